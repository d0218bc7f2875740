"""Renders screenshots/fleet.svg: twelve simulated 8-GPU hosts, each behind its own real sshd on
loopback, with real processes holding simulated GPU memory (some hosts serving, some spinning,
some idle), plus one host that refuses connections. The screen is the real fleet screen.

    .venv/bin/python scripts/fleet_screenshot.py [OUT.svg]
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "bench")]

from conftest import RANK_SCRIPT, free_port  # noqa: E402
from fleet_scale import start_hosts  # noqa: E402

from cockpit.monitor.fleet import Fleet, FleetHost, FleetMonitor  # noqa: E402
from cockpit.host.session import SessionOptions  # noqa: E402
from cockpit.ui.fleet import FleetApp  # noqa: E402

HOSTS = 12
# per host: (activity, GiB per GPU) of the processes on its GPUs; None: nothing runs there
LOAD = [("busy", 82), ("busy", 80), ("spin", 82), ("busy", 60), None, ("busy", 82), ("load", 40), None,
        ("busy", 82), ("busy", 81), ("idle", 82), ("busy", 70)]


def spawn(host: int, state: Path, gpu: int, mib: int, activity: str) -> subprocess.Popen:
    """A rank titled like SGLang's (and tagged with its host, since all hosts share this machine)."""
    script = RANK_SCRIPT.replace('"busy"', repr(activity))
    title = f"sglang::scheduler_TP{gpu}_h{host}"
    p = subprocess.Popen([sys.executable, "-c", script, title, str(gpu), str(mib), str(state)],
                         stdout=subprocess.PIPE, text=True, start_new_session=True)
    p.stdout.readline()
    return p


async def main(out: Path) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="cockpit-fleet-shot-"))
    sshds, ssh_config, known_hosts = start_hosts(tmp, HOSTS)
    with open(ssh_config, "a") as fh:
        fh.write(f"Host gpu-13\n  HostName 127.0.0.1\n  Port {free_port()}\n")
    workers = []
    for i, load in enumerate(LOAD, start=1):
        # each host watches its own ranks; short stall thresholds so the verdicts show in seconds
        (tmp / f"h{i}.yaml").write_text(f"name: h{i}\ncommand: [-m, sglang.launch_server]\n"
                                        f"watch: ['sglang::*_h{i}']\nstall: {{idle_s: 3, spin_s: 3}}\n")
        if load:
            workers += [spawn(i, tmp / f"sim{i}", g, load[1] * 1024, load[0]) for g in range(8)]
    hosts = [FleetHost(target=f"host{i:02d}", name=f"gpu-{i:02d}", python=sys.executable, sim=str(tmp / f"sim{i}"),
                       layout=str(tmp / f"h{i}.yaml")) for i in range(1, HOSTS + 1)]
    hosts.append(FleetHost(target="gpu-13", name="gpu-13"))
    watch = FleetMonitor(Fleet(hosts=hosts), SessionOptions(ssh_config=str(ssh_config), known_hosts=str(known_hosts)))
    app = FleetApp(watch)
    try:
        async with app.run_test(size=(160, 22)) as pilot:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not all(m.state.seq > 2 for m in watch.members[:HOSTS]):
                await pilot.pause(0.2)
            await pilot.pause(5)
            out.write_text(app.export_screenshot(title="gpu-cockpit fleet"))
            await pilot.press("q")
    finally:
        for p in workers:
            os.killpg(p.pid, signal.SIGKILL)
        for p in sshds:
            p.terminate()


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "screenshots" / "fleet.svg")
    asyncio.run(main(target))
    print(target)
    os._exit(0)
