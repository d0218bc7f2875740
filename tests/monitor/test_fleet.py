"""The fleet: many hosts through the real sshd, one down and one that never answers; the file's
errors; the table, its sort and filter, and a host's cockpit opened from it and left again."""

import json
import re
import socket
import sys
import textwrap
import threading
import time
from types import SimpleNamespace

import pytest
from conftest import free_port, run_cli
from simhost import until

from cockpit.host.session import SessionOptions
from cockpit.host.state import Gpu
from cockpit.judge.verdict import Verdict, VerdictName
from cockpit.monitor import fleet as fleet_monitor
from cockpit.monitor.fleet import FleetHost, FleetMonitor, Member, Row, parse_fleet
from cockpit.runs.config import LayoutError
from cockpit.ui import fleet as fleet_ui
from cockpit.ui.app import save_text
from cockpit.ui.cockpit import CockpitScreen
from cockpit.ui.fleet import COLUMNS, FleetApp, FleetScreen, FleetTable, HeapSettler


class Blackhole:
    """A TCP port that accepts connections and never says a word: a host that hangs in sshd."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)

    def close(self):
        self.sock.close()
        for c in self.held:
            c.close()


@pytest.fixture
def fleet_hosts(sshd, tmp_path, sim_state, ranks):
    """Aliases `cockpit-test` (the real sshd, a simulated 8-GPU host with a rank on GPU 2),
    `fleet-down` (a closed port) and `fleet-slow` (a port that never answers)."""
    title = f"sglang::scheduler_TP0_fleet{free_port()}"  # this test's rank alone: its layout watches this title
    ranks.spawn(title, gpu=2, mib=7000)
    (tmp_path / "a.yaml").write_text(
        f"name: fleet-a\nengine: sglang\ncommand: [-m, no.such.server]\nwatch: ['{title}']\n"
    )
    hole = Blackhole()
    config = tmp_path / "ssh_config"
    config.write_text(
        sshd.client_config.read_text()
        + textwrap.dedent(f"""\
        Host fleet-down
            HostName 127.0.0.1
            Port {free_port()}
            User {sshd.user}
        Host fleet-slow
            HostName 127.0.0.1
            Port {hole.port}
            User {sshd.user}
        """)
    )
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        textwrap.dedent(f"""\
        defaults:
          python: {sys.executable}
          sim: {sim_state}
        hosts:
          - fleet-slow
          - fleet-down
          - target: cockpit-test
            name: gpu-a
            layout: {tmp_path / "a.yaml"}
        """)
    )
    yield fleet, config, sshd
    hole.close()


async def test_a_fleet_snapshot_is_not_delayed_by_a_down_or_hung_host(fleet_hosts):
    """The fleet snapshot (what `snapshot --fleet --json` prints) returns at its timeout, on this
    process's own clock, with the live host judged, the down host's error and the hung host still
    in its handshake."""
    fleet, config, sshd = fleet_hosts
    watch = FleetMonitor(
        fleet_monitor.load_fleet(str(fleet)),
        SessionOptions(python=sys.executable, ssh_config=str(config), known_hosts=str(sshd.known_hosts)),
    )
    start = time.monotonic()
    doc = await fleet_monitor.take_fleet_snapshot(watch, timeout=6)
    took = time.monotonic() - start
    assert doc["schema"] == "gpu-cockpit.fleet/1"
    hosts = {h["name"]: h for h in doc["hosts"]}
    assert list(hosts) == ["fleet-slow", "fleet-down", "gpu-a"]
    a = hosts["gpu-a"]
    assert a["reachable"] and a["link"] == "up" and a["error"] is None
    gpus = a["snapshot"]["gpus"]
    assert len(gpus) == 8 and gpus[2]["mem_used_mib"] == 7512
    # its layout watches this test's rank alone: computing on its GPU, not yet serving
    assert (a["verdict"]["name"], a["verdict"]["odd_rank"], a["phase"]) == ("ok", None, "starting"), a
    assert [re.sub(r"\d+", "N", e) for e in a["verdict"]["evidence"]] == ["GPUs computing: N at N % or more, up to N W"]
    down = hosts["fleet-down"]
    assert not down["reachable"] and down["snapshot"] is None and "refused" in down["error"].lower()
    slow = hosts["fleet-slow"]
    assert not slow["reachable"] and slow["link"] == "connecting"  # still in the handshake when time was up
    assert 6 <= took < 6 + 4, took  # waited out the hung host's timeout, not longer (closing the links: the rest)


def test_hosts_on_the_command_line_make_the_same_fleet(fleet_hosts, sim_state):
    _, config, sshd = fleet_hosts
    out = run_cli(
        "snapshot",
        "--hosts",
        "cockpit-test,fleet-down",
        "--json",
        "--timeout",
        "10",
        "--python",
        sys.executable,
        "--sim",
        str(sim_state),
        "--ssh-config",
        str(config),
        "--known-hosts",
        str(sshd.known_hosts),
    )
    assert out.returncode == 0, out.stderr
    hosts = json.loads(out.stdout)["hosts"]
    assert [h["name"] for h in hosts] == ["cockpit-test", "fleet-down"]
    assert hosts[0]["reachable"] and hosts[0]["snapshot"]["gpus"][2]["mem_used_mib"] == 7512
    assert not hosts[1]["reachable"]
    twice = run_cli("snapshot", "--hosts", "a,a", "--json")
    assert twice.returncode == 2 and twice.stderr.strip() == "cockpit: --hosts: a host is listed twice"


def test_fleet_file_errors_name_file_line_and_fix(tmp_path):
    cases = {
        "hosts:\n  - a\n  - tagret: b\n": ":3: unknown key 'tagret' in a host: did you mean 'target'?",
        "defaults:\n  python: /x\n": ":1: missing hosts",
        "hosts: []\n": ":1: hosts is empty",
        "hosts:\n  - a\n  - a\n": ":3: host 'a' is listed twice (first at line 2)",
        "hosts:\n  - 'user@'\n": ":2: ",
        "hosts: [a]\nconcurrency: lots\n": ":2: concurrency must be a whole number",
        "hosts:\n  - name: x\n": ":2: each host needs target:",
        "hosts: [a\n": "invalid YAML",
    }
    for text, expected in cases.items():
        with pytest.raises(LayoutError) as err:
            parse_fleet(text, "f.yaml")
        assert str(err.value).startswith("f.yaml:") and expected in str(err.value), (text, str(err.value))
        assert "\n" not in str(err.value)
    path = tmp_path / "bad.yaml"
    path.write_text("hosts:\n  - a\n  - tagret: b\n")
    out = run_cli("fleet", str(path))
    assert out.returncode == 2 and out.stderr.startswith(f"cockpit: {path}:3: unknown key 'tagret'")
    assert "Traceback" not in out.stderr


async def test_fleet_screen_sorts_filters_and_opens_a_hosts_cockpit(fleet_hosts):
    fleet, config, sshd = fleet_hosts
    watch = FleetMonitor(
        parse_fleet(fleet.read_text(), str(fleet)),
        SessionOptions(ssh_config=str(config), known_hosts=str(sshd.known_hosts)),
    )
    app = FleetApp(watch)
    async with app.run_test(size=(160, 40)) as pilot:
        screen = app.screen
        assert isinstance(screen, FleetScreen)
        a = watch.members[2]
        await until(pilot, lambda: a.state.seq > 1 and "gpu-a" in save_text(app, None), 20)
        down = watch.members[1]
        await until(pilot, lambda: "connection refused" in (down.session.link_error or "").lower(), 10)
        await until(pilot, lambda: "down, retrying" in save_text(app, None), 5)
        text = save_text(app, None)
        assert "3 hosts" in text and "1 up" in text and "2 not up" in text and "8 GPUs" in text
        assert "fleet-slow" in text and "connecting" in text  # the hung host holds up no one
        names = [r.name for r in screen.shown]
        assert names[-1] == "gpu-a"  # sorted by problems: the hosts that are not up come first
        for size in ((80, 24), (100, 30), (160, 40)):  # the columns share the width by what they hold
            await pilot.resize_terminal(*size)
            await pilot.pause(0.5)
            lines = save_text(app, None).splitlines()
            head = next(line for line in lines if "util/GPU" in line)
            assert all(name in head.split() for name in COLUMNS), (size, head)
            row = next(line for line in lines if line.split()[:1] == ["gpu-a"])
            shown = next(r for r in screen.shown if r.name == "gpu-a")
            # gpu-a judges every sglang:: process of this machine (the default patterns), so its
            # verdict may be long ("crashed (rank 1)"): on a narrow screen its column gives way,
            # never below its least width; on a wide one the phase and the verdict are whole
            for name, text in (("phase", shown.phase), ("verdict", shown.verdict)):
                start = head.index(f" {name} ") + 1
                cell = row[start : head.index(f" {COLUMNS[COLUMNS.index(name) + 1]} ") + 1]
                assert len(cell) >= fleet_ui.LEAST[name] and cell == text[: len(cell) - 1].ljust(len(cell)), (
                    size,
                    name,
                    text,
                    row,
                )
                assert size[0] < 160 or cell.rstrip() == text, (size, name, text, row)
        await pilot.resize_terminal(160, 40)
        await pilot.press("question_mark")
        await until(pilot, lambda: "sort: problems first, name" in save_text(app, None), 3)
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is screen, 3)
        await pilot.press("o")
        assert screen.sort == "util" and [r.name for r in screen.shown][0] == "gpu-a"
        await pilot.press("slash")
        await pilot.press(*"gpu", "enter")
        await until(pilot, lambda: [r.name for r in screen.shown] == ["gpu-a"], 3)
        assert "filter: gpu (1 shown)" in save_text(app, None)
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, CockpitScreen), 3)
        cockpit = app.screen
        assert cockpit.monitor is a.monitor  # the fleet's own monitor and connection, not a second one
        assert cockpit.verdict is a.verdict
        await until(
            pilot, lambda: "GPU2" in save_text(app, None) and "sglang::scheduler_TP0" in save_text(app, None), 10
        )
        await until(pilot, lambda: "esc Fleet" in save_text(app, None), 3)
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is screen, 3)
        assert a.monitor._listeners == [] and a.state.link_state == "up"  # the host is still watched
        await pilot.press("q")


async def test_connections_open_concurrently_behind_the_limit(tmp_path):
    """Four hosts that never answer, a limit of two: two are connecting, two wait their turn, and
    none of the waiting ones is blocked by anything but the limit."""
    import asyncio

    holes = [Blackhole() for _ in range(4)]
    config = tmp_path / "ssh_config"
    config.write_text("".join(f"Host hole{i}\n  HostName 127.0.0.1\n  Port {h.port}\n" for i, h in enumerate(holes)))
    fleet = parse_fleet("concurrency: 2\nhosts: [hole0, hole1, hole2, hole3]\n", "f.yaml")
    (tmp_path / "known_hosts").write_text("")
    watch = FleetMonitor(fleet, SessionOptions(ssh_config=str(config), known_hosts=str(tmp_path / "known_hosts")))
    watch.start()
    try:
        for _ in range(100):
            await asyncio.sleep(0.05)
            if sum(len(h.held) for h in holes) >= 2:
                break
        await asyncio.sleep(0.5)
        states = sorted(m.state.link_state for m in watch.members)
        assert states == ["connecting", "connecting", "waiting", "waiting"]
        assert sum(len(h.held) for h in holes) == 2  # two TCP connections made, not four
    finally:
        await watch.close()
        for h in holes:
            h.close()


class StillFleet:
    """A fleet whose rows are set by the test: no host, no connection."""

    def __init__(self, n: int):
        self.members = [None] * n
        self.row_list = [
            Row(
                name=f"host{i:02d}",
                link="up",
                error=None,
                rtt_ms=1.0,
                age_s=0.1,
                gpus=[(0, 0, 98304)] * 8,
                phase="serving",
                verdict="ok",
            )
            for i in range(n)
        ]

    def start(self):
        pass

    async def close(self):
        pass

    def rows(self) -> list[Row]:
        return [Row(**vars(r)) for r in self.row_list]  # new objects, as the monitor makes them


async def test_a_fleet_redraw_repaints_only_the_rows_that_changed(monkeypatch):
    """Redraws over unchanged hosts build no row's cells and repaint no line; a host whose GPU
    moved repaints its own line alone, and the screen shows it."""
    painted, built = [], []
    real_line, real_cells = FleetTable.render_line, FleetTable._cells
    monkeypatch.setattr(FleetTable, "render_line", lambda self, y: painted.append(y) or real_line(self, y))
    monkeypatch.setattr(FleetTable, "_cells", staticmethod(lambda r: built.append(r.name) or real_cells(r)))
    watch = StillFleet(12)
    app = FleetApp(watch)
    async with app.run_test(size=(160, 30)) as pilot:
        screen = app.screen
        await until(pilot, lambda: "12 up" in save_text(app, None), 5)
        for _ in range(50):  # the screen settles: the table gets its size, the footer its width
            painted.clear()
            screen.redraw()
            await pilot.pause(0.1)
            if not painted:
                break
        built.clear()
        for _ in range(3):
            screen.redraw()
            await pilot.pause()
        assert painted == [] and built == []
        watch.row_list[4].gpus = [(100, 0, 98304)] + [(0, 0, 98304)] * 7
        screen.redraw()
        await pilot.pause()
        line = 1 + [r.name for r in screen.shown].index("host04")
        assert set(painted) == {line} and built == ["host04"]
        assert "█▁▁▁▁▁▁▁" in save_text(app, None)


def test_a_hosts_alerts_are_read_again_only_when_its_sample_or_verdict_changed(monkeypatch):
    """The table asks for the rows twice a second and a host samples once: a row's alerts are
    read from the host's state again only for a new sample or a new verdict, and say what they say."""
    reads = []
    real = fleet_monitor.alerts_of
    monkeypatch.setattr(fleet_monitor, "alerts_of", lambda s, v: reads.append(s.seq) or real(s, v))
    member = Member(FleetHost(target="local", name="gpu-a"), SessionOptions())
    s = member.state
    s.seq, s.sample_ts, s.gpus = 1, 1000.0, {0: Gpu(index=0, temp_c=60)}
    assert member.row().alerts == [] and member.row().alerts == []
    assert reads == [1]
    s.seq, s.sample_ts, s.gpus[0].temp_c = 2, 1001.0, 90
    assert member.row().alerts == ["GPU0 90°C"] and reads == [1, 2]
    member.monitor.verdict = Verdict(VerdictName.CRASHED, ["rank 3 exited with 1"])
    assert member.row().alerts == ["rank 3 exited with 1", "GPU0 90°C"] and reads == [1, 2, 2]


def test_the_heap_is_settled_again_as_late_hosts_come_up(monkeypatch):
    """The heap is frozen once at the start, again once an eighth of the fleet more came up, and a
    last time when no host is left to wait for (a host that failed its first try is not waited for);
    not for each host that trickles in."""
    settled = []
    monkeypatch.setattr(fleet_ui, "settle_heap", lambda: settled.append(1))
    members = [SimpleNamespace(state=SimpleNamespace(seq=0), tried=threading.Event()) for _ in range(16)]
    settler = HeapSettler(SimpleNamespace(members=members))
    members[0].state.seq = 5
    assert settler() and len(settled) == 1
    members[1].state.seq = 1
    assert settler() and len(settled) == 1  # one more host: an eighth of 16 is two
    members[2].state.seq = 1
    assert settler() and len(settled) == 2
    for m in members[3:15]:
        m.state.seq = 1
    members[15].tried.set()  # down: not waited for
    assert not settler() and len(settled) == 3
    assert not settler() and len(settled) == 3
