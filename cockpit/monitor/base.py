"""What every monitor is: the protocol the screen, the fleet and every command rely on (one host:
cockpit/monitor/host.py; a run spanning Slurm nodes: cluster.py; a recorded moment: replay.py),
and what they all do the same way, written once: listeners, the run followed, the one-shot look,
the one stop workflow."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager, AbstractContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from cockpit.actions import kill
from cockpit.actions.forensics import Forensics
from cockpit.actions.kill import KillPlan
from cockpit.common.errors import CockpitError
from cockpit.judge.diagnose import Watchdog
from cockpit.judge.evidence import default_sources
from cockpit.host.state import HostState
from cockpit.judge.verdict import Phase, Verdict, VerdictName
from cockpit.link.target import Target
from cockpit.read.logrules import LogLine, LogRules
from cockpit.runs.config import Layout
from cockpit.runs.ledger import (
    note_seen,
    note_stop,
    note_verdict,
    record_ended,
    record_seen,
    typical_phase_seconds,
)
from cockpit.runs.run import Run, Scope

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
    return Watchdog(s.idle_s, s.spin_s, s.slow_factor, typical_phase_seconds(layout), layout.ports,
                    sources=default_sources(), metrics=bool(layout.metrics and layout.ports))


def rules_for(layout: Layout | None) -> LogRules:
    """The layout's engine and phases; without one (or with engine none) the engine is learnt
    from the log's own lines."""
    return LogRules(layout.engine if layout else "auto", layout.phases if layout else None)


@runtime_checkable
class Monitor(Protocol):
    """What every kind of monitor is (one host: HostMonitor; a run spanning Slurm nodes:
    ClusterMonitor; a recorded moment: ReplayMonitor): the screen, the fleet, the exporter, every
    command and every workflow (cockpit/operate/) rely on this and nothing else. A type checker
    holds each kind to it (tests/test_types.py runs mypy); MonitorBase writes once what they all
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
    def session(self) -> Any: ...  # a HostSession; a ClusterSession over the nodes' ones; None for a recorded moment
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
    async def stop(self, plan: KillPlan, why: str, wait: float | None = None,
                   whole_run: bool = True) -> dict[str, Any]: ...


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
    _listeners: list[Callable[[MonitorEvent], None]]

    def new_run(self, started: float | None = None, resumed: bool = False) -> None:
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
            note_verdict(self.run, self.verdict)  # the run's history in the ledger, whoever listens (never of a sample taken
            # before the run was watched: a look that is cancelled at its prompt writes nothing)
        for fn in list(self._listeners):
            fn(event)

    _watch_moved = False
    looked_s: float | None = None  # how long the last one-shot look judged, from the connection on
    opened_at: float | None = None  # when the connection was asked for (local monotonic)
    forensics: Forensics | None = None  # the current stall's (cockpit/actions/forensics.py), once gathered

    @property
    def following(self) -> Mapping[str, Any] | None:
        """The ledger's record of the run followed, if any."""
        return self.run.record

    kept = False  # the look is kept (the screen, the fleet): its door writes what it sees of the run

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
        if self.verdict.name == VerdictName.OK and self.metrics_expected() and any(
                pt.listening and pt.port == port for pt in self.state.ports):
            view = self.state.metrics
            good = [s for s in view.scrapes if not s.error]
            return len(good) >= 2 or any(s.status == 404 for s in view.scrapes)
        return True

    def still_looking(self, since: float) -> bool:
        """Whether a one-shot look begun at `since` (local monotonic) goes on: not decided, the
        verdict's own `until` (the stall windows from the run's last sign of work, on the host's
        clock) not passed by two samples, and never past PLAIN_LOOK_S: a plain look answers in
        seconds whatever it finds (what it could not decide, it says, with how to watch longer)."""
        if self.decided():
            return False
        slack = 2 * self.session.opts.interval + 1.0
        if time.monotonic() >= since + min(PLAIN_LOOK_S, max(self.watchdog.idle_s, self.watchdog.spin_s) + slack):
            return False
        until, ts = self.verdict.until, self.state.sample_ts
        return until is None or ts is None or ts < until + slack

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
                raise CockpitError(f"{self.target.label}: the agent did not sample what is watched "
                                   f"(the run's processes and log) within {timeout:.0f} s")
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
            v.evidence = v.evidence + ["not decided in this look: watch longer with --wait S"
                                       + (f" (the stall thresholds decide by {until})" if until else "")]

    @asynccontextmanager
    async def judging(self) -> AsyncIterator[None]:
        yield

    async def forensics_done(self) -> None:
        """Wait for a stall's forensics under way (a monitor that gathers them says how)."""

    async def stop(self, plan: KillPlan, why: str, wait: float | None = None,
                   whole_run: bool = True) -> dict[str, Any]:
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
            report = await kill.kill(self.session, plan, wait, self.layout.ports if self.layout else [], why,
                                     self.run.run_id)
            report["seconds"] = round(time.monotonic() - began, 1)
            report["summary"] = kill.summarize_kill(plan, report)
            if report["verified"] and not plan.scope.pids:
                record_ended(self.run, plan)
            if whole_run and report["verified"]:
                self.run_ended()
        return report
