"""Stacks over SSH from the screen, against the real sshd, with no py-spy on the host's PATH nor
beside the agent's interpreter: `d` offers this cockpit's py-spy (what is copied where), asked
once per host; yes uploads it and dumps, and the next `d` asks nothing; no is remembered, and the
bundle (`b`) then says its stacks are missing instead of asking again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import free_port
from simhost import until  # noqa: E402

from cockpit.actions import dumps
from cockpit.cli import parse_args
from cockpit.cli.attach import build_monitor
from cockpit.ui import actions as ui_actions
from cockpit.ui.app import CockpitApp, save_text
from cockpit.ui.screens import ConfirmScreen, ReportScreen

SIZES = [(80, 24), (160, 50)]


@pytest.fixture
def remote(sim_state, tmp_path, sshd, monkeypatch):
    """A simulated server of 2 ranks on this machine, reached over ssh by an interpreter with no
    py-spy beside it; the upload's destination inside the test's folder."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setattr(ui_actions, "UPLOADS", {})
    dest = tmp_path / "host-cache" / "py-spy"
    monkeypatch.setattr(dumps, "upload_dest", lambda session: str(dest))
    port = free_port()
    log = tmp_path / "run.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "cockpit.sim.server", "--tp-size", "2", "--port", str(port), "--sim-speed", "4"],
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
        env=dict(os.environ, COCKPIT_SIM_STATE=str(sim_state)),
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while "ready to roll" not in log.read_text():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.2)
    bare = tmp_path / "bare" / "bin"
    bare.mkdir(parents=True)
    (bare / "python3").symlink_to(sys.executable)
    layout = tmp_path / "l.yaml"
    layout.write_text(f"command: [-m, cockpit.sim.server]\nports: [{port}]\nwatch: ['*--port {port}*']\n")
    args = parse_args(
        [
            "open",
            "cockpit-test",
            "--python",
            str(bare / "python3"),
            "--sim",
            str(sim_state),
            "--layout",
            str(layout),
            *sshd.cli_args(),
        ]
    )
    try:
        yield (lambda: CockpitApp(monitor=build_monitor(args), ask_host_keys=True)), dest
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def dialog_text(app) -> str:
    region = app.screen.query_one(".dialog").region
    rows = save_text(app, None).splitlines()[region.y + 1 : region.y + region.height - 1]
    return " ".join(" ".join(r[region.x + 1 : region.x + region.width - 1] for r in rows).split())


async def ready_to_dump(app, pilot) -> None:
    await until(pilot, lambda: app.cockpit.check_action("dump", ()) and len(app.state.ranks()) >= 2, 90)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_d_offers_the_upload_once_and_yes_uploads_then_dumps(remote, size):
    make, dest = remote
    app = make()
    ours = dumps.pyspy_info(dumps.local_pyspy())
    async with app.run_test(size=size) as pilot:
        await ready_to_dump(app, pilot)
        await pilot.press("d")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), 60)
        said = " ".join(app.screen.lines)
        assert app.screen.title_text == "py-spy is not on cockpit-test"
        assert (
            f"copied: {ours['path']} (py-spy {ours['version']}, {ours['size']} bytes, sha256 {ours['sha256']})" in said
        )
        assert f"to: cockpit-test:{dest} (mode 700)" in said and "asked once for cockpit-test" in said
        assert "Upload py-spy, then dump the stacks? y yes · n no" in dialog_text(app)
        assert not dest.exists()
        await pilot.press("y")
        await until(pilot, lambda: isinstance(app.screen, ReportScreen), 90)
        assert app.screen.title_text == "stacks of 2 ranks", app.screen.title_text
        assert dest.read_bytes() == ours["data"] and (dest.stat().st_mode & 0o777) == 0o700
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, ReportScreen), 30)
        await pilot.press("d")  # the upload is found now: nothing asked
        await until(pilot, lambda: isinstance(app.screen, (ReportScreen, ConfirmScreen)), 90)
        assert isinstance(app.screen, ReportScreen) and app.screen.title_text == "stacks of 2 ranks"


async def test_no_is_remembered_for_the_host_and_the_bundle_says_its_stacks_are_missing(remote):
    make, dest = remote
    app = make()
    async with app.run_test(size=(80, 24)) as pilot:
        await ready_to_dump(app, pilot)
        await pilot.press("d")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), 60)
        await pilot.press("n")
        await until(pilot, lambda: app.cockpit.actions.outcome is not None and not app.cockpit.busy, 60)
        failed = app.cockpit.actions.outcome.plain
        assert "stack dump: failed: py-spy is not installed on cockpit-test (looked for:" in failed
        assert ui_actions.UPLOADS == {"cockpit-test": False}
        await pilot.press("d")  # asked once: refused at once this time
        await until(pilot, lambda: not app.cockpit.busy, 60)
        assert not isinstance(app.screen, ConfirmScreen)
        await pilot.press("b")
        await until(pilot, lambda: isinstance(app.screen, (ReportScreen, ConfirmScreen)), 120)
        assert isinstance(app.screen, ReportScreen) and app.screen.title_text == "hang bundle"
        assert "py-spy is not installed on cockpit-test" in " ".join(app.screen.lines)
    assert not dest.exists()
