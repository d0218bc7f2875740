"""Records the demo in three states as snapshot documents (tests/fixtures/demo-*.json): loading
weights, the EAGLE-3 deadlock, serving. The SVG snapshot tests and screenshots/ render these, so
they look the same on every machine. Run: .venv/bin/python scripts/record_states.py"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from cockpit.monitor import demo
from cockpit.runs.layouts import resolve_layout
from cockpit.link.target import parse_target
from cockpit.monitor.host import HostMonitor
from cockpit.host.session import SessionOptions, WatchList
from cockpit.host.snapshot import monitor_doc

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures"


def ready(state, log, text):
    return log in state.logs and text in state.logs[log].text()


async def record(name: str, enabled: list[str], until, settle: float) -> None:
    layout = resolve_layout("demo")
    layout.enabled = enabled
    state_dir = tempfile.mkdtemp(prefix="cockpit-rec-")
    layout.log_dir = state_dir
    demo.prepare_host(layout, state_dir)
    monitor = HostMonitor(parse_target("demo"), SessionOptions(python=sys.executable, sim_state=state_dir), layout,
                          watch=WatchList(ports=list(layout.ports)))
    session = monitor.session
    await session.connect()
    run = await demo.start_demo(session, layout, state_dir)
    try:
        deadline = time.monotonic() + 90
        while not until(session.state, run["log"]):
            if time.monotonic() > deadline:
                raise SystemExit(f"{name}: the state never came")
            await session.wait_samples(1)
        await monitor.watch_for(settle)
        doc = monitor_doc(monitor, log_lines=200)
        doc["target"] = "demo"
        doc["agent"]["hostname"] = "kimi-box"
        doc["agent"]["executable"] = "/root/ml-env/bin/python3"
        doc["log"]["path"] = f"/data/eagle3/runs/{run['run_id']}.log"
        (OUT / f"demo-{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
        print("recorded", name)
    finally:
        os.killpg(run["pgid"], signal.SIGKILL)
        await asyncio.sleep(1.0)  # let the next recording start on a quiet host
        await session.close()
        shutil.rmtree(state_dir, ignore_errors=True)


async def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    shards = lambda n: lambda st, log: ready(st, log, f"| {n}/64")
    await record("loading", ["eagle3"], shards(30), 0.0)
    await record("eagle3-deadlock", ["eagle3"], lambda st, log: ready(st, log, "Capture draft cuda graph begin"), 18.0)
    await record("serving", [], lambda st, log: ready(st, log, "ready to roll"), 10.0)


if __name__ == "__main__":
    asyncio.run(main())
