"""Each kind of monitor is a `Monitor` (cockpit/monitor/base.py): mypy reads this file in
tests/architecture/test_types.py, so a kind that drifts from the protocol (a member missing, a signature
changed) fails the suite, not the screen that relies on it."""

from __future__ import annotations

from cockpit.monitor.base import Monitor
from cockpit.monitor.cluster import ClusterMonitor
from cockpit.monitor.host import HostMonitor
from cockpit.monitor.replay import ReplayMonitor


def every_kind(host: HostMonitor, cluster: ClusterMonitor, replay: ReplayMonitor) -> list[Monitor]:
    return [host, cluster, replay]
