"""A cockpit opened after something went wrong: the first look must already be right. The run is a
real process tree started before the cockpit, shaped like SGLang's (`python -m
sglang.launch_server --tp-size 4 ...` whose output goes to a file, four `sglang::scheduler_TPn`
children on simulated GPUs), and the cockpit comes with no layout naming its log."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import run_cli

LAUNCHER = textwrap.dedent("""\
    import os, subprocess, sys, time
    tp = int(sys.argv[sys.argv.index("--tp-size") + 1])
    mode, crash, state = os.environ["FAKE_MODE"], int(os.environ["FAKE_CRASH"]), os.environ["COCKPIT_SIM_STATE"]
    print("[2026-11-30 10:00:00] server_args=ServerArgs(model_path='m', tp_size=%d)" % tp, flush=True)
    kids = [subprocess.Popen([sys.executable, "-c", os.environ["FAKE_CHILD"], str(r), state, str(crash), mode])
            for r in range(tp)]
    if mode == "reaped":
        kids[crash].wait()
    time.sleep(3600)
""")
CHILD = textwrap.dedent("""\
    import os, sys, time, setproctitle
    from cockpit.sim import fakenvml
    rank, state, crash, mode = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    setproctitle.setproctitle("sglang::scheduler_TP%d" % rank)
    fakenvml.register(state, os.getpid(), rank, 70000, "idle")
    print("[2026-11-30 10:00:01 TP%d] Load weight end. type=DeepseekV3ForCausalLM, avail mem=20.00 GB" % rank, flush=True)
    time.sleep(0.5)
    if rank == crash and mode == "zombie":
        print("[2026-11-30 10:00:05 TP%d] Scheduler hit an exception: Traceback (most recent call last):" % rank)
        print('  File "/sgl/scheduler.py", line 2313, in run_scheduler_process')
        print("RuntimeError: CUDA error: an illegal memory access was encountered", flush=True)
        sys.exit(1)
    if rank == crash and mode == "reaped":
        os.kill(os.getpid(), 9)  # the kernel's OOM killer: no last word in the log
    time.sleep(3600)
""")


@pytest.fixture
def started_elsewhere(tmp_path, sim_state):
    """Starts the fake server as an operator would (nohup ... > log 2>&1 &), returns its log."""
    pkg = tmp_path / "engine" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "launch_server.py").write_text(LAUNCHER)
    procs = []

    def start(mode: str, crash: int) -> Path:
        log = tmp_path / "server.log"
        env = {
            **os.environ,
            "FAKE_MODE": mode,
            "FAKE_CRASH": str(crash),
            "FAKE_CHILD": CHILD,
            "COCKPIT_SIM_STATE": str(sim_state),
            "PYTHONPATH": os.pathsep.join([str(tmp_path / "engine"), os.environ.get("PYTHONPATH", "")]),
        }
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "sglang.launch_server",
                    "--model-path",
                    str(tmp_path / "model"),
                    "--tp-size",
                    "4",
                ],
                stdout=open(log, "w"),
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        )
        return log

    yield start
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()


def look(tmp_path, sim_state, wait: float, stall: str = "") -> dict:
    """`cockpit snapshot local --json --wait S` with a layout that names only which processes are
    ours (this machine runs other tests' ranks too), not the log."""
    layout = tmp_path / "ours.yaml"
    layout.write_text(f"command: [-m, sglang.launch_server]\nwatch: ['*sglang.launch_server*{tmp_path}*']\n{stall}")
    res = run_cli(
        "snapshot",
        "local",
        "--sim",
        str(sim_state),
        "--layout",
        str(layout),
        "--json",
        "--wait",
        str(wait),
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_a_rank_that_died_before_the_cockpit_came_is_named(started_elsewhere, tmp_path, sim_state):
    """Rank 1 hit a CUDA error and exited; its parent never reaped it (a zombie keeps only its
    truncated name). The first look says crashed (rank 1), from the log the server writes to."""
    log = started_elsewhere("zombie", crash=1)
    deadline = time.monotonic() + 30
    while "illegal memory access" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    doc = look(tmp_path, sim_state, 8)
    assert doc["log"]["path"] == str(log)  # found from the server's standard output
    assert doc["verdict"]["name"] == "crashed" and doc["verdict"]["odd_rank"] == 1, doc["verdict"]
    assert any("illegal memory access" in e for e in doc["verdict"]["evidence"])
    dead = [p for p in doc["processes"] if not p["alive"] or p["status"] == "Z"]
    assert [p["rank"] for p in dead] == [1]  # named from its place among its siblings


def test_a_rank_reaped_before_the_cockpit_came_is_missing(started_elsewhere, tmp_path, sim_state):
    """Rank 2 was SIGKILLed and reaped: no process, no line in the log. The command line says
    four ranks; three are there long after they were spawned."""
    started_elsewhere("reaped", crash=2)
    time.sleep(14)
    doc = look(tmp_path, sim_state, 8)
    assert doc["verdict"]["name"] == "crashed" and doc["verdict"]["odd_rank"] == 2, doc["verdict"]
    assert "expected 4 ranks (--tp-size 4), 3 seen: rank 2 missing" in doc["verdict"]["evidence"][0]


def test_a_run_silent_for_half_an_hour_is_stalled_at_first_look(started_elsewhere, tmp_path, sim_state):
    """Every rank alive and idle, the model resident, the log last written 30 minutes ago: the
    first short look says stalled-idle and since when, without waiting out the threshold again."""
    log = started_elsewhere("idle", crash=-1)
    deadline = time.monotonic() + 30
    while log.read_text().count("Load weight end") < 4 and time.monotonic() < deadline:
        time.sleep(0.2)
    then = time.time() - 1800
    os.utime(log, (then, then))
    time.sleep(6)
    doc = look(tmp_path, sim_state, 2, stall="stall: {idle_s: 6}\n")
    assert doc["verdict"]["name"] == "stalled-idle", doc["verdict"]
    silent = next(e for e in doc["verdict"]["evidence"] if "log silent since" in e)
    assert time.strftime("%H:%M", time.localtime(then)) in silent and "(30 min)" in silent
    assert doc["phase"]["name"] == "weights loaded"


def test_the_sample_a_first_look_judges_measures_cpu_over_a_window_that_tells(tmp_path):
    """The look judges the sample after its last watch change (the log it found, followed): the
    agent takes it at least FIRST_WINDOW_S after its last CPU reading, so a busy process reads
    several clock ticks, never one tick of a few milliseconds that could pass for idle."""
    import asyncio

    from cockpit.host.session import SessionOptions, WatchList
    from cockpit.link.target import parse_target
    from cockpit.monitor.host import HostMonitor

    out = open(tmp_path / "busy.log", "w")
    busy = subprocess.Popen(
        [sys.executable, "-c", "print('hello', flush=True)\nwhile True: pass"], stdout=out, stderr=out
    )

    async def look():
        monitor = HostMonitor(
            parse_target("local"),
            SessionOptions(python=sys.executable),
            None,
            watch=WatchList(patterns=[], pids=[busy.pid]),
        )
        async with monitor.attached():
            assert list(monitor.state.logs) == [str(tmp_path / "busy.log")]  # the watch changed after connecting
            p = monitor.state.procs[busy.pid]
            return p.cpu_pct, p.cpu_tick_pct, p.one_tick

    try:
        time.sleep(0.5)
        looks = [asyncio.run(look()) for _ in range(3)]
        assert all(tick <= 25.0 for _, tick, _ in looks), looks  # a window of 40 ms or more
        assert any(tick > 0 for _, tick, _ in looks), looks  # (a busy process's row says its tick)
    finally:
        busy.kill()
        busy.wait()
        out.close()
