"""The cockpit screen: status line, a pane per GPU, the rank tree, ports and the log.

It renders one HostMonitor and dispatches keys; the monitor owns the session, the verdict and the
probes, and the action workflows live in ui/actions.py. Frames only mark the screen dirty (or
append classified log lines), and a timer redraws at most a few times a second, so nothing on the
screen waits on the network."""

from __future__ import annotations

import asyncio
import time

from rich.markup import escape
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal
from textual.screen import Screen
from textual.widgets import Footer, Static

from cockpit.actions import process_scope, run_scope
from cockpit.config import Layout
from cockpit.diagnose import Phase, Verdict, VerdictName, phase_of
from cockpit.errors import CockpitError
from cockpit.model import HostState
from cockpit.metrics import describe as describe_metrics
from cockpit.monitor import HostMonitor, MonitorEvent
from cockpit.ui.actions import ActionRunner
from cockpit.ui.gpus import GpuPane
from cockpit.ui.logview import LogView
from cockpit.ui.ports import PortsTable
from cockpit.ui.ranks import RankTable
from cockpit.ui.screens import HelpScreen, SearchScreen

REDRAW_S = 0.25
VERDICT_STYLE = {"ok": "green", "crashed": "bold red", "stalled-idle": "bold red", "stalled-spinning": "bold red",
                 "slow": "yellow", "stopping": "yellow"}


class CockpitScreen(Screen):
    """One host's cockpit. Standalone it owns its monitor; opened from the fleet it shows the
    fleet's live monitor of that host (no second connection, the same verdict) and Escape goes back.
    Without a monitor it renders a recorded HostState (a replayed snapshot)."""

    BINDINGS = [
        Binding("q", "app.quit", "Quit"),
        Binding("escape", "back", "Fleet"),
        Binding("question_mark", "help", "Help"),
        Binding("colon", "app.command_palette", "Commands", show=False),
        Binding("slash", "search", "Search"),
        Binding("t", "rank_filter", "Rank filter"),
        Binding("f", "follow", "Follow"),
        Binding("k", "kill_one", "Kill proc"),
        Binding("K", "kill_run", "Kill run"),
        Binding("s", "shm", "Shm"),
        Binding("d", "dump", "Dump stacks"),
        Binding("b", "bundle", "Hang bundle"),
        Binding("F", "flightrec", "Flight rec.", show=False),
        Binding("r", "relaunch", "Relaunch"),
        Binding("A", "ablate", "Ablate"),
        Binding("L", "ledger", "Runs"),
        Binding("tab", "app.focus_next", "Next pane", show=False),
        Binding("shift+tab", "app.focus_previous", "Prev pane", show=False),
    ]
    ACTIONS = ("kill_one", "kill_run", "shm", "dump", "relaunch", "ablate", "bundle", "flightrec")

    def __init__(self, monitor: HostMonitor | None = None, state: HostState | None = None,
                 layout: Layout | None = None, read_only: bool = False, owns_monitor: bool = True):
        super().__init__()
        self.monitor = monitor
        self.owns_monitor = owns_monitor and monitor is not None
        self.state = monitor.state if monitor else (state or HostState())
        self.profile = monitor.layout if monitor else layout
        self.read_only = read_only
        self.actions = ActionRunner(self)
        self.dirty = True
        self.ready = asyncio.Event()
        self.error: str | None = None
        self._log_path: str | None = None
        self._gpu_count = -1
        self._status_text = ""
        self._link_seen: tuple | None = None
        self._unsubscribe = None
        self._replayed = None if monitor else self._replay()

    @property
    def session(self):
        return self.monitor.session if self.monitor else None

    @property
    def phase(self) -> Phase:
        return self.monitor.phase if self.monitor else self._replayed[0]

    @property
    def verdict(self) -> Verdict:
        return self.monitor.verdict if self.monitor else self._replayed[1]

    @property
    def busy(self) -> str | None:
        return self.actions.busy

    # ------------------------------------------------------------------ layout

    def compose(self) -> ComposeResult:
        yield Static(id="status")
        yield Grid(id="gpus")
        with Horizontal(id="middle"):
            yield RankTable(id="ranks")
            yield PortsTable(id="ports")
        yield LogView(id="log")
        yield Footer()

    def on_mount(self) -> None:
        # Kept, not queried: a modal screen on top must not hide the cockpit's widgets from updates.
        self.view = self.query_one(LogView)
        self.ranks = self.query_one(RankTable)
        self.ports = self.query_one(PortsTable)
        self.ports.configured = list(self.profile.ports) if self.profile else []
        self.status = self.query_one("#status", Static)
        self.grid = self.query_one("#gpus", Grid)
        self.panes: list[GpuPane] = []
        self.set_interval(REDRAW_S, self._tick)
        self.set_interval(1.0, self._status)
        if self.monitor is not None:
            self.ports.probes = self.monitor.probes
            self._unsubscribe = self.monitor.subscribe(self._on_event)
            self.connect()
        else:
            self._sync_log(full=True)
            self.refresh_panes()
            self.ready.set()
        self.ranks.focus()

    def _replay(self) -> tuple[Phase, Verdict]:
        """Phase and verdict of a recorded moment, as the snapshot wrote them."""
        v = self.state.verdict
        return phase_of(self.state), Verdict(**v) if v else Verdict(VerdictName.WATCHING, [])

    def on_resize(self, event) -> None:
        compact = self.size.height < 40
        for pane in getattr(self, "panes", []):
            pane.set_class(compact, "compact")

    # ------------------------------------------------------------------ data

    @work(exclusive=True, group="connect")
    async def connect(self) -> None:
        """Open the monitor, then keep it (the session reconnects with backoff; the screen only
        shows where it stands). A fleet's monitor is already open and kept."""
        if not self.owns_monitor:
            self.refresh_bindings()
            return
        try:
            await self.monitor.open()
        except CockpitError as exc:
            self.error = str(exc)
            self.state.link_state = "failed"
            self.notify(str(exc), title="cannot connect", severity="error", timeout=30)
            self.dirty = True
            self.ready.set()
            return
        self.refresh_bindings()
        await self.monitor.keep()

    @property
    def link_error(self) -> str | None:
        return self.session.link_error if self.session is not None else None

    def _on_event(self, event: MonitorEvent) -> None:
        if event.kind == "log" and event.path == self._log_path:
            self.view.add_lines(event.lines)
        elif event.kind == "verdict":
            self._verdict_changed()
        else:
            self.dirty = True

    def _verdict_changed(self) -> None:
        """A new stall or crash raises a notification (and, if the layout says so, dumps every
        rank's stack)."""
        self.dirty = True
        verdict = self.verdict
        if not verdict.alerting:
            return
        self.notify("\n".join(verdict.evidence[:4]).replace("[", "\\["), title=str(verdict), severity="error",
                    timeout=20)
        if self.profile and self.profile.auto_dump and verdict.name.startswith("stalled") and not self.read_only:
            self.action_dump()

    def _watch_link(self) -> None:
        """Link changes seen by the session become a redraw, the right bindings and, when it comes
        back, a notification."""
        seen = (self.state.link_state, self.session.link_error, self.session.reconnects)
        if seen == self._link_seen:
            return
        back = self._link_seen is not None and seen[2] > self._link_seen[2]
        self._link_seen = seen
        self.dirty = True
        self.refresh_bindings()
        if back:
            self.notify(f"link to {escape(self.state.target)} is back (reconnect {seen[2]})", timeout=5)

    def _tick(self) -> None:
        if not self.view.is_attached:
            return  # quitting: the widgets are gone
        if self.session is not None:
            self._watch_link()
        self.set_class(self.state.link_state.startswith(("lost", "down", "failed")), "stale")
        while self.state.notes:
            self.notify(escape(self.state.notes.popleft()), timeout=10)
        if self.dirty:
            self.dirty = False
            self.refresh_panes()
            if self.state.seq and not self.ready.is_set():
                self.ready.set()

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
        self.ranks.show(state)
        self.ports.show(state)
        self._sync_log()
        self._status()

    def _ensure_gpu_panes(self) -> None:
        n = len(self.state.gpus)
        if n == self._gpu_count:
            return
        self._gpu_count = n
        grid = self.grid
        grid.remove_children()
        cols = 4 if n > 4 or n == 4 else max(1, n)
        grid.styles.grid_size_columns = cols
        rows = (n + cols - 1) // cols
        compact = self.size.height < 40
        grid.styles.height = rows * (6 if compact else 9) if n else 3
        if not n:
            grid.mount(Static("no GPUs on this host" if self.state.seq else "connecting…", classes="nogpu"))
            return
        self.panes = [GpuPane(i) for i in sorted(self.state.gpus)]
        for pane in self.panes:
            pane.set_class(compact, "compact")
        grid.mount(*self.panes)

    def _status(self) -> None:
        s = self.state
        a = s.agent
        host = f"[b]{escape(s.target)}[/b]" + (f" ({escape(a.hostname)})" if a.hostname not in ("?", s.target) else "")
        parts = [host, f"phase [b cyan]{escape(str(self.phase))}[/]"]
        parts.append(f"verdict [{VERDICT_STYLE.get(self.verdict.name, 'default')}]{self.verdict}[/]")
        link = s.link_state
        style = "green" if link == "up" else "bold red" if link.startswith(("lost", "down", "failed")) else "yellow"
        if link.startswith(("lost", "down")):
            link = "link " + link
        rtt = f" {s.rtt_ms:.0f}ms" if s.rtt_ms is not None and link == "up" else ""
        parts.append(f"{'' if link.startswith('link ') else 'link '}[{style}]{link}[/{style}]{rtt}")
        age = s.age_s()
        if age is not None:
            stale = age > 2.5 * max(1.0, a.interval)
            parts.append(f"age [{'bold red' if stale else 'default'}]{age:.1f}s[/]")
        elif s.sample_ts:
            parts.append("taken " + time.strftime("%H:%M:%S", time.gmtime(s.sample_ts)) + " UTC")
        parts.append(f"gpu data: {escape(a.nvml or 'none')}")
        if a.driver:
            parts.append(f"driver {escape(a.driver)}")
        figures = describe_metrics(s.metrics)  # the engine's own: tokens/s, requests, KV cache
        if figures:
            parts.append(escape(figures))
        if self.busy:
            parts.append(f"[yellow]{escape(self.busy)}: {escape(self.actions.progress)}[/]")
        if self.error:
            parts.append(f"[bold red]{escape(self.error)}[/]")
        elif a.warnings:
            parts.append(f"[yellow]{escape(a.warnings[0])}[/]")
        text = "  │  ".join(parts)
        if self.link_error and s.link_state.startswith(("lost", "down")):
            text += f"\n[bold red]why: {escape(self.link_error)}[/]"  # its own line: the fix must be readable
        if self.verdict.evidence and self.verdict.name != VerdictName.OK:
            text += "\n[red]" + escape("  ·  ".join(self.verdict.evidence)) + "[/]"
        if text != self._status_text:
            self._status_text = text
            self.status.update(text)

    # ------------------------------------------------------------------ keys

    def check_action(self, action: str, parameters) -> bool | None:
        """Only bindings that can do something are shown: no actions without a live link, none
        at all in --read-only."""
        if action in self.ACTIONS:
            if action in ("relaunch", "ablate") and (self.profile is None or not self.profile.command):
                return False
            return not self.read_only and self.session is not None and self.state.link_state == "up"
        if action == "ledger":
            return self.profile is not None
        if action == "back":
            return not self.owns_monitor and self.monitor is not None
        return True

    def action_kill_one(self) -> None:
        pid = self.ranks.selected_pid()
        if pid is None or not self.state.procs.get(pid) or not self.state.procs[pid].alive:
            self.notify("select a live process in the rank tree first", severity="warning")
            return
        self.run_worker(self.actions.kill(process_scope(pid), f"kill pid {pid}"), group="action")

    def action_kill_run(self) -> None:
        self.run_worker(self.actions.kill(run_scope(self.session), "kill the run"), group="action")

    def action_shm(self) -> None:
        self.run_worker(self.actions.shm(), group="action")

    def action_dump(self) -> None:
        self.run_worker(self.actions.dump(), group="action")

    def action_bundle(self) -> None:
        self.run_worker(self._bundle(), group="action")

    def action_flightrec(self) -> None:
        self.run_worker(self._flightrec(), group="action")

    async def _bundle(self) -> None:
        from cockpit import bundle
        from cockpit.ui.screens import ReportScreen

        async with self.actions.exclusive("hang bundle") as go:
            if go:
                self.actions.notify("collecting the hang bundle (stacks, RAS, flight recorder, metrics, ...)")
                result = await bundle.make_bundle(self.monitor, read_only=self.read_only)
                await self.actions.ask(ReportScreen("hang bundle", bundle.describe(result)))

    async def _flightrec(self) -> None:
        from cockpit import flightrec
        from cockpit.actions import rank_pids
        from cockpit.ui.screens import ReportScreen

        async with self.actions.exclusive("flight recorder") as go:
            if go:
                pids = [pid for _, pid in rank_pids(self.state)]
                answer = await self.session.request("fr_dump", timeout=60, pids=pids, trigger=True)
                result = flightrec.compare({int(r): d for r, d in (answer.get("ranks") or {}).items() if not d.get("error")})
                if answer.get("armed"):
                    self.state.flight = result
                await self.actions.ask(ReportScreen("flight recorder", flightrec.describe(answer, result)))

    def action_relaunch(self) -> None:
        self.run_worker(self.actions.relaunch(), group="action")

    def action_ablate(self) -> None:
        self.run_worker(self.actions.ablate(), group="action")

    def action_ledger(self) -> None:
        self.actions.ledger()

    def action_help(self) -> None:
        self.app.push_screen(HelpScreen())

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
