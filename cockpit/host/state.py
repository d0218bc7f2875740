"""Host state: the agent's frames turned into typed objects, with bounded history.

HostState is what the UI renders and the snapshot prints; it knows nothing of links or Textual.
History is kept in ring buffers (minutes at 1 Hz in fixed memory) and the log in a bounded deque,
so a cockpit left open for days stays the same size.
"""

from __future__ import annotations

import math
import re
import time
from collections import Counter, deque
from dataclasses import dataclass, field

from cockpit import engines
from cockpit.agent.acts import ACTS
from cockpit.agent.protocol import HELLO, LOG, SAMPLE
from cockpit.common.hosttext import count
from cockpit.common.secrets import mask_argv, mask_line
from cockpit.read.logrules import LogLine, LogRules
from cockpit.read.metrics import MetricsView
from cockpit.read.ras import RasView

HISTORY_LEN = 600  # ten minutes at 1 Hz
LOG_LINES = 5000
DEAD_KEPT = 64

THROTTLE_REASONS = {
    0x1: "idle",
    0x2: "app-clocks",
    0x4: "sw-power-cap",
    0x8: "hw-slowdown",
    0x10: "sync-boost",
    0x20: "sw-thermal",
    0x40: "hw-thermal",
    0x80: "hw-power-brake",
    0x100: "display-clocks",
}
HW_SLOWDOWN = ("hw-slowdown", "hw-thermal", "hw-power-brake")
XID_KEPT = 32
ACTS_KEPT = 500  # the host's records kept: its recent launches, stops and forensics
XID_RECENT_S = 300.0  # an Xid this recent is news: the pane and the fleet row say it
FORGIVEN_TICK_PCT = 25.0  # what one clock tick reads as over a 40 ms window (Proc.one_tick)

_TITLE_RANK = re.compile(r"(?:^|_)TP(\d+)(?:_|$)")
_TITLES = tuple(t for e in engines.ENGINES.values() for t in e.titles)  # a rank's title prefix
_WORKER_TITLES = tuple(e.worker_title + "-" for e in engines.ENGINES.values() if e.worker_title)
_LAUNCHERS = tuple(mark for e in engines.ENGINES.values() for mark in e.launchers)
_ENGINE_TITLE = re.compile("^(" + "|".join(re.escape(t) for t in (*_TITLES, *(w[:-1] for w in _WORKER_TITLES))) + ")")
_LOG_PID = re.compile(r"\bpid=(\d+)\)")


def role_of(name: str, cmdline: list[str] | None = None) -> tuple[str | None, int | None]:
    """Role and TP rank from a process title: `sglang::scheduler_TP3` is scheduler rank 3,
    `VLLM::Worker_TP0` worker rank 0, the launcher is the server."""
    title = name or ""
    if cmdline and len(cmdline) == 1 and cmdline[0].startswith(title[:15]):
        title = cmdline[0]  # setproctitle rewrites argv: the full title survives the 15-char comm
    joined = " ".join(cmdline or [])
    for prefix in _TITLES:
        if title.startswith(prefix):
            rest = title[len(prefix) :]
            base, _, dims = rest.partition("_")
            m = _TITLE_RANK.search(dims)
            role = base.lower()
            if role.startswith("enginecore"):
                role = "engine"
            return role, int(m.group(1)) if m else None
    if any(mark in joined for mark in _LAUNCHERS) or "cockpit.sim.server" in joined or " serve " in f" {joined} ":
        return "server", None
    if title.startswith(_WORKER_TITLES):
        return "worker", int(title.rsplit("-", 1)[1]) if title.rsplit("-", 1)[1].isdigit() else None
    return None, None


@dataclass
class Gpu:
    index: int
    uuid: str | None = None
    name: str | None = None
    util_pct: int | None = None
    mem_used_mib: int | None = None
    mem_total_mib: int | None = None
    temp_c: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    sm_clock_mhz: int | None = None
    throttle: int | None = None
    ecc_uncorrected: int | None = None
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    # the GPU's own word, on the agent's slow clock (None: not supported, or not asked yet)
    lost: bool = False  # NVML answers GPU_IS_LOST (fallen off the bus): no figure from it any more
    ecc_aggregate: int | None = None  # uncorrected ECC errors over the GPU's life
    remap_corrected: int | None = None
    remap_uncorrected: int | None = None
    remap_pending: bool | None = None  # a remapped row waits for a GPU reset
    remap_failure: bool | None = None  # a row could not be remapped: the GPU wants replacing
    retired_pending: bool | None = None  # before Ampere: retired pages wait for a reset
    nvlink_replay: int | None = None  # summed over the active links
    nvlink_recovery: int | None = None
    nvlink_crc: int | None = None
    pcie_replay: int | None = None

    @property
    def throttle_reasons(self) -> list[str]:
        if not self.throttle:
            return []
        return [name for bit, name in THROTTLE_REASONS.items() if self.throttle & bit]

    @property
    def hw_slowdown(self) -> list[str]:
        """The clock event reasons that mean the hardware holds the clocks down (not a cap set by
        software, not idleness): HW slowdown, HW thermal, HW power brake."""
        return [r for r in self.throttle_reasons if r in HW_SLOWDOWN]

    def health_notes(self) -> list[str]:
        """What the GPU says is wrong with its memory: each a short phrase, for the pane, the
        fleet row and the verdict's evidence."""
        notes = []
        if self.lost:
            notes.append("lost (fallen off the bus)")
        if self.remap_failure:
            notes.append("row remap failed")
        if self.remap_pending:
            notes.append("row remap pending")
        if self.retired_pending:
            notes.append("retired pages pending")
        if self.ecc_uncorrected:
            notes.append(f"uncorrected ECC {self.ecc_uncorrected}")
        return notes


@dataclass
class XidEvent:
    """An Xid the driver reported: its GPU (None: a bus the agent could not map), when (host
    epoch), its code and, from the kernel log, the pid it names."""

    gpu: int | None
    ts: float
    code: int
    pid: int | None = None


@dataclass
class Proc:
    pid: int
    ppid: int = 0
    name: str = ""
    cmdline: list[str] = field(default_factory=list)
    status: str = "?"
    cpu_pct: float = 0.0
    cpu_tick_pct: float = 0.0  # what one clock tick reads as in cpu_pct's window, where that is coarse
    rss_mib: float = 0.0
    threads: int = 0
    pgid: int | None = None
    sid: int | None = None
    started: float | None = None
    role: str | None = None
    rank: int | None = None
    gpus: list[int] = field(default_factory=list)
    gpu_mem_mib: int | None = None
    last_gpus: list[int] = field(default_factory=list)  # the GPUs it last held: still known once it died
    alive: bool = True
    exit_code: int | None = None
    gone_at: float | None = None
    first_seen: float = field(default_factory=time.monotonic)

    @property
    def title(self) -> str:
        """What the operator recognises: the setproctitle title, or the command line."""
        if self.cmdline and len(self.cmdline) == 1:
            return self.cmdline[0]
        if self.cmdline:
            return " ".join([self.cmdline[0].rsplit("/", 1)[-1], *self.cmdline[1:]])
        return self.name

    @property
    def one_tick(self) -> bool:
        """Its CPU reading is at most one clock tick of a window of 40 ms or more: no sign of work
        (a shorter window's single tick tells nothing either way)."""
        return self.cpu_pct <= self.cpu_tick_pct <= FORGIVEN_TICK_PCT

    def ended(self, now: float) -> None:
        """The agent said it left (named gone, or left out of a full sample)."""
        self.alive, self.status, self.gone_at = False, "X", now
        self.cpu_pct, self.gpus, self.gpu_mem_mib = 0.0, [], None


@dataclass
class PortState:
    port: int
    listening: bool
    pid: int | None = None  # the watched process that listens on it
    holder: int | None = None  # who listens when no watched process does (the agent looked)
    holder_uid: int | None = None
    theirs: bool | None = None  # that holder is of the run all the same (a session of its processes)
    holder_user: str | None = None  # the holder's user, as the host names it

    @property
    def stranger(self) -> bool:
        """Listening, but held by a process that is not the run's (or, its descriptors not
        readable, a socket of another user's in the kernel's table): never the run's port opening,
        its /metrics never the run's metrics."""
        return (
            self.listening
            and self.pid is None
            and (self.holder is not None or self.holder_uid is not None)
            and self.theirs is False
        )

    def held_by(self) -> str:
        user = self.holder_user or (f"uid {self.holder_uid}" if self.holder_uid is not None else "user ?")
        if self.holder is None:
            return f"port {self.port} held by a socket of {user} (its process not readable), not the run"
        return f"port {self.port} held by pid {self.holder} ({user}), not the run"


@dataclass
class LogState:
    path: str
    lines: deque[LogLine] = field(default_factory=lambda: deque(maxlen=LOG_LINES))  # classified on arrival
    total: int = 0
    event: str | None = None  # last of opened / created / rotated / truncated / missing
    last_line_at: float | None = None  # local monotonic time the last line arrived
    written_at: float | None = None  # host clock: when the file was last written (its mtime)

    def text(self) -> str:
        return "\n".join(line.text for line in self.lines)


@dataclass
class AgentInfo:
    version: str = "?"
    python: str = "?"
    executable: str = "?"
    hostname: str = "?"
    home: str | None = None
    arch: str = "?"
    nvml: str | None = None
    driver: str | None = None
    psutil: str | None = None
    gpu_source: str | None = None  # pynvml | nvml-ctypes | nvidia-smi | none: what the agent samples GPUs with
    procs_source: str | None = None  # proc | psutil | none
    pid: int | None = None
    interval: float = 1.0
    warnings: list[str] = field(default_factory=list)
    utc_offset: int | None = None  # the host's local time minus UTC, seconds (log lines carry local time)
    xid_source: str | None = None  # nvml | kmsg | None: where the agent hears Xid events
    health_ms: float | None = None  # one slow-clock round of the GPU health calls, on the host


def _is(value, kind: str) -> bool:
    """A frame's field of the type its place needs (`?`: or null). bool is no number here."""
    if kind.endswith("?"):
        return value is None or _is(value, kind[:-1])
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "num":
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if kind == "str":
        return isinstance(value, str)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "strs":
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if kind == "pairs":  # [[pid, mib or null], ...]
        return isinstance(value, list) and all(
            isinstance(v, list) and len(v) == 2 and _is(v[0], "int") and _is(v[1], "num?") for v in value
        )
    return False


GPU_FIELDS = {
    "uuid": "str?",
    "name": "str?",
    "util_pct": "num?",
    "mem_used_mib": "num?",
    "mem_total_mib": "num?",
    "temp_c": "num?",
    "power_w": "num?",
    "power_limit_w": "num?",
    "sm_clock_mhz": "num?",
    "throttle": "int?",
    "ecc_uncorrected": "int?",
    "processes": "pairs",
    "lost": "bool?",
    "ecc_aggregate": "int?",
    "remap_corrected": "int?",
    "remap_uncorrected": "int?",
    "remap_pending": "bool?",
    "remap_failure": "bool?",
    "retired_pending": "bool?",
    "nvlink_replay": "int?",
    "nvlink_recovery": "int?",
    "nvlink_crc": "int?",
    "pcie_replay": "int?",
}
GPU_HEALTH = (
    "lost",
    "ecc_aggregate",
    "remap_corrected",
    "remap_uncorrected",
    "remap_pending",
    "remap_failure",
    "retired_pending",
    "nvlink_replay",
    "nvlink_recovery",
    "nvlink_crc",
    "pcie_replay",
)
PROC_FIELDS = {
    "ppid": "int",
    "name": "str",
    "status": "str",
    "cpu_pct": "num",
    "cpu_tick": "num?",
    "rss_mib": "num",
    "threads": "int",
    "pgid": "int?",
    "sid": "int?",
    "started": "num?",
    "cmdline": "strs?",
}


class HostState:
    """Everything known about one host, updated frame by frame."""

    def __init__(self, target: str = "?", history: int = HISTORY_LEN, rules: LogRules | None = None):
        self.target = target
        self.rules = rules or LogRules()  # how log lines are read: each is classified once, here
        self.agent = AgentInfo()
        self.gpus: dict[int, Gpu] = {}
        self.procs: dict[int, Proc] = {}
        self.ports: list[PortState] = []
        self.logs: dict[str, LogState] = {}
        self.seq = 0
        self.sample_ts: float | None = None  # agent clock
        self.received_at: float | None = None  # local monotonic clock
        self.history_len = history
        self.gpu_history: dict[int, dict[str, deque]] = {}
        self.proc_cpu_history: dict[int, deque] = {}
        self.link_state = "connecting"
        self.rtt_ms: float | None = None
        self.verdict: dict | None = None  # a recorded verdict, for a replayed snapshot
        self.generation = 0  # bumped when a new run replaces the last one (see _run_boundary)
        self._boundary_of: frozenset[int] = frozenset()  # the dead ranks of the boundary reported last
        self.notes: deque = deque(maxlen=20)  # what the operator should be told once
        self.log_ranks: dict[int, int] = {}  # pid -> rank, from log prefixes such as `(VllmWorker TP1 pid=406)`
        self.ras = RasView()  # NCCL RAS answers the agent polled (cockpit/read/ras.py)
        self.metrics = MetricsView()  # the engine's metrics as the monitor scrapes them (cockpit/read/metrics.py)
        self.flight: dict | None = None  # the last flight-recorder comparison (cockpit/read/flightrec.py)
        self.dropped: Counter = Counter()  # frame fields of the wrong type, dropped where applied: "gpus.util_pct"
        self.xid: list[XidEvent] = []  # the recent Xid events the agent heard, oldest first (at most XID_KEPT)
        self.acts: dict[str, dict] = {}  # the host's record of launches, stops and forensics, by id, oldest first
        # pid -> exit status of each process the agent launched and saw end, seen as a process or not
        # (a launch that fails at once ends before the first scan): a launch's own account of it
        self.launch_exits: dict[int, int | None] = {}

    # ------------------------------------------------------------------ frames

    def apply(self, frame: dict) -> str:
        """One frame into the state, field by field: a field of the wrong type (a hostile or
        broken host) is dropped and counted in `dropped`, the rest applied; the link stays up."""
        kind = frame.get("t")
        try:
            if kind == HELLO:
                self._hello(frame)
            elif kind == SAMPLE:
                self._sample(frame)
            elif kind == LOG:
                self._log(frame)
        except (TypeError, ValueError, KeyError, AttributeError, IndexError, OverflowError):
            self.dropped[f"{kind} frame"] += 1  # what the field checks did not foresee: the frame, not the link
        return kind

    def _rows(self, rows, key: str, fields: dict, where: str) -> list[dict]:
        """The rows of a frame's list with only their well-typed fields; a row without a valid key
        is dropped whole. Each drop counted."""
        if not isinstance(rows, list):
            if rows is not None:
                self.dropped[where] += 1
            return []
        out = []
        for row in rows:
            if not isinstance(row, dict) or not _is(row.get(key), "int"):
                self.dropped[f"{where}.{key}"] += 1
                continue
            clean = {key: row[key]}
            for name, value in row.items():
                want = fields.get(name)
                if want is None:
                    continue
                if _is(value, want):
                    clean[name] = value
                else:
                    self.dropped[f"{where}.{name}"] += 1
            out.append(clean)
        return out

    def dropped_note(self) -> str | None:
        """The drops as one warning line, or None."""
        if not self.dropped:
            return None
        parts = ", ".join(f"{name} ×{n}" for name, n in self.dropped.most_common(6))
        return f"the host sent {count(sum(self.dropped.values()), 'field')} of the wrong type, dropped: {parts}"

    def recent_xid(self, index: int | None = None) -> list[XidEvent]:
        """The Xid events of the last XID_RECENT_S (host clock), of one GPU or all."""
        since = None if self.sample_ts is None else self.sample_ts - XID_RECENT_S
        return [e for e in self.xid if (since is None or e.ts >= since) and (index is None or e.gpu == index)]

    def gpu_flags(self, index: int) -> list[str]:
        """What GPU `index` says is wrong, in short words for a pane, a line and a fleet row:
        lost, its recent Xids, a row remap pending or failed, retired pages, uncorrected ECC, the
        hardware holding its clocks down."""
        g = self.gpus.get(index)
        if g is None:
            return []
        flags = ["LOST"] if g.lost else []
        flags += [f"Xid {c}" for c in dict.fromkeys(e.code for e in self.recent_xid(index))]
        flags += [
            n
            for n, on in (
                ("remap failed", g.remap_failure),
                ("remap pending", g.remap_pending),
                ("pages pending", g.retired_pending),
            )
            if on
        ]
        if g.ecc_uncorrected:
            flags.append(f"ECC {g.ecc_uncorrected}")
        return flags + g.hw_slowdown

    def _xid(self, rows) -> None:
        """The agent's recent Xid events, whole: [gpu, ts, code, pid], each checked, merged into
        those known (a reconnected agent hears only new ones: what the last one heard stays)."""
        events = list(self.xid)
        for row in rows if isinstance(rows, list) else [None]:
            if (
                isinstance(row, list)
                and len(row) == 4
                and _is(row[0], "int?")
                and _is(row[1], "num")
                and _is(row[2], "int")
                and _is(row[3], "int?")
            ):
                event = XidEvent(*row)
                if not any(
                    e.gpu == event.gpu and e.code == event.code and e.pid == event.pid and abs(e.ts - event.ts) < 1.0
                    for e in events
                ):  # the kernel log read again
                    events.append(event)
            else:
                self.dropped["xid"] += 1
        self.xid = sorted(events, key=lambda e: e.ts)[-XID_KEPT:]

    def _hello(self, f: dict) -> None:
        self.agent = AgentInfo(
            version=f.get("agent", "?"),
            python=f.get("python", "?"),
            executable=f.get("executable", "?"),
            hostname=f.get("hostname", "?"),
            home=f.get("home"),
            arch=f.get("arch", "?"),
            nvml=f.get("nvml"),
            driver=f.get("driver"),
            psutil=f.get("psutil"),
            pid=f.get("pid"),
            gpu_source=f["gpu_source"] if isinstance(f.get("gpu_source"), str) else None,
            procs_source=f["procs_source"] if isinstance(f.get("procs_source"), str) else None,
            interval=float(f.get("interval") or 1.0),
            warnings=list(f.get("warnings") or []),
            utc_offset=f["utc_offset"] if isinstance(f.get("utc_offset"), int) else None,
            xid_source=f["xid_source"] if isinstance(f.get("xid_source"), str) else None,
            health_ms=f["health_ms"] if _is(f.get("health_ms"), "num") else None,
        )
        for g in self._rows(f.get("gpus"), "index", GPU_FIELDS, "hello.gpus"):
            gpu = self.gpus.setdefault(g["index"], Gpu(index=g["index"]))
            gpu.uuid, gpu.name = g.get("uuid"), g.get("name")
            gpu.mem_total_mib, gpu.power_limit_w = g.get("mem_total_mib"), g.get("power_limit_w")

    def _sample(self, f: dict) -> None:
        now = time.monotonic()
        self.seq = f["seq"] if _is(f.get("seq"), "int") else self.seq + 1
        self.sample_ts = f.get("ts") if _is(f.get("ts"), "num") else None
        self.received_at = now
        pid_gpus: dict[int, list[tuple[int, int | None]]] = {}
        for g in self._rows(f.get("gpus"), "index", GPU_FIELDS, "gpus"):
            gpu = self.gpus.setdefault(g["index"], Gpu(index=g["index"]))
            for key in (
                "util_pct",
                "mem_used_mib",
                "mem_total_mib",
                "temp_c",
                "power_w",
                "power_limit_w",
                "sm_clock_mhz",
                "throttle",
                "ecc_uncorrected",
                *GPU_HEALTH,
            ):
                if key in g:
                    setattr(gpu, key, bool(g[key]) if key == "lost" else g[key])
            if "processes" in g:
                gpu.processes = [(int(p[0]), p[1]) for p in g["processes"] or []]
            for pid, mib in gpu.processes:
                pid_gpus.setdefault(pid, []).append((gpu.index, mib))
            hist = self.gpu_history.setdefault(
                gpu.index, {k: deque(maxlen=self.history_len) for k in ("util_pct", "mem_used_mib", "power_w")}
            )
            for key, buf in hist.items():
                buf.append(getattr(gpu, key))
        gone = f.get("gone")
        # Each process that left, before the rows (a reused pid comes back whole); the others stand.
        for pid in gone if isinstance(gone, list) else []:
            proc = self.procs.get(pid) if _is(pid, "int") else None
            if proc is not None and proc.alive:
                proc.ended(now)
        listed = set()
        for p in self._rows(f.get("procs"), "pid", PROC_FIELDS, "procs"):
            pid = p["pid"]
            listed.add(pid)
            proc = self.procs.get(pid)
            if proc is None or not proc.alive or (p.get("started") and proc.started and p["started"] != proc.started):
                proc = self.procs[pid] = Proc(pid=pid)
            for key in ("ppid", "name", "status", "cpu_pct", "rss_mib", "threads", "pgid", "sid", "started"):
                if key in p:
                    setattr(proc, key, p[key])
            if "cpu_pct" in p or "cpu_tick" in p:  # the tick is part of the CPU reading it came with
                proc.cpu_tick_pct = p.get("cpu_tick") or 0.0
            if "cmdline" in p:
                proc.cmdline = mask_argv(p["cmdline"] or [])  # secrets never reach the screen or JSON
                proc.role, proc.rank = role_of(proc.name, proc.cmdline)
            elif proc.role is None:
                proc.role, proc.rank = role_of(proc.name, proc.cmdline)
        unread = f.get("unread") if isinstance(f.get("unread"), list) else []
        for pid, proc in self.procs.items():
            if proc.alive and f.get("full") is True and pid not in listed and pid not in unread:
                # a full sample (a new agent's first, or the first after a watch change) lists
                # every watched process (or names it `unread`): one held from before that it leaves out is gone
                proc.ended(now)
            if not proc.alive:
                continue
            on = pid_gpus.get(pid, [])
            proc.gpus = [i for i, _ in on]
            proc.gpu_mem_mib = sum(m or 0 for _, m in on) if on else None
            if proc.gpus:
                proc.last_gpus = list(proc.gpus)
            # one clock tick over a window too short to tell is no sign of work: history reads it as 0
            self.proc_cpu_history.setdefault(pid, deque(maxlen=self.history_len)).append(
                0.0 if proc.one_tick else proc.cpu_pct
            )
        for row in f.get("exits") or [] if isinstance(f.get("exits"), list) else []:
            if not (isinstance(row, list) and len(row) == 2 and _is(row[0], "int") and _is(row[1], "int?")):
                self.dropped["exits"] += 1
                continue
            self.launch_exits[row[0]] = row[1]
            if row[0] in self.procs:
                self.procs[row[0]].exit_code = row[1]
        if "xid" in f:
            self._xid(f["xid"])
        if "acts" in f:
            self._acts(f["acts"])
        self._infer_ranks()
        self._run_boundary()
        self._forget_old_dead()
        if "ports" in f:
            ports = []
            for p in f["ports"] if isinstance(f["ports"], list) else []:
                if (
                    isinstance(p, dict)
                    and _is(p.get("port"), "int")
                    and _is(p.get("pid"), "int?")
                    and _is(p.get("holder"), "int?")
                    and _is(p.get("holder_uid"), "int?")
                    and _is(p.get("holder_user"), "str?")
                ):
                    ports.append(
                        PortState(
                            p["port"],
                            bool(p.get("listening")),
                            p.get("pid"),
                            p.get("holder"),
                            p.get("holder_uid"),
                            p["theirs"] if isinstance(p.get("theirs"), bool) else None,
                            p.get("holder_user"),
                        )
                    )
                else:
                    self.dropped["ports"] += 1
            self.ports = ports
        if isinstance(f.get("ras"), dict):
            self.ras.add(f["ras"])

    def _acts(self, rows) -> None:
        for rec in rows if isinstance(rows, list) else []:
            if (
                isinstance(rec, dict)
                and _is(rec.get("id"), "str")
                and _is(rec.get("at"), "num")
                and rec.get("act") in ACTS
            ):
                self.acts[rec["id"]] = rec
            else:
                self.dropped["acts"] += 1
        for key in list(self.acts)[: max(0, len(self.acts) - ACTS_KEPT)]:
            del self.acts[key]

    def acts_of(self, act: str, since: float | None = None) -> list[dict]:
        """The host's records of one kind (`stop`, `ended`, `launch`, `forensics`), oldest first,
        those written at or after `since` (host clock) when given."""
        return [r for r in self.acts.values() if r["act"] == act and (since is None or r["at"] >= since)]

    def launches(self, layout: str) -> list[dict]:
        """The host's launch records of this layout (newest first) whose process group no later
        record says ended: the runs any cockpit launched here that may still live."""
        ended: set = set()
        out = []
        for rec in reversed(self.acts.values()):
            if rec["act"] == "ended":
                ended.update(g for g in rec.get("pgids") or [] if _is(g, "int"))
            elif (
                rec["act"] == "launch"
                and rec.get("layout") == layout
                and _is(rec.get("pgid"), "int")
                and rec["pgid"] not in ended
                and rec.get("start") is not None
                and _is(rec.get("run_id"), "str")
            ):
                out.append(rec)
        return out

    def _run_boundary(self) -> None:
        """A server restarted outside the cockpit (by hand, by systemd, an elastic agent) shows
        up as ranks first seen after every rank of the last run died: a run boundary, reported
        (`generation` moves, with a note of how the last run's ranks ended) for the monitor to act
        on (its dead ranks are history, not a crash of this one). A rank that died while others of
        its run live on is no boundary: that is a crash."""
        ranks = [p for p in self.procs.values() if p.rank is not None]
        live = [p for p in ranks if p.alive]
        dead = [p for p in ranks if not p.alive]
        if not dead or not live or min(p.first_seen for p in live) < max(p.gone_at or 0.0 for p in dead):
            return
        ended = frozenset(p.pid for p in dead)
        if ended == self._boundary_of:
            return  # reported already; the monitor has not acted on it yet
        self._boundary_of = ended
        codes = sorted({p.exit_code for p in dead if p.exit_code is not None})
        ended = f" (exit codes {', '.join(map(str, codes))})" if codes else ""
        groups = ", ".join(str(g) for g in sorted({p.pgid for p in live if p.pgid is not None}))
        self.notes.append(
            f"a new run appeared (process group {groups}): the previous run's {count(len(dead), 'rank')} "
            f"{'is' if len(dead) == 1 else 'are'} gone{ended}"
        )
        self.generation += 1

    def _infer_ranks(self) -> None:
        """A rank whose title is gone (a zombie keeps only its 15-character name, no command line)
        is named from the log's pid prefix, else from its place among its siblings: the engine
        spawns its ranks in order, so the ranks missing among them go to the nameless in start
        order."""
        nameless = [
            p for p in self.procs.values() if p.rank is None and not p.cmdline and _ENGINE_TITLE.match(p.name or "")
        ]
        if not nameless:
            return
        by_parent: dict[int, list[Proc]] = {}
        for p in nameless:
            if p.pid in self.log_ranks:
                p.rank = self.log_ranks[p.pid]
            else:
                by_parent.setdefault(p.ppid, []).append(p)
        for ppid, kids in by_parent.items():
            siblings = [q for q in self.procs.values() if q.ppid == ppid and q.rank is not None]
            if not siblings:
                continue
            missing = sorted(set(range(len(siblings) + len(kids))) - {q.rank for q in siblings})
            if len(missing) != len(kids):
                continue
            for kid, rank in zip(sorted(kids, key=lambda q: (q.started or 0.0, q.pid)), missing):
                kid.rank, kid.role = rank, siblings[0].role

    def forget_dead(self) -> None:
        """A new run starts: the last run's dead processes are history, not part of it."""
        for pid in [p.pid for p in self.procs.values() if not p.alive]:
            del self.procs[pid]
            self.proc_cpu_history.pop(pid, None)

    def _forget_old_dead(self) -> None:
        dead = sorted((p for p in self.procs.values() if not p.alive), key=lambda p: p.gone_at or 0)
        for proc in dead[: max(0, len(dead) - DEAD_KEPT)]:
            del self.procs[proc.pid]
            self.proc_cpu_history.pop(proc.pid, None)

    def _log(self, f: dict) -> None:
        if not _is(f.get("path"), "str"):
            self.dropped["log.path"] += 1
            return
        log = self.logs.setdefault(f["path"], LogState(f["path"]))
        if f.get("event"):
            if _is(f["event"], "str"):
                log.event = mask_line(f["event"])
                if log.event.startswith("refused"):  # the agent would not open it (a symlink, a FIFO, another's file)
                    self.notes.append(f"log not read: {log.event}")
            else:
                self.dropped["log.event"] += 1
        texts = f.get("lines") or []
        if not _is(texts, "strs"):
            self.dropped["log.lines"] += 1
            texts = [t for t in texts if isinstance(t, str)] if isinstance(texts, list) else []
        lines = [self.rules.classify(mask_line(text)) for text in texts]  # secrets masked on arrival
        if f.get("mtime") is not None:
            if _is(f["mtime"], "num"):
                log.written_at = f["mtime"]
            else:
                self.dropped["log.mtime"] += 1
        for line in lines:
            if line.rank is not None:
                m = _LOG_PID.search(line.text, 0, 120)
                if m and len(self.log_ranks) < 4096:
                    self.log_ranks[int(m.group(1))] = line.rank
        log.lines.extend(lines)
        log.total += len(lines)
        if lines:
            log.last_line_at = time.monotonic()

    # ------------------------------------------------------------------ views

    def age_s(self) -> float | None:
        return None if self.received_at is None else time.monotonic() - self.received_at

    def live_procs(self) -> list[Proc]:
        """Processes still running: a zombie has exited, whatever the table says."""
        return [p for p in self.procs.values() if p.alive and p.status != "Z"]

    def ranks(self) -> list[Proc]:
        """Rank-holding processes, by rank: the TP workers."""
        return sorted((p for p in self.procs.values() if p.rank is not None), key=lambda p: (p.rank, p.pid))

    def tree(self) -> list[tuple[int, Proc]]:
        """Watched processes as (depth, proc) in tree order; roots are those whose parent isn't watched."""
        by_parent: dict[int, list[Proc]] = {}
        for p in self.procs.values():
            by_parent.setdefault(p.ppid, []).append(p)
        roots = [p for p in self.procs.values() if p.ppid not in self.procs]
        out: list[tuple[int, Proc]] = []

        def key(p: Proc):
            return (p.rank is None, p.rank or 0, p.title, p.pid)

        seen: set[int] = set()
        # iterative: a process chain 1,000 deep is deeper than Python's recursion limit
        stack = [(r, 0) for r in sorted(roots, key=key, reverse=True)]
        while stack:
            p, depth = stack.pop()
            if p.pid in seen:
                continue
            seen.add(p.pid)
            out.append((depth, p))
            stack.extend((c, depth + 1) for c in sorted(by_parent.get(p.pid, []), key=key, reverse=True))
        return out
