"""Exit statuses as README "Exit status" says, on every path that asks: a plan declined (on a
terminal, through a pipe, or with stdin ended and no answer) is 1 with nothing done; a yes through
a pipe goes, as a terminal's would."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]


@pytest.fixture
def fake_run(tmp_path):
    """A process the layout's command names, in a process group of its own: the run to act on."""
    server = tmp_path / f"exit_status_server_{os.getpid()}_{tmp_path.name}.py"  # no other test's run matches
    server.write_text("import time\ntime.sleep(600)\n")
    run = subprocess.Popen([sys.executable, str(server)], start_new_session=True)
    layout = tmp_path / "fake.yaml"
    layout.write_text(f"command: [{server}]\n")
    env = dict(
        os.environ,
        HOME=str(tmp_path / "home"),
        XDG_STATE_HOME=str(tmp_path / "state"),
        XDG_CACHE_HOME=str(tmp_path / "cache"),
        XDG_RUNTIME_DIR=str(tmp_path),
    )
    yield run, layout, env
    if run.poll() is None:
        os.killpg(run.pid, signal.SIGKILL)
    run.wait()


def cockpit(env: dict, *args: str, stdin: str | None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cockpit", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        stdin=subprocess.DEVNULL if stdin is None else None,
    )


@pytest.mark.parametrize(
    "command, nothing",
    [
        (["launch"], "nothing was launched"),
        (["ablate", "--vary", "forensics"], "nothing was launched"),
        (["bisect", "--vary", "forensics"], "nothing was launched"),
        (["kill"], "nothing was signalled"),
    ],
)
@pytest.mark.parametrize("stdin", ["n\n", None], ids=["n-through-a-pipe", "stdin-ended"])
def test_a_plan_declined_without_a_terminal_exits_1_and_does_nothing(fake_run, command, nothing, stdin):
    run, layout, env = fake_run
    res = cockpit(env, command[0], "local", "--layout", str(layout), *command[1:], stdin=stdin)
    assert res.returncode == 1, res.stderr[-2000:]
    assert f"declined: {nothing}" in res.stderr and "[y/N]" in res.stderr
    assert ("no answer on stdin" in res.stderr) == (stdin is None)
    assert run.poll() is None  # the run untouched
    ledger = Path(env["XDG_STATE_HOME"]) / "gpu-cockpit" / "ledger"
    assert not any(p.read_text().strip() for p in ledger.glob("*.jsonl"))  # nothing launched, nothing recorded


def test_a_pipe_left_open_and_silent_is_no_answer(fake_run, tmp_path):
    """A script's stdin that never says anything (a pipe kept open) declines after
    PIPE_ANSWER_S, never hangs the command."""
    from cockpit.cli.base import PIPE_ANSWER_S

    run, layout, env = fake_run
    err = tmp_path / "stderr"
    proc = subprocess.Popen(
        [sys.executable, "-m", "cockpit", "kill", "local", "--layout", str(layout)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=open(err, "w"),
        env=env,
    )
    try:
        assert proc.wait(timeout=PIPE_ANSWER_S + 110) == 1  # a bound for a hung command, not a speed claim
    finally:
        proc.stdin.close()
        if proc.poll() is None:
            proc.kill()
    said = err.read_text()
    assert "no answer on stdin" in said and "declined: nothing was signalled" in said and run.poll() is None


def test_yes_through_a_pipe_is_the_answer_a_terminal_would_give(fake_run):
    run, layout, env = fake_run
    res = cockpit(env, "kill", "local", "--layout", str(layout), stdin="y\n")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "verified" in res.stdout
    run.wait(30)  # gone: the kill verified it


def test_a_shm_clean_declined_exits_1_and_removes_nothing(fake_run, tmp_path):
    _, _, env = fake_run
    folder = tmp_path / "shm"
    folder.mkdir()
    (folder / "nccl-x").write_bytes(b"x")
    res = cockpit(env, "shm", "local", "--dir", str(folder), "--clean", "--yes-other-dir", stdin="n\n")
    assert res.returncode == 1 and "declined: nothing was removed" in res.stderr, res.stderr
    assert (folder / "nccl-x").exists()
    res = cockpit(env, "shm", "local", "--dir", str(folder), stdin=None)  # an audit asks nothing
    assert res.returncode == 0 and "nccl-x" in res.stdout


def test_the_readme_table_names_commands_that_exist_and_the_codes_the_code_returns():
    from cockpit.cli import COMMANDS
    from cockpit.operate.relaunch import exit_status
    from cockpit.runs.bisect import EXIT

    readme = (REPO / "README.md").read_text()
    table = readme.split("| command | exit status |", 1)[1].split("\n\n", 1)[0]
    rows = {
        cmd: text
        for cmds, text in re.findall(r"^\| (.*?) \| (.*?) \|$", table, re.M)
        if cmds != "---"
        for cmd in re.findall(r"`(\w+)`", cmds)
    }
    assert set(rows) <= set(COMMANDS) and {"kill", "flightrec", "launch", "ablate", "explain"} <= set(rows)
    for outcome, code in (("stalled-idle", 4), ("crashed", 5), ("timeout", 6), ("ready", 0)):
        assert exit_status([outcome]) == code and f"{code} " in rows["launch"]
    joined = " ".join(readme.split())
    assert "Exit status, every command: 0 done; 1 declined at the prompt, nothing done; 2 bad input" in joined
    assert set(EXIT.values()) <= {
        int(n) for n in re.findall(r"(\d+) [a-z(]", joined.split("Exit status of `cockpit bisect`:")[1].split(".")[0])
    }


def test_flightrec_on_a_run_without_the_recorder_armed_exits_3(fake_run):
    run, layout, env = fake_run
    res = cockpit(env, "flightrec", "local", "--layout", str(layout), stdin=None)
    assert res.returncode == 3, res.stderr[-2000:]
    assert "no rank has the flight recorder armed" in res.stdout and run.poll() is None


@pytest.mark.parametrize(
    "command", [["-m", "no_such_module_of_this_test"], ["-c", "import os; os.kill(os.getpid(), 9)"]]
)
def test_a_launch_that_fails_at_once_is_a_crash_said_at_once_not_a_timeout(tmp_path, command):
    """The launched process ends with a failure status before any process of the run is seen (a
    module not found, killed at once): the launch's outcome is `crashed` (exit 5) with that status and
    the log's last line, long before its --timeout, never `still 'no run'`."""
    layout = tmp_path / "bad.yaml"
    layout.write_text(
        f"name: bad\npython: {sys.executable}\ncommand: {command!r}\nlog_dir: {tmp_path / 'runs'}\n".replace("'", '"')
    )
    env = dict(os.environ, HOME=str(tmp_path / "home"), XDG_STATE_HOME=str(tmp_path / "state"))
    res = cockpit(env, "launch", "local", "--layout", str(layout), "--yes", "--timeout", "600", stdin=None)
    assert res.returncode == 5, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    at = next((n for n, line in enumerate(lines) if re.match(r"bad-\S+: crashed$", line)), None)
    assert at is not None, lines
    said = lines[at - 1 :]
    if command[0] == "-m":
        assert said[2].strip().endswith("ended with exit status 1 before any process of the run was seen"), said
        assert said[3].strip() == f"log: {sys.executable}: No module named no_such_module_of_this_test", said
    else:
        assert said[2].strip().endswith("ended with killed by signal 9 before any process of the run was seen"), said
