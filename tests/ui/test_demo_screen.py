"""The demo as the operator meets it, end to end on a fast clock: its own state folder and runs,
the EAGLE-3 stall, the relaunch from the screen (r, space, ctrl+r) reading as the operator's own
stop (never `crashed`), the ledger keeping what the cockpit saw of each run, and `q` leaving no
process of the demo behind."""

from __future__ import annotations

import asyncio
import os
import re
import sys
import time
from pathlib import Path

import psutil
from simhost import until

from cockpit.cli import build_parser
from cockpit.cli.demo import _reap_stale_demos, demo_app, end_demo
from cockpit.monitor import demo
from cockpit.runs.layouts import resolve_layout
from cockpit.runs.ledger import describe_ledger, read_ledger
from cockpit.ui.app import save_text
from cockpit.ui.screens import ConfirmScreen, RelaunchScreen


def group_members(pgids: list[int]) -> list[psutil.Process]:
    out = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) in pgids and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc)
        except (OSError, psutil.Error):
            pass
    return out


async def test_demo_relaunch_then_quit_leaves_nothing_and_the_ledger_keeps_what_was_seen(demo_env):
    args, layout, pgids = demo_env
    app, layout, state = demo_app(args, layout)
    assert Path(state).parent == demo.demo_base() and state in demo.live_states()
    verdicts: list[str] = []
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.cockpit.monitor.following is not None, 30)
        monitor = app.cockpit.monitor
        phases: list[str] = []
        monitor.subscribe(lambda e: verdicts.append(monitor.verdict.name.value) if e.kind == "verdict" else None)
        monitor.subscribe(lambda e: phases.append(monitor.phase.name) if e.kind == "sample" else None)
        pgids.append(monitor.following["pgid"])
        await until(pilot, lambda: app.cockpit.verdict.name == "stalled-idle", 90)
        await pilot.pause(0.5)
        header = save_text(app, None)
        assert "stalled-idle" in header and "all 8 ranks alive" in header

        await pilot.press("r")
        await until(pilot, lambda: isinstance(app.screen, RelaunchScreen), 10)
        await pilot.pause(0.3)
        dialog = save_text(app, None)
        assert "[on]  eagle3" in dialog and "[off] no_cuda_graph" in dialog  # on/off in words
        assert "mem_fraction_static (--mem-fraction-static):" in dialog  # every field has a label
        assert "Launch" in dialog.splitlines()[-1]  # the dialog's keys, in its footer
        await pilot.press("space")  # eagle3, the first flag set: off
        await pilot.pause(0.3)
        assert app.screen.spec().enabled == []
        dialog = save_text(app, None)
        assert "[off] eagle3" in dialog and "--speculative-eagle-topk 1" in dialog.split("removed:")[1]
        await pilot.press("ctrl+r")
        await until(pilot, lambda: not isinstance(app.screen, RelaunchScreen), 10)
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), 30)  # what the relaunch kills, first
        assert "the run: " in save_text(app, None)
        await pilot.press("y")
        await until(pilot, lambda: monitor.following["pgid"] != pgids[0], 30)
        pgids.append(monitor.following["pgid"])
        await until(pilot, lambda: app.cockpit.busy is None and app.cockpit.phase.name in ("ready", "serving"), 90)
        assert group_members(pgids[:1]) == []  # the relaunch ended the stalled run first
        assert "crashed" not in verdicts, verdicts  # the cockpit's own stop is never a crash
        assert "stopping" in verdicts
        assert "crashed" not in phases, phases  # nor is the stopped run's phase
        await until(pilot, lambda: any(f"phase {p}" in save_text(app, None) for p in ("ready", "serving")), 10)
        await pilot.press("q")

    told = await end_demo(args, app, layout, state)
    assert told == ["the demo's 1 run stopped, verified gone"]
    assert group_members(pgids) == []
    assert not Path(state).exists() and demo.live_states() == []
    rows = read_ledger(layout)
    assert [r["outcome"] for r in rows] == ["stalled-idle", "ready"]
    assert rows[0]["flag_sets"] == ["eagle3"] and rows[1]["flag_sets"] == []
    assert_phase_times_are_the_runs_own(rows[1]["phase_times"], eagle3=False)  # nothing of the stalled run


async def test_a_demo_neither_shows_nor_judges_processes_it_did_not_start(demo_env, sim_state):
    """Another demo's run on the same machine (started here by hand, titled like every rank)
    is not in this demo's rank tree."""
    import subprocess
    import sys

    args, layout, pgids = demo_env
    other = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import setproctitle, time; setproctitle.setproctitle('sglang::scheduler_TP0'); time.sleep(60)",
        ],
        start_new_session=True,
    )
    pgids.append(other.pid)
    args.no_server = True
    app, layout, state = demo_app(args, layout)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.state.seq > 2, 30)
        await pilot.pause(0.5)
        assert other.pid not in app.state.procs
        assert app.cockpit.verdict.name.value == "no run"
        text = save_text(app, None)
        assert "sglang::scheduler_TP0" not in text
        assert "press r" in text  # the empty state says what to do
        await pilot.press("q")
    assert await end_demo(args, app, layout, state) == []
    assert not Path(state).exists()
    other.kill()
    other.wait()


def test_a_demo_killed_without_cleaning_up_is_cleaned_by_the_next(demo_env):
    """A folder whose owner is gone is stale; a live one is not."""
    args, layout, _ = demo_env
    mine = demo.new_state()
    dead = Path(demo.new_state())
    (dead / "owner.json").write_text('{"pid": 1, "start": "0"}')
    assert demo.live_states() == [mine] and demo.stale_states() == [str(dead)]
    import asyncio

    assert asyncio.run(_reap_stale_demos(args, layout)) == []
    assert not dead.exists() and Path(mine).exists()


def test_other_commands_on_the_demo_without_one_running_say_what_to_do(demo_env):
    from conftest import run_cli

    res = run_cli("snapshot", "demo", "--text", env={"XDG_RUNTIME_DIR": os.environ["XDG_RUNTIME_DIR"]})
    assert res.returncode == 2
    assert "no demo is running: start one with `cockpit demo`" in res.stderr


async def test_a_host_that_does_not_resolve_is_said_on_screen_and_quitting_exits_2():
    from cockpit.link.target import parse_target
    from cockpit.monitor.host import HostMonitor
    from cockpit.ui.app import CockpitApp

    app = CockpitApp(monitor=HostMonitor(parse_target("nosuchhost.invalid")))
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.error is not None, 30)
        await pilot.pause(0.5)
        text = save_text(app, None)
        assert "cannot resolve" in text and "q quits (exit status 2)" in text
        assert "connecting" not in text and "unknown: no connection" in text
    res = __import__("conftest").run_cli("snapshot", "nosuchhost.invalid", "--json")
    assert res.returncode == 2 and "cannot resolve" in res.stderr


async def test_a_fleet_row_for_the_demo_watches_it_as_snapshot_demo_does(demo_env, tmp_path):
    """`--hosts demo` in a fleet: the running demo's simulated GPUs and its run, not this
    machine's other processes; with no demo running, the row says so (and how to start one)."""
    from cockpit.monitor.fleet import FleetMonitor, fleet_from_hosts, take_fleet_snapshot

    args, layout, pgids = demo_env
    doc = await take_fleet_snapshot(FleetMonitor(fleet_from_hosts("demo")), timeout=20)
    row = doc["hosts"][0]
    assert not row["reachable"] and row["error"].startswith("no demo is running: start one with `cockpit demo`")

    app, layout, state = demo_app(args, layout)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.cockpit.monitor.following is not None, 30)
        pgids.append(app.cockpit.monitor.following["pgid"])
        fleet = fleet_from_hosts("demo", layout=str(tmp_path / "fastdemo.yaml"))  # the demo's own layout
        doc = await take_fleet_snapshot(FleetMonitor(fleet), timeout=30)
        row = doc["hosts"][0]
        assert row["reachable"], row
        snap = row["snapshot"]
        assert len(snap["gpus"]) == 8
        run = app.cockpit.monitor.following["pgid"]
        assert snap["processes"] and all(os.getpgid(p["pid"]) == run for p in snap["processes"])  # the demo's run only
        await pilot.press("q")
    await end_demo(args, app, layout, state)


def healthy_demo(demo_env, tmp_path):
    """The fast demo with EAGLE-3 off and metrics on (as the real demo): a run that reaches
    serving and stays there."""
    args, layout, pgids = demo_env
    path = Path(layout.path)
    healthy = tmp_path / "healthy.yaml"
    healthy.write_text(
        path.read_text()
        .replace("enabled: [eagle3]", "enabled: []")
        .replace('--sim-traffic, "2"]', '--sim-traffic, "2", --enable-metrics]')
    )
    args = build_parser().parse_args(["demo", "--layout", str(healthy), "--interval", "0.25"])
    return args, resolve_layout(str(healthy)), pgids


PHASE_ORDER = ["loading weights", "kv cache", "capturing cuda graphs", "ready", "serving"]


def assert_phase_times_are_the_runs_own(times: dict, eagle3: bool) -> None:
    """Measured from the run's own start, from its own log: in the order the server goes through
    them, nothing of the run before it."""
    assert "crashed" not in times and "exited" not in times and "no run" not in times, times
    assert ("capturing draft cuda graphs" in times) == eagle3, times
    seen = [p for p in PHASE_ORDER if p in times]
    assert {"loading weights", "ready"} <= set(seen), times
    assert [times[p] for p in seen] == sorted(times[p] for p in seen), times
    assert times["ready"] >= 1.0, times  # the fast demo takes seconds to ready, never 0


async def test_a_run_launched_from_another_terminal_is_followed_as_a_new_run(demo_env):
    """`cockpit launch demo --off eagle3 --yes` from another terminal: the open cockpit follows the
    new run within seconds (its process group, its ranks, its own log), never reads the old run's
    end as a crash of it, and agrees with `cockpit snapshot demo --json`; the ledger's phase times
    of the new run are its own."""
    import asyncio
    import json
    import sys

    args, layout, pgids = demo_env
    app, layout, state = demo_app(args, layout)
    verdicts: list[str] = []
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.cockpit.monitor.following is not None, 30)
        monitor = app.cockpit.monitor
        first = monitor.following
        pgids.append(first["pgid"])
        await until(pilot, lambda: app.cockpit.phase.name not in ("no run", "starting"), 60)
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "cockpit",
            "launch",
            "demo",
            "--layout",
            layout.path,
            "--off",
            "eagle3",
            "--yes",
            "--interval",
            "0.25",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 150)
        assert proc.returncode == 0, err.decode()[-2000:]
        assert ": ready" in out.decode()
        new = read_ledger(layout)[-1]
        pgids.append(new["pgid"])
        assert new["run_id"] != first["run_id"]
        monitor.subscribe(lambda e: verdicts.append(monitor.verdict.name.value) if e.kind == "verdict" else None)
        await until(
            pilot,
            lambda: (
                (monitor.following or {}).get("run_id") == new["run_id"]
                and app.cockpit.phase.name in ("ready", "serving")
                and monitor.verdict.name == "ok"
            ),
            8,
        )
        ranks = [p for p in app.state.ranks() if p.alive]
        assert len(ranks) == 8 and {p.pgid for p in ranks} == {new["pgid"]}
        assert list(app.state.logs) == [new["log"]]
        assert any(pt.listening and pt.pid is not None for pt in app.state.ports if pt.port in layout.ports)
        await pilot.pause(0.6)
        text = save_text(app, None)
        assert "crashed" not in text and "ranks gone" not in text, text
        assert "crashed" not in verdicts, verdicts
        snap = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "cockpit",
            "snapshot",
            "demo",
            "--layout",
            layout.path,
            "--json",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        doc = json.loads((await asyncio.wait_for(snap.communicate(), 60))[0])
        assert doc["log"]["path"] == new["log"] and doc["verdict"]["name"] == monitor.verdict.name.value
        await pilot.press("q")
    await end_demo(args, app, layout, state)
    assert group_members(pgids) == []
    assert_phase_times_are_the_runs_own(read_ledger(layout)[-1]["phase_times"], eagle3=False)


async def test_the_operators_kills_read_as_theirs_and_a_killed_run_is_no_run(demo_env, tmp_path):
    """`k` on one rank, confirmed: `stopped` (the rank stopped by the operator), never `crashed`,
    also once the kill's own window has closed and the server took its other ranks down. Then a
    launch, `K`, confirmed and verified gone: verdict and phase `no run`, no tokens/s of the dead run."""
    from cockpit.read.metrics import describe as describe_metrics
    from cockpit.ui.screens import ReportScreen

    args, layout, pgids = healthy_demo(demo_env, tmp_path)
    app, layout, state = demo_app(args, layout)
    verdicts: list[str] = []
    phases: list[str] = []
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.cockpit.monitor.following is not None, 30)
        monitor = app.cockpit.monitor
        pgids.append(monitor.following["pgid"])
        await until(pilot, lambda: app.cockpit.phase.name == "serving" and monitor.verdict.name == "ok", 90)
        monitor.subscribe(
            lambda e: (
                (verdicts.append(monitor.verdict.name.value), phases.append(monitor.phase.name))
                if e.kind in ("verdict", "sample")
                else None
            )
        )
        pid = next(p.pid for p in app.state.ranks() if p.rank == 3 and p.alive)
        app.cockpit.run_worker(app.cockpit.actions.kill(pid, f"kill pid {pid}"), group="action")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), 30)
        await pilot.press("y")
        await until(pilot, lambda: isinstance(app.screen, ReportScreen), 30)
        await pilot.press("escape")
        await until(pilot, lambda: app.state.ranks() and not any(p.alive for p in app.state.ranks()), 30)
        await pilot.pause(3.0)  # long after the kill's own window
        assert "crashed" not in verdicts and "crashed" not in phases, (verdicts, phases)
        assert monitor.verdict.name == "stopped" and monitor.phase.name == "stopped"
        text = save_text(app, None)
        assert "verdict stopped" in text and "rank 3 stopped by the operator" in text and "crashed" not in text, text

        # a run again, then K: no run
        from cockpit.actions.launch import launch
        from cockpit.runs.spec import default_spec

        with monitor.stopping_for("launching"):  # as a relaunch does
            monitor.new_run()
            monitor.follow(await launch(monitor.session, layout, default_spec(layout)))
        pgids.append(monitor.following["pgid"])
        try:
            await until(
                pilot,
                lambda: app.cockpit.phase.name == "serving" and "tok/s" in describe_metrics(app.state.metrics),
                90,
            )
        except AssertionError:
            raise AssertionError(
                (
                    app.cockpit.phase,
                    monitor.verdict,
                    describe_metrics(app.state.metrics),
                    list(app.state.logs),
                    save_text(app, None),
                )
            ) from None
        app.cockpit.action_kill_run()
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), 30)
        await pilot.press("y")
        await until(pilot, lambda: isinstance(app.screen, ReportScreen), 30)
        await pilot.press("escape")
        await until(pilot, lambda: app.cockpit.busy is None, 10)
        for _ in range(6):  # samples and metrics scrapes after the kill: the verdict stays `no run`
            await pilot.pause(0.5)
            assert monitor.verdict.name == "no run" and monitor.phase.name == "no run", (monitor.verdict, monitor.phase)
        text = save_text(app, None)
        assert "verdict no run" in text and "phase no run" in text and "tok/s" not in text, text
        await pilot.press("q")
    await end_demo(args, app, layout, state)
    assert group_members(pgids) == []


async def test_a_kill_from_another_terminal_reads_stopped_on_the_screen_and_in_the_ledger(demo_env, tmp_path):
    """`cockpit kill demo --yes` in a second terminal while the demo's screen watches: the screen
    reads the deaths as the operator's (`stopped`, then `no run`), never `crashed`; the ledger says
    who stopped the run, from where and when."""
    args, layout, pgids = healthy_demo(demo_env, tmp_path)
    app, layout, state = demo_app(args, layout)
    verdicts: list[str] = []
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.cockpit.monitor.following is not None, 30)
        monitor = app.cockpit.monitor
        pgids.append(monitor.following["pgid"])
        monitor.subscribe(lambda e: verdicts.append(monitor.verdict.name.value) if e.kind == "verdict" else None)
        await until(pilot, lambda: app.cockpit.phase.name == "serving", 90)
        await until(pilot, lambda: monitor.verdict.name.value == "ok", 30)
        # the live run's history: `cockpit runs` reads its current verdict, since when, for how long
        listed = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "cockpit",
            "runs",
            "--layout",
            layout.path,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(listed.communicate(), 60)
        live = out.decode()
        assert f"{monitor.following['run_id']}" in live and "now ok" in live, (live, err)
        assert re.search(r"\d\d:\d\d:\d\d ok for \d+ s so far", live) and "running for" in live, live
        killer = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "cockpit",
            "kill",
            "demo",
            "--layout",
            layout.path,
            "--yes",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(killer.communicate(), 90)
        assert killer.returncode == 0 and b"verified" in out, (out, err)
        await until(pilot, lambda: not any(p.alive for p in app.state.ranks()), 30)
        await until(pilot, lambda: monitor.verdict.name.value in ("stopped", "no run"), 20)
        await until(pilot, lambda: monitor.verdict.name.value == "no run", 30)  # the run is gone, said so
        assert "crashed" not in verdicts and "stopped" in verdicts, verdicts  # the screen said whose the deaths were
        assert verdicts.index("stopped") < verdicts.index("no run"), verdicts
        run = read_ledger(layout)[-1]
        assert run["stop"]["why"] == "cockpit kill: asked by the operator" and "@" in run["stop"]["by"]
        assert run["stop"]["processes"] and abs(run["stop"]["at"] - time.time()) < 120
        assert [h["verdict"] for h in run["verdicts"]][:1] == ["ok"] and run["verdicts"][-1]["verdict"] in (
            "stopped",
            "no run",
        ), run["verdicts"]  # each verdict of the run, in turn, with its time
        history = "\n".join(describe_ledger([run]))
        assert "stopped" in history and "by " in history and "cockpit kill: asked by the operator" in history, history
        await pilot.press("q")
    await end_demo(args, app, layout, state)
