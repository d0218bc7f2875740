"""Launch profiles into command lines, and starting a run through the agent.

A run's command is always an argument list: base flags, then each enabled flag set in the
layout's order, then parameters as `--name value`. Never a shell string."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from cockpit.config import Layout, param_flag


@dataclass
class RunSpec:
    """One launch: which flag sets are on and the parameters' values."""

    enabled: list[str] = field(default_factory=list)
    params: dict[str, object] = field(default_factory=dict)


def default_spec(layout: Layout) -> RunSpec:
    return RunSpec(enabled=list(layout.enabled), params=dict(layout.params))


def build_argv(layout: Layout, spec: RunSpec, python: str | None = None) -> list[str]:
    argv = [python or layout.python, *layout.command, *layout.base_flags]
    for name in layout.flag_sets:  # the layout's order, whatever order they were toggled in
        if name in spec.enabled:
            argv += layout.flag_sets[name]
    for name, value in spec.params.items():
        if value is True:
            argv.append(param_flag(name))
        elif value not in (None, False):
            argv += [param_flag(name), str(value)]
    return argv


def new_run_id(layout: Layout, now: float | None = None) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now if now is not None else time.time()))
    return f"{layout.name}-{stamp}"


def run_log_path(layout: Layout, run_id: str) -> str:
    return f"{layout.log_dir.rstrip('/')}/{run_id}.log"
