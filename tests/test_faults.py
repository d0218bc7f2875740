"""Faults: the link to the host drops (the real sshd killed with its connections) and comes back;
the cockpit says so, keeps the data with its age, reconnects on its own and re-sends the agent."""

import os
import subprocess
import sys

import pytest

from cockpit.link.target import parse_target
from cockpit.session import HostSession, SessionOptions, Watch
from cockpit.ui.app import CockpitApp, save_text
from conftest import SSHD, Sshd


async def until(pilot, predicate, timeout):
    for _ in range(int(timeout / 0.05)):
        if predicate():
            return True
        await pilot.pause(0.05)
    raise AssertionError("timed out")


def kill_sshd_and_its_connections(server: Sshd) -> None:
    subprocess.run(["pkill", "-KILL", "-P", str(server.proc.pid)])
    server.proc.kill()
    server.proc.wait()


@pytest.mark.skipif(not os.path.exists(SSHD), reason="sshd is not installed")
async def test_link_loss_is_said_then_the_cockpit_reconnects_on_its_own(tmp_path, sim_state, ranks):
    rank = ranks.spawn("sglang::scheduler_TP0", gpu=0, mib=5000)
    server = Sshd(tmp_path)
    server.start()
    try:
        session = HostSession(parse_target("cockpit-test"),
                              SessionOptions(python=sys.executable, interval=0.5, sim_state=str(sim_state),
                                             ssh_config=str(server.client_config), known_hosts=str(server.known_hosts)),
                              Watch(patterns=["sglang::*"]))
        app = CockpitApp(session=session)
        async with app.run_test(size=(160, 50)) as pilot:
            await until(pilot, lambda: app.state.seq > 1 and rank.pid in app.state.procs, 20)
            first_agent = app.state.agent.pid
            kill_sshd_and_its_connections(server)
            await until(pilot, lambda: app.state.link_state.startswith("lost"), 1.0)  # two refresh intervals
            await pilot.pause(0.3)
            text = save_text(app, None)
            assert "link lost, retrying (1)" in text
            assert "GPU0" in text and app.state.gpus[0].mem_used_mib == 5512  # the data stays, with its age
            assert app.screen.has_class("stale")
            assert not app.check_action("kill_run", ())  # no action over a dead link
            await pilot.pause(2.5)
            assert app.state.link_state.startswith("lost, retrying (")  # still trying: sshd is down
            server.start()
            await until(pilot, lambda: app.state.link_state == "up", 30)
            await until(pilot, lambda: app.state.seq > 0 and app.state.agent.pid != first_agent, 10)
            await until(pilot, lambda: app.state.procs[rank.pid].alive and app.state.gpus[0].mem_used_mib == 5512, 10)
            await until(pilot, lambda: "link lost" not in save_text(app, None) and not app.screen.has_class("stale"), 3)
            await pilot.press("q")
    finally:
        server.stop()
