"""The operator's screen at 80x24, 100x30 and 160x50: the verdict's whole evidence a key away (`e`),
dialogs that wrap whole words instead of cutting them (the kill plan, the shm audit), a footer
that drops whole entries, zoom that uses the width, fleet columns sized by what they hold, and
each action's one-line summary."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from rich.console import Console
from rich.segment import Segment
from simhost import until  # noqa: E402

from cockpit.actions.kill import KillPlan, summarize_clean, summarize_kill
from cockpit.common.hosttext import visible
from cockpit.host.snapshot import state_from_doc
from cockpit.runs.layouts import resolve_layout
from cockpit.runs.run import Scope
from cockpit.ui.app import CockpitApp, save_text
from cockpit.ui.commands import COCKPIT, key_name
from cockpit.ui.fleet import COLUMNS, cell_widths, fit_widths
from cockpit.ui.screens import ConfirmScreen, Hanging, ReportScreen

FIXTURES = Path(__file__).parents[1] / "fixtures"
SIZES = [(80, 24), (100, 30), (160, 50)]


def replay(name: str = "eagle3-deadlock") -> CockpitApp:
    doc = json.loads((FIXTURES / f"demo-{name}.json").read_text())
    return CockpitApp(state=state_from_doc(doc), layout=resolve_layout("demo"))


def dialog_rows(app) -> list[str]:
    """The rows inside the dialog's border, as the screen shows them."""
    region = app.screen.query_one(".dialog").region
    lines = save_text(app, None).splitlines()
    return [
        line[region.x + 1 : region.x + region.width - 1] for line in lines[region.y + 1 : region.y + region.height - 1]
    ]


def words(text: str) -> list[str]:
    return text.split()


def test_hanging_lines_wrap_at_whole_words_under_their_line():
    lines = [
        "  30635 root     2026-12-02 02:33:28   30635 S   /usr/bin/python -m sglang.launch_server --tp-size 8",
        "the run: launched by this cockpit (ledger): process group 30635, leader started 2026-12-02 02:33:28",
        "short",
    ]
    for width in (30, 50, 72, 120):
        console = Console(width=width, color_system=None, record=True)
        console.print(Hanging(lines))
        out = console.export_text().splitlines()
        assert all(len(row.rstrip()) <= width for row in out)
        assert words(" ".join(out)) == words(" ".join(lines))  # every word whole, in order
        continued = [row for row in out if row and not row.startswith(("  30635", "the run", "short"))]
        assert all(row.startswith("    ") for row in continued), out  # under their line, indented


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_every_evidence_line_of_the_stall_is_a_key_away(size):
    app = replay()
    async with app.run_test(size=size) as pilot:
        await pilot.pause(0.3)
        evidence = app.cockpit.verdict.evidence
        assert len(evidence) >= 3 and app.cockpit.verdict.name.value == "stalled-idle"
        header = save_text(app, None).splitlines()[1]
        if size[0] < 160:  # the header cannot hold them all: it says where they are
            assert "e: all " in header and app.cockpit.footer.shows("evidence"), header
        await pilot.press("e")
        await pilot.pause(0.3)
        assert isinstance(app.screen, ReportScreen)
        shown = " ".join(words(" ".join(dialog_rows(app))))
        for line in evidence:
            assert " ".join(words(visible(line))) in shown, (line, shown)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_the_footer_drops_whole_entries_and_zoom_uses_the_width(size):
    app = replay()
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: save_text(app, None).splitlines()[-1].strip(), 10)  # the footer composed
        footer = save_text(app, None).splitlines()[-1]
        shown = [c for c in COCKPIT if app.cockpit.footer.shows(c.action)]
        expected = " ".join(f"{key_name(c.key, c.key_display)} {c.label}" for c in shown).split()
        tokens = footer.split()
        assert tokens[: len(expected)] == expected, (footer, expected)
        assert set(tokens[len(expected) :]) <= {"▏^p", "^p", "palette"}, footer  # nothing cut after the last entry
        app.cockpit.ranks.focus()
        await pilot.press("z")
        await pilot.pause(0.3)
        box = app.cockpit.ranks.region
        assert box.width == size[0]  # the zoomed pane takes the whole width
        rows = save_text(app, None).splitlines()[box.y : box.y + box.height]
        assert all(line[box.x + box.width - 1] in "│╮╯" for line in rows), rows  # the box keeps its right border
        longest = max((p.title for p in app.state.procs.values()), key=len)
        assert len(longest) > 30 and visible(longest)[:24] in "\n".join(rows)  # wider than the pane's 20 cells


def test_fleet_columns_share_the_width_by_what_they_hold():
    def cells(phase: str, verdict: str, alerts: str) -> list[list[Segment]]:
        return [
            [Segment("kimi-box")],
            [Segment("up")],
            [Segment("3")],
            [Segment("▁" * 8)],
            [Segment("▁" * 8)],
            [Segment(phase)],
            [Segment(verdict)],
            [Segment(alerts)],
        ]

    rows = [
        cells(
            "capturing draft cuda graphs",
            "stalled-idle (rank 3)",
            "all 8 ranks alive, CPU < 5 %, GPU utilization < 5 % on all 8 GPUs",
        )
    ]
    widths = fit_widths([cell_widths(r) for r in rows], 120)
    got = dict(zip(COLUMNS, widths))
    assert sum(widths) == 120
    assert got["phase"] > len("capturing draft cuda graphs") and got["verdict"] > len("stalled-idle (rank 3)")
    assert got["link"] <= 6  # the short link leaves its room to the alerts, which take the rest
    assert got["alerts"] == 120 - sum(w for name, w in got.items() if name != "alerts") > 30
    narrow = dict(zip(COLUMNS, fit_widths([cell_widths(r) for r in rows], 80)))
    assert sum(narrow.values()) == 80 and narrow["host"] >= len("kimi-box") + 1


def test_each_action_says_itself_in_one_line():
    plan = KillPlan(Scope(), [{"pid": n, "pgid": 1, "status": "S", "title": "x"} for n in range(11)])
    good = {"verified": True, "remaining": [], "gpu_memory_left": [], "ports_open": [], "seconds": 1.24}
    assert summarize_kill(plan, good) == "stopped 11 processes in 1.2 s, verified gone"
    bad = dict(good, verified=False, remaining=[4], ports_open=[30000])
    assert summarize_kill(plan, bad) == "stopped 11 processes in 1.2 s, NOT verified: 1 process alive; port 30000 open"
    done = {"removed": [f"psm_{n}" for n in range(41)], "skipped": []}
    assert summarize_clean(done, 15) == "removed 41 /dev/shm entries, left 15 (not tied to this run)"


async def test_no_dialog_cuts_a_word_at_any_size(demo_env):
    """On the live stalled demo: the kill plan (K) and the shm audit (s) at each size show only
    whole words of what they list, and the kill's title names every process it will signal."""
    from cockpit.cli.demo import demo_app, end_demo

    args, layout, pgids = demo_env
    app, layout, state = demo_app(args, layout)
    try:
        async with app.run_test(size=SIZES[-1]) as pilot:
            await until(pilot, lambda: app.cockpit.verdict.name == "stalled-idle", 120)
            pgids.append(app.cockpit.monitor.following["pgid"])
            for size in SIZES:
                await pilot.resize_terminal(*size)
                await pilot.pause(0.5)
                for key in ("K", "s"):
                    await pilot.press(key)
                    await until(pilot, lambda: isinstance(app.screen, (ConfirmScreen, ReportScreen)), 60)
                    dialog = app.screen
                    await until(
                        pilot, lambda dialog=dialog: visible(dialog.title_text) in " ".join(dialog_rows(app)), 10
                    )
                    known = (
                        set(words(" ".join(visible(line) for line in dialog.lines + [dialog.title_text])))
                        | set(words(getattr(dialog, "question", "")))
                        | {"y", "yes", "·", "n", "no"}
                    )
                    seen = words(" ".join(dialog_rows(app)))
                    assert len(seen) > 20, (size, key, seen)  # the dialog is drawn, with its list
                    cut = [w for w in seen if w not in known and not re.fullmatch(r"[▁▂▃▄▅▆▇█]+", w)]
                    assert cut == [], (size, key, cut)
                    await pilot.press("escape")
                    await until(pilot, lambda: app.screen is app.cockpit, 10)
                    await until(pilot, lambda: app.cockpit.busy is None, 10)
    finally:
        await end_demo(args, app, layout, state)
