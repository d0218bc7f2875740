"""The snapshot document of a monitor (its state, phase, verdict, the look's time, the stall's
forensics, how the host was reached) and the one-shot look that takes it: what `cockpit snapshot
--json`, the bundle and a fleet's rows print. The state's own document is host/snapshot.py's."""

from __future__ import annotations

from typing import Any

from cockpit.host.snapshot import LOG_LINES, snapshot_doc
from cockpit.monitor.base import Monitor


def monitor_doc(monitor: Monitor, log_lines: int = LOG_LINES) -> dict[str, Any]:
    """The document of a live host, with its monitor's phase and verdict."""
    doc = snapshot_doc(monitor.state, log_lines, verdict=monitor.verdict, phase=monitor.phase)
    doc["looked_s"] = monitor.looked_s
    found = monitor.forensics
    doc["forensics"] = found.doc() if found is not None else None
    link = monitor.link_describe()
    if link is not None:  # a container or a Slurm node: how it was reached, whose pids (docs/targets.md)
        doc["link"] = link
    runs = getattr(monitor, "runs_doc", None)
    if runs is not None:  # the host's servers: each its own run, or the run followed and its neighbours
        doc.update(runs())
    extra = getattr(monitor, "doc_extra", None)
    if extra is not None:  # a run spanning nodes: its nodes (cockpit/monitor/cluster.py)
        doc.update(extra())
    return doc


async def take_snapshot(monitor: Monitor, wait: float | None = None) -> dict[str, Any]:
    """Connect, let the agent sample (its first sample measures CPU % from the agent's start),
    take the monitor's one-shot look (`HostMonitor.look`: until decided, or `wait` seconds), and
    return the document."""
    async with monitor.attached():
        await monitor.look(wait)
        return monitor_doc(monitor)
