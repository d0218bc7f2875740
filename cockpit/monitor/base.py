"""What every monitor is: the protocol the screen, the fleet and every command rely on (one host:
cockpit/monitor/host.py; a run spanning Slurm nodes: cluster.py; a recorded moment: replay.py),
and what they all do the same way, written once: listeners, the run followed, the one-shot look,
the one stop workflow."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, AbstractContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from cockpit.actions import dumps, forensics, kill, launch
from cockpit.actions.forensics import Forensics
from cockpit.actions.kill import KillPlan
from cockpit.common.errors import CockpitError
from cockpit.common.hosttext import count
from cockpit.host.state import HostState, Proc
from cockpit.judge.diagnose import LOOK_GAP_S, Watchdog
from cockpit.judge.evidence import default_sources, merge
from cockpit.judge.verdict import Phase, Verdict, VerdictName
from cockpit.link.target import Target
from cockpit.read.logrules import LogLine, LogRules
from cockpit.runs.config import Layout
from cockpit.runs.ledger import (
    append_ledger,
    note_seen,
    note_stop,
    note_verdict,
    phase_windows,
    record_ended,
    record_seen,
    typical_phase_seconds,
)
from cockpit.runs.run import Run, Scope
from cockpit.runs.spec import RunSpec

PLAIN_LOOK_S = 15.0  # the longest a plain look (no --wait) judges before it answers


@dataclass
class MonitorEvent:
    """What a listener is told: `sample` (new data), `log` (classified lines of `path`), `verdict`
    (it changed; `before` is the last one), `link` (the link went down or came back)."""

    kind: str
    path: str | None = None
    lines: list[LogLine] | None = None
    before: Verdict | None = None


def watchdog_for(layout: Layout | None) -> Watchdog:
    """The layout's stall thresholds and its earlier runs' phase times (for `slow`)."""
    if layout is None:
        return Watchdog(sources=default_sources())
    s = layout.stall
    return Watchdog(
        s.idle_s,
        s.spin_s,
        s.slow_factor,
        typical_phase_seconds(layout),
        layout.ports,
        sources=default_sources(),
        metrics=bool(layout.metrics and layout.ports),
        windows=phase_windows(layout),
    )


def rules_for(layout: Layout | None) -> LogRules:
    """The layout's engine and phases; without one (or with engine none) the engine is learnt
    from the log's own lines."""
    return LogRules(layout.engine if layout else "auto", layout.phases if layout else None)


@dataclass
class OperatorKill:
    """A process the operator's own kill signalled (`k`, `K`, a relaunch's stop): its death is not
    a crash, however late it comes."""

    pid: int
    started: float | None  # the host's start time of the process as planned (epoch)
    at: float  # local monotonic time of the kill
    why: str
    crashed_before: bool  # the run already read as crashed when the operator killed it


def named_processes(rec: Mapping[str, Any]) -> list[tuple[int, float | None]]:
    """The processes a host record names: (pid, start time on the host's clock)."""
    out = []
    for item in rec.get("processes") or []:
        if isinstance(item, list) and item and isinstance(item[0], int):
            started = item[2] if len(item) > 2 and isinstance(item[2], (int, float)) else None
            out.append((item[0], started))
    return out


def same_process(proc: Proc, started: float | None) -> bool:
    """The process is the one recorded: its pid, and its start time where both are known."""
    return started is None or proc.started is None or abs(started - proc.started) < 1.0


@dataclass(frozen=True)
class LinkView:
    """What the screen reads of the link to the host (its header, its bindings): why it is down
    or was lost, and how often it came back. Read-only: acting goes through the monitor's verbs."""

    error: str | None
    lost_reason: str | None
    reconnects: int


@runtime_checkable
class Monitor(Protocol):
    """What every kind of monitor is (one host: HostMonitor; a run spanning Slurm nodes:
    ClusterMonitor; a recorded moment: ReplayMonitor): the screen, the fleet, the exporter, every
    command and every workflow (cockpit/operate/) rely on this and nothing else. A type checker
    holds each kind to it (tests/architecture/test_types.py runs mypy); MonitorBase writes once what they all
    do the same way."""

    phase: Phase
    verdict: Verdict
    watchdog: Watchdog
    run: Run
    stopping: str | None
    forensics: Forensics | None
    looked_s: float | None
    live: bool
    forensics_on: bool  # gathers a stall's forensics itself (off in a fleet's overview, under --read-only)

    @property
    def state(self) -> HostState: ...
    @property
    def target(self) -> Target: ...
    @property
    def layout(self) -> Layout | None: ...
    @property
    def following(self) -> Mapping[str, Any] | None: ...
    @property
    def probes(self) -> dict[tuple[int, str], dict[str, Any]]: ...
    @property
    def shm_held(self) -> dict[tuple[int, int], float]: ...

    def follow(self, run: Run | None, resumed: bool = False) -> None: ...
    def scope(self) -> Scope: ...
    def subscribe(self, fn: Callable[[MonitorEvent], None]) -> Callable[[], None]: ...
    def update(self, now: float | None = None) -> None: ...
    def decided(self) -> bool: ...
    def still_looking(self, since: float) -> bool: ...
    def new_run(self, started: float | None = None, resumed: bool = False) -> None: ...
    def run_ended(self) -> None: ...
    def replayed(self) -> tuple[Phase, Verdict]: ...
    def stopping_for(self, why: str, plan: KillPlan | None = None) -> AbstractContextManager[None]: ...
    def judging(self) -> AbstractAsyncContextManager[None]: ...
    def attached(self, samples: int = 1) -> AbstractAsyncContextManager[Any]: ...
    async def open(self, kept: bool = False) -> None: ...
    async def keep(self, retry_first: bool = False) -> None: ...
    async def close(self) -> None: ...
    async def look(self, wait: float | None = None) -> float: ...
    async def watch_for(self, seconds: float) -> None: ...
    async def forensics_done(self) -> None: ...
    async def stop(
        self, plan: KillPlan, why: str, wait: float | None = None, whole_run: bool = True
    ) -> dict[str, Any]: ...
    async def plan_dump(
        self, root: int | None = None, verb: str = "dump", live_only: bool = False, run: Run | None = None
    ) -> dumps.DumpPlan: ...
    async def plan_stop(self, scope: Scope | None = None, allow_ambiguous: bool = False) -> KillPlan: ...
    async def shm_audit(self, folder: str = kill.SHM_DEFAULT, uid: int | None = None) -> dict[str, Any]: ...
    async def shm_clean(
        self, entries: list[Any], folder: str = kill.SHM_DEFAULT, uid: int | None = None, other_dir: bool = False
    ) -> dict[str, Any]: ...
    async def host_facts(self, items: list[str], pids: list[int], timeout: float = 60) -> dict[str, Any]: ...
    async def run_versions(self) -> dict[str, Any]: ...
    async def check_launch(self, spec: RunSpec) -> None: ...
    def link(self) -> LinkView | None: ...
    def launch_python(self) -> str: ...
    def sim_flags(self) -> list[str]: ...
    async def wait_samples(self, n: int = 1, timeout: float = 30.0) -> None: ...
    async def ras(self) -> dict[str, Any]: ...
    async def metrics_page(self, port: int, path: str) -> dict[str, Any]: ...
    async def flight_ranks(self, verb: str = "flightrec") -> tuple[list[int], list[str]]: ...
    async def flight_dump_raw(self, pids: list[int], trigger: bool) -> dict[str, Any]: ...
    def link_describe(self) -> dict[str, Any] | None: ...
    async def pyspy_check(
        self, upload: bool = False, say: Callable[[str], None] | None = None
    ) -> tuple[str | None, dict[str, Any]]: ...
    def pyspy_missing(self, check: dict[str, Any]) -> dumps.PyspyMissing: ...
    async def flight_record(
        self, trigger: bool = True, root: int | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]: ...
    async def launch(self, spec: RunSpec) -> Run: ...
    async def dump_stacks(
        self,
        plan: dumps.DumpPlan,
        folder: str | None = None,
        upload: bool = False,
        say: Callable[[str], None] | None = None,
        deadline_s: float = 20.0,
    ) -> dumps.DumpSet: ...


class MonitorBase:
    """What every kind of monitor (one host, a run spanning nodes) does the same way, written once:

    - the one door to the run (`follow`): the run, its watch, a fresh judge, the ledger's note;
    - the one-shot look every headless command takes (snapshot in every format, bundle, a fleet's
      rows): judge until the verdict is a claim (`decided`, `still_looking`), or exactly `wait`
      seconds;
    - the one stop workflow (`stop`): the screen's `k`/`K`, `cockpit kill`, a relaunch and an
      ablation's end all call it and keep only their own confirm and report."""

    live = True  # False: a recorded moment (ReplayMonitor), nothing on a host to act on
    forensics_on = False
    state: HostState
    session: Any
    target: Target
    layout: Layout | None
    phase: Phase
    verdict: Verdict
    watchdog: Watchdog
    stopping: str | None
    run: Run
    kept = False  # the look is kept (the screen, the fleet): its door writes what it sees of the run
    looked_s: float | None = None  # how long the last one-shot look judged, from the connection on
    opened_at: float | None = None  # when the connection was asked for (local monotonic)
    forensics: Forensics | None = None  # the current stall's (cockpit/actions/forensics.py), once gathered
    _watch_moved = False  # the door moved the watch: the first sample under it drops what the last one left
    _forensics_task: asyncio.Task[None] | None = None
    _forensics_for: tuple[object, ...] | None = None  # the stall they were gathered for
    _listeners: list[Callable[[MonitorEvent], None]]

    def new_run(self, started: float | None = None, resumed: bool = False) -> None:
        raise NotImplementedError

    def update(self, now: float | None = None) -> None:
        raise NotImplementedError

    def kills(self) -> dict[int, OperatorKill]:
        """The operator's kills known now (pid -> kill), until a new run: this cockpit's, and the
        stops the host's record holds."""
        raise NotImplementedError

    def run_ended(self) -> None:
        raise NotImplementedError

    def stopping_for(self, why: str, plan: KillPlan | None = None) -> AbstractContextManager[None]:
        raise NotImplementedError

    async def watch_for(self, seconds: float) -> None:
        raise NotImplementedError

    def subscribe(self, fn: Callable[[MonitorEvent], None]) -> Callable[[], None]:
        """Call fn with each MonitorEvent; returns the function that stops it."""
        self._listeners.append(fn)
        return lambda: self._listeners.remove(fn) if fn in self._listeners else None

    def _emit(self, event: MonitorEvent) -> None:
        if event.kind == "verdict" and self.session.watch_current():
            note_verdict(
                self.run, self.verdict
            )  # the run's history in the ledger, whoever listens (never of a sample taken
            # before the run was watched: a look that is cancelled at its prompt writes nothing)
        for fn in list(self._listeners):
            fn(event)

    @property
    def following(self) -> Mapping[str, Any] | None:
        """The ledger's record of the run followed, if any."""
        return self.run.record

    def follow(self, run: Run | None, resumed: bool = False) -> None:
        """The one door to the run: follow `run` from now on (launched, resumed, adopted, the
        demo's); None: the layout's run as the kill's rules find it on the host. It sets the run,
        the watch (the run's process group and log alone; None keeps the watch), a fresh judge,
        and notes in the ledger when the run's leader was seen alive. `resumed`: the run was under
        way before this look, so its log is read from its start and its clock from first sight;
        else what the logs hold now is an earlier run's and its clock starts at its leader's start."""
        run = note_seen(run, self.kept) if run is not None else Run(self.layout)
        rec = run.record or {}
        self.new_run(None if resumed else self._leader_clock(rec), resumed)
        self.run = run
        if rec.get("pgid") is not None:
            self.session.watch_run(int(rec["pgid"]), rec.get("log"))
            self._watch_moved = True
        elif rec.get("root") is not None:  # found on the host (its port, its command): its own tree alone
            self.session.watch_run(None, rec.get("log"), pids=[int(rec["root"])])
            self._watch_moved = True

    def _leader_clock(self, rec: Mapping[str, Any]) -> float:
        """The run's start on the local monotonic clock: its leader's start on the host where the
        last sample shows it, else now."""
        now = time.monotonic()
        leader = self.state.procs.get(int(rec.get("pid") or rec.get("pgid") or 0))
        ts = self.state.sample_ts
        if leader is not None and leader.started and ts:
            return now - max(0.0, ts - leader.started)
        return now

    def scope(self) -> Scope:
        """The run followed as the hints the agent resolves on the host (the kill's rules)."""
        return self.run.scope(self.session.watch)

    def _judgeable(self) -> bool:
        """Whether the sample in hand shows what is watched now. The first after the door moved
        the watch drops what the last watch left (its processes are not this run's deaths)."""
        if self.session.watch_changing:
            return False
        if self._watch_moved:
            self._watch_moved = False
            self.state.forget_dead()
        return True

    def metrics_expected(self) -> bool:
        return bool(self.layout and self.layout.metrics and self.layout.ports)

    def decided(self) -> bool:
        """Whether the verdict is a claim a first look can stand on: not `watching`, and, where the
        layout has the engine's metrics and its port is open, two scrapes read together (tokens
        moving or frozen)."""
        if not self.state.seq or self.verdict.name == VerdictName.WATCHING or not self.session.watch_current():
            return False
        port = self.layout.ports[0] if self.layout is not None and self.layout.ports else None
        if (
            self.verdict.name == VerdictName.OK
            and self.metrics_expected()
            and any(pt.listening and pt.port == port for pt in self.state.ports)
        ):
            view = self.state.metrics
            good = [s for s in view.scrapes if not s.error]
            return len(good) >= 2 or any(s.status == 404 for s in view.scrapes)
        return True

    def still_looking(self, since: float) -> bool:
        """Whether a one-shot look begun at `since` (local monotonic) goes on: not decided, the
        verdict's own `until` (the stall windows from the run's last sign of work, on the host's
        clock) not passed by two samples, and never past PLAIN_LOOK_S: a plain look answers in
        seconds whatever it finds (what it could not decide, it says, with how to watch longer)."""
        if self._log_went_quiet(since):
            return time.monotonic() < since + PLAIN_LOOK_S
        if self.decided():
            return False
        slack = 2 * self.session.opts.interval + 1.0
        if time.monotonic() >= since + min(PLAIN_LOOK_S, max(self.watchdog.idle_s, self.watchdog.spin_s) + slack):
            return False
        until, ts = self.verdict.until, self.state.sample_ts
        return until is None or ts is None or ts < until + slack

    def _log_went_quiet(self, since: float) -> bool:
        """`ok` on the log's work alone, and no line written since the look began (`since`, local
        monotonic): a hang that began a moment before the look reads so. The look goes on while a
        stack look can still decide (the watchdog's fast stall), never past PLAIN_LOOK_S."""
        v, ts, got = self.verdict, self.state.sample_ts, self.state.received_at
        if v.name != VerdictName.OK or not v.evidence or not self.watchdog.looks or ts is None or got is None:
            return False
        if not all(e.startswith("the log shows work") for e in v.evidence):
            return False
        log = next((lg for lg in self.state.logs.values() if lg.written_at is not None), None)
        return log is not None and log.written_at is not None and log.written_at < ts - (got - since)

    def _judge_afresh(self, started: float | None = None, resumed: bool = False) -> None:
        """A run starts (or the last one ended): its phases, clocks and dead processes are
        history; a fresh watchdog reads only what comes from now (`started`, local monotonic), or
        (`resumed`) the whole of what the logs hold."""
        self.watchdog = watchdog_for(self.layout)
        self.state.forget_dead()
        if not resumed:
            self.watchdog.begin(self.state, started if started is not None else time.monotonic())

    async def wait_current(self, timeout: float = 30.0) -> None:
        """Until a sample shows what is watched now: a watch changed right after connecting (the
        run the ledger or the demo names, followed) is answered and sampled, so even the instant
        look judges the run's processes and log, never the sample taken before them."""
        deadline = time.monotonic() + timeout
        while not self.session.watch_current():
            left = deadline - time.monotonic()
            if left <= 0:
                raise CockpitError(
                    f"{self.target.label}: the agent did not sample what is watched "
                    f"(the run's processes and log) within {timeout:.0f} s"
                )
            await self.session.wait_samples(1, left)

    async def look(self, wait: float | None = None) -> float:
        """`wait` None judges while `still_looking`, then waits for a stall's forensics under
        way; `wait` S judges exactly S seconds (0: the instant look, `watching` when undecided).
        Returns how long it looked, from the connection on, also kept as `looked_s`."""
        start = time.monotonic()
        if wait is not None:
            if wait > 0:
                await self.watch_for(wait)
        else:
            async with self.judging():
                while self.still_looking(start):
                    await asyncio.sleep(0.1)
                await self.forensics_done()
            self.say_undecided()
        self.looked_s = round(time.monotonic() - (self.opened_at or start), 1)
        return self.looked_s

    def say_undecided(self) -> None:
        """A plain look that ends `watching`: what would decide it, and how to watch for it."""
        v = self.verdict
        if v.name == VerdictName.WATCHING:
            until = time.strftime("%H:%M:%S", time.localtime(v.until)) if v.until else None
            v.evidence = v.evidence + [
                "not decided in this look: watch longer with --wait S"
                + (f" (the stall thresholds decide by {until})" if until else "")
            ]

    @asynccontextmanager
    async def judging(self) -> AsyncIterator[None]:
        yield

    async def stop(self, plan: KillPlan, why: str, wait: float | None = None, whole_run: bool = True) -> dict[str, Any]:
        """Stop the run as `plan` (a confirmed KillPlan) says: the ledger first keeps what was
        seen of the run and who stops it, from where and when (so every cockpit watching it, in
        any process, reads the deaths as the operator's: `stopped`, never `crashed`); while the
        kill runs its ranks read `stopping`; a whole run verified gone is `no run`. Returns the
        kill's report (docs/layouts.md#what-actions-touch), with its one-line `summary`."""
        record_seen(self.run, self.verdict, self.phase, self.watchdog.phase_times())
        note_stop(self.run, plan, why)
        if wait is None:
            wait = self.layout.kill_wait_s if self.layout else kill.DEFAULT_KILL_WAIT_S
        with self.stopping_for(why, plan):
            began = time.monotonic()
            report = await kill.kill(
                self.session, plan, wait, self.layout.ports if self.layout else [], why, self.run.run_id
            )
            report["seconds"] = round(time.monotonic() - began, 1)
            report["summary"] = kill.summarize_kill(plan, report)
            if report["verified"] and not plan.scope.pids:
                record_ended(self.run, plan)
            if whole_run and report["verified"]:
                self.run_ended()
        return report

    # The acts on the host, each planned (what it will touch, for the operator to confirm), then
    # carried out exactly as planned; the floors above (ui, cli, operate) act through these alone.

    async def plan_stop(self, scope: Scope | None = None, allow_ambiguous: bool = False) -> KillPlan:
        """What a stop of `scope` (the run followed) would signal: carried out by `stop`."""
        return await kill.plan_kill(self.session, scope or self.scope(), allow_ambiguous)

    async def shm_audit(self, folder: str = kill.SHM_DEFAULT, uid: int | None = None) -> dict[str, Any]:
        """Every entry of the shared-memory folder, each removable or kept with its reason."""
        return dict(await kill.shm_audit(self.session, folder, uid))

    async def shm_clean(
        self, entries: list[Any], folder: str = kill.SHM_DEFAULT, uid: int | None = None, other_dir: bool = False
    ) -> dict[str, Any]:
        """Remove exactly these audited entries, each re-checked on the host."""
        return dict(await kill.shm_clean(self.session, entries, folder, uid, other_dir))

    async def _request(self, cmd: str, timeout: float, **args: Any) -> dict[str, Any]:
        """One agent command, for the verbs that are one question to the host: the one place they
        reach the link (a replayed snapshot refuses here, in words, whatever the verb)."""
        return await self.session.request(cmd, timeout=timeout, **args)  # type: ignore[no-any-return]

    async def host_facts(self, items: list[str], pids: list[int], timeout: float = 60) -> dict[str, Any]:
        """The host's facts (`items` of nvidia_smi, xid, versions; the versions of these pids' run)."""
        return await self._request("host_facts", timeout, items=items, pids=pids)

    async def run_versions(self) -> dict[str, Any]:
        """The driver and CUDA, and the package versions of the run alive now (read by the agent
        from its first ranks' package metadata); what the host does not say is left out."""
        pids: list[int] = []
        try:
            pids = [pid for _, pid in (await self.plan_dump(verb="bisect", live_only=True)).ranks]
        except CockpitError:
            pass
        try:
            answer = await self.host_facts(["versions"], pids[:2])
        except CockpitError:
            return {}
        return dict((answer.get("versions") or {}).get("data") or {})

    async def check_launch(self, spec: RunSpec) -> None:
        """A launch's check alone (interpreter, import path, workdir): a refusal starts nothing."""
        await launch.check_launch(self.session, self._launch_layout(), spec)

    async def launch(self, spec: RunSpec) -> Run:
        """Start the layout's run as `spec` says; the caller follows the Run returned."""
        return await launch.launch(self.session, self._launch_layout(), spec)

    async def pyspy_check(
        self, upload: bool = False, say: Callable[[str], None] | None = None
    ) -> tuple[str | None, dict[str, Any]]:
        """py-spy on the host (the layout's interpreter's, the PATH's, an earlier upload; `upload`:
        this cockpit's sent where there is none): its path, or None, and the check."""
        return await dumps.ensure_pyspy(self.session, upload, say, self._run_python())

    def _run_python(self) -> str | None:
        """The layout's interpreter, whose own bin (a venv's) is where py-spy is looked for first:
        by every dump, look and check of this monitor alike."""
        return self.layout.python if self.layout is not None else None

    def pyspy_missing(self, check: dict[str, Any]) -> dumps.PyspyMissing:
        """No py-spy on the host, said with where it was looked for and what upload is offered."""
        return dumps.missing(self.session, check)

    async def flight_record(
        self, trigger: bool = True, root: int | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Every live rank's flight-recorder dump of the run (`root` names it), compared."""
        return await dumps.collect(self.session, self.run, trigger, root)

    async def wait_samples(self, n: int = 1, timeout: float = 30.0) -> None:
        """Until `n` more samples of the host came in (a workflow's tick)."""
        await self.session.wait_samples(n, timeout=timeout)

    async def ras(self) -> dict[str, Any]:
        """NCCL RAS's verbose status, asked on the host (the bundle's)."""
        return await self._request("ras", 40)

    async def metrics_page(self, port: int, path: str) -> dict[str, Any]:
        """One scrape of the run's metrics page on the host's loopback."""
        return await self._request("metrics", 20, port=port, path=path)

    async def flight_ranks(self, verb: str = "flightrec") -> tuple[list[int], list[str]]:
        """The live ranks a flight-recorder read asks (as the kill finds the run), and those left alone."""
        return await dumps.run_rank_pids(self.session, self.run, verb=verb)

    async def flight_dump_raw(self, pids: list[int], trigger: bool) -> dict[str, Any]:
        """The ranks' flight-recorder dumps as the host read them, uncompared (the bundle keeps them)."""
        return await self._request("fr_dump", 60, pids=pids, trigger=trigger, raw=True, wait_s=15)

    def link_describe(self) -> dict[str, Any] | None:
        """How a container or a Slurm node was reached and whose pids (docs/targets.md); None for a host."""
        describe = getattr(getattr(self.session, "link", None), "describe", None)
        return describe() if describe is not None else None

    def launch_python(self) -> str:
        """The interpreter a launch of the layout runs (a simulated host's: the agent's own)."""
        return launch.launch_python(self._launch_layout(), self.session)

    def sim_flags(self) -> list[str]:
        """The simulated server's flags a launch on a simulated host adds; none on a real one."""
        return launch.sim_flags(self._launch_layout(), self.session)

    def link(self) -> LinkView | None:
        """The link as the screen reads it; None for a recorded moment (no link)."""
        if self.session is None:
            return None
        return LinkView(self.session.link_error, self.session.lost_reason, self.session.reconnects)

    def _launch_layout(self) -> Layout:
        if self.layout is None:
            raise CockpitError("a relaunch needs a layout: it names what is launched")
        return self.layout

    async def plan_dump(
        self, root: int | None = None, verb: str = "dump", live_only: bool = False, run: Run | None = None
    ) -> dumps.DumpPlan:
        """The ranks a stack dump of `run` (the run followed) would touch: the plan to show."""
        return await dumps.plan_dump(self.session, run or self.run, root, verb, live_only)

    async def dump_stacks(
        self,
        plan: dumps.DumpPlan,
        folder: str | None = None,
        upload: bool = False,
        say: Callable[[str], None] | None = None,
        deadline_s: float = 20.0,
    ) -> dumps.DumpSet:
        """Carry out a dump plan: the ranks' stacks, kept in `folder` (the run's own by default)."""
        return await dumps.dump_ranks(
            self.session,
            plan.ranks,
            folder or plan.run.folder_name(self.target.label),
            upload=upload,
            deadline_s=deadline_s,
            say=say,
            python=self._run_python(),
        )

    def _stall_forensics(self) -> None:
        """A stall declared on the run followed: its forensics are gathered once, by one cockpit
        for all (every rank's stack, the flight recorder where armed), kept in the host's record;
        whoever looks at the same stall (another screen, the exporter, a cold look) reads them
        there, and what they found joins the verdict."""
        stalled = self.verdict.name in (VerdictName.STALLED_IDLE, VerdictName.STALLED_SPINNING)
        if not stalled:
            self._forensics_for = None
            return
        if self.forensics is None:
            self.forensics = self._forensics_of_this_stall("done")
        key = (self.state.generation, id(self.watchdog))
        if self.forensics is None and key != self._forensics_for and not self.stopping:
            claimed = self._forensics_of_this_stall("gathering") is not None
            if claimed or self.forensics_on:
                self._forensics_for = key
                try:
                    self._forensics_task = asyncio.get_running_loop().create_task(self._gather_forensics(claimed))
                except RuntimeError:
                    self._forensics_for = None  # judged outside the event loop (a test feeding states)
        if self.forensics is not None and self.forensics.finding is not None:
            self.verdict = merge(self.verdict, [self.forensics.finding], self.state)

    _look_task: asyncio.Task[None] | None = None
    _looks_off: str | None = None  # why this run's stacks cannot be looked at (no py-spy, no ptrace rights)

    def _stack_look(self) -> None:
        """The watchdog's fast stall (diagnose.Watchdog._fast): the cheap signals are silent, so every
        rank's stack is looked at twice (forensics.look), one look at a time, by a monitor that
        gathers forensics (auto_dump, not --read-only); the look is judged as soon as it is back."""
        dog = self.watchdog
        dog.looks = self.forensics_on and self._looks_off is None
        if (
            not dog.want_look
            or not dog.looks
            or self.stopping
            or (self._look_task is not None and not self._look_task.done())
        ):
            return
        dog.want_look = False
        try:
            self._look_task = asyncio.get_running_loop().create_task(self._take_look(dog))
        except RuntimeError:
            pass  # judged outside the event loop (a test feeding states)

    async def _take_look(self, dog: Watchdog) -> None:
        try:
            found = await forensics.look(self.session, self.run, LOOK_GAP_S, self._run_python())
        except CockpitError as exc:
            self._looks_off = str(exc)
            self.state.notes.append(f"stack look: {exc}")
            dog.looks = False
            return
        if dog is self.watchdog:
            dog.seen_stacks(found)
            self.update()
            self._emit(MonitorEvent("sample"))

    def _stall_records(self, state: str) -> list[dict[str, Any]]:
        """The host's forensics records (`gathering` claims or `done`) of this stall: naming a
        live rank of the run followed, written since the stall began."""
        since = self.verdict.since
        if since is None:
            return []
        live = {p.pid: p for p in self.state.ranks() if p.alive}
        if state == "gathering":
            since = max(since, (self.state.sample_ts or time.time()) - forensics.DEADLINE_S - 40)  # a claim expires
        return [
            r
            for r in self.state.acts_of("forensics", since - 5)
            if r.get("state") == state
            and any(pid in live and same_process(live[pid], started) for pid, started in named_processes(r))
        ]

    def _forensics_of_this_stall(self, state: str = "done") -> Any:
        """The forensics another cockpit (or this one) gathered for this stall (`done`), or the
        claim of one gathering them now (`gathering`, earliest first)."""
        recs = self._stall_records(state)
        if state == "gathering":
            return min(recs, key=lambda r: (r["at"], r["id"])) if recs else None
        doc = recs[-1].get("doc") if recs else None
        return (
            forensics.Forensics.from_doc(doc)
            if isinstance(doc, dict) and isinstance(doc.get("at"), (int, float))
            else None
        )

    async def _note_forensics(self, state: str, doc: dict[str, Any] | None = None) -> dict[str, Any] | None:
        ranks = [[p.pid, None, p.started] for p in self.state.ranks() if p.alive]
        try:
            noted: dict[str, Any] = await self.session.request(
                "note",
                act="forensics",
                state=state,
                processes=ranks,
                since=self.verdict.since,
                run_id=self.run.run_id,
                doc=doc,
            )
        except CockpitError as exc:
            self.state.notes.append(f"stall forensics: not kept on the host: {exc}")
            return None
        return noted

    async def _gather_forensics(self, claimed: bool = False) -> None:
        """Gather this stall's forensics, unless another cockpit claimed them first: then wait for
        theirs (py-spy on a rank another dump holds answers nothing)."""
        if not claimed:
            mine = await self._note_forensics("gathering")
            if mine is not None:  # two cockpits claimed at once: the earlier claim gathers
                try:
                    await self.session.wait_samples(2)
                except CockpitError:
                    return
                first = self._forensics_of_this_stall("gathering")
                claimed = first is not None and first.get("id") != mine.get("id")
        if claimed:
            deadline = time.monotonic() + forensics.DEADLINE_S + 40
            while self.forensics is None and time.monotonic() < deadline:
                try:
                    await self.session.wait_samples(1, timeout=max(1.0, deadline - time.monotonic()))
                except CockpitError:
                    break
                self.forensics = self._forensics_of_this_stall("done")
            self.update()
            self._emit(MonitorEvent("sample"))
            return
        run = self.run.folder_name(self.target.label)
        self.state.notes.append(
            "stalled: gathering every rank's stack once (auto_dump: false or --no-forensics turns it off)"
        )
        found = await forensics.gather(self.session, self.run, run, self._run_python())
        doc = found.doc()
        if self.layout is not None and self.run.run_id:  # in the ledger by the time anyone sees them
            append_ledger(self.layout, {"event": "forensics", "run_id": self.run.run_id, "forensics": doc})
        self.forensics = found
        if found.finding is not None:
            self.state.notes.append(f"stall forensics: {'; '.join(found.finding.evidence)} ({found.folder})")
        elif found.error:
            self.state.notes.append(f"stall forensics: none gathered: {found.error}")
        await self._note_forensics("done", dict(doc, lines=[line[:400] for line in doc["lines"][:60]]))
        self.update()
        self._emit(MonitorEvent("sample"))

    async def forensics_done(self) -> None:
        """Wait for a stall's forensics under way (a one-shot look reports them)."""
        task = self._forensics_task
        if task is not None and not task.done():
            try:
                await asyncio.wait_for(asyncio.shield(task), forensics.DEADLINE_S + 40)
            except (asyncio.TimeoutError, CockpitError):
                pass

    def _operators(self, phase: Phase, verdict: Verdict) -> tuple[Phase, Verdict]:
        """The operator's own kills read as theirs: `stopping` while the kill runs; after it, ranks
        the operator killed being gone, and the ranks of the run that went down after them, are
        `stopped`, never `crashed` (unless the run had crashed before the kill). A run whose
        every rank went that way is in phase `stopped`."""
        if self.stopping:
            if phase.name == "crashed":
                phase = Phase("stopped", line=phase.line)
            return phase, Verdict(VerdictName.STOPPING, [self.stopping])
        kills = self.kills()
        if verdict.name != VerdictName.CRASHED or not kills:
            return phase, verdict
        if any(k.crashed_before for k in kills.values()):
            return phase, verdict
        ranks = [p for p in self.state.procs.values() if p.rank is not None]
        dead = [p for p in ranks if not p.alive or p.status == "Z"]
        killed = [p for p in dead if self._killed(p)]
        first = min(k.at for k in kills.values())
        if dead and not killed:
            return phase, verdict
        if any(p not in killed and (p.gone_at or 0.0) < first for p in dead):
            return phase, verdict  # a rank that died before the operator's kill: a crash
        if not dead and not (verdict.evidence and verdict.evidence[0].startswith("expected ")):
            return phase, verdict  # a failure the log tells while no rank is gone: not the kill's doing
        k = kills[killed[0].pid] if killed else min(kills.values(), key=lambda k: k.at)
        stamp = time.strftime("%H:%M:%S", time.localtime(time.time() - (time.monotonic() - k.at)))
        ev = [
            f"{'rank ' + ', '.join(str(p.rank) for p in killed) if killed else f'pid {k.pid}'} stopped by the "
            f"operator ({k.why}, {stamp})"
        ]
        others = [p for p in dead if p not in killed]
        if others:
            ev.append(
                f"{count(len(others), 'more rank')} of the run went down after it: "
                f"{', '.join(str(p.rank) for p in others)}"
            )
        if phase.name == "crashed":
            phase = Phase("stopped", line=phase.line)
        return phase, Verdict(VerdictName.STOPPED, ev)

    def _killed(self, proc: Proc) -> bool:
        k = self.kills().get(proc.pid)
        return k is not None and same_process(proc, k.started)
