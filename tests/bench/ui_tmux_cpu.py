"""The cockpit's UI process in a real terminal (tmux), no test harness: its CPU, % of one core.

    python tests/bench/ui_tmux_cpu.py [--mode idle|demo] [--seconds 60] [--json OUT]

idle: `cockpit open local --sim DIR --layout quiet.yaml`, the simulated 8-GPU host with no
      processes on it, no log, and a layout whose patterns match nothing (this machine's other
      processes stay out of the rank tree). Each GPU's power and temperature still move by a watt
      or a degree from one second to the next, as real idle boards do.
demo: `cockpit demo`, the simulated server running on the 8 GPUs with its log (~30 lines/s).
Both at a 1 s refresh in a 160x50 tmux window. The UI process's user + system time is read from
/proc/PID/stat at the start and end of the window (after a warm-up); the agent is another process
and is not counted. With --compare REV, REV's cockpit (a git worktree) is measured the same way
right after, in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

TCK = os.sysconf("SC_CLK_TCK")


def cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as fh:
        f = fh.read().rsplit(b")", 1)[1].split()
    return int(f[11]) + int(f[12])


def ui_pid(session: str, timeout: float = 30.0) -> int:
    """The python process running the cockpit in the tmux pane (the pane's shell may exec it or not)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = subprocess.run(["tmux", "display", "-p", "-t", session, "#{pane_pid}"], capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.strip():
            pid = int(out.stdout.strip())
            for cand in [pid] + children(pid):
                try:
                    cmd = Path(f"/proc/{cand}/cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                if any(b"cockpit" in c for c in cmd) and b"-c" not in cmd[1:3]:
                    return cand
        time.sleep(0.2)
    raise SystemExit(f"no cockpit process in tmux session {session}")


def children(pid: int) -> list[int]:
    try:
        return [int(k) for k in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def measure(tree: Path, mode: str, seconds: float, warmup: float, tmp: Path, tag: str) -> dict:
    from cockpit.sim import fakenvml

    py = sys.executable
    state = tmp / f"xdg-{tag}"
    env = f"env PYTHONPATH={tree} XDG_STATE_HOME={state} TERM=xterm-256color"
    if mode == "idle":
        sim = tmp / f"sim-{tag}"
        fakenvml.write_host(str(sim), gpus=8)
        quiet = tmp / "quiet.yaml"  # watches nothing: not this machine's other processes (a running demo's)
        quiet.write_text(
            'name: quiet\ncommand: [-c, "pass"]\nwatch: ["gpu-cockpit-bench-matches-nothing"]\nmetrics: false\n'
        )
        cmd = f"{env} {py} -m cockpit open local --sim {sim} --layout {quiet} --interval 1"
    else:
        cmd = f"{env} {py} -m cockpit demo --interval 1"
    session = f"cockpit-cpu-{os.getpid()}-{tag}"
    subprocess.run(
        ["tmux", "new-session", "-d", "-s", session, "-x", "160", "-y", "50", "-c", str(tree), cmd], check=True
    )
    try:
        pid = ui_pid(session)
        time.sleep(warmup)
        screen = subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True).stdout
        t0, c0 = time.monotonic(), cpu_ticks(pid)
        time.sleep(seconds)
        t1, c1 = time.monotonic(), cpu_ticks(pid)
        with open(f"/proc/{pid}/status") as fh:
            rss = next(int(line.split()[1]) / 1024 for line in fh if line.startswith("VmRSS:"))
    finally:
        subprocess.run(["tmux", "send-keys", "-t", session, "q"], capture_output=True)
        time.sleep(1.5)
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
    return {
        "cpu_pct_of_core": round(100 * (c1 - c0) / TCK / (t1 - t0), 2),
        "seconds": round(t1 - t0, 1),
        "rss_mib": round(rss, 1),
        "screen_has_gpus": "GPU7" in screen,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["idle", "demo"], default="idle")
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--warmup", type=float, default=10)
    ap.add_argument("--compare", metavar="REV")
    ap.add_argument("--json")
    args = ap.parse_args()
    if not shutil.which("tmux"):
        raise SystemExit("tmux is needed")
    tmp = Path(tempfile.mkdtemp(prefix="cockpit-uicpu-"))
    res = {"mode": args.mode, "terminal": "tmux 160x50", "interval_s": 1.0}
    worktree = None
    try:
        if args.compare:
            worktree = tmp / "before"
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(worktree), args.compare],
                check=True,
                capture_output=True,
            )
            res[args.compare] = measure(worktree, args.mode, args.seconds, args.warmup, tmp, "before")
        res["now"] = measure(ROOT, args.mode, args.seconds, args.warmup, tmp, "now")
    finally:
        if worktree is not None:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)], capture_output=True
            )
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(res, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
