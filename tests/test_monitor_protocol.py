"""Every kind of monitor keeps the one protocol the screen, the fleet and the commands rely on
(cockpit/monitor/base.py: PROTOCOL): one host, a run spanning Slurm nodes, a recorded moment. A
replayed snapshot is a monitor like the others, not a missing one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cockpit.common.errors import CockpitError
from cockpit.host.session import SessionOptions
from cockpit.host.snapshot import state_from_doc
from cockpit.link.target import parse_target
from cockpit.monitor.base import PROTOCOL, Monitor
from cockpit.monitor.cluster import ClusterMonitor
from cockpit.monitor.host import HostMonitor
from cockpit.monitor.replay import ReplayMonitor
from cockpit.runs.layouts import resolve_layout
from cockpit.runs.run import Run

FIXTURES = Path(__file__).parent / "fixtures"


def kinds() -> list[Monitor]:
    layout = resolve_layout("demo")
    doc = json.loads((FIXTURES / "demo-serving.json").read_text())
    return [HostMonitor(parse_target("local"), SessionOptions(), layout),
            ClusterMonitor(parse_target("slurm:12345"), SessionOptions(), layout),
            ReplayMonitor(state_from_doc(doc), layout)]


@pytest.mark.parametrize("monitor", kinds(), ids=lambda m: type(m).__name__)
def test_every_kind_of_monitor_keeps_the_protocol(monitor):
    missing = [name for name in PROTOCOL if not hasattr(monitor, name)]
    assert missing == [], f"{type(monitor).__name__} lacks {missing}"
    assert isinstance(monitor, Monitor)
    assert isinstance(monitor.run, Run) and monitor.following is None
    events = []
    stop = monitor.subscribe(events.append)
    stop()
    run = Run(monitor.layout, {"run_id": "r-1", "pgid": 42, "start": 1.0}, "test")
    monitor.follow(run)  # the one writer of the run followed
    assert monitor.run is run and monitor.following["run_id"] == "r-1"
    monitor.follow(None)
    assert monitor.following is None and monitor.run.layout is monitor.layout


async def test_a_replayed_snapshot_is_a_monitor_with_nothing_to_act_on():
    doc = json.loads((FIXTURES / "demo-serving.json").read_text())
    monitor = ReplayMonitor(state_from_doc(doc), resolve_layout("demo"))
    assert not monitor.live and monitor.decided() and monitor.session is None
    assert monitor.verdict.name.value == doc["verdict"]["name"]
    async with monitor.attached():
        assert await monitor.look(None) >= 0
    with pytest.raises(CockpitError, match="no host to act on"):
        await monitor.stop(None, "test")
