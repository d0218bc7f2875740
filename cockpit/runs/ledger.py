"""The ledger: one JSONL file per layout, appended and fsynced, of every launch, its outcome, what
the cockpit saw of a run before it was stopped, who stopped it, its forensics and its end. Shared by
every cockpit of the user that runs the layout; secrets are masked before anything is written."""

from __future__ import annotations

import getpass
import json
import os
import re
import socket
import time
from dataclasses import replace
from pathlib import Path

from cockpit.agent.acts import open_own, own_folder
from cockpit.agent.protocol import Refused
from cockpit.common.errors import CockpitError
from cockpit.common.secrets import ENV_WORDS, mask_env, mask_record
from cockpit.judge.verdict import ALERTING
from cockpit.runs.config import Layout
from cockpit.runs.layouts import resolve_layout
from cockpit.runs.run import Run

SECRET = ENV_WORDS  # the names cockpit.secrets masks (and *_PAT, credentials in URLs)


def masked(env: dict[str, str]) -> dict[str, str]:
    """Environment as recorded: values of names that look secret never reach the disk (see
    cockpit.secrets: *TOKEN*, *KEY*, *SECRET*, *PASSWORD*, *PASSWD*, *AUTH*, *_PAT, URL credentials)."""
    return mask_env(env)


def state_home() -> Path:
    """$XDG_STATE_HOME/gpu-cockpit (an absolute XDG_STATE_HOME only, as the spec says: a relative
    one is ignored), else ~/.local/state/gpu-cockpit."""
    base = os.environ.get("XDG_STATE_HOME", "")
    return (Path(base) if os.path.isabs(base) else Path.home() / ".local" / "state") / "gpu-cockpit"


def _open(path: Path, flags: int) -> int:
    """The ledger's file opened as the host's record is (cockpit/agent/acts.py): no symbolic link
    in any component, a plain file of this user in a folder of this user nobody else can write
    (folders made 0700 where missing); else one line saying what to remove."""
    try:
        fd, _ = open_own(str(path), flags, make_dirs=bool(flags & os.O_CREAT))
        try:
            own_folder(str(path.parent))
        except Refused:
            os.close(fd)
            raise
    except FileNotFoundError:
        raise
    except (OSError, Refused) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise CockpitError(f"the ledger {path}: {why}: refused; remove it (it is made again)") from None
    return fd


def ledger_path(layout: Layout) -> Path:
    return state_home() / "ledger" / f"{re.sub(r'[^A-Za-z0-9._-]', '_', layout.name)}.jsonl"


def append_ledger(layout: Layout, record: dict) -> None:
    """One line, appended and fsynced before the caller goes on: a cockpit killed at any moment
    loses no row (a torn last line is skipped on reading). Secrets are masked here, whatever the
    caller passed: env values, argv values after --api-key and the like, URL credentials."""
    record = mask_record(record)
    fd = _open(ledger_path(layout), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, (json.dumps(record, sort_keys=True) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def _records(layout: Layout) -> list[dict]:
    """The ledger's records, oldest first; a line that is not a JSON object is skipped."""
    try:
        fd = _open(ledger_path(layout), os.O_RDONLY)
    except FileNotFoundError:
        return []
    with os.fdopen(fd, "rb") as fh:
        text = fh.read().decode("utf-8", "replace")
    out = []
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def read_ledger(layout: Layout) -> list[dict]:
    """Runs, oldest first: each launch record merged with its outcome (if one was written); its
    verdict changes in order under `verdicts` (each with `verdict`, `at`, `since`, `odd_rank`,
    `evidence`, `by`), a verdict said again by another cockpit merged into its first saying."""
    runs: dict[str, dict] = {}
    for rec in _records(layout):
        if "run_id" not in rec:
            continue
        run = runs.setdefault(rec["run_id"], {"outcome": "unknown"})
        if rec.get("event") == "verdict":
            history = run.setdefault("verdicts", [])
            if isinstance(rec.get("verdict"), str) and (not history or history[-1]["verdict"] != rec["verdict"]):
                history.append({k: rec.get(k) for k in VERDICT_KEYS})
            continue
        if rec.get("event") == "launch" and isinstance(rec.get("time"), (int, float)):
            run["launched"] = rec["time"]  # `time` is each record's own: the outcome's overwrites it
        run.update({k: v for k, v in rec.items() if k != "event"})
    return list(runs.values())


VERDICT_KEYS = ("verdict", "at", "since", "odd_rank", "detail", "evidence", "by")
QUIET = ("watching", "stopping")  # a look still deciding, a stop under way: not a verdict of the run's


def operator_id() -> str:
    """Who acts, and from where: user@machine (pid), as the ledger and the host's record say it."""
    return f"{getpass.getuser()}@{socket.gethostname()} (pid {os.getpid()})"


def note_verdict(run: Run, v) -> None:
    """A verdict change (`v`) of a run followed, kept with its time and evidence: the run's
    history (`cockpit runs`, `L`). A verdict the ledger already holds as the run's last (another
    cockpit watching the same run said it) is not written again."""
    run_id, layout = run.run_id, run.layout
    if not run_id or layout is None or v.name.value in QUIET:
        return
    last = next((r.get("verdicts") or [None] for r in read_ledger(layout) if r.get("run_id") == run_id), [None])[-1]
    if last is not None and last["verdict"] == v.name.value:
        return
    append_ledger(
        layout,
        {
            "event": "verdict",
            "run_id": run_id,
            "verdict": v.name.value,
            "at": time.time(),
            "since": v.since,
            "odd_rank": v.odd_rank,
            "detail": v.detail,
            "evidence": v.evidence[:4],
            "by": operator_id(),
        },
    )


def typical_phase_seconds(layout: Layout) -> dict[str, float]:
    """Median seconds each phase lasted in earlier runs that reached ready: what `slow` compares."""
    spans: dict[str, list[float]] = {}
    for run in read_ledger(layout):
        times = sorted((run.get("phase_times") or {}).items(), key=lambda kv: kv[1])
        for (name, at), (_, nxt) in zip(times, times[1:]):
            spans.setdefault(name, []).append(nxt - at)
    return {k: sorted(v)[len(v) // 2] for k, v in spans.items() if v}


def phase_windows(layout: Layout) -> dict[str, tuple[float, int]]:
    """The longest each phase lasted in the layout's good runs (reached ready, never called
    stalled or crashed), and in how many: the learned stall windows (diagnose.Watchdog)."""
    spans: dict[str, list[float]] = {}
    for run in read_ledger(layout):
        times = run.get("phase_times") or {}
        bad = {str(h.get("verdict")) for h in run.get("verdicts") or []} | {str(run.get("outcome"))}
        if "ready" not in times or bad & {"crashed", "stalled-idle", "stalled-spinning"}:
            continue
        ordered = sorted(((k, v) for k, v in times.items() if isinstance(v, (int, float))), key=lambda kv: kv[1])
        for (name, at), (_, nxt) in zip(ordered, ordered[1:]):
            spans.setdefault(name, []).append(nxt - at)
    return {k: (max(v), len(v)) for k, v in spans.items()}


def _clock(ts) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts)) if isinstance(ts, (int, float)) else "?"


def _span(seconds: float) -> str:
    return (
        f"{seconds:.0f} s"
        if seconds < 120
        else f"{seconds / 60:.0f} min"
        if seconds < 7200
        else f"{seconds / 3600:.1f} h"
    )


def _spans(history: list[dict], end: float, live: bool) -> list[str]:
    """Each verdict with when it began (a stall from its own start, as the host's history dates it)
    and how long it lasted: until the next one began, never past it."""
    starts = [h["since"] if isinstance(h.get("since"), (int, float)) else h.get("at") for h in history]
    for n in range(1, len(starts)):  # a stall dated back before the verdict it replaced began
        if isinstance(starts[n], (int, float)) and isinstance(starts[n - 1], (int, float)):
            starts[n] = max(starts[n], starts[n - 1])
    out = []
    for n, h in enumerate(history):
        start, stop = starts[n], starts[n + 1] if n + 1 < len(starts) else end
        rank = f" (rank {h['odd_rank']})" if h.get("odd_rank") is not None else ""
        took = (
            _span(max(0.0, stop - start)) if isinstance(start, (int, float)) and isinstance(stop, (int, float)) else "?"
        )
        last = n + 1 == len(history) and live
        out.append(f"{_clock(start)} {h['verdict']}{rank} {'for ' + took + ' so far' if last else took}")
    return out


def describe_ledger(runs: list[dict], now: float | None = None, bisects: list[dict] | None = None) -> list[str]:
    """A line per run (a live one, with no outcome yet, reads its current verdict), then its
    verdicts in turn with when each began and how long it lasted, and who stopped it. The runs of
    a bisect (`bisects`, from read_bisects) are grouped under its line, where its first run was."""
    now = time.time() if now is None else now
    lines = [f"{'run':<28} {'outcome':<24} {'ready':>7}  flag sets / params"]
    groups = {run_id: b for b in bisects or [] for run_id in b["runs"]}
    said = set()
    for r in runs:
        group = groups.get(r["run_id"])
        if group is None:
            lines += _describe_run(r, now)
        elif group["bisect_id"] not in said:
            said.add(group["bisect_id"])
            lines.append(describe_bisect_line(group))
            members = [x for x in runs if groups.get(x["run_id"]) is group]
            lines += ["  " + line for x in members for line in _describe_run(x, now)]
    return lines


def _describe_run(r: dict, now: float) -> list[str]:
    lines: list[str] = []
    ready = (r.get("phase_times") or {}).get("ready")
    sets = ",".join(r.get("flag_sets") or []) or "-"
    params = " ".join(f"{k}={v}" for k, v in (r.get("params") or {}).items())
    history = r.get("verdicts") or []
    ended = r.get("ended") if isinstance(r.get("ended"), (int, float)) else None
    live = ended is None and (not history or history[-1]["verdict"] not in ("no run", "stopped"))
    outcome = r.get("outcome", "?")
    if history and live and history[-1]["verdict"] != outcome:  # a run the ledger still sees live
        outcome = (
            f"now {history[-1]['verdict']}" if outcome == "unknown" else f"{outcome}, now {history[-1]['verdict']}"
        )
    lines.append(f"{r['run_id']:<28} {outcome:<24} {'' if ready is None else f'{ready:.0f}s':>7}  {sets} {params}")
    if history:
        lines.append("    " + ", then ".join(_spans(history, ended if ended is not None else now, live)))
    began = r.get("launched")
    if isinstance(began, (int, float)):
        lines.append(
            f"    launched {_clock(began)}" + (f", running for {_span(max(0.0, now - began))}" if live else "")
        )
    stop = r.get("stop")
    if isinstance(stop, dict):
        lines.append(f"    stopped {_clock(stop.get('at'))} by {stop.get('by') or '?'}: {stop.get('why') or ''}")
    return lines


# A bisect's records (cockpit/operate/bisect.py) carry `bisect_id`, never `run_id` (a step names
# its run as `run`): read_ledger's runs stay the runs.
BISECT_EVENTS = ("bisect", "bisect-step", "bisect-result")


def read_bisects(layout: Layout) -> list[dict]:
    """Each bisect of the layout, oldest first: its plan record, its steps (one per launch, in
    order) and its last result; `runs` lists its launches' run ids."""
    found: dict[str, dict] = {}
    for rec in _records(layout):
        if rec.get("event") not in BISECT_EVENTS or not isinstance(rec.get("bisect_id"), str):
            continue
        b = found.setdefault(
            rec["bisect_id"], {"bisect_id": rec["bisect_id"], "plan": None, "steps": [], "result": None, "runs": []}
        )
        if rec["event"] == "bisect":
            b["plan"] = rec
        elif rec["event"] == "bisect-step":
            b["steps"].append(rec)
            if isinstance(rec.get("run"), str):
                b["runs"].append(rec["run"])
        else:
            b["result"] = rec
    return [b for b in found.values() if b["plan"] is not None]


def resumable_bisect(layout: Layout, identity: str) -> dict | None:
    """The latest bisect in the ledger with the same layout, host and configurations (its plan's
    `identity`): the one a second call goes on with."""
    same = [b for b in read_bisects(layout) if b["plan"].get("identity") == identity]
    return same[-1] if same else None


def describe_bisect_line(b: dict) -> str:
    """`bisect-...: found eagle3 (97% likely), 5 launches`, or where it stands (a result written
    before bisects kept their odds reads without them)."""
    result, steps = b.get("result") or {}, b.get("steps") or []
    status, text, p = result.get("status") or "under way", result.get("answer_text"), result.get("probability")
    odds = f" ({p:.0%} likely)" if isinstance(p, (int, float)) and text else ""
    answer = (
        f" {text}{odds}"
        if status == "found" and text
        else f" (the likeliest so far: {text}{odds})"
        if status in ("budget exhausted", "interrupted") and text
        else ""
    )
    return f"{b['bisect_id']}: {status}{answer}, {len(steps)} launch{'es' if len(steps) != 1 else ''}"


def _ledger_record(run: Run) -> dict | None:
    layout, run_id = run.layout, run.run_id
    if layout is None or run_id is None:
        return None
    return next((r for r in read_ledger(layout) if r.get("run_id") == run_id), None)


def record_seen(followed: Run, verdict, phase, phase_times: dict) -> None:
    """The verdict the cockpit saw of a ledger run that has no outcome yet, written before it is
    stopped: a stalled run stays recorded as stalled, not as killed. Whether it has one is the
    ledger's word (its launcher's, a workflow's), read here, never a mark on the Run."""
    run, layout = followed.record, followed.layout
    if not run or not layout or not run.get("run_id"):
        return
    known = _ledger_record(followed) or run
    if known.get("outcome", "unknown") != "unknown":
        return
    outcome = (
        verdict.name.value
        if verdict.name in ALERTING
        else ("ready" if phase.name in ("ready", "serving") else "stopped")
    )
    append_ledger(
        layout,
        {
            "event": "outcome",
            "run_id": run["run_id"],
            "outcome": outcome,
            "phase_times": phase_times,
            "evidence": verdict.evidence,
            "dumps": None,
            "time": time.time(),
        },
    )


def note_seen(run: Run, write: bool) -> Run:
    """The run as followed from now on: its leader's `leader_seen_ticks` (the agent saw the
    leader alive then, so a process of its session born before is the run's, should its pid be
    reused later) becomes its `seen_ticks`, written to the ledger when `write` (a kept screen's
    look; a one-shot look that may yet be cancelled writes nothing) and the record is this
    ledger's (not the host's)."""
    rec = run.record
    if not rec or rec.get("leader_seen_ticks") is None:
        return run
    seen = rec["leader_seen_ticks"]
    if write and seen != rec.get("seen_ticks") and not rec.get("from_host") and run.layout and rec.get("run_id"):
        append_ledger(run.layout, {"event": "seen", "run_id": rec["run_id"], "seen_ticks": seen})
    kept = {k: v for k, v in rec.items() if k != "leader_seen_ticks"}
    return replace(run, record={**kept, "seen_ticks": seen})


def note_stop(followed: Run, plan, why: str) -> None:
    """The ledger's word that the operator stops the run followed: who (the action), from where
    (user, host, process), when, and the processes planned (pid, start time): the run's history
    (the host's own record, written by the agent, is what other cockpits judge by)."""
    run, layout = followed.record, followed.layout
    if not run or not layout or not run.get("run_id") or not plan.entries:
        return
    append_ledger(
        layout,
        {
            "event": "stop",
            "run_id": run["run_id"],
            "stop": {
                "why": why,
                "by": operator_id(),
                "at": time.time(),
                "processes": [[int(e["pid"]), e.get("started")] for e in plan.entries],
            },
        },
    )


def record_ended(run: Run, plan) -> None:
    """A launched run killed whole and verified gone is written to the ledger as ended: it is
    never resumed (followed or planned again) from its record."""
    if run.layout is None:
        return
    for rec in run.launched():
        if rec.get("run_id") and int(rec.get("pgid", -1)) in set(plan.sessions):
            append_ledger(
                run.layout, {"event": "ended", "run_id": rec["run_id"], "ended": time.time(), "how": "killed"}
            )


def stall_window_of(path: str, default: float) -> float:
    """The stall window of the run whose log this is (its launch record in a ledger says it, or
    names its layout), else `default`."""
    real = os.path.realpath(path)
    try:
        ledgers = sorted((state_home() / "ledger").glob("*.jsonl"))
    except OSError:
        return default
    for ledger in ledgers:
        try:
            with os.fdopen(_open(ledger, os.O_RDONLY), encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    if real not in line and path not in line:
                        continue
                    try:
                        rec = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(rec, dict) and rec.get("log") in (path, real):
                        stall = rec.get("stall")
                        if isinstance(stall, dict) and isinstance(stall.get("idle_s"), (int, float)):
                            return float(stall["idle_s"])
                        try:
                            return float(resolve_layout(rec.get("layout") or ledger.stem).stall.idle_s)
                        except (CockpitError, OSError, ValueError, TypeError):
                            return default
        except (OSError, CockpitError):
            continue
    return default
