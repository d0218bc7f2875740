"""One host, watched: the session, the layout, the one watchdog with its phase and verdict, the
endpoint probes and the reconnection. The screen, the fleet (its row and the cockpit opened from
it), `launch`/`ablate` and every headless command read the same HostMonitor, so they cannot
disagree. The verdict moves on each sample that arrives, and only on live data: a host whose link
is down is not a silent run. Nothing here knows Textual."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, replace
from typing import Any

from cockpit.actions import kill
from cockpit.actions.kill import KillPlan
from cockpit.actions.launch import find_live_run
from cockpit.common.errors import CockpitError, LinkLost
from cockpit.common.hosttext import count, visible
from cockpit.host.servers import Server, servers_of, tree_pids, tree_view
from cockpit.host.session import HostSession, SessionOptions, WatchList
from cockpit.host.state import HISTORY_LEN, HostState
from cockpit.judge.diagnose import phase_of
from cockpit.judge.verdict import Phase, Verdict, VerdictName
from cockpit.link.target import Target
from cockpit.monitor.base import (
    MonitorBase,
    MonitorEvent,
    OperatorKill,
    named_processes,
    rules_for,
    same_process,
    watchdog_for,
)
from cockpit.read import metrics
from cockpit.runs.config import Layout
from cockpit.runs.ledger import ledger_path
from cockpit.runs.run import Run

PROBE_EVERY_S = 2.0
SERVERS_EVERY_S = 10.0  # how often the host's servers (the runs, a run's neighbours) are listed again
SHM_WATCH_S = 30.0  # how often the run's /dev/shm holdings are looked at while it lives


def _run_key(rec: Mapping[str, Any]) -> tuple[object, ...]:
    """What tells one run's record from another's: its process group, else its tree's root."""
    return (
        ("pgid", str(rec["pgid"])) if rec.get("pgid") is not None else ("root", rec.get("root"), rec.get("root_start"))
    )


@dataclass
class Judged:
    """A server of the host judged on its own tree (no layout, several servers): its watchdog,
    phase and verdict."""

    server: Server
    watchdog: Any
    phase: Phase
    verdict: Verdict


class HostMonitor(MonitorBase):
    def __init__(
        self,
        target: Target,
        opts: SessionOptions | None = None,
        layout: Layout | None = None,
        history: int = HISTORY_LEN,
        probe_every_s: float = PROBE_EVERY_S,
        on_connect: Callable[[HostMonitor], Awaitable[None]] | None = None,
        watch: WatchList | None = None,
    ):
        self.layout = layout
        self.rules = rules_for(layout)
        self.target = target
        self.state = HostState(target.label, history=history, rules=self.rules)
        self.session: HostSession = HostSession(
            target, opts, watch or WatchList.for_layout(layout), state=self.state, on_frame=self._on_frame
        )
        self.watchdog = watchdog_for(layout)
        self.phase = Phase("no run")
        self.verdict = Verdict(VerdictName.WATCHING, [])
        self.probes: dict[tuple[int, str], dict[str, Any]] = {}
        self.run = Run(layout)
        self.stopping: str | None = None  # the operator's own kill is under way, and why
        self.operator_kills: dict[int, OperatorKill] = {}  # pid -> what the operator killed, until a new run
        self._ledger_seen: float | None = None  # the ledger's mtime when a new run was last looked for
        self._port_look_at = 0.0  # when a port held by a process not watched last sent us looking
        self._generation_seen = 0  # the HostState's run generation whose log was last looked for
        self._boundary_seen = 0  # the HostState's run generation acted on
        self._log_found = False  # the log followed is the one _find_log found (no layout log, no ledger run)
        self.on_connect = on_connect
        self.probe_every_s = probe_every_s
        self._listeners: list[Callable[[MonitorEvent], None]] = []
        self._link_seen: tuple[object, ...] | None = None
        # gather a stall's forensics (cockpit/actions/forensics.py): the layout's auto_dump; off under --read-only
        self.forensics_on = bool(layout.auto_dump) if layout is not None else False
        self._forensics_task: asyncio.Task[None] | None = None
        self._forensics_for: tuple[object, ...] | None = None  # the stall they were gathered for
        self._probing = False  # a probe loop runs (the screen's keep, or a look's judging)
        self.shm_held: dict[tuple[int, int], float] = {}  # (device, inode) of /dev/shm files the run held -> when seen
        self._shm_look_at = 0.0
        # a watch of the caller's own processes (a Slurm job's on its node): that is the run's tree, kept
        self._given_tree = bool(watch is not None and (watch.pids or watch.pgids))
        self._server_patterns = watch.patterns if watch is not None and watch.patterns else None  # the caller's titles
        self.servers: list[Server] = []  # every server on the host as last listed (SERVERS_EVERY_S)
        self._servers_at: float | None = None  # when (local monotonic)
        self._server_logs: dict[tuple[int, int | None], str | None] = {}  # the file each server writes to
        self.several = False  # no layout and several servers: each judged alone (`judged`), none followed
        self.judged: dict[tuple[int, int | None], Judged] = {}

    def _on_frame(self, frame: dict[str, Any]) -> None:
        kind = frame.get("t")
        if kind == "sample":
            self.update()
            self._emit(MonitorEvent("sample"))
        elif kind == "log":
            log = self.state.logs.get(str(frame.get("path")))
            n = len(frame.get("lines") or [])
            if log is not None and n:
                lines = [
                    log.lines[i] for i in range(-min(n, len(log.lines)), 0)
                ]  # the new ones: a deque's end is cheap
                self._emit(MonitorEvent("log", path=log.path, lines=lines))

    # ------------------------------------------------------------------ judging

    def update(self, now: float | None = None) -> None:
        """Phase and verdict from the latest sample. While the operator's own kill runs, the ranks
        dying are that kill, not a crash."""
        state = self.state
        if not state.seq or state.link_state != "up" or not self._judgeable():
            return
        if state.generation != self._boundary_seen:
            self._forget_run()
        before = self.verdict
        if self.several:
            self._judge_each(now if now is not None else time.monotonic())
            if self.verdict.name != before.name:
                self._emit(MonitorEvent("verdict", before=before))
            return
        self.watchdog.looks = self.forensics_on and self._looks_off is None
        self.watchdog.scrape_every_s = self.probe_every_s
        self.phase, self.verdict = self.watchdog.update(state, now if now is not None else time.monotonic())
        if self.verdict.name == VerdictName.NO_RUN:
            self.phase, self.verdict = self._failed_launch() or (self.phase, self.verdict)
        if self.verdict.name == VerdictName.CRASHED:
            self._stops_elsewhere()
        self.phase, self.verdict = self._operators(self.phase, self.verdict)
        if self.verdict.name == VerdictName.STOPPED and self._ended_elsewhere():
            self.run_ended()  # another cockpit killed the whole run and verified it gone: no run
            return
        self._stall_forensics()
        self._stack_look()
        if self.verdict.name != before.name or self.verdict.odd_rank != before.odd_rank:
            self._emit(MonitorEvent("verdict", before=before))

    def _failed_launch(self) -> tuple[Phase, Verdict] | None:
        """The run this cockpit launched ended with a failure status before any process of it was
        seen (a wrong interpreter, a module not found, a flag refused): a crash, said with its status
        and the log's last lines, not `no run` until the launch's timeout. A leader that ended well
        (a launcher that forks the server and returns) is left to what the host shows."""
        rec = self.run.record
        if rec is None or not isinstance(rec.get("pid"), int):
            return None
        pid = rec["pid"]
        code = self.state.launch_exits.get(pid)
        if code is None or code == 0 or self.state.live_procs():
            return None
        status = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
        log = self.state.logs.get(str(rec.get("log"))) if rec.get("log") else None
        last = [visible(line.text) for line in list(log.lines)[-3:] if line.text.strip()] if log is not None else []
        evidence = [f"the launched process (pid {pid}) ended with {status} before any process of the run was seen"]
        return Phase("crashed"), Verdict(VerdictName.CRASHED, evidence + [f"log: {line}" for line in last])

    def _judge_each(self, now: float) -> None:
        """No layout, several servers: each server judged alone, on a view of its own tree (its
        processes, GPUs, ports and log); none is the host's run until the operator picks one."""
        state = self.state
        for s in self.servers:
            j = self.judged.get(s.key)
            if j is None:
                j = self.judged[s.key] = Judged(
                    s, watchdog_for(None), Phase("starting"), Verdict(VerdictName.WATCHING, [])
                )
            j.server = s
        for j in self.judged.values():
            s = j.server
            pids = tree_pids(state, [s.root], set(s.pids))
            if not pids:
                continue
            view = tree_view(state, pids, s.log)
            j.phase, j.verdict = j.watchdog.update(view, now, s.log)
        live = [j for j in self.runs_judged()]
        self.phase = Phase("no run", f"{count(len(live), 'server')} on the host, each its own run")
        self.verdict = Verdict(
            VerdictName.NO_RUN,
            [
                f"{count(len(live), 'server')} on this host, each its own run, judged alone (runs): none followed; "
                "pick one (enter in the runs list) or name its layout with --layout"
            ],
        )

    def runs_judged(self) -> list[Judged]:
        """The servers judged alone that are still on the host (listed, or their processes still
        in the state)."""
        listed = {s.key for s in self.servers}
        return [
            j
            for j in self.judged.values()
            if j.server.key in listed or any(pid in self.state.procs for pid in j.server.pids)
        ]

    def neighbours(self) -> list[Server]:
        """The host's other servers: every server listed that is not the run followed (none of its
        processes watched as the run's). Listed, never judged with the run."""
        if self.several:
            return []
        rec = self.following or {}
        root = rec.get("root") or rec.get("pid")  # a launch's record names its leader: the tree's root
        watched = {pid for pid, p in self.state.procs.items() if p.alive}
        return [s for s in self.servers if not set(s.pids) & watched and s.root != root]

    def decided(self) -> bool:
        if self.several:
            return (
                bool(self.state.seq)
                and self.session.watch_current()
                and bool(self.judged)
                and all(j.verdict.name != VerdictName.WATCHING for j in self.runs_judged())
            )
        return super().decided()

    async def list_servers(self, force: bool = False) -> list[Server]:
        """Every server on the host, each its own tree (the agent's `servers`), at most every
        SERVERS_EVERY_S; the file each one writes to looked for once."""
        now = time.monotonic()
        if self.target.kind == "demo":
            return []  # a simulated host: this machine's own servers are none of its neighbours
        if not force and self._servers_at is not None and now < self._servers_at + SERVERS_EVERY_S:
            return self.servers
        self._servers_at = now
        servers = servers_of(await self.session.request("servers", timeout=60, patterns=self._server_patterns))
        for s in servers:
            if s.key not in self._server_logs:
                pids = [s.root] + [p for p in s.pids if p != s.root]
                out = await self.session.request("stdout_of", pids=pids[:16])
                self._server_logs[s.key] = next((out[str(p)] for p in pids if str(p) in out), None)
            s.log = self._server_logs[s.key]
        self.servers = servers
        if self.several:
            await self._follow_server_logs()
        return servers

    async def _follow_server_logs(self) -> None:
        """Several servers judged alone: each one's own log followed."""
        logs = sorted({s.log for s in self.servers if s.log})
        if logs != sorted(self.session.watch.logs):
            await self.session.follow_logs(logs)

    def pick(self, server: Server, rule: str | None = None) -> None:
        """The operator picks one of the host's servers (no layout): it is the run followed from
        now on, its own tree alone watched; the others are its neighbours."""
        self.several = False
        self.judged = {}
        rec: dict[str, Any] = {
            "root": server.root,
            "pid": server.root,
            "root_start": server.root_start,
            "uid": server.uid,
            "user": server.user,
            "host": self.target.label,
            "ports": sorted(server.own_ports),
        }
        if server.log:
            rec["log"] = server.log
        self.follow(
            Run(
                self.layout,
                rec,
                rule
                or f"picked by the operator: root pid {server.root} ({server.user}, "
                f"port {', '.join(map(str, server.ports)) or '?'})",
            ),
            resumed=True,
        )

    def runs_doc(self) -> dict[str, Any]:
        """The document's `runs` (each server judged alone, or the run followed) and `neighbours`
        (the host's other servers, never judged with the run): docs/snapshot-schema.md."""
        if self.several:
            runs = [
                dict(
                    j.server.doc(),
                    phase={"name": j.phase.name, "detail": j.phase.detail},
                    verdict=j.verdict.doc(),
                    followed=False,
                )
                for j in self.runs_judged()
            ]
        elif self.run.record is not None and self.verdict.name != VerdictName.NO_RUN:
            rec = self.run.record
            watched = {pid for pid, p in self.state.procs.items() if p.alive}
            own = next((s for s in self.servers if set(s.pids) & watched), None)
            entry = (
                own.doc()
                if own is not None
                else {
                    "root": rec.get("root") or rec.get("pid"),
                    "user": rec.get("user"),
                    "uid": rec.get("uid"),
                    "ports": sorted({pt.port for pt in self.state.ports if pt.pid is not None}),
                    "model": None,
                    "tp_size": None,
                    "ranks": sorted(p.rank for p in self.state.ranks() if p.alive and p.rank is not None),
                    "pids": sorted(watched),
                    "title": "",
                    "since": None,
                    "log": rec.get("log"),
                }
            )
            runs = [
                dict(
                    entry,
                    phase={"name": self.phase.name, "detail": self.phase.detail},
                    verdict=self.verdict.doc(),
                    followed=True,
                    run_id=self.run.run_id,
                    rule=self.run.rule,
                )
            ]
        else:
            runs = []
        listed = {r.get("root") for r in runs}  # a run's own tree is never also its neighbour
        return {
            "runs": runs,
            "neighbours": [dict(s.doc(), phase=None, verdict=None) for s in self.neighbours() if s.root not in listed],
        }

    def _local_time(self, at: float) -> float:
        """A host-clock time as local monotonic, through the latest sample's stamp."""
        ts, got = self.state.sample_ts, self.state.received_at
        if ts is None or got is None:
            return time.monotonic() - max(0.0, time.time() - at)
        return got - max(0.0, ts - at)

    def _stops_elsewhere(self) -> None:
        """Stops the host's record holds (any cockpit's: `cockpit kill` in another terminal,
        another screen's `K`, a colleague's machine): the processes each names, by pid and start
        time, died by the operator's hand here too, whatever this cockpit followed."""
        procs = self.state.procs
        for stop in self.state.acts_of("stop"):
            why = f"{stop.get('why') or 'stopped'}, by {stop.get('by') or '?'}"
            for pid, started in named_processes(stop):
                proc = procs.get(pid)
                if proc is None or not same_process(proc, started):
                    continue
                k = self.operator_kills.get(pid)
                if k is None or not same_process(proc, k.started):
                    self.operator_kills[pid] = OperatorKill(pid, started, self._local_time(stop["at"]), why, False)

    def _ended_elsewhere(self) -> bool:
        """Whether the host's record says a stop ended the run followed whole, verified gone (any
        cockpit's), and none of its ranks lives."""
        ranks = self.state.ranks()
        if not ranks or any(p.alive and p.status != "Z" for p in ranks):
            return False
        return any(
            any(
                pid in self.state.procs and same_process(self.state.procs[pid], started)
                for pid, started in named_processes(rec)
            )
            for rec in self.state.acts_of("ended")
        )

    def kills(self) -> dict[int, OperatorKill]:
        return self.operator_kills

    def new_run(self, started: float | None = None, resumed: bool = False) -> None:
        """A run starts (launched, or found replacing the last one): the last run's phases, crash
        and stall clocks, dead ranks, log lines, metrics and the operator's kills are history."""
        self._judge_afresh(started, resumed)
        self._forget_run()
        self.verdict = Verdict(VerdictName.WATCHING, [])

    def _forget_run(self) -> None:
        """The last run's dead processes, the operator's kills, metrics, forensics and /dev/shm
        holdings are history: a run started (new_run), or the HostState reported a run boundary
        (a server restarted outside the cockpit; the watchdog starts afresh on it by itself,
        reading on from the lines that came since)."""
        self._boundary_seen = self.state.generation
        self.state.forget_dead()
        self.operator_kills = {}
        self.state.metrics = metrics.MetricsView()
        self.forensics, self._forensics_for = None, None
        self._looks_off = None
        self.shm_held, self._shm_look_at = {}, 0.0

    def run_ended(self) -> None:
        """The operator's kill of the whole run, verified: no run until one starts. Its log stays
        on screen as history; nothing of it is judged or shown as current."""
        self.follow(None)
        self.watchdog.end()
        before = self.verdict
        self.phase, self.verdict = Phase("no run"), Verdict(VerdictName.NO_RUN, [])
        self._emit(MonitorEvent("verdict", before=before))

    @contextmanager
    def stopping_for(self, why: str, plan: KillPlan | None = None) -> Iterator[None]:
        """The operator's own kill: its ranks going down read as `stopping`, never `crashed`; the
        processes of `plan` (a KillPlan) are remembered, so their deaths read as the operator's
        after the kill too."""
        if plan is not None:
            now = time.monotonic()
            crashed = self.verdict.name == VerdictName.CRASHED and not self.stopping
            for e in plan.entries:
                self.operator_kills[int(e["pid"])] = OperatorKill(int(e["pid"]), e.get("started"), now, why, crashed)
        before, self.stopping = self.stopping, why
        try:
            yield
        finally:
            self.stopping = before

    def replayed(self) -> tuple[Phase, Verdict]:
        """Phase and verdict of a HostState that is not live (a replayed snapshot)."""
        v = self.state.verdict
        return phase_of(self.state), Verdict(**v) if v else Verdict(VerdictName.WATCHING, [])

    # ------------------------------------------------------------------ lifecycle

    async def open(self, kept: bool = False) -> None:
        """Connect, then find the run to follow: the caller's hook (the demo's own run), else this
        layout's latest launched run that still lives. `kept`: the caller keeps the link after
        (the screen, the fleet), so it is watched for silence from the start."""
        self.opened_at = time.monotonic()
        self.kept = kept
        await self.session.connect()
        if kept:
            self.session.watch_silence()
        try:
            if self.on_connect is not None:
                await self.on_connect(self)
            elif self.layout is not None:
                found = await self.find_run()
                if found is not None:
                    self.follow(found, resumed=True)
                    self.state.agent.warnings.insert(
                        0,
                        f"following {found.run_id} (launched earlier, still running)"
                        if found.run_id
                        else f"following the layout's run: {found.rule}",
                    )
                elif not self._given_tree and not self.layout.watch and not self._server_patterns:
                    # no run: no server on the host is judged as this one (a layout's own `watch:`
                    # patterns, or the caller's, name the operator's processes: those stay watched)
                    self.session.watch_run(None, None)
                    self._watch_moved = True
            elif self.layout is None and not self._given_tree:
                await self._runs_of_the_host()
            if self.following is None and self.layout is None and not self.several and not self.session.watch.logs:
                await self._find_log()
            if self._servers_at is None:
                await self.list_servers(force=True)  # the run's neighbours, from the first look
        except LinkLost:
            pass  # the link dropped as soon as it came up: keep() reconnects with the same watch

    async def _runs_of_the_host(self) -> None:
        """No layout: every server on the host is a run of its own. One: it is the run followed
        (its tree alone). Several: each judged alone, none followed until the operator picks one."""
        servers = await self.list_servers(force=True)
        if len(servers) == 1:
            self.pick(servers[0], f"the host's only server: root pid {servers[0].root} ({servers[0].user})")
        elif len(servers) > 1:
            self.several = True
            await self._follow_server_logs()

    async def _find_log(self) -> None:
        """A run started elsewhere (`nohup ... > run.log 2>&1 &`) with no log named: follow the
        file its server writes its output to, so a first look reads what happened before it."""
        await self.session.wait_samples(1)
        procs = self.state.procs
        servers = [p.pid for p in procs.values() if p.alive and p.role == "server"]
        roots = [p.pid for p in procs.values() if p.alive and p.ppid not in procs]
        pids = sorted(servers) + sorted(set(roots) - set(servers))
        if not pids:
            return
        found = await self.session.request("stdout_of", pids=pids[:16])
        path = next((found[str(pid)] for pid in pids if str(pid) in found), None)
        if path:
            self._log_found = True
            if path not in self.session.watch.logs:
                await self.session.follow_log(path)

    async def _log_of_new_run(self) -> None:
        """A server restarted outside the cockpit with no ledger record (by hand, by systemd) may
        write to another file: once the HostState sees the new run, the file its server writes to
        is looked for again, as on the first look."""
        if self.state.generation == self._generation_seen:
            return
        self._generation_seen = self.state.generation
        if self.following is None and (self._log_found or not self.session.watch.logs):
            await self._find_log()

    async def keep(self, retry_first: bool = False) -> None:
        """Keep the link up (reconnecting with backoff) and the probes going, until cancelled."""
        await asyncio.gather(self.session.keep(retry_first=retry_first), self._probe_loop())

    async def _probe_loop(self) -> None:
        """The round-trip time and the layout's endpoints, one round after another: polls never
        overlap, and a hung endpoint is answered from a thread on the host."""
        self._probing = True
        try:
            await self._probe_rounds()
        finally:
            self._probing = False

    async def _probe_rounds(self) -> None:
        ports = self.layout.ports if self.layout else []
        endpoints = self.layout.endpoints if self.layout else []
        while True:
            if self.state.link_state == "up":
                try:
                    await self.session.ping()
                    for port in ports:
                        for path in endpoints:
                            self.probes[(port, path)] = await self.session.request(
                                "http", port=port, path=path, timeout=5
                            )
                    await self._scrape_metrics(ports)
                    await self.note_shm_held()
                    await self.list_servers()
                    await self.look_for_new_run()
                    await self._log_of_new_run()
                except CockpitError:
                    pass
            await asyncio.sleep(self.probe_every_s)

    async def look_for_new_run(self) -> Run | None:
        """A run of the layout started elsewhere (another terminal's `cockpit launch`, a relaunch
        by hand) once every process of the run followed is gone: followed as a new run (its
        process group and log, a new watchdog), not read as the old one's crash. Looked for when
        the ledger changed, or (every 10 s at most) when the layout's port is held by a process
        not watched. Returns the run adopted, if any."""
        if self.stopping or self.state.link_state != "up":
            return None
        if any(p.alive and p.status != "Z" for p in self.state.procs.values()):
            return None  # the run followed (or part of it) lives: a new run cannot have replaced it
        if self.layout is None:
            return await self._restarted_server()
        try:
            mtime = ledger_path(self.layout).stat().st_mtime
        except OSError:
            mtime = None
        now = time.monotonic()
        stranger = any(pt.listening and pt.port in self.layout.ports for pt in self.state.ports)
        if mtime == self._ledger_seen and not ((stranger or self.following is None) and now >= self._port_look_at):
            return None
        self._ledger_seen = mtime
        self._port_look_at = now + 10.0
        run = await self.find_run()
        if run is None or self.stopping or any(p.alive for p in self.state.procs.values()):
            return None
        if (
            self.following is not None
            and _run_key(self.following) == _run_key(run.record or {})
            and self.run.run_id == run.run_id
        ):
            return None
        await self.adopt(run)
        return run

    async def _restarted_server(self) -> Run | None:
        """No layout: the server followed ended (crashed, stopped elsewhere) and one started on its
        port (restarted by hand): followed as its new run. A server on another port stays a
        neighbour; after the operator's own kill nothing is followed (`no run`, the list stays)."""
        rec = self.following
        if rec is None or self.several or self._given_tree or not rec.get("ports"):
            return None
        now = time.monotonic()
        if now < self._port_look_at:
            return None
        self._port_look_at = now + self.probe_every_s
        old = (rec.get("root"), rec.get("root_start"))
        new = [s for s in await self.list_servers(force=True) if s.own_ports & set(rec["ports"]) and s.key != old]
        if len(new) != 1 or any(p.alive and p.status != "Z" for p in self.state.procs.values()):
            return None
        server = new[0]
        self.pick(
            server,
            f"the server on port {', '.join(map(str, sorted(server.own_ports)))} started again: "
            f"root pid {server.root} ({server.user})",
        )
        self.state.notes.append(
            f"a new run appeared on port {', '.join(map(str, rec['ports']))} (root pid "
            f"{server.root}), started elsewhere; following it and its log"
        )
        self.update()
        return self.run

    async def find_run(self) -> Run | None:
        """The layout's live run as a fresh look finds it (actions/launch.py's find_live_run, the
        one way a run is found): on the demo host, among the demo's own runs."""
        if self.layout is None:
            return None
        demo = self.session.opts.sim_state if self.target.kind == "demo" else None
        return await find_live_run(self.session, self.layout, demo_state=demo or None, elsewhere=not self._given_tree)

    async def adopt(self, run: Run) -> None:
        """Follow `run` from now on (the door: its process group and its own log, a new
        watchdog whose phase clock starts at the run's leader's start), said on screen."""
        rec = run.record or {}
        what = f"process group {rec['pgid']}" if rec.get("pgid") is not None else f"root pid {rec.get('root')}"
        if run.rule is None:
            run = replace(run, rule=f"the layout's run in the ledger: {what}")
        self.follow(run)
        self.state.notes.append(
            f"a new run appeared: {rec.get('run_id', what)} ({what}), started elsewhere; following it and its log"
        )
        self.update()

    async def note_shm_held(self) -> None:
        """Remember which /dev/shm files the run's live processes map or hold open (device,
        inode), every SHM_WATCH_S while it lives: the clean after a kill removes those (and
        what it still holds then), never a file another job of the same user made meanwhile."""
        now = time.monotonic()
        if self.layout is None or now < self._shm_look_at:
            return
        self._shm_look_at = now + SHM_WATCH_S
        ours = {p.pid for p in self.state.live_procs()}
        if not ours:
            return
        audit = await kill.shm_audit(self.session)
        stamp = time.time()
        for e in audit.get("entries") or []:
            if set(e.get("held_by") or []) & ours and e.get("dev") is not None:
                self.shm_held[(e["dev"], e["ino"])] = stamp

    async def _scrape_metrics(self, ports: list[int]) -> None:
        """The engine's metrics (tokens, requests, KV cache), filtered on the host to the families
        the header and the stall evidence use; a 404 (metrics off) is asked again a minute later."""
        path = self.layout.metrics if self.layout else None
        view = self.state.metrics
        if not path or not ports or not view.due(time.monotonic()):
            return
        if any(pt.port == ports[0] and pt.stranger for pt in self.state.ports):
            return  # another's listener on the run's port: its /metrics are never the run's
        view.endpoint = f"{ports[0]}{path}"
        view.health = self.probes.get((ports[0], "/health"))
        answer = await self.session.request("metrics", port=ports[0], path=path, want=metrics.wanted(), timeout=10)
        view.add(metrics.scrape_of(answer))

    async def close(self) -> None:
        for task in (self._forensics_task, self._look_task):
            if task is not None and not task.done():
                task.cancel()
        await self.session.close()

    @asynccontextmanager
    async def attached(self, samples: int = 1) -> AsyncIterator[HostMonitor]:
        """Open, wait for `samples` samples (the first measures CPU % from the agent's start) and
        for one of what is watched now (wait_current), yield, close: every one-shot command's
        lifecycle."""
        await self.open()
        try:
            if self.state.seq < samples:
                await self.session.wait_samples(samples - self.state.seq)
            await self.wait_current()
            yield self
        finally:
            await self.close()

    @asynccontextmanager
    async def judging(self) -> AsyncIterator[None]:
        """While a one-shot look judges (or a launch is watched): the endpoints and metrics probed,
        as on screen; where the screen's own probes run already (keep), those."""
        if self._probing:
            yield
            return
        probes = asyncio.create_task(self._probe_loop())
        try:
            yield
        finally:
            probes.cancel()

    async def watch_for(self, seconds: float) -> None:
        """Judge for `seconds` more: the verdict moves on each sample as it would on screen."""
        deadline = time.monotonic() + seconds
        async with self.judging():
            while time.monotonic() < deadline:
                await asyncio.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
