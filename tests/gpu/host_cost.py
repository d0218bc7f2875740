"""CPU cost of GPU monitors on the host, side by side in one run at a 1 s refresh: the gpu-cockpit
agent, `nvidia-smi --query-gpu ... -l 1`, `nvidia-smi -l 1`, nvitop, gpustat, and the cockpit's own
UI process (on the operator's machine in real use; here on the same host).

    python tests/gpu/host_cost.py [--seconds 60] [--json OUT]

Interactive monitors run in tmux (they need a terminal); each one's CPU time (user + system, the
process itself) is read at the start and end of the window.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
QUERY = "index,uuid,name,utilization.gpu,memory.used,memory.total,temperature.gpu,power.draw,power.limit,clocks.sm"


def tmux(name: str, cmd: str) -> None:
    subprocess.run(["tmux", "new-session", "-d", "-s", name, "-x", "200", "-y", "50", cmd], check=True)


def find(pred, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in psutil.process_iter(["pid", "name", "cmdline"]):
            try:
                if pred(p.info["name"] or "", " ".join(p.info["cmdline"] or [])):
                    return p
            except (psutil.NoSuchProcess, TypeError):
                continue
        time.sleep(0.2)
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--json")
    args = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=f"{ROOT}:{os.environ.get('PYTHONPATH', '')}")
    py = sys.executable
    procs = {}
    started = []
    started.append(
        subprocess.Popen(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv", "-l", "1"], stdout=subprocess.DEVNULL)
    )
    procs["nvidia-smi --query-gpu -l 1"] = psutil.Process(started[-1].pid)
    started.append(subprocess.Popen(["nvidia-smi", "-l", "1"], stdout=subprocess.DEVNULL))
    procs["nvidia-smi -l 1"] = psutil.Process(started[-1].pid)
    tmux("cockpit", f"env PYTHONPATH={env['PYTHONPATH']} {py} -m cockpit local --interval 1")
    if shutil.which("nvitop") or True:
        tmux("nvitop", f"env PYTHONPATH={env['PYTHONPATH']} {py} -m nvitop --interval 1")
    tmux("gpustat", f"env PYTHONPATH={env['PYTHONPATH']} {py} -m gpustat -i 1")
    procs["gpu-cockpit agent"] = find(
        lambda n, c: "cockpit-agent" in c or (" -c import os,sys" in c and "--interval" in c)
    )
    procs["gpu-cockpit UI (Textual)"] = find(lambda n, c: "-m cockpit local" in c and "env " not in c)
    procs["nvitop 1.7.2 --interval 1"] = find(lambda n, c: "-m nvitop" in c and "env " not in c)
    procs["gpustat 1.1.1 -i 1"] = find(lambda n, c: "-m gpustat" in c and "env " not in c)
    time.sleep(5)
    t0 = time.monotonic()
    c0 = {k: (p.cpu_times() if p else None) for k, p in procs.items()}
    time.sleep(args.seconds)
    wall = time.monotonic() - t0
    res = {}
    for k, p in procs.items():
        try:
            c1 = p.cpu_times() if p else None
        except psutil.NoSuchProcess:
            c1 = None
        if c0[k] is None or c1 is None:
            res[k] = None
            continue
        res[k] = round(100 * ((c1.user - c0[k].user) + (c1.system - c0[k].system)) / wall, 3)
    for s in ("cockpit", "nvitop", "gpustat"):
        subprocess.run(["tmux", "kill-session", "-t", s])
    for p in started:
        p.kill()
    print(f"CPU over {wall:.0f} s at a 1 s refresh, % of one core:")
    print("| monitor | % of one core |")
    print("|---|---|")
    for k, v in res.items():
        print(f"| {k} | {'n/a (did not start)' if v is None else v} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"seconds": wall, "cpu_pct": res}, indent=1))


if __name__ == "__main__":
    main()
