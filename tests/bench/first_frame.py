"""Time to the first complete frame over SSH, against the one-shot query an operator types.

Both go through the same real OpenSSH sshd on loopback (started here with generated keys):
  A: `ssh HOST nvidia-smi --query-gpu=... --format=csv` (on a host without GPUs, the simulated
     NVML's equivalent: the host's python printing the same CSV from the same state)
  B: a fresh `python -m cockpit`-equivalent process: import, connect with asyncssh, send the
     agent, and receive its first sample frame.

    python tests/bench/first_frame.py [--runs 10]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from conftest import Sshd  # noqa: E402

from cockpit.sim import fakenvml  # noqa: E402

FIRST_FRAME = r"""
import asyncio, os, sys, time
t0 = float(os.environ["T0"])
from cockpit.link.target import parse_target
from cockpit.session import HostSession, SessionOptions
async def main():
    s = HostSession(parse_target("cockpit-test"), SessionOptions(python=sys.executable,
        ssh_config=os.environ["CFG"], known_hosts=os.environ["KH"], sim_state=os.environ.get("SIM") or None))
    await s.connect()
    await s.first_sample.wait()
    print(time.time() - t0)
    os._exit(0)
asyncio.run(main())
"""

SIM_QUERY = ("import os,sys;os.environ['COCKPIT_SIM_STATE']=sys.argv[1];import importlib.util as u;"
             "s=u.spec_from_file_location('pynvml',sys.argv[2]);m=u.module_from_spec(s);s.loader.exec_module(m);"
             "m.nvmlInit();print('index, memory.used, memory.total, power.draw, utilization.gpu');"
             "[print(i,m.nvmlDeviceGetMemoryInfo(i).used>>20,m.nvmlDeviceGetMemoryInfo(i).total>>20,"
             "m.nvmlDeviceGetPowerUsage(i)/1000,m.nvmlDeviceGetUtilizationRates(i).gpu,sep=', ') "
             "for i in range(m.nvmlDeviceGetCount())]")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--json")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="cockpit-ff-"))
    sshd = Sshd(root)
    sshd.start()
    real = shutil.which("nvidia-smi") is not None
    sim = None
    if not real:
        sim = str(root / "sim")
        fakenvml.write_host(sim, gpus=8)
    env = dict(os.environ, CFG=str(sshd.client_config), KH=str(sshd.known_hosts), SIM=sim or "",
               PYTHONPATH=str(ROOT))
    ssh = ["ssh", "-F", str(sshd.client_config), "cockpit-test"]
    if real:
        remote = ["nvidia-smi", "--query-gpu=index,memory.used,memory.total,power.draw,utilization.gpu",
                  "--format=csv"]
    else:
        remote = [sys.executable, "-c", f'"{SIM_QUERY}"', sim, str(ROOT / "cockpit/sim/fakenvml.py")]
    a, b = [], []
    try:
        for _ in range(args.runs):
            t = time.perf_counter()
            out = subprocess.run(ssh + remote, capture_output=True, text=True)
            a.append(time.perf_counter() - t)
            assert out.returncode == 0 and "memory" in out.stdout, out.stderr
            env["T0"] = repr(time.time())
            out = subprocess.run([sys.executable, "-c", FIRST_FRAME], capture_output=True, text=True, env=env)
            assert out.returncode == 0, out.stderr
            b.append(float(out.stdout.strip()))
    finally:
        sshd.stop()
        shutil.rmtree(root, ignore_errors=True)
    res = {
        "gpu_data": "nvidia-smi" if real else "sim",
        "runs": args.runs,
        "ssh_query_ms_median": round(statistics.median(a) * 1000, 1),
        "cockpit_first_frame_ms_median": round(statistics.median(b) * 1000, 1),
        "ratio": round(statistics.median(b) / statistics.median(a), 2),
        "ssh_query_ms": [round(x * 1000) for x in a],
        "cockpit_first_frame_ms": [round(x * 1000) for x in b],
    }
    print(json.dumps(res, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
