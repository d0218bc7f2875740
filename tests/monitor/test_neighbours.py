"""One host, many servers: three simulated TP-2 servers of the same command on three ports. A run
is one server's process tree; its neighbours never count in its ranks, phase or verdict, and
after it ends the cockpit reads `no run` unless the layout's run (by the same rules) appears.
Real processes throughout; other servers of this machine may run beside them (asserted by pid)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

from conftest import free_port, run_cli
from simhost import end_session, gone, kill_groups, until, wait_for
from test_safety import json_tail, layout_file, session_procs, start_by_hand

from cockpit.agent import procs as agent_procs
from cockpit.host.session import SessionOptions, WatchList
from cockpit.judge.verdict import VerdictName
from cockpit.link.target import parse_target
from cockpit.monitor.host import HostMonitor
from cockpit.runs.layoutfile import load_layout


def three_servers(sim_state, tmp_path):
    """Three TP-2 servers of the same command, started by hand, each in its own session, on its
    own port and its own two GPUs."""
    out = []
    for n in range(3):
        port = free_port()
        out.append(
            (
                port,
                start_by_hand(
                    sim_state,
                    tmp_path,
                    port,
                    "--base-gpu-id",
                    str(2 * n),
                    "--sim-shm-dir",
                    str(tmp_path),
                    "--model-path",
                    f"/models/m{n}",
                ),
            )
        )
    return out


def watching(lay, sim_state) -> HostMonitor:
    return HostMonitor(
        parse_target("local"),
        SessionOptions(python=sys.executable, interval=0.25, sim_state=str(sim_state)),
        layout=lay,
        watch=WatchList.for_layout(lay),
        probe_every_s=0.25,
    )


async def test_a_layouts_run_is_its_own_tree_and_after_its_kill_no_run(sim_state, tmp_path, monkeypatch):
    """A layout names A's port: the monitor follows A's tree alone; B stopped leaves A's verdict as
    it was (no `crashed`, no `N of M ranks gone`); A killed with `cockpit kill --layout` leaves B's
    and C's processes untouched and reads `no run`, never a neighbour's run; a cold look too."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    servers = three_servers(sim_state, tmp_path)
    (port_a, a), (port_b, b), (port_c, c) = servers
    layout = layout_file(tmp_path, "a", port_a)
    monitor = watching(load_layout(str(layout)), sim_state)
    kept = None
    try:
        own = session_procs(a.pid)
        await monitor.open(kept=True)
        kept = asyncio.create_task(monitor.keep())
        await wait_for(
            lambda: monitor.phase.name in ("ready", "serving") and len(monitor.state.ranks()) == 2,
            90,
            "the monitor sees A up",
            lambda: (monitor.phase, monitor.verdict, monitor.state.ranks()),
        )
        assert set(monitor.state.procs) <= set(own), "only A's processes are watched"
        before = monitor.verdict.name
        assert before not in (VerdictName.CRASHED, VerdictName.NO_RUN), monitor.verdict
        end_session(b)
        await monitor.session.wait_samples(12)
        assert monitor.verdict.name not in (VerdictName.CRASHED, VerdictName.STOPPED), monitor.verdict
        assert monitor.phase.name in ("ready", "serving"), monitor.phase
        assert all(p.alive for p in monitor.state.ranks()) and len(monitor.state.ranks()) == 2
        theirs = session_procs(c.pid)
        res = await asyncio.to_thread(
            run_cli,
            "kill",
            "local",
            "--sim",
            str(sim_state),
            "--layout",
            str(layout),
            "--yes",
            "--json",
            timeout=120,
            env={"XDG_STATE_HOME": str(tmp_path / "state")},
        )
        assert res.returncode == 0 and json_tail(res.stdout)["verified"], (res.stdout, res.stderr)
        assert all(gone(p) for p in own) and not any(gone(p) for p in theirs)
        await wait_for(
            lambda: monitor.verdict.name == VerdictName.NO_RUN, 60, "no run", lambda: (monitor.phase, monitor.verdict)
        )
        await monitor.session.wait_samples(12)
        assert monitor.verdict.name == VerdictName.NO_RUN and monitor.phase.name == "no run", monitor.verdict
        alive = [(p.pid, p.ppid, p.cmdline[-8:]) for p in monitor.state.procs.values() if p.alive and p.status != "Z"]
        assert not alive, (
            f"C is never followed as the run: {alive} {dict(monitor.following or {})} {port_a} {port_c} {a.pid} {c.pid}"
        )
        res = await asyncio.to_thread(
            run_cli,
            "snapshot",
            "local",
            "--sim",
            str(sim_state),
            "--layout",
            str(layout),
            "--json",
            timeout=120,
            env={"XDG_STATE_HOME": str(tmp_path / "state")},
        )
        assert res.returncode == 0, res.stderr
        doc = json.loads(res.stdout)
        assert doc["verdict"]["name"] == "no run" and doc["phase"]["name"] == "no run", doc["verdict"]
        assert c.pid in [n["root"] for n in doc["neighbours"]], doc["neighbours"]
    finally:
        if kept is not None:
            kept.cancel()
        await monitor.close()
        kill_groups([s.pid for _, s in servers])
        for _, s in servers:
            s.wait(10)


async def test_no_layout_every_server_is_its_own_run_judged_alone(sim_state, tmp_path, monkeypatch):
    """No layout: each server is a run of its own, judged on its own tree. B's rank killed: B reads
    `crashed` while A and C, serving, do not; the host's verdict is no one run's. A cold look
    lists A and C in snapshot --json's `runs`, each with its own port, model, ranks, phase and
    verdict; B, gone, is not listed."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    servers = three_servers(sim_state, tmp_path)
    (port_a, a), (port_b, b), (port_c, c) = servers
    monitor = HostMonitor(
        parse_target("local"),
        SessionOptions(python=sys.executable, interval=0.25, sim_state=str(sim_state)),
        probe_every_s=0.25,
    )
    kept = None

    def judged(pid):
        return next((j for j in monitor.runs_judged() if j.server.root == pid), None)

    def said():
        return [
            (j.server.root, j.server.ports, j.phase.name, str(j.verdict), j.verdict.evidence[:2])
            for j in monitor.runs_judged()
        ]

    try:
        await monitor.open(kept=True)
        kept = asyncio.create_task(monitor.keep())
        assert monitor.several and monitor.following is None, "several servers: none followed"
        await wait_for(
            lambda: all(
                judged(s.pid) is not None and judged(s.pid).phase.name in ("ready", "serving") for s in (a, b, c)
            ),
            90,
            "each server judged up",
            said,
        )
        rank = next(p for p in session_procs(b.pid) if "TP1" in " ".join(agent_procs._read_cmdline(p)))
        os.kill(rank, signal.SIGKILL)  # B: one rank gone, then its server ends the rest: a crash of B's alone
        await wait_for(lambda: judged(b.pid).verdict.name == VerdictName.CRASHED, 60, "B crashed", said)
        await monitor.session.wait_samples(8)
        for s in (a, c):
            assert judged(s.pid).verdict.name not in (VerdictName.CRASHED, VerdictName.STOPPED), said()
            assert judged(s.pid).phase.name in ("ready", "serving"), said()
        assert monitor.verdict.name == VerdictName.NO_RUN and "each its own run" in monitor.verdict.evidence[0]
        res = await asyncio.to_thread(
            run_cli, "snapshot", "local", "--sim", str(sim_state), "--json", "--wait", "3", timeout=120
        )
        assert res.returncode == 0, res.stderr
        doc = json.loads(res.stdout)
        runs = {r["root"]: r for r in doc["runs"]}
        assert set(runs) == {a.pid, c.pid}, doc["runs"]  # the simulated host's own servers alone
        for n, (pid, port) in enumerate(((a.pid, port_a), (c.pid, port_c))):
            run = runs[pid]
            assert run["ports"] == [port] and run["tp_size"] == 2 and run["ranks"] == [0, 1], run
            assert run["user"] and run["model"] == f"/models/m{2 * n}", run
            assert run["phase"]["name"] in ("ready", "serving") and run["verdict"]["name"] != "crashed", run
        assert doc["verdict"]["name"] == "no run" and doc["neighbours"] == [], doc["verdict"]
    finally:
        if kept is not None:
            kept.cancel()
        await monitor.close()
        kill_groups([s.pid for _, s in servers])
        for _, s in servers:
            s.wait(10)


async def test_the_screen_lists_every_server_and_enter_follows_one(sim_state, tmp_path, monkeypatch):
    """No layout: the screen's runs list has a row per server; enter on B's row follows B alone
    (its ranks, its log, its verdict) and lists A and C as its neighbours."""
    from cockpit.ui.app import CockpitApp
    from cockpit.ui.runs import RunsTable

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    servers = three_servers(sim_state, tmp_path)
    (port_a, a), (port_b, b), (port_c, c) = servers
    monitor = HostMonitor(
        parse_target("local"),
        SessionOptions(python=sys.executable, interval=0.25, sim_state=str(sim_state)),
        probe_every_s=0.25,
    )
    app = CockpitApp(monitor=monitor)
    try:
        async with app.run_test(size=(200, 60)) as pilot:
            screen = app.screen
            table = screen.query_one(RunsTable)

            def listed() -> set[str]:
                return set(table._keys)

            await until(
                pilot,
                lambda: (
                    {str(a.pid), str(b.pid), str(c.pid)} <= listed()
                    and all(str(table.get_cell(str(s.pid), "ports")) == str(p) for p, s in servers)
                ),
                90,
            )
            assert not table.has_class("empty")
            table.focus()
            table.move_cursor(row=table._keys.index(str(b.pid)))
            await pilot.press("enter")
            own = set(session_procs(b.pid))
            await until(
                pilot,
                lambda: (
                    monitor.following is not None
                    and monitor.following.get("root") == b.pid
                    and monitor.state.procs
                    and set(p.pid for p in monitor.state.procs.values() if p.alive) <= own
                    and len(monitor.state.ranks()) == 2
                ),
                60,
            )
            await until(
                pilot,
                lambda: (
                    str(table.get_cell(str(b.pid), "verdict")).startswith("▶")
                    and str(table.get_cell(str(a.pid), "verdict")) == "neighbour"
                    and str(table.get_cell(str(c.pid), "verdict")) == "neighbour"
                ),
                60,
            )
            # B's log alone (a sample sent before the agent took the new watch may still carry another's)
            await until(pilot, lambda: list(monitor.state.logs) == [str(tmp_path / f"by-hand-{port_b}.log")], 30)
    finally:
        kill_groups([s.pid for _, s in servers])
        for _, s in servers:
            s.wait(10)


RANKS_OF_AN_UNTITLED_PARENT = """\
import multiprocessing as mp, setproctitle, time
def rank(n):
    setproctitle.setproctitle(f"VLLM::Worker_TP{n}")
    time.sleep(600)
if __name__ == "__main__":
    ranks = [mp.get_context("spawn").Process(target=rank, args=(n,)) for n in range(2)]
    for r in ranks:
        r.start()
    print("ready", flush=True)
    time.sleep(600)
"""


def test_ranks_spawned_by_a_parent_no_pattern_names_are_one_server_rooted_there(tmp_path):
    """A server whose own program no title pattern names (`python job.py serve`) spawns ranks
    titled `VLLM::Worker_TP<n>`: the host lists one server, rooted at that parent, never a server
    per rank."""
    from cockpit.agent import kill as agent_kill

    script = tmp_path / "job.py"
    script.write_text(RANKS_OF_AN_UNTITLED_PARENT)
    job = subprocess.Popen(
        [sys.executable, str(script), "serve"], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert job.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 30
        while True:
            found = [
                s
                for s in agent_kill.host_servers()["servers"]
                if any(m["pid"] in session_procs(job.pid) for m in s["members"])
            ]
            titles = [m["title"] for s in found for m in s["members"]]
            if sum("VLLM::Worker_TP" in t for t in titles) == 2 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert [s["root"] for s in found] == [job.pid], found
    finally:
        kill_groups([job.pid])
        job.wait(10)


async def test_a_simulated_host_lists_only_the_servers_started_into_it(sim_state, tmp_path):
    """An agent watching a simulated host lists as the host's servers only those started into
    its folder: a server of another simulated host on this machine (another test's, another
    cockpit's demo) is none of its runs or neighbours; the machine itself lists both."""
    from cockpit.agent import kill as agent_kill
    from cockpit.host.session import HostSession
    from cockpit.sim import fakenvml

    elsewhere = tmp_path / "elsewhere-sim"
    fakenvml.write_host(str(elsewhere), gpus=8, model="rtx-pro-6000", seed=12)
    (tmp_path / "ours").mkdir()
    (tmp_path / "theirs").mkdir()
    ours = start_by_hand(sim_state, tmp_path / "ours", free_port())
    theirs = start_by_hand(elsewhere, tmp_path / "theirs", free_port())
    session = HostSession(
        parse_target("local"),
        SessionOptions(python=sys.executable, interval=0.25, sim_state=str(sim_state)),
        WatchList(patterns=[]),
    )
    try:
        roots = {s["root"] for s in agent_kill.host_servers()["servers"]}
        assert {ours.pid, theirs.pid} <= roots, roots
        await session.connect()
        listed = [s["root"] for s in (await session.request("servers", timeout=60))["servers"]]
        assert listed == [ours.pid], (listed, ours.pid, theirs.pid)
    finally:
        await session.close()
        kill_groups([ours.pid, theirs.pid])
        ours.wait(10)
        theirs.wait(10)
