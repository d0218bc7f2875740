"""The demo host: the simulated NVML's state folder and the simulated server, started through the
agent exactly as a real run is launched, recorded so a second `cockpit demo` finds it again, and
stopped through a session like any other host's run."""

from __future__ import annotations

import json
import os
from pathlib import Path

from cockpit.config import Layout
from cockpit.runs import default_spec, launch, read_ledger
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
    """The record's process group and its leader's start time: what the agent checks before it
    calls anything the demo's run."""
    return {k: rec[k] for k in ("pgid", "start", "boot", "uid") if rec.get(k) is not None}


def forget_demo(state: str) -> None:
    """The demo run was ended some other way (a kill from the cockpit)."""
    if running_demo(state) is None:
        _record(state).unlink(missing_ok=True)


async def stop_demo(session: HostSession, layout: Layout, state: str, since: float = 0.0,
                    recorded: bool = True, wait_s: float = 5.0) -> list[str]:
    """End every run this demo launched since `since` (the first one and each relaunch, all in
    the ledger) and, with `recorded`, the recorded demo run, through the session's agent: each run
    found from its process group and its leader's start time, every pid checked against its start
    time, SIGTERM then SIGKILL, then verified. Returns what was not verified gone."""
    from cockpit import actions

    left = []
    rec = running_demo(state) if recorded else None
    runs = [r for r in read_ledger(layout) if r.get("host") == session.target.label and r.get("pgid")
            and (r.get("time", 0) >= since or (rec and r.get("run_id") == rec.get("run_id")))]
    for run in runs:
        plan = await actions.plan_kill(session, actions.Scope(launched=[_launched(run)]), allow_ambiguous=True)
        if plan.entries:
            report = await actions.kill(session, plan, wait_s)
            if not report["verified"]:
                left.append(f"{run['run_id']}: " + "; ".join(actions.describe_kill(report)[1:]))
    if recorded:
        _record(state).unlink(missing_ok=True)
    return left
