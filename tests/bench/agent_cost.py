"""What the agent costs on the host.

1. One sample (GPUs, a watched process tree, ports) in CPU ms, against the sum of the NVML calls
   it makes per GPU (NVML's own floor).
2. The agent as it really runs (a subprocess sending frames at a 1 s refresh) in % of one core
   over a wall-clock window, with bytes on the wire per second.

    python tests/bench/agent_cost.py [--sim] [--tree 50] [--seconds 60] [--compare REV] [--profile OUT] [--json OUT]
    python tests/bench/agent_cost.py --phases [--warmup 70] [--seconds 120] [--tree 50] [--json OUT]

3. With --phases: where a steady second goes. The agent runs in this process (its frames to
   /dev/null) at a real 1 s refresh, after --warmup seconds (the tree settled, past its young
   minute), each step of its tick timed on the thread's CPU clock, and every thread of the process
   (the Xid wait, RAS polls) from schedstat over the same window.

With --sim it runs the simulated 8-GPU host; without, whatever GPUs the machine has.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from cockpit.agent import gpus as agent_gpus, ports as agent_ports, procs as agent_procs


def spawn_tree(n: int) -> list[subprocess.Popen]:
    """n real processes titled like TP ranks under one parent: the watched tree."""
    script = (
        "import setproctitle,sys,time,subprocess\n"
        "setproctitle.setproctitle('sglang::scheduler_TP0')\n"
        "kids=[subprocess.Popen([sys.executable,'-c','import time,setproctitle;"
        'setproctitle.setproctitle("sglang::worker");time.sleep(3600)\']) for _ in range(int(sys.argv[1]))]\n'
        "time.sleep(3600)\n"
    )
    try:
        import psutil
        import setproctitle  # noqa: F401

        kids = [subprocess.Popen([sys.executable, "-c", script, str(n - 1)], start_new_session=True)]
        deadline = time.monotonic() + 30  # the whole tree up before anything is measured
        while time.monotonic() < deadline and len(psutil.Process(kids[0].pid).children()) < n - 1:
            time.sleep(0.2)
        time.sleep(1.0)  # and titled
        return kids
    except ImportError:
        return [subprocess.Popen(["sleep", "3600"], start_new_session=True) for _ in range(n)]


def kill_tree(kids: list[subprocess.Popen]) -> None:
    for k in kids:
        try:
            os.killpg(k.pid, 9)
        except ProcessLookupError:
            pass
        k.wait()


def nvml_floor(nvml, handles, reps: int) -> float:
    """Seconds per GPU for exactly the calls one sample makes, each timed alone."""
    reasons = (
        getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or nvml.nvmlDeviceGetCurrentClocksThrottleReasons
    )
    calls = [
        lambda h: nvml.nvmlDeviceGetUtilizationRates(h),
        lambda h: nvml.nvmlDeviceGetMemoryInfo(h),
        lambda h: nvml.nvmlDeviceGetPowerUsage(h),
        lambda h: reasons(h),
        lambda h: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU),
        lambda h: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM),
        lambda h: nvml.nvmlDeviceGetComputeRunningProcesses(h),
    ]
    total = 0.0
    for call in calls:
        times = []
        for _ in range(reps):
            for h in handles:
                t = time.perf_counter()
                try:
                    call(h)
                except nvml.NVMLError:
                    pass
                times.append(time.perf_counter() - t)
        total += statistics.median(times)
    return total


def sample_cost(tree: int, reps: int) -> dict:
    import psutil

    warnings: list[str] = []
    gpus = agent_gpus.open_gpus(1.0, warnings)
    procs = agent_procs.Procs(psutil)
    ports = agent_ports.Ports()
    kids = spawn_tree(tree)
    time.sleep(1.5)
    try:
        procs.configure(patterns=["sglang::*"])
        procs.sample(time.monotonic(), force_scan=True)
        watched = len(procs.watched)
        per_tick, gpu_only = [], []
        for _ in range(reps):
            t0 = time.process_time()
            g = gpus.sample(slow=False)
            t1 = time.process_time()
            rows = procs.sample(time.monotonic())
            ports.sample([r["pid"] for r in rows])
            t2 = time.process_time()
            gpu_only.append(t1 - t0)
            per_tick.append(t2 - t0)
        scan_t = time.process_time()
        procs.scan()
        scan_cost = time.process_time() - scan_t
        n_gpus = len(g)
        floor = nvml_floor(gpus.nvml, gpus.handles, 200) if isinstance(gpus, agent_gpus.NvmlGpus) else None
    finally:
        kill_tree(kids)
        gpus.close()
    med_gpu = statistics.median(gpu_only)
    return {
        "gpus": n_gpus,
        "nvml": gpus.source,
        "watched_processes": watched,
        "sample_cpu_ms_median": round(statistics.median(per_tick) * 1000, 3),
        "sample_cpu_ms_p95": round(sorted(per_tick)[int(0.95 * len(per_tick))] * 1000, 3),
        "full_scan_cpu_ms": round(scan_cost * 1000, 2),
        "gpu_part_us_per_gpu": round(med_gpu / max(1, n_gpus) * 1e6, 1),
        "nvml_floor_us_per_gpu": None if floor is None else round(floor * 1e6, 1),
        "ratio_to_floor": None if not floor else round(med_gpu / max(1, n_gpus) / floor, 2),
    }


async def live_cost(seconds: float, sim_state: str | None, tree: int, profile: str | None = None) -> dict:
    import psutil

    from cockpit.host.session import HostSession, SessionOptions
    from cockpit.link.target import parse_target

    kids = spawn_tree(tree)
    nbytes = 0
    if profile:
        os.environ["COCKPIT_AGENT_PROFILE"] = profile  # the agent dumps cProfile's stats when its stdin ends
    session = HostSession(parse_target("local"), SessionOptions(python=sys.executable, sim_state=sim_state))
    await session.connect()
    proc = psutil.Process(session.state.agent.pid)
    counted = {"n": 0}

    def count(frame):
        counted["n"] += len(json.dumps(frame, separators=(",", ":"))) + 1

    session.on_frame = count
    await session.wait_samples(6)  # past the warm-up scans
    c0 = proc.cpu_times()
    n0 = counted["n"]
    t0 = time.monotonic()
    await asyncio.sleep(seconds)
    c1 = proc.cpu_times()
    wall = time.monotonic() - t0
    nbytes = counted["n"] - n0
    watched = len(session.state.procs) if hasattr(session.state, "procs") else None
    if profile:
        session.stream.proc.stdin.close()
        await asyncio.wait_for(session.stream.proc.wait(), 10)
    await session.close()
    kill_tree(kids)
    cpu = (c1.user - c0.user) + (c1.system - c0.system)
    return {
        "seconds": round(wall, 1),
        "agent_cpu_pct_of_core": round(100 * cpu / wall, 3),
        "wire_bytes_per_s": round(nbytes / wall),
        "watched_processes": watched,
    }


def phases(seconds: float, warmup: float, tree: int) -> dict:
    from cockpit.agent import main as agent_main

    kids = spawn_tree(tree)
    saved = os.dup(1)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)  # the frames: written and flushed as ever, read by nobody
    spent: dict[str, int] = {}

    def timed(name, fn):
        def wrapper(*a, **k):
            t = time.thread_time_ns()
            try:
                return fn(*a, **k)
            finally:
                spent[name] = spent.get(name, 0) + time.thread_time_ns() - t

        return wrapper

    def threads() -> dict[str, int]:
        out = {}
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/schedstat") as fh:
                    ns = int(fh.read().split()[0])
                with open(f"/proc/self/task/{tid}/comm") as fh:
                    name = fh.read().strip()
            except (OSError, ValueError):
                continue
            out[f"{name}:{tid}"] = ns
        return out

    try:
        procs = agent_procs.Procs()
        procs.prime()
        agent = agent_main.Agent(1.0, procs)
        agent.cmd_config(patterns=list(agent_procs.DEFAULT_PATTERNS))
        agent.gpus.sample = timed("gpus.sample (NVML)", agent.gpus.sample)
        agent.procs.sample = timed("procs.sample", agent.procs.sample)
        agent.procs.scan = timed("  of it: procs.scan (every 5 s)", agent.procs.scan)
        agent.procs.adopt_children = timed("  of it: procs.adopt_children", agent.procs.adopt_children)
        agent.ports.sample = timed("ports.sample", agent.ports.sample)
        agent.ras.poll = timed("ras.poll (starts the thread)", agent.ras.poll)
        agent._delta = timed("_delta", agent._delta)
        emit = agent_main.emit
        agent_main.emit = timed("emit (JSON, write)", emit)
        tick = timed("tick, whole", agent.tick)
        end = time.monotonic() + warmup
        while time.monotonic() < end:
            tick()
            time.sleep(1.0)
        spent.clear()
        n0, t0, ticks = threads(), time.monotonic(), 0
        while time.monotonic() - t0 < seconds:
            tick()
            ticks += 1
            time.sleep(max(0.0, t0 + ticks - time.monotonic()))
        n1, wall = threads(), time.monotonic() - t0
        watched = len(procs.watched)
        agent.gpus.close()
    finally:
        os.dup2(saved, 1)
        kill_tree(kids)
    per = {k: round(v / 1000 / ticks, 1) for k, v in sorted(spent.items(), key=lambda kv: -kv[1])}
    per["other (tick minus the steps)"] = round(
        per["tick, whole"] - sum(v for k, v in per.items() if k != "tick, whole" and not k.startswith(" ")), 1
    )
    by_thread = {k: round((ns - n0.get(k, 0)) / 1000 / wall, 1) for k, ns in n1.items() if ns - n0.get(k, 0) > 0}
    return {
        "seconds": round(wall, 1),
        "ticks": ticks,
        "watched_processes": watched,
        "gpus": len(agent.gpus.sample(False)),
        "us_per_tick_thread_cpu": per,
        "us_per_second_by_thread_schedstat": by_thread,
        "note": "the main thread also runs this benchmark's loop (sleep, the clock)",
    }


def agent_at(rev: str) -> bytes:
    """The agent of `rev` as today's bootstrap runs it: its modules in today's table (with today's
    importer, which reads that table), or, before the split, its one agent.py."""

    def git(*argv: str) -> bytes:
        return subprocess.run(["git", "-C", str(ROOT), *argv], capture_output=True, check=True).stdout

    names = git("ls-tree", "--name-only", rev, "cockpit/agent/").decode().split()
    if "cockpit/agent/memimport.py" not in names:
        return git("show", f"{rev}:cockpit/agent/agent.py")
    from benchlib import pack_old_agent

    return pack_old_agent(
        {
            name.rsplit("/", 1)[1][:-3]: git("show", f"{rev}:{name}")
            for name in names
            if name.endswith(".py") and not name.endswith(("/__init__.py", "/agent.py"))
        }
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sim", action="store_true", help="the simulated 8-GPU host")
    ap.add_argument("--tree", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--json")
    ap.add_argument("--compare", metavar="REV", help="also run REV's agent live, in the same run (before/after)")
    ap.add_argument("--profile", metavar="OUT", help="the live agent under cProfile: its stats to OUT (pstats)")
    ap.add_argument("--phases", action="store_true", help="where a steady second goes (in-process agent, real ticks)")
    ap.add_argument("--warmup", type=float, default=70.0, help="with --phases: seconds before the window")
    args = ap.parse_args()
    sim_state = None
    if args.sim:
        from cockpit.sim import fakenvml

        sim_state = tempfile.mkdtemp(prefix="cockpit-bench-")
        fakenvml.write_host(sim_state, gpus=8)
        os.environ["COCKPIT_SIM_STATE"] = sim_state
        sys.modules["pynvml"] = fakenvml
    out = {"host": os.uname().nodename, "python": sys.version.split()[0], "tree": args.tree}
    if args.phases:
        out["phases"] = phases(args.seconds, args.warmup, args.tree)
        print(json.dumps(out, indent=1))
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=1))
        return
    out["sample"] = sample_cost(args.tree, args.reps)
    if args.compare:
        import cockpit.agent as shipped

        old = agent_at(args.compare)
        now = shipped.agent_source
        shipped.agent_source = lambda compiled=False: old  # what agent_argv sends
        try:
            out["live_" + args.compare] = asyncio.run(live_cost(args.seconds, sim_state, args.tree))
        finally:
            shipped.agent_source = now
    out["live"] = asyncio.run(live_cost(args.seconds, sim_state, args.tree, args.profile))
    print(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
