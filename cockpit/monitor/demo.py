"""The demo host: each `cockpit demo` has a state folder of its own (the simulated NVML's state,
under the user's runtime folder, removed when the demo ends), launches its run through the agent
exactly as a real run is launched (recorded in the ledger first), watches only the runs it
launched, and stops every one of them (relaunches included) when it ends, verified.

A run belongs to a demo when its ledger record carries the demo's folder in its environment
(COCKPIT_SIM_STATE): that is how `q` finds the relaunches, how another terminal's
`cockpit snapshot demo` finds the demo's current run, and how a demo whose cockpit was killed is
cleaned up by the next one."""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from cockpit import engines
from cockpit.actions import kill
from cockpit.actions.kill import KillPlan
from cockpit.actions.launch import find_live_run
from cockpit.common.errors import CockpitError
from cockpit.host.session import SessionOptions, WatchList
from cockpit.link.target import parse_target
from cockpit.monitor.base import Monitor
from cockpit.monitor.host import HostMonitor
from cockpit.runs.config import Layout
from cockpit.runs.ledger import read_ledger
from cockpit.runs.run import Run, Scope
from cockpit.runs.spec import default_spec
from cockpit.sim import fakenvml

OWNER = "owner.json"
SERVER = "cockpit.sim.server"  # the launcher's command line


def _simulated(title: str) -> bool:
    """A process of the simulated server (its launcher, or a rank under its title): a process
    group without one is not a demo's (its number was reused) and is left alone."""
    return SERVER in title or title.startswith(tuple(t for e in engines.ENGINES.values() for t in e.titles))


def prepare_host(layout: Layout, state: str) -> None:
    sim = layout.sim
    fakenvml.write_host(
        state, gpus=sim.gpus if sim else 8, model=sim.model if sim else "rtx-pro-6000", seed=sim.seed if sim else 1
    )


# ----------------------------------------------------------------------------- state folders


def demo_base() -> Path:
    """Where the demos' folders live: the user's runtime folder (tmpfs, private), else ~/.cache."""
    base = os.environ.get("XDG_RUNTIME_DIR") or os.path.join(Path.home(), ".cache")
    return Path(base) / "gpu-cockpit"


def _start_ticks(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def new_state(base: Path | None = None) -> str:
    """A fresh folder for one demo, owned by this process."""
    base = base or demo_base()
    base.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = Path(tempfile.mkdtemp(prefix=f"demo-{os.getpid()}-", dir=base))
    (path / OWNER).write_text(json.dumps({"pid": os.getpid(), "start": _start_ticks(os.getpid())}))
    return str(path)


def _owner_alive(path: Path) -> bool:
    try:
        owner = json.loads((path / OWNER).read_text())
        return bool(_start_ticks(int(owner["pid"])) == owner["start"])
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _folders(base: Path | None) -> list[Path]:
    base = base or demo_base()
    try:
        found = [p for p in base.iterdir() if p.is_dir() and p.name.startswith("demo")]
    except OSError:
        return []
    return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)


def live_states(base: Path | None = None) -> list[str]:
    """The folders of the demos running now, newest first."""
    return [str(p) for p in _folders(base) if _owner_alive(p)]


def stale_states(base: Path | None = None) -> list[str]:
    """Folders whose demo ended without cleaning up (its cockpit was killed), and the one folder
    every demo shared before demos had their own."""
    return [str(p) for p in _folders(base) if not _owner_alive(p)]


def remove_state(state: str) -> None:
    shutil.rmtree(state, ignore_errors=True)


def with_free_port(layout: Layout) -> Layout:
    """The demo layout on its own port when its port is taken on this machine (another demo, or
    anything else): `--port` and the watched port move together."""
    if not layout.ports:
        return layout
    port = layout.ports[0]
    if _port_free(port):
        return layout
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    flags = list(layout.base_flags)
    for i, flag in enumerate(flags[:-1]):
        if flag == "--port" and flags[i + 1] == str(port):
            flags[i + 1] = str(free)
    return replace(layout, base_flags=flags, ports=[free] + layout.ports[1:])


def save_layout(state: str, layout: Layout) -> None:
    """What another command attaching to this demo needs of its layout: its ports."""
    (Path(state) / "layout.json").write_text(json.dumps({"ports": layout.ports, "base_flags": layout.base_flags}))


def layout_of(state: str, layout: Layout) -> Layout:
    """The layout as the demo in `state` runs it (its own port, if it had to move)."""
    try:
        saved = json.loads((Path(state) / "layout.json").read_text())
        return replace(layout, ports=[int(p) for p in saved["ports"]], base_flags=[str(f) for f in saved["base_flags"]])
    except (OSError, ValueError, KeyError, TypeError):
        return layout


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


# ----------------------------------------------------------------------------- runs


def runs_of(layout: Layout, state: str, host: str = "demo") -> list[dict[str, Any]]:
    """The ledger's runs launched into this demo's folder, oldest first."""
    return [
        r
        for r in read_ledger(layout)
        if r.get("host") == host and r.get("pgid") and (r.get("env") or {}).get("COCKPIT_SIM_STATE") == state
    ]


async def start_demo(monitor: Monitor) -> Run:
    """Launch the demo's run the way every run is launched: the monitor's verb, recorded in the
    ledger first."""
    if monitor.layout is None:
        raise CockpitError("the demo has no layout to launch")
    return await monitor.launch(default_spec(monitor.layout))


def _run(layout: Layout | None, rec: dict[str, Any]) -> Run:
    return Run(layout, rec, f"the demo's run (process group {rec['pgid']})")


async def _members(monitor: Monitor, rec: dict[str, Any]) -> KillPlan | None:
    """The live processes of a run, found from its process group and its leader's start time, if
    they are still the demo server's (a pgid reused by something else is not touched)."""
    plan = await monitor.plan_stop(Scope(launched=Run(None, rec).launched()), allow_ambiguous=True)
    if not any(_simulated(e.get("title", "")) for e in plan.entries):
        return None
    return plan


def follower(layout: Layout, state: str) -> tuple[WatchList, Callable[[HostMonitor], Awaitable[None]]]:
    """What a cockpit attached to the demo in `state` watches (the demo's port, no process
    patterns: another demo's processes or anything else here are not shown or judged) and the
    hook that finds the demo's current run once connected."""

    async def on_connect(monitor: HostMonitor) -> None:
        run = await find_live_run(monitor.session, layout, demo_state=state)
        if run is not None:
            monitor.follow(run, resumed=True)

    return WatchList(patterns=[], ports=list(layout.ports)), on_connect


async def stop_demo(monitor: Monitor, state: str, wait_s: float = 5.0) -> tuple[int, list[str]]:
    """End every run launched into this demo's folder (the first one and each relaunch) through
    the one stop workflow (`Monitor.stop`: the ledger says who stopped each, every cockpit watching
    reads it as stopped): each run's process group, every pid checked against its start time,
    SIGTERM then SIGKILL, then verified. Returns how many runs were stopped and what was not
    verified gone."""
    left: list[str] = []
    stopped = 0
    if monitor.layout is None:
        return stopped, left
    for rec in runs_of(monitor.layout, state, monitor.target.label):
        plan = await _members(monitor, rec)
        if plan is None:
            continue
        monitor.follow(_run(monitor.layout, rec))
        report = await monitor.stop(plan, "stopped: the demo ended", wait_s)
        stopped += 1
        if not report["verified"]:
            left.append(f"{rec['run_id']}: " + "; ".join(kill.describe_kill(report)[1:]))
    return stopped, left


async def stop_demo_runs(opts: SessionOptions, layout: Layout, state: str) -> tuple[int, list[str]]:
    """Every run a demo launched (the first and each relaunch) ends with it, through a monitor of
    its own (the screen's is closed by now) that follows no run until `stop_demo` names each."""
    monitor = HostMonitor(parse_target("demo"), opts, layout, watch=WatchList(patterns=[]), on_connect=_no_run)
    await monitor.session.connect()
    try:
        return await stop_demo(monitor, state)
    finally:
        await monitor.close()


async def _no_run(_monitor: Monitor) -> None:
    """A monitor that follows no run until told."""


def need_live_state(base: Path | None = None) -> str:
    """The running demo another command (snapshot, kill, launch ...) attaches to."""
    states = live_states(base)
    if not states:
        raise CockpitError(
            "no demo is running: start one with `cockpit demo` (or ./scripts/demo), "
            "then use this command from another terminal"
        )
    return states[0]


__all__ = [
    "prepare_host",
    "demo_base",
    "new_state",
    "live_states",
    "stale_states",
    "remove_state",
    "with_free_port",
    "save_layout",
    "layout_of",
    "runs_of",
    "start_demo",
    "stop_demo",
    "stop_demo_runs",
    "need_live_state",
]
