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
anything but plain containers: agent.read_fr_dump); this module compares them. Pure."""

from __future__ import annotations

from dataclasses import dataclass, field

from cockpit.evidence import Finding, rank_ranges

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
        for key, attr in (("last_enqueued_collective", "last_enqueued"), ("last_started_collective", "last_started"),
                          ("last_completed_collective", "last_completed")):
            v = _seq(st.get(key))
            if v is not None:
                setattr(t, attr, max(getattr(t, attr) or 0, v))
    return list(by_pg.values())


def _op(name: str) -> str:
    return name.split(":", 1)[-1] if name else "?"


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
        waiting = sorted(r for r in ranks if enq[r] == top and started[r] >= top and done[r] < top)
        group = {"pg": pg, "collective": top, "op": name, "last_enqueued": enq, "last_started": started,
                 "last_completed": done}
        if behind:
            lows = sorted({enq[r] for r in behind})
            lines.append(f"rank{'s' if len(behind) > 1 else ''} {rank_ranges(behind)} never called {name} "
                         f"#{top}{where} (last collective #{lows[0]}); rank{'s' if len(waiting) != 1 else ''} "
                         f"{rank_ranges(waiting) or 'none'} {'are' if len(waiting) != 1 else 'is'} in it")
            odd.update(behind)
        else:
            unstarted = sorted(r for r in ranks if started[r] < top)
            if unstarted and len(unstarted) < len(ranks):
                lines.append(f"rank{'s' if len(unstarted) > 1 else ''} {rank_ranges(unstarted)} never started "
                             f"{name} #{top}{where}; rank{'s' if len(ranks) - len(unstarted) != 1 else ''} "
                             f"{rank_ranges(sorted(set(ranks) - set(unstarted)))} "
                             f"{'are' if len(ranks) - len(unstarted) != 1 else 'is'} in it")
                odd.update(unstarted)
            elif all(done[r] < top for r in ranks) and all(started[r] >= top for r in ranks):
                lines.append(f"every rank is inside {name} #{top}{where} (started, never completed): a hang inside "
                             f"the collective itself; the flight recorder cannot name a rank")
        mismatch = {r: t.ops.get(top) for r, t in ranks.items() if top in t.ops}
        if len(set(mismatch.values())) > 1:
            lines.append(f"collective #{top}{where} differs across ranks: "
                         + ", ".join(f"rank {r} {_op(v)}" for r, v in sorted(mismatch.items())))
        groups.append(group)
    return {"groups": groups, "lines": lines, "odd_rank": min(odd) if len(odd) == 1 else None}


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
    for why in answer.get("problems") or []:
        out.append(f"not armed: {why}")
    for g in result.get("groups") or []:
        out.append(f"process group {g['pg']}: last enqueued {g['last_enqueued']}, started {g['last_started']}, "
                   f"completed {g['last_completed']}")
    out.extend(result.get("lines") or ["every rank completed the same collectives: no rank is behind"])
    return out
