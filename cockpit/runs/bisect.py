"""Delta debugging (Zeller's ddmin) over a layout's flag sets and parameters: the smallest set of
differences between a failing configuration and a good one that still fails. Pure: plain values
in, plain values out, no launch and no I/O; the workflow that launches each candidate is
cockpit/operate/bisect.py.

The search is replayed from the start at every step against the outcomes known so far (the
ledger's, so a bisect resumes where it stopped): `advance` names the next candidate to launch, or
says the search is over. A candidate fails on its first failing launch; it passes only after
`repeat` clean launches (real hangs are flaky); a launch budget bounds the whole search.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from cockpit.common.errors import CockpitError
from cockpit.runs.spec import RunSpec

FAILING = ("stalled-idle", "stalled-spinning", "crashed", "timeout")  # a launch that fails the candidate
PASSING = ("ready",)  # ready (or serving) for the settle window: one clean launch
NOT_JUDGED = ("interrupted",)
DEFAULT_SETTLE_S = 10.0  # how long a candidate must stay ready (or serving) to pass  # a launch stopped before its outcome: counted in the budget, judges nothing

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
    repeat: int = 1
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
        (and what it launches), the host and both configurations. Not the repeat, budget or settle: a larger budget goes
        on where a smaller one stopped."""
        doc = {"layout": self.layout, "host": self.host, "failing": spec_doc(self.spec(self.names)),
               "good": spec_doc(self.spec([])), "launches": self.launches}
        return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def max_launches(self) -> int:
        """The most launches the search can take: every candidate ddmin may try (never more than
        2^n distinct ones; Zeller's bound n^2 + 3n), each `repeat` times, within the budget."""
        n = len(self.deltas)
        most = min(2 ** n, n * n + 3 * n + 1) * self.repeat
        return most if self.budget is None else min(most, self.budget)

    def describe(self) -> list[str]:
        fail, good = self.spec(self.names), self.spec([])
        lines = [f"bisect over {len(self.deltas)}: " + ", ".join(d.describe() for d in self.deltas),
                 f"  failing: {', '.join(fail.enabled) or 'no flag sets'}",
                 f"  good:    {', '.join(good.enabled) or 'no flag sets'}"]
        if self.held:
            lines.append(f"  on in every launch: {', '.join(self.held)}")
        lines.append(f"  at most {self.max_launches()} launches"
                     + (f" (budget {self.budget})" if self.budget is not None else "")
                     + (f"; a pass needs {self.repeat} clean launches" if self.repeat > 1 else "")
                     + "; a failure is final")
        return lines


def spec_doc(spec: RunSpec) -> dict:
    return {"flag_sets": list(spec.enabled), "params": dict(spec.params)}


def check_counts(repeat: int, budget: int | None) -> None:
    if repeat < 1:
        raise CockpitError(f"--repeat {repeat}: a pass needs at least 1 clean launch")
    if budget is not None and budget < 1:
        raise CockpitError(f"--budget {budget}: at least 1 launch")


def make_plan(layout, host: str, failing: list[str] | None = None, good: list[str] | None = None,
              vary: list[str] | None = None, repeat: int = 1, budget: int | None = None,
              settle: float = 0.0) -> Plan:
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
            raise CockpitError(f"--vary {item!r}: not a flag set ({', '.join(sets) or 'none'}) nor a parameter "
                               f"({', '.join(params) or 'none'}; NAME or NAME=GOOD_VALUE)")
    check_counts(repeat, budget)
    fail_on = set(layout.enabled if failing is None else failing) | {s for s in vary_sets if s not in good_on}
    differ = [s for s in sets if (s in fail_on) != (s in good_on)]
    names = vary_sets if vary else differ
    for s in names:
        if s not in differ:
            raise CockpitError(f"--vary {s}: {s} is {'on' if s in fail_on else 'off'} in both the failing and "
                               f"the good configuration; name it in --good to search it")
    for s in differ:
        if s not in names and s in good_on:  # a set only --vary searches; the others hold the failing side
            raise CockpitError(f"--good {s}: {s} is off in the failing configuration and --vary does not name it: "
                               f"add it to --vary")
    deltas = [Delta(s, "on" if s in fail_on else "off") for s in sets if s in names]
    for name, good_value in vary_params.items():
        if params.get(name) is None:
            raise CockpitError(f"--vary {name}: the layout gives {name} no value to bisect from")
        deltas.append(Delta(name, "param", params.pop(name), good_value))
    if not deltas:
        raise CockpitError("nothing to bisect: the failing and the good configuration are the same "
                           "(name the suspects with --vary, or a good configuration with --good)")
    held = [s for s in sets if s in fail_on and s not in names]
    launches = json.dumps([layout.command, layout.base_flags, layout.flag_sets], sort_keys=True, default=str)
    return Plan(layout.name, host, deltas, held, params, sets, repeat, budget, settle, launches)


# ----------------------------------------------------------------------------- the search


@dataclass
class Step:
    """The search's next move: launch `applied` (a candidate), or the search is over (`status`)."""

    applied: frozenset | None = None  # the candidate to launch next
    status: str | None = None  # when over: a key of EXIT
    answer: list[str] = field(default_factory=list)  # the smallest failing set found (or known so far)
    why: str = ""


def judge(outcomes: list[str], repeat: int) -> bool | None:
    """A candidate's verdict from its launches: True (fails) on any failing launch, False (passes)
    after `repeat` clean ones, None while undecided."""
    if any(o in FAILING for o in outcomes):
        return True
    if sum(o in PASSING for o in outcomes) >= repeat:
        return False
    return None


def _chunks(items: list, n: int) -> list[list]:
    size, extra = divmod(len(items), n)
    out, at = [], 0
    for k in range(n):
        step = size + (1 if k < extra else 0)
        out.append(items[at:at + step])
        at += step
    return [c for c in out if c]


def ddmin(deltas: list[str]):
    """Zeller's ddmin as a generator: yields each candidate (a frozenset of deltas applied) and is
    sent whether it fails; returns the 1-minimal failing list. The whole set is taken as failing."""
    c, n = list(deltas), 2
    while len(c) >= 2:
        chunks = _chunks(c, n)
        for chunk in chunks:
            if (yield frozenset(chunk)):
                c, n = chunk, 2
                break
        else:
            for chunk in (chunks if n > 2 else []):  # with two chunks each complement is the other chunk
                rest = [x for x in c if x not in chunk]
                if (yield frozenset(rest)):
                    c, n = rest, max(n - 1, 2)
                    break
            else:
                if n >= len(c):
                    break
                n = min(len(c), 2 * n)
    return c


def advance(plan: Plan, outcomes: dict[frozenset, list[str]], launched: int) -> Step:
    """The next step of the search given every launch's outcome so far (`outcomes`: candidate ->
    its launches' outcomes in order) and how many launches the bisect made (interrupted ones too).

    Order: the failing configuration first (not reproduced: the search stops), then ddmin; the
    good configuration is launched only when the answer is a single delta (or ddmin needs it):
    its failing too means no delta is to blame."""
    names = plan.names
    smallest = list(names)

    def want(applied: frozenset) -> bool | None:
        return judge(outcomes.get(applied, []), plan.repeat)

    def launch(applied: frozenset) -> Step:
        if plan.budget is not None and launched >= plan.budget:
            return Step(status="budget exhausted", answer=smallest,
                        why=f"{launched} launches made, the budget is {plan.budget}")
        return Step(applied=applied)

    full = frozenset(names)
    verdict = want(full)
    if verdict is None:
        return launch(full)
    if verdict is False:
        return Step(status="not reproduced", why=f"the failing configuration passed {plan.repeat} clean launches")
    search = ddmin(names)
    answer = None
    try:
        applied = next(search)
        while True:
            verdict = want(applied)
            if verdict is None:
                return launch(applied)
            if verdict and len(applied) < len(smallest):
                smallest = [n for n in names if n in applied]
            applied = search.send(verdict)
    except StopIteration as done:
        answer = done.value
    if len(answer) == 1:  # a single delta is to blame only if the good configuration passes
        verdict = want(frozenset())
        if verdict is None:
            return launch(frozenset())
        if verdict:
            return Step(status="good fails", answer=[])
    return Step(status="found", answer=[n for n in names if n in answer])


def describe_answer(plan: Plan, answer: list[str]) -> str:
    """`eagle3`, or `eagle3 with no_cuda_graph off` when only the two together fail."""
    by_name = {d.name: d for d in plan.deltas}
    return " with ".join(by_name[n].describe() if n in by_name else n for n in answer) or "nothing"
