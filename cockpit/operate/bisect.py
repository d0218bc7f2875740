"""A bisect's launches: each candidate the search names (cockpit/runs/bisect.py) launched as a
relaunch is (relaunch.run_variant: the run before stopped by the one stop workflow, /dev/shm
cleaned, the new run watched to the monitor's own verdict), its outcome kept in the ledger as a
step of the bisect with the host's facts (driver, CUDA, the run's package versions), so a second
call with the same arguments resumes: launches made under the same facts are evidence again, those
made before an upgrade are set aside. The operator's interrupt ends the watch at once, stops the
run and keeps what was learned."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from cockpit.actions.kill import KillPlan, ShmForRun
from cockpit.common.errors import CockpitError
from cockpit.common.hosttext import count
from cockpit.monitor.base import Monitor
from cockpit.operate.relaunch import Progress, end_own_run, run_variant
from cockpit.runs.bisect import (
    EXIT,
    FAILING,
    NOT_JUDGED,
    PASSING,
    Plan,
    Step,
    advance,
    bisect_facts,
    describe_answer,
    facts_agree,
    facts_changed,
    known_outcomes,
    spec_doc,
    split_steps,
)
from cockpit.runs.ledger import append_ledger, resumable_bisect
from cockpit.runs.spec import new_run_id


@dataclass
class Prepared:
    """A bisect as it stands before it launches: the one it resumes (`before`), the steps whose
    facts agree with the host's (`steps`), those set aside, and the search's next step."""

    plan: Plan
    facts: dict[str, str]
    before: dict[str, Any] | None
    steps: list[dict[str, Any]] = field(default_factory=list)
    aside: list[dict[str, Any]] = field(default_factory=list)
    step: Step = field(default_factory=Step)

    @property
    def launches(self) -> bool:
        """Whether the bisect launches anything (else its answer is already in the ledger)."""
        return self.step.status is None

    def describe(self) -> list[str]:
        """What the operator confirms: the deltas, both configurations, the most launches, and
        the bisect it resumes: the launches reused, those set aside, or that nothing is launched."""
        lines = self.plan.describe()
        if self.before is not None:
            lines.append(
                f"  resumes {self.before['bisect_id']}: {count(len(self.steps), 'launch', 'launches')} "
                f"already in the ledger"
            )
        if self.aside:
            lines.append(
                f"  {count(len(self.aside), 'launch', 'launches')} of it set aside: made under other host "
                f"facts ({facts_changed(self.aside[-1].get('facts') or {}, self.facts)})"
            )
        if not self.launches:
            lines.append(
                f"  nothing is launched nor stopped: the ledger already answers ({self.step.status}: "
                f"{answer_text(self.plan, self.step)})"
            )
        return lines


def answer_text(plan: Plan, step: Step) -> str:
    if step.status == "good fails":
        return f"the good configuration fails too, {step.probability:.0%} likely"
    if step.status == "not reproduced":
        return f"no hang reproduced, {step.probability:.0%} likely"
    return f"{describe_answer(plan, step.answer)}, {step.probability:.0%} likely" if step.answer else "no answer yet"


async def prepare(monitor: Monitor, plan: Plan, fresh: bool = False) -> Prepared:
    layout = monitor.layout
    if layout is None:
        raise CockpitError("bisect: a layout names what is launched")
    facts = bisect_facts(monitor.state.agent.driver, await monitor.run_versions())
    before = None if fresh else resumable_bisect(layout, plan.identity())
    steps, aside = split_steps(list(before["steps"]) if before else [], facts)
    step = advance(plan, known_outcomes(plan, steps), len(steps))
    return Prepared(plan, facts, before, steps, aside, step)


def configurations(
    runs: list[dict[str, Any]], current: list[str] | None, health: str
) -> tuple[list[str] | None, list[str] | None]:
    """The failing and the good configuration (their flag sets) a bisect from the screen offers:
    the run on screen on the side its `health` says ("failing", "good", else "unknown"), the other
    side the latest run of the ledger that failed (its outcome or any verdict it was seen with),
    or came up. None: the ledger does not say."""

    def sets(run: dict[str, Any]) -> list[str]:
        return [str(n) for n in run.get("flag_sets") or []]

    def failed(run: dict[str, Any]) -> bool:
        said = [run.get("outcome")] + [v.get("verdict") for v in run.get("verdicts") or []]
        return any(v in FAILING for v in said)

    def came_up(run: dict[str, Any]) -> bool:
        return run.get("outcome") in PASSING or any(v.get("verdict") == "ok" for v in run.get("verdicts") or [])

    failing = current if health == "failing" else next((sets(r) for r in reversed(runs) if failed(r)), None)
    good = (
        current if health == "good" else next((sets(r) for r in reversed(runs) if came_up(r) and not failed(r)), None)
    )
    return failing, good


def candidate_text(plan: Plan, applied: Iterable[str]) -> str:
    """A candidate as the flag sets it launches with (and the parameters bisected)."""
    spec = plan.spec(applied)
    params = [f"{d.name}={spec.params[d.name]}" for d in plan.deltas if d.kind == "param" and d.name in spec.params]
    return ",".join(spec.enabled + params) or "no flag sets"


def odds_text(plan: Plan, step: Step) -> str:
    """The leading answers with their odds, as the header and the progress show them."""
    return ", ".join(f"{text} {p:.0%}" for text, p in step.odds[:3] if p >= 0.01)


async def bisect(
    monitor: Monitor,
    plan: Plan,
    timeout: float,
    progress: Progress | None = None,
    first_plan: KillPlan | None = None,
    first_shm: ShmForRun | None = None,
    interrupted: Callable[[], bool] | None = None,
    fresh: bool = False,
    on_step: Callable[[int, int, str, str], None] | None = None,
) -> dict[str, Any]:
    """Run the bisect to its end (an answer at the plan's confidence, the budget spent) or the
    operator's interrupt (`interrupted()` true). The first launch carries out
    `first_plan`/`first_shm` as the operator confirmed them; each later one says its plan before
    acting and stops only the run the bisect launched. `on_step(n, most, candidate, odds)` is
    told each launch as it starts, with the odds as they stand. Returns the result document
    (`--json`)."""
    layout = monitor.layout
    if layout is None:
        raise CockpitError("bisect: a layout names what is launched")
    ready = await prepare(monitor, plan, fresh)
    facts, before = dict(ready.facts), ready.before
    if before is None:
        bisect_id = "bisect-" + new_run_id(layout)
        append_ledger(
            layout,
            {
                "event": "bisect",
                "bisect_id": bisect_id,
                "identity": plan.identity(),
                "layout": layout.name,
                "host": plan.host,
                "time": time.time(),
                "deltas": [{"name": d.name, "kind": d.kind, "failing": d.failing, "good": d.good} for d in plan.deltas],
                "failing": spec_doc(plan.spec(plan.names)),
                "good": spec_doc(plan.spec([])),
                "confidence": plan.confidence,
                "budget": plan.budget,
                "settle": plan.settle,
                "facts": facts,
            },
        )
        every: list[dict[str, Any]] = []
    else:
        bisect_id, every = before["bisect_id"], list(before["steps"])
    steps, aside = split_steps(every, facts)
    resumed = len(steps)
    first = True
    while True:
        step = advance(plan, known_outcomes(plan, steps), len(steps))
        if step.status is not None or step.applied is None:
            status = step.status or "interrupted"
            break
        if interrupted is not None and interrupted():
            status, step.why = "interrupted", "interrupted before the next launch"
            break
        text = candidate_text(plan, step.applied)
        n = len(steps) + 1
        if on_step:
            on_step(n, plan.most(), text, odds_text(plan, step))
        if progress:
            progress(None, f"bisect launch {n} (at most {plan.most()}): {text}; odds: {odds_text(plan, step)}")
        began = time.time()
        row = await run_variant(
            monitor,
            plan.spec(step.applied),
            timeout,
            progress=progress,
            settle=plan.settle,
            plan=first_plan if first else None,
            shm=first_shm if first else None,
            dump_on_stall=False,
            interrupted=interrupted,
        )
        first = False
        seen = bisect_facts(monitor.state.agent.driver, await monitor.run_versions())  # the run just launched: its own
        if not facts_agree(seen, facts):  # the host changed under the bisect: what came before is set aside
            steps, more = split_steps(steps, seen)
            aside += more
        facts.update(seen)
        rec = {
            "event": "bisect-step",
            "bisect_id": bisect_id,
            "run": row["run_id"],
            "applied": [n for n in plan.names if n in step.applied],
            "candidate": text,
            "flag_sets": list(row["flag_sets"]),
            "params": dict(row.get("params") or {}),
            "outcome": row["outcome"],
            "evidence": list(row["evidence"][:3]),
            "ready_s": (row.get("phase_times") or {}).get("ready"),
            "started": began,
            "seconds": round(time.time() - began, 1),
            "time": time.time(),
            "facts": dict(seen),
        }
        steps.append(rec)
        after = advance(plan, known_outcomes(plan, steps), len(steps))
        rec["odds"] = [[t, round(p, 4)] for t, p in after.odds[:3]]
        append_ledger(layout, rec)
        if row["outcome"] in NOT_JUDGED:
            status, step.why = "interrupted", "the operator stopped it; a second call resumes"
            break
    launched_now = len(steps) - resumed
    if launched_now:  # the last candidate launched is stopped: the bisect leaves nothing running
        await end_own_run(
            monitor, f"stopped: the bisection is {'interrupted' if status == 'interrupted' else 'over'}", progress
        )
    blames = status in ("found", "budget exhausted", "interrupted") and bool(step.answer)
    answer = step.answer if blames else []
    result = {
        "event": "bisect-result",
        "bisect_id": bisect_id,
        "status": status,
        "answer": answer,
        "answer_text": describe_answer(plan, answer) if answer else "",
        "why": step.why,
        "probability": round(step.probability, 4),
        "rate": None if step.rate is None else round(step.rate, 3),
        "odds": [[t, round(p, 4)] for t, p in step.odds[:3]],
        "launches": len(steps),
        "launched_now": launched_now,
        "set_aside": len(aside),
        "time": time.time(),
    }
    append_ledger(layout, result)
    doc = {k: v for k, v in result.items() if k != "event"}
    doc.update(
        {
            "exit": EXIT[status],
            "resumed": resumed,
            "plan": plan.describe(),
            "deltas": [d.describe() for d in plan.deltas],
            "confidence": plan.confidence,
            "budget": plan.most(),
            "settle": plan.settle,
            "facts": facts,
            "steps": [
                {
                    k: s.get(k)
                    for k in (
                        "run",
                        "candidate",
                        "applied",
                        "flag_sets",
                        "params",
                        "outcome",
                        "odds",
                        "evidence",
                        "ready_s",
                        "seconds",
                        "started",
                    )
                }
                for s in steps
            ],
        }
    )
    return doc


def _rate(rate: float | None) -> str:
    if rate is None:
        return ""
    if rate >= 0.95:
        return "; it hangs every launch that holds it"
    return f"; a flaky hang: about 1 launch in {max(1.0, 1 / max(rate, 0.01)):.0f}"


def _odds_of(odds: Any, answer: Any) -> str:
    """The answer's probability after a launch, from the leading answers the step kept."""
    if not isinstance(odds, list) or not odds:
        return "-"
    for text, p in odds:
        if text == answer and isinstance(p, (int, float)):
            return f"{p:.0%}"
    last = odds[-1][1] if isinstance(odds[-1][1], (int, float)) else None
    return f"<{last:.0%}" if last is not None else "-"


def describe_bisect(doc: dict[str, Any]) -> list[str]:
    """The answer with its odds, then every launch: its outcome, time, the answer's odds after it
    and its candidate (last: a long one wraps between flag sets, never inside one)."""
    p = doc.get("probability")
    odds = f", {p:.0%} likely" if isinstance(p, (int, float)) else ""
    text = doc.get("answer_text") or ""
    head = {
        "found": f"the smallest failing set: {text}{odds}{_rate(doc.get('rate'))}",
        "not reproduced": f"no hang reproduced with the failing configuration{odds}",
        "good fails": f"the good configuration fails too: no delta is to blame{odds}",
        "budget exhausted": "the launch budget is spent"
        + (f"; the likeliest answer so far: {text}{odds}" if doc["answer"] else ""),
        "interrupted": "interrupted" + (f"; the likeliest answer so far: {text}{odds}" if doc["answer"] else ""),
    }[doc["status"]]
    lines = [
        f"{doc['bisect_id']}: {head}" + (f" ({doc['why']})" if doc.get("why") else ""),
        count(doc["launches"], "launch", "launches")
        + (f" ({doc['resumed']} from the ledger, {doc['launched_now']} now)" if doc["resumed"] else "")
        + (
            f"; {count(doc['set_aside'], 'launch', 'launches')} set aside (other host facts)"
            if doc.get("set_aside")
            else ""
        ),
        f"  {'#':>3}  {'outcome':<16} {'took':>6}  {'odds':>5}  candidate",
    ]
    final = (doc.get("odds") or [[None]])[0][0]
    for n, s in enumerate(doc["steps"], 1):
        took = f"{s['seconds']:.0f} s" if isinstance(s.get("seconds"), (int, float)) else "?"
        lines.append(
            f"  {n:>3}  {s.get('outcome') or '?':<16} {took:>6}  {_odds_of(s.get('odds'), final):>5}  "
            f"{(s.get('candidate') or '?').replace(',', ', ')}"
        )
    runs = [s.get("run") for s in doc["steps"] if s.get("run")]
    if runs:
        lines.append("runs: " + ", ".join(runs))
    return lines
