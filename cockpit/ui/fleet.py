"""The fleet screen: one row per host (link, a mini bar per GPU for utilization and memory, phase,
verdict, alerts), sortable and filterable; Enter opens that host's cockpit on the monitor the
fleet already holds (one connection, one verdict), Escape comes back. Rows are redrawn from the
hosts' states on a timer; no key ever waits on a host."""

from __future__ import annotations

import gc

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import on
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.geometry import Region, Size
from textual.message import Message
from textual.screen import Screen
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widgets import Static

from cockpit.common.hosttext import count, visible
from cockpit.judge.verdict import ALERTING
from cockpit.monitor.fleet import FleetMonitor, Row
from cockpit.ui.cockpit import CockpitScreen
from cockpit.ui.commands import FLEET, bindings, key_rows
from cockpit.ui.fmt import SPARKS, level_style
from cockpit.ui.footer import FittedFooter
from cockpit.ui.screens import HelpScreen, SearchScreen

FLEET_ABOUT = """
Each row: the link and round-trip time, one bar per GPU for utilization and one for memory (its
height the value, red from 90 %), the run's phase and verdict with the host's layout, and alerts:
a stall or crash, a GPU at 85 °C or more, ECC errors, hardware or thermal throttling, no GPUs,
the agent's warning, or why the host cannot be reached. A host that is down is retried with
backoff; none waits on another. The columns are as wide as what they hold; the alerts take the rest.
"""


def fleet_help() -> str:
    """The fleet's help as markup: its keys from its command table, then what a row says."""
    rows = [("[b]↑ ↓[/b] pgup pgdn", "move between hosts")] + key_rows(FLEET)
    width = max(len(Text.from_markup(keys).plain) for keys, _ in rows) + 2
    lines = [f"  {keys}{' ' * (width - len(Text.from_markup(keys).plain))}{what}" for keys, what in rows]
    return "[b]gpu-cockpit fleet[/b] — keys\n\n" + "\n".join(lines) + "\n" + FLEET_ABOUT


REDRAW_S = 0.5
HEAP_SETTLE_S = 15.0
PROBLEMS = tuple(v.value for v in ALERTING)
SORTS = {
    "name": lambda r: r.name,
    "problems": lambda r: (not (r.verdict.startswith(PROBLEMS) or r.alerts or not r.reachable), r.name),
    "util": lambda r: (-r.util, r.name),
    "memory": lambda r: (-r.mem_share, r.name),
    "link": lambda r: (r.reachable, r.name),
}


def mini_bars(values: list[float | None]) -> list[Segment]:
    """One character per GPU, its height the value (0..1), its colour the level."""
    out = []
    for v in values:
        if v is None:
            out.append(Segment("·", NA_STYLE))
        else:
            v = min(1.0, max(0.0, v))
            out.append(Segment(SPARKS[int(v * (len(SPARKS) - 1) + 0.5)], LEVEL[level_style(v)]))
    return out


NA_STYLE = Style(color="grey35")
LEVEL = {name: Style(color=name) for name in ("green", "yellow", "red", "grey50")}
RED, BOLD_RED, GREEN, YELLOW, DIM = (
    Style(color="red"),
    Style(color="red", bold=True),
    Style(color="green"),
    Style(color="yellow"),
    Style(color="grey50"),
)
HEADER = Style(bold=True)
CURSOR_BLURRED = Style(bgcolor="grey23")
CURSOR = Style(bgcolor="#264f78")  # a background, not reverse: the bars keep their colours
COLUMNS = ["host", "link", "ms", "util/GPU", "mem/GPU", "phase", "verdict", "alerts"]
LEAST = {"host": 8, "link": 6, "ms": 4, "util/GPU": 9, "mem/GPU": 8, "phase": 10, "verdict": 12, "alerts": 12}
SHRINKS = ("alerts", "phase", "verdict", "link", "host")  # what gives way first on a narrow screen, in turn


def cell_widths(row: list[list[Segment]]) -> list[int]:
    """What each of a row's cells needs, one space after it included."""
    return [sum(len(s.text) for s in cell) + 1 for cell in row]


def fit_widths(wants: list[list[int]], width: int) -> list[int]:
    """Each column as wide as what it holds (one space between columns), the alerts taking what is
    left; on a narrow screen the widest of the columns that can give way narrows first, never
    below its least width."""
    want = [len(name) + 1 for name in COLUMNS]
    for row in wants:
        want = [max(a, b) for a, b in zip(want, row)]
    widths = [max(LEAST[name], w) for name, w in zip(COLUMNS, want)]
    over = sum(widths) - width
    shrinkable = [COLUMNS.index(name) for name in SHRINKS]
    while over > 0:
        i = max(shrinkable, key=lambda k: widths[k] - LEAST[COLUMNS[k]])
        if widths[i] <= LEAST[COLUMNS[i]]:
            break
        widths[i] -= 1
        over -= 1
    if over < 0:
        widths[-1] -= over  # the alerts column takes the rest
    return widths


def _cell(segments: list[Segment], width: int) -> list[Segment]:
    """Exactly `width` cells: cut or padded, one space between columns."""
    strip = Strip(segments).crop(0, max(0, width - 1)).extend_cell_length(width)
    return list(strip)


class FleetTable(ScrollView, can_focus=True):
    """A row per host, drawn with the line API: only the rows on screen are built, a row's cells
    are built again only when what it shows changed, and a redraw repaints only the lines whose
    row changed (or moved). At 64 hosts a DataTable re-rendered every row on each cell update
    (~90 ms), which is what a key then waited for; rebuilding every row's cells and repainting the
    whole table twice a second was, later, most of the fleet's CPU."""

    BINDINGS = [
        Binding("up", "move(-1)", show=False),
        Binding("down", "move(1)", show=False),
        Binding("pageup", "move(-10)", show=False),
        Binding("pagedown", "move(10)", show=False),
        Binding("home", "move(-100000)", show=False),
        Binding("end", "move(100000)", show=False),
    ]

    class Selected(Message):
        def __init__(self, name: str):
            super().__init__()
            self.name = name

    def __init__(self, **kw):
        super().__init__(**kw)
        self.rows: list[Row] = []
        self.cursor = 0
        self._strips: dict[str, tuple[tuple, tuple, Strip]] = {}
        self._cells_of: dict[str, tuple[tuple, list[list[Segment]], list[int]]] = {}  # name -> (sig, cells, widths)
        self._widths: tuple = ()
        self._lines: list[tuple] = []  # what each line of the table showed at the last redraw

    def show(self, rows: list[Row]) -> None:
        selected = self.selected_key()
        self.rows = rows
        names = [r.name for r in rows]
        self.cursor = names.index(selected) if selected in names else min(self.cursor, max(0, len(rows) - 1))
        widths = self._widths
        self._fit()
        self.virtual_size = Size(self.size.width, len(rows) + 1)
        lines = [(r.name, self._sig(r), i == self.cursor) for i, r in enumerate(rows)]
        old, self._lines = self._lines, lines
        if widths != self._widths or len(old) != len(lines):
            self.refresh()
            return
        top, height = self.scroll_offset.y, self.size.height
        for i, (was, now) in enumerate(zip(old, lines)):
            if was != now and top <= i + 1 < top + height:
                self.refresh_lines(i + 1)

    @staticmethod
    def _sig(row: Row) -> tuple:
        """What a row shows: its cells are built again only when this changed."""
        return (
            row.name,
            row.link,
            row.error,
            None if row.rtt_ms is None else round(row.rtt_ms),
            tuple(row.gpus),
            row.phase,
            row.verdict,
            tuple(row.alerts),
        )

    def _row_cells(self, row: Row) -> list[list[Segment]]:
        sig = self._sig(row)
        cached = self._cells_of.get(row.name)
        if cached is not None and cached[0] == sig:
            return cached[1]
        cells = self._cells(row)
        self._cells_of[row.name] = (sig, cells, cell_widths(cells))
        return cells

    def selected_key(self) -> str | None:
        return self.rows[self.cursor].name if 0 <= self.cursor < len(self.rows) else None

    def action_move(self, delta: int) -> None:
        if self.rows:
            self.cursor = min(len(self.rows) - 1, max(0, self.cursor + delta))
            self.scroll_to_region(Region(0, self.cursor + 1, 1, 1), animate=False, immediate=True)
            self.refresh()

    def on_click(self, event) -> None:
        index = event.y + self.scroll_offset.y - 1
        if 0 <= index < len(self.rows):
            self.cursor = index
            self.refresh()
            if event.chain == 2:
                self.post_message(self.Selected(self.rows[index].name))

    def _fit(self) -> None:
        """The columns' widths, from each row's cell widths (kept with its cells)."""
        for r in self.rows:
            self._row_cells(r)
        wants = [self._cells_of[r.name][2] for r in self.rows]
        self._widths = tuple(fit_widths(wants, self.scrollable_content_region.width))
        if len(self._cells_of) > 2 * len(self.rows):  # hosts filtered out or gone: what they held
            shown = {r.name for r in self.rows}
            self._cells_of = {k: v for k, v in self._cells_of.items() if k in shown}

    def on_resize(self) -> None:
        self._fit()
        self.refresh()

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        if len(self._widths) != len(COLUMNS):
            self._fit()
        if y == 0:
            return self._line([[Segment(name, HEADER)] for name in COLUMNS], width)
        index = self.scroll_offset.y + y - 1
        if index >= len(self.rows):
            return Strip.blank(width, self.rich_style)
        row = self.rows[index]
        sig = (self._sig(row), index == self.cursor)
        cached = self._strips.get(row.name)
        if cached is not None and cached[0] == sig and cached[1] == (width, self._widths):
            return cached[2]
        strip = self._line(self._row_cells(row), width)
        if index == self.cursor:
            over = CURSOR if self.has_focus else CURSOR_BLURRED  # laid over each cell's own style
            strip = Strip(
                [Segment(seg.text, (seg.style or Style()) + over, seg.control) for seg in strip], strip.cell_length
            )
        self._strips[row.name] = (sig, (width, self._widths), strip)
        return strip

    def _line(self, cells: list[list[Segment]], width: int) -> Strip:
        out: list[Segment] = []
        for w, cell in zip(self._widths, cells):
            out += _cell(cell, w)
        return Strip(out).crop(0, width).extend_cell_length(width).apply_style(self.rich_style)

    @staticmethod
    def _cells(r: Row) -> list[list[Segment]]:
        """A row's cells; every text in it came from the fleet file or the host (a name, a link
        error, a warning, evidence): written as segments (never markup), control characters visible."""
        link_style = GREEN if r.reachable else BOLD_RED if r.link.startswith(("lost", "down")) else YELLOW
        bad = r.verdict.startswith(PROBLEMS)
        alerts = "; ".join(r.alerts) or ((r.error or "") if not r.reachable else "")
        return [
            [Segment(visible(r.name))],
            [Segment(visible(r.link), link_style)],
            [Segment(f"{r.rtt_ms:.0f}" if r.rtt_ms is not None and r.reachable else "")],
            mini_bars([None if u is None else u / 100 for u, _, _ in r.gpus]),
            mini_bars([None if m is None or not t else m / t for _, m, t in r.gpus]),
            [Segment(visible(r.phase))],
            [Segment(visible(r.verdict), BOLD_RED if bad else None)],
            [Segment(visible(alerts), RED if r.alerts else DIM)],
        ]

    def on_focus(self) -> None:
        self._strips.clear()
        self.refresh()

    def on_blur(self) -> None:
        self._strips.clear()
        self.refresh()


class FleetScreen(Screen):
    BINDINGS = bindings(FLEET)

    def __init__(self, watch: FleetMonitor, read_only: bool = False):
        super().__init__()
        self.watch = watch
        self.read_only = read_only
        self.sort = "problems"
        self.filter: str | None = None
        self.shown: list[Row] = []
        self._status_shown = ""

    def compose(self) -> ComposeResult:
        yield Static(id="fleet-status")
        yield FleetTable(id="fleet")
        yield FittedFooter()

    def on_mount(self) -> None:
        self.table = self.query_one(FleetTable)
        self.status = self.query_one("#fleet-status", Static)
        self.set_interval(REDRAW_S, self.redraw)
        self.redraw()
        self.table.focus()

    def redraw(self) -> None:
        rows = self.watch.rows()
        up = sum(r.reachable for r in rows)
        bad = sum(1 for r in rows if r.verdict.startswith(PROBLEMS))
        gpus = sum(len(r.gpus) for r in rows)
        if self.filter:
            needle = self.filter.lower()
            rows = [
                r for r in rows if needle in visible(" ".join([r.name, r.link, r.phase, r.verdict, *r.alerts])).lower()
            ]
        rows.sort(key=SORTS[self.sort])
        self.shown = rows
        self.table.show(rows)
        n = len(self.watch.members)
        parts = [
            Text.assemble(("fleet", "bold"), f" {count(n, 'host')}"),
            Text(f"{up} up", "green"),
            Text(f"{n - up} not up", "bold red" if up < n else ""),
            Text(f"{gpus} GPUs"),
            Text(f"{bad} in trouble", "bold red" if bad else ""),
            Text(f"sort: {self.sort}"),
        ]
        if self.filter:
            parts.append(Text(f"filter: {visible(self.filter)} ({len(rows)} shown)"))  # typed, maybe pasted: text
        status = Text("  │  ").join(parts)
        if status.markup != self._status_shown:  # an update lays the screen out: only when the line changed
            self._status_shown = status.markup
            self.status.update(status)

    def action_help(self) -> None:
        self.app.push_screen(HelpScreen(fleet_help()))

    def action_sort(self) -> None:
        names = list(SORTS)
        self.sort = names[(names.index(self.sort) + 1) % len(names)]
        self.redraw()

    def action_filter(self) -> None:
        def done(term: str | None) -> None:
            self.filter = term
            self.redraw()

        self.app.push_screen(SearchScreen(self.filter, "filter hosts by name, link, phase, verdict or alert"), done)

    @on(FleetTable.Selected)
    def _selected(self, event: FleetTable.Selected) -> None:
        self.action_open()

    def action_open(self) -> None:
        name = self.table.selected_key()
        member = next((m for m in self.watch.members if m.host.name == name), None)
        if member is None:
            return
        member.monitor.forensics_on = not self.read_only and bool(
            member.monitor.layout and member.monitor.layout.auto_dump
        )
        self.app.push_screen(CockpitScreen(monitor=member.monitor, owns_monitor=False, read_only=self.read_only))


def settle_heap() -> None:
    """Once the screen is built and the hosts are connected, what exists is what lives: collect,
    then move it out of the collector's sight (gc.freeze), so later full passes walk only what is
    new. At 64 hosts the longest pass went from 180 ms to under 52 ms (docs/BENCHMARKS.md)."""
    gc.collect()
    gc.freeze()


class HeapSettler:
    """Settles the heap HEAP_SETTLE_S after the start, then, checked each HEAP_SETTLE_S, again once
    an eighth of the fleet more came up since, and a last time when no host is left to wait for:
    at 256 hosts on a starved machine most connect after the first settling, and what they built
    (sessions, states, history) was left for every full pass to walk. Each settling is a full pass
    itself, so not one per host trickling in."""

    def __init__(self, watch: FleetMonitor):
        self.watch = watch
        self.settled_at = -1  # hosts up at the last settling

    def __call__(self) -> bool:
        """Settle if it is due; False once there is no host left to wait for."""
        members = self.watch.members
        up = sum(1 for m in members if m.state.seq > 0)
        waiting = not all(m.state.seq > 0 or m.tried.is_set() for m in members)
        step = max(1, len(members) // 8)
        if self.settled_at < 0 or up >= self.settled_at + step or (not waiting and up > self.settled_at):
            self.settled_at = up
            settle_heap()
        return waiting


class FleetApp(App):
    CSS_PATH = "cockpit.tcss"
    TITLE = "gpu-cockpit fleet"

    def __init__(self, watch: FleetMonitor, read_only: bool = False):
        super().__init__()
        self.watch = watch
        self.fleet_screen = FleetScreen(watch, read_only)

    def get_default_screen(self) -> FleetScreen:
        return self.fleet_screen

    def get_system_commands(self, screen):
        from cockpit.ui.app import cockpit_commands

        yield from cockpit_commands(screen)  # a host's cockpit opened from the fleet: its actions
        yield from super().get_system_commands(screen)

    def on_mount(self) -> None:
        self.watch.start()
        settler = HeapSettler(self.watch)

        def settle() -> None:
            if not settler():
                timer.stop()

        timer = self.set_interval(HEAP_SETTLE_S, settle)

    async def on_unmount(self) -> None:
        await self.watch.close()
