"""How many launches `cockpit bisect` takes, pure (the search against seeded outcome oracles, no
launch made): a flaky hang among four flag sets at p = 0.34 and 0.2 (found at >= 0.95, the launches
it took), and every deterministic single or pair cause among four and six flag sets and the
README's demo, against ddmin's count (the search before it weighed flakiness).

    python tests/bench/bisect_launches.py [--seeds 20] [--json OUT]
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "runs"), str(ROOT / "tests" / "bench")]

from benchlib import pct, report
from bisect_oracle import ddmin_launches, drive, flaky, layout_of

from cockpit.runs.bisect import make_plan
from cockpit.runs.layouts import resolve_layout


def flaky_runs(p: float, seeds: int, budget: int | None) -> dict:
    plan = make_plan(layout_of("graphs, flaky, allreduce, attn"), "h", budget=budget)
    counts, found, wrong = [], 0, []
    for seed in range(seeds):
        step, order, _ = drive(plan, flaky({"flaky"}, p, seed))
        counts.append(len(order))
        if step.status == "found" and step.answer == ["flaky"] and step.probability >= plan.confidence:
            found += 1
        else:
            wrong.append(
                {"seed": seed, "status": step.status, "answer": step.answer, "probability": round(step.probability, 3)}
            )
    return {
        "p": p,
        "seeds": seeds,
        "budget": plan.most(),
        "found_at_confidence": found,
        "launches_median": pct(counts, 0.5),
        "launches_p90": pct(counts, 0.9),
        "launches_max": max(counts),
        "missed": wrong,
    }


def deterministic() -> dict:
    rows = []
    for names in (
        ["graphs", "eagle3", "allreduce", "attn"],
        ["graphs", "eagle3", "allreduce", "attn", "part_a", "part_b"],
    ):
        plan = make_plan(layout_of(", ".join(names)), "h")
        for size in (1, 2):
            for culprit in itertools.combinations(names, size):
                step, order, _ = drive(plan, lambda on, culprit=culprit: set(culprit) <= set(on))
                rows.append(
                    {
                        "deltas": len(names),
                        "cause": "+".join(culprit),
                        "launches": len(order),
                        "ddmin": ddmin_launches(plan.names, lambda a, culprit=culprit: set(culprit) <= set(a)),
                        "right": set(step.answer) == set(culprit),
                        "probability": round(step.probability, 3),
                    }
                )
    demo = resolve_layout("demo")
    for label, plan, fails in (
        (
            "demo --good no_cuda_graph",
            make_plan(demo, "demo", good=["no_cuda_graph"]),
            lambda on: "eagle3" in on and "no_cuda_graph" not in on,
        ),
        ("demo, B (eagle3 on)", make_plan(demo, "demo", failing=demo.enabled), lambda on: "eagle3" in on),
    ):
        step, order, _ = drive(plan, fails)
        rows.append(
            {
                "deltas": len(plan.names),
                "cause": label,
                "launches": len(order),
                "ddmin": ddmin_launches(plan.names, lambda a, plan=plan, fails=fails: fails(plan.spec(a).enabled)),
                "right": step.status == "found",
                "probability": round(step.probability, 3),
            }
        )
    singles = [r for r in rows if "+" not in r["cause"] and "demo" not in r["cause"]]
    pairs = [r for r in rows if "+" in r["cause"]]
    return {
        "rows": rows,
        "singles": {
            "launches": sum(r["launches"] for r in singles),
            "ddmin": sum(r["ddmin"] for r in singles),
            "more_than_ddmin": sum(r["launches"] > r["ddmin"] for r in singles),
            "cases": len(singles),
        },
        "pairs": {
            "launches": sum(r["launches"] for r in pairs),
            "ddmin": sum(r["ddmin"] for r in pairs),
            "more_than_ddmin": sum(r["launches"] > r["ddmin"] for r in pairs),
            "cases": len(pairs),
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--json")
    args = ap.parse_args()
    report(
        {
            "flaky": [flaky_runs(0.34, args.seeds, None), flaky_runs(0.2, args.seeds, 150)],
            "deterministic": deterministic(),
        },
        args.json,
    )


if __name__ == "__main__":
    main()
