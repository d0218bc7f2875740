"""The cockpit's UI process on a real GPU host beside nvitop, in one window (issue 27).

    python tests/gpu/ui_beside_nvitop.py [--seconds 60] [--warmup 10] [--label quiet] [--json OUT]

Starts `cockpit open local` (no layout: the default patterns find an SGLang-titled job's ranks)
and `nvitop --monitor full --interval 1`, each in a detached 160x50 tmux window at a 1 s refresh,
waits the warm-up, then measures over one window the CPU of the cockpit's UI process, its agent,
nvitop and the tmux server: every thread's /proc/PID/task/TID/schedstat (nanoseconds), % of one
core. The screens at the end are kept in the JSON. Run it once on a quiet GPU and once beside a
job (tests/gpu/run_device14.sh does both).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "bench"))

from ui_tmux_cpu import children, ui_pid  # noqa: E402


def cpu_ns(pid: int) -> int:
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total


def pane_pid(session: str) -> int:
    out = subprocess.run(["tmux", "display", "-p", "-t", session, "#{pane_pid}"], capture_output=True, text=True)
    return int(out.stdout.strip())


def tmux(session: str, cmd: str) -> None:
    subprocess.run(
        ["tmux", "new-session", "-d", "-s", session, "-x", "160", "-y", "50", "-c", str(ROOT), cmd], check=True
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--warmup", type=float, default=10)
    ap.add_argument("--label", default="window")
    ap.add_argument(
        "--top",
        default="-m nvitop --monitor full --interval 1",
        help="nvitop's arguments to this python (a dry run elsewhere may name another tool's command)",
    )
    ap.add_argument("--json")
    args = ap.parse_args()
    py = sys.executable
    env = f"env PYTHONPATH={os.environ.get('PYTHONPATH', ROOT)} TERM=xterm-256color"
    tag = f"{os.getpid()}"
    ui_s, top_s = f"cockpit-{tag}", f"nvitop-{tag}"
    tmux(ui_s, f"{env} {py} -m cockpit open local --interval 1")
    tmux(top_s, f"{env} {py} {args.top}" if args.top.startswith("-m ") else args.top)
    try:
        ui = ui_pid(ui_s)
        time.sleep(3)
        agent = next((k for k in children(ui) if b"-c" in Path(f"/proc/{k}/cmdline").read_bytes()), None)
        top = pane_pid(top_s)
        word = args.top.split()[1].encode() if args.top.startswith("-m ") else args.top.split()[0].encode()
        top = next((k for k in [top] + children(top) if word in Path(f"/proc/{k}/cmdline").read_bytes()), top)
        server = int(subprocess.run(["tmux", "display", "-p", "#{pid}"], capture_output=True, text=True).stdout.strip())
        pids = {"cockpit UI process": ui, "its agent": agent, "nvitop": top, "tmux server (draws both)": server}
        time.sleep(max(0.0, args.warmup - 3))
        t0, c0 = time.monotonic(), {k: cpu_ns(p) for k, p in pids.items() if p}
        time.sleep(args.seconds)
        t1, c1 = time.monotonic(), {k: cpu_ns(p) for k, p in pids.items() if p}
        screens = {
            name: subprocess.run(["tmux", "capture-pane", "-p", "-t", s], capture_output=True, text=True).stdout
            for name, s in (("cockpit", ui_s), ("nvitop", top_s))
        }
    finally:
        subprocess.run(["tmux", "send-keys", "-t", ui_s, "q"], capture_output=True)
        subprocess.run(["tmux", "send-keys", "-t", top_s, "q"], capture_output=True)
        time.sleep(1.5)
        for s in (ui_s, top_s):
            subprocess.run(["tmux", "kill-session", "-t", s], capture_output=True)
    pct = {k: round(100 * (c1[k] - c0[k]) / 1e9 / (t1 - t0), 3) for k in c1}
    res = {
        "label": args.label,
        "seconds": round(t1 - t0, 1),
        "cpu_pct_of_core": pct,
        "ui_to_nvitop": round(pct["cockpit UI process"] / pct["nvitop"], 3) if pct.get("nvitop") else None,
        "screens_at_end": screens,
    }
    print(json.dumps({k: v for k, v in res.items() if k != "screens_at_end"}, indent=1))
    print(screens["cockpit"])
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
