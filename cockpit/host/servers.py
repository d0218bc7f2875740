"""The servers on a host, each its own run: what the agent's `servers` command lists (every server's
process tree, any user's: cockpit/agent/kill.py `host_servers`), and a HostState narrowed to one
tree, so that a run is judged on its own processes, GPUs, ports and log alone, never with its
neighbours'."""

from __future__ import annotations

import copy
import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from cockpit.common.secrets import mask_text, mask_url
from cockpit.host.state import HostState, role_of


@dataclass
class Server:
    """One server's process tree on the host, as the agent listed it."""

    root: int
    root_start: int | None = None  # clock ticks since boot: with `root`, which tree this is
    uid: int | None = None
    user: str = "?"
    started: float | None = None  # host clock
    title: str = ""
    ports: list[int] = field(default_factory=list)
    port_named: int | None = None  # the port its command line names (`--port N`): its own, listening or not yet
    model: str | None = None
    tp_size: int | None = None
    pids: list[int] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)  # the TP ranks its processes' titles name
    log: str | None = None  # the file its server writes to, where the cockpit found it

    @property
    def key(self) -> tuple[int, int | None]:
        return (self.root, self.root_start)

    @property
    def own_ports(self) -> set[int]:
        """The ports it listens on and the one its command line names."""
        return set(self.ports) | ({self.port_named} if self.port_named is not None else set())

    def doc(self) -> dict[str, Any]:
        """The document's entry of this server (docs/snapshot-schema.md `runs`, `neighbours`)."""
        since = (
            dt.datetime.fromtimestamp(self.started, dt.timezone.utc).isoformat(timespec="seconds")
            if self.started
            else None
        )
        return {
            "root": self.root,
            "user": self.user,
            "uid": self.uid,
            "ports": list(self.ports),
            "model": self.model,
            "tp_size": self.tp_size if self.tp_size is not None else (len(self.ranks) or None),
            "ranks": list(self.ranks),
            "pids": list(self.pids),
            "title": self.title,
            "since": since,
            "log": self.log,
        }


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def servers_of(answer: Any) -> list[Server]:
    """The agent's `servers` answer, field by field (a hostile host's wrong types dropped, its
    command lines' secrets masked on arrival)."""
    out: list[Server] = []
    rows = answer.get("servers") if isinstance(answer, dict) else None
    for row in rows if isinstance(rows, list) else []:
        if not isinstance(row, dict) or _int(row.get("root")) is None:
            continue
        members = [m for m in row.get("members") or [] if isinstance(m, dict) and _int(m.get("pid")) is not None]
        ranks = []
        for m in members:
            title = m.get("title") if isinstance(m.get("title"), str) else ""
            name = m.get("name") if isinstance(m.get("name"), str) else ""
            _, rank = role_of(name, [title] if title else None)
            if rank is not None and m.get("status") != "Z":
                ranks.append(rank)
        started = row.get("started")
        out.append(
            Server(
                root=row["root"],
                root_start=_int(row.get("root_start")),
                uid=_int(row.get("uid")),
                user=str(row.get("user") or "?"),
                started=float(started) if isinstance(started, (int, float)) and not isinstance(started, bool) else None,
                title=mask_text(str(row.get("title") or "")[:400]),  # secrets never reach the screen or JSON
                ports=[p for p in row.get("ports") or [] if _int(p) is not None],
                port_named=_int(row.get("port_named")),
                model=mask_url(row["model"]) if isinstance(row.get("model"), str) else None,
                tp_size=_int(row.get("tp_size")),
                pids=[m["pid"] for m in members],
                ranks=sorted(ranks),
            )
        )
    return out


def tree_pids(state: HostState, roots: set[int] | list[int], known: set[int] | None = None) -> set[int]:
    """The processes of the state in these trees: the pids listed (`known`) and every process
    whose parent chain reaches one of them (a child born since the list was made)."""
    mine = set(known or ()) | set(roots)
    changed = True
    while changed:
        changed = False
        for pid, p in state.procs.items():
            if pid not in mine and p.ppid in mine:
                mine.add(pid)
                changed = True
    return {pid for pid in mine if pid in state.procs}


def tree_view(state: HostState, pids: set[int], log: str | None) -> HostState:
    """The state as one run sees it: its own processes, the GPUs they hold (or last held), the
    ports they listen on, its own log; the rest (the host's record, Xid events, the clock) shared.
    Judging this view, no process, GPU or line of another tree counts."""
    view = copy.copy(state)
    view.procs = {pid: p for pid, p in state.procs.items() if pid in pids}
    held = {i for p in view.procs.values() for i in (p.gpus or p.last_gpus)}
    view.gpus = {i: g for i, g in state.gpus.items() if i in held}
    view.ports = [pt for pt in state.ports if pt.pid in pids]
    view.logs = {log: state.logs[log]} if log and log in state.logs else {}
    view.generation = 0  # a neighbour's restart is no boundary of this run
    return view
