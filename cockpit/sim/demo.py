"""The demo host: the simulated NVML's state folder and the simulated server, started through the
agent exactly as a real run is launched, recorded so a second `cockpit demo` finds it again."""

from __future__ import annotations

import json
import os
from pathlib import Path

from cockpit.agent import agent
from cockpit.config import Layout
from cockpit.runs import default_spec, launch
from cockpit.session import HostSession
from cockpit.sim import fakenvml


def prepare_host(layout: Layout, state: str) -> None:
    sim = layout.sim
    fakenvml.write_host(state, gpus=sim.gpus if sim else 8, model=sim.model if sim else "rtx-pro-6000",
                        seed=sim.seed if sim else 1)


def _record(state: str) -> Path:
    return Path(state) / "demo.json"


def running_demo(state: str) -> dict | None:
    """The recorded demo run, if its launcher is still alive."""
    try:
        rec = json.loads(_record(state).read_text())
        pid = int(rec["pid"])
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return rec if b"cockpit.sim.server" in cmd else None


async def start_demo(session: HostSession, layout: Layout, state: str) -> dict:
    """Launch the demo's run the way every run is launched (recorded in the ledger first)."""
    run = await launch(session, layout, default_spec(layout))
    tmp = _record(state).with_suffix(".tmp")
    tmp.write_text(json.dumps(run))
    os.replace(tmp, _record(state))
    return run


async def attach_demo(session: HostSession, run: dict) -> None:
    from cockpit.actions import remember_run

    remember_run(session, launched=_launched(run), rule=f"the demo's run (process group {run['pgid']})")
    await session.follow_run(int(run["pgid"]), run.get("log"))


def _launched(rec: dict) -> dict:
    """The record's process group and its leader's start time (a record written before start
    times were kept: the start of the live launcher that running_demo just recognised)."""
    pgid = int(rec["pgid"])
    start = rec.get("start")
    if start is None:
        start = agent._start_ticks(pgid)
    return {"pgid": pgid, "start": start, "boot": rec.get("boot"), "uid": rec.get("uid")}


def forget_demo(state: str) -> None:
    """The demo run was ended some other way (a kill from the cockpit)."""
    if running_demo(state) is None:
        _record(state).unlink(missing_ok=True)


def stop_demo(state: str, wait_s: float = 5.0) -> bool:
    """End the recorded demo run (always on this machine) with the agent's own kill: its process
    group and session, found from its leader's start time, each pid checked against its start time,
    SIGTERM then SIGKILL."""
    rec = running_demo(state)
    if rec is None:
        return False
    plan = agent.run_plan(launched=[_launched(rec)])
    agent.kill_run(plan["plan"], wait_s, plan["sessions"])
    _record(state).unlink(missing_ok=True)
    return True
