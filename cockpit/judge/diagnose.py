"""Where a run is: its phase from the log lines, the processes and the port. Pure functions over
HostState; nothing here touches the network."""

from __future__ import annotations

import calendar
import itertools
import re
import time
from collections import deque
from dataclasses import dataclass

from cockpit.host.state import HostState
from cockpit.judge.evidence import merge
from cockpit.judge.verdict import REQUESTS_FROZEN, Phase, V, Verdict, VerdictName
from cockpit.read.logrules import ACCESS_LINE, LogLine, LogRules, LogTracker, progress_of
from cockpit.read.stacks import StackLook
from cockpit.read.xid import LOST, meaning


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


def _corrected(state: HostState, phase: Phase, failed: bool = False) -> Phase:
    """What the processes say over the log: every rank gone is the end of the run, a crash unless
    it was serving and the log tells no failure."""
    ranks = [p for p in state.procs.values() if p.rank is not None]
    if ranks and all(not p.alive for p in ranks) and phase.name != "no run":
        ended = "exited" if phase.name in ("ready", "serving") and not failed else "crashed"
        return Phase(ended, line=phase.line)
    return phase


TP_FLAGS = ("--tp-size", "--tp", "--tensor-parallel-size", "-tp")
PP_FLAGS = ("--pp-size", "--pp", "--pipeline-parallel-size", "-pp")
DP_FLAGS = ("--dp-size", "--dp", "--data-parallel-size", "-dp")
NODE_FLAGS = ("--nnodes",)


def _flag(argv: list[str], names: tuple[str, ...]) -> tuple[int, str] | None:
    """An integer flag's value and its spelling (`--tp-size 8` or `--tp-size=8`)."""
    for i, a in enumerate(argv):
        name, eq, value = a.partition("=")
        if name in names:
            value = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
            if value.isdigit() and int(value) > 0:
                return int(value), f"{name} {value}"
    return None


def expected_ranks(state: HostState) -> tuple[int, str, bool] | None:
    """How many ranks this host should have, from the server's command line: (count, the flags
    that say so, whether rank numbers are 0..count-1 on this host)."""
    for p in state.procs.values():
        if p.role != "server" or not p.alive or not p.cmdline:
            continue
        tp = _flag(p.cmdline, TP_FLAGS)
        if tp is None:
            continue
        n, said, plain = tp[0], [tp[1]], True
        for names in (PP_FLAGS, DP_FLAGS):
            more = _flag(p.cmdline, names)
            if more and more[0] > 1:
                n, plain = n * more[0], False
                said.append(more[1])
        nodes = _flag(p.cmdline, NODE_FLAGS)
        if nodes and nodes[0] > 1:
            n, plain = max(1, n // nodes[0]), False
            said.append(nodes[1])
        return n, " ".join(said), plain
    return None


# ----------------------------------------------------------------------------- verdicts

IDLE_CPU_PCT = 5.0
IDLE_GPU_PCT = 5.0
SPIN_GPU_PCT = 90.0
SPIN_POWER_SHARE = 0.3  # of the power limit: a kernel polling a flag draws little
COMPUTE_GPU_PCT = 50.0  # busy and drawing more than SPIN_POWER_SHARE of its limit: computing
RESIDENT_SHARE = 0.10  # of GPU memory: the model is loaded
SPAWN_GRACE_S = 20.0  # ranks all spawn within this of each other: fewer after it means one is gone
XID_BEFORE_S = 300.0  # an Xid this long before a rank's death (or just after it) names the cause
XID_AFTER_S = 30.0
HW_SLOW_S = 5.0  # the hardware holds a GPU's clocks down this long: the run is slow
REPLAY_WINDOW_S = 60.0  # NVLink or PCIe replays that grew within this: the link is retrying
UNSTALL_SAMPLES = 3  # samples in a row showing the run's own progress that end a stall
# The fast stall (docs/diagnosis.md#a-stall-called-in-seconds): once the cheap signals (log, CPU, GPUs, port) are
# silent QUIET_S, every rank is dumped twice without stopping it, LOOK_GAP_S apart; a look that
# finds them all still in waits calls the stall. At most one look every LOOK_EVERY_S while silent.
QUIET_S = 5.0
LOOK_GAP_S = 4.0
LOOK_EVERY_S = 30.0
LOOK_SLACK_S = 8.0  # a look's dumps and their round trips, on a loaded host
# Windows learned from the layout's good runs (NVRx's way): a phase silent and idle for longer
# than LEARNED_FACTOR times the longest it took in LEARNED_RUNS or more good runs is stalled
LEARNED_FACTOR = 2.0
LEARNED_MIN_S = 10.0
LEARNED_RUNS = 2
STALE_SCRAPES = 3  # a metrics scrape older than this many scrape intervals is stale: no tokens said moving
# An access line is work only where it answers a generation (a 2xx POST to a completion or a
# generate route): a probe, a 4xx, a model list or metrics page produces no token
GENERATION_PATH = re.compile(r"/(?:v\d+/)?(?:chat/)?(?:completions|generate|responses|generate_stream)(?:[/?]|$)")


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


@dataclass
class Progress:
    """What the run's own history says of its progress, on the host's clock: how long since the
    last sign of work (`idle_s`), the lines that said so, and whether requests are in flight
    with nothing done (`frozen`: the engine's stats lines or its metrics say so)."""

    idle_s: float  # seconds since the last sign of work
    said: str  # that, for the evidence
    work: list[str]  # signs of progress seen now (empty: none)
    frozen: str | None = None  # requests in flight, nothing done: the evidence line
    frozen_since_s: float | None = None  # how long the requests have been frozen
    serving_idle: bool = False  # the engine says nothing is running or waiting
    pending: bool = False  # requests in flight with nothing made (stats lines, or fresh metrics): work waits


def _clock(stamp: str | None) -> float | None:
    """A line's own timestamp in seconds on its own (naive) clock: only differences are used,
    anchored at the file's modification time, so the host's time zone never matters."""
    if not stamp:
        return None
    m = _STAMP.match(stamp)
    if not m:
        return None
    year, month, day, hh, mm, ss = m.groups()
    try:
        return float(calendar.timegm((int(year or 2000), int(month or 1), int(day or 1), int(hh), int(mm), int(ss))))
    except (ValueError, OverflowError):
        return None


_NO_YEAR_BEFORE = 978307200.0  # _clock gives a stamp without a year the year 2000: before 2001


def _with_year(clock: float, year: int) -> float:
    t = time.gmtime(clock)
    try:
        return float(calendar.timegm((year, t.tm_mon, t.tm_mday, t.tm_hour, t.tm_min, t.tm_sec)))
    except ValueError:  # 29 February in another year
        return clock


_STAMP = re.compile(r"(?:(?:(\d{4})-)?(\d\d)-(\d\d) )?(\d\d):(\d\d):(\d\d)")


class Watchdog:
    """Turns a stream of HostStates into a verdict with its evidence. It remembers since when each
    condition has held, and when each phase was first seen (time to each phase)."""

    def __init__(
        self,
        idle_s: float = 120.0,
        spin_s: float = 60.0,
        slow_factor: float = 3.0,
        earlier: dict[str, float] | None = None,
        ports: list[int] | None = None,
        sources=None,
        metrics: bool = False,
        windows: dict[str, tuple[float, int]] | None = None,
    ):
        self.idle_s, self.spin_s, self.slow_factor = idle_s, spin_s, slow_factor
        self.windows = windows or {}  # phase -> (longest seconds in the layout's good runs, how many runs)
        self.looks = False  # the monitor takes stack looks when asked (want_look): the fast stall
        self.look: StackLook | None = None  # the last stack look of this run
        self.want_look = False  # the cheap signals are silent: a stack look would decide
        self.scrape_every_s = 2.0  # the monitor's metrics interval: older scrapes are stale
        self._look_valid, self._look_left = False, None  # a look of this silence; seconds until one decides
        self.metrics = metrics  # the layout has the engine's metrics: "idle" needs their word
        self.sources = list(sources or [])  # more evidence: (state, now, watchdog, stalled) -> [Finding] (evidence.py)
        self.earlier = earlier or {}  # phase -> typical seconds to reach it in earlier runs
        self.ports = list(ports or [])
        self.started: float | None = None
        self.phase_at: dict[str, float] = {}
        self._since: dict[str, float] = {}
        self._log_seen: tuple[str | None, int] = (None, 0)
        self._marks: dict[str, int] = {}  # log path -> lines that belong to earlier runs (see begin)
        self.tracker = LogTracker(LogRules())  # the post-mortem rules `cockpit explain` uses, fed live
        self._errors: deque = deque(maxlen=3)
        self._phase_line: LogLine | None = None
        self._passed: list[tuple[str, float | None]] = []  # (phase, line's clock) read since the last judgement
        self._ended = False  # see end()
        self._shards: tuple[int, int] | None = None
        self._generation = 0
        self._all_dead_at: int | None = None  # lines of the log read when every rank was first seen dead
        self._reset_progress()
        self.progress: Progress | None = None  # the last judgement's reading of the run's progress
        self._replays: dict[
            tuple[int, str], tuple[int, int, float | None]
        ] = {}  # (gpu, counter) -> (first, last, grew at)
        self._stall: Verdict | None = None  # the stall declared, held until the run itself moves
        self._unstall: tuple[int, int] = (0, 0)  # (samples in a row that showed progress, the last one's seq)

    def _reset_progress(self) -> None:
        # (line's own clock, local arrival) of the last line that showed work, of the last line,
        # and the first stats line since that work saying requests run with nothing done
        self._work: tuple[float | None, float] | None = None
        self._last: tuple[float | None, float] | None = None
        self._frozen: tuple[LogLine, float | None, float] | None = None
        self._stats: LogLine | None = None

    def _new_run(self) -> None:
        """The host state saw a new run replace the last one: its phases and crash are history."""
        self.started = None
        self.phase_at, self._since = {}, {}
        self.tracker = LogTracker(LogRules())
        self._phase_line, self._shards, self._passed = None, None, []
        self._ended = False
        self._errors.clear()
        self._reset_progress()
        self._replays = {}
        self._stall, self._unstall = None, (0, 0)
        self.look, self.want_look = None, False
        self._look_valid, self._look_left = False, None

    def seen_stacks(self, look: StackLook) -> None:
        """A stack look the monitor took (cockpit/actions/forensics.py: look), judged at the next update."""
        self.look = look

    def begin(self, state: HostState, started: float | None = None) -> None:
        """A run starts now (launched, or found replacing the last one): the lines the logs hold
        now are the earlier run's, never read as this one's phases or failures; its phase clock
        starts at `started` (local monotonic), else at its first rank or phase line."""
        self._new_run()
        self._generation = state.generation  # this run is the state's current one: not new again
        self._marks = {path: log.total for path, log in state.logs.items()}
        self._log_seen = (None, 0)
        self._all_dead_at = None
        self.started = started

    def end(self) -> None:
        """The operator's kill of the whole run, verified: `no run` until a rank lives again or a
        new run is seen, whatever the dead run's last lines still bring (its shutdown's errors)."""
        self.started, self._ended = None, True

    def _held(self, name: str, cond: bool, now: float) -> float:
        if not cond:
            self._since.pop(name, None)
            return 0.0
        return now - self._since.setdefault(name, now)

    def _phase(self, state: HostState) -> Phase:
        failed = bool(self.tracker.failures)
        if self._phase_line is None:
            return _corrected(state, Phase("starting" if state.live_procs() else "no run"), failed)
        return _corrected(state, _phase(self._phase_line, self._shards), failed)

    def update(self, state: HostState, now: float, log_path: str | None = None) -> tuple[Phase, Verdict]:
        phase, verdict = self._judge(state, now, log_path)
        if self.sources:  # NCCL RAS, the engine's metrics, the flight recorder (cockpit/judge/evidence.py)
            stalled = verdict.name in (V.STALLED_IDLE, V.STALLED_SPINNING)
            verdict = merge(verdict, [f for src in self.sources for f in src(state, now, self, stalled)], state)
        verdict = self._hold(state, verdict)
        if verdict.name != VerdictName.NO_RUN:
            more = [e for e in gpu_evidence(state) if not any(e in said for said in verdict.evidence)]
            if more:
                verdict.evidence = verdict.evidence + more  # a new list: the evidence may be the progress's own
        return phase, verdict

    def _hold(self, state: HostState, verdict: Verdict) -> Verdict:
        """A stall holds until the run itself moves: a look that sees no stall pattern and no
        progress either (`watching`: a CPU blip, a stranger's listener) keeps it; progress ends it
        only once seen on UNSTALL_SAMPLES samples in a row, so a blip never clears an alert."""
        if verdict.name in (V.STALLED_IDLE, V.STALLED_SPINNING):
            self._stall, self._unstall = verdict, (0, 0)
            return verdict
        stall = self._stall
        if (
            stall is None
            or verdict.name not in (V.OK, V.WATCHING)
            or not any(p.alive and p.status != "Z" for p in state.ranks())
        ):
            self._stall = None
            return verdict
        if verdict.name == V.OK:
            n, seq = self._unstall
            if state.seq != seq:
                n, seq = n + 1, state.seq
            self._unstall = (n, seq)
            if n >= UNSTALL_SAMPLES:
                self._stall = None
                return verdict
            why = f"progress seen on {n} of {UNSTALL_SAMPLES} samples in a row: {'; '.join(verdict.evidence[:1])}"
        else:
            self._unstall = (0, 0)
            why = "no sign of the run's own progress since"
        return Verdict(
            stall.name,
            [e for e in stall.evidence if not e.startswith("held: ")] + [f"held: {why}"],
            stall.odd_rank,
            detail=stall.detail,
            since=stall.since,
        )

    def _judge(self, state: HostState, now: float, log_path: str | None = None) -> tuple[Phase, Verdict]:
        key = log_path if log_path else next(iter(state.logs), None)  # a run spanning nodes: `node:path`
        log = state.logs.get(key) if key is not None else None
        ranks = [p for p in state.procs.values() if p.rank is not None]
        if state.generation != self._generation:
            self._generation = state.generation
            self._new_run()
            self._phases_since(self._all_dead_at, key, log)
        if ranks and not any(p.alive for p in ranks):
            if self._all_dead_at is None:
                self._all_dead_at = self._log_seen[1] if self._log_seen[0] == key else None
        elif ranks:
            self._all_dead_at = None
        if self._ended:
            if not any(p.alive and p.status != "Z" for p in ranks):
                if log is not None:
                    self._log_seen = (key, log.total)  # the dead run's last lines: never this run's
                return Phase("no run"), Verdict("no run", [])
            self._new_run()  # a rank lives again: a new run, judged from the lines that came since
        self._scan_new_lines(key, log, now)
        phase = self._phase(state)
        if self.started is None and (any(p.alive for p in ranks) or self._phase_line is not None):
            self.started = now
            self._passed = []  # first sight of a run under way: the phases before it are history
        if self.started is not None:
            self._note_phases(phase.name, now)
        quiet_s, silent = self._quiet(state, log, now)
        prog = self.progress = self._progress(state, quiet_s, silent, now)
        crashed = self._crashed(state, ranks, log, phase) or self._missing(state, ranks)
        if crashed:
            if crashed.name == VerdictName.STOPPED and phase.name == "crashed":
                phase = Phase("stopped", line=phase.line)
            return phase, crashed
        if not ranks:
            if phase.name == "no run":
                return phase, Verdict("no run", [])
            up = self._up_without_ranks(state)
            if up:
                return phase, Verdict("ok", up)
            return phase, self._watching(state, prog, ["no rank of the run seen yet"])
        alive = [p for p in ranks if p.alive and p.status != "Z"]
        gpus = [state.gpus[i] for p in alive for i in p.gpus if i in state.gpus]
        port_open = self._port_open(state)
        kind = self._stall_kind(phase, prog)
        resident = gpus and all((g.mem_used_mib or 0) > RESIDENT_SHARE * (g.mem_total_mib or 1) for g in gpus)
        # the model need not be resident: a run hung before its weights (a rendezvous or NCCL's
        # bootstrap waiting for a rank) holds only its CUDA contexts, or no GPU the agent can match
        # to a rank (a container's host pids: then every GPU of the host must be idle). That is
        # weaker evidence (a download or a file lock waits as quietly): twice the window
        seen = gpus or list(state.gpus.values())
        idle = (
            alive
            and all(_cpu_idle(p) for p in alive)
            and all((g.util_pct or 0) < IDLE_GPU_PCT for g in seen)
            and (not port_open or prog.pending)
        )
        window = self.idle_s if resident else 2 * self.idle_s
        held = self._back_dated(self._held("idle", bool(idle), now), bool(idle), alive, state, prog.idle_s)
        if idle and held >= window and prog.idle_s >= window:
            ev = [
                f"all {len(alive)} ranks alive, CPU < {IDLE_CPU_PCT:.0f} % ({_cpu_said(alive)})",
                _gpus_said(state, gpus, resident),
                f"{prog.said}, port {'closed' if not port_open else 'open'}"
                + "".join(f"; {pt.held_by()}" for pt in state.ports if pt.stranger and pt.port in self.ports),
                f"in phase '{phase}' for {held:.0f} s (threshold {window:.0f} s"
                + (")" if resident else ", twice the stall window: no model seen resident)"),
            ]
            if prog.frozen:
                ev.insert(0, prog.frozen)
            return phase, Verdict("stalled-idle", ev, detail=kind, since=self._since_host(state, held))
        idle_held = held if idle else 0.0
        spin, odd, ev = self._spin(alive, state)
        held = self._back_dated(self._held("spin", spin, now), spin, alive, state, prog.idle_s, busy=True)
        fast = self._fast(
            state, phase, prog, alive, gpus, resident, port_open, kind, idle_held, held if spin else 0.0, odd, ev, now
        )
        if fast is not None:
            return phase, fast
        if spin and held >= self.spin_s and prog.idle_s >= self.spin_s:
            ev = ([prog.frozen] if prog.frozen else []) + ev + [f"held for {held:.0f} s, {prog.said}"]
            if port_open:
                ev.append("the port still answers: health alone does not prove progress")
            return phase, Verdict("stalled-spinning", ev, odd, detail=kind, since=self._since_host(state, held))
        window = min(self.idle_s, self.spin_s)
        if prog.frozen is not None and (prog.frozen_since_s or 0.0) >= window:
            busy = any((g.util_pct or 0) >= SPIN_GPU_PCT for g in gpus)
            ev = [prog.frozen, f"{prog.said} (threshold {window:.0f} s)"]
            if port_open:
                ev.append("the port still answers: health alone does not prove progress")
            return phase, Verdict(
                "stalled-spinning" if busy else "stalled-idle",
                ev,
                detail=REQUESTS_FROZEN,
                since=self._since_host(state, prog.idle_s),
            )  # from the last work seen
        slow = self._slow(phase, now) or self._gpu_slow(state, alive, now)
        if slow:
            return phase, slow
        if prog.work:
            return phase, Verdict("ok", prog.work)
        ready = self._ready_idle(state, phase, prog, alive, gpus, port_open)
        if ready:
            return phase, Verdict("ok", ready)
        return phase, self._watching(state, prog, [f"no sign of progress: {prog.said}, and no stall pattern yet"])

    def _watching(self, state: HostState, prog: Progress, why: list[str]) -> Verdict:
        """Not decided yet: what the look waits for, and until when (the stall windows from the
        last sign of work, on the host's clock; sooner where a stack look will decide)."""
        left = max(0.0, max(self.idle_s, self.spin_s) - prog.idle_s)
        said = f"the stall thresholds (idle {self.idle_s:.0f} s, spin {self.spin_s:.0f} s)"
        if self._look_left is not None and self._look_left < left:
            left = self._look_left
            said = f"a stack look once the cheap signals are silent {QUIET_S:.0f} s"
        until = state.sample_ts + left if state.sample_ts is not None else None
        stamp = time.strftime("%H:%M:%S", time.localtime(until)) if until is not None else "?"
        looked = self.look.evidence() if self._look_valid else []
        return Verdict(
            "watching",
            why
            + looked
            + [f"waiting for a sign of progress (a log line, tokens, a phase) or {said}: decided by {stamp}"],
            until=until,
        )

    def _fast(
        self,
        state: HostState,
        phase: Phase,
        prog: Progress,
        alive,
        gpus,
        resident: bool,
        port_open: bool,
        kind: str,
        idle_held: float,
        spin_held: float,
        spin_odd: int | None,
        spin_ev: list[str],
        now: float,
    ) -> Verdict | None:
        """The stall called in seconds, on positive evidence rather than a long wait: the cheap
        signals (log, CPU, GPUs, port with work pending or a launch under way) silent QUIET_S,
        then a stack look (every rank dumped twice, LOOK_GAP_S apart, without stopping it) that
        finds them all still in waits; or, second, a phase silent and idle far longer than the
        layout's good runs ever took in it (the learned windows)."""
        silent = min(max(idle_held, spin_held), prog.idle_s)
        if any(p.rank is None and not _cpu_idle(p) for p in state.live_procs()):
            silent = 0.0  # a process of the run beside its ranks at work (an engine core compiling): it moves
        look = self.look
        valid = self._look_valid = look is not None and silent > 0 and look.at - look.gap_s >= now - silent - 1.0
        self.want_look = (
            self.looks and silent >= QUIET_S and self._stall is None and (not valid or now - look.at >= LOOK_EVERY_S)
        )  # a stall declared has its forensics: no more looks
        self._look_left = None
        if self.looks and silent > 0 and not valid:
            self._look_left = max(0.0, QUIET_S - silent) + LOOK_GAP_S + LOOK_SLACK_S
        since = self._since_host(state, silent)
        cheap = [
            f"all {len(alive)} ranks alive, CPU < {IDLE_CPU_PCT:.0f} % ({_cpu_said(alive)})" if idle_held else None,
            _gpus_said(state, gpus, resident) if idle_held else None,
            f"{prog.said}, port {'closed' if not port_open else 'open'}",
            f"in phase '{phase}'",
        ]
        cheap = [c for c in cheap if c] + ([prog.frozen] if prog.frozen else [])
        if valid and look is not None:
            if idle_held and look.still:
                return Verdict("stalled-idle", look.evidence() + cheap, look.odd_rank, detail=kind, since=since)
            if spin_held and look.parked:
                odd = look.odd_rank if look.odd_rank is not None else spin_odd
                return Verdict(
                    "stalled-spinning", look.evidence() + spin_ev + cheap[-2:], odd, detail=kind, since=since
                )
        span = self.windows.get(phase.name)
        if not idle_held or silent < QUIET_S or span is None or span[1] < LEARNED_RUNS:
            return None
        if valid and look is not None and not look.still:
            return None  # the stacks say it moves (reading, computing, a rendezvous): they outrank a window
        limit = max(LEARNED_MIN_S, LEARNED_FACTOR * span[0])
        in_phase = max(now - self.phase_at.get(phase.name, now), prog.idle_s)
        if in_phase < limit:
            self._look_left = min(self._look_left if self._look_left is not None else limit, limit - in_phase)
            return None
        return Verdict(
            "stalled-idle",
            [
                f"phase '{phase.name}' took at most {span[0]:.0f} s in {span[1]} good runs "
                f"of this layout; in it {in_phase:.0f} s, silent and idle (learned window "
                f"{limit:.0f} s)"
            ]
            + cheap,
            detail=kind,
            since=since,
        )

    @staticmethod
    def _since_host(state: HostState, held: float) -> float | None:
        return state.sample_ts - held if state.sample_ts is not None else None

    @staticmethod
    def _stall_kind(phase: Phase, prog: Progress) -> str:
        if prog.frozen is not None or prog.pending:
            return REQUESTS_FROZEN
        if phase.name in ("ready", "serving", "warmup", "port open"):
            return "serving stopped"
        return f"launch stopped at '{phase.name}'"

    def _progress(self, state: HostState, quiet_s: float, silent: str, now: float) -> Progress:
        """The run's progress from its own history, so a first look is as right as a long watch:
        the last line that showed work, measured back from the file's modification time through
        the lines' own timestamps; the engine's stats lines saying requests run with nothing done;
        the engine's metrics (tokens moving or frozen); GPUs computing."""

        def age(a) -> float:
            """How long ago (before the sample) line `a` was written: from the last line through the
            lines' own clocks when the last line has one (anchored at the file's mtime); else its
            own clock on the host's (when it falls where it can: after the run's start, before the
            mtime); else through the lines' arrivals here."""
            last = self._last
            if a[0] is not None and last[0] is not None:
                return quiet_s + max(0.0, last[0] - a[0])
            on_host = self._host_age(state, a[0])
            if on_host is not None:
                return on_host
            return quiet_s + max(0.0, last[1] - a[1])

        since_work = age(self._work) if self._work and self._last else quiet_s
        said = silent if since_work - quiet_s < 1 else f"no work in the log for {_duration(since_work)} ({silent})"
        work, frozen, frozen_s = [], None, None
        if self._frozen is not None and self._last is not None:
            line, *at = self._frozen
            frozen_s = age(tuple(at))
            rate, running = line.stats
            frozen = (
                f"the engine's stats say {running} request{'s' if running != 1 else ''} running at 0 tokens/s "
                f"since {line.time or '?'} ({_duration(frozen_s)}): requests frozen"
            )
            since_work = max(since_work, frozen_s)
        elif self._work is not None and since_work < min(self.idle_s, self.spin_s):
            work.append(f"the log shows work {_duration(since_work)} ago")  # stats lines at 0 tokens/s are no work
        view = state.metrics
        fresh = view is not None and self._fresh(view, now)
        h = view.header() if fresh else {}
        idle_engine = pending = False
        if h.get("tokens_per_s"):
            work.append(f"tokens moving: {h['tokens_per_s']:.0f} tok/s (the engine's metrics)")
        elif h.get("running") == 0 and not h.get("waiting"):  # (tokens frozen while requests run: metrics.findings)
            idle_engine = True
        if fresh and view.frozen_since is not None:
            # the engine's own counters say requests run and nothing is made: whatever else the log
            # says (access lines, warnings), it is not the run moving; the stall holds
            pending = True
            work = [w for w in work if not w.startswith("the log shows work")]
            since_work = max(since_work, view.frozen_for(now))
            said = (
                f"{said}; the engine's metrics: requests running, generation tokens frozen for "
                f"{_duration(view.frozen_for(now))}"
            )
        computing = self._computing(state)
        if computing:
            work.append(computing)
        return Progress(since_work, said, work, frozen, frozen_s, idle_engine, pending or frozen is not None)

    def _fresh(self, view, now: float) -> bool:
        """The last good scrape is no older than STALE_SCRAPES scrape intervals (the monitor's, or
        the last two good scrapes' spacing on a slow host): an endpoint that stopped answering says
        nothing of tokens, moving or frozen."""
        good = [sc.at for sc in view.scrapes if not sc.error][-2:]
        if not good:
            return False
        every = max(self.scrape_every_s, good[1] - good[0] if len(good) == 2 else 0.0)
        return now - good[-1] <= STALE_SCRAPES * every

    @staticmethod
    def _host_age(state: HostState, clock: float | None) -> float | None:
        """A line's own (local, zone-less) clock as seconds before the sample, through the host's
        UTC offset; None where that cannot be trusted: no offset, or a time after the file's
        last write or before the run's oldest process (a server in another time zone)."""
        ts, offset = state.sample_ts, state.agent.utc_offset
        if clock is None or ts is None or offset is None:
            return None
        log = next(iter(state.logs.values()), None)
        upper = (log.written_at if log is not None and log.written_at is not None else ts) + 2.0
        starts = [p.started for p in state.procs.values() if p.started]
        lower = min(starts) - 5.0 if starts else None
        when = clock - offset
        if clock < _NO_YEAR_BEFORE:  # "MM-DD HH:MM:SS": the year is the host's, or the one before
            year = time.gmtime(ts + offset).tm_year
            when = _with_year(clock, year) - offset
            if when > upper:
                when = _with_year(clock, year - 1) - offset
        if when > upper or (lower is not None and when < lower):
            return None
        return max(0.0, ts - when)

    @staticmethod
    def _computing(state: HostState) -> str | None:
        """Every GPU of a live rank busy and drawing real power: it is computing, not polling."""
        alive = [p for p in state.ranks() if p.alive and p.status != "Z"]
        gpus = {i: state.gpus[i] for p in alive for i in p.gpus if i in state.gpus}
        if not gpus or not all(
            (g.util_pct or 0) >= COMPUTE_GPU_PCT
            and g.power_w is not None
            and g.power_limit_w
            and g.power_w >= SPIN_POWER_SHARE * g.power_limit_w
            for g in gpus.values()
        ):
            return None
        g = max(gpus.values(), key=lambda g: g.power_w or 0)
        return f"GPUs computing: {len(gpus)} at {min(x.util_pct or 0 for x in gpus.values())} % or more, up to {g.power_w:.0f} W"

    def _ready_idle(self, state, phase, prog: Progress, alive, gpus, port_open: bool) -> list[str] | None:
        """A server up and idle: ready, its port open, its GPUs idle, and no request known in
        flight (the engine's metrics or stats lines say none runs, or none says any does)."""
        if not (port_open and alive and phase.name in ("ready", "serving", "port open", "warmup")) or prog.frozen:
            return None
        if gpus and any((g.util_pct or 0) >= IDLE_GPU_PCT for g in gpus):
            return None
        h = state.metrics.header() if state.metrics is not None else {}
        if (h.get("running") or 0) > 0 or (self.metrics and not state.metrics.scrapes):
            return None  # requests in flight, or metrics expected and not read yet
        how = (
            "the engine's metrics say none runs"
            if prog.serving_idle
            else (
                "its last stats line says none runs"
                if self._stats is not None and not (self._stats.stats[1] or 0)
                else "none seen"
            )
        )
        return [f"ready and idle: port open, GPUs idle, no request in flight ({how})"]

    def _quiet(self, state: HostState, log, now: float) -> tuple[float, str]:
        """How long the log has been silent, and that said for the evidence. From the file's own
        modification time on the host where the agent reports it, so a cockpit opened twenty
        minutes into a hang knows at once; else since the last line arrived here."""
        if log is not None and log.written_at is not None and state.sample_ts is not None:
            quiet = max(0.0, state.sample_ts - log.written_at)
            since = time.strftime("%H:%M:%S", time.localtime(log.written_at))
            return quiet, f"log silent since {since} ({_duration(quiet)})"
        last = log.last_line_at if log is not None and log.last_line_at is not None else self.started
        quiet = max(0.0, now - (last if last is not None else now))
        return quiet, f"log silent for {quiet:.0f} s"

    @staticmethod
    def _back_dated(held: float, cond: bool, alive, state: HostState, quiet_s: float, busy: bool = False) -> float:
        """A condition seen now, on ranks whose CPU was measured idle (one interval is enough;
        `busy`: or busy, a spin), with no work in the log for longer: it has held since the last
        work (no earlier than the ranks started). A first look at an old hang names it at once."""
        if not cond or not alive:
            return held
        flat = all(
            len(h) >= 1 and max(list(h)[-2:]) < IDLE_CPU_PCT or (busy and p.cpu_pct >= IDLE_CPU_PCT)
            for p in alive
            for h in [state.proc_cpu_history.get(p.pid, ())]
        )
        started = [p.started for p in alive if p.started]
        if not flat or not started or state.sample_ts is None:
            return held
        return max(held, min(quiet_s, state.sample_ts - min(started)))

    def _up_without_ranks(self, state: HostState) -> list[str] | None:
        """A run with no GPU rank (a layout of `engine: none`, a plain HTTP server) whose own
        process listens on the layout's port: up, and that is all there is to watch. The engines
        open their port only once their ranks are ready, so a launch still starting never reads so."""
        live = {p.pid for p in state.live_procs()}
        held = [pt for pt in state.ports if pt.listening and pt.pid in live and pt.port in self.ports]
        if not held or self.tracker.failures:
            return None
        return [
            f"up: port {', '.join(str(pt.port) for pt in held)} open, held by the run's pid "
            f"{held[0].pid}; no GPU rank in the run to watch"
        ]

    def _port_open(self, state: HostState) -> bool:
        """The server's own port: the layout's (held by the run, not by a stranger: another user's
        or another job's listener proves nothing of the run), else any port the server process
        listens on."""
        if self.ports:
            return any(pt.listening and not pt.stranger for pt in state.ports if pt.port in self.ports)
        servers = {p.pid for p in state.procs.values() if p.role == "server" and p.alive}
        return any(pt.listening and pt.pid in servers for pt in state.ports)

    def _missing(self, state: HostState, ranks) -> Verdict | None:
        """Fewer ranks than the command line asks for, long after they were spawned: a rank died
        (and was reaped) before the cockpit looked."""
        want = expected_ranks(state)
        if want is None or not ranks or state.sample_ts is None or len(ranks) >= want[0]:
            return None
        started = [p.started for p in ranks if p.started]
        if not started or state.sample_ts - max(started) < SPAWN_GRACE_S:
            return None
        n, said, plain = want
        ev = [f"expected {n} ranks ({said}), {len(ranks)} seen"]
        odd = None
        if plain:
            gone = sorted(set(range(n)) - {p.rank for p in ranks})
            odd = gone[0] if len(gone) == 1 else None
            ev[0] += f": rank{'s' if len(gone) > 1 else ''} {', '.join(map(str, gone))} missing"
        ev.append("a rank that exited and was reaped before the cockpit looked leaves no process behind")
        ev += [f"log: {line.strip()[:160]}" for line in self._errors]
        return Verdict(VerdictName.CRASHED, ev, odd)

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
            return (
                (g.util_pct or 0) >= SPIN_GPU_PCT
                and g.power_w is not None
                and bool(g.power_limit_w)
                and g.power_w < SPIN_POWER_SHARE * g.power_limit_w
            )

        spin = [r for r, g in per_rank.items() if spinning(g)]
        idle = [r for r, g in per_rank.items() if (g.util_pct or 0) < IDLE_GPU_PCT]
        if not spin or len(spin) + len(idle) != len(per_rank):
            return False, None, []
        g = per_rank[spin[0]]
        ev = [
            f"GPU of rank{'s' if len(spin) > 1 else ''} {','.join(map(str, sorted(spin)))} at "
            f"{g.util_pct} % utilization drawing {g.power_w:.0f} W of {g.power_limit_w:.0f} W: "
            f"a kernel polling, not computing (a collective that never completes)"
        ]
        odd = None
        if idle and len(idle) <= len(spin):
            odd = sorted(idle)[0] if len(idle) == 1 else None
            ev.append(
                f"GPU of rank {','.join(map(str, sorted(idle)))} idle: not in the collective"
                + (f": rank {odd} is the odd one out" if odd is not None else "")
            )
        elif not idle and len(alive) >= 3:
            cpus = sorted(p.cpu_pct for p in alive)
            median = cpus[len(cpus) // 2]
            outliers = [p for p in alive if abs(p.cpu_pct - median) > 40]
            if len(outliers) == 1:
                odd = outliers[0].rank
                ev.append(
                    f"rank {odd} is the odd one out: CPU {outliers[0].cpu_pct:.0f} % against "
                    f"{median:.0f} % for the others"
                )
        return True, odd, ev

    def _phases_since(self, position: int | None, key: str | None, log) -> None:
        """A run that replaced the last one outside the cockpit (HostState's run boundary) may have
        printed its first phases before its ranks were seen: its lines since every rank of the last
        run was seen dead (`position`, lines of the log read then) mark its phases again. Only the
        phases: what failed there was the last run's end."""
        if log is None or position is None or key != self._log_seen[0]:
            return
        new = min(len(log.lines), self._log_seen[1] - position)
        if new <= 0:
            return
        first = len(log.lines) - (log.total - self._log_seen[1]) - new
        for line in itertools.islice(log.lines, max(0, first), max(0, first + new)):
            if line.phase is not None:
                self._mark_phase(line)

    def _scan_new_lines(self, key: str | None, log, now: float) -> None:
        """Reads only the lines that arrived since the last update: the verdict runs every frame
        and the buffer holds thousands of lines. `key`: the log's name in the state (begin's marks)."""
        if log is None:
            return
        if key != self._log_seen[0]:
            self._log_seen = (key, self._marks.get(key, 0))
            self.tracker, self._errors = LogTracker(LogRules()), deque(maxlen=3)
            self._phase_line, self._shards, self._passed = None, None, []
            self._reset_progress()
        new = min(len(log.lines), log.total - self._log_seen[1])
        self._log_seen = (key, log.total)
        if new <= 0:
            return
        for line in itertools.islice(log.lines, len(log.lines) - new, None):
            self.tracker.add(line)
            self._note_progress(line, now)
            if line.kind in ("failure", "error"):
                self._errors.append(line.text)
            if line.phase is not None:
                self._mark_phase(line)

    def _mark_phase(self, line: LogLine) -> None:
        """A line that marks a phase: the phase the run is in now, its shard count, and the
        phases passed since the last judgement."""
        self._phase_line = line
        if line.shards:
            self._shards = line.shards
        if not self._passed or self._passed[-1][0] != line.phase:
            self._passed.append((line.phase, _clock(line.time)))

    def _note_phases(self, current: str, now: float) -> None:
        """The first sight of every phase the new lines went through, not only the last: a sample
        late on a loaded host brings loading, KV cache and graph capture at once. A line with its
        own timestamp is placed that many seconds before the newest line, never before the run's
        start nor before the phase it followed (a first sight of a run under way keeps none of
        them: see _judge)."""
        newest = self._last[0] if self._last else None
        floor = max([self.started, *self.phase_at.values()])  # called once the run's clock started
        for name, clock in [*self._passed, (current, None)]:
            if name in self.phase_at or name == "no run":
                continue
            at = now - (newest - clock) if newest is not None and clock is not None and newest >= clock else now
            floor = min(now, max(floor, at))
            if name == "serving":
                self.phase_at.setdefault("ready", floor)  # serving implies it was ready
            self.phase_at[name] = floor
        self._passed = []

    def _note_progress(self, line: LogLine, now: float) -> None:
        at = (_clock(line.time), now)
        self._last = at
        kind = progress_of(line)
        if kind == "work" and line.http is not None and not _generation(line):
            kind = "none"  # a 4xx, a probe, a model list: the HTTP front end answers, no token is made
        if line.stats is not None:
            self._stats = line
        if kind == "work":
            self._work, self._frozen = at, None
        elif kind == "frozen":
            if self._frozen is None:
                self._frozen = (line, *at)
            if self._work is None:
                self._work = at  # the history starts frozen: no work seen after its first line
        elif kind == "idle":
            self._frozen = None

    def _crashed(self, state, ranks, log, phase) -> Verdict | None:
        """Ranks dead (a zombie has exited), or the log telling a failure: crashed, naming the rank
        that failed first (a root cause before its consequences, as `cockpit explain` reads it)."""
        dead = [p for p in ranks if not p.alive or p.status == "Z"]
        first = self.tracker.first_failure()
        if first is not None and first.provisional and ranks and not dead:
            first = None  # a traceback no failure line opened, while every rank lives: its process went on
        if not dead and first is None and phase.name != "crashed":
            return None
        if first is None and self.tracker.stop is not None:  # the server said it was stopped: its end, no crash
            n, ll = self.tracker.stop
            ev = [f"the server said it was stopped ({ll.stop}): log: {ll.text.strip()[:160]}"]
            if dead:
                ev.append(f"{len(dead)} of {len(ranks)} ranks gone after it: {', '.join(str(p.rank) for p in dead)}")
            return Verdict(VerdictName.STOPPED, ev)
        rank = (
            first.rank if first is not None and first.rank is not None else (_first_gone(dead).rank if dead else None)
        )
        code = next((p.exit_code for p in dead if p.rank == rank and p.exit_code is not None), None)
        if code is None and first is not None:
            code = next((int(m) for m in re.findall(r"exit code:? (-?\d+)", first.text)), None)
        ev = []
        if rank is not None:
            ev.append(
                f"rank {rank} died"
                + (f" (exit code {code})" if code is not None else "")
                + (f": {first.cause}" if first is not None and first.cause not in ("exception", "died") else "")
            )
        if dead:
            ev.append(f"{len(dead)} of {len(ranks)} ranks gone: {', '.join(str(p.rank) for p in dead)}")
        if first is not None and first.together:  # no one of them failed first
            said = (
                f"all {len(first.together)} ranks"
                if self.tracker.all_ranks(first.together)
                else f"ranks {','.join(map(str, first.together))}"
            )
            ev.insert(0, f"{said} together: {first.cause}")
        if first is not None:
            ev += [f"log: {text.strip()[:160]}" for _, text in first.evidence[:3]]
        ev += [
            f"log: {line.strip()[:160]}"
            for line in self._errors
            if first is None or all(line != text for _, text in first.evidence)
        ][:3]
        cause = _gpu_cause(state, dead)
        if cause is not None:  # the GPU's own word comes first: the log's failure is its consequence
            rank, line = cause
            ev.insert(0, line)
        return Verdict(VerdictName.CRASHED, ev, rank)

    def _gpu_slow(self, state: HostState, alive, now: float) -> Verdict | None:
        """Every rank alive, and the GPU of one held down by the hardware (HW slowdown, thermal,
        power brake) for HW_SLOW_S, or its NVLink or PCIe link retrying (replay counters that grew
        within REPLAY_WINDOW_S): the run goes at that GPU's pace."""
        on = {}
        for p in alive:
            for i in p.gpus or p.last_gpus:
                if i in state.gpus:
                    on.setdefault(i, p.rank)
        found = []
        for i, rank in sorted(on.items()):
            g = state.gpus[i]
            held = self._held(f"hw{i}", bool(g.hw_slowdown), now)
            if g.hw_slowdown and held >= HW_SLOW_S:
                clocks = [x.sm_clock_mhz for j, x in state.gpus.items() if j != i and j in on and x.sm_clock_mhz]
                vs = f" against {max(clocks)} MHz on the others" if clocks and g.sm_clock_mhz else ""
                found.append(
                    (
                        rank,
                        f"GPU {i} (rank {rank}) held down by the hardware: {'/'.join(g.hw_slowdown)}"
                        f"{f', SM {g.sm_clock_mhz} MHz' if g.sm_clock_mhz else ''}{vs} for {held:.0f} s",
                    )
                )
            for name, what in (
                ("nvlink_replay", "NVLink replays"),
                ("nvlink_recovery", "NVLink recoveries"),
                ("pcie_replay", "PCIe replays"),
            ):
                grew = self._grew(i, name, getattr(g, name), now)
                if grew:
                    found.append(
                        (rank, f"GPU {i} (rank {rank}) {what} growing: +{grew} in the last {REPLAY_WINDOW_S:.0f} s")
                    )
        if not found:
            return None
        ranks = {r for r, _ in found}
        return Verdict(VerdictName.SLOW, [line for _, line in found], next(iter(ranks)) if len(ranks) == 1 else None)

    def _grew(self, gpu: int, name: str, value: int | None, now: float) -> int:
        """How much a replay counter grew since the first look, while it last grew within
        REPLAY_WINDOW_S (a counter that stopped growing is history, not slowness)."""
        if value is None:
            return 0
        had = self._replays.get((gpu, name))
        if had is None or value < had[1]:  # first look, or the counter was reset
            self._replays[(gpu, name)] = (value, value, None)
            return 0
        base, last, at = had
        if value > last:
            at = now
        self._replays[(gpu, name)] = (base, value, at)
        return value - base if at is not None and now - at <= REPLAY_WINDOW_S else 0

    def _slow(self, phase: Phase, now: float) -> Verdict | None:
        typical = self.earlier.get(phase.name)
        since = self.phase_at.get(phase.name)
        if not typical or since is None or phase.name in ("ready", "serving", "no run"):
            return None
        took = now - since
        if took > self.slow_factor * typical:
            return Verdict(
                "slow",
                [
                    f"'{phase.name}' has taken {took:.0f} s; earlier runs of this layout took "
                    f"{typical:.0f} s ({self.slow_factor:g}x threshold)"
                ],
            )
        return None

    def phase_times(self) -> dict[str, float]:
        """Seconds from the start of the run to the first sight of each phase, in the order they
        came (each first seen in this run's own log lines, so never before the one before it)."""
        if self.started is None:
            return {}
        return {
            name: round(max(0.0, at - self.started), 1)
            for name, at in sorted(self.phase_at.items(), key=lambda kv: kv[1])
        }


def _generation(line: LogLine) -> bool:
    """An access line that answered a generation: a 2xx POST to a completion or generate route."""
    m = ACCESS_LINE.search(line.message or line.text)
    return (
        m is not None
        and m.group(1) == "POST"
        and m.group(3).startswith("2")
        and GENERATION_PATH.search(m.group(2)) is not None
    )


def _cpu_idle(p) -> bool:
    """Idle on the CPU, or at most one clock tick in a window too short to tell (the first
    sample's: one tick of 10 ms over 50 ms reads 20 %); a window shorter still tells nothing."""
    return p.cpu_pct < IDLE_CPU_PCT or p.one_tick


def _gpus_said(state: HostState, gpus, resident: bool) -> str:
    if not gpus:
        if state.gpus:
            return (
                f"no rank matched to a GPU; all {len(state.gpus)} GPUs of the host at "
                f"< {IDLE_GPU_PCT:.0f} % utilization"
            )
        return "no GPU seen (the GPUs cannot be read on this host: the CPU and the log say it alone)"
    return f"GPU utilization < {IDLE_GPU_PCT:.0f} % on all {len(gpus)} GPUs with " + (
        f"{min(g.mem_used_mib or 0 for g in gpus) / 1024:.0f} GiB or more resident"
        if resident
        else f"only {max(g.mem_used_mib or 0 for g in gpus) / 1024:.1f} GiB or less in use (no model resident)"
    )


def _cpu_said(alive) -> str:
    top = max(alive, key=lambda p: p.cpu_pct)
    if top.cpu_pct < IDLE_CPU_PCT:
        return f"max {top.cpu_pct:.1f} %"
    return f"max {top.cpu_pct:.0f} %: one clock tick, over a window too short to tell"


def _stamp(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts))


def _rank_gpus(state: HostState, p) -> list[int]:
    """The GPUs a rank held (known after its death), else the GPU of its number where no rank
    of this host was ever seen on a GPU (a plain local TP layout)."""
    if p.gpus or p.last_gpus:
        return list(p.gpus or p.last_gpus)
    if p.rank is not None and p.rank in state.gpus and not any(q.last_gpus for q in state.procs.values()):
        return [p.rank]
    return []


def _death_ts(state: HostState, p) -> float | None:
    """When a dead rank was seen gone, on the host's clock."""
    if state.sample_ts is None:
        return None
    if p.gone_at is not None and state.received_at is not None:
        return state.sample_ts - max(0.0, state.received_at - p.gone_at)
    return state.sample_ts


def _gpu_cause(state: HostState, dead) -> tuple[int, str] | None:
    """A dead rank whose GPU raised an Xid shortly before (or at) its death, or fell off the bus:
    that rank, and the line that says so. The earliest such Xid wins (the first fault is the cause)."""
    best = None
    for p in dead:
        if p.rank is None:
            continue
        died = _death_ts(state, p)
        for i in _rank_gpus(state, p):
            for ev in state.xid:
                if ev.gpu != i or died is None or not died - XID_BEFORE_S <= ev.ts <= died + XID_AFTER_S:
                    continue
                if best is None or ev.ts < best[0]:
                    best = (
                        ev.ts,
                        p.rank,
                        f"rank {p.rank} died: GPU {i} Xid {meaning(ev.code)} at {_stamp(ev.ts)}"
                        + (f" (pid {ev.pid})" if ev.pid else ""),
                    )
            g = state.gpus.get(i)
            if best is None and g is not None and g.lost:
                best = (float("inf"), p.rank, f"rank {p.rank} died: GPU {i} lost ({LOST}: NVML answers GPU_IS_LOST)")
    return None if best is None else (best[1], best[2])


def gpu_evidence(state: HostState) -> list[str]:
    """What the GPUs say of themselves, for any verdict's evidence: a GPU lost, recent Xids, a
    row remap pending or failed, uncorrected ECC. Evidence, not a verdict: a pending remap only
    asks for a reset when the run ends."""
    out = []
    recent = state.sample_ts - XID_BEFORE_S if state.sample_ts is not None else None
    for ev in state.xid:
        if recent is None or ev.ts >= recent:
            where = f"GPU {ev.gpu}" if ev.gpu is not None else "a GPU"
            out.append(f"{where} Xid {meaning(ev.code)} at {_stamp(ev.ts)}" + (f" (pid {ev.pid})" if ev.pid else ""))
    for g in sorted(state.gpus.values(), key=lambda g: g.index):
        notes = g.health_notes()
        if notes:
            out.append(f"GPU {g.index}: {', '.join(notes)}")
    return out[-6:]


def _first_gone(dead):
    """Of ranks that died with nothing in the log, the one that went first: the earliest seen gone
    (one the agent has not yet reported gone, a zombie, after), then one that exited on its own
    (an exit code, not a signal: the others were most likely taken down after it), then the lowest rank."""
    return min(
        dead,
        key=lambda p: (
            p.gone_at is None,
            p.gone_at or 0.0,
            not (p.exit_code is not None and p.exit_code > 0),
            p.rank if p.rank is not None else 1 << 30,
        ),
    )
