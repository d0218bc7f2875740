"""The fleet screen: one row per host (link, a mini bar per GPU for utilization and memory, phase,
verdict, alerts), sortable and filterable; Enter opens that host's cockpit on the session the
fleet already holds, Escape comes back. Rows are redrawn from the hosts' states on a timer; no
key ever waits on a host."""

from __future__ import annotations

from rich.markup import escape
from rich.text import Text
from textual import on
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from cockpit.fleet import FleetWatch, Row
from cockpit.ui.app import CockpitScreen, SearchScreen
from cockpit.ui.fmt import SPARKS, level_style
from cockpit.ui.table import LiveTable

REDRAW_S = 0.5
PROBLEMS = ("crashed", "stalled-idle", "stalled-spinning", "slow")
SORTS = {
    "name": lambda r: r.name,
    "problems": lambda r: (not (r.verdict.startswith(PROBLEMS) or r.alerts or not r.reachable), r.name),
    "util": lambda r: (-r.util, r.name),
    "memory": lambda r: (-r.mem_share, r.name),
    "link": lambda r: (r.reachable, r.name),
}


def mini_bars(values: list[float | None]) -> Text:
    """One character per GPU, its height the value (0..1), its colour the level."""
    out = Text()
    for v in values:
        if v is None:
            out.append("·", style="grey35")
        else:
            v = min(1.0, max(0.0, v))
            out.append(SPARKS[int(v * (len(SPARKS) - 1) + 0.5)], style=level_style(v))
    return out


class FleetTable(LiveTable):
    COLUMNS = [("host", 18), ("link", 18), ("ms", 4), ("util/GPU", 9), ("mem/GPU", 9), ("phase", 18),
               ("verdict", 22), ("alerts", 44)]

    def show(self, rows: list[Row]) -> None:
        out = []
        for r in rows:
            link_style = "green" if r.reachable else "bold red" if r.link.startswith(("lost", "down")) else "yellow"
            util = mini_bars([None if u is None else u / 100 for u, _, _ in r.gpus])
            mem = mini_bars([None if m is None or not t else m / t for _, m, t in r.gpus])
            bad = r.verdict.startswith(PROBLEMS)
            alerts = "; ".join(r.alerts) or (r.error or "" if not r.reachable else "")
            out.append((r.name, [r.name, Text(r.link, style=link_style),
                                 f"{r.rtt_ms:.0f}" if r.rtt_ms is not None and r.reachable else "",
                                 util, mem, r.phase, Text(r.verdict, style="bold red" if bad else ""),
                                 Text(alerts, style="red" if r.alerts else "grey50")]))
        self.sync(out)


class FleetScreen(Screen):
    BINDINGS = [
        Binding("q", "app.quit", "Quit"),
        Binding("enter", "open", "Open host"),
        Binding("o", "sort", "Sort"),
        Binding("slash", "filter", "Filter"),
        Binding("colon", "app.command_palette", "Commands", show=False),
    ]

    def __init__(self, watch: FleetWatch, read_only: bool = False):
        super().__init__()
        self.watch = watch
        self.read_only = read_only
        self.sort = "problems"
        self.filter: str | None = None
        self.shown: list[Row] = []

    def compose(self) -> ComposeResult:
        yield Static(id="fleet-status")
        yield FleetTable(id="fleet")
        yield Footer()

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
            rows = [r for r in rows if needle in " ".join([r.name, r.link, r.phase, r.verdict, *r.alerts]).lower()]
        rows.sort(key=SORTS[self.sort])
        self.shown = rows
        self.table.show(rows)
        parts = [f"[b]fleet[/b] {len(self.watch.members)} hosts", f"[green]{up} up[/]",
                 f"[{'bold red' if up < len(self.watch.members) else 'default'}]{len(self.watch.members) - up} not up[/]",
                 f"{gpus} GPUs", f"[{'bold red' if bad else 'default'}]{bad} in trouble[/]", f"sort: {self.sort}"]
        if self.filter:
            parts.append(f"filter: {escape(self.filter)} ({len(rows)} shown)")
        self.status.update("  │  ".join(parts))

    def action_sort(self) -> None:
        names = list(SORTS)
        self.sort = names[(names.index(self.sort) + 1) % len(names)]
        self.redraw()

    def action_filter(self) -> None:
        def done(term: str | None) -> None:
            self.filter = term
            self.redraw()

        self.app.push_screen(SearchScreen(self.filter, "filter hosts by name, link, phase, verdict or alert"), done)

    @on(DataTable.RowSelected)
    def _selected(self, event: DataTable.RowSelected) -> None:
        self.action_open()

    def action_open(self) -> None:
        name = self.table.selected_key()
        member = next((m for m in self.watch.members if m.host.name == name), None)
        if member is None:
            return
        self.app.push_screen(CockpitScreen(session=member.session, layout=member.layout, owns_session=False,
                                           read_only=self.read_only))


class FleetApp(App):
    CSS_PATH = "cockpit.tcss"
    TITLE = "gpu-cockpit fleet"

    def __init__(self, watch: FleetWatch, read_only: bool = False):
        super().__init__()
        self.watch = watch
        self.fleet_screen = FleetScreen(watch, read_only)

    def get_default_screen(self) -> FleetScreen:
        return self.fleet_screen

    def on_mount(self) -> None:
        self.watch.start()

    async def on_unmount(self) -> None:
        await self.watch.close()
