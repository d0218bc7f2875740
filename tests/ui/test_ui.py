"""The cockpit screen: Pilot tests against a live simulated host, and SVG snapshots of the demo's
recorded states (loading weights, the EAGLE-3 deadlock, serving)."""

import json
import re
from pathlib import Path

import pytest
from conftest import free_port, run_cli
from fixtures_shared import sim_monitor
from rich.console import Console
from rich.text import Text
from simhost import until

from cockpit.host.snapshot import state_from_doc
from cockpit.monitor import demo
from cockpit.runs.layoutfile import parse_layout
from cockpit.runs.layouts import resolve_layout
from cockpit.ui import cockpit as cockpit_screen
from cockpit.ui.app import CockpitApp, save_text
from cockpit.ui.fmt import bar
from cockpit.ui.gpus import GpuPane, _segments
from cockpit.ui.logview import LogView
from cockpit.ui.ports import PortsTable
from cockpit.ui.ranks import RankTable
from cockpit.ui.screens import HelpScreen

FIXTURES = Path(__file__).parents[1] / "fixtures"


async def test_live_screen_shows_gpus_ranks_ports_and_log_and_navigates(live_app):
    app, port = live_app
    async with app.run_test(size=(160, 50)) as pilot:
        await until(pilot, lambda: any("ready to roll" in log.text() for log in app.state.logs.values()))
        await until(
            pilot,
            lambda: any(
                k[1] == "/health" and v.get("status") == 200 for k, v in app.query_one(PortsTable).probes.items()
            ),
        )
        await pilot.pause(0.6)
        panes = list(app.query(GpuPane))
        assert [p.index for p in panes] == list(range(8))
        text = save_text(app, None)
        assert "GPU7 RTX PRO 6000" in text and "TP3" in text and "n/a" not in text
        table = app.query_one(RankTable)
        rows = [(p.pid, p.title, p.alive) for _, p in app.state.tree()]
        print(rows)
        assert table.row_count == 11, rows
        assert sum("sglang::scheduler_TP" in line for line in text.splitlines()) == 8
        ports = app.query_one(PortsTable)
        assert str(port) in text and "listen" in text
        assert "phase serving" in text or "phase ready" in text
        log = app.query_one(LogView)
        assert len(log.visible_lines()) > 10

        # tab moves between panes
        assert app.focused is table
        await pilot.press("tab")
        assert app.focused is ports
        await pilot.press("tab")
        assert app.focused is log
        await pilot.press("shift+tab", "shift+tab")
        assert app.focused is table

        # enter collapses the launcher's subtree
        await pilot.press("home", "enter")
        await pilot.pause(0.3)
        assert table.row_count == 1
        await pilot.press("enter")
        await pilot.pause(0.3)
        assert table.row_count == 11

        # / searches the log; an empty search clears it
        await pilot.press("slash")
        await pilot.press(*"Load weight end")
        await pilot.press("enter")
        await pilot.pause(0.2)
        assert log.search == "Load weight end"
        assert 1 <= len(log.visible_lines()) <= 8  # one line per rank at most
        await pilot.press("slash", "ctrl+u", "enter")
        await pilot.pause(0.2)
        assert log.search is None and len(log.visible_lines()) > 10

        # t filters one rank's lines, cycling through the ranks back to all
        await pilot.press("t")
        assert log.rank == 0
        lines = log.visible_lines()
        assert lines and all(" TP0]" in line for line in lines)
        for _ in range(8):
            await pilot.press("t")
        assert log.rank is None

        # f toggles follow
        await pilot.press("f")
        assert log.auto_scroll is False and "paused" in log.border_subtitle
        await pilot.press("f")
        assert log.auto_scroll is True

        # ? shows help, escape closes it
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)

        keys = ("Quit", "Help", "Relaunch", "Stacks", "Kill run", "Shm", "Runs", "Zoom", "Find", "Rank", "Follow")
        await until(pilot, lambda: all(k in save_text(app, None).splitlines()[-1] for k in keys), 5)
        await pilot.press("q")
    assert app.return_code == 0 or app.return_code is None


def replay(name: str) -> CockpitApp:
    doc = json.loads((FIXTURES / f"demo-{name}.json").read_text())
    return CockpitApp(state=state_from_doc(doc), layout=resolve_layout("demo"))


@pytest.mark.parametrize("name", ["loading", "eagle3-deadlock", "serving"])
def test_demo_states_snapshot(snap_compare, name):
    assert snap_compare(replay(name), terminal_size=(160, 50))


def test_serving_at_100x30_snapshot(snap_compare):
    assert snap_compare(replay("serving"), terminal_size=(100, 30))


def test_eagle3_deadlock_at_80x24_snapshot(snap_compare):
    assert snap_compare(replay("eagle3-deadlock"), terminal_size=(80, 24))


@pytest.mark.parametrize("size", [(80, 24), (100, 30), (160, 50)], ids=lambda s: f"{s[0]}x{s[1]}")
async def test_the_stalls_whole_evidence_in_the_svg(size):
    """`e` on the stalled demo, saved as SVG: every evidence line is in the picture, wrapped whole
    (the SVG's rows read back as text)."""
    import html

    app = replay("eagle3-deadlock")
    async with app.run_test(size=size) as pilot:
        await pilot.press("e")
        await pilot.pause(0.3)
        svg = app.export_screenshot()
        evidence = app.cockpit.verdict.evidence
    rows: dict[float, list] = {}
    for m in re.finditer(r'<text class="[^"]*" x="([\d.]+)" y="([\d.]+)"[^>]*>(.*?)</text>', svg, re.S):
        rows.setdefault(float(m.group(2)), []).append((float(m.group(1)), html.unescape(m.group(3))))
    shown = " ".join(
        " ".join("".join(s for _, s in sorted(v)).replace("\xa0", " ").split()) for _, v in sorted(rows.items())
    )
    assert "why: stalled-idle" in shown
    for line in evidence:
        assert " ".join(line.split()) in shown, (size, line)


async def test_panes_show_what_each_state_means():
    app = replay("eagle3-deadlock")
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.pause()
        text = save_text(app, None)
    assert "phase capturing draft cuda graphs" in text
    assert text.count("  0%") >= 8  # every GPU idle...
    assert text.count("82G/96G") == 8  # ...with the model resident


async def test_a_gpu_pane_whose_data_did_not_change_is_not_rendered_again(monkeypatch):
    """Samples that change nothing a pane shows draw no line again and lay nothing out; a sample
    that moves one GPU's utilization draws that pane's changed lines alone, and the screen shows it."""
    renders = {}
    real = GpuPane._strip

    def counted(self, line, width):
        renders[self.index] = renders.get(self.index, 0) + 1
        return real(self, line, width)

    monkeypatch.setattr(GpuPane, "_strip", counted)
    app = replay("serving")
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.pause()
        screen = app.screen
        await pilot.pause(0.3)
        before = dict(renders)
        assert sorted(before) == list(range(8))
        layouts = screen._layout_updates if hasattr(screen, "_layout_updates") else None
        for _ in range(5):  # five identical samples
            screen.refresh_panes()
            await pilot.pause()
        assert renders == before
        if layouts is not None:
            assert screen._layout_updates == layouts
        screen.state.gpus[3].util_pct = 7
        screen.refresh_panes()
        await pilot.pause()
        assert before[3] < renders[3] <= before[3] + 2  # its utilization line (and its history's)
        assert all(renders[i] == before[i] for i in range(8) if i != 3)
        assert "    7%" in save_text(app, None)


async def test_a_gpu_pane_builds_only_the_lines_whose_values_changed(monkeypatch):
    """A pane's line is built again only when a value it prints moved: a sample that changes one
    GPU's power builds that pane's power line alone, and the screen shows the new figure."""
    built = []
    for name in ("_util", "_mem", "_power", "_misc"):
        real = getattr(GpuPane, name)
        monkeypatch.setattr(
            GpuPane,
            name,
            lambda self, gpu, *a, _real=real, _name=name: built.append((self.index, _name)) or _real(self, gpu, *a),
        )
    app = replay("serving")
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.pause()
        screen = app.screen
        await pilot.pause(0.3)
        built.clear()
        screen.refresh_panes()
        await pilot.pause()
        assert built == []
        screen.state.gpus[5].power_w = 123.0
        screen.refresh_panes()
        await pilot.pause()
        assert built == [(5, "_power")]
        assert "123/600W" in save_text(app, None)


def test_a_lines_segments_are_richs_own_for_a_line_of_a_shape_seen_before():
    """A changed line's segments are Rich's render of it, whether its shape (length, style,
    spans) was seen before (a new power figure) or not."""
    console = Console()
    lines = [Text("pwr  ") + bar(w / 600, 24, "cyan") + Text(f" {w}/600W") for w in (63, 64, 64, 390)]
    lines += [
        Text("no processes", style="grey42"),
        Text(" 31°C  SM 392MHz") + Text("  ECC 2", style="bold red"),
        Text(""),
    ]
    for line in lines:
        assert _segments(line, console) == list(line.render(console)), line


async def test_the_header_is_drawn_with_each_sample_and_by_the_tick_only_when_none_came(monkeypatch):
    """The header's age changes in the frame that draws a sample's panes; the tick draws it alone
    only once HEADER_S went by without a sample, so the age still counts up when samples stop."""
    drawn = []
    real = cockpit_screen.header_text
    monkeypatch.setattr(cockpit_screen, "header_text", lambda screen: drawn.append(1) or real(screen))
    app = replay("serving")
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.pause()
        screen = app.screen
        screen.dirty = True
        screen._tick()
        assert len(drawn) >= 1
        drawn.clear()
        screen._tick()  # no sample since: too soon for the header alone
        assert drawn == []
        screen._status_at -= cockpit_screen.HEADER_S
        screen._tick()
        assert drawn == [1]


async def test_not_supported_fields_read_na_never_zero():
    doc = json.loads((FIXTURES / "demo-serving.json").read_text())
    for g in doc["gpus"]:
        g["power_w"] = g["temp_c"] = g["sm_clock_mhz"] = None
    app = CockpitApp(state=state_from_doc(doc))
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.pause()
        text = save_text(app, None)
    assert text.count("n/a/600W") == 8
    assert text.count("n/a  SM n/a") == 8


def test_snapshot_svg_is_identical_run_after_run(tmp_path):
    outs = []
    for n in (1, 2):
        out = tmp_path / f"{n}.svg"
        res = run_cli(
            "snapshot",
            "--replay",
            str(FIXTURES / "demo-serving.json"),
            "--layout",
            "demo",
            "--svg",
            str(out),
            "--size",
            "160x50",
        )
        assert res.returncode == 0, res.stderr
        outs.append(out.read_bytes())
    assert outs[0] == outs[1] and b"GPU7" in outs[0]


def test_live_snapshot_text_of_a_host_without_gpus():
    res = run_cli("snapshot", "local", "--text", "--size", "160x40")
    assert res.returncode == 0, res.stderr
    assert "no GPUs on " in res.stdout and "gpu data: none" in res.stdout
    assert "no NVIDIA driver on this host" in res.stdout


@pytest.fixture
async def eagle_app(sim_state, tmp_path, monkeypatch):
    """The demo's story on a fast clock: EAGLE-3 on, then relaunched from the screen without it."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    port = free_port()
    layout = parse_layout(
        f"""
name: ui{port}
engine: sglang
command: [-m, cockpit.sim.server]
base_flags: [--tp-size, "8", --port, "{port}", --sim-traffic, "2"]
flag_sets:
  eagle3: [--speculative-algorithm, EAGLE3, --speculative-draft-model-path, /d]
enabled: [eagle3]
log_dir: {tmp_path}
ports: [{port}]
stall: {{idle_s: 3, spin_s: 3}}
kill_wait_s: 2
auto_dump: true
sim: {{speed: 4, seed: 1}}
""",
        "ui.yaml",
    )
    runs = []

    async def on_connect(monitor):
        run = await demo.start_demo(monitor)
        runs.append(run.record)
        monitor.follow(run)  # as `cockpit demo` does: the ledger gets what was seen of it

    app = CockpitApp(monitor=sim_monitor(sim_state, port, layout, on_connect))
    yield app
    subprocess_kill = __import__("subprocess").run
    subprocess_kill(["pkill", "-9", "-f", f"sim.server.*port {port}"])


async def test_stall_then_relaunch_without_eagle3_then_kill_the_run(eagle_app):
    from cockpit.ui.screens import ConfirmScreen, RelaunchScreen, ReportScreen

    app = eagle_app
    async with app.run_test(size=(160, 50)) as pilot:
        await until(pilot, lambda: app.cockpit.verdict.name == "stalled-idle", 60)
        assert "log silent" in " ".join(app.cockpit.verdict.evidence)
        # auto_dump: the stall itself has every rank's stack dumped (py-spy) once, nobody pressed d
        monitor = app.cockpit.monitor
        await until(pilot, lambda: monitor.forensics is not None, 60)
        folder = __import__("pathlib").Path(monitor.forensics.folder)
        assert len(list(folder.glob("rank*-pid*.txt"))) == 8 and (folder / "groups.txt").exists()
        rows = __import__("cockpit.runs.ledger", fromlist=["read_ledger"]).read_ledger(app.cockpit.profile)
        assert rows[0]["forensics"]["folder"] == str(folder)  # the ledger says where they are
        await pilot.press("d")  # the same stacks, on request
        await until(pilot, lambda: isinstance(app.screen, ReportScreen), 60)
        await until(pilot, lambda: "raw dumps:" in save_text(app, None), 10)
        report = save_text(app, None)
        assert "stacks of 8 ranks" in report and "ranks 0-7" in report and "raw dumps:" in report
        assert "every frame of rank" not in report
        await until(pilot, lambda: "Native frames" in save_text(app, None).splitlines()[-1], 10)  # its footer
        await pilot.press("n")  # the native frames, unfolded
        await until(pilot, lambda: "every frame of rank 0" in save_text(app, None), 10)
        await pilot.press("escape")
        await until(pilot, lambda: app.cockpit.busy is None, 10)
        assert "stalled-idle" in save_text(app, None)
        await pilot.press("r")
        await until(pilot, lambda: isinstance(app.screen, RelaunchScreen), 10)
        await until(pilot, lambda: "--speculative-algorithm" in save_text(app, None), 10)
        await pilot.press("space")  # eagle3 is the first (and selected) flag set: off
        await pilot.pause(0.2)
        assert app.screen.spec().enabled == []
        await pilot.press("ctrl+r")
        await until(pilot, lambda: not isinstance(app.screen, RelaunchScreen), 10)
        # the relaunch shows what it will kill (the rule that found the run, every pid) before it acts
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), 30)
        await until(pilot, lambda: "the run: launched by this cockpit" in save_text(app, None), 10)
        assert save_text(app, None).count("sglang::scheduler_TP") >= 8
        # and the command line it runs, as `cockpit launch` shows it (one workflow: perform.agree_launch)
        asked = app.screen.lines[app.screen.lines.index("then launched:") + 1]
        assert "--tp-size 8" in asked and "--speculative-algorithm" not in asked, asked
        assert re.match(r"kill these \d+ processes(, remove .* of /dev/shm)? and launch\?", app.screen.question)
        await pilot.press("y")
        await until(pilot, lambda: app.cockpit.busy is None and app.cockpit.phase.name in ("ready", "serving"), 90)
        rows = __import__("cockpit.runs.ledger", fromlist=["read_ledger"]).read_ledger(app.cockpit.profile)
        assert [r["outcome"] for r in rows] == ["stalled-idle", "ready"] and rows[1]["flag_sets"] == []
        assert "--speculative-algorithm" not in " ".join(rows[1]["argv"])
        # K: the confirmation names every pid, then the report says it is verified
        await pilot.press("K")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), 10)
        await until(pilot, lambda: "SIGTERM" in save_text(app, None), 10)
        body = save_text(app, None)
        assert body.count("sglang::scheduler_TP") >= 8 and "SIGTERM" in body
        await pilot.press("y")
        await until(pilot, lambda: isinstance(app.screen, ReportScreen), 30)
        await until(pilot, lambda: "verified" in save_text(app, None), 10)
        await pilot.press("escape")
        await until(pilot, lambda: not [p for p in app.state.live_procs() if p.rank is not None], 10)
        # the operator's own kill is named as such, in the header, and is never judged a crash
        await pilot.pause(1.0)
        assert app.cockpit.verdict.name.value in ("no run", "watching")  # not crashed
        assert re.search(r"kill the run: stopped \d+ processes in [\d.]+ s, verified gone", save_text(app, None))
        await pilot.press("v")  # the kill's full report, a key away
        await until(pilot, lambda: isinstance(app.screen, ReportScreen) and "SIGTERM" in save_text(app, None), 10)


def test_the_layouts_ports_come_before_the_listeners_the_tree_opened():
    from cockpit.host.state import HostState, PortState
    from cockpit.ui.ports import PortsTable

    state = HostState("h")
    state.ports = [PortState(29500, True, 11), PortState(30000, True, 10), PortState(45678, True, 12)]
    table = PortsTable()
    table.configured = [30000]
    assert [key for key, _ in table._rows(state)] == ["30000", "29500", "45678"]
