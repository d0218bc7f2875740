"""`cockpit explain LOG`: a post-mortem of an inference server's log, without a host.

Reads a saved SGLang or vLLM log (a file, a `.gz`, or `-` for stdin) through the same rules the live
cockpit uses (cockpit.logrules) and says how far the launch got (the timeline of phases with line
numbers and timestamps), and what became of it: `crashed` (with the rank that failed first and the
cause, from the root-cause line rather than its consequences), `stopped` (the server said it was
stopped, by the operator's signal or a launcher's, and what failed came after that), `stalled` (the log
ends on a hang tell such as vLLM's shared-memory broadcast warning, with nothing moving after it) or `ok`.

    cockpit explain LOG [--engine sglang|vllm|auto] [--json]

`cockpit explain` (cockpit/cli/offline.py) reads the file, takes the run's stall window from the ledger, and calls `explain`; the exit
status is 0 whenever the log was read and explained (the verdict is in the output), 2 for a log
that cannot be read (a one-line CockpitError)."""

from __future__ import annotations

import gzip
import itertools
import os
import sys
import time
import zlib
from collections.abc import Iterable, Iterator

from cockpit import engines
from cockpit.common.errors import CockpitError
from cockpit.common.hosttext import count, visible
from cockpit.read.logrules import ANSI, LogRules, LogTracker, detect_engine

EVIDENCE_CHARS = 200
_WRITERS = ", ".join(f"{e.title}'s" for e in engines.logged())  # who writes a server log
DETECT_LINES = 5000  # engine "auto" decides from this many lines before reading on
LINE_MAX = 64 << 10  # the agent's LOG_LINE_MAX: a line is cut where the live path cuts it
CHUNK = 1 << 20


def short(text: str, limit: int = EVIDENCE_CHARS) -> str:
    """A log line as evidence: colour codes gone, at most `limit` characters."""
    text = ANSI.sub("", text[: 4 * limit]).rstrip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


PROGRESS_BYTES = 10 << 20  # a file this large shows how far the reading got (on a terminal)


class Progress:
    """How far into a file the reading is, on stderr, a few times a second: for a file over
    PROGRESS_BYTES when stderr is a terminal (a script reading the JSON sees nothing of it)."""

    def __init__(self, raw, name: str, stream=None):
        self.raw, self.name, self.stream = raw, visible(name), stream or sys.stderr
        self.size = os.fstat(raw.fileno()).st_size
        self.next = 0.0
        self.shown = False

    @classmethod
    def wanted(cls, raw, name: str, stream=None) -> Progress | None:
        stream = stream or sys.stderr
        try:
            big = os.fstat(raw.fileno()).st_size > PROGRESS_BYTES
        except (OSError, ValueError):
            return None
        return cls(raw, name, stream) if big and stream.isatty() else None

    def tick(self) -> None:
        now = time.monotonic()
        if now < self.next:
            return
        self.next = now + 0.25
        done = min(self.raw.tell(), self.size)
        width = 30
        filled = width * done // max(1, self.size)
        self.stream.write(
            f"\rreading {self.name}: [{'#' * filled}{'.' * (width - filled)}] "
            f"{100 * done // max(1, self.size):3d}% of {self.size / 2**20:.0f} MB"
        )
        self.stream.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


def read_log(path: str, progress: bool = False) -> Iterator[str]:
    """The lines of a log file (`-` is stdin; a `.gz` is decompressed; bytes that are not UTF-8 read
    as U+FFFD). A missing or unreadable file is one CockpitError naming it and the fix. `progress`:
    a bar on stderr for a large file, when stderr is a terminal (`Progress`)."""
    if path == "-":
        return _lines(sys.stdin.buffer, "stdin")
    try:
        raw = open(path, "rb")
    except FileNotFoundError:
        raise CockpitError(f"{path}: no such file: give the path of the server's log (or - to read stdin)") from None
    except IsADirectoryError:
        raise CockpitError(f"{path}: is a directory: give the server's log file inside it") from None
    except PermissionError:
        raise CockpitError(f"{path}: permission denied: copy the log somewhere readable or run as its owner") from None
    except OSError as exc:
        raise CockpitError(f"{path}: cannot read: {exc.strerror}") from None
    bar = Progress.wanted(raw, path) if progress else None
    if path.endswith(".gz"):
        return _lines(gzip.GzipFile(fileobj=raw, mode="rb"), path, raw, bar=bar)
    return _lines(raw, path, bar=bar)


def _lines(stream, name: str, *others, bar: Progress | None = None) -> Iterator[str]:
    """The stream's lines, read in bounded chunks: a line keeps its first LINE_MAX bytes (the live
    path's cap) and says the rest as ` … [N bytes skipped]`, never held in memory, so a 200 MB
    line without a newline costs what 64 KiB does (and no rule sees a longer line)."""
    read = getattr(stream, "read1", None) or stream.read
    try:
        partial, skipped = bytearray(), 0
        while True:
            chunk = read(CHUNK)
            if not chunk:
                break
            if bar is not None:
                bar.tick()
            parts = chunk.split(b"\n")  # the whole lines of a chunk at once: C speed, the chunk bounds the list
            head = parts[0]
            room = max(0, LINE_MAX - len(partial))
            partial += head[:room]
            skipped += max(0, len(head) - room)
            if len(parts) == 1:
                continue
            yield _line(partial, skipped)
            for raw in itertools.islice(parts, 1, len(parts) - 1):
                if len(raw) <= LINE_MAX:
                    yield raw.decode("utf-8", errors="replace").rstrip("\r")
                else:
                    yield _line(raw[:LINE_MAX], len(raw) - LINE_MAX)
            tail = parts[-1]
            partial, skipped = bytearray(tail[:LINE_MAX]), max(0, len(tail) - LINE_MAX)
        if partial or skipped:
            yield _line(partial, skipped)
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise CockpitError(
            f"{name}: not a readable gzip file ({exc}): gunzip it to check, or pass the plain log"
        ) from None
    except OSError as exc:
        raise CockpitError(f"{name}: cannot read: {exc.strerror or exc}") from None
    finally:
        if bar is not None:
            bar.close()
        if stream is not sys.stdin.buffer:
            stream.close()
        for other in others:
            other.close()


def _line(raw: bytes | bytearray, skipped: int) -> str:
    text = raw.decode("utf-8", errors="replace").rstrip("\r")
    return text + f" \u2026 [{skipped} bytes skipped]" if skipped else text


SILENT_S = 60.0  # a log that stopped short of ready this long ago is a stall, if it is the live log


def explain(
    lines: Iterable[str], engine: str = "auto", silent_s: float | None = None, window_s: float = SILENT_S
) -> dict:
    """A log's post-mortem as a JSON-able dict:

    engine      the engine whose rules read it ("sglang", "vllm"; None when auto found neither)
    detected    true when the engine was detected from the lines (engine "auto")
    lines       how many lines were read
    phase       the last launch phase reached (never "crashed"); None when no phase mark was seen
    verdict     {name: crashed | stopped | stalled | ok, rank, cause, line, time, evidence: [line texts],
                 evidence_lines: [their line numbers], together: [ranks that failed the same way in
                 the same second, rank then None], all_ranks: whether those are every rank}
    ranks       every rank the lines name, sorted
    timeline    [{phase, line, time}] in the order the run reached them
    failures    [{line, rank, cause, consequence, text}]: every failure line, in order (at most 50)
    last_time   the last timestamp the log carries
    findings    what the log says beside the verdict: another program's tracebacks (a test client's, a
                harness's), each with its line
    silent_s    how long the file has not been written (its modification time), when known

    `silent_s` (the file's age): a log that stopped short of ready (or of an end) for at least
    `window_s` reads `stalled` (cause `silent`), if it is the live log. A file in which nothing
    is an engine's (no engine, phase, failure or stall tell) reads `not a server log`."""
    known = [e.name for e in engines.logged()]
    if engine not in ("auto", *known):
        raise CockpitError(f"--engine {engine!r}: one of {', '.join(known)}, auto")
    it = iter(lines)
    head: list[str] = []
    detected = False
    if engine == "auto":
        for text in it:
            head.append(text)
            if len(head) >= DETECT_LINES:
                break
        found = detect_engine(head)
        engine, detected = (found or "auto"), found is not None
    tracker = LogTracker(LogRules(engine))
    classify, add = tracker.rules.classify, tracker.add  # `tracker.feed`, its two calls bound once
    for text in head:
        add(classify(text))
    for text in it:
        add(classify(text))
    engine_name = engine if engine in known else tracker.rules.detected
    reached = tracker.reached()
    return {
        "engine": engine_name,
        "detected": detected or (engine_name is not None and engine not in known),
        "lines": tracker.n,
        "phase": reached[-1].phase if reached else None,
        "verdict": {"together": [], "all_ranks": False, **_verdict(tracker, engine_name, silent_s, window_s)},
        "ranks": sorted(tracker.ranks),
        "timeline": [{"phase": m.phase, "line": m.line, "time": m.time} for m in reached],
        "failures": [
            {"line": f.line, "rank": f.rank, "cause": f.cause, "consequence": f.consequence, "text": short(f.text)}
            for f in tracker.failures[:50]
        ],
        "last_time": tracker.last_time,
        "findings": [line for f in tracker.findings() for line in f.evidence],
        "silent_s": None if silent_s is None else round(silent_s, 1),
    }


ENDED = ("ready", "serving")


def _verdict(tracker: LogTracker, engine: str | None, silent_s: float | None, window_s: float) -> dict:
    first = tracker.first_failure()
    if first is not None:
        seen: dict[int, str] = {}
        for n, text in first.evidence:
            seen.setdefault(n, text)
        evidence = sorted(seen.items())[:6]
        return {
            "name": "crashed",
            "rank": first.rank,
            "cause": first.cause,
            "line": first.line,
            "time": first.time,
            "evidence": [short(t) for _, t in evidence],
            "evidence_lines": [n for n, _ in evidence],
            "together": list(first.together),
            "all_ranks": bool(first.together) and tracker.all_ranks(first.together),
        }
    if tracker.stalled():
        n, last = tracker.stalls[-1]
        tells = tracker.stalls[-3:]
        return {
            "name": "stalled",
            "rank": last.rank,
            "cause": last.cause,
            "line": tracker.stalls[0][0],
            "time": last.time,
            "evidence": [short(ll.text) for _, ll in tells],
            "evidence_lines": [k for k, _ in tells],
        }
    if tracker.stopped():  # the failures came after the server said it was stopped: its shutdown's
        n, ll = tracker.stop
        after = tracker.failures[0]
        return {
            "name": "stopped",
            "rank": None,
            "cause": ll.stop,
            "line": n,
            "time": ll.time or after.time,
            "evidence": [short(ll.text), short(after.text)],
            "evidence_lines": [n, after.line],
        }
    if tracker.n == 0:  # nothing read: not a run that went well
        return {
            "name": "empty",
            "rank": None,
            "cause": None,
            "line": None,
            "time": None,
            "evidence": [],
            "evidence_lines": [],
        }
    reached = tracker.reached()
    mark = reached[-1] if reached else None
    if engine is None and mark is None and not tracker.ranks and not tracker.requests:
        return {
            "name": "not a server log",
            "rank": None,
            "cause": None,
            "line": None,
            "time": None,
            "evidence": [],
            "evidence_lines": [],
        }
    if silent_s is not None and silent_s >= window_s and (mark and mark.phase) not in ENDED and not tracker.finished_at:
        return {
            "name": "stalled",
            "rank": None,
            "cause": "silent",
            "line": mark.line if mark else None,
            "time": mark.time if mark else None,
            "evidence": [f"the file was last written {_ago(silent_s)} ago"],
            "evidence_lines": [],
        }
    return {
        "name": "ok",
        "rank": None,
        "cause": None,
        "line": mark.line if mark else None,
        "time": mark.time if mark else None,
        "evidence": [],
        "evidence_lines": [],
    }


def _ranks(ranks: list[int]) -> str:
    if not ranks:
        return "none named"
    if ranks == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 2:
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks))


def describe(result: dict) -> list[str]:
    """The post-mortem as text, for people."""
    engine = result["engine"] or "unknown"
    how = " (detected)" if result["detected"] else ""
    out = [
        f"engine {engine}{how}, {count(result['lines'], 'line')}, ranks {_ranks(result['ranks'])}",
        f"phase: {result['phase'] or 'no phase mark seen'}",
    ]
    v = result["verdict"]
    if v["name"] == "crashed":
        who = f"rank {v['rank']}" if v["rank"] is not None else "no rank named"
        if v.get("together"):
            who = (
                f"all {len(v['together'])} ranks" if v.get("all_ranks") else f"ranks {_ranks(v['together'])}"
            ) + " together"
        when = f", {v['time']}" if v["time"] else ""
        out.append(f"verdict: crashed: {who}, cause {v['cause']} (line {v['line']}{when})")
    elif v["name"] == "stopped":
        more = len(result["failures"])
        out.append(
            f"verdict: stopped: the server said it was stopped ({v['cause']}, line {v['line']}); "
            f"{count(more, 'failure')} after it: its shutdown's, no crash"
        )
    elif v["name"] == "stalled" and v["cause"] == "silent":
        out.append(
            f"verdict: stalled: silent for {_ago(result['silent_s'])} at '{result['phase'] or 'the start'}' "
            f"(threshold {result.get('window_s', SILENT_S):.0f} s), short of ready (if this is the live log)"
        )
    elif v["name"] == "stalled":
        out.append(
            f"verdict: stalled: the log ends on a hang tell ({v['cause']}) with nothing moving after it "
            f"(first tell line {v['line']})"
        )
    elif v["name"] == "not a server log":
        out.append(
            f"verdict: not a server log: no line in it is {_WRITERS} or torch's "
            "(give the file the server writes its output to)"
        )
    elif v["name"] == "empty":
        out.append("verdict: none: the log is empty (0 lines), nothing to judge: check the file or the pipe")
    else:
        out.append("verdict: ok: no failure in the log")
    for n, text in zip(v["evidence_lines"], v["evidence"]):
        out.append(f"  {n:>7}  {text}")
    if result["timeline"]:
        out.append("timeline:")
        for mark in result["timeline"]:
            out.append(f"  {mark['line']:>7}  {mark['time'] or '':<19}  {mark['phase']}")
    for finding in result.get("findings", []):
        out.append(f"finding: {finding}")
    others = [f for f in result["failures"] if f["line"] != v.get("line")]
    if v["name"] == "crashed" and others:
        out.append(
            f"other failures: {len(others)} (first at line {others[0]['line']}: rank "
            f"{others[0]['rank'] if others[0]['rank'] is not None else '?'}, {others[0]['cause']})"
        )
    return out


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def silence(path: str) -> float | None:
    """How long ago the file was last written (a saved copy's age is its copy's, so the verdict
    says 'if this is the live log'); None for stdin."""
    if path == "-":
        return None
    try:
        return max(0.0, time.time() - os.stat(path).st_mtime)
    except OSError:
        return None
