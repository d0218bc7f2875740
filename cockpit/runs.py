"""Launch profiles into command lines, and starting a run through the agent.

A run's command is always an argument list: base flags, then each enabled flag set in the
layout's order, then parameters as `--name value`. Never a shell string."""

from __future__ import annotations

import getpass
import itertools
import json
import os
import re
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

from cockpit.config import Layout, param_flag
from cockpit.diagnose import ALERTING, VerdictName
from cockpit.errors import CockpitError
from cockpit.secrets import ENV_WORDS, mask_argv, mask_env, mask_record


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


# ----------------------------------------------------------------------------- the ledger

SECRET = ENV_WORDS  # the names cockpit.secrets masks (and *_PAT, credentials in URLs)


def masked(env: dict[str, str]) -> dict[str, str]:
    """Environment as recorded: values of names that look secret never reach the disk (see
    cockpit.secrets: *TOKEN*, *KEY*, *SECRET*, *PASSWORD*, *PASSWD*, *AUTH*, *_PAT, URL credentials)."""
    return mask_env(env)


def run_name(monitor) -> str:
    """The name of the run's folder (`runs/NAME/`: its dumps, bundles, forensics): the ledger's
    run followed, else the layout, else the host."""
    if monitor.following and monitor.following.get("run_id"):
        return str(monitor.following["run_id"])
    return monitor.layout.name if monitor.layout else monitor.target.label


def state_home() -> Path:
    return Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "gpu-cockpit"


def ledger_path(layout: Layout) -> Path:
    return state_home() / "ledger" / f"{re.sub(r'[^A-Za-z0-9._-]', '_', layout.name)}.jsonl"


def append_ledger(layout: Layout, record: dict) -> None:
    """One line, appended and fsynced before the caller goes on: a cockpit killed at any moment
    loses no row (a torn last line is skipped on reading). Secrets are masked here, whatever the
    caller passed: env values, argv values after --api-key and the like, URL credentials."""
    record = mask_record(record)
    path = ledger_path(layout)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (json.dumps(record, sort_keys=True) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def read_ledger(layout: Layout) -> list[dict]:
    """Runs, oldest first: each launch record merged with its outcome (if one was written)."""
    runs: dict[str, dict] = {}
    try:
        text = ledger_path(layout).read_text()
    except FileNotFoundError:
        return []
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if not isinstance(rec, dict) or "run_id" not in rec:
            continue
        runs.setdefault(rec["run_id"], {"outcome": "unknown"}).update(
            {k: v for k, v in rec.items() if k != "event"})
    return list(runs.values())


async def find_live_run(session, layout: Layout) -> dict | None:
    """The latest run of this layout on this host that is still alive (ready, stalled, or never
    watched to an outcome): what a cockpit started again after a crash, a quit or a dropped link
    follows. A record is trusted only with its leader's start time: the agent checks that the
    process group's leader is still the process launched (not a later one reusing its pid), or,
    the leader gone, that the survivors of its session carry the run's titles and user.
    The answer carries the rule that found it (`rule`) and its root pid (`root`)."""
    from cockpit.actions import LAUNCHED_KEYS

    records = [r for r in list(reversed(read_ledger(layout)))[:20]
               if r.get("host") == session.target.label and r.get("pgid") and r.get("start") is not None
               and not r.get("ended")]  # a run killed whole and verified gone is never resumed
    if not records:
        return None
    launched = [{k: r[k] for k in LAUNCHED_KEYS if r.get(k) is not None} for r in records]
    found = await session.request("find_runs", timeout=60, launched=launched, command=list(layout.command),
                                  patterns=session.watch.patterns)
    alive = {s: c for c in found.get("runs") or [] for s in c.get("sessions") or []}
    for run in records:
        cand = alive.get(int(run["pgid"]))
        if cand is not None:
            seen = cand.get("leader_seen_ticks")
            if seen is not None and seen != run.get("seen_ticks"):
                # the leader alive and the recorded one: a process of its session started before now
                # is the run's, should the leader die later and its pid be reused (the agent checks)
                append_ledger(layout, {"event": "seen", "run_id": run["run_id"], "seen_ticks": seen})
                run = {**run, "seen_ticks": seen}
            return {**run, "rule": cand["rule"], "root": cand["root"]}
    return None


async def resume(session, layout: Layout | None) -> dict | None:
    from cockpit.actions import remember_run

    if layout is not None:
        remember_run(session, layout)
    run = await find_live_run(session, layout) if layout is not None else None
    if run is not None:
        remember_run(session, layout, launched=run, rule=run["rule"])
        await watch_only(session, int(run["pgid"]), run.get("log"))
    return run


def typical_phase_seconds(layout: Layout) -> dict[str, float]:
    """Median seconds each phase lasted in earlier runs that reached ready: what `slow` compares."""
    spans: dict[str, list[float]] = {}
    for run in read_ledger(layout):
        times = sorted((run.get("phase_times") or {}).items(), key=lambda kv: kv[1])
        for (name, at), (_, nxt) in zip(times, times[1:]):
            spans.setdefault(name, []).append(nxt - at)
    return {k: sorted(v)[len(v) // 2] for k, v in spans.items() if v}


def describe_ledger(runs: list[dict]) -> list[str]:
    lines = [f"{'run':<28} {'outcome':<17} {'ready':>7}  flag sets / params"]
    for r in runs:
        ready = (r.get("phase_times") or {}).get("ready")
        sets = ",".join(r.get("flag_sets") or []) or "-"
        params = " ".join(f"{k}={v}" for k, v in (r.get("params") or {}).items())
        lines.append(f"{r['run_id']:<28} {r.get('outcome', '?'):<17} {'' if ready is None else f'{ready:.0f}s':>7}  "
                     f"{sets} {params}")
    return lines


# ----------------------------------------------------------------------------- launching

TERMINAL = (VerdictName.STALLED_IDLE, VerdictName.STALLED_SPINNING, VerdictName.CRASHED)


def launch_python(layout: Layout, session) -> str:
    """A simulated host runs the simulated server with the agent's own interpreter."""
    return session.opts.python if session.opts.sim_state else layout.python


def sim_flags(layout: Layout, session) -> list[str]:
    if not session.opts.sim_state or not layout.sim:
        return []
    return ["--sim-speed", str(layout.sim.speed), "--sim-seed", str(layout.sim.seed)]


async def launch(session, layout: Layout, spec: RunSpec) -> dict:
    """Record the launch, then start it detached on the host and follow it."""
    run_id = new_run_id(layout)
    argv = build_argv(layout, spec, python=launch_python(layout, session)) + sim_flags(layout, session)
    env = dict(layout.env)
    from cockpit.actions import LAUNCH_MARKER

    env[LAUNCH_MARKER] = run_id  # the run's processes carry it: proof they are the run, its leader gone
    if session.opts.sim_state:
        env["COCKPIT_SIM_STATE"] = session.opts.sim_state
    log = run_log_path(layout, run_id)
    if log.startswith("~/") and session.state.agent.home:
        log = session.state.agent.home + log[1:]
    await watch_only(session, None, None)  # from now on the session watches the new run alone
    if "forensics" in spec.enabled:  # torch's flight recorder armed, its pipes and dumps beside the run's log
        from cockpit.flightrec import forensics_env

        env.update(forensics_env(log.removesuffix(".log")))
    append_ledger(layout, {"event": "launch", "run_id": run_id, "layout": layout.name, "host": session.target.label,
                           "time": time.time(), "argv": mask_argv(argv), "flag_sets": list(spec.enabled),
                           "params": dict(spec.params), "env": masked(env), "log": log,
                           "stall": {"idle_s": layout.stall.idle_s, "spin_s": layout.stall.spin_s}})
    run = await session.request("launch", argv=argv, env=env, cwd=layout.workdir, log=log)
    run["run_id"] = run_id
    append_ledger(layout, {"event": "started", "run_id": run_id, "pid": run["pid"], "pgid": run["pgid"],
                           "log": run["log"], "start": run.get("start"), "boot": run.get("boot"),
                           "uid": run.get("uid")})
    from cockpit.actions import remember_run

    remember_run(session, layout, launched=run, rule=f"launched by this cockpit (ledger): process group {run['pgid']}")
    session.state.forget_dead()
    await session.follow_run(run["pgid"], run["log"])
    return run


async def watch_only(session, pgid: int | None, log: str | None) -> None:
    """Watch this run (its process group; None: nothing yet, a launch follows) and nothing else:
    title patterns found every server on the host, and a colleague's rank that ends is not a crash
    of ours. What was watched before is dropped once the agent has sent samples under the new
    watch (a sample already in flight may still carry it)."""
    session.watch.patterns = []
    if pgid is None:
        session.watch.pgids = []
        await session.request("config", **session.watch.args())
    else:
        await session.follow_run(pgid, log)
    await session.wait_samples(2)
    session.state.forget_dead()


async def follow_to_outcome(monitor, timeout: float, progress=None, settle: float = 0.0) -> tuple[str, list[str]]:
    """Follow the monitor's run until it is ready (and stays so for `settle` seconds: some hangs
    come with the first requests), stalls, crashes or times out; returns (outcome, evidence). The
    verdict is the monitor's own: the screen shows the same."""
    deadline = time.monotonic() + timeout
    ready_at = None
    while True:
        await monitor.session.wait_samples(1, timeout=30)
        now = time.monotonic()
        phase, verdict = monitor.phase, monitor.verdict
        if progress:
            progress(phase, verdict)
        if verdict.name in TERMINAL:
            for _ in range(2):  # the log's own account (exit code, traceback) comes a tick after the ranks die
                await monitor.session.wait_samples(1, timeout=30)
                if monitor.verdict.name in TERMINAL:
                    verdict = monitor.verdict
            return verdict.name.value, verdict.evidence
        if phase.name in ("ready", "serving"):
            ready_at = ready_at or now
            if now - ready_at >= settle:
                return "ready", []
        elif now > deadline:
            return "timeout", [f"still '{phase}' after {timeout:.0f} s"]


def record_seen(monitor) -> None:
    """The verdict the cockpit saw of a ledger run that has no outcome yet, written before it is
    stopped: a stalled run stays recorded as stalled, not as killed."""
    run, layout = monitor.following, monitor.layout
    if not run or not layout or not run.get("run_id") or run.get("outcome_written") \
            or run.get("outcome", "unknown") != "unknown":  # the ledger already has how it ended (its launcher's)
        return
    verdict = monitor.verdict
    outcome = verdict.name.value if verdict.name in ALERTING else (
        "ready" if monitor.phase.name in ("ready", "serving") else "stopped")
    append_ledger(layout, {"event": "outcome", "run_id": run["run_id"], "outcome": outcome,
                           "phase_times": monitor.watchdog.phase_times(), "evidence": verdict.evidence,
                           "dumps": None, "time": time.time()})
    run["outcome_written"] = True


def note_stop(monitor, plan, why: str) -> None:
    """The ledger's word that the operator stops the run followed: who (the action), from where
    (user, host, process), when, and the processes planned (pid, start time). Written before the
    first signal, so another cockpit watching the run reads their deaths as the operator's."""
    run, layout = monitor.following, monitor.layout
    if not run or not layout or not run.get("run_id") or not plan.entries:
        return
    append_ledger(layout, {"event": "stop", "run_id": run["run_id"], "stop": {
        "why": why, "by": f"{getpass.getuser()}@{socket.gethostname()} (pid {os.getpid()})", "at": time.time(),
        "processes": [[int(e["pid"]), e.get("started")] for e in plan.entries]}})


def stops_of(layout: Layout, run_id: str) -> dict | None:
    """The operator's last stop of a ledger run (note_stop), if any."""
    rec = next((r.get("stop") for r in read_ledger(layout) if r.get("run_id") == run_id), None)
    return rec if isinstance(rec, dict) and isinstance(rec.get("processes"), list) else None


async def stop_run(monitor, plan, why: str, say=None) -> dict | None:
    """A relaunch's or an ablation's stop of the run on screen (monitor.stop, the one stop
    workflow), verified: an unverified stop raises, so nothing is launched beside it."""
    from cockpit import actions

    if not plan.entries:
        return None
    report = await monitor.stop(plan, why, whole_run=False)
    for line in actions.describe_kill(report):
        if say:
            say(line)
    if not report["verified"]:
        raise CockpitError("the previous run is not fully gone: " + "; ".join(actions.describe_kill(report)[1:]))
    return report


async def plan_relaunch(session, layout: Layout, clean_shm: bool = True, held_before: dict | None = None):
    """What a (re)launch will do before it starts the new run, for the operator to confirm: the
    kill plan of the current run (every pid, user, start time, command, and the rule that found
    it) and the shm entries the clean after it will remove: only files tied to the run, each
    as listed (name, device, inode; actions.shm_for_run), the others said as left. Returns
    (plan, shm entries, lines).
    Two runs found: AmbiguousRun (the operator chooses, e.g. `cockpit kill --pid ROOT` first)."""
    from cockpit import actions

    plan = await actions.plan_kill(session, actions.run_scope(session, layout))
    lines = (["the current run is killed and verified gone:"] + ["  " + line for line in plan.describe()]
             if plan.entries else ["no current run to kill" + (f" ({'; '.join(plan.notes)})" if plan.notes else "")])
    lines += [f"  left alone: pid {f['root']}: {f['why']}" for f in plan.foreign if not plan.entries]
    names: list[dict] = []
    if clean_shm:
        audit = await actions.shm_audit(session, uid=plan.uid)  # before the kill: the run still holds its files
        found = actions.shm_for_run(audit, plan, held_before)
        names = found.remove
        lines += actions.describe_shm_for_run(found, audit["folder"])
    return plan, names, lines


def refuse_unasked(plan, launched: dict | None) -> None:
    """A kill nobody confirmed (an ablation's later steps, its final kill) may end only the run
    the ablation launched itself: found by the ledger rule, in the process group it started. Any
    other plan (a server found by its port or command, a colleague's) stops the ablation with the
    plan shown, nothing signalled."""
    if not plan.entries:
        return
    pgid = int(launched["pgid"]) if launched and launched.get("pgid") else None
    own = (pgid is not None and plan.sessions == [pgid]
           and (plan.rule or "").startswith("launched by this cockpit (ledger)"))
    if not own:
        raise CockpitError(f"the run found ({plan.rule}; root pid {plan.root}, {len(plan.entries)} processes) is not "
                           f"the one this ablation launched"
                           + (f" (process group {pgid})" if pgid is not None else "")
                           + ": nothing was killed; kill it yourself if it is yours (`cockpit kill`, which asks), "
                           "then start again")


async def run_variant(monitor, spec: RunSpec, timeout: float, clean_shm: bool = True,
                      dump_on_stall: bool = True, progress=None, settle: float = 0.0, plan=None,
                      shm_names: list[dict] | None = None) -> dict:
    """One step of a bisection: end what runs, clean shm, launch, watch, dump on a stall, record.

    `plan` and `shm_names` (from plan_relaunch) are what the operator confirmed: exactly that is
    carried out. Without them (an ablation's later steps) they are made here and said through
    `progress(None, line)` before anything is signalled or removed."""
    from cockpit import actions, stacks

    session, layout = monitor.session, monitor.layout
    def say(line: str) -> None:
        if progress:
            progress(None, line)

    if plan is None:
        plan, found, lines = await plan_relaunch(session, layout, clean_shm, monitor.shm_held)
        shm_names = found if shm_names is None else shm_names
        for line in lines:
            say(line)
        refuse_unasked(plan, monitor.following)
    killed = [{"pid": e["pid"], "user": e.get("user"), "started": e.get("started"), "title": e["title"]}
              for e in plan.entries]
    removed: list[str] = []
    with monitor.stopping_for("stopped for relaunch"):  # until the new run replaces the dead ranks
        await stop_run(monitor, plan, "stopped for relaunch", say)
        if clean_shm:
            if shm_names is None:  # the plan came without them: only what the kill leaves tied to the run
                audit = await actions.shm_audit(session, uid=plan.uid)
                found = actions.shm_for_run(audit, plan, monitor.shm_held)
                shm_names = found.remove
                for line in actions.describe_shm_for_run(found, audit["folder"]):
                    say(line)
            if shm_names:
                done = await actions.shm_clean(session, shm_names, uid=plan.uid)
                removed = done["removed"]
                for line in actions.describe_clean(done):
                    say(line)
        monitor.new_run()
        run = await launch(session, layout, spec)
    monitor.following = run
    outcome, evidence = await follow_to_outcome(monitor, timeout, progress, settle)
    dumps = None
    if outcome.startswith("stalled") and dump_on_stall:
        try:
            found = await actions.find_run(session, layout)  # the run just launched, as the kill finds it
            result = await stacks.dump_ranks(session, stacks.dump_targets(session.state,
                                                                          actions.of_run(session.state, found)[0]),
                                             run["run_id"])
            dumps = str(result.folder)
            evidence = evidence + [f"stacks: {line}" for line in stacks.describe_groups(result.groups)
                                   if not line.startswith("    ")]
        except CockpitError as exc:
            evidence = evidence + [f"no stack dump: {exc}"]
    row = {"event": "outcome", "run_id": run["run_id"], "outcome": outcome,
           "phase_times": monitor.watchdog.phase_times(), "evidence": evidence, "dumps": dumps, "time": time.time(),
           "killed_before": killed, "shm_removed": removed}
    append_ledger(layout, row)
    run["outcome_written"] = True
    return {**run, **row, "flag_sets": list(spec.enabled)}


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


async def ablate(monitor, vary: list[str], timeout: float, progress=None, first_plan=None,
                 first_shm: list[dict] | None = None) -> list[dict]:
    """Each combination in turn. The first step carries out `first_plan`/`first_shm` when the
    operator confirmed them; each later step (and the final kill) says its plan before acting."""
    from cockpit import actions

    rows = []
    for n, spec in enumerate(combinations(monitor.layout, vary)):
        if progress:
            progress(None, f"launching with {','.join(spec.enabled) or 'no flag sets'}")
        plan, names = (first_plan, first_shm) if n == 0 else (None, None)
        rows.append(await run_variant(monitor, spec, timeout, progress=progress, plan=plan, shm_names=names))
    plan = await actions.plan_kill(monitor.session, actions.run_scope(monitor.session, monitor.layout))
    if plan.entries and progress:
        for line in ["the last run is killed:"] + plan.describe():
            progress(None, line)
    refuse_unasked(plan, monitor.following)
    await stop_run(monitor, plan, "stopped: the ablation is over")
    return rows


def describe_ablation(rows: list[dict], vary: list[str]) -> list[str]:
    head = "  ".join(f"{v:<10}" for v in vary)
    lines = [f"{head}  {'outcome':<17} {'ready after':>11}  run"]
    for r in rows:
        cells = "  ".join(f"{'on' if v in r['flag_sets'] else 'off':<10}" for v in vary)
        ready = r["phase_times"].get("ready")
        lines.append(f"{cells}  {r['outcome']:<17} {'' if ready is None else f'{ready:.1f} s':>11}  {r['run_id']}")
    return lines
