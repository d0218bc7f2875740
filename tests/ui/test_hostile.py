"""Hostile host text, everywhere the cockpit shows it (issue 17): a process title, a log line, a
/dev/shm name, a driver string, a fleet host's name and its link error holding Rich/Textual markup
(`[/x]` would raise MarkupError, `[@click=app.quit]` would be an action) and terminal escape
sequences (OSC 52 writes the clipboard, `ESC [ 2J` clears the screen, a carriage return hides
what came before it). Real processes titled so, a real log, the real CLI and the live app with its
notifications, dialogs and the fleet screen: nothing crashes, everything is shown as text with its
control characters visible (`^[`, `^M`), and no escape byte reaches what a terminal would get."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from simhost import until

from cockpit.common.hosttext import as_text, escape_markup, visible
from cockpit.sim import fakenvml

EVIL = "[/x] [@click=app.quit] \x1b]52;c;aGFjaw==\x07 \x1b[2J \rHIDDEN"
TOKEN = f"hostile{os.getpid()}"
# A rank with a hostile tail (rank 0), a rank whose role itself is hostile (`[/x]^[[2j`, rank 1,
# the one that dies), the title as the issue gives it (no rank: a watched process) and a process
# with no rank whose role is hostile (the GPU pane names it by its role). One on each GPU.
TITLES = [
    f"sglang::scheduler_TP0_{TOKEN} {EVIL}",
    f"sglang::[/x]\x1b[2J_{TOKEN}_TP1",
    f"sglang::scheduler_TP0 {EVIL} {TOKEN}",
    f"sglang::[/x]\x1b]52;c;aGFjaw==\x07 {TOKEN}",
]
STRAY = f"hostile-stray {TOKEN} \x1b[2J [/x] [@click=app.quit]"  # a second run: K is ambiguous
DYING = 1
FAILURE = "[2026-01-01 00:00:09 TP1] Scheduler hit an exception: \x1b[2J [/x] boom \x1b]52;c;aGFjaw==\x07"
LOG_LINES = [
    "[2026-01-01 00:00:00 TP0] Load weight begin. \x1b]52;c;aGFjaw==\x07 \x1b[2J",
    "[2026-01-01 00:00:01 TP0] [@click=app.quit] click me [/red] \rHIDDEN",
    "[2026-01-01 00:00:02 TP1] [/x] a closing tag alone \x1b[31mred\x1b[0m \x9b2J",
]

RANK = textwrap.dedent("""\
    import os, signal, sys, time, setproctitle
    from cockpit.sim import fakenvml
    title, gpu, state, log, last = sys.argv[1:6]
    setproctitle.setproctitle(title)
    if int(gpu) >= 0:
        fakenvml.register(state, os.getpid(), int(gpu), 7000, "busy")

    def die(*_):
        with open(log, "a") as fh:
            fh.write(last + "\\n")
        os._exit(1)

    signal.signal(signal.SIGUSR1, die)
    print("ready", flush=True)
    while True:
        time.sleep(1)
    """)

LAUNCHER = textwrap.dedent("""\
    import subprocess, sys, time, setproctitle
    token, state, log, rank, last = sys.argv[1:6]
    setproctitle.setproctitle("hostile-launcher " + token + " \\x1b[2J [/x]")
    kids = []
    for gpu, title in enumerate(sys.argv[6:]):
        p = subprocess.Popen([sys.executable, "-c", rank, title, str(gpu), state, log, last], stdout=subprocess.PIPE,
                             text=True)
        assert p.stdout.readline().strip() == "ready"
        kids.append(p)
    print(" ".join(str(p.pid) for p in kids), flush=True)
    time.sleep(600)  # the dying rank stays a zombie: its death is seen
    """)


def clean(out: str | bytes, where: str) -> None:
    """What would reach a terminal (or a browser): no escape byte, no carriage return, no C1 CSI."""
    if isinstance(out, bytes):
        out = out.decode("utf-8", "surrogateescape")
    for bad in ("\x1b", "\r", "\x07", "\x9b"):
        at = out.find(bad)
        assert at < 0, f"{where}: {bad!r} at {at}: {out[max(0, at - 80) : at + 40]!r}"


class HostileRun:
    """A launcher with three titled ranks on the simulated GPUs, one log, one /dev/shm entry."""

    def __init__(self, tmp: Path, sim: Path):
        self.sim, self.log = sim, tmp / "run.log"
        self.log.write_text("".join(line + "\n" for line in LOG_LINES))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", LAUNCHER, TOKEN, str(sim), str(self.log), RANK, FAILURE, *TITLES],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.pids = [int(p) for p in self.proc.stdout.readline().split()]
        assert len(self.pids) == len(TITLES), self.pids
        self.stray = subprocess.Popen(
            [sys.executable, "-c", RANK, STRAY, "-1", str(sim), str(self.log), FAILURE],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        assert self.stray.stdout.readline().strip() == "ready"
        self.shm = Path("/dev/shm") / f"nccl-{TOKEN}-\x1b[2J\rHIDDEN[/x]"
        try:
            self.shm.write_bytes(b"x" * 4096)
        except OSError:
            self.shm = None

    def kill_rank(self, index: int) -> None:
        os.kill(self.pids[index], signal.SIGUSR1)

    def stop_stray(self) -> None:
        if self.stray.poll() is None:
            os.killpg(self.stray.pid, signal.SIGKILL)
        self.stray.wait(10)

    def stop(self) -> None:
        self.stop_stray()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)
        if self.shm is not None:
            self.shm.unlink(missing_ok=True)


@pytest.fixture
def hostile(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    sim = tmp_path / "sim"
    fakenvml.write_host(str(sim), gpus=4, model="h200", seed=3, driver="580.95 " + EVIL)
    host = json.loads((sim / "host.json").read_text())
    (sim / "host.json").write_text(json.dumps(dict(host, name="NVIDIA H200 [/x] \x1b[2J")))  # the board's name
    run = HostileRun(tmp_path, sim)
    yield run
    run.stop()


# ----------------------------------------------------------------------------- the rule itself


def test_visible_is_idempotent_so_text_shown_twice_is_not_escaped_twice():
    for s in [EVIL, *TITLES, *LOG_LINES, FAILURE, "C:\\path\\x1b and \\r literally", "^[ already", "\x00\x7f\x85"]:
        once = visible(s)
        assert visible(once) == once
        assert visible(once, newlines=True) == once
        assert as_text(once).plain == once
    assert visible("a\\b") == "a\\b"  # a backslash is printable: kept as it is, never doubled


def test_textual_markup_is_not_rich_markup_so_widgets_get_text_objects():
    """escape_markup is Rich's escape: Textual's own markup reads its backslashes differently, so
    anything Textual parses (notifications, titles, DataTable cells given as str) gets a Text or
    markup=False instead."""
    from textual.content import Content

    assert Content.from_markup(escape_markup("end\\")).plain != "end\\"
    assert as_text("end\\ [/x] [@click=app.quit]").plain == "end\\ [/x] [@click=app.quit]"


# ----------------------------------------------------------------------------- the CLI


def test_snapshot_text_and_svg_show_hostile_titles_and_log_lines_visibly(hostile, tmp_path):
    layout = tmp_path / "hostile.yaml"
    layout.write_text(
        textwrap.dedent(f"""\
        name: hostile-layout
        engine: sglang
        command: [-m, nothing.to.run]
        log: {hostile.log}
        watch: ["*{TOKEN}*"]
        """)
    )
    svg = tmp_path / "screen.svg"
    env = dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"))
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "cockpit",
            "snapshot",
            "local",
            "--layout",
            str(layout),
            "--sim",
            str(hostile.sim),
            "--python",
            sys.executable,
            "--interval",
            "0.25",
            "--wait",
            "1.5",
            "--size",
            "220x50",
            "--text",
            "--svg",
            str(svg),
        ],
        capture_output=True,
        env=env,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr.decode(errors="replace")
    out = res.stdout.decode()
    clean(res.stdout, "--text")
    clean(res.stderr, "stderr")
    assert "^[" in out and "^M" in out
    assert "└ sglang::[/x]^[[2J_hostile" in out and "[/x]^[[2j" in out  # a rank's title, the role read from it
    assert "[@click=app.quit] click me [/red] ^MHIDDEN" in out  # the log line
    assert "driver 580.95 [/x]" in out
    data = svg.read_bytes()
    clean(data, "--svg")
    assert b"^[" in data and b"HIDDEN" in data


# ----------------------------------------------------------------------------- the live screen


def _screen(app) -> tuple[str, str]:
    from cockpit.ui.app import save_text

    text, svg = save_text(app, None), app.export_screenshot()
    clean(text, "the screen")
    clean(svg, "the SVG")
    return text, svg


def _dialog(app) -> str:
    """The text of every Static of the dialog on top, the part scrolled out of view included (a
    busy /dev/shm lists more entries than fit)."""
    from rich.text import Text
    from textual.widgets import Static

    parts = [w.content for w in app.screen.query(Static)]
    assert all(isinstance(p, Text) for p in parts if p), parts  # text, never a markup string
    return "\n".join(p.plain for p in parts if isinstance(p, Text))


def _has_click_meta(text) -> bool:
    from rich.style import Style
    from rich.text import Text

    if not isinstance(text, Text):
        return "@click" in str(text)
    styles = [text.style] + [span.style for span in text.spans]
    return any("@click" in str(s) or (isinstance(s, Style) and s.meta) for s in styles)


async def test_live_screen_notifications_and_dialogs_with_hostile_host_text(hostile):
    from cockpit.host.session import SessionOptions, WatchList
    from cockpit.link.target import parse_target
    from cockpit.monitor.host import HostMonitor
    from cockpit.runs.config import Layout
    from cockpit.runs.spec import default_spec
    from cockpit.ui.app import CockpitApp
    from cockpit.ui.ranks import RankTable
    from cockpit.ui.screens import ConfirmScreen, RelaunchScreen, ReportScreen

    monitor = HostMonitor(
        parse_target("local"),
        SessionOptions(python=sys.executable, interval=0.25, sim_state=str(hostile.sim)),
        watch=WatchList(patterns=[f"*{TOKEN}*"], logs=[str(hostile.log)]),
    )
    app = CockpitApp(monitor=monitor)
    async with app.run_test(size=(220, 50), notifications=True) as pilot:
        state = app.state
        await until(pilot, lambda: all(pid in state.procs and state.procs[pid].alive for pid in hostile.pids), 90)
        await until(pilot, lambda: sum(len(log.lines) for log in state.logs.values()) >= len(LOG_LINES), 60)
        await until(pilot, lambda: "click me" in _screen(app)[0] and "^[[2j" in _screen(app)[0], 30)
        await until(pilot, lambda: "GPU0 H200 [/x] ^[[2J" in _screen(app)[0], 30)  # the panes follow on the next tick
        text, _ = _screen(app)
        assert "└ sglang::[/x]^[[2J_hostile" in text  # the title, its markup shown as text
        assert "[/x]^[[2j" in text  # the role read from a hostile title, in the rank table and the GPU pane
        assert "[@click=app.quit] click me [/red] ^MHIDDEN" in text
        assert "driver 580.95 [/x] [@click=app.quit] ^[]52" in text
        assert "GPU0 H200 [/x] ^[[2J" in text  # the pane's title
        assert "[/x]^[]52;c;agfjaw==^G" in text  # a process without a rank, named by its role in the GPU pane

        # No cell of the rank table carries an action; clicking every row's title quits nothing.
        table = app.query_one(RankTable)
        for row in range(table.row_count):
            assert not any(_has_click_meta(cell) for cell in table.get_row_at(row)), table.get_row_at(row)
            await pilot.click(RankTable, offset=(8, row + 2))  # below the border and the header
        await pilot.pause(0.3)
        assert app.is_running and app.return_code is None

        # A note from the host and a search term with markup: notification and the log's subtitle.
        state.notes.append(f"note from the host: {EVIL}")
        await until(pilot, lambda: any("note from the host" in n.message for n in app._notifications), 20)
        note = next(n for n in app._notifications if "note from the host" in n.message)
        assert note.message == "note from the host: " + visible(EVIL) and not note.markup
        await until(pilot, lambda: "note from the host: [/x] [@click=app.quit]" in _screen(app)[0], 10)
        assert "^[]52;c;aGFjaw==^G ^[[2J ^MHIDDEN" in _screen(app)[0]  # the toast, as text
        await pilot.press("slash", *"[/x]", "enter")
        await until(pilot, lambda: app.cockpit.view.search == "[/x]", 10)
        await until(pilot, lambda: "/[/x]" in _screen(app)[0], 10)
        assert "a closing tag alone" in _screen(app)[0]
        await pilot.press("slash", "ctrl+u", "enter")
        await until(pilot, lambda: app.cockpit.view.search is None, 10)

        # The rank dies after its hostile failure line: crashed, a notification, the evidence in the header.
        hostile.kill_rank(DYING)
        await until(pilot, lambda: app.cockpit.verdict.name == "crashed", 90)
        await until(pilot, lambda: any(n.message.startswith("crashed") for n in app._notifications), 20)
        await until(pilot, lambda: "boom" in _screen(app)[0], 20)
        text, _ = _screen(app)
        assert "Scheduler hit an exception: ^[[2J [/x] boom" in text
        assert any("boom" in line for line in app.cockpit.verdict.evidence)

        # K with two runs on screen: refused as ambiguous, the candidates' titles in the header.
        await pilot.press("K")
        await until(pilot, lambda: app.cockpit.actions.outcome is not None, 60)
        await until(pilot, lambda: "kill the run: failed: 2 runs found" in _screen(app)[0], 20)
        assert "kill the run failed" in " ".join(n.message for n in app._notifications)
        assert not any(_has_click_meta(line) for line in [app.cockpit.actions.outcome])
        hostile.stop_stray()
        await until(pilot, lambda: not state.procs[hostile.stray.pid].alive, 30)

        # K: the kill plan names every process, titles shown; n cancels.
        await pilot.press("K")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), 60)
        await until(pilot, lambda: "SIGTERM" in _screen(app)[0], 20)
        text, _ = _screen(app)
        assert f"hostile-launcher {TOKEN} ^[[2J [/x]" in text and f"{TOKEN} [/x] [@click=app.quit] ^[]52" in text
        await pilot.press("n")
        await until(pilot, lambda: app.screen is app.cockpit and app.cockpit.busy is None, 20)
        assert all(state.procs[pid].alive for n, pid in enumerate(hostile.pids) if n != DYING)

        # s: the /dev/shm report lists the hostile name visibly; c offers to clean it; n keeps it.
        if hostile.shm is not None:
            await pilot.press("s")
            await until(pilot, lambda: isinstance(app.screen, ReportScreen), 60)
            await until(pilot, lambda: f"nccl-{TOKEN}-^[[2J^MHIDDEN[/x]" in _dialog(app), 20)
            _screen(app)
            assert "c" in app.screen.keys, "an nccl- entry held by no process is removable"
            await pilot.press("c")
            await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), 20)
            await until(pilot, lambda: f"rm nccl-{TOKEN}-^[[2J^MHIDDEN[/x]" in _dialog(app), 20)  # the CLI's words
            _screen(app)
            await pilot.press("n")
            await until(pilot, lambda: app.screen is app.cockpit and app.cockpit.busy is None, 20)
            assert hostile.shm.exists()

        # The relaunch dialog: a layout's flag sets and the interpreter found on the host, as text.
        layout = Layout(
            path="x.yaml",
            name="evil [/x] \x1b[2J",
            command=["-m", "srv\x1b]52;c;aGFjaw==\x07"],
            flag_sets={"eagle[/x]\x1b[2J": ["--x", "[@click=app.quit]\x1b[2J"]},
            enabled=["eagle[/x]\x1b[2J"],
        )
        app.push_screen(RelaunchScreen(layout, default_spec(layout), "/opt/py\rHIDDEN [/red]", []))
        await until(pilot, lambda: isinstance(app.screen, RelaunchScreen), 10)
        await until(pilot, lambda: "srv^[]52;c;aGFjaw==^G" in _screen(app)[0], 10)
        text, _ = _screen(app)
        assert "relaunch: evil [/x] ^[[2J" in text and "eagle[/x]^[[2J" in text and "/opt/py^MHIDDEN [/red]" in text
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is app.cockpit, 10)

        _screen(app)
        assert app.is_running and app.return_code is None
        await pilot.press("q")


# ----------------------------------------------------------------------------- the fleet


async def test_fleet_screen_with_a_hostile_host_name_and_link_error(tmp_path):
    from cockpit.host.session import SessionOptions
    from cockpit.monitor.fleet import FleetMonitor, parse_fleet
    from cockpit.ui.cockpit import CockpitScreen
    from cockpit.ui.fleet import FleetApp, FleetScreen

    fleet = parse_fleet(
        textwrap.dedent("""\
        hosts:
          - target: local
            name: "evil \\e[2J [/x] [@click=app.quit] \\e]52;c;aGFjaw==\\a \\rHIDDEN"
            python: "/nonexistent/py \\e[2J [/red]"
        """),
        "fleet.yaml",
    )
    assert "\x1b" in fleet.hosts[0].name
    watch = FleetMonitor(fleet, SessionOptions())
    app = FleetApp(watch)
    async with app.run_test(size=(200, 30), notifications=True) as pilot:
        screen = app.screen
        assert isinstance(screen, FleetScreen)
        await until(pilot, lambda: "not found on this machine" in (watch.members[0].session.link_error or ""), 60)
        await until(pilot, lambda: "/nonexistent/py ^[[2J [/red]" in _screen(app)[0], 20)
        text, _ = _screen(app)
        assert "evil ^[[2J [/x]" in text  # the host column: 18 wide
        await pilot.press("slash", *"[/x]", "enter")
        await until(pilot, lambda: screen.filter == "[/x]", 10)
        await until(pilot, lambda: "filter: [/x] (1 shown)" in _screen(app)[0], 10)
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, CockpitScreen), 10)
        await until(pilot, lambda: "/nonexistent/py ^[[2J [/red]" in _screen(app)[0], 20)
        assert "evil ^[[2J [/x] [@click=app.quit]" in _screen(app)[0]
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is screen, 10)
        _screen(app)
        assert app.is_running
        await pilot.press("q")


def test_the_plain_cli_shows_host_text_never_acts_on_it(tmp_path):
    """`cockpit explain` prints the log's own lines as evidence: no escape sequence, bell or carriage
    return of theirs reaches the terminal, in the text output as in the JSON; the line is still there."""
    log = tmp_path / "server.log"
    log.write_bytes(
        b"[2026-11-30 10:00:01 TP1] Scheduler hit an exception: \x1b]52;c;aGFjaw==\x07 \x1b[2J [/x]\r boom\n"
        b"RuntimeError: CUDA error: an illegal memory access was encountered\n"
    )
    for extra in ([], ["--json"]):
        res = subprocess.run(
            [sys.executable, "-m", "cockpit", "explain", str(log), *extra], capture_output=True, timeout=60
        )
        assert res.returncode == 0, res.stderr
        assert b"\x1b" not in res.stdout and b"\r" not in res.stdout and b"\x07" not in res.stdout
        assert b"[/x]" in res.stdout and b"boom" in res.stdout  # the line is there, as text
