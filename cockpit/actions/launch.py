"""Starting runs through the agent and finding them again: launch (recorded in the ledger first,
and on the host by the agent), the live run of a layout (this cockpit's ledger, else the host's
record: the one way a run is found), and the rule that a workflow's unconfirmed stop ends only
the run it launched. Plain values only (a session, a layout): what is watched is the monitor's
door (`Monitor.follow`); the workflows that drive a monitor are in cockpit/operate/relaunch.py."""

from __future__ import annotations

import time
from typing import Any

from cockpit.common.secrets import mask_argv
from cockpit.read.flightrec import forensics_env
from cockpit.runs.config import Layout
from cockpit.runs.ledger import append_ledger, masked, operator_id, read_ledger
from cockpit.runs.run import LAUNCH_MARKER, LAUNCHED_KEYS, Run, layout_default_port, layout_model
from cockpit.runs.spec import RunSpec, build_argv, new_run_id, run_log_path


async def find_live_run(session, layout: Layout, demo_state: str | None = None, elsewhere: bool = True) -> Run | None:
    """The latest run of this layout on this host that is still alive (ready, stalled, or never
    watched to an outcome): what a cockpit started again after a crash, a quit or a dropped link
    follows, what a cold look from anywhere finds, and (`demo_state`) a demo's current run, among
    the runs launched into that demo's folder. Its record comes from this cockpit's ledger, else
    from the host's record of launches (any cockpit's, any machine's). A record is trusted only
    with its leader's start time: the agent checks that the process group's leader is still the
    process launched (not a later one reusing its pid), or, the leader gone, that the survivors of
    its session carry the run's titles and user.
    The record carries its root pid (`root`) and, where the agent saw the leader alive, when
    (`leader_seen_ticks`: the monitor's door notes it, ledger.note_seen); the Run, the rule that
    found it. No launch of it alive: the run started elsewhere (`find_started_elsewhere`), unless
    `elsewhere` is off (a Slurm job's node, whose run is the job's processes)."""
    records = [
        r
        for r in list(reversed(read_ledger(layout)))
        if r.get("host") == session.target.label
        and r.get("pgid")
        and r.get("start") is not None
        and not r.get("ended")  # a run killed whole and verified gone is never resumed
        and (demo_state is None or (r.get("env") or {}).get("COCKPIT_SIM_STATE") == demo_state)
    ][:20]
    if not session.state.seq:
        await session.wait_samples(1)  # the first sample carries the host's record of launches
    mine = {str(r.get("run_id")) for r in records}
    if demo_state is None:
        records += [
            {
                "run_id": r["run_id"],
                "pgid": r["pgid"],
                "pid": r.get("pid"),
                "start": r["start"],
                "boot": r.get("boot"),
                "uid": r.get("uid"),
                "log": r.get("log"),
                "host": session.target.label,
                "by": r.get("by"),
                "from_host": True,
            }
            for r in session.state.launches(layout.name)[:20]
            if r["run_id"] not in mine
        ]
    if records:
        launched = [{k: r[k] for k in LAUNCHED_KEYS if r.get(k) is not None} for r in records]
        found = await session.request(
            "find_runs",
            timeout=60,
            launched=launched,
            command=list(layout.command),
            patterns=session.watch.patterns,
            layout=layout.name,
        )
        alive = {s: c for c in found.get("runs") or [] for s in c.get("sessions") or []}
        for run in records:
            cand = alive.get(int(run["pgid"]))
            if cand is not None:
                seen = (
                    {"leader_seen_ticks": cand["leader_seen_ticks"]}
                    if cand.get("leader_seen_ticks") is not None
                    else {}
                )
                rule = f"the demo's run (process group {run['pgid']})" if demo_state is not None else cand["rule"]
                return Run(layout, {**run, "root": cand["root"], **seen}, rule)
    if demo_state is not None or not elsewhere:
        return None
    return await find_started_elsewhere(session, layout)


async def find_started_elsewhere(session, layout: Layout) -> Run | None:
    """The layout's run that no cockpit launched (`nohup python -m sglang.launch_server ... &`):
    the one tree that holds the layout's port, else the one whose program is the layout's command
    with its model on its port (the kill's rules, cockpit/agent/kill.py `find_runs`). Its record
    is its tree's root (pid and start) and the file its server writes to: that tree alone is the
    run; a server on another port is a neighbour, never the run. Two found: none followed, both
    named in the host's notes."""
    found = await session.request(
        "find_runs",
        timeout=60,
        ports=list(layout.ports),
        command=list(layout.command),
        model=layout_model(layout),
        default_port=layout_default_port(layout),
        patterns=session.watch.patterns,
    )
    runs = found.get("runs") or []
    if len(runs) > 1:
        session.state.notes.append(
            f"{len(runs)} servers match the layout {layout.name} (roots "
            f"{', '.join(str(c['root']) for c in runs)}): none followed; name the port, "
            "or kill the one that is not yours with --pid"
        )
    if len(runs) != 1:
        return None
    cand = runs[0]
    members = [int(e["pid"]) for e in cand.get("members") or []]
    rec: dict[str, Any] = {
        "root": cand["root"],
        "pid": cand["root"],
        "root_start": cand.get("root_start"),
        "uid": cand.get("uid"),
        "user": cand.get("user"),
        "host": session.target.label,
    }
    log = layout.log
    if not log:
        pids = [cand["root"]] + [p for p in members if p != cand["root"]]
        out = await session.request("stdout_of", pids=pids[:16])
        log = next((out[str(p)] for p in pids if str(p) in out), None)
    if log:
        rec["log"] = log
    return Run(layout, rec, f"started elsewhere: {cand['rule']} (root pid {cand['root']}, {cand.get('user')})")


def launch_python(layout: Layout, session) -> str:
    """A simulated host runs the simulated server with the agent's own interpreter."""
    return session.opts.python if session.opts.sim_state else layout.python


def sim_flags(layout: Layout, session) -> list[str]:
    if not session.opts.sim_state or not layout.sim:
        return []
    return ["--sim-speed", str(layout.sim.speed), "--sim-seed", str(layout.sim.seed)]


def _launched(session, layout: Layout, spec: RunSpec, run_id: str) -> tuple[list[str], dict[str, str], str]:
    """The run's argv, environment and log."""
    argv = build_argv(layout, spec, python=launch_python(layout, session)) + sim_flags(layout, session)
    env = dict(layout.env)
    env[LAUNCH_MARKER] = run_id  # the run's processes carry it: proof they are the run, its leader gone
    if session.opts.sim_state:
        env["COCKPIT_SIM_STATE"] = session.opts.sim_state
    log = run_log_path(layout, run_id)
    if log.startswith("~/") and session.state.agent.home:
        log = session.state.agent.home + log[1:]
    if "forensics" in spec.enabled:  # torch's flight recorder armed, its pipes and dumps beside the run's log
        env.update(forensics_env(log.removesuffix(".log")))
    return argv, env, log


async def check_launch(session, layout: Layout, spec: RunSpec) -> None:
    """The launch's check alone, made on the host before a relaunch stops anything: its
    interpreter, import path and workdir as root (cockpit/agent/guard.py); a refusal is one line
    (CockpitError), nothing stopped, nothing started."""
    if session.opts.trust_python:
        return
    argv, env, _ = _launched(session, layout, spec, new_run_id(layout))
    await session.request("launch_check", argv=argv, env=env, cwd=layout.workdir)


async def launch(session, layout: Layout, spec: RunSpec) -> Run:
    """Record the launch, then start it detached on the host, in the layout's workdir or `/`, its
    interpreter and import path checked there first as the agent's were (unless --trust-python);
    the caller's monitor follows the Run returned (its door watches it)."""
    run_id = new_run_id(layout)
    argv, env, log = _launched(session, layout, spec, run_id)
    append_ledger(
        layout,
        {
            "event": "launch",
            "run_id": run_id,
            "layout": layout.name,
            "host": session.target.label,
            "time": time.time(),
            "argv": mask_argv(argv),
            "flag_sets": list(spec.enabled),
            "params": dict(spec.params),
            "env": masked(env),
            "log": log,
            "stall": {"idle_s": layout.stall.idle_s, "spin_s": layout.stall.spin_s},
        },
    )
    run = await session.request(
        "launch",
        argv=argv,
        env=env,
        cwd=layout.workdir,
        log=log,
        run_id=run_id,
        layout=layout.name,
        ports=list(layout.ports),
        by=operator_id(),
        check=not session.opts.trust_python,
    )
    run["run_id"] = run_id
    append_ledger(
        layout,
        {
            "event": "started",
            "run_id": run_id,
            "pid": run["pid"],
            "pgid": run["pgid"],
            "log": run["log"],
            "start": run.get("start"),
            "boot": run.get("boot"),
            "uid": run.get("uid"),
        },
    )
    return Run(layout, run, f"launched by this cockpit (ledger): process group {run['pgid']}")
