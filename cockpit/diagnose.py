"""Where a run is: its phase from the log lines, the processes and the port. Pure functions over
HostState; nothing here touches the network."""

from __future__ import annotations

import itertools
import re
from collections import deque
from dataclasses import dataclass
from enum import Enum

from cockpit.logrules import LogLine, LogRules, LogTracker
from cockpit.model import HostState

@dataclass
class Phase:
    name: str
    detail: str = ""
    line: str = ""

    def __str__(self) -> str:
        return f"{self.name} {self.detail}".strip()


def phase_of(state: HostState, log_path: str | None = None) -> Phase:
    """The run's phase from its log (lines carry their phase, classified on arrival), corrected by
    what the processes say."""
    log = state.logs.get(log_path) if log_path else next(iter(state.logs.values()), None)
    marks = [line for line in log.lines if line.phase] if log is not None else []
    if not marks:
        return _corrected(state, Phase("starting" if state.live_procs() else "no run"))
    last = marks[-1]
    shards = last.shards or next((m.shards for m in reversed(marks) if m.shards), None)
    return _corrected(state, _phase(last, shards))


def _phase(line: LogLine, shards: tuple[int, int] | None) -> Phase:
    phase = Phase(line.phase, line=line.text)
    if line.phase == "loading weights" and shards:
        phase.detail = f"{shards[0]}/{shards[1]} shards"
    return phase


def _corrected(state: HostState, phase: Phase) -> Phase:
    """What the processes say over the log: every rank gone is the end of the run."""
    ranks = [p for p in state.procs.values() if p.rank is not None]
    if ranks and all(not p.alive for p in ranks) and phase.name != "no run":
        return Phase("exited" if phase.name in ("ready", "serving") else "crashed", line=phase.line)
    return phase


# ----------------------------------------------------------------------------- verdicts

IDLE_CPU_PCT = 5.0
IDLE_GPU_PCT = 5.0
SPIN_GPU_PCT = 90.0
SPIN_POWER_SHARE = 0.3  # of the power limit: a kernel polling a flag draws little
RESIDENT_SHARE = 0.10  # of GPU memory: the model is loaded


class VerdictName(str, Enum):
    """Every verdict the cockpit gives, the one spelling used by the screen, fleet, ledger and JSON."""

    OK = "ok"
    WATCHING = "watching"  # processes are there, not enough seen yet to judge
    NO_RUN = "no run"
    STALLED_IDLE = "stalled-idle"
    STALLED_SPINNING = "stalled-spinning"
    CRASHED = "crashed"
    SLOW = "slow"
    STOPPING = "stopping"  # the operator's own kill or relaunch is under way: not a crash

    __str__ = str.__str__
    __format__ = str.__format__


ALERTING = (VerdictName.STALLED_IDLE, VerdictName.STALLED_SPINNING, VerdictName.CRASHED, VerdictName.SLOW)
V = VerdictName


@dataclass
class Verdict:
    name: VerdictName
    evidence: list[str]
    odd_rank: int | None = None

    def __post_init__(self) -> None:
        self.name = VerdictName(self.name)

    def __str__(self) -> str:
        return self.name if self.odd_rank is None else f"{self.name} (rank {self.odd_rank})"

    @property
    def alerting(self) -> bool:
        return self.name in ALERTING

    def doc(self) -> dict:
        return {"name": self.name.value, "evidence": list(self.evidence), "odd_rank": self.odd_rank}


class Watchdog:
    """Turns a stream of HostStates into a verdict with its evidence. It remembers since when each
    condition has held, and when each phase was first seen (time to each phase)."""

    def __init__(self, idle_s: float = 120.0, spin_s: float = 60.0, slow_factor: float = 3.0,
                 earlier: dict[str, float] | None = None, ports: list[int] | None = None):
        self.idle_s, self.spin_s, self.slow_factor = idle_s, spin_s, slow_factor
        self.earlier = earlier or {}  # phase -> typical seconds to reach it in earlier runs
        self.ports = list(ports or [])
        self.started: float | None = None
        self.phase_at: dict[str, float] = {}
        self._since: dict[str, float] = {}
        self._log_seen: tuple[str | None, int] = (None, 0)
        self.tracker = LogTracker(LogRules())  # the post-mortem rules `cockpit explain` uses, fed live
        self._errors: deque = deque(maxlen=3)
        self._phase_line: LogLine | None = None
        self._shards: tuple[int, int] | None = None
        self._generation = 0

    def _new_run(self) -> None:
        """The host state saw a new run replace the last one: its phases and crash are history."""
        self.started = None
        self.phase_at, self._since = {}, {}
        self.tracker = LogTracker(LogRules())
        self._phase_line, self._shards = None, None
        self._errors.clear()

    def _held(self, name: str, cond: bool, now: float) -> float:
        if not cond:
            self._since.pop(name, None)
            return 0.0
        return now - self._since.setdefault(name, now)

    def _phase(self, state: HostState) -> Phase:
        if self._phase_line is None:
            return _corrected(state, Phase("starting" if state.live_procs() else "no run"))
        return _corrected(state, _phase(self._phase_line, self._shards))

    def update(self, state: HostState, now: float, log_path: str | None = None) -> tuple[Phase, Verdict]:
        log = state.logs.get(log_path) if log_path else next(iter(state.logs.values()), None)
        if state.generation != self._generation:
            self._generation = state.generation
            self._new_run()
        self._scan_new_lines(log)
        phase = self._phase(state)
        ranks = [p for p in state.procs.values() if p.rank is not None]
        if self.started is None and (ranks or phase.name != "no run"):
            self.started = now
        if phase.name not in self.phase_at and self.started is not None:
            self.phase_at[phase.name] = now
            if phase.name == "serving":
                self.phase_at.setdefault("ready", now)  # serving implies it was ready
        last = log.last_line_at if log is not None and log.last_line_at is not None else self.started
        quiet_s = now - (last if last is not None else now)
        crashed = self._crashed(state, ranks, log, phase)
        if crashed:
            return phase, crashed
        if not ranks:
            return phase, Verdict("no run" if phase.name == "no run" else "watching", [])
        alive = [p for p in ranks if p.alive and p.status != "Z"]
        gpus = [state.gpus[i] for p in alive for i in p.gpus if i in state.gpus]
        port_open = any(pt.listening for pt in state.ports if pt.port in self.ports)  # the server's own ports
        resident = gpus and all((g.mem_used_mib or 0) > RESIDENT_SHARE * (g.mem_total_mib or 1) for g in gpus)
        idle = (alive and gpus and all(p.cpu_pct < IDLE_CPU_PCT for p in alive)
                and all((g.util_pct or 0) < IDLE_GPU_PCT for g in gpus) and resident and not port_open)
        held = self._held("idle", bool(idle), now)
        if idle and held >= self.idle_s and quiet_s >= self.idle_s:
            return phase, Verdict("stalled-idle", [
                f"all {len(alive)} ranks alive, CPU < {IDLE_CPU_PCT:.0f} % (max {max(p.cpu_pct for p in alive):.1f} %)",
                f"GPU utilization < {IDLE_GPU_PCT:.0f} % on all {len(gpus)} GPUs with "
                f"{min(g.mem_used_mib or 0 for g in gpus) / 1024:.0f} GiB or more resident",
                f"log silent for {quiet_s:.0f} s, port {'closed' if not port_open else 'open'}",
                f"in phase '{phase}' for {held:.0f} s (threshold {self.idle_s:.0f} s)",
            ])
        spin, odd, ev = self._spin(alive, state)
        held = self._held("spin", spin, now)
        if spin and held >= self.spin_s and quiet_s >= self.spin_s:
            ev = ev + [f"held for {held:.0f} s, log silent for {quiet_s:.0f} s"]
            if port_open:
                ev.append("the port still answers: health alone does not prove progress")
            return phase, Verdict("stalled-spinning", ev, odd)
        slow = self._slow(phase, now)
        if slow:
            return phase, slow
        return phase, Verdict("ok", [])

    @staticmethod
    def _spin(alive, state: HostState) -> tuple[bool, int | None, list[str]]:
        """A collective that never completes, as seen on H200s (docs/VALIDATION.md): the GPUs of
        the ranks waiting in it sit at 100 % utilization drawing near-idle power (a kernel polling
        a flag), while the GPU of a rank that is elsewhere is idle. No GPU does real work."""
        per_rank = {}
        for p in alive:
            gs = [state.gpus[i] for i in p.gpus if i in state.gpus]
            if gs:
                per_rank[p.rank] = gs[0]
        if not per_rank:
            return False, None, []

        def spinning(g):
            return (g.util_pct or 0) >= SPIN_GPU_PCT and g.power_w is not None and bool(g.power_limit_w) \
                and g.power_w < SPIN_POWER_SHARE * g.power_limit_w

        spin = [r for r, g in per_rank.items() if spinning(g)]
        idle = [r for r, g in per_rank.items() if (g.util_pct or 0) < IDLE_GPU_PCT]
        if not spin or len(spin) + len(idle) != len(per_rank):
            return False, None, []
        g = per_rank[spin[0]]
        ev = [f"GPU of rank{'s' if len(spin) > 1 else ''} {','.join(map(str, sorted(spin)))} at "
              f"{g.util_pct} % utilization drawing {g.power_w:.0f} W of {g.power_limit_w:.0f} W: "
              f"a kernel polling, not computing (a collective that never completes)"]
        odd = None
        if idle and len(idle) <= len(spin):
            odd = sorted(idle)[0] if len(idle) == 1 else None
            ev.append(f"GPU of rank {','.join(map(str, sorted(idle)))} idle: not in the collective"
                      + (f": rank {odd} is the odd one out" if odd is not None else ""))
        elif not idle and len(alive) >= 3:
            cpus = sorted(p.cpu_pct for p in alive)
            median = cpus[len(cpus) // 2]
            outliers = [p for p in alive if abs(p.cpu_pct - median) > 40]
            if len(outliers) == 1:
                odd = outliers[0].rank
                ev.append(f"rank {odd} is the odd one out: CPU {outliers[0].cpu_pct:.0f} % against "
                          f"{median:.0f} % for the others")
        return True, odd, ev

    def _scan_new_lines(self, log) -> None:
        """Reads only the lines that arrived since the last update: the verdict runs every frame
        and the buffer holds thousands of lines."""
        if log is None:
            return
        if log.path != self._log_seen[0]:
            self._log_seen = (log.path, 0)
            self.tracker, self._errors = LogTracker(LogRules()), deque(maxlen=3)
            self._phase_line, self._shards = None, None
        new = min(len(log.lines), log.total - self._log_seen[1])
        self._log_seen = (log.path, log.total)
        if new <= 0:
            return
        for line in itertools.islice(log.lines, len(log.lines) - new, None):
            self.tracker.add(line)
            if line.kind in ("failure", "error"):
                self._errors.append(line.text)
            if line.phase is not None:
                self._phase_line = line
                if line.shards:
                    self._shards = line.shards

    def _crashed(self, state, ranks, log, phase) -> Verdict | None:
        """Ranks dead (a zombie has exited), or the log telling a failure: crashed, naming the rank
        that failed first (a root cause before its consequences, as `cockpit explain` reads it)."""
        dead = [p for p in ranks if not p.alive or p.status == "Z"]
        first = self.tracker.first_failure()
        if not dead and first is None and phase.name != "crashed":
            return None
        rank = first.rank if first is not None and first.rank is not None else (dead[0].rank if dead else None)
        code = next((p.exit_code for p in dead if p.rank == rank and p.exit_code is not None), None)
        if code is None and first is not None:
            code = next((int(m) for m in re.findall(r"exit code:? (-?\d+)", first.text)), None)
        ev = []
        if rank is not None:
            ev.append(f"rank {rank} died" + (f" (exit code {code})" if code is not None else "")
                      + (f": {first.cause}" if first is not None and first.cause not in ("exception", "died") else ""))
        if dead:
            ev.append(f"{len(dead)} of {len(ranks)} ranks gone: {', '.join(str(p.rank) for p in dead)}")
        if first is not None:
            ev += [f"log: {text.strip()[:160]}" for _, text in first.evidence[:3]]
        ev += [f"log: {line.strip()[:160]}" for line in self._errors if first is None or
               all(line != text for _, text in first.evidence)][:3]
        return Verdict(VerdictName.CRASHED, ev, rank)

    def _slow(self, phase: Phase, now: float) -> Verdict | None:
        typical = self.earlier.get(phase.name)
        since = self.phase_at.get(phase.name)
        if not typical or since is None or phase.name in ("ready", "serving", "no run"):
            return None
        took = now - since
        if took > self.slow_factor * typical:
            return Verdict("slow", [f"'{phase.name}' has taken {took:.0f} s; earlier runs of this layout took "
                                    f"{typical:.0f} s ({self.slow_factor:g}x threshold)"])
        return None

    def phase_times(self) -> dict[str, float]:
        """Seconds from the start of the run to the first sight of each phase."""
        if self.started is None:
            return {}
        return {name: round(at - self.started, 1) for name, at in self.phase_at.items()}
