"""What the interpreter check costs where the agent starts as root: `python -I -c pass` started
directly and through GUARD (cockpit/agent/__init__.py: /bin/sh, one find(1) per chain), median
of N starts each, interleaved.

    python tests/bench/python_guard.py [--python /usr/bin/python3] [--n 30]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[2])]

from cockpit.agent import guarded  # noqa: E402


def once(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--n", type=int, default=30)
    args = ap.parse_args()
    plain = [args.python, "-I", "-c", "pass"]
    direct, checked = [], []
    for _ in range(args.n):
        direct.append(once(plain))
        checked.append(once(guarded(plain)))
    d, c = statistics.median(direct) * 1000, statistics.median(checked) * 1000
    print(f"{args.python}: direct {d:.1f} ms, through the check {c:.1f} ms (+{c - d:.1f} ms), median of {args.n}")


if __name__ == "__main__":
    main()
