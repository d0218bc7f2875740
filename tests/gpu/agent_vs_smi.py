"""The agent beside `nvidia-smi --query-gpu ... -l 1`, side by side in one window (issue 21).

    python tests/gpu/agent_vs_smi.py [--seconds 60] [--tree 50] [--before FILE] [--bare PYTHON]
        [--ras-every S] [--watch LABEL=PID ...] [--json OUT]

1. CPU, % of one core over the same wall-clock window, at a 1 s refresh: `nvidia-smi
   --query-gpu=... --format=csv -l 1`, the gpu-cockpit agent as the cockpit runs it (local link,
   watching a tree of --tree real processes titled like TP ranks), and with --before FILE, an
   older agent's source (FILE) running at the same time on the same tree; with --bare PYTHON, the
   agent once more on that interpreter (e.g. `python3 -S -E`: no pynvml, so NVML through ctypes);
   with --watch LABEL=PID, any other process started beforehand (nvitop in a tmux window). Each
   figure twice: from the clock ticks of /proc/PID/stat (10 ms each: 0.007 % of a core over 150 s,
   a seventh of nvidia-smi's whole figure), and from the nanoseconds of every thread's
   /proc/PID/task/TID/schedstat (threads that end inside the window are not counted there).
2. Wall time of one-shot looks, interleaved, median of --runs: `nvidia-smi --query-gpu=...
   --format=csv` against `python3 -m cockpit snapshot local --json`.

Without GPUs (or nvidia-smi) it says so and measures what it can.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "bench"))

from agent_cost import kill_tree, spawn_tree  # noqa: E402

QUERY = "index,uuid,name,utilization.gpu,memory.used,memory.total,temperature.gpu,power.draw,power.limit,clocks.sm"


def cpu_s(proc) -> float | None:
    try:
        t = proc.cpu_times()
        return t.user + t.system
    except Exception:
        return None


def sched_ns(proc) -> dict[int, int] | None:
    """Each thread's time on a CPU in ns (/proc/PID/task/TID/schedstat's first field)."""
    out = {}
    try:
        for tid in os.listdir(f"/proc/{proc.pid}/task"):
            try:
                with open(f"/proc/{proc.pid}/task/{tid}/schedstat") as fh:
                    out[int(tid)] = int(fh.read().split()[0])
            except (OSError, ValueError, IndexError):
                continue
    except OSError:
        return None
    return out or None


def sched_delta_s(a: dict[int, int] | None, b: dict[int, int] | None) -> float | None:
    """Seconds on a CPU between two readings, summed over the threads alive at the second (a
    thread born inside the window counts from zero)."""
    if a is None or b is None:
        return None
    return sum(ns - a.get(tid, 0) for tid, ns in b.items()) / 1e9


async def side_by_side(
    seconds: float,
    tree: int,
    before: bytes | None,
    bare: str | None = None,
    watch: dict[str, int] | None = None,
    ras_every: float | None = None,
) -> dict:
    import psutil

    import cockpit.agent as shipped
    from cockpit.host.session import HostSession, SessionOptions
    from cockpit.link.target import parse_target

    kids = spawn_tree(tree)
    monitors: dict[str, object] = {label: psutil.Process(pid) for label, pid in (watch or {}).items()}
    smi = None
    if shutil.which("nvidia-smi"):
        smi = subprocess.Popen(
            ["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv", "-l", "1"], stdout=subprocess.DEVNULL
        )
        monitors["nvidia-smi --query-gpu=... --format=csv -l 1"] = psutil.Process(smi.pid)
    sessions = []
    try:
        if before is not None:
            now = shipped.agent_source
            shipped.agent_source = lambda compiled=False: before  # what agent_argv sends
            try:
                old = HostSession(parse_target("local"), SessionOptions(python=sys.executable, interval=1.0))
                await old.connect()
            finally:
                shipped.agent_source = now
            sessions.append(old)
            monitors["gpu-cockpit agent, before (--before)"] = psutil.Process(old.state.agent.pid)
        sources = {}
        if bare:
            other = HostSession(parse_target("local"), SessionOptions(python=bare, python_named=True, interval=1.0))
            await other.connect()
            sessions.append(other)
            label = f"gpu-cockpit agent, bare python ({other.state.agent.gpu_source})"
            monitors[label] = psutil.Process(other.state.agent.pid)
            sources[label] = [other.state.agent.gpu_source, other.state.agent.procs_source]
        if ras_every:
            slow = HostSession(parse_target("local"), SessionOptions(python=sys.executable, interval=1.0))
            await slow.connect()
            said = await slow.request("ras_config", every_s=ras_every)
            sessions.append(slow)
            monitors[f"gpu-cockpit agent, NCCL RAS polled every {said['every_s']:g} s"] = psutil.Process(
                slow.state.agent.pid
            )
        new = HostSession(parse_target("local"), SessionOptions(python=sys.executable, interval=1.0))
        await new.connect()
        sessions.append(new)
        monitors["gpu-cockpit agent"] = psutil.Process(new.state.agent.pid)
        sources["gpu-cockpit agent"] = [new.state.agent.gpu_source, new.state.agent.procs_source]
        await asyncio.gather(*(s.wait_samples(6) for s in sessions))  # past the warm-up scans
        c0 = {k: cpu_s(p) for k, p in monitors.items()}
        n0 = {k: sched_ns(p) for k, p in monitors.items()}
        t0 = time.monotonic()
        await asyncio.sleep(seconds)
        c1 = {k: cpu_s(p) for k, p in monitors.items()}
        n1 = {k: sched_ns(p) for k, p in monitors.items()}
        wall = time.monotonic() - t0
        watched = len(new.state.procs)
        gpus = len(new.state.gpus) if hasattr(new.state, "gpus") else None
        nvml = new.state.agent.nvml if hasattr(new.state.agent, "nvml") else None
    finally:
        for s in sessions:
            await s.close()
        if smi is not None:
            smi.kill()
            smi.wait()
        kill_tree(kids)
    pct = {k: (None if c0[k] is None or c1[k] is None else round(100 * (c1[k] - c0[k]) / wall, 3)) for k in monitors}
    ns = {k: sched_delta_s(n0[k], n1[k]) for k in monitors}
    pct_ns = {k: (None if v is None else round(100 * v / wall, 4)) for k, v in ns.items()}
    out = {
        "seconds": round(wall, 1),
        "watched_processes": watched,
        "gpus": gpus,
        "nvml": nvml,
        "sources": sources,
        "cpu_pct_of_core": pct,
        "cpu_pct_of_core_schedstat": pct_ns,
    }
    smi_ns = pct_ns.get("nvidia-smi --query-gpu=... --format=csv -l 1")
    if smi_ns:
        out["to_smi_ratio_schedstat"] = {k: round(v / smi_ns, 2) for k, v in pct_ns.items() if v is not None}
    base = pct.get("nvidia-smi --query-gpu=... --format=csv -l 1")
    if base:
        out["agent_to_smi_ratio"] = round(pct["gpu-cockpit agent"] / base, 2)
        if "gpu-cockpit agent, before (--before)" in pct:
            out["before_to_smi_ratio"] = round(pct["gpu-cockpit agent, before (--before)"] / base, 2)
        for k in pct:
            if k.startswith("gpu-cockpit agent, bare python") and pct[k] is not None:
                out["bare_to_smi_ratio"] = round(pct[k] / base, 2)
    return out


def one_shots(runs: int) -> dict:
    env = dict(os.environ)
    cases = {
        "python3 -m cockpit snapshot local --json": [sys.executable, "-m", "cockpit", "snapshot", "local", "--json"]
    }
    if shutil.which("nvidia-smi"):
        cases["nvidia-smi --query-gpu=... --format=csv"] = ["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv"]
    walls: dict[str, list[float]] = {k: [] for k in cases}
    for i in range(runs + 1):  # the first of each is not counted (bytecode written, files cached)
        for name, argv in cases.items():
            t = time.perf_counter()
            out = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=str(ROOT))
            wall = time.perf_counter() - t
            if out.returncode != 0:
                return {"error": f"{name}: rc={out.returncode}: {out.stderr[-800:]}"}
            if i:
                walls[name].append(wall)
    res = {
        k: {
            "median_ms": round(statistics.median(v) * 1000, 1),
            "p90_ms": round(sorted(v)[int(0.9 * (len(v) - 1))] * 1000, 1),
            "runs": len(v),
        }
        for k, v in walls.items()
    }
    if len(walls) == 2:
        a, b = (statistics.median(v) for v in walls.values())
        res["snapshot_to_smi_ratio"] = round(a / b, 1)
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--tree", type=int, default=50)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument(
        "--before",
        help="an older agent to run beside the current one: its agent.py, or the zip "
        "of its modules (either may be gzipped)",
    )
    ap.add_argument("--bare", metavar="PYTHON", help="also the agent on this interpreter (one without pynvml)")
    ap.add_argument(
        "--watch",
        action="append",
        default=[],
        metavar="LABEL=PID",
        help="also measure this process in the same window (nvitop, say)",
    )
    ap.add_argument(
        "--ras-every",
        type=float,
        metavar="S",
        help="also the current agent told to poll NCCL's RAS every S seconds (ras_config)",
    )
    ap.add_argument("--json")
    args = ap.parse_args()
    watch = {w.rsplit("=", 1)[0]: int(w.rsplit("=", 1)[1]) for w in args.watch}
    before = None
    if args.before:  # a .gz is read through gzip
        import gzip

        raw = Path(args.before).read_bytes()
        before = gzip.decompress(raw) if args.before.endswith(".gz") else raw
        if before[:2] == b"PK":  # a zip of the agent's modules, as they travelled before the table
            import io
            import zipfile

            sys.path.insert(0, str(ROOT / "tests" / "bench"))
            from benchlib import pack_old_agent

            with zipfile.ZipFile(io.BytesIO(before)) as zf:
                before = pack_old_agent(
                    {
                        n.rsplit("/", 1)[1][:-3]: zf.read(n)
                        for n in zf.namelist()
                        if n.endswith(".py") and not n.endswith("/__init__.py")
                    }
                )
    res = {"host": os.uname().nodename, "python": sys.version.split()[0], "cpu_count": os.cpu_count()}
    res["side_by_side"] = asyncio.run(side_by_side(args.seconds, args.tree, before, args.bare, watch, args.ras_every))
    if args.runs:
        res["one_shot"] = one_shots(args.runs)
    print(json.dumps(res, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
