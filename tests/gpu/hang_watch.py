"""The two-GPU proof, watched through the cockpit's own code: a real NCCL job goes healthy, then
rank 1 stops joining the all-reduce; the watchdog's verdict, the per-rank and per-GPU figures
over time, py-spy dumps of both ranks grouped, then kill-and-verify. SVGs of each step.

    python tests/gpu/hang_watch.py --log /tmp/hang.log --out DIR
(tp_job.py must already be running with --hang-rank 1 --hang-after S, logging to --log)
"""

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cockpit.actions import (
    dumps,  # noqa: E402
    kill as actions,  # noqa: E402
)
from cockpit.host.session import HostSession, SessionOptions, WatchList  # noqa: E402
from cockpit.host.snapshot import snapshot_doc, state_from_doc  # noqa: E402
from cockpit.judge.diagnose import Watchdog  # noqa: E402
from cockpit.link.target import parse_target  # noqa: E402
from cockpit.read import stacks
from cockpit.runs.layoutfile import parse_layout  # noqa: E402
from cockpit.runs.run import Run  # noqa: E402
from cockpit.ui.app import CockpitApp  # noqa: E402
from cockpit.ui.headless import render  # noqa: E402


async def svg(state, verdict, path):
    doc = snapshot_doc(state, verdict=verdict)
    await render(CockpitApp(state=state_from_doc(doc)), (160, 50), 0, str(path), None)


def row(state):
    ranks = {p.rank: p for p in state.ranks() if p.alive}
    g = state.gpus
    return (
        " | ".join(f"TP{r}: cpu {p.cpu_pct:5.1f}% st {p.status}" for r, p in sorted(ranks.items()))
        + " || "
        + " | ".join(
            f"GPU{i}: util {x.util_pct}% {x.power_w}W/{x.power_limit_w}W mem {x.mem_used_mib}MiB"
            for i, x in sorted(g.items())
        )
    )


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--log", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--no-kill", action="store_true", help="leave the kill to `cockpit kill`")
    args = ap.parse_args()
    out = Path(args.out)
    layout = parse_layout(
        f"command: [tests/gpu/tp_job.py]\nengine: sglang\nlog: {args.log}\n"
        f"stall: {{idle_s: 15, spin_s: 15}}\nkill_wait_s: 10\n",
        "tp.yaml",
    )
    session = HostSession(
        parse_target("local"),
        SessionOptions(python=sys.executable),
        WatchList(patterns=["sglang::*", "*tp_job.py*"], logs=[args.log]),
    )
    await session.connect()
    dog = Watchdog(layout.stall.idle_s, layout.stall.spin_s)
    start = time.monotonic()
    verdict = None
    shot_healthy = False
    while time.monotonic() - start < args.timeout:
        await session.wait_samples(1)
        phase, verdict = dog.update(session.state, time.monotonic(), args.log)
        print(f"t={time.monotonic() - start:5.1f}s phase={phase} verdict={verdict} :: {row(session.state)}", flush=True)
        if not shot_healthy and phase.name == "serving" and time.monotonic() - start > 5:
            await svg(session.state, verdict, out / "step1-healthy.svg")
            shot_healthy = True
        if verdict.name.startswith("stalled") or verdict.name == "crashed":
            break
    print("VERDICT:", verdict)
    for e in verdict.evidence:
        print("  evidence:", e)
    await svg(session.state, verdict, out / "step2-hung.svg")
    ranks = actions.rank_pids(session.state)
    result = await dumps.dump_ranks(session, ranks, "h200-hang")
    print("STACKS (py-spy, grouped):")
    print("\n".join(stacks.describe_groups(result.groups)))
    for r, e in result.failed.items():
        print(f"rank {r}: no dump: {e}")
    (out / "dumps.txt").write_text(
        "".join(f"===== {f.name}\n{f.read_text()}\n" for f in sorted(result.folder.iterdir()))
    )
    if args.no_kill:
        await session.close()
        return
    before = {i: g.mem_used_mib for i, g in session.state.gpus.items()}
    plan = await actions.plan_kill(session, Run().scope(session.watch))
    print("KILL PLAN:")
    print("\n".join(plan.describe()))
    t = time.monotonic()
    report = await actions.kill(session, plan, layout.kill_wait_s, [])
    print(f"KILL took {time.monotonic() - t:.1f} s")
    print("\n".join(actions.describe_kill(report)))
    print("GPU memory before kill:", before)
    await session.wait_samples(2)
    await svg(session.state, None, out / "step3-killed.svg")
    await session.close()


if __name__ == "__main__":
    asyncio.run(main())
