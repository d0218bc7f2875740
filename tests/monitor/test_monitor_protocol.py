"""Every kind of monitor keeps the one protocol the screen, the fleet and the commands rely on
(cockpit/monitor/base.py: `Monitor`, a typing.Protocol that mypy holds each kind to in
tests/architecture/test_types.py): one host, a run spanning Slurm nodes, a recorded moment. A replayed snapshot
is a monitor like the others, not a missing one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cockpit.common.errors import CockpitError
from cockpit.host.session import SessionOptions
from cockpit.host.snapshot import state_from_doc
from cockpit.link.target import parse_target
from cockpit.monitor.base import Monitor
from cockpit.monitor.cluster import ClusterMonitor
from cockpit.monitor.host import HostMonitor
from cockpit.monitor.replay import ReplayMonitor
from cockpit.runs.layouts import resolve_layout
from cockpit.runs.ledger import ledger_path, read_ledger
from cockpit.runs.run import Run

FIXTURES = Path(__file__).parents[1] / "fixtures"


def kinds() -> list[Monitor]:
    layout = resolve_layout("demo")
    doc = json.loads((FIXTURES / "demo-serving.json").read_text())
    return [
        HostMonitor(parse_target("local"), SessionOptions(), layout),
        ClusterMonitor(parse_target("slurm:12345"), SessionOptions(), layout),
        ReplayMonitor(state_from_doc(doc), layout),
    ]


@pytest.mark.parametrize("monitor", kinds(), ids=lambda m: type(m).__name__)
def test_every_kind_of_monitor_follows_a_run_through_its_one_door(monitor):
    assert isinstance(monitor, Monitor)
    assert isinstance(monitor.run, Run) and monitor.following is None
    events = []
    stop = monitor.subscribe(events.append)
    stop()
    run = Run(monitor.layout, {"run_id": "r-1", "start": 1.0}, "test")
    monitor.follow(run)
    assert monitor.run is run and monitor.following["run_id"] == "r-1"
    with pytest.raises(TypeError):
        monitor.run.record["run_id"] = "r-2"  # a Run is frozen: what changes comes back as a new one
    monitor.follow(None)
    assert monitor.following is None and monitor.run.layout is monitor.layout


def test_the_door_sets_the_watch_and_notes_when_the_leader_was_seen(tmp_path, monkeypatch):
    """Following a launched run watches its process group and log alone (title patterns would
    find every server here); the leader's sighting the agent reported becomes the run's
    `seen_ticks`, written to the ledger only by a kept look."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    layout = resolve_layout("demo")
    monitor = HostMonitor(parse_target("local"), SessionOptions(), layout)
    rec = {"run_id": "r-7", "pgid": 4242, "start": 1.0, "log": "/tmp/r-7.log", "leader_seen_ticks": 99}
    monitor.follow(Run(layout, rec, "test"))
    assert monitor.session.watch.pgids == [4242] and monitor.session.watch.patterns == []
    assert monitor.session.watch.logs == ["/tmp/r-7.log"]
    assert monitor.following["seen_ticks"] == 99 and "leader_seen_ticks" not in monitor.following
    assert not ledger_path(layout).exists()  # a one-shot look writes nothing
    monitor.kept = True
    monitor.follow(Run(layout, rec, "test"))
    assert [r.get("seen_ticks") for r in read_ledger(layout)] == [99]


async def test_a_replayed_snapshot_is_a_monitor_with_nothing_to_act_on():
    doc = json.loads((FIXTURES / "demo-serving.json").read_text())
    monitor = ReplayMonitor(state_from_doc(doc), resolve_layout("demo"))
    assert not monitor.live and monitor.decided() and monitor.session is None
    assert monitor.verdict.name.value == doc["verdict"]["name"]
    async with monitor.attached():
        assert await monitor.look(None) >= 0
    with pytest.raises(CockpitError, match="no host to act on"):
        await monitor.stop(None, "test")
    from cockpit.runs.spec import RunSpec

    acts = {
        "plan_stop": monitor.plan_stop(),
        "shm_audit": monitor.shm_audit(),
        "shm_clean": monitor.shm_clean([]),
        "plan_dump": monitor.plan_dump(),
        "pyspy_check": monitor.pyspy_check(),
        "flight_record": monitor.flight_record(),
        "host_facts": monitor.host_facts(["versions"], []),
        "run_versions": monitor.run_versions(),
        "check_launch": monitor.check_launch(RunSpec()),
        "launch": monitor.launch(RunSpec()),
        "ras": monitor.ras(),
        "metrics_page": monitor.metrics_page(30000, "/metrics"),
        "flight_ranks": monitor.flight_ranks(),
        "flight_dump_raw": monitor.flight_dump_raw([1], False),
        "wait_samples": monitor.wait_samples(),
    }
    for act in acts.values():  # each refused in words, naming what to do instead
        with pytest.raises(CockpitError, match="a replayed snapshot .*: attach to the host itself"):
            await act
    with pytest.raises(CockpitError, match="a replayed snapshot .*: attach to the host itself"):
        monitor.pyspy_missing({})
    assert monitor.link_describe() is None


def test_a_job_stopped_whole_stays_no_run_while_its_nodes_still_send_samples():
    """`K` on a Slurm job: the stop is verified, the verdict is `no run`; a node whose agent still
    sends a sample before the job's end takes it down must not bring the dead run back (its dead
    ranks and its log's lines are history), as on one host."""
    from cockpit.monitor.cluster import Node

    layout = resolve_layout("demo")
    monitor = ClusterMonitor(parse_target("slurm:12345"), SessionOptions(), layout)
    node = Node(1, "n1", parse_target("slurm:12345/n1"))
    node.monitor = HostMonitor(node.target, SessionOptions(), layout)
    monitor.nodes = [node]
    st = node.monitor.state
    st.link_state = "up"
    st.apply({"t": "hello", "gpus": [{"index": 0, "mem_total_mib": 80000}]})
    ranks = [
        {
            "pid": 10 + r,
            "ppid": 1,
            "name": f"sglang::scheduler_TP{r}",
            "cmdline": [f"sglang::scheduler_TP{r}"],
            "status": "S",
            "cpu_pct": 1.0,
        }
        for r in range(2)
    ]
    st.apply({"t": "sample", "seq": 1, "procs": ranks, "gpus": [{"index": 0, "util_pct": 50}]})
    st.apply({"t": "log", "path": "/l", "lines": ["[2026 TP0] The server is fired up and ready to roll!"]})
    node.monitor.session.watch.logs = ["/l"]
    monitor.state.rebuild(monitor.nodes)
    monitor.update()
    assert monitor.phase.name == "ready"
    st.apply({"t": "sample", "seq": 2, "gone": [10, 11]})
    monitor.run_ended()
    assert monitor.verdict.name.value == "no run"
    st.apply({"t": "sample", "seq": 3})  # the node's agent, still up for a moment
    monitor.state.rebuild(monitor.nodes)
    monitor.update()
    assert (monitor.phase.name, monitor.verdict.name.value) == ("no run", "no run"), monitor.verdict
    st.apply(
        {
            "t": "log",
            "path": "/l",
            "lines": [  # the teardown's own lines, read after the kill's end
                "[2026 TP1] Rank 1 scheduler is dead. Please check if there are relevant logs.",
                "srun: error: n1: task 0: Killed",
            ],
        }
    )
    st.apply({"t": "sample", "seq": 4})
    monitor.state.rebuild(monitor.nodes)
    monitor.update()
    assert (monitor.phase.name, monitor.verdict.name.value) == ("no run", "no run"), monitor.verdict
    st.apply({"t": "sample", "seq": 5, "procs": ranks})  # a new run's ranks: judged again, by its own lines
    monitor.state.rebuild(monitor.nodes)
    monitor.update()
    assert monitor.verdict.name.value not in ("no run", "crashed"), monitor.verdict
    st.apply({"t": "log", "path": "/l", "lines": ["[2026 TP0] Load weight begin. avail mem=94 GB"]})
    st.apply({"t": "sample", "seq": 6})
    monitor.state.rebuild(monitor.nodes)
    monitor.update()
    assert monitor.phase.name == "loading weights" and monitor.verdict.name.value != "crashed", monitor.verdict
