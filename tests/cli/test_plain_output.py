"""What a person reads without asking for a format: `snapshot` with none prints the screen as
text (the terminal's size on a terminal, 160x50 through a pipe; a fleet's one document is JSON),
and the runs to choose from are listed one per line."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

from conftest import run_cli

REPLAY = str(Path(__file__).parents[1] / "fixtures" / "demo-serving.json")


def test_snapshot_without_a_format_through_a_pipe_is_the_text_at_160x50():
    res = run_cli("snapshot", "--replay", REPLAY)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.rstrip("\n").splitlines()
    assert len(lines) == 50 and max(len(line) for line in lines) == 160
    assert "verdict ok" in lines[0] and "phase serving" in lines[0]
    assert res.stdout == run_cli("snapshot", "--replay", REPLAY, "--text", "--size", "160x50").stdout


def test_snapshot_without_a_format_on_a_terminal_is_the_text_at_the_terminals_size():
    pid, fd = pty.fork()
    if pid == 0:
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 20, 90, 0, 0))  # 90 columns, 20 rows
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
        os.execve(sys.executable, [sys.executable, "-m", "cockpit", "snapshot", "--replay", REPLAY], env)
    out, deadline = b"", time.monotonic() + 60
    while time.monotonic() < deadline:
        if select.select([fd], [], [], 0.5)[0]:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
    else:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0, out[-2000:]
    lines = out.decode().rstrip("\r\n").split("\r\n")
    assert len(lines) == 19 and max(len(line) for line in lines) == 90, lines  # a row left for the prompt
    assert "verdict ok" in lines[0]


def test_a_fleet_snapshot_without_a_format_is_its_one_json_document():
    import json

    res = run_cli("snapshot", "--hosts", "nosuchhost.invalid", "--timeout", "5")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert [h["reachable"] for h in doc["hosts"]] == [False]


def test_two_runs_to_choose_from_are_listed_one_per_line(tmp_path):
    server = tmp_path / f"two_runs_server_{os.getpid()}_{tmp_path.name}.py"
    server.write_text("import time\ntime.sleep(600)\n")
    runs = [subprocess.Popen([sys.executable, str(server)], start_new_session=True) for _ in range(2)]
    layout = tmp_path / "two.yaml"
    layout.write_text(f"command: [{server}]\n")
    try:
        res = run_cli(
            "kill",
            "local",
            "--layout",
            str(layout),
            "--yes",
            env={"HOME": str(tmp_path / "home"), "XDG_STATE_HOME": str(tmp_path / "state")},
        )
        assert res.returncode == 2, res.stderr
        first, *listed = res.stderr.rstrip("\n").splitlines()
        assert first.startswith(
            "cockpit: 2 runs found on local, not merged: choose one: `cockpit kill local --pid ROOT`"
        )
        assert len(listed) == 2 and all(line.startswith(f"  [{n}] pid ") for n, line in enumerate(listed, 1))
        assert {str(r.pid) for r in runs} == {line.split()[2] for line in listed}
        assert all(len(line) < 300 for line in listed) and all(r.poll() is None for r in runs)
    finally:
        for r in runs:
            os.killpg(r.pid, signal.SIGKILL)
            r.wait()
