"""One monitor per host: the layout's own phases, the verdict a headless snapshot gives, and the
fleet row and the cockpit opened from it agreeing on a stalled simulated host."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

from conftest import free_port, run_cli
from simhost import kill_groups, until

from cockpit.host.session import SessionOptions
from cockpit.host.state import HostState
from cockpit.judge.diagnose import Watchdog, phase_of
from cockpit.judge.verdict import VerdictName
from cockpit.monitor.fleet import Fleet, FleetHost, FleetMonitor
from cockpit.monitor.host import rules_for
from cockpit.runs.layoutfile import parse_layout
from cockpit.ui.app import save_text
from cockpit.ui.cockpit import CockpitScreen
from cockpit.ui.fleet import FleetApp

PHASED = """\
name: phased
engine: vllm
command: [-m, my.server]
watch: []
phases:
  - pattern: 'Compiling the drafter'
    phase: compiling drafter
  - pattern: 'init engine .* took'
    phase: engine up
"""


def test_a_layouts_own_phases_mark_the_log_and_the_phase(tmp_path):
    layout = parse_layout(PHASED, "phased.yaml")
    assert [r.phase for r in layout.phases] == ["compiling drafter", "engine up"]
    state = HostState("t", rules=rules_for(layout))
    state.apply(
        {
            "t": "log",
            "path": "/l",
            "lines": [
                "(EngineCore pid=9) INFO Loading safetensors checkpoint shards: 50% Completed | 1/2",
                "(EngineCore pid=9) INFO Compiling the drafter, step 1",
            ],
        }
    )
    assert [line.phase for line in state.logs["/l"].lines] == ["loading weights", "compiling drafter"]
    assert str(phase_of(state, "/l")) == "compiling drafter"
    state.apply({"t": "log", "path": "/l", "lines": ["(EngineCore pid=9) INFO init engine (profile) took 20.1 s"]})
    assert phase_of(state, "/l").name == "engine up"
    dog = Watchdog()
    assert dog.update(state, 1.0, "/l")[0].name == "engine up"  # the watchdog reads the same marks


def test_a_layout_with_phases_opens_in_snapshot(tmp_path, sim_state):
    """The layout's own phase, read from its log by a headless snapshot; no rank of its run is up
    (nothing runs `-m my.server`): watching, and the snapshot says so."""
    log = tmp_path / "server.log"
    log.write_text(
        "(EngineCore pid=9) INFO Loading safetensors checkpoint shards: 50% Completed | 1/2\n"
        "(EngineCore pid=9) INFO Compiling the drafter, step 1\n"
    )
    path = tmp_path / "phased.yaml"
    path.write_text(PHASED + f"log: {log}\n")
    res = run_cli("snapshot", "local", "--sim", str(sim_state), "--layout", str(path), "--json", "--wait", "0")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["phase"] == {"name": "compiling drafter", "detail": ""}, doc["phase"]
    assert doc["verdict"]["name"] == "watching" and doc["verdict"]["evidence"][0] == "no rank of the run seen yet", doc[
        "verdict"
    ]


def hang_layout(tmp_path, port: int) -> str:
    path = tmp_path / "hang.yaml"
    path.write_text(f"""\
name: hang
engine: sglang
command: [-m, cockpit.sim.server]
watch: ['*cockpit.sim.server*--sim-shm-dir {tmp_path}*']
log: {tmp_path}/server.log
ports: [{port}]
stall: {{idle_s: 600, spin_s: 8}}
""")
    return str(path)


def start_server(sim_state, tmp_path, port: int, *extra: str) -> subprocess.Popen:
    """A server started outside the cockpit, as an operator would have, before it looks."""
    argv = [
        sys.executable,
        "-m",
        "cockpit.sim.server",
        "--tp-size",
        "8",
        "--port",
        str(port),
        "--sim-speed",
        "4",
        "--sim-shm-dir",
        str(tmp_path),
        *extra,
    ]
    return subprocess.Popen(
        argv,
        stdout=open(tmp_path / "server.log", "w"),
        stderr=subprocess.STDOUT,
        env={**os.environ, "COCKPIT_SIM_STATE": str(sim_state)},
        start_new_session=True,
    )


def test_headless_snapshot_judges_a_hung_rank(sim_state, tmp_path):
    """`snapshot --json --wait` runs the monitor and fills the verdict: rank 3 spins in the
    sampler under traffic while the others wait in the collective."""
    port = free_port()
    server = start_server(sim_state, tmp_path, port, "--sim-hang-rank", "3", "--sim-traffic", "2")
    try:
        res = run_cli(
            "snapshot",
            "local",
            "--sim",
            str(sim_state),
            "--layout",
            hang_layout(tmp_path, port),
            "--json",
            "--wait",
            "25",
            timeout=120,
        )
        assert res.returncode == 0, res.stderr
        doc = json.loads(res.stdout)
        assert doc["verdict"]["name"] == "stalled-spinning", doc["verdict"]
        assert doc["verdict"]["odd_rank"] == 3
        assert doc["phase"]["name"] == "serving"
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


async def test_the_fleet_row_and_the_cockpit_opened_from_it_show_one_verdict(sim_state, tmp_path):
    """A stalled host: its fleet row and the cockpit opened from the row say the same verdict at
    once, because they read one monitor."""
    port = free_port()
    server = start_server(sim_state, tmp_path, port, "--sim-hang-rank", "3", "--sim-traffic", "2")
    layout = hang_layout(tmp_path, port)
    fleet = FleetMonitor(
        Fleet(hosts=[FleetHost(target="local", name="box", layout=layout)], interval=0.25),
        SessionOptions(python=sys.executable, sim_state=str(sim_state)),
    )
    app = FleetApp(fleet)
    try:
        async with app.run_test(size=(160, 40)) as pilot:
            member = fleet.members[0]
            await until(pilot, lambda: member.verdict.name == VerdictName.STALLED_SPINNING, 60)
            await pilot.pause(0.6)
            row = fleet.rows()[0]
            assert row.verdict == "stalled-spinning (rank 3)" and row.verdict in save_text(app, None)
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, CockpitScreen), 5)
            await until(pilot, lambda: "verdict stalled-spinning (rank 3)" in save_text(app, None), 5)
            assert app.screen.verdict is member.verdict
            await pilot.press("q")
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def test_a_json_snapshot_never_imports_textual(sim_state):
    """The headless path scripts call every few seconds stays light: no UI library is loaded."""
    code = (
        "import sys, io, contextlib\n"
        "from cockpit import cli\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    rc = cli.main(['snapshot', 'local', '--sim', {str(sim_state)!r}, '--json'])\n"
        "print(rc, sorted(m for m in sys.modules if m.split('.')[0] in ('textual', 'asyncssh')))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "0 []"


async def test_a_server_restarted_by_hand_into_another_log_is_followed_there(sim_state, tmp_path):
    """No layout, no ledger: a server started by hand (`server > a.log`), killed, started again
    into b.log. The monitor follows b.log once the new run is found, its phases and verdict come
    from it, and the old run's end is not a crash of the new one."""
    import asyncio

    from simhost import wait_for

    from cockpit.host.session import WatchList
    from cockpit.link.target import parse_target
    from cockpit.monitor.host import HostMonitor

    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "cockpit.sim.server",
        "--tp-size",
        "4",
        "--port",
        str(port),
        "--sim-speed",
        "4",
        "--sim-shm-dir",
        str(tmp_path),
    ]
    env = {**os.environ, "COCKPIT_SIM_STATE": str(sim_state)}

    def start_by_hand(log):
        return subprocess.Popen(argv, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)

    first, second = start_by_hand(tmp_path / "a.log"), None
    monitor = HostMonitor(
        parse_target("local"),
        SessionOptions(python=sys.executable, interval=0.25, sim_state=str(sim_state)),
        watch=WatchList(patterns=[f"*cockpit.sim.server*--sim-shm-dir {tmp_path}*"]),
        probe_every_s=0.25,
    )
    kept = None
    try:
        await wait_for(lambda: (tmp_path / "a.log").stat().st_size > 0, 20, "the first server's log")
        await monitor.open(kept=True)
        kept = asyncio.create_task(monitor.keep())
        await wait_for(lambda: list(monitor.state.logs) == [str(tmp_path / "a.log")], 20, "a.log followed")
        await wait_for(lambda: monitor.phase.name in ("ready", "serving"), 60, "the first run ready")
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
        await wait_for(lambda: monitor.verdict.name == "crashed", 10, "the kill seen")
        second = start_by_hand(tmp_path / "b.log")
        await wait_for(lambda: list(monitor.state.logs) == [str(tmp_path / "b.log")], 20, "b.log followed")
        await wait_for(
            lambda: monitor.phase.name in ("ready", "serving") and monitor.verdict.name == "ok",
            60,
            "the new run's phases, from b.log",
        )
        assert all(p.pgid == second.pid for p in monitor.state.ranks())
    finally:
        if kept is not None:
            kept.cancel()
        kill_groups(proc.pid for proc in (first, second) if proc is not None)
        await monitor.close()
