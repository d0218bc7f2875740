"""The cockpit screen: status line, a pane per GPU, the rank tree, ports and the log.

It renders one HostMonitor and dispatches keys; the monitor owns the session, the verdict and the
probes, and the action workflows live in ui/actions.py. Frames only mark the screen dirty (or
append classified log lines), and a timer redraws at most a few times a second, so nothing on the
screen waits on the network."""

from __future__ import annotations

import asyncio
import time

from textual import work
from textual.app import ComposeResult
from textual.containers import Grid, Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Static

from cockpit.common.errors import CockpitError, UnknownHostKey
from cockpit.common.hosttext import as_text
from cockpit.host.state import HostState
from cockpit.judge.verdict import Phase, Verdict
from cockpit.monitor.base import LinkView, Monitor, MonitorEvent
from cockpit.monitor.replay import ReplayMonitor
from cockpit.operate.acts import ACT, ACTS
from cockpit.runs.config import Layout
from cockpit.ui.actions import ActionRunner
from cockpit.ui.commands import COCKPIT, RANK_TABLE, bindings
from cockpit.ui.fmt import say
from cockpit.ui.footer import FittedFooter
from cockpit.ui.gpus import GpuList, GpuPane
from cockpit.ui.header import FULL, header_text
from cockpit.ui.logview import LogView
from cockpit.ui.ports import PortsTable
from cockpit.ui.ranks import RankTable
from cockpit.ui.runs import RunsTable
from cockpit.ui.screens import ConfirmScreen, HelpScreen, ReportScreen, SearchScreen, help_renderable

REDRAW_S = 0.25
HEADER_S = 1.0 + REDRAW_S  # the header (its age, an action's progress) is drawn at least this often: a tick
# more than a 1 s refresh, so a sample a little late is not preceded by a header-only repaint
NARROW = 100  # below this many columns the rank table's columns narrow and the footer is compact
TOAST_S = 5  # notifications are short; what lasts is in the header


class GpuView(Vertical, can_focus=True):
    """The GPUs: panes on a large screen, a line each on a smaller one; zoomed (z), the panes."""

    ALLOW_MAXIMIZE = True


class CockpitScreen(Screen):
    """One host's cockpit. Standalone it owns its monitor; opened from the fleet it shows the
    fleet's live monitor of that host (no second connection, the same verdict) and Escape goes back.
    Without a monitor it renders a recorded HostState (a replayed snapshot)."""

    # The footer shows these in this order, cut at the terminal's width: help, quit, then the
    # actions of the operator story first, then the view's keys. `?` lists every one.
    BINDINGS = bindings(COCKPIT)
    ALLOW_IN_MAXIMIZED_VIEW = "#status, FittedFooter"

    def __init__(
        self,
        monitor: Monitor | None = None,
        state: HostState | None = None,
        layout: Layout | None = None,
        read_only: bool = False,
        owns_monitor: bool = True,
        ask_host_keys: bool = False,
    ):
        """`monitor` watches a host (or a run spanning nodes); without one, `state` is a recorded
        moment, watched through a ReplayMonitor. `ask_host_keys`: an operator is at this screen,
        so a host key no known_hosts file lists is asked about as ssh asks (headless, refused)."""
        super().__init__()
        self.ask_host_keys = ask_host_keys
        self.declined: str | None = None  # the host key the operator said no to: quit, nothing recorded
        self.monitor = monitor if monitor is not None else ReplayMonitor(state, layout)
        self.owns_monitor = owns_monitor
        self.state = self.monitor.state
        self.profile = self.monitor.layout
        self.read_only = read_only
        if read_only:
            self.monitor.forensics_on = False  # watch only: not even py-spy attaches
        self.actions = ActionRunner(self)
        self.dirty = True
        self.ready = asyncio.Event()
        self.error: str | None = None
        self._log_path: str | None = None
        self._gpu_count: int | str = -1  # the GPUs drawn, or what was said of none
        self._status_text = ""
        self._status_lines = 0
        self._status_at = 0.0
        self._link_seen: tuple | None = None
        self._unsubscribe = None
        self._opened_seq: int | None = None  # the sample count when the monitor was open (its run found)

    @property
    def link(self) -> LinkView | None:
        return self.monitor.link()

    @property
    def phase(self) -> Phase:
        return self.monitor.phase

    @property
    def verdict(self) -> Verdict:
        return self.monitor.verdict

    @property
    def busy(self) -> str | None:
        return self.actions.busy

    # ------------------------------------------------------------------ layout

    def compose(self) -> ComposeResult:
        yield Static(id="status")
        with GpuView(id="gpuview"):
            yield Grid(id="gpus")
            yield GpuList(id="gpu-list")
        with Horizontal(id="middle"):
            yield RankTable(id="ranks")
            yield PortsTable(id="ports")
            yield RunsTable(id="runs", classes="empty")
        yield LogView(id="log")
        yield FittedFooter()

    def on_mount(self) -> None:
        # Kept, not queried: a modal screen on top must not hide the cockpit's widgets from updates.
        self.view = self.query_one(LogView)
        self.ranks = self.query_one(RankTable)
        self.ports = self.query_one(PortsTable)
        self.runs = self.query_one(RunsTable)
        self.ports.configured = list(self.profile.ports) if self.profile else []
        self.status = self.query_one("#status", Static)
        self.grid = self.query_one("#gpus", Grid)
        self.gpu_list = self.query_one(GpuList)
        self.footer = self.query_one(FittedFooter)
        self.panes: list[GpuPane] = []
        self._fit()
        self.set_interval(REDRAW_S, self._tick)
        self.ports.probes = self.monitor.probes
        self._unsubscribe = self.monitor.subscribe(self._on_event)
        if self.monitor.live:
            self.connect()
        else:
            self._sync_log(full=True)
            self.refresh_panes()
            self.ready.set()
        self.ranks.focus()

    def on_resize(self, event) -> None:
        if hasattr(self, "footer"):
            self._fit()

    def on_fitted_footer_fitted(self, event) -> None:
        """The header's hints name only keys the footer shows: drawn again when those change."""
        self._status()

    def _fit(self) -> None:
        """The layout for the terminal's size: GPU panes or a line per GPU (two to a line when
        short), narrower rank columns and a compact footer on a narrow screen."""
        width, height = self.size
        compact = width < FULL[0] or height < FULL[1]
        self.set_class(compact, "compact")
        self._size_gpus()
        self.set_class(width < NARROW, "narrow")  # the ports' table gives way: a summary under the ranks
        self.ranks.set_narrow(compact)
        self.ports.set_narrow(compact)
        self.footer.compact = width < FULL[0]
        self.footer.show_command_palette = width >= FULL[0]
        self.dirty = True

    # ------------------------------------------------------------------ data

    @work(exclusive=True, group="connect")
    async def connect(self) -> None:
        """Open the monitor, then keep it (the session reconnects with backoff; the screen only
        shows where it stands). A fleet's monitor is already open and kept."""
        if not self.owns_monitor:
            self._opened_seq = self.state.seq
            self.refresh_bindings()
            return
        try:
            while True:
                try:
                    await self.monitor.open(kept=True)
                    break
                except UnknownHostKey as exc:
                    if not self.ask_host_keys:
                        raise
                    title, lines = exc.question()
                    if not await self.app.push_screen_wait(
                        ConfirmScreen(title, lines, "Are you sure you want to continue connecting?")
                    ):
                        self.declined = (
                            f"the host key of {exc.label} ({exc.key_type} {exc.fingerprint}) was not "
                            f"recorded; nothing done"
                        )
                        self.app.exit()
                        return
                    say(self, exc.record(), timeout=TOAST_S)  # then connect again: the next hop's key may be new
        except CockpitError as exc:
            self.error = str(exc)
            self.state.link_state = "failed"
            self._gpu_count = -1  # the GPU area says why there is nothing
            self.notify("cannot connect: see the header", severity="error", timeout=TOAST_S)
            self.dirty = True
            self.ready.set()
            return
        self._opened_seq = self.state.seq  # ready once a sample judged after the run was found
        self.refresh_bindings()
        await self.monitor.keep()

    @property
    def link_error(self) -> str | None:
        link = self.link
        return link.error if link is not None else None

    def _on_event(self, event: MonitorEvent) -> None:
        if event.kind == "log" and event.path == self._log_path:
            self.view.add_lines(event.lines)
        elif event.kind == "verdict":
            self._verdict_changed()
        else:
            self.dirty = True

    def _verdict_changed(self) -> None:
        """A new stall or crash raises a notification (the monitor gathers a stall's forensics)."""
        self.dirty = True
        verdict = self.verdict
        if not verdict.alerting:
            return
        say(self, f"{verdict}: the header says why", severity="error", timeout=TOAST_S)

    def _watch_link(self) -> None:
        """Link changes seen by the session become a redraw, the right bindings and, when it comes
        back, a notification."""
        link = self.link
        if link is None:
            return
        seen = (self.state.link_state, link.error, link.reconnects)
        if seen == self._link_seen:
            return
        back = self._link_seen is not None and seen[2] > self._link_seen[2]
        self._link_seen = seen
        self.dirty = True
        self.refresh_bindings()
        if back:
            say(self, f"link to {self.state.target} is back (reconnect {seen[2]})", timeout=TOAST_S)

    def _tick(self) -> None:
        if not self.view.is_attached:
            return  # quitting: the widgets are gone
        self._watch_link()
        self.set_class(self.state.link_state.startswith(("lost", "down", "failed")), "stale")
        while self.state.notes:
            say(self, self.state.notes.popleft(), timeout=TOAST_S)
        if self.dirty:
            self.dirty = False
            self.refresh_panes()
            if self._opened_seq is not None and self.state.seq > self._opened_seq and not self.ready.is_set():
                self.ready.set()  # a first look never stands on a sample taken before its run was followed
        elif time.monotonic() - self._status_at >= HEADER_S:
            self._status()

    def _sync_log(self, full: bool = False) -> None:
        path = next(iter(self.state.logs), None)
        view = self.view
        if path != self._log_path or full:
            self._log_path = path
            view.path = path
            view.redraw(self.state.logs[path].lines if path else [])

    def refresh_panes(self) -> None:
        state = self.state
        self._ensure_gpu_panes()
        for pane in self.panes:
            pane.show(state)
        self.gpu_list.show(state)
        self.ranks.show(state, self.ports.summary(state) if self.has_class("narrow") else "")
        self.ports.show(state)
        runs_doc = getattr(self.monitor, "runs_doc", None)  # the host's servers: one monitor of one host has them
        self.runs.set_class(not (runs_doc is not None and self.runs.show(runs_doc())), "empty")
        self._sync_log()
        self._status()

    def on_runs_table_picked(self, event: RunsTable.Picked) -> None:
        """Enter on a server (no layout): it is the run followed from now on."""
        pick = getattr(self.monitor, "pick", None)
        servers = getattr(self.monitor, "servers", [])
        server = next((s for s in servers if s.root == event.root), None)
        if pick is None or server is None or self.monitor.layout is not None:
            say(
                self,
                "the layout says which server is the run: its neighbours are listed, never followed",
                timeout=TOAST_S,
            )
            return
        if self.monitor.following is not None and self.monitor.following.get("root") == event.root:
            return
        pick(server)
        say(self, f"following root pid {server.root} ({server.user}): the others are its neighbours", timeout=TOAST_S)
        self.dirty = True

    def _ensure_gpu_panes(self) -> None:
        n = len(self.state.gpus)
        seen = n or self._empty_gpus()  # no GPUs: drawn again when what is said of them changes
        if seen == self._gpu_count:
            return
        self._gpu_count = seen
        grid = self.grid
        grid.remove_children()
        self.grid.styles.grid_size_columns = 4 if n >= 4 else max(1, n)
        self.set_class(not n, "nogpus")  # nothing to list: the grid says why, whatever the size
        self.panes = [GpuPane(i) for i in sorted(self.state.gpus)]
        if self.panes:
            grid.mount(*self.panes)
        else:
            grid.mount(Static(as_text(self._empty_gpus()), classes="nogpu"))
        self._size_gpus()

    def _size_gpus(self) -> None:
        """Heights that follow the terminal: panes of 9 lines (6 when short), or the list's lines."""
        n = len(self.state.gpus)
        width, height = self.size
        cols = 4 if n >= 4 else max(1, n)
        short = height < 40
        for pane in self.panes:
            pane.set_class(short, "compact")
        self.grid.styles.height = ((n + cols - 1) // cols) * (6 if short else 9) if n else 3
        self.gpu_list.columns = 2 if self.has_class("compact") and width >= 80 and height < 36 and n > 4 else 1
        self.gpu_list.styles.height = self.gpu_list.lines_needed(n) + 2

    def _empty_gpus(self) -> str:
        if self.error:
            return "no connection: the header says why; q quits"
        if self.state.seq or not self.monitor.live:
            agent = self.state.agent
            why = next((w for w in agent.warnings if "no GPU" in w or "no NVIDIA driver" in w), None)
            where = agent.hostname if agent.hostname != "?" else self.state.target
            return f"no GPUs on {where}: " + (
                why.split(" (")[0] if why else "the agent found neither NVML nor nvidia-smi"
            )
        return f"connecting to {self.state.target}…"

    def _status(self) -> None:
        """Drawn with each sample, and by the tick when HEADER_S went by without one: the header's
        age changes in the same frame as the panes, one repaint a second rather than two on a
        quiet host, and still counts up when samples stop."""
        self._status_at = time.monotonic()
        text = header_text(self)
        if text.markup != self._status_text:
            self._status_text = text.markup
            # the header does not wrap (cockpit.tcss): its height is its count of lines, and only a
            # new count needs a layout of the screen (a layout a second was most of a quiet screen's CPU)
            lines = text.plain.count("\n") + 1
            self.status.update(text, layout=lines != self._status_lines)
            self._status_lines = lines

    # ------------------------------------------------------------------ keys

    def check_action(self, action: str, parameters) -> bool | None:
        """Only bindings that can do something are shown: an act as the table of acts allows it
        (a live link, not --read-only, a launch command where it needs one)."""
        act = ACT.get(action)
        if act is not None:
            return act.allowed(
                self.link is not None and self.state.link_state == "up",
                self.read_only,
                self.profile is not None and bool(self.profile.command),
            )
        if action == "ledger":
            return self.profile is not None
        if action == "report":
            return self.actions.report is not None
        if action == "back":
            return not self.owns_monitor
        return True

    def action_zoom(self) -> None:
        """The focused pane fills the screen, the header and the keys stay (k9s's zoom); z again,
        or escape, brings the others back. Zoomed, the GPUs are panes whatever the size."""
        if self.maximized is not None:
            self.minimize()
        elif self.focused is not None:
            self.maximize(self.focused, container=False)

    def action_ledger(self) -> None:
        self.actions.ledger()

    def action_help(self) -> None:
        """The keys of this screen: `esc` back to the fleet only where one opened it."""
        keys = tuple(k for k in COCKPIT + RANK_TABLE if k.action != "back" or not self.owns_monitor)
        self.app.push_screen(HelpScreen(help_renderable(keys)))

    def action_evidence(self) -> None:
        """The verdict with every line of its evidence, wrapped: what the header can only begin
        (without a connection, the whole reason)."""
        if self.error:
            self.app.push_screen(
                ReportScreen(f"cannot connect to {self.state.target}", [self.error, "q quits (exit status 2)"])
            )
            return
        v = self.verdict
        lines = [f"phase: {self.phase}"]
        lines += [
            f"{key}: {value}"
            for key, value in (("detail", v.detail), ("since", v.doc()["since"]), ("decided by", v.doc()["until"]))
            if value
        ]
        lines += [f"▸ {line}" for line in v.evidence] or ["no evidence beyond the verdict itself"]
        self.app.push_screen(ReportScreen(f"why: {v}", lines))

    def action_report(self) -> None:
        self.actions.show_report()

    def action_search(self) -> None:
        view = self.view

        def done(term: str | None) -> None:
            view.search = term
            self._sync_log(full=True)

        self.app.push_screen(SearchScreen(view.search), done)

    def action_rank_filter(self) -> None:
        view = self.view
        ranks = sorted({p.rank for p in self.state.procs.values() if p.rank is not None})
        if not ranks:
            view.rank = None
        elif view.rank is None:
            view.rank = ranks[0]
        else:
            later = [r for r in ranks if r > view.rank]
            view.rank = later[0] if later else None
        self._sync_log(full=True)

    def action_follow(self) -> None:
        self.view.toggle_follow()

    def action_back(self) -> None:
        self.dismiss()

    async def on_unmount(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
        if self.owns_monitor:
            await self.monitor.close()


def _act_action(name: str):
    def action(self: CockpitScreen) -> None:
        self.run_worker(self.actions.act(name), group="action")

    action.__doc__ = f"The act {name!r} of the table of acts (cockpit/operate/acts.py), as a worker of the screen."
    return action


for _act in ACTS:  # each act's key runs it: its own workflow on the ActionRunner, or the generic one
    if hasattr(CockpitScreen, f"action_{_act.name}"):
        raise ValueError(f"act {_act.name!r}: the screen has an action of that name already")
    setattr(CockpitScreen, f"action_{_act.name}", _act_action(_act.name))
