"""The JSON snapshot: one document of a host's state, for scripts and tests.

Versioned by SCHEMA; docs/snapshot-schema.md describes every field. Fields a GPU does not
support are null, never 0."""

from __future__ import annotations

import datetime as dt
from collections import deque

from cockpit.host.state import GPU_HEALTH, THROTTLE_REASONS, HostState, Proc
from cockpit.read.xid import action, meaning

SCHEMA = "gpu-cockpit.snapshot/1"
LOG_LINES = 50
HISTORY = 60


def snapshot_doc(
    state: HostState, log_lines: int = LOG_LINES, taken_at: float | None = None, verdict=None, phase=None
) -> dict:
    taken = dt.datetime.fromtimestamp(taken_at if taken_at is not None else (state.sample_ts or 0), dt.timezone.utc)
    a = state.agent
    log_path = next(iter(state.logs), None)
    log = state.logs.get(log_path) if log_path else None
    return {
        "schema": SCHEMA,
        "target": state.target,
        "taken_at": taken.isoformat(timespec="seconds"),
        "agent": {
            "version": a.version,
            "hostname": a.hostname,
            "python": a.python,
            "executable": a.executable,
            "nvml": a.nvml,
            "driver": a.driver,
            "psutil": a.psutil,
            "gpu_source": a.gpu_source,
            "procs_source": a.procs_source,
            "xid_source": a.xid_source,
            "health_ms": a.health_ms,
            "warnings": a.warnings + [n for n in [state.dropped_note()] if n],
            "dropped_fields": dict(state.dropped),
        },
        "gpus": [
            {
                "index": g.index,
                "uuid": g.uuid,
                "name": g.name,
                "util_pct": g.util_pct,
                "mem_used_mib": g.mem_used_mib,
                "mem_total_mib": g.mem_total_mib,
                "temp_c": g.temp_c,
                "power_w": g.power_w,
                "power_limit_w": g.power_limit_w,
                "sm_clock_mhz": g.sm_clock_mhz,
                "throttle_reasons": g.throttle_reasons,
                "ecc_uncorrected": g.ecc_uncorrected,
                **{key: getattr(g, key) for key in GPU_HEALTH},  # the GPU's own word (docs/xid.md)
                "processes": [{"pid": pid, "used_mib": mib} for pid, mib in g.processes],
                **({"label": g.label} if hasattr(g, "label") else {}),  # node:index of a run spanning nodes
            }
            for g in sorted(state.gpus.values(), key=lambda g: g.index)
        ],
        "processes": [
            {
                "pid": p.pid,
                "ppid": p.ppid,
                "name": p.name,
                "cmdline": p.cmdline,
                "status": p.status,
                "alive": p.alive,
                "cpu_pct": p.cpu_pct,
                "cpu_tick_pct": p.cpu_tick_pct,
                "rss_mib": p.rss_mib,
                "threads": p.threads,
                "pgid": p.pgid,
                "role": p.role,
                "rank": p.rank,
                "gpus": p.gpus,
                "gpu_mem_mib": p.gpu_mem_mib,
                "exit_code": p.exit_code,
                "last_gpus": p.last_gpus,
                **(
                    {"node": p.node, "node_pid": p.node_pid, "step": getattr(p, "step", None)}
                    if hasattr(p, "node")
                    else {}
                ),  # a run spanning nodes (cockpit/monitor/cluster.py)
            }
            for _, p in state.tree()
        ],
        "ports": [
            {
                "port": p.port,
                "listening": p.listening,
                "pid": p.pid,
                **(
                    {"holder": p.holder, "holder_uid": p.holder_uid, "holder_user": p.holder_user, "theirs": p.theirs}
                    if p.holder or p.holder_uid is not None
                    else {}
                ),
            }
            for p in state.ports
        ],
        "xid": [{"gpu": e.gpu, "time": _iso(e.ts), "ts": e.ts, "code": e.code, "pid": e.pid} for e in state.xid],
        "log": {
            "path": log_path,
            "event": log.event if log else None,
            "lines": [line.text for line in list(log.lines)[-log_lines:]] if log else [],
        },
        "ras": state.ras.doc(),
        "metrics": state.metrics.doc(),
        "flight_recorder": state.flight,
        "phase": None if phase is None else {"name": phase.name, "detail": phase.detail},
        "verdict": None if verdict is None else verdict.doc(),
        "history": {
            str(i): {key: list(buf)[-HISTORY:] for key, buf in hist.items()}
            for i, hist in sorted(state.gpu_history.items())
        },
    }


def gpu_health_doc(state: HostState) -> dict:
    """The GPUs' own word, on its own (the bundle's gpu-health.json): where Xids are heard from,
    what a health round costs, every recent Xid with its meaning and next step (docs/xid.md),
    and each GPU's health fields and flags."""
    return {
        "xid_source": state.agent.xid_source,
        "health_ms": state.agent.health_ms,
        "xid": [
            {
                "gpu": e.gpu,
                "time": _iso(e.ts),
                "code": e.code,
                "meaning": meaning(e.code),
                "next": action(e.code),
                "pid": e.pid,
            }
            for e in state.xid
        ],
        "gpus": [
            {
                "index": g.index,
                "uuid": g.uuid,
                "flags": state.gpu_flags(g.index),
                "throttle_reasons": g.throttle_reasons,
                "ecc_uncorrected": g.ecc_uncorrected,
                **{key: getattr(g, key) for key in GPU_HEALTH},
            }
            for g in sorted(state.gpus.values(), key=lambda g: g.index)
        ],
    }


def state_from_doc(doc: dict) -> HostState:
    """A HostState rebuilt from a snapshot document: renders a recorded moment, the same way
    every time (the screenshots and the SVG snapshot tests use this)."""
    state = HostState(doc.get("target", "?"))
    a = doc.get("agent") or {}
    state.apply(
        {
            "t": "hello",
            "agent": a.get("version"),
            "python": a.get("python"),
            "executable": a.get("executable"),
            "hostname": a.get("hostname"),
            "nvml": a.get("nvml"),
            "driver": a.get("driver"),
            "psutil": a.get("psutil"),
            "gpu_source": a.get("gpu_source"),
            "procs_source": a.get("procs_source"),
            "xid_source": a.get("xid_source"),
            "health_ms": a.get("health_ms"),
            "warnings": a.get("warnings") or [],
            "gpus": doc.get("gpus") or [],
        }
    )
    procs = []
    for p in doc.get("processes") or []:
        if p.get("alive", True):
            row = {k: p.get(k) for k in ("pid", "ppid", "name", "status", "cpu_pct", "rss_mib", "threads", "pgid")}
            row["cmdline"] = p.get("cmdline") or []
            if p.get("cpu_tick_pct"):
                row["cpu_tick"] = p["cpu_tick_pct"]
            procs.append(row)
    gpus = [
        dict(
            g,
            processes=[[q["pid"], q["used_mib"]] for q in g.get("processes") or []],
            throttle=sum(b for b, n in THROTTLE_REASONS.items() if n in (g.get("throttle_reasons") or [])),
        )
        for g in doc.get("gpus") or []
    ]
    xid = [
        [e.get("gpu"), e.get("ts"), e.get("code"), e.get("pid")] for e in doc.get("xid") or [] if isinstance(e, dict)
    ]
    state.apply(
        {
            "t": "sample",
            "seq": 1,
            "ts": _parse_time(doc.get("taken_at")),
            "gpus": gpus,
            "procs": procs,
            "ports": doc.get("ports") or [],
            "xid": xid,
        }
    )
    for i, hist in (doc.get("history") or {}).items():
        state.gpu_history[int(i)] = {k: deque(v, maxlen=state.history_len) for k, v in hist.items()}
    for p in doc.get("processes") or []:
        if not p.get("alive", True):
            state.procs[p["pid"]] = Proc(
                pid=p["pid"],
                ppid=p.get("ppid", 0),
                name=p.get("name", ""),
                cmdline=p.get("cmdline") or [],
                status="X",
                role=p.get("role"),
                rank=p.get("rank"),
                alive=False,
                exit_code=p.get("exit_code"),
                last_gpus=list(p.get("last_gpus") or []),
            )
    log = doc.get("log") or {}
    if log.get("path"):
        state.apply({"t": "log", "path": log["path"], "lines": log.get("lines") or [], "event": log.get("event")})
    state.received_at = None
    state.link_state = "replay"
    state.verdict = doc.get("verdict")
    return state


def _iso(ts: float | None) -> str | None:
    return None if ts is None else dt.datetime.fromtimestamp(ts, dt.timezone.utc).isoformat(timespec="seconds")


def _parse_time(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return dt.datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None
