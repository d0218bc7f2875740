"""The cockpit screen under load: 8 simulated GPUs, a 40-process tree, a log growing at N lines/s,
a 1 s refresh. Measures the time to apply each frame to the screen (median, p99), key press to
screen through Pilot, the cockpit's RSS over the run and its CPU.

    python tests/bench/ui_load.py [--rate 2000] [--seconds 60] [--json OUT]

--rate 0 measures the quiet case (no log growth).
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "bench"))

from agent_cost import kill_tree, spawn_tree
from benchlib import pct, report, rss_mib

from cockpit.host.session import SessionOptions, WatchList
from cockpit.link.target import parse_target
from cockpit.monitor.host import HostMonitor
from cockpit.runs.layoutfile import parse_layout
from cockpit.sim import fakenvml
from cockpit.ui.app import CockpitApp, save_text
from cockpit.ui.logview import LogView


def flood(path: Path, rate: int, stop: threading.Event) -> None:
    n = 0
    with open(path, "a", buffering=1 << 16) as fh:
        start = time.monotonic()
        while not stop.is_set():
            due = int((time.monotonic() - start) * rate)
            while n < due:
                fh.write(
                    f"[2026-11-30 10:00:00 TP{n % 8}] Decode batch. #running-req: 12, #token: {n}, "
                    f"token usage: 0.41, gen throughput (token/s): 2210.5, #queue-req: 0\n"
                )
                n += 1
            fh.flush()
            time.sleep(0.01)


async def run(rate: int, seconds: float) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="cockpit-ui-"))
    fakenvml.write_host(str(tmp), gpus=8)
    log = tmp / "server.log"
    log.write_text("")
    layout = parse_layout(f"command: [-m, x]\nlog: {log}\n", "bench.yaml")
    kids = spawn_tree(40)
    for i, kid in enumerate(kids):
        fakenvml.register(str(tmp), kid.pid, i % 8, 70000, "busy")
    monitor = HostMonitor(
        parse_target("local"),
        SessionOptions(python=sys.executable, sim_state=str(tmp)),
        layout,
        watch=WatchList(patterns=["sglang::*"], logs=[str(log)]),
    )
    app = CockpitApp(monitor=monitor)
    frame_ms: list[float] = []
    original = app.cockpit.refresh_panes

    def timed_refresh() -> None:
        t = time.perf_counter()
        original()
        frame_ms.append((time.perf_counter() - t) * 1000)

    app.cockpit.refresh_panes = timed_refresh
    view_ms: list[float] = []
    stop = threading.Event()
    keys: list[float] = []
    missed = 0
    async with app.run_test(size=(160, 50)) as pilot:
        await asyncio.wait_for(app.ready.wait(), 30)
        view = app.query_one(LogView)
        original_add = view.add_lines

        def timed_add(lines):
            t = time.perf_counter()
            original_add(lines)
            view_ms.append((time.perf_counter() - t) * 1000)

        view.add_lines = timed_add
        await pilot.pause(3)
        writer = threading.Thread(target=flood, args=(log, rate, stop), daemon=True)
        if rate:
            writer.start()
        rss_start = rss_mib()
        cpu0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.monotonic()
        frame_ms.clear()
        next_key = t0 + 2
        next_rss = t0 + 30
        rss_trace = []
        while time.monotonic() - t0 < seconds:
            await pilot.pause(0.2)
            if time.monotonic() > next_rss:
                next_rss += 30
                rss_trace.append(round(rss_mib(), 1))
            if time.monotonic() > next_key:
                next_key += 2
                # key press to screen: from the key event to the screen showing its effect
                want = "paused" if view.auto_scroll else "follow"
                t = time.perf_counter()
                app.simulate_key("f")
                while want not in (view.border_subtitle or "") or want not in save_text(app, None):
                    if time.perf_counter() - t > 5:
                        missed += 1  # counted, not waited on forever
                        break
                    await asyncio.sleep(0.002)
                else:
                    keys.append((time.perf_counter() - t) * 1000)
        cpu1 = resource.getrusage(resource.RUSAGE_SELF)
        wall = time.monotonic() - t0
        rss_end = rss_mib()
        stop.set()
        lines_seen = len(view.visible_lines())
    kill_tree(kids)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)

    return {
        "rate_lines_s": rate,
        "seconds": round(wall, 1),
        "frames": len(frame_ms),
        "frame_ms_median": pct(frame_ms, 0.5),
        "frame_ms_p99": pct(frame_ms, 0.99),
        "log_append_ms_median": pct(view_ms, 0.5),
        "log_append_ms_p99": pct(view_ms, 0.99),
        "key_to_screen_ms_median": pct(keys, 0.5),
        "key_to_screen_ms_max": pct(keys, 1.0),
        "cockpit_cpu_pct_of_core": round(100 * cpu / wall, 1),
        "rss_mib_start": round(rss_start, 1),
        "rss_mib_end": round(rss_end, 1),
        "log_lines_held": lines_seen,
        "keys_missed": missed,
        "rss_mib_every_30s": rss_trace,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=int, default=2000)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--json")
    args = ap.parse_args()
    res = asyncio.run(run(args.rate, args.seconds))
    report(res, args.json)


if __name__ == "__main__":
    main()
