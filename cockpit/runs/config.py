"""Layouts (launch profiles) as typed objects. Read from their YAML files by
cockpit/runs/layoutfile.py, which alone imports PyYAML: a command without a layout never loads it."""

from __future__ import annotations

from dataclasses import dataclass, field

from cockpit import engines
from cockpit.common.errors import CockpitError
from cockpit.read.logrules import PhaseRule

SIM_MODELS = ("rtx-pro-6000", "h200")


class LayoutError(CockpitError):
    pass


@dataclass
class Stall:
    """The windows that decide where no stack can be read: with py-spy, a stall is called from
    two stack dumps once the cheap signals are silent 5 s (docs/diagnosis.md#a-stall-called-in-seconds)."""

    idle_s: float = 120.0  # all ranks quiet, log silent, port closed for this long: stalled-idle
    spin_s: float = 60.0  # GPUs pinned at low power, no progress for this long: stalled-spinning
    slow_factor: float = 3.0  # a phase this many times slower than earlier runs: slow


@dataclass
class Sim:
    gpus: int = 8
    model: str = "rtx-pro-6000"
    seed: int = 1
    speed: float = 1.0


@dataclass
class Layout:
    path: str
    name: str
    engine: str = engines.DEFAULT
    python: str = "python3"
    trust_python: bool = False  # as root, run `python` even where another user can change it
    command: list[str] = field(default_factory=list)
    base_flags: list[str] = field(default_factory=list)
    flag_sets: dict[str, list[str]] = field(default_factory=dict)
    enabled: list[str] = field(default_factory=list)
    params: dict[str, object] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None
    log_dir: str = "~/.cache/gpu-cockpit/runs"
    log: str | None = None
    ports: list[int] = field(default_factory=list)
    endpoints: list[str] = field(default_factory=list)
    watch: list[str] | None = None
    phases: list[PhaseRule] = field(default_factory=list)
    stall: Stall = field(default_factory=Stall)
    kill_wait_s: float = 10.0
    auto_dump: bool = True  # a stall's forensics gathered once, automatically (cockpit/actions/forensics.py)
    sim: Sim | None = None
    metrics: str | None = None  # the engine's Prometheus endpoint on the first port (default /metrics for sglang/vllm)


def param_flag(name: str) -> str:
    """`mem_fraction_static` is passed as `--mem-fraction-static`."""
    return "--" + name.replace("_", "-")
