"""The exporter at scale: N hosts (default 64), each a real sshd on loopback in front of an agent
on a simulated 8-GPU host (as tests/bench/fleet_scale.py makes them), watched by one
`cockpit exporter` process at a 1 s sampling interval and scraped every S seconds by this script
(its own CPU not counted), asking as Prometheus asks (OpenMetrics, gzip). Measures the exporter process's CPU and RSS over the window, each
scrape's time and size, and the series per scrape.

    python tests/bench/exporter_cpu.py [--hosts 64] [--seconds 60] [--scrape-every 5] [--json OUT]
"""

from __future__ import annotations

import argparse
import gzip
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "bench")]

from benchlib import pct, report
from conftest import free_port
from fleet_scale import start_hosts, tree_cpu_s


def rss_mib_of(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


# what Prometheus 2.42 sends: OpenMetrics preferred, gzip
HEADERS = {
    "Accept": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    "Accept-Encoding": "gzip",
}


def scrape(url: str) -> tuple[float, str, int]:
    """(ms until the whole answer arrived, its text, its size on the wire)."""
    t = time.perf_counter()
    with urllib.request.urlopen(urllib.request.Request(url, headers=HEADERS), timeout=30) as resp:
        raw = resp.read()
        zipped = resp.headers.get("Content-Encoding") == "gzip"
    ms = (time.perf_counter() - t) * 1000
    return ms, (gzip.decompress(raw) if zipped else raw).decode(), len(raw)


UP = re.compile(r'^gpu_cockpit_link\{host="[^"]*",state="up"\} 1\.0$', re.M)


def run(n: int, seconds: float, every: float) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="cockpit-exporter-"))
    procs, ssh_config, known_hosts = start_hosts(tmp, n)
    fleet = tmp / "fleet.yaml"
    fleet.write_text(
        "interval: 1\nhosts:\n"
        + "".join(
            f"  - {{target: host{i:02d}, python: {sys.executable}, sim: {tmp / f'sim{i}'}}}\n" for i in range(1, n + 1)
        )
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    exp = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cockpit",
            "exporter",
            str(fleet),
            "--listen",
            f"127.0.0.1:{port}",
            "--ssh-config",
            str(ssh_config),
            "--known-hosts",
            str(known_hosts),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
    )
    try:
        assert "metrics on" in (exp.stdout.readline() or ""), "the exporter did not start"
        t_start = time.monotonic()
        up = 0
        while time.monotonic() - t_start < 180:
            up = len(UP.findall(scrape(url)[1]))
            if up == n:
                break
            time.sleep(1)
        all_up_s = time.monotonic() - t_start
        time.sleep(5)  # past the connections' own start
        ms, sizes, series = [], [], []
        cpu0, hosts0, t0 = tree_cpu_s([exp.pid]), tree_cpu_s([p.pid for p in procs]), time.monotonic()
        rss_start = rss_mib_of(exp.pid)
        next_at = t0
        while time.monotonic() - t0 < seconds:
            took, body, wire = scrape(url)
            ms.append(took)
            sizes.append((len(body), wire))
            series.append(sum(1 for line in body.splitlines() if line and not line.startswith("#")))
            next_at += every
            time.sleep(max(0.0, next_at - time.monotonic()))
        wall = time.monotonic() - t0
        cpu = tree_cpu_s([exp.pid]) - cpu0
        hosts = tree_cpu_s([p.pid for p in procs]) - hosts0
        rss_end = rss_mib_of(exp.pid)
    finally:
        exp.terminate()
        exp.wait(30)
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(10)
    return {
        "hosts": n,
        "gpus": 8 * n,
        "hosts_up": up,
        "seconds_until_all_up": round(all_up_s, 1),
        "window_s": round(wall, 1),
        "scrape_every_s": every,
        "scrapes": len(ms),
        "exporter_cpu_pct_of_core": round(100 * cpu / wall, 1),
        "simulated_hosts_cpu_pct_of_core": round(100 * hosts / wall, 1),
        "scrape_ms_median": pct(ms, 0.5),
        "scrape_ms_p99": pct(ms, 0.99),
        "scrape_ms_max": pct(ms, 1.0),
        "series_per_scrape": max(series) if series else None,
        "bytes_per_scrape": max(sizes)[0] if sizes else None,
        "gzip_bytes_per_scrape": max(sizes)[1] if sizes else None,
        "exporter_rss_mib_start": round(rss_start, 1),
        "exporter_rss_mib_end": round(rss_end, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--scrape-every", type=float, default=5.0)
    ap.add_argument("--json")
    args = ap.parse_args()
    report(run(args.hosts, args.seconds, args.scrape_every), args.json)


if __name__ == "__main__":
    main()
