"""The cockpit screen: status line, a pane per GPU, the rank tree, ports and the log.

Data arrives from a HostSession whose reader runs as a task on the app's loop; frames only mark
the screen dirty or append log lines, and a timer redraws at most a few times a second. Probes of
the endpoints run in one worker whose next round starts when the last has finished, so polls
never overlap and nothing on the screen waits on the network."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from rich.markup import escape
from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal
from textual.screen import ModalScreen, Screen
from textual.widgets import Footer, Input, Static

from cockpit.actions import (DEFAULT_KILL_WAIT_S, describe_kill, describe_shm, human_bytes, kill, plan_kill,
                             process_scope, rank_pids, run_scope, shm_audit, shm_clean)
from cockpit.config import Layout
from cockpit.diagnose import Phase, Verdict, compile_phases, phase_of
from cockpit.errors import CockpitError
from cockpit.model import HostState
from cockpit.session import HostSession
from cockpit.runs import (RunSpec, ablate, combinations, default_spec, describe_ablation,
                          describe_ledger, launch_python, plan_relaunch, read_ledger, run_variant, sim_flags,
                          watchdog_for)
from cockpit.stacks import describe_groups, dump_ranks
from cockpit.ui.gpus import GpuPane
from cockpit.ui.logview import LogView
from cockpit.ui.ports import PortsTable
from cockpit.ui.ranks import RankTable
from cockpit.ui.screens import ConfirmScreen, RelaunchScreen, ReportScreen

REDRAW_S = 0.25
PROBE_EVERY_S = 2.0

HELP = """\
[b]gpu-cockpit[/b] — keys

  [b]tab[/b] / [b]shift+tab[/b]   move between panes
  [b]↑ ↓[/b]            move in a table or scroll the log
  [b]enter[/b]          collapse or expand a process subtree (rank tree)
  [b]/[/b]              search the log (empty search clears it)
  [b]t[/b]              show one rank's log lines (cycles TP0…TPn, then all)
  [b]f[/b]              follow the log on / off
  [b]k[/b]              kill the selected process (asks first, names every pid)
  [b]K[/b]              kill the whole run: SIGTERM, wait, SIGKILL, then verify GPUs and ports
  [b]s[/b]              /dev/shm: every entry, who holds it; [b]c[/b] there cleans what is safe
  [b]d[/b]              py-spy dump of every rank, identical stacks grouped, the odd one out shown
  [b]r[/b]              relaunch: flag sets as toggles, parameters as fields, the command line shown
  [b]A[/b]              ablation: each on/off combination of the chosen flag sets, then a table
  [b]L[/b]              the ledger of this layout's runs
  [b]:[/b] or [b]ctrl+p[/b]     command palette
  [b]?[/b]              this help
  [b]escape[/b]         back to the fleet (a host's cockpit opened from it)
  [b]q[/b]              quit (a run keeps running on the host)

GPU panes: utilization with its history, memory, power against the limit (100 % utilization at
idle power is a collective that never completes), temperature, SM clock, the ranks on the GPU.
Fields a GPU does not report show as n/a, never 0.
"""


class HelpScreen(ModalScreen):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "Close")]

    def __init__(self, text: str = HELP):
        super().__init__()
        self.text = text

    def compose(self) -> ComposeResult:
        yield Static(self.text, id="help")


class SearchScreen(ModalScreen[str | None]):
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, current: str | None, placeholder: str = "search the log"):
        super().__init__()
        self.current = current or ""
        self.placeholder = placeholder

    def compose(self) -> ComposeResult:
        yield Input(value=self.current, placeholder=f"{self.placeholder} (enter to apply, empty to clear)", id="search")

    @on(Input.Submitted)
    def submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)

    def action_cancel(self) -> None:
        self.dismiss(self.current or None)


class CockpitScreen(Screen):
    """One host's cockpit. Standalone it owns its session; opened from the fleet it borrows the
    fleet's live session (no second connection) and Escape goes back."""

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
        Binding("r", "relaunch", "Relaunch"),
        Binding("A", "ablate", "Ablate"),
        Binding("L", "ledger", "Runs"),
        Binding("tab", "app.focus_next", "Next pane", show=False),
        Binding("shift+tab", "app.focus_previous", "Prev pane", show=False),
    ]

    def __init__(self, state: HostState | None = None, session: HostSession | None = None,
                 layout: Layout | None = None,
                 on_connect: Callable[[HostSession], Awaitable[None]] | None = None,
                 clock: Callable[[], float] = time.time, read_only: bool = False, owns_session: bool = True):
        super().__init__()
        self.session = session
        self.owns_session = owns_session
        self.state = session.state if session else (state or HostState())
        self.profile = layout
        self.on_connect = on_connect
        self.clock = clock
        self.read_only = read_only
        self.busy: str | None = None  # the action in flight: one at a time
        self.spec: RunSpec | None = None
        self.run_progress = ""
        self.phases = compile_phases(layout.engine if layout else "sglang", layout.phases if layout else None)
        self.watchdog = watchdog_for(layout)
        self.phase = Phase("no run")
        self.verdict = Verdict("watching", [])
        self.dirty = True
        self.ready = asyncio.Event()
        self.error: str | None = None
        self._log_path: str | None = None
        self._gpu_count = -1
        self._status_text = ""
        self._link_seen: tuple | None = None

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
        self.view.phases = self.phases
        self.set_interval(REDRAW_S, self._tick)
        self.set_interval(1.0, self._status)
        if self.session is not None:
            self.session.on_frame = self._on_frame
            self.connect()
        else:
            self._sync_log(full=True)
            self.refresh_panes()
            self.ready.set()
        self.ranks.focus()

    def on_resize(self, event) -> None:
        compact = self.size.height < 40
        for pane in getattr(self, "panes", []):
            pane.set_class(compact, "compact")

    # ------------------------------------------------------------------ data

    @work(exclusive=True, group="connect")
    async def connect(self) -> None:
        """Connect, then keep the link up (the session reconnects with backoff and re-sends the
        agent; the screen only shows where it stands). A fleet's session is already kept."""
        if self.owns_session:
            try:
                await self.session.connect()
                if self.on_connect is not None:
                    await self.on_connect(self.session)
            except CockpitError as exc:
                self.error = str(exc)
                self.state.link_state = "failed"
                self.notify(str(exc), title="cannot connect", severity="error", timeout=30)
                self.dirty = True
                self.ready.set()
                return
        self.refresh_bindings()
        self.probe()
        if self.owns_session:
            await self.session.keep()

    @property
    def link_error(self) -> str | None:
        """Why the link is down, as the session last saw it."""
        return self.session.link_error if self.session is not None else None

    def _watch_link(self) -> None:
        """Link changes seen by the session become a redraw, the right bindings and, when it comes
        back, a notification and a new round of probes."""
        seen = (self.state.link_state, self.session.link_error, self.session.reconnects)
        if seen == self._link_seen:
            return
        back = self._link_seen is not None and seen[2] > self._link_seen[2]
        self._link_seen = seen
        self.dirty = True
        self.refresh_bindings()
        if back:
            self.notify(f"link to {self.state.target} is back (reconnect {seen[2]})", timeout=5)
            self.probe()

    @work(exclusive=True, group="probe")
    async def probe(self) -> None:
        """Endpoint probes and the round-trip time, one round after another."""
        ports = self.profile.ports if self.profile else []
        endpoints = self.profile.endpoints if self.profile else []
        table = self.ports
        while self.session is not None and not self.session.closed.is_set():
            try:
                await self.session.ping()
                for port in ports:
                    for path in endpoints:
                        table.probes[(port, path)] = await self.session.request("http", port=port, path=path, timeout=5)
            except CockpitError:
                pass
            self.dirty = True
            await asyncio.sleep(PROBE_EVERY_S)

    def _on_frame(self, frame: dict) -> None:
        kind = frame.get("t")
        if kind == "sample":
            self.dirty = True
        elif kind == "log":
            if frame.get("path") == self._log_path:
                self.view.add_lines(frame.get("lines") or [])
            else:
                self.dirty = True

    def _tick(self) -> None:
        if not self.view.is_attached:
            return  # quitting: the widgets are gone
        if self.session is not None:
            self._watch_link()
        self.set_class(self.state.link_state.startswith(("lost", "down", "failed")), "stale")
        while self.state.notes:
            self.notify(self.state.notes.popleft(), timeout=10)
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

    def _diagnose(self) -> None:
        """Phase and verdict; a new stall or crash raises a notification (and, if the layout says
        so, dumps every rank's stack)."""
        if self.state.link_state == "replay":
            self.phase = phase_of(self.state, self.phases, self._log_path)
            if self.state.verdict:
                self.verdict = Verdict(**self.state.verdict)
            return
        if self.state.link_state != "up":
            return  # data that stopped coming is not a silent run: the verdict waits for the link
        before = self.verdict.name
        self.phase, self.verdict = self.watchdog.update(self.state, time.monotonic(), self._log_path)
        if self.verdict.name != before and self.verdict.name in ("stalled-idle", "stalled-spinning", "crashed", "slow"):
            self.notify("\n".join(self.verdict.evidence[:4]), title=str(self.verdict), severity="error", timeout=20)
            if self.profile and self.profile.auto_dump and self.verdict.name.startswith("stalled") and not self.read_only:
                self.action_dump()

    def refresh_panes(self) -> None:
        state = self.state
        self._diagnose()
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
        parts = [f"[b]{s.target}[/b]" + (f" ({a.hostname})" if a.hostname not in ("?", s.target) else "")]
        parts.append(f"phase [b cyan]{self.phase}[/]")
        style = {"ok": "green", "crashed": "bold red", "stalled-idle": "bold red", "stalled-spinning": "bold red",
                 "slow": "yellow"}.get(self.verdict.name, "default")
        parts.append(f"verdict [{style}]{self.verdict}[/]")
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
        parts.append(f"gpu data: {a.nvml or 'none'}")
        if a.driver:
            parts.append(f"driver {a.driver}")
        if self.busy:
            parts.append(f"[yellow]{self.busy}: {self.run_progress}[/]")
        if self.error:
            parts.append(f"[bold red]{escape(self.error)}[/]")
        elif a.warnings:
            parts.append(f"[yellow]{escape(a.warnings[0])}[/]")
        text = "  │  ".join(parts)
        if self.link_error and s.link_state.startswith(("lost", "down")):
            text += f"\n[bold red]why: {escape(self.link_error)}[/]"  # its own line: the fix must be readable
        if self.verdict.evidence and self.verdict.name != "ok":
            text += "\n[red]" + "  ·  ".join(self.verdict.evidence).replace("[", "\\[") + "[/]"
        if text != self._status_text:
            self._status_text = text
            self.status.update(text)

    # ------------------------------------------------------------------ actions

    ACTIONS = ("kill_one", "kill_run", "shm", "dump", "relaunch", "ablate")

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
            return not self.owns_session
        return True

    @asynccontextmanager
    async def _exclusive(self, name: str):
        """One action at a time; its failure is a notification, never a crash of the screen."""
        if self.busy:
            self.notify(f"{self.busy} is still running", severity="warning")
            yield False
            return
        self.busy = name
        try:
            yield True
        except CockpitError as exc:
            self.notify(str(exc), severity="error", timeout=15)
        finally:
            self.busy = None

    def action_kill_one(self) -> None:
        pid = self.ranks.selected_pid()
        if pid is None or not self.state.procs.get(pid) or not self.state.procs[pid].alive:
            self.notify("select a live process in the rank tree first", severity="warning")
            return
        self._kill(process_scope(pid), f"kill pid {pid}")

    def action_kill_run(self) -> None:
        self._kill(run_scope(self.session), "kill the run")

    @work(group="action")
    async def _kill(self, scope, what: str) -> None:
        async with self._exclusive(what) as go:
            if not go:
                return
            plan = await plan_kill(self.session, scope)
            if not plan.entries:
                self.notify("nothing to kill: no process of it is alive", severity="warning")
                return
            ok = await self.app.push_screen_wait(ConfirmScreen(what, plan.describe(), f"Signal these {len(plan.entries)} processes?"))
            if not ok:
                return
            self.notify(f"{what}: SIGTERM sent, waiting…")
            wait = self.profile.kill_wait_s if self.profile else DEFAULT_KILL_WAIT_S
            report = await kill(self.session, plan, wait, self.profile.ports if self.profile else [])
            title = f"{what}: {'verified' if report['verified'] else 'NOT everything is gone'}"
            await self.app.push_screen_wait(ReportScreen(title, describe_kill(report)))

    @work(group="action")
    async def action_shm(self) -> None:
        async with self._exclusive("shm audit") as go:
            if not go:
                return
            audit = await shm_audit(self.session)
            removable = [e["name"] for e in audit["entries"] if e["removable"]]
            keys = {"c": f"clean {len(removable)} removable"} if removable else {}
            choice = await self.app.push_screen_wait(ReportScreen(f"{audit['folder']} on {self.state.agent.hostname}",
                                                              describe_shm(audit), keys))
            if choice != "c":
                return
            ok = await self.app.push_screen_wait(ConfirmScreen(
                "clean shm", [f"rm {audit['folder']}/{n}" for n in removable],
                f"Remove these {len(removable)} entries (held ones and those of live creators are kept)?"))
            if not ok:
                return
            done = await shm_clean(self.session, removable, audit["folder"])
            lines = [f"removed {len(done['removed'])}, freed {human_bytes(done['freed_bytes'])}"]
            lines += [f"kept {s['name']}: {s['why']}" for s in done["skipped"]]
            await self.app.push_screen_wait(ReportScreen("shm cleaned", lines))

    @work(group="action")
    async def action_dump(self) -> None:
        async with self._exclusive("stack dump") as go:
            if not go:
                return
            ranks = rank_pids(self.state)
            if not ranks:
                self.notify("no live rank to dump", severity="warning")
                return
            self.notify(f"dumping {len(ranks)} processes with py-spy…")
            run = self.profile.name if self.profile else self.state.target
            result = await dump_ranks(self.session, ranks, run)
            lines = describe_groups(result.groups)
            lines += [f"rank {r}: no dump ({'; '.join(e)})" for r, e in result.failed.items()]
            lines.append(f"raw dumps: {result.folder}")
            await self.app.push_screen_wait(ReportScreen(f"stacks of {len(ranks)} ranks", lines))

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
        view = self.view
        view.auto_scroll = not view.auto_scroll
        if view.auto_scroll:
            view.scroll_end(animate=False)
        view._subtitle()

    def _current_spec(self) -> RunSpec:
        if self.spec is None:
            self.spec = default_spec(self.profile)
        return self.spec

    def _progress(self, phase, verdict) -> None:
        self.run_progress = f"{phase or ''} {verdict}".strip()

    def _new_watchdog(self) -> None:
        self.watchdog = watchdog_for(self.profile)
        self.verdict = Verdict("watching", [])

    @work(group="action")
    async def action_relaunch(self) -> None:
        async with self._exclusive("relaunch") as go:
            if not go:
                return
            extra = sim_flags(self.profile, self.session)
            spec = await self.app.push_screen_wait(RelaunchScreen(self.profile, self._current_spec(),
                                                              launch_python(self.profile, self.session), extra))
            if spec is None:
                return
            plan, names, lines = await plan_relaunch(self.session, self.profile)  # what will be killed and removed
            if not await self.app.push_screen_wait(ConfirmScreen("relaunch", lines, "Kill this, clean shm and launch?")):
                return
            self.spec = spec
            self._new_watchdog()
            self.notify(f"relaunching with {','.join(spec.enabled) or 'no flag sets'}…")
            row = await run_variant(self.session, self.profile, spec, timeout=24 * 3600.0, progress=self._progress,
                                    plan=plan, shm_names=names)
            self._new_watchdog()
            self.notify("\n".join(row["evidence"][:4]) or row["log"], title=f"{row['run_id']}: {row['outcome']}",
                        severity="information" if row["outcome"] == "ready" else "error", timeout=20)

    @work(group="action")
    async def action_ablate(self) -> None:
        async with self._exclusive("ablation") as go:
            if not go:
                return
            choice = await self.app.push_screen_wait(RelaunchScreen(self.profile, self._current_spec(),
                                                                launch_python(self.profile, self.session),
                                                                sim_flags(self.profile, self.session),
                                                                title="ablate: the chosen flag sets are switched on and off"))
            if choice is None or not choice.enabled:
                return
            vary = choice.enabled
            specs = combinations(self.profile, vary)
            plan, names, lines = await plan_relaunch(self.session, self.profile)
            ok = await self.app.push_screen_wait(ConfirmScreen(
                "ablation", lines + [f"{n + 1}. {','.join(s.enabled) or '(no flag sets)'}" for n, s in enumerate(specs)],
                f"Run these {len(specs)} launches in turn (each kills the one before)?"))
            if not ok:
                return
            rows = await ablate(self.session, self.profile, vary, timeout=self.profile.stall.idle_s * 10 + 600,
                                progress=self._progress, first_plan=plan, first_shm=names)
            self._new_watchdog()
            await self.app.push_screen_wait(ReportScreen("ablation", describe_ablation(rows, vary)))

    def action_ledger(self) -> None:
        self.app.push_screen(ReportScreen(f"runs of {self.profile.name}", describe_ledger(read_ledger(self.profile))))

    def action_back(self) -> None:
        self.dismiss()

    async def on_unmount(self) -> None:
        if self.session is not None:
            if self.owns_session:
                await self.session.close()
            elif self.session.on_frame == self._on_frame:
                self.session.on_frame = None


class CockpitApp(App):
    """The cockpit on one host: a thin app around CockpitScreen (which the fleet reuses)."""

    CSS_PATH = "cockpit.tcss"
    TITLE = "gpu-cockpit"

    def __init__(self, **kwargs):
        super().__init__()
        self.cockpit = CockpitScreen(**kwargs)

    def get_default_screen(self) -> CockpitScreen:
        return self.cockpit

    @property
    def state(self) -> HostState:
        return self.cockpit.state

    @property
    def error(self) -> str | None:
        return self.cockpit.error

    @property
    def ready(self) -> asyncio.Event:
        return self.cockpit.ready


def save_text(app: App, path: str | None) -> str:
    """The screen as plain text (what `--text` prints)."""
    import io

    from rich.console import Console

    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), record=True, color_system=None,
                      legacy_windows=False, safe_box=False)
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    text = console.export_text()
    if path:
        Path(path).write_text(text)
    return text
