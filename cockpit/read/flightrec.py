"""Torch's flight recorder: what each rank last enqueued, started and completed, compared across
ranks to name the rank that never joined collective N.

Arming (the `forensics` flag set, which any layout has): TORCH_NCCL_TRACE_BUFFER_SIZE (and its
newer name TORCH_FR_BUFFER_SIZE) keeps the last entries; TORCH_NCCL_DUMP_ON_TIMEOUT=1 dumps on a
watchdog timeout and makes the heartbeat thread poll the dump pipe every second;
TORCH_NCCL_DEBUG_INFO_PIPE_FILE is the stem of a FIFO per rank (`<stem><global rank>.pipe`,
created by the rank) that dumps on any byte written; the dump goes to
`<TORCH_NCCL_DEBUG_INFO_TEMP_FILE or TORCH_FR_DUMP_TEMP_FILE><global rank>` as a pickle of plain
containers (torch/csrc/distributed/c10d/FlightRecorderDetail.hpp: `version`, `pg_config`,
`pg_status`, `entries` with `collective_seq_id`, `profiling_name` such as `nccl:all_reduce`,
`state` scheduled/started/completed). The agent triggers and reads the dumps (never unpickling
anything but plain containers: agent.read_fr_dump); this module compares them. Pure.

Whether a collective has *started* is known only with TORCH_NCCL_ENABLE_TIMING (its start event):
without it `pg_status.last_started_collective` is -1 ("not tracked", not "nothing started") and
entries go from `scheduled` straight to `completed` (seen on H200s, torch 2.11). A rank whose
newest entry is `scheduled` has then enqueued that collective and waits in it or before it; its
"started" is only known to be at least its last completed collective."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from cockpit.read.findings import Finding, rank_ranges

FORENSICS = "forensics"


def forensics_env(prefix: str) -> dict[str, str]:
    """The environment the forensics flag set adds to a launch; `prefix` is a path stem on the
    host (the run's log folder and id), so each run's pipes and dumps are its own."""
    return {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
        "TORCH_FR_BUFFER_SIZE": "2000",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": f"{prefix}.fr_rank_",
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": f"{prefix}.fr_pipe_rank_",
        "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_SUBSYS": "COLL",
    }


@dataclass
class RankTrace:
    rank: int
    pg: str  # the process group's name ("0" is the default group)
    last_enqueued: int | None
    last_started: int | None
    last_completed: int | None
    ops: dict[int, str] = field(default_factory=dict)  # collective_seq_id -> profiling name
    states: dict[int, str] = field(default_factory=dict)  # collective_seq_id -> state
    # torch tracks starts (TORCH_NCCL_ENABLE_TIMING): an entry `started` or with a discovered start
    # time, or pg_status' last_started_collective >= 0. Otherwise last_started is a lower bound.
    starts_tracked: bool = False


def _seq(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def traces(dump: dict, rank: int) -> list[RankTrace]:
    """One rank's dump (the agent's plain-container reading of it) as a trace per process group."""
    by_pg: dict[str, RankTrace] = {}
    entries = dump.get("entries") if isinstance(dump.get("entries"), list) else []
    names: dict[int, str] = {}
    for e in entries:
        if not isinstance(e, dict) or e.get("is_p2p"):
            continue
        pg = e.get("process_group")
        pg_name = str(pg[0] if isinstance(pg, (list, tuple)) and pg else e.get("pg_id", "?"))[:40]
        pg_id = e.get("pg_id")
        if isinstance(pg_id, int):
            names[pg_id] = pg_name
        seq = _seq(e.get("collective_seq_id"))
        if seq is None:
            continue
        t = by_pg.setdefault(pg_name, RankTrace(rank, pg_name, None, None, None))
        t.ops[seq] = str(e.get("profiling_name") or "?")[:60]
        state = str(e.get("state") or "?")[:20]
        t.states[seq] = state
        t.last_enqueued = max(t.last_enqueued or 0, seq)
        if state == "started" or e.get("time_discovered_started_ns") is not None:
            t.starts_tracked = True
        if state in ("started", "completed"):
            t.last_started = max(t.last_started or 0, seq)
        if state == "completed":
            t.last_completed = max(t.last_completed or 0, seq)
    status = dump.get("pg_status") if isinstance(dump.get("pg_status"), dict) else {}
    for pg_id, st in status.items():
        if not isinstance(st, dict):
            continue
        try:
            name = names.get(int(pg_id), str(pg_id))
        except ValueError:
            name = str(pg_id)[:40]
        t = by_pg.setdefault(name, RankTrace(rank, name, None, None, None))
        for key, attr in (
            ("last_enqueued_collective", "last_enqueued"),
            ("last_started_collective", "last_started"),
            ("last_completed_collective", "last_completed"),
        ):
            v = _seq(st.get(key))
            if v is not None:
                setattr(t, attr, max(getattr(t, attr) or 0, v))
                if key == "last_started_collective":
                    t.starts_tracked = True
    return list(by_pg.values())


def _op(name: str) -> str:
    return name.split(":", 1)[-1] if name else "?"


def _ranks(rs: list[int]) -> str:
    return f"rank{'s' if len(rs) > 1 else ''} {rank_ranges(rs)}"


def _who_waits(inside: list[int], queued: list[int]) -> str:
    """The ranks that called the collective the others never did: in it (started), or enqueued it
    and wait (its start not tracked, or not yet on the GPU)."""
    parts = []
    if inside:
        parts.append(f"{_ranks(inside)} {'are' if len(inside) > 1 else 'is'} in it")
    if queued:
        parts.append(f"{_ranks(queued)} enqueued it and wait{'' if len(queued) > 1 else 's'}")
    return ", ".join(parts) or "no rank is in it"


def compare(dumps: dict[int, dict]) -> dict:
    """Per process group, across ranks: the collective some ranks are in and others never joined.
    Returns {"groups": [...], "lines": [...], "odd_rank": R or None}."""
    per_pg: dict[str, dict[int, RankTrace]] = {}
    for rank, dump in dumps.items():
        if isinstance(dump, dict):
            for t in traces(dump, rank):
                per_pg.setdefault(t.pg, {})[rank] = t
    lines: list[str] = []
    groups = []
    odd: set[int] = set()
    for pg, ranks in sorted(per_pg.items(), key=lambda kv: (kv[0] != "0", kv[0])):
        enq = {r: t.last_enqueued or 0 for r, t in ranks.items()}
        started = {r: t.last_started or 0 for r, t in ranks.items()}
        done = {r: t.last_completed or 0 for r, t in ranks.items()}
        top = max(enq.values())
        name = next((_op(t.ops[top]) for t in ranks.values() if top in t.ops), "collective")
        where = "" if pg == "0" else f" (process group {pg})"
        behind = sorted(r for r, v in enq.items() if v < top)
        pending = sorted(r for r in ranks if enq[r] == top and done[r] < top)  # enqueued it, not completed
        inside = [r for r in pending if started[r] >= top]  # known to have started it
        queued = [r for r in pending if started[r] < top]  # enqueued it; started unknown or not yet
        tracked = {r: t.starts_tracked for r, t in ranks.items()}
        group = {
            "pg": pg,
            "collective": top,
            "op": name,
            "last_enqueued": enq,
            "last_started": started,
            "last_completed": done,
            "starts_tracked": tracked,
        }
        if behind:
            lows = sorted({enq[r] for r in behind})
            lines.append(
                f"{_ranks(behind)} never called {name} #{top}{where} (last collective #{lows[0]}); "
                f"{_who_waits(inside, queued)}"
            )
            odd.update(behind)
        else:
            unstarted = [r for r in queued if tracked[r]]  # only where torch tracks starts
            if unstarted and len(unstarted) < len(ranks):
                rest = sorted(set(ranks) - set(unstarted))
                lines.append(
                    f"{_ranks(unstarted)} never started {name} #{top}{where}; "
                    f"{_ranks(rest)} {'are' if len(rest) != 1 else 'is'} in it"
                )
                odd.update(unstarted)
            elif len(pending) == len(ranks) and not queued:
                lines.append(
                    f"every rank is inside {name} #{top}{where} (started, never completed): a hang inside "
                    f"the collective itself; the flight recorder cannot name a rank"
                )
            elif len(pending) == len(ranks) and not unstarted:
                lines.append(
                    f"every rank enqueued {name} #{top}{where} and none completed it (starts not tracked: "
                    f"TORCH_NCCL_ENABLE_TIMING unset): a hang in or before the collective on every rank; "
                    f"the flight recorder cannot name a rank"
                )
        mismatch = {r: t.ops.get(top) for r, t in ranks.items() if top in t.ops}
        if len(set(mismatch.values())) > 1:
            lines.append(
                f"collective #{top}{where} differs across ranks: "
                + ", ".join(f"rank {r} {_op(v)}" for r, v in sorted(mismatch.items()))
            )
        groups.append(group)
    return {"groups": groups, "lines": lines, "odd_rank": min(odd) if len(odd) == 1 else None}


def by_reason(problems: list[str]) -> list[str]:
    """`pid N: why` lines with the same why said once, with their pids (eight ranks not armed for
    the same reason are one line)."""
    by: dict[str, list[str]] = {}
    for line in problems:
        m = re.match(r"pid (\d+): (.*)\Z", line, re.S)
        by.setdefault(m.group(2) if m else line, []).extend([m.group(1)] if m else [])
    return [
        f"{'pids' if len(pids) > 1 else 'pid'} {', '.join(pids)}: {why}" if pids else why for why, pids in by.items()
    ]


def findings(result: dict) -> list[Finding]:
    """The last comparison (state.flight) as evidence."""
    lines = result.get("lines") or []
    if not lines:
        return []
    return [Finding("flight recorder", list(lines), odd_rank=result.get("odd_rank"))]


def describe(answer: dict, result: dict) -> list[str]:
    """What `cockpit flightrec` prints: per rank the dump, then the comparison."""
    out = []
    for rank, d in sorted(((int(k), v) for k, v in (answer.get("ranks") or {}).items()), key=lambda kv: kv[0]):
        if d.get("error"):
            out.append(f"rank {rank}: no dump ({d['error']})")
        else:
            out.append(f"rank {rank}: {d.get('entries_total', 0)} entries, dump {d.get('file')}")
    for why in by_reason(answer.get("problems") or []):
        out.append(why if why.startswith("left alone") else f"not armed: {why}")
    for g in result.get("groups") or []:
        untracked = not all((g.get("starts_tracked") or {}).values())
        out.append(
            f"process group {g['pg']}: last enqueued {g['last_enqueued']}, started "
            f"{'at least ' if untracked else ''}{g['last_started']}, completed {g['last_completed']}"
            f"{' (starts not tracked: TORCH_NCCL_ENABLE_TIMING unset)' if untracked else ''}"
        )
    dumps = [d for d in (answer.get("ranks") or {}).values() if not d.get("error")]
    if not dumps:
        out.append("no dumps collected: nothing to compare")
    else:
        out.extend(result.get("lines") or ["every rank completed the same collectives: no rank is behind"])
    return out
