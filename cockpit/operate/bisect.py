"""A bisect's launches: each candidate ddmin names (cockpit/runs/bisect.py) launched as a relaunch
is (relaunch.run_variant: the run before stopped by the one stop workflow, /dev/shm cleaned, the
new run watched to the monitor's own verdict), its outcome kept in the ledger as a step of the
bisect, so a second call with the same arguments resumes: candidates already judged are not
launched again. The operator's interrupt ends the watch at once, stops the run and keeps what
was learned."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from cockpit.actions.kill import KillPlan, ShmForRun
from cockpit.common.errors import CockpitError
from cockpit.monitor.base import Monitor
from cockpit.operate.relaunch import Progress, end_own_run, run_variant
from cockpit.runs.config import Layout
from cockpit.runs.bisect import EXIT, NOT_JUDGED, Plan, advance, describe_answer, judge, spec_doc
from cockpit.runs.ledger import append_ledger, read_bisects
from cockpit.runs.spec import new_run_id


def resumable(layout: Layout, plan: Plan) -> dict[str, Any] | None:
    """The latest bisect in the ledger with the same layout, host and configurations: the one a
    second call goes on with."""
    identity = plan.identity()
    same = [b for b in read_bisects(layout) if b["plan"].get("identity") == identity]
    return same[-1] if same else None


def describe_plan(plan: Plan, before: dict[str, Any] | None) -> list[str]:
    """What the operator confirms: the deltas, both configurations, the most launches, and the
    bisect it resumes (`before`, from `resumable`)."""
    n = len(before["steps"]) if before else 0
    return plan.describe() + ([f"  resumes {before['bisect_id']}: {n} launch{'es' if n != 1 else ''} already in "
                               f"the ledger"] if before else [])


def known_outcomes(plan: Plan, steps: list[dict[str, Any]]) -> dict[frozenset[str], list[str]]:
    """Each candidate's launches' outcomes, in order, from the bisect's steps (interrupted ones
    judge nothing)."""
    names = set(plan.names)
    outcomes: dict[frozenset[str], list[str]] = {}
    for step in steps:
        applied = step.get("applied")
        if isinstance(applied, list) and set(applied) <= names and step.get("outcome") not in NOT_JUDGED:
            outcomes.setdefault(frozenset(applied), []).append(str(step.get("outcome")))
    return outcomes


def candidate_text(plan: Plan, applied: Iterable[str]) -> str:
    """A candidate as the flag sets it launches with (and the parameters bisected)."""
    spec = plan.spec(applied)
    params = [f"{d.name}={spec.params[d.name]}" for d in plan.deltas if d.kind == "param" and d.name in spec.params]
    return ",".join(spec.enabled + params) or "no flag sets"


async def bisect(monitor: Monitor, plan: Plan, timeout: float, progress: Progress | None = None,
                 first_plan: KillPlan | None = None, first_shm: ShmForRun | None = None,
                 interrupted: Callable[[], bool] | None = None, fresh: bool = False,
                 on_step: Callable[[int, int, str], None] | None = None) -> dict[str, Any]:
    """Run the bisect to its end (found, not reproduced, the good configuration failing too,
    the budget spent) or the operator's interrupt (`interrupted()` true). The first launch
    carries out `first_plan`/`first_shm` as the operator confirmed them; each later one says its
    plan before acting and stops only the run the bisect launched. `on_step(n, most, text)` is
    told each launch as it starts. Returns the result document (`--json`)."""
    layout = monitor.layout
    if layout is None:
        raise CockpitError("bisect: a layout names what is launched")
    before = None if fresh else resumable(layout, plan)
    if before is None:
        bisect_id = "bisect-" + new_run_id(layout)
        append_ledger(layout, {"event": "bisect", "bisect_id": bisect_id, "identity": plan.identity(), "layout": layout.name,
                               "host": plan.host, "time": time.time(),
                               "deltas": [{"name": d.name, "kind": d.kind, "failing": d.failing, "good": d.good}
                                          for d in plan.deltas],
                               "failing": spec_doc(plan.spec(plan.names)), "good": spec_doc(plan.spec([])),
                               "repeat": plan.repeat, "budget": plan.budget, "settle": plan.settle})
        steps: list[dict[str, Any]] = []
    else:
        bisect_id, steps = before["bisect_id"], list(before["steps"])
    resumed = len(steps)
    outcomes = known_outcomes(plan, steps)
    first = True
    while True:
        step = advance(plan, outcomes, len(steps))
        if step.status is not None or step.applied is None:
            status, answer, why = step.status or "interrupted", step.answer, step.why
            break
        if interrupted is not None and interrupted():
            status, answer, why = "interrupted", [], "interrupted before the next launch"
            break
        text = candidate_text(plan, step.applied)
        if on_step:
            on_step(len(steps) + 1, plan.max_launches(), text)
        if progress:
            progress(None, f"bisect launch {len(steps) + 1} (at most {plan.max_launches()}): {text}")
        began = time.time()
        row = await run_variant(monitor, plan.spec(step.applied), timeout, progress=progress, settle=plan.settle,
                                plan=first_plan if first else None, shm=first_shm if first else None,
                                dump_on_stall=False, interrupted=interrupted)
        first = False
        rec = {"event": "bisect-step", "bisect_id": bisect_id, "run": row["run_id"],
               "applied": [n for n in plan.names if n in step.applied], "candidate": text,
               "flag_sets": list(row["flag_sets"]), "params": dict(row.get("params") or {}),
               "outcome": row["outcome"], "evidence": list(row["evidence"][:3]),
               "ready_s": (row.get("phase_times") or {}).get("ready"), "started": began,
               "seconds": round(time.time() - began, 1), "time": time.time()}
        append_ledger(layout, rec)
        steps.append(rec)
        if row["outcome"] in NOT_JUDGED:
            status, answer, why = "interrupted", [], "the operator stopped it; a second call resumes"
            break
        outcomes.setdefault(frozenset(step.applied), []).append(row["outcome"])
    if len(steps) > resumed:  # the last candidate launched is stopped: the bisect leaves nothing running
        await end_own_run(monitor, f"stopped: the bisection is {'interrupted' if status == 'interrupted' else 'over'}",
                          progress)
    if status == "interrupted" and not answer:
        answer = smallest_failing(plan, outcomes)
    result = {"event": "bisect-result", "bisect_id": bisect_id, "status": status, "answer": answer,
              "answer_text": describe_answer(plan, answer) if answer else "", "why": why, "launches": len(steps),
              "launched_now": len(steps) - resumed, "time": time.time()}
    append_ledger(layout, result)
    doc = {k: v for k, v in result.items() if k != "event"}
    doc.update({"exit": EXIT[status], "resumed": resumed, "plan": plan.describe(),
                "deltas": [d.describe() for d in plan.deltas], "repeat": plan.repeat, "budget": plan.budget,
                "settle": plan.settle,
                "steps": [{k: s.get(k) for k in ("run", "candidate", "applied", "flag_sets", "params", "outcome",
                                                 "evidence", "ready_s", "seconds", "started")}
                          for s in steps]})
    return doc


def smallest_failing(plan: Plan, outcomes: dict[frozenset[str], list[str]]) -> list[str]:
    """The smallest candidate known to fail (what an interrupted bisect learnt so far)."""
    failing = [a for a, o in outcomes.items() if judge(o, plan.repeat)]
    best = min(failing, key=len, default=None)
    return [n for n in plan.names if best is not None and n in best]


def describe_bisect(doc: dict[str, Any]) -> list[str]:
    """The answer, then every launch with its candidate, outcome and time."""
    head = {"found": f"the smallest failing set: {doc['answer_text']}",
            "not reproduced": "no failure reproduced with the failing configuration",
            "good fails": "the good configuration fails too: no delta is to blame",
            "budget exhausted": "the launch budget is spent"
                                + (f"; the smallest failing set so far: {doc['answer_text']}" if doc["answer"] else ""),
            "interrupted": "interrupted" + (f"; the smallest failing set so far: {doc['answer_text']}"
                                            if doc["answer"] else "")}[doc["status"]]
    lines = [f"{doc['bisect_id']}: {head}" + (f" ({doc['why']})" if doc.get("why") else ""),
             f"{doc['launches']} launches" + (f" ({doc['resumed']} from the ledger, {doc['launched_now']} now)"
                                              if doc["resumed"] else ""),
             f"  {'#':>3}  {'candidate':<36} {'outcome':<17} {'took':>7}  run"]
    for n, s in enumerate(doc["steps"], 1):
        took = f"{s['seconds']:.0f} s" if isinstance(s.get("seconds"), (int, float)) else "?"
        lines.append(f"  {n:>3}  {s.get('candidate') or '?':<36} {s.get('outcome') or '?':<17} {took:>7}  "
                     f"{s.get('run') or ''}")
    return lines
