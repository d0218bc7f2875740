"""The workflows that drive a monitor through launches: watch a run to its outcome, relaunch (the
run on screen stopped by the one stop workflow, /dev/shm cleaned, the new run launched and
watched), ablation (each flag-set combination in turn), and the stop of the run a workflow
launched itself. The screen, `cockpit launch`, `cockpit ablate` and bisect run these; what they
call below takes plain values (cockpit/actions/launch.py: the launch itself, through the session)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from cockpit.actions import kill
from cockpit.actions.kill import KillPlan
from cockpit.common.errors import CockpitError
from cockpit.judge.verdict import Phase, Verdict, VerdictName
from cockpit.monitor.base import Monitor
from cockpit.runs.ledger import append_ledger
from cockpit.runs.spec import RunSpec, combinations

# What a workflow tells its caller as it goes: (phase, verdict) on each sample, (None, line) for
# what it does (the plan said before acting, the stop, the clean).
Progress = Callable[[Phase | None, "Verdict | str"], None]

TERMINAL = (VerdictName.STALLED_IDLE, VerdictName.STALLED_SPINNING, VerdictName.CRASHED)

# A launch's exit status by its outcome (`cockpit launch`, `cockpit ablate`; README "Exit status").
# 1 is a launch not made (declined at the prompt), 2 bad input.
EXIT_STATUS = {"ready": 0, "stalled-idle": 4, "stalled-spinning": 4, "crashed": 5, "timeout": 6, "interrupted": 130}


def exit_status(outcomes: list[str]) -> int:
    """0 when a launch came up (ready, serving); else the first failed outcome's status."""
    if any(EXIT_STATUS.get(o) == 0 for o in outcomes):
        return 0
    return next((EXIT_STATUS.get(o, 1) for o in outcomes), 1)


async def follow_to_outcome(
    monitor: Monitor,
    timeout: float,
    progress: Progress | None = None,
    settle: float = 0.0,
    interrupted: Callable[[], bool] | None = None,
) -> tuple[str, list[str]]:
    """Follow the monitor's run until it is ready (and stays so for `settle` seconds: some hangs
    come with the first requests), stalls, crashes or times out; returns (outcome, evidence). The
    verdict is the monitor's own: the screen shows the same. `interrupted()` true (the operator's
    Ctrl+C, SIGTERM, SIGHUP or a closed output during a launch, an ablation or a bisect) ends the
    watch with `interrupted`, the run left for its caller to stop."""
    async with monitor.judging():  # the endpoints and the engine's metrics probed, as on screen
        return await _follow(monitor, timeout, progress, settle, interrupted)


async def _follow(
    monitor: Monitor, timeout: float, progress: Progress | None, settle: float, interrupted: Callable[[], bool] | None
) -> tuple[str, list[str]]:
    deadline = time.monotonic() + timeout
    ready_at = None
    while True:
        await monitor.wait_samples(1, timeout=30)
        if interrupted is not None and interrupted():
            return "interrupted", ["the operator stopped watching before the run's outcome"]
        now = time.monotonic()
        phase, verdict = monitor.phase, monitor.verdict
        if progress:
            progress(phase, verdict)
        if verdict.name in TERMINAL:
            for _ in range(2):  # the log's own account (exit code, traceback) comes a tick after the ranks die
                await monitor.wait_samples(1, timeout=30)
                if monitor.verdict.name in TERMINAL:
                    verdict = monitor.verdict
            return verdict.name.value, verdict.evidence
        if phase.name in ("ready", "serving"):
            ready_at = ready_at or now
            if now - ready_at >= settle:
                return "ready", []
        elif now > deadline:
            return "timeout", [f"still '{phase}' after {timeout:.0f} s"]


def refuse_unasked(plan: KillPlan, launched: Mapping[str, Any] | None) -> None:
    """A kill nobody confirmed (an ablation's later steps, its final kill) may end only the run
    the ablation launched itself: found by the ledger rule, in the process group it started. Any
    other plan (a server found by its port or command, a colleague's) stops the ablation with the
    plan shown, nothing signalled."""
    if not plan.entries:
        return
    pgid = int(launched["pgid"]) if launched and launched.get("pgid") else None
    own = (
        pgid is not None
        and plan.sessions == [pgid]
        and (plan.rule or "").startswith("launched by this cockpit (ledger)")
    )
    if not own:
        raise CockpitError(
            f"the run found ({plan.rule}; root pid {plan.root}, {len(plan.entries)} processes) is not "
            f"the one this ablation launched"
            + (f" (process group {pgid})" if pgid is not None else "")
            + ": nothing was killed; kill it yourself if it is yours (`cockpit kill`, which asks), "
            "then start again"
        )


async def stop_run(
    monitor: Monitor, plan: KillPlan, why: str, say: Callable[[str], None] | None = None
) -> dict[str, Any] | None:
    """A relaunch's or an ablation's stop of the run on screen (monitor.stop, the one stop
    workflow), verified: an unverified stop raises, so nothing is launched beside it."""
    if not plan.entries:
        return None
    report = await monitor.stop(plan, why, whole_run=False)
    for line in kill.describe_kill(report):
        if say:
            say(line)
    if not report["verified"]:
        raise CockpitError("the previous run is not fully gone: " + "; ".join(kill.describe_kill(report)[1:]))
    return report


async def plan_relaunch(monitor: Monitor, clean_shm: bool = True) -> tuple[KillPlan, kill.ShmForRun | None, list[str]]:
    """What a (re)launch will do before it starts the new run, for the operator to confirm: the
    kill plan of the current run (every pid, user, start time, command, and the rule that found
    it) and the shm entries the clean after it will remove: only files tied to the run, each
    as listed (name, device, inode; kill.shm_for_run), the others said as left. Returns
    (plan, the ShmForRun or None when shm is left alone, lines).
    Two runs found: AmbiguousRun (the operator chooses, e.g. `cockpit kill --pid ROOT` first)."""
    plan = await monitor.plan_stop()
    lines = (
        ["the current run is killed and verified gone:"] + ["  " + line for line in plan.describe()]
        if plan.entries
        else ["no current run to kill" + (f" ({'; '.join(plan.notes)})" if plan.notes else "")]
    )
    lines += [f"  left alone: pid {f['root']}: {f['why']}" for f in plan.foreign if not plan.entries]
    found = None
    if clean_shm:
        audit = await monitor.shm_audit(uid=plan.uid)  # before the kill: the run still holds its files
        found = kill.shm_for_run(audit, plan, monitor.shm_held)
        lines += kill.describe_shm_for_run(found, audit["folder"])
    return plan, found, lines


async def run_variant(
    monitor: Monitor,
    spec: RunSpec,
    timeout: float,
    clean_shm: bool = True,
    dump_on_stall: bool = True,
    progress: Progress | None = None,
    settle: float = 0.0,
    plan: KillPlan | None = None,
    shm: kill.ShmForRun | None = None,
    interrupted: Callable[[], bool] | None = None,
) -> dict[str, Any]:
    """One step of a bisection: end what runs, clean shm, launch, watch, dump on a stall, record.

    `plan` and `shm` (from plan_relaunch) are what the operator confirmed: exactly that is
    carried out. Without them (an ablation's later steps) they are made here and said through
    `progress(None, line)` before anything is signalled or removed. The row returned (and kept in
    the ledger) says the stop and clean in one line, `summary`."""
    layout = monitor.layout
    if layout is None:
        raise CockpitError("a relaunch needs a layout: it names what is launched")

    def say(line: str) -> None:
        if progress:
            progress(None, line)

    await monitor.check_launch(spec)  # a launch refused stops nothing
    if plan is None:
        plan, found, lines = await plan_relaunch(monitor, clean_shm)
        shm = found if shm is None else shm
        for line in lines:
            say(line)
        refuse_unasked(plan, monitor.following)
    killed = [
        {"pid": e["pid"], "user": e.get("user"), "started": e.get("started"), "title": e["title"]} for e in plan.entries
    ]
    removed: list[str] = []
    said = []
    with monitor.stopping_for("stopped for relaunch"):  # until the new run replaces the dead ranks
        stopped = await stop_run(monitor, plan, "stopped for relaunch", say)
        said.append(stopped["summary"] if stopped else "no run to stop")
        if clean_shm:
            if shm is None:  # the plan came without it: only what the kill leaves tied to the run
                audit = await monitor.shm_audit(uid=plan.uid)
                shm = kill.shm_for_run(audit, plan, monitor.shm_held)
                for line in kill.describe_shm_for_run(shm, audit["folder"]):
                    say(line)
            done: dict[str, Any] = {"removed": [], "skipped": []}
            if shm.remove:
                done = await monitor.shm_clean(shm.remove, uid=plan.uid)
                removed = done["removed"]
                for line in kill.describe_clean(done, by_exit=bool(plan.entries)):
                    say(line)
            said.append(kill.summarize_clean(done, len(shm.left), by_exit=bool(plan.entries)))
            say(said[-1])  # the clean in one line, last: what a screen's progress keeps
        run = await monitor.launch(spec)
        monitor.follow(run)  # the door: the new run alone watched, judged afresh
    outcome, evidence = await follow_to_outcome(monitor, timeout, progress, settle, interrupted)
    folder = None
    if outcome.startswith("stalled") and dump_on_stall:
        await monitor.forensics_done()  # the stall's forensics, gathered once for every cockpit: read, not taken again
        gathered = monitor.forensics
        if gathered is not None and gathered.folder:
            folder = gathered.folder
            evidence = evidence + [f"stacks: {line}" for line in gathered.lines]
        else:
            try:
                ranks = await monitor.plan_dump(run=run)  # the run just launched, as the kill finds it
                result = await monitor.dump_stacks(ranks)
                folder = str(result.folder)
                evidence = evidence + [f"stacks: {line}" for line in result.report()]
            except CockpitError as exc:
                evidence = evidence + [f"no stack dump: {exc}"]
    row = {
        "event": "outcome",
        "run_id": run.run_id,
        "outcome": outcome,
        "phase_times": monitor.watchdog.phase_times(),
        "evidence": evidence,
        "dumps": folder,
        "time": time.time(),
        "killed_before": killed,
        "shm_removed": removed,
        "summary": ", ".join(said),
    }
    append_ledger(layout, row)
    return {**(run.record or {}), **row, "flag_sets": list(spec.enabled)}


def describe_launch(row: dict[str, Any]) -> list[str]:
    """A launch's outcome (run_variant's row) in lines: its stop and clean, the outcome and its
    evidence, where its log is."""
    return [
        row["summary"],
        f"{row['run_id']}: {row['outcome']}",
        *(f"  {line}" for line in row["evidence"]),
        f"log: {row['log']}",
    ]


async def ablate(
    monitor: Monitor,
    vary: list[str],
    timeout: float,
    progress: Progress | None = None,
    first_plan: KillPlan | None = None,
    first_shm: kill.ShmForRun | None = None,
    interrupted: Callable[[], bool] | None = None,
) -> list[dict[str, Any]]:
    """Each combination in turn. The first step carries out `first_plan`/`first_shm` when the
    operator confirmed them; each later step (and the final kill) says its plan before acting.
    `interrupted()` true ends the step under way and the ablation; its run is stopped as at the end."""
    if monitor.layout is None:
        raise CockpitError("an ablation needs a layout: it names what is launched")
    rows = []
    for n, spec in enumerate(combinations(monitor.layout, vary)):
        if interrupted is not None and interrupted():
            break
        if progress:
            progress(None, f"launching with {','.join(spec.enabled) or 'no flag sets'}")
        plan, names = (first_plan, first_shm) if n == 0 else (None, None)
        rows.append(
            await run_variant(monitor, spec, timeout, progress=progress, plan=plan, shm=names, interrupted=interrupted)
        )
    stopped = interrupted is not None and interrupted()
    await end_own_run(monitor, f"stopped: the ablation is {'interrupted' if stopped else 'over'}", progress)
    return rows


async def end_own_run(monitor: Monitor, why: str, progress: Progress | None = None) -> dict[str, Any] | None:
    """The last run of an ablation or a bisect stopped (monitor.stop, verified), its plan said
    first; only the run it launched itself (refuse_unasked)."""
    plan = await monitor.plan_stop()
    if plan.entries and progress:
        for line in ["the last run is killed:"] + plan.describe():
            progress(None, line)
    refuse_unasked(plan, monitor.following)
    return await stop_run(monitor, plan, why)


def describe_ablation(rows: list[dict[str, Any]], vary: list[str]) -> list[str]:
    head = "  ".join(f"{v:<10}" for v in vary)
    lines = [f"{head}  {'outcome':<17} {'ready after':>11}  run"]
    for r in rows:
        cells = "  ".join(f"{'on' if v in r['flag_sets'] else 'off':<10}" for v in vary)
        ready = r["phase_times"].get("ready")
        lines.append(f"{cells}  {r['outcome']:<17} {'' if ready is None else f'{ready:.1f} s':>11}  {r['run_id']}")
    return lines
