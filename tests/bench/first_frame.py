"""Time to the first complete frame over SSH, against the one-shot query an operator types.

Both go through the same real OpenSSH sshd on loopback (started here with generated keys):
  A: `ssh HOST nvidia-smi --query-gpu=... --format=csv` (on a host without GPUs, the simulated
     NVML's equivalent: the host's python printing the same CSV from the same state)
  B: a fresh `python -m cockpit`-equivalent process: import, connect with asyncssh, send the
     agent, and receive its first sample frame.

    python tests/bench/first_frame.py [--runs 10] [--no-bytecode] [--json OUT]
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

from conftest import Sshd

from cockpit.sim import fakenvml

FIRST_FRAME = r"""
import asyncio, json, os, sys, time
t0 = float(os.environ["T0"])
m = {"interpreter": time.time() - t0}
from cockpit.link.target import parse_target
from cockpit.host.session import HostSession, SessionOptions
from cockpit.link import ssh  # what the first connect imports (asyncssh, cryptography)
from cockpit.host import state as model
m["imports"] = time.time() - t0
c0, s0 = ssh.SshLink.connect, ssh.SshLink.start_agent
async def connect(self):
    await c0(self)
    m["ssh connected (key exchange, auth)"] = time.time() - t0
async def start_agent(self, argv, env=None):
    r = await s0(self, argv, env)
    m["agent channel open"] = time.time() - t0
    return r
ssh.SshLink.connect, ssh.SshLink.start_agent = connect, start_agent
a0 = model.HostState.apply
def apply(self, frame):
    m.setdefault(frame.get("t"), time.time() - t0)
    if frame.get("t") == "hello":
        m["hello built"] = frame["time"] - t0  # the agent's own clock: the same machine here
    return a0(self, frame)
model.HostState.apply = apply
async def main():
    s = HostSession(parse_target("cockpit-test"), SessionOptions(python=sys.executable,
        ssh_config=os.environ["CFG"], known_hosts=os.environ["KH"], sim_state=os.environ.get("SIM") or None))
    await s.connect()
    await s.first_sample.wait()
    print(json.dumps(m))
    os._exit(0)
asyncio.run(main())
"""

SIM_QUERY = (
    "import os,sys;os.environ['COCKPIT_SIM_STATE']=sys.argv[1];import importlib.util as u;"
    "s=u.spec_from_file_location('pynvml',sys.argv[2]);m=u.module_from_spec(s);s.loader.exec_module(m);"
    "m.nvmlInit();print('index, memory.used, memory.total, power.draw, utilization.gpu');"
    "[print(i,m.nvmlDeviceGetMemoryInfo(i).used>>20,m.nvmlDeviceGetMemoryInfo(i).total>>20,"
    "m.nvmlDeviceGetPowerUsage(i)/1000,m.nvmlDeviceGetUtilizationRates(i).gpu,sep=', ') "
    "for i in range(m.nvmlDeviceGetCount())]"
)


def phases(marks: list[dict]) -> dict:
    """Each step's own time (median over runs), from the marks the cockpit process took."""
    order = [
        ("interpreter", "interpreter start, asyncio imported"),
        ("imports", "imports (asyncssh and cryptography among them)"),
        ("ssh connected (key exchange, auth)", "TCP, key exchange, authentication"),
        ("agent channel open", "the agent's channel opened (the remote command started)"),
        ("hello built", "the remote python started, the agent's source sent, compiled and run, its hello built"),
        ("hello", "the hello back to the cockpit"),
        ("sample", "config, then the first sample (a full process scan)"),
    ]
    out, prev = {}, None
    for key, name in order:
        out[name] = round(statistics.median([(m[key] - (m[prev] if prev else 0)) * 1000 for m in marks]), 1)
        prev = key
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument(
        "--no-bytecode",
        action="store_true",
        help="the cockpit compiles its modules from source on each start (PYTHONDONTWRITEBYTECODE=1); "
        "default: bytecode cached, as an installed package has it",
    )
    ap.add_argument("--compare", metavar="REV", help="also REV's cockpit (a git worktree), interleaved in the same run")
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
    env = dict(
        os.environ,
        CFG=str(sshd.client_config),
        KH=str(sshd.known_hosts),
        SIM=sim or "",
        PYTHONPATH=str(ROOT) + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else ""),
    )
    if args.no_bytecode:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    else:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(root / "pyc")
    ssh = ["ssh", "-F", str(sshd.client_config), "cockpit-test"]
    if real:
        remote = ["nvidia-smi", "--query-gpu=index,memory.used,memory.total,power.draw,utilization.gpu", "--format=csv"]
    else:
        remote = [sys.executable, "-c", f'"{SIM_QUERY}"', sim, str(ROOT / "cockpit/sim/fakenvml.py")]
    a, b, marks = [], [], []
    old_b, old_marks, worktree = [], [], None
    if args.compare:
        worktree = root / "before"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(worktree), args.compare],
            check=True,
            capture_output=True,
        )
    try:
        for i in range(args.runs + 1):  # the first of each is not counted: caches filled, files read once
            t = time.perf_counter()
            out = subprocess.run(ssh + remote, capture_output=True, text=True)
            a.append(time.perf_counter() - t)
            assert out.returncode == 0 and "memory" in out.stdout, out.stderr
            if worktree is not None:
                e = dict(env, T0=repr(time.time()), PYTHONPATH=str(worktree) + env["PYTHONPATH"][len(str(ROOT)) :])
                out = subprocess.run(
                    [sys.executable, "-c", FIRST_FRAME], capture_output=True, text=True, env=e, cwd=str(worktree)
                )
                assert out.returncode == 0, out.stderr
                if i:
                    old_marks.append(json.loads(out.stdout.strip()))
                    old_b.append(old_marks[-1]["sample"])
            env["T0"] = repr(time.time())
            out = subprocess.run(
                [sys.executable, "-c", FIRST_FRAME], capture_output=True, text=True, env=env, cwd=str(ROOT)
            )
            assert out.returncode == 0, out.stderr
            if i == 0:
                a.pop()
                continue
            marks.append(json.loads(out.stdout.strip()))
            b.append(marks[-1]["sample"])
    finally:
        if worktree is not None:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)], capture_output=True
            )
        sshd.stop()
        shutil.rmtree(root, ignore_errors=True)
    res = {
        "gpu_data": "nvidia-smi" if real else "sim",
        "runs": args.runs,
        "ssh_query_ms_median": round(statistics.median(a) * 1000, 1),
        "cockpit_first_frame_ms_median": round(statistics.median(b) * 1000, 1),
        "ratio": round(statistics.median(b) / statistics.median(a), 2),
        "cockpit_phases_ms_median": phases(marks),
        "ssh_query_ms": [round(x * 1000) for x in a],
        **(
            {
                f"{args.compare}: cockpit_first_frame_ms_median": round(statistics.median(old_b) * 1000, 1),
                f"{args.compare}: ratio": round(statistics.median(old_b) / statistics.median(a), 2),
                f"{args.compare}: cockpit_phases_ms_median": phases(old_marks),
            }
            if args.compare
            else {}
        ),
        "cockpit_first_frame_ms": [round(x * 1000) for x in b],
    }
    print(json.dumps(res, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
