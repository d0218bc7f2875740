"""The fleet at scale: N hosts (default 64), each a real sshd on loopback in front of an agent on a
simulated 8-GPU host, watched by one fleet screen at a 1 s refresh. Measures the time until every
host is up, the cockpit process's CPU and RSS over the window, the fleet redraw time, and key
press to screen (the sort key, until the screen shows the new order).

    python tests/bench/fleet_scale.py [--hosts 64] [--seconds 60] [--compare REV] [--json OUT]

With --compare REV, REV's cockpit (a git worktree, this script's harness) is measured first, then
this tree's, each in a process of its own, in the same run. The cockpit CPU counts everything in
the process, the harness included (in the window it sleeps between keys, no Pilot pause: a pause
waits on every widget's queue and forces a screen update, five times a second): its reads of the screen for key to screen (a text render of the
whole screen every 2 ms until the new sort shows) are timed apart and given as
`screen_reads_cpu_pct_of_core`, and `cockpit_cpu_pct_of_core_less_screen_reads` is the one less
the other.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TREE = Path(os.environ.get("FLEET_SCALE_TREE", ROOT))  # whose cockpit is measured (--compare)
sys.path[:0] = [str(TREE), str(ROOT / "tests"), str(ROOT / "tests" / "bench")]

from benchlib import pct, report, rss_mib
from conftest import free_port

from cockpit.host.session import SessionOptions
from cockpit.monitor.fleet import Fleet, FleetHost, FleetMonitor
from cockpit.sim import fakenvml
from cockpit.ui import fleet as fleet_ui
from cockpit.ui.app import save_text
from cockpit.ui.fleet import HEAP_SETTLE_S, SORTS, FleetApp

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def start_hosts(tmp: Path, n: int) -> tuple[list[subprocess.Popen], Path, Path]:
    """n sshd processes sharing one host key and one authorized client key; an ssh config with
    aliases host01..hostNN and a known_hosts naming each port."""
    for name in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp / name)], check=True)
    (tmp / "authorized_keys").write_text((tmp / "client_key.pub").read_text())
    host_pub = " ".join((tmp / "host_key.pub").read_text().split()[:2])
    user = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    os.makedirs("/run/sshd", exist_ok=True)
    procs, config, known = [], [], []
    for i in range(1, n + 1):
        port = free_port()
        cfg = tmp / f"sshd{i}.conf"
        cfg.write_text(
            f"Port {port}\nListenAddress 127.0.0.1\nHostKey {tmp}/host_key\n"
            f"AuthorizedKeysFile {tmp}/authorized_keys\nPasswordAuthentication no\n"
            f"KbdInteractiveAuthentication no\nUsePAM no\nPermitRootLogin prohibit-password\n"
            f"StrictModes no\nPidFile {tmp}/sshd{i}.pid\nLogLevel ERROR\n"
        )
        # niced: the hosts are other machines in the real case, here they only share the cores
        procs.append(
            subprocess.Popen(
                ["nice", "-n", "10", SSHD, "-D", "-e", "-f", str(cfg)], stderr=open(tmp / f"sshd{i}.log", "wb")
            )
        )
        config.append(
            f"Host host{i:02d}\n  HostName 127.0.0.1\n  Port {port}\n  User {user}\n"
            f"  IdentityFile {tmp}/client_key\n  IdentitiesOnly yes\n"
        )
        known.append(f"[127.0.0.1]:{port} {host_pub}\n")
        fakenvml.write_host(str(tmp / f"sim{i}"), gpus=8, model="h200", seed=i)
    (tmp / "ssh_config").write_text("".join(config))
    (tmp / "known_hosts").write_text("".join(known))
    return procs, tmp / "ssh_config", tmp / "known_hosts"


def tree_cpu_s(roots: list[int]) -> float:
    """CPU seconds used so far by the processes under these roots (the simulated hosts' sshd and
    agents), read from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    kids: dict[int, list[int]] = {}
    stats: dict[int, list[str]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as fh:
                    f = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            stats[int(name)] = f
            kids.setdefault(int(f[1]), []).append(int(name))
    total, stack = 0, list(roots)
    while stack:
        pid = stack.pop()
        if pid in stats:
            total += int(stats[pid][11]) + int(stats[pid][12])
            stack.extend(kids.get(pid, []))
    return total / tick


class GcPauses:
    """Durations of the garbage collector's passes: a long one is a key that waits."""

    def __init__(self):
        self.ms: list[float] = []
        self.gen: list[int] = []
        self._t = 0.0
        gc.callbacks.append(self)

    def __call__(self, phase, info):
        if phase == "start":
            self._t = time.perf_counter()
        else:
            self.ms.append((time.perf_counter() - self._t) * 1000)
            self.gen.append(info["generation"])


class Settles:
    """The cockpit's heap settlings (gc.collect then gc.freeze), each a full pass the keys wait on:
    when, and how long."""

    def __init__(self):
        self.at: list[tuple[float, float]] = []  # (monotonic start, ms)
        real = fleet_ui.settle_heap

        def timed() -> None:
            t, w = time.monotonic(), time.perf_counter()
            real()
            self.at.append((t, (time.perf_counter() - w) * 1000))

        fleet_ui.settle_heap = timed  # before the app is made: it finds the module's name when it settles

    def since(self, t0: float) -> list[float]:
        return [round(ms, 1) for t, ms in self.at if t >= t0]


async def run(n: int, seconds: float) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="cockpit-fleet-"))
    settles = Settles()
    procs, ssh_config, known_hosts = start_hosts(tmp, n)
    fleet = Fleet(
        hosts=[
            FleetHost(target=f"host{i:02d}", name=f"host{i:02d}", python=sys.executable, sim=str(tmp / f"sim{i}"))
            for i in range(1, n + 1)
        ],
        interval=1.0,
    )
    watch = FleetMonitor(fleet, SessionOptions(ssh_config=str(ssh_config), known_hosts=str(known_hosts)))
    app = FleetApp(watch)
    redraw_ms: list[float] = []
    keys: list[float] = []
    reads_cpu = 0.0
    missed = 0
    try:
        async with app.run_test(size=(160, n + 6)) as pilot:
            screen = app.screen
            original = screen.redraw

            def timed_redraw():
                t = time.perf_counter()
                original()
                redraw_ms.append((time.perf_counter() - t) * 1000)

            screen.redraw = timed_redraw
            t_start = time.monotonic()
            while not all(m.state.seq > 0 for m in watch.members):
                if time.monotonic() - t_start > 120:
                    break
                await pilot.pause(0.2)
            all_up_s = time.monotonic() - t_start
            up = sum(m.state.seq > 0 for m in watch.members)
            await pilot.pause(max(3.0, HEAP_SETTLE_S + 1 - (time.monotonic() - t_start)))  # past the heap's settling
            redraw_ms.clear()
            pauses = GcPauses()
            frozen = gc.get_freeze_count()
            rss_start = rss_mib()
            cpu0 = resource.getrusage(resource.RUSAGE_SELF)
            hosts0 = tree_cpu_s([p.pid for p in procs])
            t0 = time.monotonic()
            next_key = t0 + 2
            while time.monotonic() - t0 < seconds:
                await asyncio.sleep(0.2)  # not pilot.pause: it walks every widget and forces a screen update
                if time.monotonic() > next_key:
                    next_key += 2
                    order = list(SORTS)
                    want = f"sort: {order[(order.index(screen.sort) + 1) % len(order)]}"
                    t = time.perf_counter()
                    app.simulate_key("o")
                    while True:
                        c = time.process_time()
                        shown = want in save_text(app, None)
                        reads_cpu += time.process_time() - c
                        if shown:
                            break
                        if time.perf_counter() - t > 5:
                            missed += 1
                            break
                        await asyncio.sleep(0.002)
                    keys.append((time.perf_counter() - t) * 1000)
            cpu1 = resource.getrusage(resource.RUSAGE_SELF)
            hosts1 = tree_cpu_s([p.pid for p in procs])
            wall = time.monotonic() - t0
            samples = sum(m.state.seq for m in watch.members)
            live_objects = len(gc.get_objects())
            frozen_end = gc.get_freeze_count()
            await pilot.press("q")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(10)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    return {
        "hosts": n,
        "gpus": 8 * n,
        "hosts_up": up,
        "seconds_until_all_up": round(all_up_s, 1),
        "window_s": round(wall, 1),
        "samples_received_total": samples,
        "cockpit_cpu_pct_of_core": round(100 * cpu / wall, 1),
        "screen_reads_cpu_pct_of_core": round(100 * reads_cpu / wall, 1),
        "cockpit_cpu_pct_of_core_less_screen_reads": round(100 * (cpu - reads_cpu) / wall, 1),
        "simulated_hosts_cpu_pct_of_core": round(100 * (hosts1 - hosts0) / wall, 1),
        "redraw_ms_median": pct(redraw_ms, 0.5),
        "redraw_ms_p99": pct(redraw_ms, 0.99),
        "key_to_screen_ms_median": pct(keys, 0.5),
        "key_to_screen_ms_p90": pct(keys, 0.9),
        "key_to_screen_ms_max": pct(keys, 1.0),
        "keys_missed": missed,
        "heap_settles_before_window": len(settles.at) - len(settles.since(t0)),
        "heap_settles_in_window_ms": settles.since(t0),
        "gc_frozen_objects": frozen,
        "gc_frozen_objects_end": frozen_end,
        "gc_tracked_objects_end": live_objects,
        "gc_passes": len(pauses.ms),
        "gc_pause_ms_max": pct(pauses.ms, 1.0),
        "gc_full_passes": pauses.gen.count(2),
        "gc_pause_ms_max_by_generation": {
            g: pct([m for m, k in zip(pauses.ms, pauses.gen) if k == g], 1.0) for g in (0, 1, 2)
        },
        "rss_mib_start": round(rss_start, 1),
        "rss_mib_end": round(rss_mib(), 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--compare", metavar="REV")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.compare:
        report(compare(args.compare, args.hosts, args.seconds), args.json)
    res = asyncio.run(run(args.hosts, args.seconds))
    res["tree"] = str(TREE)
    report(res, args.json)


def compare(rev: str, hosts: int, seconds: float) -> dict:
    """REV's cockpit, then this tree's, each measured by this script in a fresh process."""
    tmp = Path(tempfile.mkdtemp(prefix="cockpit-fleet-compare-"))
    before = tmp / "before"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(before), rev], check=True, capture_output=True
    )
    out = {}
    try:
        for tag, tree in ((rev, before), ("now", ROOT)):
            dest = tmp / f"{tag.replace('/', '_')}.json"
            subprocess.run(
                [sys.executable, __file__, "--hosts", str(hosts), "--seconds", str(seconds), "--json", str(dest)],
                env={**os.environ, "FLEET_SCALE_TREE": str(tree)},
                check=True,
                stdout=subprocess.DEVNULL,
            )
            out[tag] = json.loads(dest.read_text())
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(before)], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
    return out


if __name__ == "__main__":
    main()
