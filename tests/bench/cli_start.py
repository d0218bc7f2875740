"""Wall time of commands that answer without a host: how long the command line takes to start
each family of cockpit/cli/ (the package, the one family module a command imports, its parser).

    python tests/bench/cli_start.py [--runs 15] [--compare REV] [--json OUT]

Runs, interleaved, N times each (after one run each not counted): `python -c pass`, then `cockpit
--version`, `--help`, a subcommand's `--help` and one quick command per family: `runs` (offline),
`snapshot --replay` (snapshot), `kill --read-only` (act: refused before any host is asked),
`exporter --print-rules` (exporter), `serve --port 0` (serve: refused before anything is
served); with --compare, REV's cockpit (a git worktree) on the same
commands. A snapshot of a live host is tests/bench/snapshot_wall.py's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import report

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "demo-serving.json"
COMMANDS = {
    "--version": ["--version"],
    "--help": ["--help"],
    "launch --help": ["launch", "--help"],
    "runs --layout demo --json": ["runs", "--layout", "demo", "--json"],
    "snapshot --replay FILE --json": ["snapshot", "--replay", str(FIXTURE), "--json"],
    "kill local --read-only": ["kill", "local", "--read-only"],
    "exporter --print-rules": ["exporter", "--print-rules"],
    "serve --port 0": ["serve", "--port", "0"],
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--compare", metavar="REV", help="also time REV's cockpit (a git worktree), interleaved")
    ap.add_argument("--json")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="cockpit-clistart-"))
    py = sys.executable
    env = dict(os.environ, XDG_STATE_HOME=str(tmp / "state"), PYTHONPYCACHEPREFIX=str(tmp / "pyc"))
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # bytecode cached, as an installed package has it
    trees = {"this tree": ROOT}
    if args.compare:
        trees[args.compare] = tmp / "before"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(trees[args.compare]), args.compare],
            check=True,
            capture_output=True,
        )
    cases = [("python -c pass", ROOT, [py, "-c", "pass"])]
    for tree, path in trees.items():
        # `python -m` from the tree's folder: its cockpit first on sys.path
        cases += [(f"{tree}: cockpit {name}", path, [py, "-m", "cockpit", *argv]) for name, argv in COMMANDS.items()]
    walls: dict[str, list[float]] = {name: [] for name, _, _ in cases}
    try:
        for n in range(args.runs + 1):
            for name, cwd, argv in cases:
                t = time.perf_counter()
                subprocess.run(
                    argv,
                    cwd=cwd,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                if n:
                    walls[name].append((time.perf_counter() - t) * 1000)
    finally:
        if args.compare:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(trees[args.compare])], capture_output=True
            )
        shutil.rmtree(tmp, ignore_errors=True)
    report(
        {
            "host": os.uname().nodename,
            "python": sys.version.split()[0],
            "runs": args.runs,
            "load_average": os.getloadavg()[0],
            "median_ms (p90)": {
                k: f"{statistics.median(v):.1f} ({sorted(v)[int(0.9 * (len(v) - 1))]:.1f})" for k, v in walls.items()
            },
        },
        args.json,
    )


if __name__ == "__main__":
    main()
