"""The metrics parser on a hostile page: one line of N MiB that is nearly all short labels (a
local user listening on the layout's port serves it). Times `cockpit.read.metrics.parse` on it,
best of 3; with --against REV also the parser of that git revision (capped at --old-max MiB:
before the one-pass parser it copied the rest of the line for every label, O(n^2)).

    python tests/bench/metrics_hostile.py [--mib 1 2 4 6] [--against REV] [--old-max 0.5]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "agent")]

from test_shared_host_two import hostile_line

from cockpit.read import metrics


def best(parse, text: str, n: int = 3) -> float:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        parse(text)
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=float, nargs="+", default=[1, 2, 4, 6])
    ap.add_argument("--against", metavar="REV")
    ap.add_argument("--old-max", type=float, default=0.5)
    args = ap.parse_args()
    old = None
    if args.against:
        src = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{args.against}:cockpit/read/metrics.py"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        old = sys.modules["old_metrics"] = types.ModuleType("old_metrics")
        exec(compile(src, "old_metrics.py", "exec"), old.__dict__)
    sizes = sorted(set(args.mib) | ({0.125, 0.25, 0.5} if old else set()))
    for mib in sizes:
        text = hostile_line(int(mib * (1 << 20)))
        line = f"{mib:g} MiB: now {best(metrics.parse, text) * 1000:.0f} ms"
        if old is not None and mib <= args.old_max:
            line += f", {args.against} {best(old.parse, text, 1) * 1000:.0f} ms"
        print(line, flush=True)


if __name__ == "__main__":
    main()
