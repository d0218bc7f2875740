"""The watched process tree with role, rank, state and GPU memory. Rows are updated cell by cell
(a full rebuild happens only when the set of rows changes); Enter collapses a subtree; a dead rank
stays, marked, with its exit code when known. `o` (or a click on a column's header) sorts the rows
by a column instead of the tree; the tree comes back after the last column."""

from __future__ import annotations

from rich.text import Text

from cockpit.common.hosttext import as_text, visible
from cockpit.host.state import HostState, Proc
from cockpit.ui.commands import RANK_TABLE, bindings
from cockpit.ui.fmt import NA, gib, mib
from cockpit.ui.table import LiveTable

COLUMNS = [
    ("process", 30),
    ("pid", 7),
    ("role", 11),
    ("rank", 4),
    ("st", 2),
    ("cpu%", 5),
    ("rss", 6),
    ("thr", 4),
    ("gpu", 3),
    ("gpu mem", 7),
]
NARROW = [("process", 20), ("pid", 7), ("rank", 4), ("st", 2), ("cpu%", 5), ("gpu", 3), ("gpu mem", 7)]
# What `o` cycles through: (column, the key of a Proc, largest first?)
SORTS = {
    "tree": None,
    "gpu mem": (lambda p: p.gpu_mem_mib or 0, True),
    "cpu%": (lambda p: p.cpu_pct if p.alive else -1, True),
    "rank": (lambda p: (p.rank is None, p.rank or 0), False),
    "pid": (lambda p: p.pid, False),
    "rss": (lambda p: p.rss_mib or 0, True),
    "thr": (lambda p: p.threads or 0, True),
    "st": (lambda p: p.status, False),
    "role": (lambda p: p.role or "~", False),
    "process": (lambda p: p.title, False),
    "gpu": (lambda p: (not p.gpus, p.gpus), False),
}
CYCLE = ["tree", "gpu mem", "cpu%", "rank", "pid"]
STATUS_STYLE = {"R": "green", "S": "default", "D": "yellow", "Z": "bold red", "T": "yellow", "X": "bold red"}


class RankTable(LiveTable):
    COLUMNS = COLUMNS
    BINDINGS = bindings(RANK_TABLE)

    def __init__(self, **kw):
        super().__init__(**kw)
        self.collapsed: set[int] = set()
        self.sort_by = "tree"
        self.reverse = False
        self.state: HostState | None = None
        self._subtitle: str | None = None
        self._title()

    def show(self, state: HostState, ports: str = "") -> None:
        """`ports`: the ports in a few words, when the screen is too narrow for their table."""
        self.state = state
        self.sync(self._rows(state))
        live = f"{sum(1 for p in state.procs.values() if p.alive)} live"
        subtitle = f"{ports}  {live}" if ports else live
        if subtitle != self._subtitle:  # setting it repaints the whole table, changed or not
            self._subtitle = subtitle
            self.border_subtitle = as_text(subtitle)

    def set_narrow(self, narrow: bool) -> None:
        self.narrow = narrow
        self.fit()

    def fit(self) -> None:
        """The columns for the pane's width (fewer when narrow), the process column taking what the
        others leave: a zoomed pane shows whole titles, not the narrow pane's cut ones."""
        columns = NARROW if getattr(self, "narrow", False) else COLUMNS
        others = sum(w + 2 for _, w in columns[1:])  # each cell has one cell of padding a side
        room = self.size.width - others - 2 - 2  # its own padding, and the vertical scrollbar
        name, least = columns[0]
        wanted = [(name, max(least, room))] + columns[1:]
        if wanted != getattr(self, "_visible_columns", None):
            self.set_columns(wanted)
            if self.state is not None:  # the rows again, in the new columns (a replay gets no new sample)
                self.sync(self._rows(self.state))

    def on_resize(self) -> None:
        self.fit()

    def selected_pid(self) -> int | None:
        key = self.selected_key()
        return int(key) if key and key.isdigit() else None

    def _title(self) -> None:
        order = "" if self.sort_by == "tree" else f" by {self.sort_by}{' ↑' if self.reverse else ''}"
        self.border_title = f"ranks{order}"

    def sort(self, column: str) -> None:
        """Rows by this column (a second time: the other way round); `tree` is the process tree."""
        if column not in SORTS:
            return
        self.reverse = column == self.sort_by and column != "tree" and not self.reverse
        self.sort_by = column
        self._title()
        if self.state is not None:
            self.show(self.state)

    def action_sort(self) -> None:
        """The next order of the cycle: the tree, gpu mem, cpu%, rank, pid, then the tree again."""
        at = CYCLE.index(self.sort_by) if self.sort_by in CYCLE else -1
        self.sort_by, self.reverse = CYCLE[(at + 1) % len(CYCLE)], False
        self._title()
        if self.state is not None:
            self.show(self.state)

    def on_data_table_header_selected(self, event) -> None:
        event.stop()
        self.sort(str(event.column_key.value))

    def _rows(self, state: HostState) -> list[tuple[str, list]]:
        if self.sort_by != "tree":
            key, largest_first = SORTS[self.sort_by]
            procs = sorted((p for _, p in state.tree()), key=key, reverse=largest_first != self.reverse)
            return [(str(p.pid), self._cells(0, p, False, self._title_width())) for p in procs]
        out = []
        hidden_below: int | None = None
        for depth, proc in state.tree():
            if hidden_below is not None and depth > hidden_below:
                continue
            hidden_below = depth if proc.pid in self.collapsed else None
            out.append((str(proc.pid), self._cells(depth, proc, proc.pid in self.collapsed, self._title_width())))
        return out

    def _title_width(self) -> int:
        columns = getattr(self, "_visible_columns", None)
        return columns[0][1] if columns else COLUMNS[0][1]

    @staticmethod
    def _cells(depth: int, p: Proc, collapsed: bool, width: int = 0) -> list:
        mark = "▸ " if collapsed else ""
        title = ("  " * depth) + ("└ " if depth else "") + mark + visible(p.title)  # host text: shown, never acted on
        exit_text = "" if p.alive else (f" exit {p.exit_code}" if p.exit_code is not None else " gone")
        room = max(4, width - len(exit_text)) if width else 0  # a dead rank's exit code is never cut off
        if room and len(title) > room:  # cut in the middle: the end names the rank (…_TP3) or the port
            keep = min(8, room // 3)
            title = title[: room - keep - 1] + "…" + title[-keep:]
        if not p.alive:
            name = Text(title, style="strike grey62") + Text(exit_text, style="bold red")
        else:
            name = Text(title, style="bold" if p.rank is not None else "")
        return [
            name,
            f"{p.node}:{p.node_pid}" if hasattr(p, "node") else str(p.pid),  # a run spanning nodes: node:pid
            p.role or "",
            "" if p.rank is None else str(p.rank),
            as_text(p.status, STATUS_STYLE.get(p.status, "default")),
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
