"""How long after the log's last line a hang is called stalled, with a layout that says nothing
about stalls (the default windows), on the simulated host: every rank blocked in a collective in
each phase of the launch (`--sim-stall-at`, and the seed's own hang, EAGLE-3's draft capture), and
the healthy silent phases (they must never read stalled).

    python tests/bench/stall_detect.py [--runs 1] [--phases seed,init,...] [--json OUT]
    python tests/bench/stall_detect.py --layout REAL.yaml --marker TEXT   (a real job's hang, on a GPU host)

Live: `cockpit launch local --layout L --sim DIR --yes --json` watches the launch; the time is the
stalled verdict's moment in the ledger minus the log's last write (its mtime). Cold: the same launch
is left to its own once the hang's last line is written (the watching cockpit killed), and a
fresh `cockpit snapshot local --layout L --json` is started as soon as the log has been silent
`--cold-after` seconds; the time is its answer minus the log's last write, and the look's own
length. Healthy: launched and watched to ready (`--settle 5`); the verdicts it went through.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchlib import pct, report

SEED = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/d"]
HANGS = {
    "seed": SEED,
    "init": ["--sim-stall-at", "init"],
    "load": ["--sim-stall-at", "load"],
    "kv": ["--sim-stall-at", "kv"],
    "capture": ["--sim-stall-at", "capture"],
    "serving": ["--sim-stall-at", "serving", "--sim-traffic", "2"],
}
HEALTHY = {
    "jit": ["--sim-jit-s", "25"],
    "late-node": ["--sim-late-node-s", "25"],
    "slow-disk": ["--sim-slow-disk-s", "25"],
    "idle-server": [],
}
MARKERS = {
    "seed": "Capture draft cuda graph begin",
    "init": "Init torch distributed ends",
    "load": "Loading safetensors checkpoint shards:  48%",
    "kv": "KV Cache is allocated",
    "capture": "Capture cuda graph begin",
    "serving": "Decode batch",
}


REAL: dict = {}  # --layout FILE --marker TEXT: a real job's layout instead of the simulated host's


def layout(folder: Path, name: str, flags: list[str], port: int) -> Path:
    """A layout as an operator's first: the command, the port, and nothing about stalls."""
    path = folder / f"{name}.yaml"
    if REAL:
        from cockpit.runs.layoutfile import load_layout

        real = load_layout(REAL["layout"])
        body = {
            "name": f"bench-{name}",
            "engine": real.engine,
            "python": real.python,
            "command": real.command,
            "base_flags": real.base_flags,
            "flag_sets": real.flag_sets,
            "enabled": real.enabled,
            "env": real.env,
            "log_dir": str(folder / "runs"),
            "ports": real.ports,
            "kill_wait_s": 5,
        }
        path.write_text(json.dumps(body))
        return path
    body = {
        "name": f"bench-{name}",
        "engine": "sglang",
        "python": sys.executable,
        "command": ["-m", "cockpit.sim.server"],
        "base_flags": ["--tp-size", "8", "--port", str(port), "--enable-metrics", "--sim-shm-dir", str(folder), *flags],
        "log_dir": str(folder / "runs"),
        "ports": [port],
    }
    path.write_text(json.dumps(body))  # JSON is YAML
    return path


def cockpit(*args: str) -> list[str]:
    return [sys.executable, "-m", "cockpit", *args]


def env(folder: Path) -> dict:
    return {
        **os.environ,
        "HOME": str(folder / "home"),
        "XDG_STATE_HOME": str(folder / "home" / "state"),
        "XDG_CACHE_HOME": str(folder / "home" / "cache"),
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
    }


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ledger_rows(folder: Path) -> list[dict]:
    rows = []
    for path in (folder / "home").rglob("*.jsonl"):
        if path.parent.name == "ledger":
            rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows


def newest_log(folder: Path) -> Path | None:
    logs = sorted((folder / "runs").glob("*.log"), key=lambda p: p.stat().st_mtime)
    return logs[-1] if logs else None


def kill_runs(folder: Path) -> None:
    """SIGKILL the process groups this benchmark launched (their leaders are in its ledger)."""
    for row in ledger_rows(folder):
        if row.get("pgid"):
            try:
                os.killpg(int(row["pgid"]), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def sim_args(folder: Path) -> list[str]:
    """`--sim DIR` of a fresh simulated host, or nothing for a real job's layout."""
    return [] if REAL else ["--sim", str(sim_state(folder))]


def sim_state(folder: Path) -> Path:
    from cockpit.sim import fakenvml

    state = folder / "sim"
    fakenvml.write_host(str(state), gpus=8, model="rtx-pro-6000", seed=5)
    return state


def live(name: str, flags: list[str], settle: int = 60) -> dict:
    with tempfile.TemporaryDirectory(prefix="stall-bench-") as tmp:
        folder = Path(tmp)
        lay, sim = layout(folder, name, flags, free_port()), sim_args(folder)
        try:
            out = subprocess.run(
                cockpit(
                    "launch",
                    "local",
                    "--layout",
                    str(lay),
                    *sim,
                    "--yes",
                    "--json",
                    "--timeout",
                    "200",
                    "--settle",
                    str(settle),
                ),
                capture_output=True,
                text=True,
                env=env(folder),
                timeout=260,
            )
            log = newest_log(folder)
            last = log.stat().st_mtime if log else None
            verdicts = [r for r in ledger_rows(folder) if r.get("event") == "verdict"]
            stalled = next((r for r in verdicts if str(r.get("verdict", "")).startswith("stalled")), None)
            doc = json.loads(out.stdout) if out.stdout.strip().startswith("{") else {}
        finally:
            kill_runs(folder)
        return {
            "outcome": doc.get("outcome"),
            "verdicts": [r.get("verdict") for r in verdicts],
            "after_last_line_s": round(stalled["at"] - last, 1) if stalled and last else None,
            "odd_rank": stalled.get("odd_rank") if stalled else None,
            "evidence": (stalled.get("evidence") or [None])[0] if stalled else None,
        }


def cold(name: str, flags: list[str], after: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="stall-bench-") as tmp:
        folder = Path(tmp)
        lay, sim = layout(folder, name, flags, free_port()), sim_args(folder)
        watcher = subprocess.Popen(
            cockpit(
                "launch", "local", "--layout", str(lay), *sim, "--yes", "--json", "--timeout", "600", "--no-forensics"
            ),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env(folder),
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                log = newest_log(folder)
                if (
                    log is not None
                    and MARKERS[name] in log.read_text(errors="replace")
                    and time.time() - log.stat().st_mtime >= 0.5
                ):
                    break
                time.sleep(0.2)
            os.killpg(watcher.pid, signal.SIGKILL)  # the cockpit that watched the launch is gone
            watcher.wait()
            while time.time() - log.stat().st_mtime < after:
                time.sleep(0.1)
            began = time.time()
            out = subprocess.run(
                cockpit("snapshot", "local", "--layout", str(lay), *sim, "--json"),
                capture_output=True,
                text=True,
                env=env(folder),
                timeout=120,
            )
            ended = time.time()
            last = log.stat().st_mtime
            doc = json.loads(out.stdout) if out.stdout.strip().startswith("{") else {"verdict": {}}
        finally:
            kill_runs(folder)
        v = doc.get("verdict") or {}
        return {
            "verdict": v.get("name"),
            "odd_rank": v.get("odd_rank"),
            "look_s": round(ended - began, 1),
            "after_last_line_s": round(ended - last, 1),
            "evidence": (v.get("evidence") or [None])[0],
        }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--phases", default=",".join([*HANGS, *HEALTHY]))
    ap.add_argument("--cold-after", type=float, default=1.0, help="start the cold look once the log is this silent")
    ap.add_argument("--layout", help="a real job's layout (its hang on): measured instead of the simulated host")
    ap.add_argument("--marker", help="with --layout: the log text the hang comes after (the cold look waits for it)")
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.layout:
        REAL.update(layout=a.layout)
        HANGS.clear()
        HANGS["real"] = []
        MARKERS["real"] = a.marker or ""
        a.phases = "real"
    result: dict = {"command": " ".join(sys.argv), "hangs": {}, "healthy": {}}
    for name in a.phases.split(","):
        if name in HANGS:
            runs = [
                {"live": live(name, HANGS[name]), "cold": cold(name, HANGS[name], a.cold_after)} for _ in range(a.runs)
            ]
            lt = [r["live"]["after_last_line_s"] for r in runs if r["live"]["after_last_line_s"] is not None]
            ct = [
                r["cold"]["after_last_line_s"]
                for r in runs
                if r["cold"]["verdict"] in ("stalled-idle", "stalled-spinning")
            ]
            result["hangs"][name] = {
                "live_median_s": pct(lt, 0.5),
                "live_max_s": max(lt, default=None),
                "cold_median_s": pct(ct, 0.5),
                "cold_max_s": max(ct, default=None),
                "called": f"{len(lt)}+{len(ct)} of {2 * len(runs)}",
                "runs": runs,
            }
        elif name in HEALTHY:
            runs = [live(name, HEALTHY[name], settle=5) for _ in range(a.runs)]
            result["healthy"][name] = {
                "stalled": sum(any(str(v).startswith("stalled") for v in r["verdicts"]) for r in runs),
                "runs": runs,
            }
        print(
            name,
            json.dumps(result["hangs"].get(name) or result["healthy"].get(name))[:400],
            file=sys.stderr,
            flush=True,
        )
    report(result, a.json)


if __name__ == "__main__":
    main()
