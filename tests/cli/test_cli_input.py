"""Bad command lines: one line naming what is wrong and the fix, exit status 2, never a traceback;
a subcommand's own usage on an argument it does not take; output paths checked before any work;
`serve` on a port in use says so before printing a URL. What a command imports: its family's
module of cockpit/cli/ alone, and a family that cannot be imported is still one line."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
from conftest import run_cli, unprivileged

REPLAY = "tests/fixtures/demo-serving.json"


def one_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr
    return lines[0]


@pytest.mark.parametrize(
    "args, expect",
    [
        (
            ["--svg", "/nonexistent/dir/x.svg"],
            "--svg /nonexistent/dir/x.svg: the folder /nonexistent/dir does not exist",
        ),
        (["--text", "/nonexistent/x.txt"], "--text /nonexistent/x.txt: the folder /nonexistent does not exist"),
        (["--svg", "/tmp"], "--svg /tmp: is a folder"),
    ],
)
def test_an_output_path_that_cannot_be_written_is_one_line(args, expect):
    result = run_cli("snapshot", "--replay", REPLAY, *args)
    assert result.returncode == 2
    assert expect in one_line(result)


def test_an_output_file_in_a_read_only_folder(tmp_path):
    """Refused before any work, in one line; as root (CI is), the command runs without root's
    privilege to write into any folder, as a user runs it."""
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        result = run_cli("snapshot", "--replay", REPLAY, "--svg", str(folder / "x.svg"), under=unprivileged())
    finally:
        folder.chmod(0o700)
    assert result.returncode == 2
    assert one_line(result) == f"cockpit: --svg {folder / 'x.svg'}: not writable by you: choose another path"
    assert list(folder.iterdir()) == []


def test_text_to_stdout_ends_with_a_newline():
    result = run_cli("snapshot", "--replay", REPLAY, "--text", "--size", "80x24")
    assert result.returncode == 0 and result.stdout.endswith("\n") and not result.stdout.endswith("\n\n\n")


@pytest.mark.parametrize(
    "args, expect",
    [
        (["snapshot", "demo", "--json", "--wait", "-5"], "cockpit snapshot: --wait -5: must be at least 0 seconds"),
        (["snapshot", "demo", "--json", "--interval", "0"], "cockpit snapshot: --interval 0: must be more than 0"),
        (["snapshot", "demo", "--json", "--interval", "-1"], "cockpit snapshot: --interval -1: must be more than 0"),
        (["kill", "demo", "--wait", "-1"], "--wait -1: must be at least 0"),
        (["launch", "demo", "--on", "eagle3", "--off", "eagle3"], "a flag set cannot be both on and off"),
    ],
)
def test_bad_values_are_refused_in_one_line(args, expect):
    result = run_cli(*args)
    assert result.returncode == 2
    assert expect in one_line(result)


@pytest.mark.parametrize(
    "args, usage",
    [
        (["runs", "--layout", "demo", "--bogus"], "usage: cockpit runs"),
        (["explain", "x.log", "--bogus"], "usage: cockpit explain"),
        (["kill", "demo", "--no-such-flag"], "usage: cockpit kill"),
    ],
)
def test_a_subcommand_error_shows_that_subcommands_usage(args, usage):
    result = run_cli(*args)
    assert result.returncode == 2
    assert result.stderr.startswith(usage) and "unrecognized arguments" in result.stderr
    assert "{open,demo" not in result.stderr  # not the top level's usage


def test_options_the_readme_promises_are_taken(tmp_path):
    assert (
        run_cli("runs", "--layout", "demo", "--read-only", "--json", env={"XDG_STATE_HOME": str(tmp_path)}).returncode
        == 0
    )
    log = tmp_path / "x.log"
    log.write_text("")
    result = run_cli("explain", str(log), "--read-only")
    assert result.returncode == 0 and "verdict: none: the log is empty" in result.stdout
    assert "--json" in run_cli("launch", "--help").stdout
    assert "the layout whose runs to list" in run_cli("runs", "--help").stdout


def test_serve_on_a_port_in_use_says_so_before_any_url():
    pytest.importorskip("textual_serve")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli("serve", "demo", "--port", str(port), timeout=30)
    assert result.returncode == 2
    line = one_line(result)
    assert f"port {port} on 127.0.0.1 is already in use" in line and "--port N" in line
    assert "Serving" not in result.stdout and "token" not in result.stdout


def test_serve_without_its_extra_names_the_command_for_a_checkout(tmp_path):
    """Without textual-serve: the message names the install command that works here."""
    blocker = tmp_path / "textual_serve"
    blocker.mkdir()
    (blocker / "__init__.py").write_text("raise ImportError('blocked for the test')\n")
    code = (
        f"import sys; sys.path.insert(0, {str(tmp_path)!r}); from cockpit.cli import main; "
        f"sys.exit(main(['serve', 'demo']))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    line = one_line(result)
    assert "serve" in line and (
        ".venv/bin/pip install -e '.[serve]'" in line or "pip install 'gpu-cockpit[serve]'" in line
    )


def test_the_readme_names_exactly_the_commands_that_take_json_and_read_only():
    import re
    from pathlib import Path

    from cockpit.cli import COMMANDS, build_parser

    parser = build_parser()
    takes = {name: {o for a in parser.subcommands[name]._actions for o in a.option_strings} for name in COMMANDS}
    readme = " ".join(Path(__file__).parents[2].joinpath("README.md").read_text().split())
    assert "Every command takes `--read-only`" in readme
    assert all("--read-only" in opts for opts in takes.values())
    said = re.search(
        r"`--json` \(JSON instead of a plain table\) is taken by (.*?); the screens \((.*?)\) have none", readme
    )
    assert said, "the README's sentence on --json"
    with_json = set(re.findall(r"`(\w+)`", said.group(1)))
    screens = set(re.findall(r"`(\w+)`", said.group(2)))
    assert with_json == {name for name, opts in takes.items() if "--json" in opts}
    assert screens == set(COMMANDS) - with_json


def test_the_schema_doc_says_how_long_a_snapshot_looks():
    from pathlib import Path

    from cockpit.agent.main import FIRST_WINDOW_S

    doc = " ".join((Path(__file__).parents[2] / "docs" / "snapshot-schema.md").read_text().split())
    assert f"`FIRST_WINDOW_S` = {FIRST_WINDOW_S:g} s" in doc and f"at least {FIRST_WINDOW_S:g} s) and GPUs" in doc
    assert "FIRST_GAP_S" not in doc
    assert "about two seconds" not in doc and "at least two ticks" not in doc
    assert "unknown: no connection" in doc


def _kill_at_a_terminal(tmp_path, keys: bytes) -> tuple[int, str]:
    """`cockpit kill` of a run on a terminal (a pty), `keys` typed at its [y/N]: its exit status
    and what it printed, the run checked alive after."""
    import pty
    import select
    import signal
    import time

    server = tmp_path / "fake_server.py"
    server.write_text("import time\ntime.sleep(600)\n")
    run = subprocess.Popen([sys.executable, str(server)], start_new_session=True)
    layout = tmp_path / "fake.yaml"
    layout.write_text(f"command: [{server}]\n")
    try:
        pid, fd = pty.fork()
        if pid == 0:
            os.execv(sys.executable, [sys.executable, "-m", "cockpit", "kill", "local", "--layout", str(layout)])
        out, deadline = b"", time.monotonic() + 60
        while b"[y/N]" not in out and time.monotonic() < deadline:
            if select.select([fd], [], [], 0.5)[0]:
                try:
                    out += os.read(fd, 4096)
                except OSError:
                    break
        assert b"[y/N]" in out, out.decode(errors="replace")[-2000:]
        os.write(fd, keys)  # the terminal turns Ctrl+C into SIGINT for the foreground process
        asked = time.monotonic()
        while time.monotonic() - asked < 20:  # a bound for a stuck command, not a speed claim
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.05)
        else:
            os.kill(pid, signal.SIGKILL)
            raise AssertionError(f"the command did not end after {keys!r} at the prompt")
        while select.select([fd], [], [], 0)[0]:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        os.close(fd)
        assert run.poll() is None  # nothing was killed
        return os.waitstatus_to_exitcode(status), out.decode(errors="replace")
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()


def test_ctrl_c_at_the_kill_prompt_ends_the_command_at_once_and_kills_nothing(tmp_path):
    """`cockpit kill` asks [y/N] on a terminal; Ctrl+C there ends it at once (exit 130), with
    the run untouched: the prompt is not waiting for Enter first, whichever of the command's
    threads the kernel hands the signal to."""
    rc, _ = _kill_at_a_terminal(tmp_path, b"\x03")
    assert rc == 130


def test_no_at_the_kill_prompt_signals_nothing(tmp_path):
    rc, out = _kill_at_a_terminal(tmp_path, b"n\n")
    assert rc == 1 and "nothing was signalled" in out


def test_a_mistyped_command_is_named_with_the_one_meant():
    res = run_cli("snpashot", "demo", "--json")
    assert res.returncode == 2 and res.stderr == "cockpit: unknown command 'snpashot': did you mean 'snapshot'?\n"
    res = run_cli("frobnicate", "demo")
    assert res.returncode == 2 and res.stderr.startswith("cockpit: unknown command 'frobnicate': one of ")


def _imported_by(tmp_path, *argv: str, under: tuple[str, ...] = ("cockpit.cli",)) -> tuple[int, list[str], str]:
    """`cockpit ARGV` in a fresh interpreter: its exit status, the modules it imported of the
    packages `under` (cockpit/cli/), and its stdout."""
    code = (
        "import sys\nfrom cockpit.cli import main\n"
        "try:\n    rc = main(sys.argv[1:])\nexcept SystemExit as exc:\n    rc = exc.code\n"
        "sys.stdout.flush()\n"
        f"print(rc, *sorted(m for m in sys.modules if m.startswith({under!r})), file=sys.stderr)\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code, *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, XDG_STATE_HOME=str(tmp_path)),
        stdin=subprocess.DEVNULL,
    )
    rc, *modules = res.stderr.strip().splitlines()[-1].split()
    return int(rc), modules, res.stdout


def test_a_command_imports_its_family_module_alone_and_the_top_help_none(tmp_path):
    from cockpit.cli import COMMANDS

    rc, modules, out = _imported_by(tmp_path, "runs", "--layout", "demo", "--read-only", "--json")
    assert (rc, modules, out) == (0, ["cockpit.cli", "cockpit.cli.base", "cockpit.cli.offline"], "[]\n")
    rc, modules, _ = _imported_by(tmp_path, "kill", "local", "--read-only")  # refused before any host is asked
    assert (rc, modules) == (2, ["cockpit.cli", "cockpit.cli.act", "cockpit.cli.attach", "cockpit.cli.base"])
    rc, modules, out = _imported_by(tmp_path, "--version")
    assert (rc, modules) == (0, ["cockpit.cli", "cockpit.cli.base"]) and out.startswith("gpu-cockpit ")
    # `serve` builds no monitor (each browser session runs its own cockpit): its family imports
    # neither the monitors nor the exporter; refused here before anything is served
    rc, modules, _ = _imported_by(
        tmp_path, "serve", "--port", "0", under=("cockpit.cli", "cockpit.monitor", "cockpit.exporter")
    )
    assert (rc, modules) == (2, ["cockpit.cli", "cockpit.cli.base", "cockpit.cli.serve"])
    rc, modules, out = _imported_by(tmp_path, "--help")
    assert (rc, modules) == (0, ["cockpit.cli", "cockpit.cli.base"])
    listed = " ".join(out.split())
    assert all(f"{name} {' '.join(text.split())}" in listed for name, (_family, text) in COMMANDS.items())


def test_each_command_is_registered_by_the_family_that_names_it_and_no_other():
    import importlib
    import pkgutil

    import cockpit.cli
    from cockpit.cli import COMMANDS
    from cockpit.cli.base import REGISTERED

    for module in pkgutil.iter_modules(cockpit.cli.__path__):
        importlib.import_module(f"cockpit.cli.{module.name}")
    assert {name: cmd.handler.__module__ for name, cmd in REGISTERED.items()} == {
        name: f"cockpit.cli.{family}" for name, (family, _help) in COMMANDS.items()
    }


def test_a_family_that_cannot_be_imported_is_one_line_not_a_traceback(tmp_path):
    """A broken install (here Textual made unimportable) fails the command that needs it in one
    line, exit status 1, as any bug does; a command of another family still runs."""
    blocker = tmp_path / "textual"
    blocker.mkdir()
    (blocker / "__init__.py").write_text("raise ImportError('blocked for the test')\n")
    code = (
        f"import sys; sys.path.insert(0, {str(tmp_path)!r}); from cockpit.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    env = dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"))
    broken = subprocess.run(
        [sys.executable, "-c", code, "open", "local"], capture_output=True, text=True, timeout=60, env=env
    )
    assert broken.returncode == 1 and broken.stdout == ""
    assert broken.stderr == (
        "cockpit: internal error: ImportError: blocked for the test (rerun with COCKPIT_DEBUG=1 for the traceback)\n"
    )
    other = subprocess.run(
        [sys.executable, "-c", code, "runs", "--layout", "demo", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert (other.returncode, other.stdout) == (0, "[]\n"), other.stderr
