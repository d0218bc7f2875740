"""The first connection to a host over SSH, on the screen, against the real sshd: an unknown key
asked about as ssh asks (its type and SHA256 fingerprint; yes records it in the user's known_hosts
and connects, no quits with nothing recorded), a changed key refused with the whole message a key
away, `snapshot --text` refusing as `--json` does without looking first, and a host without GPUs
said so over the link, at 80x24 and 160x50."""

from __future__ import annotations

import subprocess
import sys

import asyncssh
import pytest
from conftest import run_cli
from simhost import until  # noqa: E402

from cockpit.cli import parse_args
from cockpit.cli.attach import build_monitor
from cockpit.ui.app import CockpitApp, save_text
from cockpit.ui.screens import ConfirmScreen, ReportScreen

SIZES = [(80, 24), (160, 50)]


def ssh_config(sshd, tmp_path, known) -> str:
    path = tmp_path / "ssh_config"
    path.write_text(
        "\n".join(
            [
                "Host newbox",
                "    HostName 127.0.0.1",
                f"    Port {sshd.port}",
                f"    User {sshd.user}",
                f"    IdentityFile {sshd.root}/client_key",
                "    IdentitiesOnly yes",
                f"    UserKnownHostsFile {known}",
                "    GlobalKnownHostsFile /dev/null",
            ]
        )
        + "\n"
    )
    return str(path)


def screen_app(cfg: str, ask: bool = True) -> CockpitApp:
    args = parse_args(["open", "newbox", "--ssh-config", cfg, "--python", sys.executable])
    return CockpitApp(monitor=build_monitor(args), ask_host_keys=ask)


def shown(app) -> str:
    return " ".join(save_text(app, None).replace("│", " ").split())


def dialog_text(app) -> str:
    """The words inside the dialog's border, as the screen shows them."""
    region = app.screen.query_one(".dialog").region
    rows = save_text(app, None).splitlines()[region.y + 1 : region.y + region.height - 1]
    return " ".join(" ".join(r[region.x + 1 : region.x + region.width - 1] for r in rows).split())


def dialog_drawn(app, kind) -> bool:
    """The screen is a `kind` dialog and it has been laid out (pushed is not yet drawn)."""
    return (
        isinstance(app.screen, kind)
        and bool(app.screen.query(".dialog"))
        and app.screen.query_one(".dialog").region.height > 0
    )


def ssh_keygen_fingerprint(sshd) -> tuple[str, str]:
    """What `ssh-keygen -lf` says of the server's key: (SHA256:..., ED25519)."""
    out = subprocess.run(
        ["ssh-keygen", "-lf", str(sshd.root / "host_key.pub")], capture_output=True, text=True, check=True
    ).stdout.split()
    return out[1], out[-1].strip("()")


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_an_unknown_key_is_asked_about_as_ssh_does_and_yes_records_it(sshd, tmp_path, size):
    known = tmp_path / "home" / ".ssh" / "known_hosts"
    app = screen_app(ssh_config(sshd, tmp_path, known))
    fingerprint, kind = ssh_keygen_fingerprint(sshd)
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: dialog_drawn(app, ConfirmScreen), 60)
        text = dialog_text(app)
        assert f"The authenticity of host 'newbox ([127.0.0.1]:{sshd.port})' can't be established." in text
        assert f"{kind} key fingerprint is {fingerprint}." in text, text
        assert "Are you sure you want to continue connecting? y yes · n no" in text
        assert f"yes records it in {known} (as ssh does)" in " ".join(app.screen.lines)
        assert not known.exists()
        await pilot.press("y")
        await until(pilot, lambda: app.state.link_state == "up" and app.state.seq > 0, 60)
        real = asyncssh.read_public_key(str(sshd.root / "host_key.pub"))
        alg, blob = real.export_public_key("openssh").decode().split()[:2]
        assert known.read_text() == f"[127.0.0.1]:{sshd.port} {alg} {blob}\n"
        assert (known.stat().st_mode & 0o777) == 0o600 and not app.error
        # a host without GPUs (this machine, over ssh) says so, never "connecting to ..."
        await until(pilot, lambda: "no GPUs on" in shown(app), 60)
        assert "connecting to" not in shown(app)


async def test_no_quits_and_records_nothing(sshd, tmp_path):
    known = tmp_path / "known_hosts"
    app = screen_app(ssh_config(sshd, tmp_path, known))
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), 60)
        await pilot.press("n")
        await until(pilot, lambda: not app.is_running, 30)
    assert app.cockpit.declined and "was not recorded" in app.cockpit.declined and not known.exists()


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_a_changed_key_is_refused_and_the_whole_message_is_a_key_away(sshd, tmp_path, size):
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], check=True)
    other = asyncssh.read_public_key(str(tmp_path / "other.pub"))
    known = tmp_path / "known_hosts"
    line = f"[127.0.0.1]:{sshd.port} {' '.join(other.export_public_key('openssh').decode().split()[:2])}\n"
    known.write_text(line)
    app = screen_app(ssh_config(sshd, tmp_path, known))
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: app.error is not None, 60)
        assert not isinstance(app.screen, ConfirmScreen) and "HOST KEY CHANGED" in app.error
        await until(pilot, lambda: "e: the whole reason" in shown(app), 30)
        await pilot.press("e")
        await until(pilot, lambda: dialog_drawn(app, ReportScreen), 30)
        body = " ".join(app.screen.lines[0].split())
        assert body == " ".join(app.error.split()) and f"ssh-keygen -f {known} -R" in body
        inside = dialog_text(app)
        assert "cannot connect to newbox" in inside and "HOST KEY CHANGED for newbox" in inside
        assert other.get_fingerprint()[:20] in inside.replace(" ", ""), inside  # wrapped, whole
    assert known.read_text() == line


@pytest.mark.parametrize("fmt", [["--json"], ["--text"], ["--text", "--wait", "300"], []])
def test_every_snapshot_refuses_an_unknown_key_at_once_without_looking(sshd, tmp_path, fmt):
    """`--text` renders the screen: a refused link ends it as `--json` ends, never after a look
    (`--wait 300` would be waited out otherwise)."""
    known = tmp_path / "known_hosts"
    cfg = ssh_config(sshd, tmp_path, known)
    res = run_cli("snapshot", "newbox", *fmt, "--ssh-config", cfg, timeout=120)
    assert res.returncode == 2, res.stdout[-2000:]
    assert "unknown host key for newbox (ED25519 key SHA256:" in res.stderr and "--accept-new" in res.stderr
    assert not known.exists() and "Traceback" not in res.stderr


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_in_a_real_terminal_the_question_is_whole_and_no_exits_1(sshd, tmp_path, size):
    """`cockpit newbox` in tmux at the operator's size: ssh's question on screen, whole; `n`
    quits with exit status 1 (declined) and records nothing."""
    import os
    import shutil
    import time

    tmux = shutil.which("tmux")
    assert tmux, "tmux is needed (apt-get install tmux)"
    known = tmp_path / "known_hosts"
    cfg = ssh_config(sshd, tmp_path, known)
    sock, rc = f"cockpit-test-{os.getpid()}-{size[0]}", tmp_path / "rc"
    script = tmp_path / "run.sh"
    script.write_text(
        f"#!/bin/sh\n{sys.executable} -m cockpit newbox --ssh-config {cfg} --python {sys.executable}\n"
        f"echo $? > {rc}\nsleep 600\n"
    )  # the screen is drawn on stderr: not redirected
    script.chmod(0o700)
    env = dict(os.environ, HOME=str(tmp_path), TERM="xterm-256color")
    subprocess.run(
        [tmux, "-L", sock, "new-session", "-d", "-x", str(size[0]), "-y", str(size[1]), str(script)],
        env=env,
        check=True,
    )
    try:

        def screen() -> str:
            return subprocess.run(
                [tmux, "-L", sock, "capture-pane", "-p", "-J"], capture_output=True, text=True, env=env
            ).stdout

        fingerprint, kind = ssh_keygen_fingerprint(sshd)
        deadline = time.monotonic() + 90
        while "continue connecting" not in screen():
            assert time.monotonic() < deadline, screen()
            time.sleep(0.3)
        shown = " ".join(screen().replace("│", " ").split())
        assert f"{kind} key fingerprint is" in shown and fingerprint[:30] in shown.replace(" ", ""), shown
        subprocess.run([tmux, "-L", sock, "send-keys", "n"], env=env, check=True)
        while not rc.exists() or not rc.read_text().strip():
            assert time.monotonic() < deadline + 30, screen()
            time.sleep(0.3)
        assert rc.read_text().strip() == "1"
        said = " ".join(screen().split())  # the screen gone, what the command said after it
        assert "declined: the host key of newbox (ED25519 SHA256:" in said and "was not recorded" in said, said
        assert not known.exists()
    finally:
        subprocess.run([tmux, "-L", sock, "kill-server"], env=env)
