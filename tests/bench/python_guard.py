"""What the interpreter check costs as root: the agent's start (`python -I -S -c pass`) directly
and through GUARD, and a server's check before its launch (CHECK on `python -c pass`, in `/`: its
whole import path, .pth files and what they name) (cockpit/agent/guard.py: /bin/sh, find(1), the
interpreter asked under -I -S what it imports from), median of N starts each, interleaved.

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

from cockpit.agent.guard import CHECK, guarded


def once(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--n", type=int, default=30)
    args = ap.parse_args()
    plain = [args.python, "-I", "-S", "-c", "pass"]
    direct, checked, server = [], [], []
    for _ in range(args.n):
        direct.append(once(plain))
        checked.append(once(guarded(plain)))
        server.append(once(["/bin/sh", "-c", CHECK, args.python, "-c", "pass"]))
    d, c, s = (statistics.median(x) * 1000 for x in (direct, checked, server))
    print(
        f"{args.python}: the agent's start direct {d:.1f} ms, through the check {c:.1f} ms (+{c - d:.1f} ms); "
        f"a server's check alone {s:.1f} ms; median of {args.n}"
    )


if __name__ == "__main__":
    main()
