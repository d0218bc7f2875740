"""The simulated host under a layout that says nothing about stalls (every operator's first): its
hangs called stalled on the stacks' evidence, long before the default windows, with the rank
that is not where the others are; and its healthy phases that are silent in the log yet moving
(a JIT on the CPU, a rendezvous waiting for a late node, a weight load from a slow disk, a server
with no request) never called stalled. Each is a real `cockpit launch` watching a real run; the
verdicts it went through are read from the ledger. No time is asserted: the detection times are
tests/bench/stall_detect.py's (docs/BENCHMARKS.md)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import free_port
from simhost import kill_groups, wait_for

from cockpit.host.session import SessionOptions, WatchList
from cockpit.link.target import parse_target
from cockpit.monitor.host import HostMonitor
from cockpit.runs.layoutfile import load_layout
from cockpit.sim import fakenvml


def launch(
    tmp_path: Path,
    flags: list[str],
    timeout: int = 150,
    settle: int = 5,
    port: int | None = None,
    target: list[str] | None = None,
) -> tuple[dict, list[dict]]:
    """`cockpit launch local --layout L --sim DIR --yes --json` of a layout with no stall
    settings (`target`: another target and its options); returns its outcome row and the
    verdicts the ledger kept."""
    state = tmp_path / "sim"
    fakenvml.write_host(str(state), gpus=8, model="rtx-pro-6000", seed=5)
    port = port or free_port()
    layout = tmp_path / "first.yaml"
    layout.write_text(
        json.dumps(
            {
                "name": "first",
                "engine": "sglang",
                "python": sys.executable,
                "command": ["-m", "cockpit.sim.server"],
                "base_flags": [
                    "--tp-size",
                    "8",
                    "--port",
                    str(port),
                    "--enable-metrics",
                    "--sim-shm-dir",
                    str(tmp_path),
                    *flags,
                ],
                "log_dir": str(tmp_path / "runs"),
                "ports": [port],
            }
        )
    )
    env = {**os.environ, "HOME": str(tmp_path / "home"), "XDG_STATE_HOME": str(tmp_path / "home" / "state")}
    try:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "cockpit",
                "launch",
                *(target or ["local"]),
                "--layout",
                str(layout),
                "--sim",
                str(state),
                "--yes",
                "--json",
                "--timeout",
                str(timeout),
                "--settle",
                str(settle),
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout + 120,
        )
    finally:
        rows = [
            json.loads(line)
            for p in (tmp_path / "home").rglob("ledger/*.jsonl")
            for line in p.read_text().splitlines()
            if line.strip()
        ]
        for pgid in {r["pgid"] for r in rows if isinstance(r.get("pgid"), int)}:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert out.stdout.strip().startswith("{"), out.stderr[-2000:]
    return json.loads(out.stdout), [r for r in rows if r.get("event") == "verdict"]


@pytest.mark.parametrize(
    "flags, phase",
    [
        (["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/d"], "capturing draft cuda graphs"),
        (["--sim-stall-at", "init"], "loading weights"),
        (["--sim-stall-at", "serving", "--sim-traffic", "2"], "serving"),
    ],
    ids=["seed", "init", "serving"],
)
def test_a_hang_is_called_stalled_on_the_stacks_evidence(tmp_path, flags, phase):
    """Every rank blocked in a collective, the log silent: stalled on the positive evidence of two
    dumps, whatever the phase (before the weights, the seed's own, with requests frozen)."""
    row, verdicts = launch(tmp_path, ["--sim-speed", "4", *flags], settle=60)  # the serving hang comes after ready
    assert row["outcome"] == "stalled-idle", json.dumps(row, indent=1)
    assert row["evidence"][0].startswith(
        "stacks unchanged across two dumps 4 s apart, all in waits: ranks 0-7 in a collective (Rank.all_reduce)"
    ), row["evidence"]
    assert not any(str(v["verdict"]).startswith("stalled") for v in verdicts[:-1])
    if phase == "serving":
        assert verdicts[-1]["detail"] == "requests frozen", verdicts[-1]
        assert any("generation tokens frozen" in e for e in row["evidence"]), row["evidence"]


def test_over_ssh_the_stacks_are_looked_at_with_the_pyspy_beside_the_layouts_interpreter(tmp_path, sshd):
    """Over ssh the cockpit's own py-spy is not used: the agent runs on an interpreter with no
    py-spy beside it (this venv's, through a script in a folder of its own) and the session's PATH
    has none; the layout's interpreter (the venv's) has one. The stall's stack look finds it there,
    as `cockpit dump` does, and calls the hang on the stacks' evidence, not on the silent windows
    (as a look with no py-spy must)."""
    folder = tmp_path / "agent" / "bin"
    folder.mkdir(parents=True)
    agent = folder / "python3"
    agent.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    agent.chmod(0o755)
    target = ["cockpit-test", "--python", str(agent), *sshd.cli_args()]
    row, _ = launch(tmp_path, ["--sim-speed", "4", "--sim-stall-at", "init"], target=target)
    assert row["outcome"] == "stalled-idle", json.dumps(row, indent=1)
    assert row["evidence"][0].startswith("stacks unchanged across two dumps 4 s apart"), row["evidence"]


def test_a_strangers_404s_every_2_s_never_move_a_hung_server(tmp_path):
    """Issue 44: another user requests a missing page every 2 s from the server hung while serving
    (its HTTP front end answers 404, one access line each): still stalled, requests frozen, the
    log never said to show work (the access lines make no token, and the engine's counters stand;
    each rule alone: tests/judge/test_fast_stall.py)."""
    port, stop, answered = free_port(), threading.Event(), []

    def stranger() -> None:
        while not stop.is_set():
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/completions/x", timeout=2)
            except urllib.error.HTTPError as exc:
                answered.append(exc.code)
            except OSError:
                pass  # not up yet
            stop.wait(2)

    who = threading.Thread(target=stranger, daemon=True)
    who.start()
    try:
        row, verdicts = launch(
            tmp_path, ["--sim-speed", "4", "--sim-stall-at", "serving", "--sim-traffic", "2"], settle=60, port=port
        )
    finally:
        stop.set()
        who.join(10)
    lines = (next((tmp_path / "runs").glob("*.log"))).read_text()
    assert 404 in answered and '"GET /v1/completions/x HTTP/1.1" 404' in lines, (answered, lines[-2000:])
    assert row["outcome"] == "stalled-idle" and verdicts[-1]["detail"] == "requests frozen", (row, verdicts[-1])
    assert not any("the log shows work" in e for e in row["evidence"]), row["evidence"]


def test_a_rank_outside_the_collective_is_named(tmp_path):
    """Rank 3 stops while capturing CUDA graphs, outside any collective; the others wait in it:
    stalled, rank 3 named from the stacks."""
    row, verdicts = launch(tmp_path, ["--sim-speed", "4", "--sim-capture-hang-rank", "3"])
    assert row["outcome"] == "stalled-idle" and verdicts[-1]["odd_rank"] == 3, (row, verdicts[-1])
    assert any("rank 3 not in Rank.all_reduce" in e for e in row["evidence"]), row["evidence"]


def test_the_demos_launch_at_a_third_of_its_speed_is_never_stalled(tmp_path):
    """A slow host: the demo's server (its flags, EAGLE-3 off: the demo's hang is the seed's) at a
    third of its speed, its weight load and graph capture three times as long and as silent, then
    serving: ready, and no verdict on the way a stall."""
    row, verdicts = launch(
        tmp_path,
        ["--model-path", "/shared/kimi-k2.5-int4", "--trust-remote-code", "--sim-speed", "0.33", "--sim-traffic", "1"],
        timeout=120,
        settle=20,
    )
    assert row["outcome"] == "ready", row
    assert verdicts and not any(str(v["verdict"]).startswith("stalled") for v in verdicts), verdicts


@pytest.mark.parametrize(
    "flags, said",
    [
        (["--sim-jit-s", "20"], None),  # rank 0 busy on the CPU: the cheap signals are not silent, no look
        (["--sim-late-node-s", "20"], "in a rendezvous"),
        (["--sim-slow-disk-s", "20"], "reading"),
        ([], None),  # the idle server
    ],
    ids=["jit", "late-node", "slow-disk", "idle-server"],
)
async def test_a_healthy_phase_silent_in_the_log_is_never_stalled(tmp_path, sim_state, monkeypatch, flags, said):
    """A run started by hand, watched by a monitor as a screen keeps one, with a layout that says
    nothing about stalls: its phase runs 20 s silent in the log, then the server comes up and
    serves nothing. No verdict on the way is a stall; where the ranks sit idle (the rendezvous,
    the slow disk) a stack look is taken and says why it is none; the idle server is `ok` and
    never looked at."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    server, log, monitor = by_hand(tmp_path, sim_state, flags)
    verdicts: list[str] = []
    looks = []

    def seen(event):
        verdicts.append(str(monitor.verdict.name))
        if monitor.watchdog.look is not None and monitor.watchdog.look not in looks:
            looks.append(monitor.watchdog.look)

    monitor.subscribe(seen)
    try:
        await monitor.open(kept=True)
        kept = asyncio.create_task(monitor.keep())
        await wait_for(lambda: monitor.phase.name in ("ready", "serving"), 150, "the server up", log.read_text)
        up = len(looks)
        await monitor.session.wait_samples(40, timeout=120)  # idle, serving nothing, past the quiet window
        assert monitor.verdict.name.value == "ok", monitor.verdict
        assert len(looks) == up  # a server with no request has no work waiting: never looked at
        kept.cancel()
    finally:
        await monitor.close()
        kill_groups([server.pid])
    assert not any(v.startswith("stalled") for v in verdicts), verdicts
    if said is not None:
        assert looks and not any(look.still for look in looks), looks
        assert any(said in look.evidence()[0] for look in looks), [look.evidence() for look in looks]


def started_by_hand(tmp_path: Path, sim_state, flags: list[str], tp: int = 2, layout_extra: str = ""):
    """A simulated server started by hand (as the operator story's are), its log a file, and a layout
    naming its port and nothing about stalls."""
    port = free_port()
    log = tmp_path / "server.log"
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cockpit.sim.server",
            "--tp-size",
            str(tp),
            "--sim-speed",
            "4",
            "--port",
            str(port),
            "--sim-shm-dir",
            str(tmp_path),
            *flags,
        ],
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, "COCKPIT_SIM_STATE": str(sim_state)},
    )
    layout = tmp_path / "first.yaml"
    layout.write_text(f"engine: sglang\ncommand: [-m, cockpit.sim.server]\nports: [{port}]\nlog: {log}\n{layout_extra}")
    return server, log, layout


def by_hand(tmp_path: Path, sim_state, flags: list[str], layout_extra: str = ""):
    """A TP-2 server started by hand, and a monitor as a screen keeps one, its layout watching the
    server's processes."""
    server, log, layout = started_by_hand(
        tmp_path,
        sim_state,
        flags,
        layout_extra=(f"watch: ['*cockpit.sim.server*--sim-shm-dir {tmp_path}*']\n{layout_extra}"),
    )
    lay = load_layout(str(layout))
    monitor = HostMonitor(
        parse_target("local"),
        SessionOptions(python=sys.executable, interval=0.25, sim_state=str(sim_state)),
        layout=lay,
        watch=WatchList.for_layout(lay),
        probe_every_s=0.25,
    )
    return server, log, monitor


@pytest.mark.parametrize("switch", ["auto_dump: false\n", "--no-forensics"], ids=["layout", "cli"])
async def test_with_forensics_off_no_stack_look_is_taken(tmp_path, sim_state, monkeypatch, switch):
    """Looks follow the forensics switch: with `auto_dump: false` in the layout, or `--no-forensics`
    as the CLI reads it, a hang before the weights is silent well past the quiet window and the look
    gap, and no rank is dumped: the verdict waits for the stall windows (120 s), never stalled on a look."""
    from cockpit.cli.attach import forensics_allowed

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    server, log, monitor = by_hand(
        tmp_path, sim_state, ["--sim-stall-at", "init"], switch if switch.endswith("\n") else ""
    )
    args = argparse.Namespace(read_only=False, no_forensics=switch == "--no-forensics")
    monitor.forensics_on = forensics_allowed(args, monitor.layout)
    assert monitor.forensics_on is False
    verdicts: list[str] = []
    monitor.subscribe(lambda event: verdicts.append(str(monitor.verdict.name)))
    try:
        await monitor.open(kept=True)
        kept = asyncio.create_task(monitor.keep())
        await wait_for(lambda: "Init torch distributed ends" in log.read_text(), 60, "the hang", log.read_text)
        await monitor.session.wait_samples(80, timeout=120)  # 20 s and more of silence: 5 s quiet + 4 s gap, twice
        assert monitor.watchdog.looks is False and monitor.watchdog.look is None, monitor.watchdog.look.evidence()
        assert not monitor.verdict.name.value.startswith("stalled"), (monitor.verdict, log.read_text()[-500:])
        kept.cancel()
    finally:
        await monitor.close()
        kill_groups([server.pid])
    assert not any(v.startswith("stalled") for v in verdicts), verdicts


def test_a_cold_look_just_after_the_last_line_goes_on_until_a_stack_look_decides(tmp_path):
    """A one-shot `cockpit snapshot` (its default wait) begun a second after a hang's last line, by a
    cockpit that never saw the run before: it does not answer on its first sample, but goes on while a
    stack look can decide, and says stalled on the stacks' evidence."""
    state = tmp_path / "sim"
    fakenvml.write_host(str(state), gpus=8, model="rtx-pro-6000", seed=5)
    server, log, layout = started_by_hand(tmp_path, state, ["--sim-stall-at", "init"], tp=8)
    env = {**os.environ, "HOME": str(tmp_path / "home"), "XDG_STATE_HOME": str(tmp_path / "home" / "state")}
    try:
        deadline = time.monotonic() + 90
        while not ("Init torch distributed ends" in log.read_text() and time.time() - log.stat().st_mtime >= 1.0):
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.1)
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "cockpit",
                "snapshot",
                "local",
                "--layout",
                str(layout),
                "--sim",
                str(state),
                "--json",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
    finally:
        kill_groups([server.pid])
    assert out.returncode == 0 and out.stdout.startswith("{"), out.stderr[-2000:]
    verdict = json.loads(out.stdout)["verdict"]
    assert verdict["name"] == "stalled-idle", verdict
    assert verdict["evidence"][0].startswith(
        "stacks unchanged across two dumps 4 s apart, all in waits: ranks 0-7 in a collective"
    ), verdict["evidence"]
