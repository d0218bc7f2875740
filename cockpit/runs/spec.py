"""A layout and a flag-set choice into the run's command: always an argument list (base flags,
then each enabled flag set in the layout's order, then parameters as `--name value`), never a
shell string; and every on/off combination an ablation tries."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

from cockpit.common.errors import CockpitError
from cockpit.runs.config import Layout, param_flag


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
    now = now if now is not None else time.time()
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return f"{layout.name}-{stamp}-{int(now * 1000) % 1000:03d}"


def run_log_path(layout: Layout, run_id: str) -> str:
    return f"{layout.log_dir.rstrip('/')}/{run_id}.log"


def combinations(layout: Layout, vary: list[str]) -> list[RunSpec]:
    """Every on/off combination of the varied flag sets, over the layout's defaults."""
    for name in vary:
        if name not in layout.flag_sets:
            known = ", ".join(layout.flag_sets) or "none"
            raise CockpitError(f"{layout.path}: no flag set {name!r} to vary (flag sets: {known})")
    out = []
    base = [n for n in layout.enabled if n not in vary]
    for bits in itertools.product((True, False), repeat=len(vary)):
        on = base + [n for n, b in zip(vary, bits) if b]
        out.append(RunSpec(enabled=[n for n in layout.flag_sets if n in on], params=dict(layout.params)))
    return out
