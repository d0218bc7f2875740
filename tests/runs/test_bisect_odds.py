"""The bisect's search under flakiness, pure (cockpit/runs/bisect.py against seeded outcome
oracles): a flaky hang found with its odds, a deterministic one in no more launches than ddmin took
for a single cause, the failing configuration's first pass ending nothing, the host's facts."""

import itertools

import pytest
from bisect_oracle import ddmin_launches, drive, flaky, layout_of

from cockpit.common.errors import CockpitError
from cockpit.operate.bisect import odds_text
from cockpit.runs.bisect import (
    DEFAULT_CONFIDENCE,
    EXIT,
    advance,
    describe_answer,
    facts_agree,
    facts_changed,
    make_plan,
    odds,
)
from cockpit.runs.layouts import resolve_layout

FOUR = ["graphs", "flaky", "allreduce", "attn"]


@pytest.mark.parametrize("p, budget", [(0.34, None), (0.2, 150)])
def test_a_flaky_hang_is_found_at_095_in_19_of_20_seeded_runs(p, budget):
    """One flag set of four hangs a launch with probability p: the bisect names it alone, at
    least 95 % likely, in 19 of 20 seeded draws (docs/BENCHMARKS.md: the launches it took)."""
    plan = make_plan(layout_of(", ".join(FOUR)), "h", budget=budget)
    assert plan.confidence == DEFAULT_CONFIDENCE == 0.95
    found = 0
    for seed in range(20):
        step, order, _ = drive(plan, flaky({"flaky"}, p, seed))
        right = step.status == "found" and step.answer == ["flaky"] and step.probability >= 0.95
        found += right
        assert len(order) <= plan.most()
    assert found >= 19


def test_a_first_pass_of_the_failing_configuration_ends_nothing():
    plan = make_plan(layout_of(", ".join(FOUR)), "h")
    full = frozenset(plan.names)
    step = advance(plan, {full: ["ready"]}, 1)
    assert step.status is None and step.applied is not None
    assert odds(plan, {full: ["ready"]}).best()[1] < 0.95  # "not reproduced" is not yet likely enough
    then = advance(plan, {full: ["ready", "stalled-idle"]}, 2)
    assert then.status is None and dict(odds(plan, {full: ["ready", "stalled-idle"]}).answers)["not reproduced"] < 0.05


def test_a_hang_raises_the_odds_of_the_sets_it_holds_and_a_pass_lowers_them():
    plan = make_plan(layout_of(", ".join(FOUR)), "h")
    full, flaky_only = frozenset(plan.names), frozenset({"flaky"})
    index = 1 << plan.names.index("flaky")
    before = odds(plan, {full: ["stalled-idle"]})
    hung = odds(plan, {full: ["stalled-idle"], flaky_only: ["stalled-idle"]})
    passed = odds(plan, {full: ["stalled-idle"], flaky_only: ["ready"]})
    p = [dict(o.answers)[index] for o in (before, hung, passed)]
    assert p[1] > p[0] > p[2] > 0  # a pass is weak evidence: the set may be flaky
    assert hung.best()[0] == index


def test_a_deterministic_hang_takes_no_more_launches_than_ddmin_for_one_cause():
    """Every single cause among four and six flag sets in no more launches than ddmin took;
    every pair found as the pair (pairs weigh their odds over a few more launches, fewer in all:
    docs/BENCHMARKS.md)."""
    for names in (
        ["graphs", "eagle3", "allreduce", "attn"],
        ["graphs", "eagle3", "allreduce", "attn", "part_a", "part_b"],
    ):
        plan = make_plan(layout_of(", ".join(names)), "h")
        ours = theirs = 0
        for size in (1, 2):
            for culprit in itertools.combinations(names, size):
                step, order, _ = drive(plan, lambda on, culprit=culprit: set(culprit) <= set(on))
                assert step.status == "found" and set(step.answer) == set(culprit) and step.probability >= 0.95
                assert step.rate is not None and step.rate > 0.95  # it hangs every launch that holds it
                before = ddmin_launches(plan.names, lambda applied, culprit=culprit: set(culprit) <= set(applied))
                if size == 1:
                    assert len(order) <= before, culprit
                ours, theirs = ours + len(order), theirs + before
        assert ours < theirs


def test_the_readme_walk_through_on_the_demo_layout():
    """`cockpit bisect demo --good no_cuda_graph`: the simulated EAGLE-3 deadlock is in the draft
    CUDA graph's capture (cockpit/sim/server.py skips it with --disable-cuda-graph), so the answer
    is the pair; `B` on the demo (EAGLE-3 on) finds eagle3 in the 2 launches ddmin took."""
    demo = resolve_layout("demo")
    plan = make_plan(demo, "demo", good=["no_cuda_graph"])
    step, order, _ = drive(plan, lambda on: "eagle3" in on and "no_cuda_graph" not in on)
    assert describe_answer(plan, step.answer) == "eagle3 with no_cuda_graph off" and step.probability >= 0.95
    assert f"{step.probability:.0%}" == "97%" and len(order) == 6  # as the README says
    assert plan.describe()[0] == "bisect over 2: eagle3, no_cuda_graph off"
    ui = make_plan(demo, "demo", failing=demo.enabled)
    assert (
        odds_text(ui, advance(ui, {frozenset(ui.names): ["stalled-idle"]}, 1))
        == "eagle3 89%, the good configuration fails too 11%"
    )  # the header's odds after the first launch
    step, order, _ = drive(ui, lambda on: "eagle3" in on)
    assert step.answer == ["eagle3"] and len(order) == ddmin_launches(ui.names, lambda a: "eagle3" in a) == 2
    assert f"{step.probability:.0%}" == "99%" and step.rate >= 0.95  # "it hangs every launch that holds it"
    assert (
        ui.describe()[0] == "bisect over 1: eagle3"
        and "at most 24 launches; it ends when one answer is 95% likely" in ui.describe()[-1]
    )


def test_not_reproduced_good_fails_and_the_budget_end_the_search():
    plan = make_plan(layout_of("graphs, eagle3"), "h")
    step, order, _ = drive(plan, lambda on: False)
    assert step.status == "not reproduced" and step.probability >= 0.95 and EXIT[step.status] == 3
    assert len(order) > 1  # one pass of the failing configuration proves nothing of a flaky hang
    step, order, _ = drive(plan, lambda on: True)
    assert step.status == "good fails" and frozenset() in order and EXIT[step.status] == 4
    small = make_plan(layout_of("graphs, eagle3, allreduce, attn"), "h", budget=3)
    step, order, _ = drive(small, lambda on: "eagle3" in on)
    assert step.status == "budget exhausted" and len(order) == 3 and EXIT[step.status] == 5
    assert "eagle3" in step.answer and 0 < step.probability < 0.95  # the likeliest so far, with its odds


def test_resuming_replays_what_is_known_and_launches_only_the_rest():
    plan = make_plan(layout_of("graphs, eagle3, allreduce, attn"), "h")
    fails = lambda on: "attn" in on  # noqa: E731
    _, whole, outcomes = drive(plan, fails)
    for cut in range(len(whole)):
        known: dict = {}
        for applied in whole[:cut]:
            known.setdefault(applied, []).append(outcomes[applied][len(known.get(applied, []))])
        step, rest, _ = drive(plan, fails, known=known, launched=cut)
        assert step.answer == ["attn"] and rest == whole[cut:]
    # a larger budget or another confidence goes on where a smaller one stopped: the same bisect
    assert (
        make_plan(layout_of("graphs, eagle3"), "h", budget=2, confidence=0.99).identity()
        == make_plan(layout_of("graphs, eagle3"), "h").identity()
        != make_plan(layout_of("graphs, eagle3"), "other").identity()
    )
    edited = layout_of("graphs, eagle3")
    edited.flag_sets["eagle3"] = ["--speculative-algorithm", "EAGLE"]
    assert make_plan(edited, "h").identity() != make_plan(layout_of("graphs, eagle3"), "h").identity()


def test_a_higher_confidence_takes_more_launches_for_a_flaky_hang():
    layout = layout_of(", ".join(FOUR))
    counts = {}
    for confidence in (0.9, 0.99):
        plan = make_plan(layout, "h", confidence=confidence, budget=200)
        counts[confidence] = sum(len(drive(plan, flaky({"flaky"}, 0.34, seed))[1]) for seed in range(10))
    assert counts[0.99] > counts[0.9]


def test_launches_under_other_host_facts_are_not_the_same_evidence():
    old = {"driver": "550.54", "torch": "2.8.0"}
    assert facts_agree(old, {"driver": "550.54", "torch": "2.8.0", "sglang": "0.5.4"})  # a fact only one says
    assert facts_agree({}, old)  # a record from before facts were kept
    assert not facts_agree(old, {"driver": "560.28", "torch": "2.8.0"})
    assert facts_changed(old, {"driver": "560.28", "torch": "2.8.0"}) == "driver 550.54 → 560.28"


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"confidence": 1.0}, "--confidence 1.0: a probability from 0.5"),
        ({"confidence": 0.3}, "--confidence 0.3"),
        ({"budget": 0}, "at least 1 launch"),
    ],
)
def test_bad_odds_and_budgets_are_one_line_naming_the_fix(kw, message):
    with pytest.raises(CockpitError, match=message):
        make_plan(layout_of("attn"), "h", **kw)
