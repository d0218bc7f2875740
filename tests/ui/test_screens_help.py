"""One command table per screen: the cockpit's bindings, footer, help and palette are drawn from
it, so every key the cockpit binds is in the help; wrapped help lines hang under their
description; the palette offers the cockpit's own actions, each only while its key would work,
and runs the very action of the key."""

from __future__ import annotations

import json
import re
from pathlib import Path

from fixtures_shared import help_plain

from cockpit.host.snapshot import state_from_doc
from cockpit.operate.acts import ACTS
from cockpit.runs.layouts import resolve_layout
from cockpit.ui.app import CockpitApp, save_text
from cockpit.ui.cockpit import CockpitScreen
from cockpit.ui.commands import COCKPIT, RANK_TABLE, key_name
from cockpit.ui.ranks import RankTable
from cockpit.ui.screens import HelpScreen

FIXTURES = Path(__file__).parents[1] / "fixtures"


def replay(name: str = "serving", **kw) -> CockpitApp:
    doc = json.loads((FIXTURES / f"demo-{name}.json").read_text())
    return CockpitApp(state=state_from_doc(doc), layout=resolve_layout("demo"), **kw)


PALETTE_TITLES = {c.action: c.palette for c in COCKPIT if c.palette}


def keys_section(text: str) -> list[str]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if "this help" in line)  # the first key's row
    end = next(i for i, line in enumerate(lines) if i > start and not line.strip())
    return lines[start:end]


def test_every_binding_of_the_cockpit_is_in_the_help():
    bindings = [*CockpitScreen.BINDINGS, *RankTable.BINDINGS]
    rows = keys_section(help_plain(width=100))
    listed = {tok for line in rows for tok in re.split(r"\s{2,}", line.strip())[0].split(" or ") if line[2] != " "}
    for b in bindings:
        for key in b.key.split(","):
            assert key_name(key, b.key_display) in listed, f"{key} ({b.action}) is not in the help"
    for key in ("b", "F", "K", "?", ":", "ctrl+p", "enter", "o", "esc"):
        assert key in listed
    table = [*COCKPIT, *RANK_TABLE]
    assert [(b.key, b.action, b.description, b.show) for b in bindings] == [
        (c.key, c.action, c.label, c.show) for c in table
    ]  # the bindings are the table's
    assert len({c.action for c in table}) == len(table)  # each action described once


def test_wrapped_help_lines_hang_under_their_description():
    for width in (60, 80, 100):
        text = help_plain(width=width)
        rows = keys_section(text)
        column = rows[0].index("this help")
        for line in rows:
            if line[:column].strip():  # a key's first line: the description starts at the column
                assert line[column - 1] == " " and line[column] != " ", line
            else:  # a continuation: under the description, never at column 1
                assert line[column] != " ", line
        verdicts = text[text.index("Verdicts") :].splitlines()[1:]
        spinning = next(i for i, line in enumerate(verdicts) if "stalled-spinning" in line)
        start = verdicts[spinning].index("GPUs pinned")
        assert verdicts[spinning + 1][:start].strip() == "" and verdicts[spinning + 1][start] != " "


async def test_help_screen_shows_the_generated_keys_at_80x24():
    app = replay()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("question_mark")
        await pilot.pause(0.3)
        assert isinstance(app.screen, HelpScreen)
        text = save_text(app, None)
        assert "hang bundle" in text and "flight recorder" in text
        assert "back to the fleet" not in text  # no fleet opened this cockpit: no esc back to one
        assert "unknown: no connection" in help_plain()


def titles(app, screen) -> set[str]:
    return {c.title for c in app.get_system_commands(screen)}


async def test_the_palette_offers_only_what_the_keys_can_do():
    app = replay()
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.2)
        offered = titles(app, app.cockpit)
        # a replayed snapshot has no link: no action on the host, the view's keys are there
        assert PALETTE_TITLES["kill_run"] not in offered and PALETTE_TITLES["dump"] not in offered
        assert {PALETTE_TITLES["ledger"], PALETTE_TITLES["search"], PALETTE_TITLES["help"]} <= offered
        assert "Quit" in offered  # Textual's own stay
        await pilot.press("colon")
        await pilot.pause(0.3)
        for ch in "ledger":
            await pilot.press(ch)
        await pilot.pause(0.5)
        assert PALETTE_TITLES["ledger"].split(":")[0] in save_text(app, None)
        await pilot.press("enter")
        await pilot.pause(0.5)
        assert "runs of demo" in save_text(app, None)  # the same as L


async def test_kill_from_the_palette_asks_as_K_does_and_the_header_says_it_waits(live_app):
    """On a live host the palette finds "kill"; choosing it opens the kill's own confirmation (one
    process is "this process"), the header says the action waits for an answer; read-only, the
    palette offers no action at all."""
    from simhost import until

    from cockpit.ui.screens import ConfirmScreen

    app, _ = live_app  # a demo run on the simulated host, its process group killed after the test
    async with app.run_test(size=(160, 50)) as pilot:
        await until(pilot, lambda: app.state.link_state == "up" and any(p.alive for p in app.state.procs.values()))
        await until(pilot, lambda: PALETTE_TITLES["kill_run"] in titles(app, app.cockpit), 20)
        assert PALETTE_TITLES["dump"] in titles(app, app.cockpit)
        helps = {c.title: c.help for c in app.get_system_commands(app.cockpit)}
        assert helps[PALETTE_TITLES["kill_run"]].endswith("; asks first")  # dangerous, in the table of acts
        assert not helps[PALETTE_TITLES["dump"]].endswith("; asks first")
        await pilot.press("colon")
        await pilot.pause(0.3)
        for ch in "kill the run":
            await pilot.press("space" if ch == " " else ch)
        await until(pilot, lambda: PALETTE_TITLES["kill_run"] in save_text(app, None), 10)
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), 20)
        await until(pilot, lambda: "kill the run: waiting for your answer" in save_text(app, None), 10)  # next tick
        text = save_text(app, None)
        header = next(line for line in text.splitlines() if "kill the run:" in line)
        assert "ready ok" not in header
        assert not re.search(r"\b1 processes|\bprocess groups \d+:", text)
        assert re.search(r"kill (this process|these \d+ processes)\?", text)  # as `cockpit kill` asks
        await pilot.press("n")
        await until(pilot, lambda: app.cockpit.busy is None, 10)
        app.cockpit.read_only = True
        offered = titles(app, app.cockpit)
        assert not {PALETTE_TITLES[a.name] for a in ACTS} & offered


async def test_a_log_search_without_a_match_says_so():
    app = replay()
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.pause(0.3)
        await pilot.press("slash")
        await pilot.pause(0.2)
        for ch in "zqzqzq":
            await pilot.press(ch)
        await pilot.press("enter")
        await pilot.pause(0.4)
        assert "no line matches “zqzqzq”" in save_text(app, None)


async def test_c_in_a_report_without_anything_to_clean_says_nothing_to_remove():
    from cockpit.ui.screens import ReportScreen

    app = replay()
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.2)
        app.push_screen(ReportScreen("/dev/shm", ["nothing of a run"], {}, {"c": "nothing to remove: all kept"}))
        await pilot.pause(0.2)
        await pilot.press("c")
        await pilot.pause(0.3)
        assert isinstance(app.screen, ReportScreen)
        assert "nothing to remove: all kept" in save_text(app, None)


def test_the_help_explains_every_verdict_the_cockpit_gives():
    from rich.text import Text

    from cockpit.judge.verdict import VerdictName
    from cockpit.ui.screens import VERDICT_HELP

    named = {Text.from_markup(name).plain for name, _ in VERDICT_HELP}
    assert {v.value for v in VerdictName} <= named


def test_the_fleet_screen_draws_its_keys_and_help_from_its_one_table():
    from rich.text import Text

    from cockpit.ui.commands import FLEET
    from cockpit.ui.fleet import FleetScreen, fleet_help

    assert [(b.key, b.action, b.description) for b in FleetScreen.BINDINGS] == [
        (c.key, c.action, c.label) for c in FLEET
    ]
    text = Text.from_markup(fleet_help()).plain
    for c in FLEET:
        assert key_name(c.key, c.key_display) in text and Text.from_markup(c.help).plain in text
