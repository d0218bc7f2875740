"""NCCL's RAS service, as the agent hears it: its answers parsed (JSON from NCCL 2.28, the text
report before that or when the JSON is broken) and judged over time. The collective library itself
says which rank is behind: counts are launch counts, so the rank with the lower count never
launched the collective its peers wait in. Pure functions and a small history; the agent does the
talking (cockpit/agent/ras.py: RasPoller, ras_query).

Text from the host is hostile: every field is bounded and typed here, nothing is rendered as
markup, and a report that cannot be read says so in one line."""

from __future__ import annotations

import json
import re
from collections import deque
from dataclasses import dataclass, field

from cockpit import engines
from cockpit.common.hosttext import count
from cockpit.read.findings import Finding, rank_ranges

RAS_PORT = 28028
MAX_TEXT = 1 << 20  # the agent sends at most this much of one answer
MAX_RANKS = 4096
HISTORY = 64  # polls kept (every ~5 s: five minutes)
FIELD_MAX = 200

_ENGINES_OWN = " and ".join(f"{e.title}'s" for e in engines.ENGINES.values() if e.title)
BLIND_SYMMETRIC = (
    "RAS shows no skew: a hang where every rank is inside the same collective looks like this, and "
    f"so does a collective outside NCCL (custom all-reduce, {_ENGINES_OWN} default for small "
    "TP messages, bypasses NCCL): RAS cannot name a rank here"
)


@dataclass
class RasRank:
    rank: int
    pid: int | None = None
    host: str | None = None
    cuda_dev: int | None = None
    counts: dict[str, int] = field(default_factory=dict)  # op -> launched up to
    async_error: int = 0
    abort: bool = False


@dataclass
class RasMissing:
    rank: int
    pid: int | None = None
    host: str | None = None
    cuda_dev: int | None = None
    unresponsive: bool = False
    dead: bool = False


@dataclass
class RasComm:
    hash: str
    size: int | None = None
    ranks: dict[int, RasRank] = field(default_factory=dict)
    missing: list[RasMissing] = field(default_factory=list)
    status: str | None = None  # text report: RUNNING, ...
    errors: str | None = None  # text report: OK, MISMATCH, ERROR, INCOMPLETE
    groups: dict[str, dict[int, int]] = field(default_factory=dict)  # text: op -> {count: ranks at it} not listed


@dataclass
class RasReport:
    format: str  # json | text | none
    comms: list[RasComm] = field(default_factory=list)
    nccl_version: str | None = None
    cuda_runtime: int | None = None
    dead_processes: int = 0  # text: "N job processes considered dead"
    missing_processes: int = 0  # text: "Missing communicator data from N job processes"
    timeouts: int = 0
    error: str | None = None  # why the report could not be had or read

    def doc(self) -> dict:
        return {
            "format": self.format,
            "nccl_version": self.nccl_version,
            "error": self.error,
            "dead_processes": self.dead_processes,
            "missing_processes": self.missing_processes,
            "timeouts": self.timeouts,
            "communicators": [
                {
                    "hash": c.hash,
                    "size": c.size,
                    "status": c.status,
                    "errors": c.errors,
                    "ranks": [
                        {
                            "rank": r.rank,
                            "pid": r.pid,
                            "host": r.host,
                            "cuda_dev": r.cuda_dev,
                            "counts": dict(r.counts),
                            "async_error": r.async_error,
                        }
                        for r in sorted(c.ranks.values(), key=lambda r: r.rank)
                    ],
                    "missing": [
                        {
                            "rank": m.rank,
                            "pid": m.pid,
                            "host": m.host,
                            "cuda_dev": m.cuda_dev,
                            "unresponsive": m.unresponsive,
                            "dead": m.dead,
                        }
                        for m in c.missing
                    ],
                }
                for c in self.comms
            ],
        }


def _s(value, limit: int = FIELD_MAX) -> str | None:
    return None if value is None else str(value)[:limit]


def _i(value) -> int | None:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value == value and abs(value) < 2**63:
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"-?\d{1,19}", value.strip()):
        return int(value)
    return None


# ----------------------------------------------------------------------------- parsing


def parse_json(text: str) -> RasReport:
    """NCCL 2.28's JSON report. Raises ValueError when it is not JSON or not shaped like one."""
    doc = json.loads(text[:MAX_TEXT])
    if not isinstance(doc, dict) or not isinstance(doc.get("communicators", []), list):
        raise ValueError("not a RAS report: no communicators list")
    rep = RasReport(
        "json", nccl_version=_s(doc.get("nccl_version"), 40), cuda_runtime=_i(doc.get("cuda_runtime_version"))
    )
    ras = doc.get("ras") if isinstance(doc.get("ras"), dict) else {}
    rep.timeouts = _i(ras.get("timeouts_count")) or 0
    for c in doc.get("communicators") or []:
        if not isinstance(c, dict):
            continue
        comm = RasComm(_s(c.get("hash"), 40) or "?", size=_i(c.get("size")))
        for r in (c.get("ranks") or [])[:MAX_RANKS]:
            if not isinstance(r, dict) or _i(r.get("rank")) is None:
                continue
            status = r.get("status") if isinstance(r.get("status"), dict) else {}
            counts = r.get("collective_counts") if isinstance(r.get("collective_counts"), dict) else {}
            rank = RasRank(
                _i(r["rank"]),
                pid=_i(r.get("pid")),
                host=_s(r.get("host")),
                cuda_dev=_i(r.get("cuda_dev")),
                counts={_s(k, 40): _i(v) for k, v in list(counts.items())[:32] if _i(v) is not None},
                async_error=_i(status.get("async_error")) or 0,
                abort=bool(status.get("abort_flag")),
            )
            comm.ranks[rank.rank] = rank
        for m in (c.get("missing_ranks") or [])[:MAX_RANKS]:
            if not isinstance(m, dict) or _i(m.get("rank")) is None:
                continue
            status = m.get("status") if isinstance(m.get("status"), dict) else {}
            comm.missing.append(
                RasMissing(
                    _i(m["rank"]),
                    pid=_i(m.get("pid")),
                    host=_s(m.get("host")),
                    cuda_dev=_i(m.get("cuda_dev")),
                    unresponsive=bool(status.get("unresponsive")),
                    dead=bool(status.get("considered_dead")),
                )
            )
        rep.comms.append(comm)
    return rep


_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\d+)\s+([\d-]+)\s+(\d+)\s+(\d+)\s+([A-Z_]+)\s+([A-Z_]+)\s*$")
_COMM = re.compile(r"^#(\d+)-(\d+) \(([0-9a-fA-F]+)\) ([A-Z_]+)")
_OPS = re.compile(r"different (\w+) operation counts")
_GROUP = re.compile(r"^\s+(\d+) ranks have (?:launched up to operation (\d+)|not launched any operations)")
_RANK = re.compile(
    r"^\s+Rank (\d+)(?: has (?:launched up to operation (\d+)|not launched any operations|status (\w+)|reported (.+?)))?"
    r" -- (?:GPU (\S+) managed by process (\d+) on node (\S+)|\[process information not found\])"
)
_DEAD = re.compile(r"^\s+(\d+) job process(?:es are| is) considered dead")
_MISSING = re.compile(r"^\s+Missing communicator data from (\d+) job process")
_MISSING_RANKS = re.compile(r"^\s+Missing communicator data from (\d+) rank")
_VERSION = re.compile(r"NCCL version (\S+)")


def parse_text(text: str) -> RasReport:
    """The text report (NCCL 2.24 on, or a broken JSON's fallback): the table's status per group,
    and from the error sections the ranks named with their counts, the missing and the dead."""
    rep = RasReport("text")
    rows: list[tuple[str, str]] = []
    comm: RasComm | None = None
    section = None  # "counts", "missing", or None
    op = None
    group_value: int | None = None
    for line in text[:MAX_TEXT].splitlines()[:100_000]:
        m = _VERSION.search(line)
        if m and rep.nccl_version is None:
            rep.nccl_version = m.group(1)[:40]
        m = _ROW.match(line)
        if m:
            rows.append((m.group(7), m.group(8)))
            continue
        m = _DEAD.match(line)
        if m:
            rep.dead_processes = int(m.group(1))
            continue
        m = _MISSING.match(line)
        if m:
            rep.missing_processes = int(m.group(1))
            continue
        m = _COMM.match(line)
        if m:
            comm = RasComm(m.group(3)[:40], errors=m.group(4))
            if int(m.group(1)) < len(rows):
                comm.status = rows[int(m.group(1))][0]
            rep.comms.append(comm)
            section, op, group_value = None, None, None
            continue
        if comm is None:
            continue
        m = _OPS.search(line)
        if m:
            section, op, group_value = "counts", m.group(1)[:40], None
            continue
        if _MISSING_RANKS.match(line):
            section, op, group_value = "missing", None, None
            continue
        m = _GROUP.match(line)
        if m and section == "counts":
            group_value = int(m.group(2) or 0)
            comm.groups.setdefault(op, {})[group_value] = int(m.group(1))
            continue
        m = _RANK.match(line)
        if m and len(comm.ranks) < MAX_RANKS:
            r = int(m.group(1))
            pid = int(m.group(6)) if m.group(6) else None
            host, gpu = _s(m.group(7)), _i(m.group(5))
            if section == "missing":
                comm.missing.append(RasMissing(r, pid=pid, host=host, cuda_dev=gpu))
                continue
            rank = comm.ranks.setdefault(r, RasRank(r, pid=pid, host=host, cuda_dev=gpu))
            if section == "counts" and op:
                single = "has launched" in line or "has not launched" in line
                rank.counts[op] = int(m.group(2) or 0) if single else (group_value or 0)
    if not rep.comms and rows:
        for n, (status, errors) in enumerate(rows):
            rep.comms.append(RasComm(f"group {n}", status=status, errors=errors))
    return rep


def parse(answer: dict) -> RasReport:
    """The agent's answer (format, text, error, json_error) as a report: the JSON when it parses,
    else the text report; a broken JSON without text is an error said in one line."""
    if not isinstance(answer, dict):
        return RasReport("none", error="not an answer")
    if answer.get("error") and not answer.get("text"):
        return RasReport("none", error=_s(answer["error"]))
    text = answer.get("text") or ""
    if not isinstance(text, str):
        return RasReport("none", error="the answer is not text")
    if answer.get("format") == "json":
        try:
            return parse_json(text)
        except (ValueError, TypeError, KeyError, RecursionError) as exc:
            rep = parse_text(text)
            rep.error = f"malformed JSON from RAS ({_s(exc, 120)}): read as text"
            return rep
    rep = parse_text(text)
    if answer.get("json_error"):
        rep.error = f"RAS sent malformed JSON ({_s(answer['json_error'], 120)}): the text report was read instead"
    return rep


# ----------------------------------------------------------------------------- judging


@dataclass
class Skew:
    comm: str
    op: str
    behind: dict[int, int]  # rank -> count
    ahead: dict[int, int]
    unlisted: dict[int, int] = field(default_factory=dict)  # text: count -> ranks at it, not named


def skews(rep: RasReport) -> list[Skew]:
    """Per communicator and op: the ranks at the lowest count while others are further on."""
    out = []
    for c in rep.comms:
        ops = {op for r in c.ranks.values() for op in r.counts} | set(c.groups)
        for op in sorted(ops):
            counts = {r.rank: r.counts[op] for r in c.ranks.values() if op in r.counts}
            values = set(counts.values()) | set(c.groups.get(op, {}))
            if len(values) < 2:
                continue
            low = min(values)
            behind = {r: v for r, v in counts.items() if v == low}
            ahead = {r: v for r, v in counts.items() if v != low}
            unlisted = {v: n for v, n in c.groups.get(op, {}).items() if v not in counts.values()}
            if behind:
                out.append(Skew(c.hash, op, behind, ahead, unlisted))
    return out


def _total(rep: RasReport) -> tuple:
    """Every count of every rank: two reports with the same total saw no progress between them."""
    return tuple(
        sorted((c.hash, r.rank, op, v) for c in rep.comms for r in c.ranks.values() for op, v in r.counts.items())
    )


class RasView:
    """The latest RAS reports of a host (the agent polls about every 5 s while a rank listens on
    NCCL's RAS port), and since when their counts have not moved."""

    def __init__(self, history: int = HISTORY):
        self.reports: deque[tuple[float, RasReport]] = deque(maxlen=history)
        self.raw: dict | None = None  # the agent's last answer as it came (bounded by the agent)
        self.port: int | None = None
        self.still_since: float | None = None  # host clock: the counts have been what they are since then
        self.moved_at: float | None = None  # host clock: the last poll that saw a count change
        self._total: tuple | None = None

    @property
    def latest(self) -> RasReport | None:
        return self.reports[-1][1] if self.reports else None

    def add(self, answer: dict) -> RasReport:
        ts = answer.get("ts") if isinstance(answer.get("ts"), (int, float)) else 0.0
        rep = parse(answer)
        self.raw = answer
        self.port = _i(answer.get("port")) or self.port
        if rep.error is None or rep.comms:
            total = _total(rep)
            if total != self._total or self.still_since is None:
                if self._total is not None:
                    self.moved_at = ts
                self._total, self.still_since = total, ts
        self.reports.append((ts, rep))
        return rep

    def still_for(self, now_ts: float | None) -> float:
        if self.still_since is None or now_ts is None or len(self.reports) < 2:
            return 0.0
        return max(0.0, now_ts - self.still_since)

    def doc(self) -> dict | None:
        if not self.reports:
            return None
        ts, rep = self.reports[-1]
        return {
            **rep.doc(),
            "at": ts,
            "port": self.port,
            "still_s": round(self.still_for(ts), 1),
            "skews": [{"communicator": s.comm, "op": s.op, "behind": s.behind, "ahead": s.ahead} for s in skews(rep)],
        }


def _count(n: int) -> str:
    return f"{n:,}"


def _ranks_at(counts: dict[int, int]) -> str:
    by_value: dict[int, list[int]] = {}
    for r, v in counts.items():
        by_value.setdefault(v, []).append(r)
    parts = []
    for v, rs in sorted(by_value.items(), key=lambda kv: -len(kv[1])):
        parts.append(f"rank{'s' if len(rs) > 1 else ''} {rank_ranges(rs)} {_count(v)}")
    return ", ".join(parts)


def findings(view: RasView, now_ts: float | None, stall_s: float, stalled: bool = False) -> list[Finding]:
    """What RAS says about the run: a rank behind while no count moves (a stall naming the rank),
    ranks RAS calls missing, unresponsive or dead, asynchronous errors; with `stalled` (the
    watchdog's own verdict), the blind spots that apply when RAS cannot name anyone."""
    rep = view.latest
    if rep is None:
        return []
    out: list[Finding] = []
    still = view.still_for(now_ts)
    # moving: the latest poll saw a count change (counts that moved, then stood still over two polls, do not move)
    moving = view.moved_at is not None and view.moved_at == view.reports[-1][0]
    watched = len(view.reports) >= 2
    for c in rep.comms:
        for m in c.missing:
            how = "considered dead" if m.dead else "unresponsive" if m.unresponsive else "missing"
            who = f"pid {m.pid}, GPU {m.cuda_dev}" if m.pid is not None else "no process information"
            out.append(
                Finding(
                    "RAS",
                    [f"rank {m.rank} ({who}) is {how} in communicator {c.hash}"],
                    odd_rank=m.rank,
                    stalled=still >= stall_s,
                    dead=m.dead,
                )
            )
        for r in c.ranks.values():
            if r.async_error:
                out.append(
                    Finding(
                        "RAS",
                        [
                            f"rank {r.rank} (pid {r.pid}) reports NCCL asynchronous error "
                            f"{r.async_error} in communicator {c.hash}"
                        ],
                        odd_rank=r.rank,
                    )
                )
    if rep.dead_processes and not any(m.dead for c in rep.comms for m in c.missing):
        out.append(
            Finding(
                "RAS",
                [
                    f"{count(rep.dead_processes, 'job process', 'job processes')} "
                    f"considered dead (unreachable via the RAS network)"
                ],
                dead=True,
            )
        )
    for s in skews(rep):
        # A skew alone is normal (ranks are always a little apart); one that holds is a stall on its
        # own, and one the watchdog already calls a stall names the rank as soon as a second poll
        # saw the same counts.
        if still < stall_s and not (stalled and watched and not moving):
            continue
        behind = sorted(s.behind)
        low = s.behind[behind[0]]
        others = _ranks_at(s.ahead)
        if s.unlisted:
            others = ", ".join(filter(None, [others, *(f"{n} other ranks {_count(v)}" for v, n in s.unlisted.items())]))
        how = f"no progress for {still:.0f} s" if still >= stall_s else f"unchanged over {still:.0f} s of polling"
        line = f"rank{'s' if len(behind) > 1 else ''} {rank_ranges(behind)} launched up to {s.op} {_count(low)}, {others}; {how}"
        out.append(
            Finding(
                "RAS",
                [line, "counts are launch counts: the rank behind never launched the collective the others wait in"],
                odd_rank=behind[0] if len(behind) == 1 else None,
                stalled=still >= stall_s,
            )
        )
    if stalled and not out and rep.comms and watched:
        if moving:
            out.append(
                Finding(
                    "RAS",
                    [
                        "NCCL collective counts still move: the stall is outside NCCL's collectives "
                        "(custom all-reduce bypasses NCCL, or the ranks wait elsewhere)"
                    ],
                )
            )
        else:
            out.append(Finding("RAS", [f"no NCCL count moved in {still:.0f} s; {BLIND_SYMMETRIC}"]))
    return out


def port_label(port: int, view: RasView | None = None) -> str | None:
    """How the ports pane names the RAS port."""
    if port == (view.port if view is not None and view.port else RAS_PORT):
        return "NCCL RAS"
    return None
