"""Wall time of a one-shot `cockpit snapshot local --json` (one JSON document, no --wait), and where
it goes.

    python tests/bench/snapshot_wall.py [--runs 10] [--compare REV] [--json OUT]

Runs, interleaved, N times each: `python -c pass` (the interpreter's own start), `python -c "import
psutil"` (issue 27's yardstick: the snapshot at most 4x it; the ratio is printed), the snapshot of
this machine as it is (`local`: its GPUs, none on a machine without), the same with the simulated
8-GPU host (`local --sim DIR`), `nvidia-smi --query-gpu=... --format=csv` where there is one, and
with --compare, REV's cockpit (a git worktree) on the same two snapshots. Then N instrumented runs of
the simulated one split its time: interpreter start, imports, building the monitor (the agent,
started before these imports, runs meanwhile), up to its hello, the first sample (its CPU window
from the agent's start), the document and the exit.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

QUERY = "index,uuid,name,utilization.gpu,memory.used,memory.total,temperature.gpu,power.draw,power.limit,clocks.sm"

# The snapshot itself, with time marks around it (written to stderr as JSON).
MARKED = r"""
import os, sys, time, json
T0 = float(os.environ["T0"])
now = lambda: round((time.time() - T0) * 1000, 1)
m = {"interpreter": now()}
import cockpit.cli
m["import_cli"] = now()
from cockpit.host import state as model
from cockpit.host import session
c0 = session.HostSession.connect
async def connect(self):
    m.setdefault("connect", now())
    await c0(self)
session.HostSession.connect = connect
a0 = model.HostState.apply
n = [0]
def apply(self, frame):
    r = a0(self, frame)
    if frame.get("t") == "hello":
        m.setdefault("hello", now())
    elif frame.get("t") == "sample":
        n[0] += 1
        m.setdefault("sample%d" % n[0], now())
    return r
model.HostState.apply = apply
sys.stdout = open(os.devnull, "w")
rc = cockpit.cli.main(sys.argv[1:])
m["document"] = now()
sys.stderr.write(json.dumps(m) + "\n")
sys.stderr.flush()
os._exit(rc)  # as cockpit.cli.entry does
"""


def timed(argv: list[str], env: dict, check: str | None = None) -> float:
    t = time.perf_counter()
    # from the tree under test: `python -m` puts the working directory first on sys.path
    out = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=env["PYTHONPATH"].split(os.pathsep)[0])
    wall = time.perf_counter() - t
    if out.returncode != 0 or (check and check not in out.stdout):
        raise SystemExit(f"{' '.join(argv[:6])}: rc={out.returncode}\n{out.stderr[-2000:]}")
    return wall


def stats(xs: list[float]) -> dict:
    xs = sorted(xs)
    return {
        "median_ms": round(statistics.median(xs) * 1000, 1),
        "p90_ms": round(xs[int(0.9 * (len(xs) - 1))] * 1000, 1),
        "min_ms": round(xs[0] * 1000, 1),
        "runs": len(xs),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--compare", metavar="REV", help="also time REV's cockpit (a git worktree), interleaved")
    ap.add_argument(
        "--no-bytecode",
        action="store_true",
        help="compile every module from source on each start (PYTHONDONTWRITEBYTECODE=1, as on the "
        "dev machine's shell); default: bytecode cached, as an installed package has it",
    )
    ap.add_argument("--json")
    args = ap.parse_args()
    from cockpit.sim import fakenvml

    tmp = Path(tempfile.mkdtemp(prefix="cockpit-snapwall-"))
    sim = str(tmp / "sim")
    fakenvml.write_host(sim, gpus=8)
    py = sys.executable
    rest = os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else ""  # e.g. packages in /tmp/site
    env = dict(os.environ, PYTHONPATH=str(ROOT) + rest, XDG_STATE_HOME=str(tmp / "state"))
    if args.no_bytecode:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    else:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(tmp / "pyc")  # cached outside the trees under test
    cases = {
        "python -c pass": ([py, "-c", "pass"], env, None),
        'python -c "import psutil"': ([py, "-c", "import psutil"], env, None),
        "cockpit snapshot local --json": ([py, "-m", "cockpit", "snapshot", "local", "--json"], env, '"schema"'),
        "cockpit snapshot local --sim DIR --json (8 GPUs)": (
            [py, "-m", "cockpit", "snapshot", "local", "--sim", sim, "--json"],
            env,
            '"schema"',
        ),
    }
    if shutil.which("nvidia-smi"):
        cases["nvidia-smi --query-gpu=... --format=csv"] = (
            ["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv"],
            env,
            None,
        )
    worktree = None
    if args.compare:
        worktree = tmp / "before"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(worktree), args.compare],
            check=True,
            capture_output=True,
        )
        old_env = dict(env, PYTHONPATH=str(worktree) + rest)
        cases[f"{args.compare}: cockpit snapshot local --json"] = (
            [py, "-m", "cockpit", "snapshot", "local", "--json"],
            old_env,
            '"schema"',
        )
        cases[f"{args.compare}: cockpit snapshot local --sim DIR --json (8 GPUs)"] = (
            [py, "-m", "cockpit", "snapshot", "local", "--sim", sim, "--json"],
            old_env,
            '"schema"',
        )
    walls: dict[str, list[float]] = {k: [] for k in cases}
    marks: list[dict] = []
    try:
        for argv, e, check in cases.values():
            timed(argv, e, check)  # a first run, not counted: bytecode cached, files in the page cache
        for _ in range(args.runs):
            for name, (argv, e, check) in cases.items():
                walls[name].append(timed(argv, e, check))
            e = dict(env, T0=repr(time.time()))
            out = subprocess.run(
                [py, "-c", MARKED, "snapshot", "local", "--sim", sim, "--json"],
                capture_output=True,
                text=True,
                env=e,
                cwd=str(ROOT),
            )
            marks.append(json.loads(out.stderr.strip().splitlines()[-1]))
            marks[-1]["exit"] = round((time.time() - float(e["T0"])) * 1000, 1)
    finally:
        if worktree is not None:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)], capture_output=True
            )
        shutil.rmtree(tmp, ignore_errors=True)
    order = ["interpreter", "import_cli", "connect", "hello", "sample1", "document", "exit"]
    names = {
        "interpreter": "interpreter start",
        "import_cli": "import cockpit.cli",
        "connect": "imports on the path and the monitor built",
        "hello": "the agent started, up to its hello",
        "sample1": "the first sample (CPU % from the agent's start)",
        "document": "the document judged and printed",
        "exit": "the interpreter's exit",
    }
    phases = {}
    prev = None
    for k in order:
        vals = [mk[k] - (mk[prev] if prev else 0) for mk in marks if k in mk and (prev is None or prev in mk)]
        if vals:
            phases[names[k]] = round(statistics.median(vals), 1)
        prev = k
    res = {
        "host": os.uname().nodename,
        "python": sys.version.split()[0],
        "runs": args.runs,
        "bytecode": "compiled on each start" if args.no_bytecode else "cached",
        "wall": {k: stats(v) for k, v in walls.items()},
        "phases_ms_median (simulated 8 GPUs)": phases,
    }
    base = statistics.median(walls['python -c "import psutil"'])
    res["ratio_to_import_psutil (medians)"] = {
        k: round(statistics.median(v) / base, 2) for k, v in walls.items() if k.startswith("cockpit")
    }
    print(json.dumps(res, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
