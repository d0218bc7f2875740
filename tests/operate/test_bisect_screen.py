"""`B` from the screen always leads somewhere (at 80x24 and 160x50): the ledger's failing run and the
good run on screen offered as that bisect; otherwise a choice of both sides that never takes
nothing to search; a failure's whole reason a key away (`v`)."""

import subprocess

import pytest
from bisect_oracle import layout_of
from conftest import free_port
from simhost import until

from cockpit.common.errors import CockpitError
from cockpit.monitor import demo
from cockpit.runs.bisect import make_plan
from cockpit.runs.ledger import append_ledger


def failing_run(layout, sets, run_id="earlier-1"):
    """What the walk-through leaves in the ledger: a run launched with `sets` that stalled."""
    append_ledger(layout, {"event": "launch", "run_id": run_id, "flag_sets": sets, "params": {}, "time": 1.0})
    append_ledger(layout, {"event": "outcome", "run_id": run_id, "outcome": "stalled-idle", "time": 2.0})


@pytest.fixture
def screen_host(sim_state, tmp_path, monkeypatch):
    """A cockpit on the simulated host whose layout runs with `enabled` (a healthy launch)."""
    from test_ui import sim_monitor

    from cockpit.ui.app import CockpitApp

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    port = free_port()

    def make(enabled=""):
        layout = layout_of(enabled, tmp=tmp_path, port=port)
        layout.name = f"scr{port}"

        async def on_connect(monitor):
            monitor.follow(await demo.start_demo(monitor))

        return layout, CockpitApp(monitor=sim_monitor(sim_state, port, layout, on_connect))

    yield make
    subprocess.run(["pkill", "-9", "-f", f"sim.server.*port {port}"])


async def healthy(pilot, app):
    await until(
        pilot, lambda: app.cockpit.verdict.name.value == "ok" and app.cockpit.phase.name in ("ready", "serving"), 90
    )


def flat(app) -> str:
    from cockpit.ui.app import save_text

    return " ".join(save_text(app, None).split())


def dialog_text(app) -> str:
    """The words inside the dialog's borders, its rows joined (the panes behind it cut away)."""
    from cockpit.ui.app import save_text

    rows = save_text(app, None).splitlines()
    top = next(i for i, row in enumerate(rows) if "╭" in row and "╮" in row and row.index("╮") - row.index("╭") > 40)
    left, right = rows[top].index("╭"), rows[top].index("╮")
    return " ".join(" ".join(row[left + 1 : right] for row in rows[top + 1 :]).split())


@pytest.mark.parametrize("size", [(80, 24), (160, 50)])
async def test_b_after_the_walk_through_offers_the_ledgers_failing_run_against_the_good_one(screen_host, size):
    """The ledger holds the failing run (eagle3 on, stalled); the run on screen (eagle3 off) is
    serving: B offers that bisect at once, with the suspects and its most launches."""
    from cockpit.ui.screens import ConfirmScreen

    layout, app = screen_host("graphs")
    failing_run(layout, ["graphs", "eagle3"])
    async with app.run_test(size=size) as pilot:
        await healthy(pilot, app)
        await pilot.press("B")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), 30)
        await until(pilot, lambda: "bisect over 1: eagle3" in flat(app), 10)
        text = flat(app)
        assert "failing: graphs, eagle3" in text and "good: graphs" in text
        await pilot.press("n")
        await until(pilot, lambda: app.cockpit.busy is None, 30)


@pytest.mark.parametrize("size", [(80, 24), (160, 50)])
async def test_b_with_nothing_in_the_ledger_opens_the_choice_and_never_takes_nothing(screen_host, size):
    from cockpit.ui.screens import BisectScreen, ConfirmScreen

    layout, app = screen_host("")
    async with app.run_test(size=size) as pilot:
        await healthy(pilot, app)
        await pilot.press("B")
        await until(pilot, lambda: isinstance(app.screen, BisectScreen), 30)
        assert "no failing run in the ledger" in flat(app)
        await pilot.press("ctrl+r")  # both sides the same: it says what to switch and stays
        await pilot.pause(0.2)
        assert isinstance(app.screen, BisectScreen) and "the same configuration on both sides" in flat(app)
        await pilot.press("down", "space")  # the failing side: the second flag set on
        await until(pilot, lambda: "suspects: eagle3" in flat(app), 10)
        await pilot.press("ctrl+r")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), 30)
        await until(pilot, lambda: "bisect over 1: eagle3" in flat(app), 10)
        await pilot.press("n")
        await until(pilot, lambda: app.cockpit.busy is None, 30)


async def test_a_bisects_failure_is_read_whole_at_80x24(screen_host):
    """The ledger's failing run names a flag set the layout no longer has: the header begins the
    reason, `v` shows all of it."""
    from cockpit.ui.screens import ReportScreen

    layout, app = screen_host("")
    failing_run(layout, ["eagle3", "old_set"])
    async with app.run_test(size=(80, 24)) as pilot:
        await healthy(pilot, app)
        await pilot.press("B")
        await until(pilot, lambda: app.cockpit.actions.report is not None, 30)
        await until(pilot, lambda: app.cockpit.busy is None, 30)
        await pilot.press("v")
        await until(pilot, lambda: isinstance(app.screen, ReportScreen), 10)
        with pytest.raises(CockpitError) as said:
            make_plan(layout, "local", failing=["eagle3", "old_set"], good=[])
        assert "no flag set 'old_set'" in str(said.value)
        assert "bisect failed: " + " ".join(str(said.value).split()) in dialog_text(app)  # whole, wrapped under itself
