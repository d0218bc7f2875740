"""The screen at the sizes operators have (80x24, 100x30, 160x50): the header always there, a
line per GPU below 120x35, zoom, the rank table's sort, the relaunch dialog's diff of argument
lists, help, and notifications that never cover a dialog. Rendered from recorded demo states."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cockpit.host.snapshot import state_from_doc
from cockpit.judge.verdict import VerdictName
from cockpit.runs.layouts import resolve_layout
from cockpit.runs.spec import RunSpec, build_argv
from cockpit.ui.app import CockpitApp, save_text
from cockpit.ui.cockpit import GpuView
from cockpit.ui.ranks import RankTable
from cockpit.ui.screens import ConfirmScreen, HelpScreen, arg_diff, arg_items

FIXTURES = Path(__file__).parents[1] / "fixtures"


def replay(name: str) -> CockpitApp:
    doc = json.loads((FIXTURES / f"demo-{name}.json").read_text())
    return CockpitApp(state=state_from_doc(doc), layout=resolve_layout("demo"))


@pytest.mark.parametrize("size", [(80, 24), (100, 30), (160, 50)])
async def test_the_header_and_every_gpu_are_on_screen_at_every_size(size):
    app = replay("eagle3-deadlock")
    async with app.run_test(size=size) as pilot:
        await pilot.pause(0.3)
        text = save_text(app, None)
    lines = text.splitlines()
    assert "verdict stalled-idle" in lines[0] and "phase capturing draft cuda graphs" in lines[0]
    assert lines[1].lstrip().startswith("▸ all 8 ranks alive")  # the first evidence, on its own line
    for rank in range(8):
        assert f"TP{rank}" in text  # every GPU, with its rank
    assert len(lines) == size[1]


async def test_below_120x35_a_line_per_gpu_and_zoom_shows_the_panes():
    app = replay("serving")
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause(0.3)
        screen = app.cockpit
        assert screen.has_class("compact")
        text = save_text(app, None)
        assert "GPU7 RTX PRO 6000" not in text and text.count("82G/96G") == 8  # the compact list
        screen.query_one(GpuView).focus()
        await pilot.press("z")
        await pilot.pause(0.3)
        assert screen.maximized is screen.query_one(GpuView)
        zoomed = save_text(app, None)
        assert "GPU7 RTX PRO 6000" in zoomed and "verdict ok" in zoomed.splitlines()[0]
        assert "ranks" not in zoomed  # the other panes give way; the header and keys stay
        await pilot.press("z")
        await pilot.pause(0.3)
        assert screen.maximized is None and "ranks" in save_text(app, None)


async def test_the_rank_table_sorts_by_a_column_and_back_to_the_tree():
    app = replay("serving")
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.pause(0.3)
        table = app.query_one(RankTable)
        tree = [int(k) for k in table._keys]
        await pilot.press("o")  # gpu mem, largest first
        await pilot.pause(0.2)
        assert table.border_title == "ranks by gpu mem"
        mem = [app.state.procs[int(k)].gpu_mem_mib or 0 for k in table._keys]
        assert mem == sorted(mem, reverse=True) and mem[0] > 0
        table.sort("pid")
        await pilot.pause(0.2)
        assert [int(k) for k in table._keys] == sorted(tree)
        table.sort("pid")  # again: the other way round
        await pilot.pause(0.2)
        assert [int(k) for k in table._keys] == sorted(tree, reverse=True)
        table.sort("tree")
        await pilot.pause(0.2)
        assert [int(k) for k in table._keys] == tree and table.border_title == "ranks"


def test_the_relaunch_diff_is_a_diff_of_argument_lists_flag_with_value():
    layout = resolve_layout("demo")
    old = build_argv(layout, RunSpec(enabled=["eagle3"], params={"mem_fraction_static": 0.85}), "python3")
    new = build_argv(layout, RunSpec(enabled=["no_cuda_graph"], params={"mem_fraction_static": "0.8"}), "python3")
    shown, removed = arg_diff(old, new)
    assert "--speculative-eagle-topk 1" in removed and "--speculative-num-steps 3" in removed
    assert "--speculative-algorithm EAGLE3" in removed
    assert [item for item, changed in shown if changed] == ["--disable-cuda-graph", "--mem-fraction-static 0.8"]
    assert "--mem-fraction-static 0.85" in removed
    assert arg_items(["-m", "x", "--trust-remote-code", "--tp-size", "8", "--offset", "-3", "--name", "a b"]) == [
        "-m x",
        "--trust-remote-code",
        "--tp-size 8",
        "--offset -3",
        "--name 'a b'",
    ]


async def test_help_explains_every_verdict_and_scrolls_at_80x24():
    app = replay("serving")
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("question_mark")
        await pilot.pause(0.2)
        assert isinstance(app.screen, HelpScreen)
        from fixtures_shared import help_plain

        HELP = help_plain()

        for name in VerdictName:
            assert name.value in HELP
        for word in ("loading weights", "capturing draft cuda graphs", "Colours", "zoom", "sort"):
            assert word in HELP
        first = save_text(app, None)
        await pilot.press("end")
        await pilot.pause(0.2)
        assert save_text(app, None) != first  # the rest is reachable
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)


async def test_a_notification_never_covers_a_dialog():
    app = replay("serving")
    async with app.run_test(size=(100, 30)) as pilot:
        app.push_screen(ConfirmScreen("kill the run", ["pid 1"], "Signal these?"))
        await pilot.pause(0.2)
        app.notify("SOMETHING HAPPENED")
        await pilot.pause(0.3)
        text = save_text(app, None)
        assert "Signal these?" in text and "SOMETHING HAPPENED" not in text
        assert "y Yes, do it" in text.splitlines()[-1]  # the dialog's keys, in its footer


async def test_the_header_says_a_stall_with_requests_in_flight_as_such():
    doc = json.loads((FIXTURES / "demo-serving.json").read_text())
    doc["verdict"] = {
        "name": "stalled-idle",
        "odd_rank": 1,
        "detail": "requests frozen",
        "evidence": [
            "the engine's stats say 8 requests running at 0 tokens/s since 12-01 22:06:15 (48 s): requests frozen"
        ],
    }
    app = CockpitApp(state=state_from_doc(doc), layout=resolve_layout("demo"))
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.pause(0.3)
        first = save_text(app, None).splitlines()[0]
    assert "verdict stalled-idle (rank 1): requests frozen" in first


async def test_the_ablation_dialog_says_what_ctrl_r_does_there():
    """The same dialog serves relaunch and ablation; what ctrl+r does is said for each. The
    command, wrapped, hangs under its first argument, never under the label."""
    from cockpit.runs.spec import default_spec
    from cockpit.ui.screens import RelaunchScreen

    layout = resolve_layout("demo")
    app = replay("serving")
    async with app.run_test(size=(100, 40)) as pilot:
        for note in (RelaunchScreen.RELAUNCH, RelaunchScreen.ABLATE):
            app.push_screen(RelaunchScreen(layout, default_spec(layout), "python3", [], note=note))
            for _ in range(50):
                await pilot.pause(0.1)
                if isinstance(app.screen, RelaunchScreen) and "ctrl+r:" in save_text(app, None):
                    break
            lines = save_text(app, None).splitlines()
            first = next(i for i, line in enumerate(lines) if "command:" in line)
            label = lines[first].index("command:")
            more = lines[first + 1 : next(i for i in range(first + 1, len(lines)) if "ctrl+r:" in lines[i])]
            assert more, "the demo's command wraps at 100 columns"
            for line in more:
                assert line[label : label + 8].strip() == "" or line[label:].startswith(("added:", "removed:")), line
            text = " ".join(" ".join(lines).split())
            assert ("every on/off combination" in text) == (note is RelaunchScreen.ABLATE), text[-600:]
            assert ("then this runs" in text) == (note is RelaunchScreen.RELAUNCH)
            app.pop_screen()


@pytest.mark.parametrize("size", [(100, 30), (160, 50)])
async def test_a_dead_ranks_exit_code_is_on_screen_at_every_width(size):
    """The narrow rank table's process column is 20 cells: a dead rank's title gives way to its
    exit code, cut in the middle so its end (…_TP5) still names the rank."""
    doc = json.loads((FIXTURES / "demo-serving.json").read_text())
    state = state_from_doc(doc)
    dead = next(p for p in state.procs.values() if p.rank == 5)
    dead.ended(0.0)
    dead.exit_code = -9
    app = CockpitApp(state=state, layout=resolve_layout("demo"))
    async with app.run_test(size=size) as pilot:
        await pilot.pause(0.3)
        text = save_text(app, None)
    row = next(line for line in text.splitlines() if "exit -9" in line)
    assert "TP5" in row, row
