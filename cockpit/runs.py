"""Launch profiles into command lines, and starting a run through the agent.

A run's command is always an argument list: base flags, then each enabled flag set in the
layout's order, then parameters as `--name value`. Never a shell string."""

from __future__ import annotations

import itertools
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from cockpit.config import Layout, param_flag
from cockpit.diagnose import ALERTING, VerdictName
from cockpit.errors import CockpitError


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

SECRET = ("TOKEN", "KEY", "SECRET", "PASSWORD")


def masked(env: dict[str, str]) -> dict[str, str]:
    """Environment as recorded: values of names that look secret never reach the disk."""
    return {k: ("***" if any(s in k.upper() for s in SECRET) else v) for k, v in env.items()}


def state_home() -> Path:
    return Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "gpu-cockpit"


def ledger_path(layout: Layout) -> Path:
    return state_home() / "ledger" / f"{re.sub(r'[^A-Za-z0-9._-]', '_', layout.name)}.jsonl"


def append_ledger(layout: Layout, record: dict) -> None:
    """One line, appended and fsynced before the caller goes on: a cockpit killed at any moment
    loses no row (a torn last line is skipped on reading)."""
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
    """The latest run of this layout on this host that still has processes in its group (ready,
    stalled, or never watched to an outcome): what a cockpit started again after a crash, a quit or
    a dropped link follows."""
    for run in list(reversed(read_ledger(layout)))[:20]:
        if run.get("host") != session.target.label:
            continue
        if not run.get("pgid"):
            continue
        members = await session.request("kill_plan", pgids=[run["pgid"]], sids=[run["pgid"]])
        if members["plan"]:
            return run
    return None


async def resume(session, layout: Layout | None) -> dict | None:
    run = await find_live_run(session, layout) if layout is not None else None
    if run is not None:
        await session.follow_run(int(run["pgid"]), run.get("log"))
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
    if session.opts.sim_state:
        env["COCKPIT_SIM_STATE"] = session.opts.sim_state
    log = run_log_path(layout, run_id)
    if log.startswith("~/") and session.state.agent.home:
        log = session.state.agent.home + log[1:]
    if "forensics" in spec.enabled:  # torch's flight recorder armed, its pipes and dumps beside the run's log
        from cockpit.flightrec import forensics_env

        env.update(forensics_env(log.removesuffix(".log")))
    append_ledger(layout, {"event": "launch", "run_id": run_id, "layout": layout.name, "host": session.target.label,
                           "time": time.time(), "argv": argv, "flag_sets": list(spec.enabled),
                           "params": dict(spec.params), "env": masked(env), "log": log})
    run = await session.request("launch", argv=argv, env=env, cwd=layout.workdir, log=log)
    run["run_id"] = run_id
    append_ledger(layout, {"event": "started", "run_id": run_id, "pid": run["pid"], "pgid": run["pgid"],
                           "log": run["log"]})
    session.state.forget_dead()
    await session.follow_run(run["pgid"], run["log"])
    return run


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
            return verdict.name.value, verdict.evidence
        if phase.name in ("ready", "serving"):
            ready_at = ready_at or now
            if now - ready_at >= settle:
                return "ready", []
        elif now > deadline:
            return "timeout", [f"still '{phase}' after {timeout:.0f} s"]


async def stop_run(monitor, why: str) -> None:
    """End the run on screen before a launch, verified; the ledger keeps what the cockpit saw of
    it (a stalled run stays recorded as stalled, not as killed)."""
    from cockpit import actions

    session, layout = monitor.session, monitor.layout
    plan = await actions.plan_kill(session, actions.run_scope(session))
    if not plan.entries:
        return
    _record_seen(monitor)
    with monitor.stopping_for(why):
        report = await actions.kill(session, plan, layout.kill_wait_s, layout.ports)
    if not report["verified"]:
        raise CockpitError("the previous run is not fully gone: " + "; ".join(actions.describe_kill(report)[1:]))


def _record_seen(monitor) -> None:
    """The verdict the cockpit saw of a ledger run that has no outcome yet, written before it is
    stopped."""
    run, layout = monitor.following, monitor.layout
    if not run or not layout or run.get("outcome_written"):
        return
    verdict = monitor.verdict
    outcome = verdict.name.value if verdict.name in ALERTING else (
        "ready" if monitor.phase.name in ("ready", "serving") else "stopped")
    append_ledger(layout, {"event": "outcome", "run_id": run["run_id"], "outcome": outcome,
                           "phase_times": monitor.watchdog.phase_times(), "evidence": verdict.evidence,
                           "dumps": None, "time": time.time()})
    run["outcome_written"] = True


async def run_variant(monitor, spec: RunSpec, timeout: float, clean_shm: bool = True,
                      dump_on_stall: bool = True, progress=None, settle: float = 0.0) -> dict:
    """One step of a bisection: end what runs, clean shm, launch, watch, dump on a stall, record."""
    from cockpit import actions, stacks

    session, layout = monitor.session, monitor.layout
    await stop_run(monitor, "stopped for relaunch")
    if clean_shm:
        audit = await actions.shm_audit(session)
        names = [e["name"] for e in audit["entries"] if e["removable"]]
        if names:
            await actions.shm_clean(session, names)
    monitor.new_run()
    run = await launch(session, layout, spec)
    monitor.following = run
    outcome, evidence = await follow_to_outcome(monitor, timeout, progress, settle)
    dumps = None
    if outcome.startswith("stalled") and dump_on_stall:
        try:
            result = await stacks.dump_ranks(session, actions.rank_pids(session.state), run["run_id"])
            dumps = str(result.folder)
            evidence = evidence + [f"stacks: {line}" for line in stacks.describe_groups(result.groups)
                                   if not line.startswith("    ")]
        except CockpitError as exc:
            evidence = evidence + [f"no stack dump: {exc}"]
    row = {"event": "outcome", "run_id": run["run_id"], "outcome": outcome,
           "phase_times": monitor.watchdog.phase_times(), "evidence": evidence, "dumps": dumps, "time": time.time()}
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


async def ablate(monitor, vary: list[str], timeout: float, progress=None) -> list[dict]:
    rows = []
    for spec in combinations(monitor.layout, vary):
        if progress:
            progress(None, f"launching with {','.join(spec.enabled) or 'no flag sets'}")
        rows.append(await run_variant(monitor, spec, timeout, progress=progress))
    await stop_run(monitor, "stopped: the ablation is over")
    return rows


def describe_ablation(rows: list[dict], vary: list[str]) -> list[str]:
    head = "  ".join(f"{v:<10}" for v in vary)
    lines = [f"{head}  {'outcome':<17} {'ready after':>11}  run"]
    for r in rows:
        cells = "  ".join(f"{'on' if v in r['flag_sets'] else 'off':<10}" for v in vary)
        ready = r["phase_times"].get("ready")
        lines.append(f"{cells}  {r['outcome']:<17} {'' if ready is None else f'{ready:.1f} s':>11}  {r['run_id']}")
    return lines
