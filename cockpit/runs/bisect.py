"""A bisect over a layout's flag sets and parameters under flakiness: which set of differences
between a failing configuration and a good one makes the launch hang, with its odds. Pure: plain
values in, plain values out, no launch and no I/O; the workflow that launches each candidate is
cockpit/operate/bisect.py.

Every launch is evidence (a hang strong, a pass weak while the hang may be flaky: `Model`); the
odds of each answer are computed afresh at every step from the outcomes known so far (the
ledger's, so a bisect resumes where it stopped): `advance` names the launch that tells the most,
or says the search is over: one answer at least `confidence` likely, or the budget spent.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any

from cockpit import engines
from cockpit.common.errors import CockpitError
from cockpit.common.hosttext import count
from cockpit.runs.spec import RunSpec

FAILING = ("stalled-idle", "stalled-spinning", "crashed", "timeout")  # a launch that fails the candidate
PASSING = ("ready",)  # ready (or serving) for the settle window: one clean launch
NOT_JUDGED = ("interrupted",)  # a launch stopped before its outcome: counted in the budget, judges nothing
DEFAULT_SETTLE_S = 10.0  # how long a candidate must stay ready (or serving) to pass
DEFAULT_CONFIDENCE = 0.95

# How a bisect ends: its `status` and the command's exit status (README, `cockpit bisect --help`).
EXIT = {"found": 0, "not reproduced": 3, "good fails": 4, "budget exhausted": 5, "interrupted": 130}


@dataclass(frozen=True)
class Delta:
    """One difference between the failing configuration and the good one: a flag set on in the
    failing one (`eagle3`), a flag set off in it (`no_cuda_graph off`), or a parameter's value."""

    name: str
    kind: str  # "on", "off" (a flag set's state in the failing configuration) or "param"
    failing: object = None  # a parameter's value in the failing configuration
    good: object = None  # ... and in the good one (None: not passed)

    def describe(self) -> str:
        if self.kind == "on":
            return self.name
        if self.kind == "off":
            return f"{self.name} off"
        return f"{self.name}={self.failing}" + (f" (good: {self.good})" if self.good is not None else " (good: unset)")


@dataclass
class Plan:
    """What a bisect searches: the deltas (the layout's order), and the configurations either side.
    `held` are the flag sets on in every candidate; `params` the parameters not varied."""

    layout: str
    host: str
    deltas: list[Delta]
    held: list[str]
    params: dict[str, object]
    flag_order: list[str]
    confidence: float = DEFAULT_CONFIDENCE
    budget: int | None = None
    settle: float = 0.0
    launches: str = ""  # what the layout launches (command, base flags, flag sets): an edited layout is a new bisect

    @property
    def names(self) -> list[str]:
        return [d.name for d in self.deltas]

    def spec(self, applied) -> RunSpec:
        """The candidate with the deltas `applied` (their failing side), every other at its good
        side: none applied is the good configuration, all applied the failing one."""
        applied = set(applied)
        on = set(self.held)
        params = dict(self.params)
        for d in self.deltas:
            if d.kind == "param":
                value = d.failing if d.name in applied else d.good
                if value is not None:
                    params[d.name] = value
            elif (d.kind == "on") == (d.name in applied):
                on.add(d.name)
        return RunSpec(enabled=[n for n in self.flag_order if n in on], params=params)

    def identity(self) -> str:
        """What makes two calls the same bisect (a second call resumes the first): the layout
        (and what it launches), the host and both configurations. Not the confidence, budget or
        settle: a larger budget goes on where a smaller one stopped. The host's facts (versions)
        key each launch instead (cockpit/operate/bisect.py): an upgrade sets earlier ones aside."""
        doc = {
            "layout": self.layout,
            "host": self.host,
            "failing": spec_doc(self.spec(self.names)),
            "good": spec_doc(self.spec([])),
            "launches": self.launches,
        }
        return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def most(self) -> int:
        """The most launches the search makes: the budget, else `default_budget`."""
        return self.budget if self.budget is not None else default_budget(len(self.deltas))

    def describe(self) -> list[str]:
        fail, good = self.spec(self.names), self.spec([])
        lines = [
            f"bisect over {len(self.deltas)}: " + ", ".join(d.describe() for d in self.deltas),
            f"  failing: {', '.join(fail.enabled) or 'no flag sets'}",
            f"  good:    {', '.join(good.enabled) or 'no flag sets'}",
        ]
        if self.held:
            lines.append(f"  on in every launch: {', '.join(self.held)}")
        lines.append(
            f"  at most {count(self.most(), 'launch', 'launches')}"
            + (" (the budget)" if self.budget is not None else "")
            + f"; it ends when one answer is {self.confidence:.0%} likely (a flaky hang counted)"
        )
        return lines


def default_budget(n: int) -> int:
    """Launches enough for a hang one launch in three among `n` deltas, in nearly every draw
    (tests/bench/bisect_launches.py measures it; a rarer hang needs --budget)."""
    return 16 + 8 * n


def spec_doc(spec: RunSpec) -> dict:
    return {"flag_sets": list(spec.enabled), "params": dict(spec.params)}


def check_counts(confidence: float, budget: int | None) -> None:
    if not 0.5 <= confidence < 1:
        raise CockpitError(
            f"--confidence {confidence}: a probability from 0.5 to below 1 (0.95: an answer "
            f"19 times more likely than not)"
        )
    if budget is not None and budget < 1:
        raise CockpitError(f"--budget {budget}: at least 1 launch")


def make_plan(
    layout,
    host: str,
    failing: list[str] | None = None,
    good: list[str] | None = None,
    vary: list[str] | None = None,
    confidence: float = DEFAULT_CONFIDENCE,
    budget: int | None = None,
    settle: float = 0.0,
) -> Plan:
    """The bisect between `failing` (flag sets; default the layout's enabled ones, plus the sets
    `vary` names) and `good` (default none). `vary` names the flag sets and parameters to search
    (`NAME` or `NAME=GOOD` for a parameter, whose good side is otherwise unset); without it, every
    flag set on in one configuration and off in the other. Bad names: one line naming the fix."""
    sets, params = list(layout.flag_sets), dict(layout.params)
    good_on = set(good or [])
    for name in list(good_on) + list(failing or []):
        if name not in layout.flag_sets:
            raise CockpitError(f"{layout.path}: no flag set {name!r} (flag sets: {', '.join(sets) or 'none'})")
    vary_sets, vary_params = [], {}
    for item in vary or []:
        name, sep, value = item.partition("=")
        if name in layout.flag_sets and not sep:
            vary_sets.append(name)
        elif name in layout.params:
            vary_params[name] = value if sep else None
        else:
            raise CockpitError(
                f"--vary {item!r}: not a flag set ({', '.join(sets) or 'none'}) nor a parameter "
                f"({', '.join(params) or 'none'}; NAME or NAME=GOOD_VALUE)"
            )
    check_counts(confidence, budget)
    fail_on = set(layout.enabled if failing is None else failing) | {s for s in vary_sets if s not in good_on}
    differ = [s for s in sets if (s in fail_on) != (s in good_on)]
    names = vary_sets if vary else differ
    for s in names:
        if s not in differ:
            raise CockpitError(
                f"--vary {s}: {s} is {'on' if s in fail_on else 'off'} in both the failing and "
                f"the good configuration; name it in --good to search it"
            )
    for s in differ:
        if s not in names and s in good_on:  # a set only --vary searches; the others hold the failing side
            raise CockpitError(
                f"--good {s}: {s} is off in the failing configuration and --vary does not name it: add it to --vary"
            )
    deltas = [Delta(s, "on" if s in fail_on else "off") for s in sets if s in names]
    for name, good_value in vary_params.items():
        if params.get(name) is None:
            raise CockpitError(f"--vary {name}: the layout gives {name} no value to bisect from")
        deltas.append(Delta(name, "param", params.pop(name), good_value))
    if not deltas:
        raise CockpitError(
            "nothing to bisect: the failing and the good configuration are the same "
            "(name the suspects with --vary, or a good configuration with --good)"
        )
    held = [s for s in sets if s in fail_on and s not in names]
    launches = json.dumps([layout.command, layout.base_flags, layout.flag_sets], sort_keys=True, default=str)
    return Plan(layout.name, host, deltas, held, params, sets, confidence, budget, settle, launches)


# ----------------------------------------------------------------------------- the search


@dataclass(frozen=True)
class Model:
    """How a launch is read as evidence (flake-aware culprit finding, as git_bayesect does): the
    cause is one set of deltas S (they hang only together), or the good configuration itself
    (`good fails`), or nothing (`not reproduced`). A launch holding the cause hangs always
    (`deterministic`, the prior most hangs earn) or at a rate r, one of `rates` as likely as each
    other (a flaky hang); a launch that does not hold it hangs only by `noise` (a crash of the
    host's own). A hang is strong evidence, a pass weak while the cause may be flaky: one pass of
    a launch holding S rules out only S's deterministic side."""

    deterministic: float = 0.8
    rates: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
    noise: float = 0.01
    good_fails: float = 0.1  # the prior of each of the two answers that blame no delta
    not_reproduced: float = 0.1
    size: float = 0.3  # the sets of k deltas share size^k of the rest: most hangs have one cause, some two

    def weight(self, hangs: int, passes: int) -> float:
        """The chance of `hangs` hangs and `passes` passes of launches holding the cause."""
        det = self.deterministic if passes == 0 else 0.0
        return det + (1 - self.deterministic) * sum(r**hangs * (1 - r) ** passes for r in self.rates) / len(self.rates)

    def rate(self, hangs: int, passes: int) -> float:
        """The cause's hang rate as the launches holding it say (1 for a deterministic hang): the
        chance the next launch holding it hangs."""
        return self.weight(hangs + 1, passes) / self.weight(hangs, passes)


MODEL = Model()
GOOD, NONE = "good fails", "not reproduced"  # the two answers that blame no delta
ALL_SETS_UP_TO = 8  # deltas up to this many: every set of them a suspect; beyond, sets of one or two


def hung(outcome: str) -> bool | None:
    """A launch's evidence: True (it hung or crashed), False (it passed), None (judges nothing)."""
    return True if outcome in FAILING else False if outcome in PASSING else None


@dataclass(frozen=True)
class Odds:
    """The posterior over the answers after the launches known: `answers` (a delta set as a
    bitmask over the plan's names, GOOD or NONE) with their probabilities, most likely first, and
    each set's hang rate."""

    names: tuple[str, ...]
    answers: tuple[tuple[object, float], ...]
    rates: dict

    def best(self) -> tuple[object, float]:
        return self.answers[0]

    def names_of(self, answer) -> list[str]:
        return [n for i, n in enumerate(self.names) if isinstance(answer, int) and answer >> i & 1]


def _suspects(n: int) -> list[int]:
    masks = range(1, 1 << n)
    return list(masks) if n <= ALL_SETS_UP_TO else [m for m in masks if bin(m).count("1") <= 2]


def _prior(n: int, model: Model) -> dict:
    """Smaller sets first (the sets of k deltas share size^k), the two answers that blame no
    delta their own share."""
    sets = _suspects(n)
    by_size: dict[int, int] = {}
    for m in sets:
        by_size[bin(m).count("1")] = by_size.get(bin(m).count("1"), 0) + 1
    total = sum(model.size**k for k in by_size)
    share = 1 - model.good_fails - model.not_reproduced
    prior: dict = {m: share * model.size ** bin(m).count("1") / total / by_size[bin(m).count("1")] for m in sets}
    prior[GOOD], prior[NONE] = model.good_fails, model.not_reproduced
    return prior


def _tally(answer, launches: list[tuple[int, bool]]) -> tuple[int, int, int, int]:
    """(hangs, passes) of the launches holding the cause, then of those not holding it."""
    k = m = ef = ep = 0
    for mask, did_hang in launches:
        if _holds(answer, mask):
            k, m = k + did_hang, m + (not did_hang)
        else:
            ef, ep = ef + did_hang, ep + (not did_hang)
    return k, m, ef, ep


def _holds(answer, mask: int) -> bool:
    return answer == GOOD or (isinstance(answer, int) and answer & ~mask == 0)


def _posterior(n: int, launches: list[tuple[int, bool]], model: Model) -> tuple[dict, dict]:
    weights, tallies = {}, {}
    for answer, prior in _prior(n, model).items():
        k, m, ef, ep = _tally(answer, launches)
        weights[answer] = prior * model.weight(k, m) * model.noise**ef * (1 - model.noise) ** ep
        tallies[answer] = (k, m)
    total = sum(weights.values()) or 1.0
    return {a: w / total for a, w in weights.items()}, tallies


def _launches(plan: Plan, outcomes: dict) -> list[tuple[int, bool]]:
    index = {name: i for i, name in enumerate(plan.names)}
    out = []
    for applied, said in outcomes.items():
        mask = sum(1 << index[n] for n in applied if n in index)
        out += [(mask, h) for h in map(hung, said) if h is not None]
    return out


def odds(plan: Plan, outcomes: dict[frozenset, list[str]], model: Model = MODEL) -> Odds:
    """How likely each answer is after the launches known (`outcomes`: candidate -> its launches'
    outcomes)."""
    post, tallies = _posterior(len(plan.names), _launches(plan, outcomes), model)
    ranked = sorted(post.items(), key=lambda kv: (-kv[1], _order(kv[0])))
    return Odds(tuple(plan.names), tuple(ranked), {a: model.rate(*tallies[a]) for a, _ in ranked[:8]})


def _order(answer) -> tuple:
    return (0, bin(answer).count("1"), answer) if isinstance(answer, int) else (1, 0, 0 if answer == GOOD else 1)


def _entropy(p: float) -> float:
    return 0.0 if p <= 0.0 or p >= 1.0 else -(p * math.log2(p) + (1 - p) * math.log2(1 - p))


def best_launch(n: int, launches: list[tuple[int, bool]], model: Model = MODEL) -> int:
    """The candidate (a bitmask of deltas applied) whose outcome tells the most about the answer:
    the largest expected information gain, H(outcome) - E[H(outcome | answer)]; ties go to fewer
    deltas applied, then the layout's order."""
    post, tallies = _posterior(n, launches, model)
    live = [(a, p, model.rate(*tallies[a])) for a, p in post.items() if p > 1e-9]
    sets = _suspects(n)
    pool = (
        range(1 << n)
        if n <= ALL_SETS_UP_TO
        else sorted({0, (1 << n) - 1} | set(sets) | {((1 << n) - 1) & ~s for s in sets})
    )
    best, best_gain = (1 << n) - 1, -1.0
    for mask in sorted(pool, key=lambda m: (bin(m).count("1"), m)):
        p_hang = cond = 0.0
        for answer, p, q in live:
            q = q if _holds(answer, mask) else model.noise
            p_hang += p * q
            cond += p * _entropy(q)
        gain = _entropy(p_hang) - cond
        if gain > best_gain + 1e-9:
            best, best_gain = mask, gain
    return best


@dataclass
class Step:
    """The search's next move: launch `applied` (a candidate), or the search is over (`status`).
    `answer` is the most likely answer (its deltas; none for the two that blame none) with its
    `probability`; `odds` the leading answers as the operator reads them."""

    applied: frozenset | None = None  # the candidate to launch next
    status: str | None = None  # when over: a key of EXIT
    answer: list[str] = field(default_factory=list)
    probability: float = 0.0
    rate: float | None = None  # the answer's hang rate (1: every launch holding it hangs)
    odds: list[tuple[str, float]] = field(default_factory=list)
    why: str = ""


def advance(plan: Plan, outcomes: dict[frozenset, list[str]], launched: int, model: Model = MODEL) -> Step:
    """The next step given every launch's outcome so far (`outcomes`: candidate -> its launches'
    outcomes; order does not matter) and how many launches the bisect made (interrupted ones
    too). The failing configuration is launched first (the hang reproduced); then the launch that
    tells the most, until one answer is at least `plan.confidence` likely or the budget is spent.
    A pass of the failing configuration ends nothing: a flaky hang passes too."""
    names = plan.names
    now = odds(plan, outcomes, model)
    answer, p = now.best()
    said = [(describe_odds(plan, now, a), q) for a, q in now.answers[:3]]
    found = {GOOD: "good fails", NONE: "not reproduced"}.get(answer, "found") if isinstance(answer, str) else "found"
    step = Step(
        answer=now.names_of(answer),
        probability=p,
        odds=said,
        rate=now.rates.get(answer) if isinstance(answer, int) else None,
    )
    full = frozenset(names)
    tried = any(hung(o) is not None for o in outcomes.get(full, []))
    if p >= plan.confidence and tried:
        step.status = found
        return step
    if launched >= plan.most():
        step.status = "budget exhausted"
        step.why = f"{count(launched, 'launch', 'launches')} made, the budget is {plan.most()}"
        return step
    if not tried:
        step.applied = full
        return step
    mask = best_launch(len(names), _launches(plan, outcomes), model)
    step.applied = frozenset(n for i, n in enumerate(names) if mask >> i & 1)
    return step


def describe_odds(plan: Plan, now: Odds, answer) -> str:
    """An answer as the operator reads it: `eagle3`, `the good configuration fails too`."""
    if answer == GOOD:
        return "the good configuration fails too"
    if answer == NONE:
        return "no hang reproduced"
    return describe_answer(plan, now.names_of(answer))


FACT_KEYS = (
    "driver",
    "cuda_driver",
    "torch",
    *(p for e in engines.ENGINES.values() for p in e.packages),
    "nvidia-nccl-cu12",
    "nvidia-nccl-cu13",
    "flashinfer-python",
    "triton",
    "python",
)


def bisect_facts(driver: str | None, versions: dict[str, Any]) -> dict[str, str]:
    """What a launch's outcome is keyed by beside its command: the driver and CUDA, and the
    package versions of the run alive then (`versions`: the agent's answer; empty when no run was
    alive). A fact the host does not say is left out, never compared."""
    facts: dict[str, Any] = {"driver": driver}
    facts.update({k: versions.get(k) for k in ("driver", "cuda_driver") if versions.get(k)})
    facts.update({k: v for k, v in (versions.get("run") or {}).items() if k in FACT_KEYS})
    return {k: str(v)[:64] for k, v in facts.items() if k in FACT_KEYS and v}


def facts_agree(a: dict, b: dict) -> bool:
    """Whether two launches ran under the same host facts (versions): every fact both name is
    the same; one only one names is not compared (no run alive to read it from, an older ledger)."""
    return all(a[k] == b[k] for k in a.keys() & b.keys())


def split_steps(
    steps: list[dict[str, Any]], facts: dict[str, str]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The steps made under facts that agree with `facts` (evidence), and the others."""
    kept = [s for s in steps if facts_agree(s.get("facts") or {}, facts)]
    return kept, [s for s in steps if s not in kept]


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


def facts_changed(old: dict, new: dict) -> str:
    """`torch 2.8.0 → 2.9.0`: the facts that differ."""
    return ", ".join(f"{k} {old[k]} → {new[k]}" for k in sorted(old.keys() & new.keys()) if old[k] != new[k])


def describe_answer(plan: Plan, answer: list[str]) -> str:
    """`eagle3`, or `eagle3 with no_cuda_graph off` when only the two together fail."""
    by_name = {d.name: d for d in plan.deltas}
    return " with ".join(by_name[n].describe() if n in by_name else n for n in answer) or "nothing"
