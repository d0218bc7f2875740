"""What a run is: the layout it was launched from, the ledger's record of it (run id, process group,
its leader's start time and boot, user, log) and the rule that found it. A `Run` is followed by one
monitor, its only writer (launch, resume, adopt and the demo hand it over); everything that acts on
the run asks the monitor for it. `scope` turns it into the hints the agent's `find_runs` resolves on
the host (the kill's rules: cockpit/actions/kill.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from cockpit import engines
from cockpit.runs.config import Layout

if TYPE_CHECKING:
    from cockpit.host.session import WatchList

LAUNCH_MARKER = "GPU_COCKPIT_RUN"  # in every launched run's environment: its run id (the agent's LAUNCH_MARKER)
LAUNCHED_KEYS = ("pgid", "start", "boot", "uid", "run_id", "seen_ticks")  # what the agent is told of a launched run


@dataclass
class Scope:
    """What the agent is asked to find: a launched run (process group + leader start time), the
    layout's ports, command and model path, the title patterns; or explicit pids (`k`, --pid).
    `pgids` without a start time are trusted only by the agent that launched them."""

    pgids: list[int] = field(default_factory=list)
    sids: list[int] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)
    launched: list[dict[str, Any]] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)
    command: list[str] = field(default_factory=list)
    model: str | None = None
    patterns: list[str] | None = None
    default_port: int | None = None
    layout: str | None = None  # the layout's name: the host's record of launches holds its runs
    starts: dict[int, int] = field(default_factory=dict)  # a pid's start (clock ticks since boot), as it was seen

    def args(self) -> dict[str, Any]:
        if self.pids:
            if self.starts:  # a pid reused since it was seen is another process: the agent leaves it alone
                return {"pids": self.pids, "starts": {str(p): t for p, t in self.starts.items()}}
            return {"pids": self.pids}
        launched: list[dict[str, Any]] = [dict(r) for r in self.launched]
        for g in list(self.pgids) + list(self.sids):
            if all(int(r.get("pgid", -1)) != int(g) for r in launched):
                launched.append({"pgid": int(g)})
        out: dict[str, Any] = {
            "launched": launched,
            "ports": self.ports,
            "command": self.command,
            "model": self.model,
            "patterns": self.patterns,
        }
        if self.default_port is not None:
            out["default_port"] = self.default_port
        if self.layout:
            out["layout"] = self.layout
        return out


def layout_model(layout: Layout | None) -> str | None:
    """The model path the layout launches (`--model-path X`, `--model X`, `--model=X`, vLLM's
    `serve MODEL`), which a run started elsewhere must carry to be this layout's run."""
    if layout is None:
        return None
    flags = list(layout.base_flags)
    for i, arg in enumerate(flags):
        if arg in ("--model-path", "--model") and i + 1 < len(flags):
            return str(flags[i + 1])
        for name in ("--model-path=", "--model="):
            if arg.startswith(name):
                return str(arg[len(name) :])
    for name in ("model_path", "model"):
        value = layout.params.get(name)
        if isinstance(value, str) and value:
            return value
    if layout.command and layout.command[-1].rsplit("/", 1)[-1] == "serve" and flags and not flags[0].startswith("-"):
        return str(flags[0])
    return None


def layout_default_port(layout: Layout | None) -> int | None:
    """The engine's default port: a server started without `--port` listens there."""
    engine = engines.get(layout.engine) if layout is not None else None
    return engine.default_port if engine is not None else None


def process_scope(pid: int) -> Scope:
    """One process (and what it started, as its user): the `k` key, `--pid`."""
    return Scope(pids=[pid])


@dataclass(frozen=True)
class Run:
    """The run a monitor follows. `record` is the ledger's record of a run launched, resumed or
    adopted (None: the layout's run, found on the host by the kill's rules); `rule` says how it
    was found. Frozen, its record read-only: what changes of a run (its leader seen again) comes
    back as a new Run, handed to the monitor's one door (`Monitor.follow`)."""

    layout: Layout | None = None
    record: Mapping[str, Any] | None = None
    rule: str | None = None

    def __post_init__(self) -> None:
        if self.record is not None and not isinstance(self.record, MappingProxyType):
            object.__setattr__(self, "record", MappingProxyType(dict(self.record)))

    @property
    def run_id(self) -> str | None:
        return str(self.record["run_id"]) if self.record and self.record.get("run_id") else None

    def folder_name(self, host: str) -> str:
        """The name of the run's folder (`runs/NAME/`: its dumps, bundles, forensics): its run id,
        else the layout's name, else the host's."""
        return self.run_id or (self.layout.name if self.layout else host)

    def launched(self) -> list[dict[str, Any]]:
        """What the agent is told of the launched run: its process group and its leader's start."""
        rec = self.record
        if not rec or rec.get("pgid") is None:
            return []
        return [{k: rec[k] for k in LAUNCHED_KEYS if rec.get(k) is not None}]

    def scope(self, watch: WatchList) -> Scope:
        """The run as hints the agent resolves on the host; `watch` is the session's WatchList,
        whose process groups the agent launched itself (it knows their leaders' start)."""
        layout = self.layout
        launched = self.launched()
        for g in watch.pgids:
            if all(int(r.get("pgid", -1)) != int(g) for r in launched):
                launched.append({"pgid": int(g)})
        if layout is None and not launched and not watch.patterns and watch.pids:
            rec = self.record or {}
            root, start = rec.get("root"), rec.get("root_start")
            starts = {int(root): int(start)} if isinstance(root, int) and isinstance(start, int) else {}
            return Scope(pids=[int(p) for p in watch.pids], starts=starts)  # the one server followed: its own tree
        return Scope(
            launched=launched,
            ports=list(layout.ports) if layout else [],
            command=list(layout.command) if layout else [],
            model=layout_model(layout),
            patterns=watch.patterns,
            default_port=layout_default_port(layout),
            layout=layout.name if layout else None,
        )
