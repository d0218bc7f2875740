"""Ports: configured and discovered listeners, their owner, and the layout's HTTP endpoints as
probed from the host itself through the link (no curl needed there). One row per endpoint; the
layout's own ports come first, before the listeners the tree opened itself (torch.distributed's
store, NCCL bootstrap)."""

from __future__ import annotations

from rich.text import Text

from cockpit.common.hosttext import as_text
from cockpit.host.state import HostState
from cockpit.read.ras import port_label
from cockpit.ui.table import LiveTable

COLUMNS = [("port", 5), ("state", 6), ("pid", 7), ("endpoint", 16), ("http", 4), ("ms", 5)]
NARROW = [("port", 5), ("state", 6), ("endpoint", 9), ("http", 4)]


class PortsTable(LiveTable):
    COLUMNS = COLUMNS

    def __init__(self, **kw):
        super().__init__(**kw)
        self.border_title = "ports"
        self.probes: dict[tuple[int, str], dict] = {}
        self.configured: list[int] = []  # the layout's ports: listed first, whatever else the tree opens

    def _rows(self, state: HostState) -> list[tuple[str, list]]:
        rows = []
        for p in sorted(state.ports, key=lambda p: (p.port not in self.configured, p.port)):
            stat = Text("listen", style="bold green") if p.listening else Text("closed", style="grey50")
            probes = sorted((path, res) for (port, path), res in self.probes.items() if port == p.port)
            if not probes:
                label = port_label(p.port, state.ras) or ""  # NCCL's RAS service, where the ranks listen on it
                rows.append((f"{p.port}", [str(p.port), stat, str(p.pid or ""), label, "", ""]))
            for n, (path, res) in enumerate(probes):
                status = res.get("status")
                style = "green" if status and status < 400 else "red" if status else "grey50"
                http = as_text(str(status) if status else "—", style)
                ms = f"{res['ms']:.0f}" if status and res.get("ms") is not None else ""
                head = [str(p.port), stat, str(p.pid or "")] if n == 0 else ["", "", ""]
                rows.append((f"{p.port}{path}", head + [path, http, ms]))
        return rows

    def show(self, state: HostState) -> None:
        self.sync(self._rows(state))

    def summary(self, state: HostState) -> str:
        """The layout's ports in a few words, for a screen too narrow for this table."""
        parts = []
        for p in sorted(state.ports, key=lambda p: p.port):
            if self.configured and p.port not in self.configured:
                continue
            codes = [str(res.get("status") or "—") for (port, _), res in sorted(self.probes.items()) if port == p.port]
            parts.append(
                f":{p.port} {'listen' if p.listening else 'closed'}" + (f" http {','.join(codes)}" if codes else "")
            )
        return " · ".join(parts)

    def set_narrow(self, narrow: bool) -> None:
        self.set_columns(NARROW if narrow else COLUMNS)
