"""The watched process tree with role, rank, state and GPU memory. Rows are updated cell by cell
(a full rebuild happens only when the set of rows changes); Enter collapses a subtree; a dead rank
stays, marked, with its exit code when known."""

from __future__ import annotations

from rich.text import Text
from textual.binding import Binding

from cockpit.model import HostState, Proc
from cockpit.ui.fmt import NA, gib, mib
from cockpit.ui.table import LiveTable

COLUMNS = [("process", 30), ("pid", 7), ("role", 11), ("rank", 4), ("st", 2), ("cpu%", 5), ("rss", 6),
           ("thr", 4), ("gpu", 3), ("gpu mem", 7)]
STATUS_STYLE = {"R": "green", "S": "default", "D": "yellow", "Z": "bold red", "T": "yellow", "X": "bold red"}


class RankTable(LiveTable):
    COLUMNS = COLUMNS
    BINDINGS = [Binding("enter", "toggle_collapse", "Collapse", show=True)]

    def __init__(self, **kw):
        super().__init__(**kw)
        self.collapsed: set[int] = set()
        self.border_title = "ranks"

    def show(self, state: HostState) -> None:
        self.sync(self._rows(state))
        self.border_subtitle = f"{sum(1 for p in state.procs.values() if p.alive)} live"

    def selected_pid(self) -> int | None:
        key = self.selected_key()
        return int(key) if key else None

    def _rows(self, state: HostState) -> list[tuple[str, list]]:
        out = []
        hidden_below: int | None = None
        for depth, proc in state.tree():
            if hidden_below is not None and depth > hidden_below:
                continue
            hidden_below = depth if proc.pid in self.collapsed else None
            out.append((str(proc.pid), self._cells(depth, proc, proc.pid in self.collapsed)))
        return out

    @staticmethod
    def _cells(depth: int, p: Proc, collapsed: bool) -> list:
        mark = "▸ " if collapsed else ""
        title = ("  " * depth) + ("└ " if depth else "") + mark + p.title
        if not p.alive:
            exit_text = f" exit {p.exit_code}" if p.exit_code is not None else " gone"
            name = Text(title[:22], style="strike grey62") + Text(exit_text, style="bold red")
        else:
            name = Text(title, style="bold" if p.rank is not None else "")
        return [
            name,
            f"{p.node}:{p.node_pid}" if hasattr(p, "node") else str(p.pid),  # a run spanning nodes: node:pid
            p.role or "",
            "" if p.rank is None else str(p.rank),
            Text(p.status, style=STATUS_STYLE.get(p.status, "default")),
            f"{p.cpu_pct:5.1f}" if p.alive else "",
            mib(p.rss_mib) if p.alive else "",
            str(p.threads) if p.alive else "",
            ",".join(str(g) for g in p.gpus),
            gib(p.gpu_mem_mib) if p.gpu_mem_mib is not None else ("" if not p.gpus else NA),
        ]

    def action_toggle_collapse(self) -> None:
        pid = self.selected_pid()
        if pid is None:
            return
        self.collapsed.symmetric_difference_update({pid})
        self.screen.refresh_panes()
