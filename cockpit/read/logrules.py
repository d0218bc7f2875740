"""What a line of an inference server's log says: the one rule set for log lines.

Each line is classified once, where it arrives (`LogRules.classify`), into a `LogLine`: its kind
(a failure, a stall tell, an error, a warning, the mark of a launch phase), the rank that wrote it,
the phase it marks, and for a failure its cause and the rank it names. The watchdog, the log view
and `cockpit explain` all read these; nothing else matches log text. `LogTracker` reads a run's
lines in order and keeps what a post-mortem needs (the phases reached, the failures with their
traceback's cause, the first failing rank, the last stall tell). Pure: no I/O, no Textual.

The rules name what SGLang, vLLM and torch really print (docs/diagnosis.md lists them with their
sources): SGLang `[2025-04-21 04:13:43 DP0 TP3] msg` (newer `[04-21 04:13:43 TP3]`), vLLM
`(VllmWorker rank=3 pid=406) ERROR 03-25 21:13:53 [multiproc_executor.py:374] msg` and its other
process names (`Worker_PP1_TP2`, `EngineCore_DP0`, `APIServer`, `VllmWorkerProcess`), torch
`[rank4]:[E421 04:13:43.426633564 ProcessGroupNCCL.cpp:607] msg` and torchrun's `[rank3]: msg`, SGLang
0.2's `[gpu_id=1] msg`, vLLM 0.10's nested `(EngineCore_0 pid=..) (VllmWorker TP1 pid=..) msg`, and site
formats of the same records (`2024-12-19 21:40:35 ERROR 56542 [file.py:64] msg`, NIM's
`ERROR 2025-07-21 14:34:24.934 file.py:62] msg`). Colour codes (also with the ESC byte lost to U+FFFD),
carriage returns (also a literal `^M`) and a container's own prefix (`svc-1  | `, an ISO timestamp,
a `│ ` box) are stripped first. Also C/C++ libraries' own error lines (flash-attention's, vLLM's custom
all-reduce's, NCCL's WARN), loaders' progress bars, HTTP access lines.

Host text is hostile: the rules read at most RULE_CHARS of a line, every pattern is linear in it (no
repeat that rescans what another attempt scanned: bounded, or over characters its lead cannot hold;
tests/data/hostile_lines.py draws each one's worst case), and each family of rules runs only on a line
that holds one of its words (`_hot`, `_phase_words`), so a common line costs a few `str` tests, and
the prefix shapes a writer repeats line after line are parsed by one match each (`_parse_common`),
any other line by the general parse (`parse_general`), with the same result (tests/read/test_log_fastpath.py).
A run's tracker is linear in its lines whatever the failures."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from cockpit import engines
from cockpit.read.findings import Finding


class LogLine(NamedTuple):
    text: str
    kind: str | None = None  # failure | stall | error | warning | phase | None
    rank: int | None = None  # the rank that wrote the line, from its prefix
    phase: str | None = None  # the launch phase this line marks
    cause: str | None = None  # of a failure (or stall): see CAUSES
    failed_rank: int | None = None  # the rank a failure line names
    exit_code: int | None = None  # the exit code a failure line names
    shards: tuple[int, int] | None = None  # (done, total) of a checkpoint-loading bar
    time: str | None = None  # the line's own timestamp as written: "2025-04-21 04:13:43" or "04-21 04:13:43"
    who: str | None = None  # the writer its prefix names: "TP3", "DP0 TP3", "VllmWorker rank=3", "EngineCore_DP0"
    message: str | None = None  # the text after the prefixes
    consequence: bool = False  # a failure that reports another's (a parent's sigquit, a dead-worker notice)
    victim: bool = False  # its writer reports a peer's failure (ncclRemoteError): it names no failing rank
    level: str | None = None  # ERROR, WARNING, INFO, ... where the line's prefix says
    stats: tuple[float, int | None] | None = None  # an engine's periodic stats line: (tokens/s, requests running)
    probe: bool = False  # an access-log line of a health, metrics or model-list probe: no work done
    http: tuple[str, int] | None = None  # an access-log line's (method, status)
    stop: str | None = None  # a deliberate stop the server says it received: the signal ("SIGTERM") or "shutdown"


@dataclass(frozen=True)
class PhaseRule:
    """A layout's own phase: lines matching `pattern` mark `phase` (tried before the engine's)."""

    pattern: re.Pattern
    phase: str


# The phases a launch goes through, in order. A post-mortem timeline only moves forward along it
# (ranks print the same marks at different times); a new launch starts it again.
PHASE_ORDER = [
    "starting",
    "loading weights",
    "weights loaded",
    "compiling",
    "kv cache",
    "capturing cuda graphs",
    "cuda graphs captured",
    "capturing draft cuda graphs",
    "draft cuda graphs captured",
    "engine initialized",
    "port open",
    "warmup",
    "ready",
    "serving",
]

# The capture stages: a later begin moves the phase back into capture (a draft-extend capture after the
# draft capture ended, a stage run again), whatever the order (see LogTracker._mark).
CAPTURE_PHASES = (
    "capturing cuda graphs",
    "cuda graphs captured",
    "capturing draft cuda graphs",
    "draft cuda graphs captured",
)

# A new launch of the server (its arguments printed): a post-mortem starts over from here.
LAUNCH = re.compile("|".join(rx for e in engines.logged() for rx in e.launch))
LAUNCH_HEADS = tuple(re.split(r"[\\(|?*+\[{.^$]", rx, maxsplit=1)[0] for e in engines.logged() for rx in e.launch)

# ----------------------------------------------------------------------------- prefixes

# Colour codes (also those whose ESC byte a copy turned into U+FFFD or wrote out as "^[", a terminal
# capture's caret notation), a carriage return, and a
# literal "^M" at a line's end (a terminal's \r, pasted as text).
_BRACKET = engines.with_prefix("bracket")  # the engine whose lines open `[time TP3] `
_WRITER = engines.with_prefix("writer")  # the engine whose lines open `(Name pid=N) `

ANSI = re.compile(r"(?:[\x1b\ufffd]|\^\[)\[[0-9;]*[A-Za-z]|\x1b\][^\x07\x1b]*\x07|\r|\^M$")
# What a container, a log shipper or a pager puts in front of the server's own line.
OUTER = [
    re.compile(r"^(?:\s*[│|])+\s"),  # a k9s / table border, or a log viewer's gutter of several columns
    # a wrapper's own time and the program it ran: "[2025-09-25 20:03:20] [/bin/sh]: "
    re.compile(r"^\[\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d[.,\d]*\] \[[^\]\s]{1,80}\]: ?"),
    # a log viewer's time and a bar, with no level after it: "2025-05-30 18:28:27.890 | "
    re.compile(
        r"^\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)? ?\| ?"
        r"(?! *(?:TRACE|DEBUG|INFO|SUCCESS|WARN|WARNING|ERROR|CRITICAL) *\|)"
    ),
    # a log shipper's own time and host before a ">>": "2025-11-04 10:07:58 host >> "
    re.compile(r"^\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d[.,\d]*(?:Z|[+-]\d\d:?\d\d)? (?:[\w.@-]{1,80} )?>> ?"),
    re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[.,\d]*Z?\s"),  # docker logs --timestamps
    re.compile(r"^[\w.-]+\s+\| ?"),  # docker compose: "sglang-1  | "
    re.compile(
        r"^\w{3} [ \d]\d \d\d:\d\d:\d\d \S+ [\w.-]+\[\d+\]: "
    ),  # journald: "Sep 22 23:46:42 host vllm[361991]: "
    # a Ray actor that runs SGLang ("(SGLangEngine pid=6680) ", slime, verl): Ray's prefix, not vLLM's;
    # SGLang's own "[.. DP1 TP3] " follows on a header line, its traceback lines carry Ray's alone
    re.compile(rf"^\(\w*(?i:{_BRACKET})\w* pid=\d+(?:, ip=[\w.:-]+)?\) ?"),
]
OUTER_ANY = re.compile("|".join(f"(?:{rx.pattern})" for rx in OUTER))  # one match rules out every layer
ISO_TIME = re.compile(r"^(\d{4}-\d\d-\d\d)T(\d\d:\d\d:\d\d)")  # docker's; a wrapper's own time is not the line's
# Python logging formats whose fields are separated by " | ": FastChat's "date | LEVEL | logger | msg",
# loguru's default "date | LEVEL    | module:function:line - msg", and "date | LEVEL | msg"
PIPE_FIELDS = re.compile(
    r"(?P<d>\d{4}-\d\d-\d\d)[ T](?P<t>\d\d:\d\d:\d\d)(?:[.,]\d+)? ?\| ?"
    r"(?P<l>TRACE|DEBUG|INFO|SUCCESS|WARNING|WARN|ERROR|CRITICAL) *\| ?"
    r"(?:[\w.<>-]{1,120}:[\w.<>-]{1,120}:\d{1,6} - |[\w.<>-]{1,80} \| )?"
)
PIPE_LEVELS = {"TRACE": "DEBUG", "SUCCESS": "INFO", "WARN": "WARNING"}
# SGLang: "[2025-04-21 04:13:43 DP0 TP3] ", "[04-21 04:13:43 TP3] ", "[2025-04-21 04:13:43] ", 2024's "[04:40:55 TP0] "
BRACKET_PREFIX = re.compile(r"\[((?:(?:\d{4}-)?\d\d-\d\d )?\d\d:\d\d:\d\d)(?:[.,]\d+)?((?: [A-Z][A-Z_]*\d+)*)\] ?")
BRACKET_TAG = re.compile(r"(?<![A-Z_])([A-Z][A-Z_]*+)(\d+)")  # a tag starts where no letter stands before it
# vLLM: "(VllmWorker rank=3 pid=406) ", "(Worker_PP1_TP2 pid=130) ", "(RayWorkerWrapper pid=336, ip=10.0.0.1) "
WRITER_PREFIX = re.compile(r"\(([A-Za-z_][\w]*(?: [\w=]+)?) pid=(\d+)(?:, ip=[\w.:-]+)?\) ?")
WRITER_NAMES = re.compile(engines.ENGINES[_WRITER].writers)  # the engine's own processes; others are Ray actors
# Site formats of the same logging record (a site's own formatter, NVIDIA NIM's wrapper of vLLM):
# "2024-12-19 21:40:35 ERROR 56542 [file.py:64] msg", "ERROR 2025-07-21 14:34:24.934 file.py:62] msg"
SITE_LEVEL = re.compile(
    r"(?:(?P<d1>\d{4}-\d\d-\d\d) (?P<t1>\d\d:\d\d:\d\d)(?:[.,]\d+)? (?P<l1>DEBUG|INFO|WARNING|ERROR|CRITICAL) \d+ "
    r"\[[\w./<>-]+:\d+\]"
    r"|(?P<l2>DEBUG|INFO|WARNING|ERROR|CRITICAL) (?P<d2>\d{4}-\d\d-\d\d) (?P<t2>\d\d:\d\d:\d\d)(?:[.,]\d+)? "
    r"\[?[\w./<>-]+:\d+\]) ?"
)
# SGLang 0.2 (2024): "[gpu_id=1] msg"
GPU_ID_PREFIX = re.compile(r"\[gpu_id=(\d+)\] ?")
LEVEL_PREFIX = re.compile(
    r"(DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d-\d\d \d\d:\d\d:\d\d)(?:\.\d+)? \[?[\w./<>-]+:\d+\] ?"
)
# torch c10: "[rank4]:[E421 04:13:43.426633564 ProcessGroupNCCL.cpp:607] ", "[rank0]:[E ProcessGroupNCCL.cpp:563] "
TORCH_PREFIX = re.compile(r"(?:\[rank(\d+)\]:)?\[([EWIF])(?:(\d{1,2})(\d\d) (\d\d:\d\d:\d\d)[.\d]*)? [\w.]+:\d+\] ?")
TORCH_RANK = re.compile(r"\[rank(\d+)\]:")
TORCH_RANK_LEAD = re.compile(r"\[rank(\d+)\]: ?")  # torchrun's per-rank prefix in front of a whole line
RULE_CHARS = 8 << 10  # the rules read this much of a line: a longer one (up to the agent's 64 KiB) costs no more
PREFIX_WINDOW = 160  # prefixes are looked for this far into a line, past whatever an outer layer put first
LEVEL_WORDS = ("DEBUG ", "INFO ", "WARNING ", "ERROR ", "CRITICAL ")  # LEVEL_PREFIX's and SITE_LEVEL's 2nd start
# The common shapes whole, for `_parse_common`: the prefix (atomic: the general parse's own match,
# never another split of it), then what rules out every further prefix the general parse could read
# after it: no "[" (SGLang's, torch's, a rank's) nor "(" (a vLLM writer's) in the next 60
# characters, and for SGLang's no level or digit (a vLLM or site level) right after it.
NO_PREFIX_AHEAD = r"(?=[^\[(]{60}|[^\[(]*\Z)"
BRACKET_COMMON = re.compile(
    r"(?>\[((?:(?:\d{4}-)?\d\d-\d\d )?\d\d:\d\d:\d\d)(?:[.,]\d+)?((?: [A-Z][A-Z_]*\d+)*)\] ?)"
    r"(?!\d|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) )" + NO_PREFIX_AHEAD
)
LEVEL_COMMON = re.compile(
    r"(?>(DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d-\d\d \d\d:\d\d:\d\d)(?:\.\d+)? "
    r"\[?[\w./<>-]+:\d+\] ?)" + NO_PREFIX_AHEAD
)
NO_PREFIX = re.compile(r"(?=[^\[\](]{60}|[^\[\](]*\Z)")  # nor a level's "file:N]" in reach


# a named tuple made from all its fields at once, without the generated __new__'s call: the common
# line's two tuples are a tenth of its cost otherwise
_new = tuple.__new__


class Parsed(NamedTuple):
    message: str
    time: str | None
    who: str | None
    rank: int | None
    level: str | None  # ERROR, WARNING, INFO, ... where the line says (torch's E/W/I mapped)
    engine: str | None  # the engine whose prefix the line carries


@functools.lru_cache(maxsize=512)  # a run's writers are few; a hostile log's many only evict
def _rank_of_tags(tags: str) -> int | None:
    """SGLang's tags, e.g. " DP0 PP1 TP3 EP3": the TP rank, else the PP rank, else the DP rank."""
    found = {name: int(num) for name, num in BRACKET_TAG.findall(tags)}
    for name in ("TP", "PP", "DP"):
        if name in found:
            return found[name]
    return None


_WORKER = engines.ENGINES[_WRITER].worker_title or "Worker"


@functools.lru_cache(maxsize=512)
def _rank_of_who(who: str) -> int | None:
    """vLLM's process name: "VllmWorker TP1", "VllmWorker rank=3", "Worker_PP1_TP2", "Worker_TP0_EP0"."""
    m = re.search(r"(?:^|[_ ])TP(\d+)(?!\d)", who) or re.search(r"rank=(\d+)", who)
    if m:
        return int(next(g for g in m.groups() if g is not None))
    if who.startswith(("Worker", _WORKER)):
        m = re.search(r"_PP(\d+)", who)
        if m:
            return int(m.group(1))
    return None


def _find_match(rx: re.Pattern, s: str, lead: str, start: int, last: int, end: int):
    """`rx.search(s, start, end)` whose match starts before `last`, tried only where `lead` (the
    literal every match starts with) stands: most lines have no such place, and a search would
    try every position."""
    i = s.find(lead, start, last)
    while i >= 0:
        m = rx.match(s, i, end)
        if m:
            return m
        i = s.find(lead, i + 1, last)
    return None


def _outer_maybe(s: str) -> bool:
    """Whether an outer layer (OUTER) may stand first: each begins with a digit, a space or a bar,
    `[` and a time then `] [`, `(` and SGLang's name, a three-letter month, or holds a `|`."""
    c = s[:1]
    if c == "[":
        return "] [" in s[:80] or "|" in s
    if c == "(":
        return "glang" in s[:200].lower() or "|" in s
    return c.isdigit() or c.isspace() or c == "\u2502" or s[3:4] == " " or "|" in s


def _level_near(s: str, start: int, end: int) -> bool:
    return (
        s.find("INFO ", start, end) >= 0
        or s.find("ERROR ", start, end) >= 0
        or s.find("WARNING ", start, end) >= 0
        or s.find("DEBUG ", start, end) >= 0
        or s.find("CRITICAL ", start, end) >= 0
    )


def parse(text: str) -> Parsed:
    """Split a raw log line into its prefixes (time, writer, rank, level) and its message. Only the
    first RULE_CHARS of a line are read. The shapes a writer repeats line after line go by
    `_parse_common`; any other line by `parse_general`, which gives every line the same result
    (tests/read/test_log_fastpath.py checks it on every line of the corpus)."""
    return _parse_common(text) or parse_general(text)


def _parse_common(text: str) -> Parsed | None:
    """`parse_general`'s result for the common shapes, or None for any other line (one with a
    colour code or a carriage return too): SGLang's `[time TP3] `, vLLM's `LEVEL time [file:N] `
    behind an optional `(Writer pid=N) `, and a line with no prefix at all (uvicorn's `INFO:     ...`, a
    traceback's indented lines):
    one match of the shape's own pattern, which also rules out every other prefix the general parse
    could still find (BRACKET_COMMON, LEVEL_COMMON, NO_PREFIX)."""
    s = text if len(text) <= RULE_CHARS else text[:RULE_CHARS]
    if "\x1b" in s or "\ufffd" in s or "^" in s or "\r" in s:
        return None
    c = s[:1]
    if c == "[":
        m = BRACKET_COMMON.match(s)
        if m is None or m.end() > PREFIX_WINDOW:  # the general parse reads SGLang's within the window
            return None
        time, tags = m.group(1, 2)
        if tags:
            tags = tags.strip()
            return _new(Parsed, (s[m.end() :], time, tags, _rank_of_tags(tags), None, _BRACKET))
        return _new(Parsed, (s[m.end() :], time, None, None, None, _BRACKET))
    if c == "(":
        m = WRITER_PREFIX.match(s, 0, PREFIX_WINDOW)
        if m is None:
            return None
        who, pos = m.group(1), m.end()
        if "glang" in who.lower() or s.startswith("(", pos):
            return None  # Ray's prefix of an SGLang actor (an outer layer), or a nested writer
        rank = _rank_of_who(who)
        m = LEVEL_COMMON.match(s, pos)
        if m is not None:
            return _new(Parsed, (s[m.end() :], m.group(2), who, rank, m.group(1), _WRITER))
        if s.startswith(LEVEL_WORDS, pos) or s[pos : pos + 1].isdigit() or NO_PREFIX.match(s, pos) is None:
            return None
        return _new(Parsed, (s[pos:], None, who, rank, None, _WRITER if WRITER_NAMES.match(who) else None))
    m = LEVEL_COMMON.match(s)
    if m is not None:
        return _new(Parsed, (s[m.end() :], m.group(2), None, None, m.group(1), _WRITER))
    if c.isalpha():
        if s.startswith(LEVEL_WORDS) or s[3:4] == " ":
            return None  # a level the general parse reads, journald's prefix
    elif not c.isspace() or "\u2502" in s:  # an indented line (a traceback's) unless a table's border
        return None
    if "|" in s or NO_PREFIX.match(s) is None:
        return None  # docker compose's prefix, a border, a prefix further on
    return _new(Parsed, (s, None, None, None, None, None))


def parse_general(text: str) -> Parsed:
    """`parse` for any line: each prefix tried where its first literal stands (`str.find`), not
    searched for position by position."""
    text = text if len(text) <= RULE_CHARS else text[:RULE_CHARS]
    s = ANSI.sub("", text) if ("\x1b" in text or "\ufffd" in text or "^" in text or "\r" in text) else text
    time = None
    if _outer_maybe(s) and OUTER_ANY.match(s):
        for rx in OUTER:
            m = rx.match(s)
            if m:
                iso = ISO_TIME.match(s)
                if iso:
                    time = f"{iso.group(1)} {iso.group(2)}"
                s = s[m.end() :]
    outer_level = None
    m = PIPE_FIELDS.match(s) if s[:1].isdigit() else None
    if m:
        time, outer_level = f"{m.group('d')} {m.group('t')}", PIPE_LEVELS.get(m.group("l"), m.group("l"))
        s = s[m.end() :]
    who = rank = level = engine = None
    pos = 0
    c = s[:1]
    if c == "[":  # SGLang's prefix where it mostly stands: first
        m = BRACKET_PREFIX.match(s, 0, PREFIX_WINDOW) or _find_match(BRACKET_PREFIX, s, "[", 1, 60, PREFIX_WINDOW)
    else:
        m = _find_match(BRACKET_PREFIX, s, "[", 0, 60, PREFIX_WINDOW) if "[" in s else None
    if m:
        time, engine, pos = m.group(1), _BRACKET, m.end()
        tags = m.group(2)
        if tags:
            tags = tags.strip()
            who, rank = tags, _rank_of_tags(tags)
    m = (
        _find_match(WRITER_PREFIX, s, "(", pos, pos + 60, pos + PREFIX_WINDOW)
        if s.find(" pid=", pos, pos + PREFIX_WINDOW) >= 0
        else None
    )
    if m:
        # vLLM's own processes name the engine; any other "(Name pid=N)" is a Ray actor's prefix
        who, engine, pos = m.group(1), (_WRITER if WRITER_NAMES.match(m.group(1)) else engine), m.end()
        rank = _rank_of_who(who)
        # nested: "(EngineCore_0 pid=..) (VllmWorker TP1 pid=..) ": the innermost writer wrote it
        while (inner := WRITER_PREFIX.match(s, pos)) is not None:
            who, pos = inner.group(1), inner.end()
            inner_rank = _rank_of_who(who)
            rank = inner_rank if inner_rank is not None else rank
    elif engine is None and s.startswith("[gpu_id=", pos):
        m = GPU_ID_PREFIX.match(s, pos)
        if m:
            rank, engine, pos = int(m.group(1)), _BRACKET, m.end()
            who = f"gpu_id={rank}"
    leveled = s.startswith(LEVEL_WORDS, pos)
    m = LEVEL_PREFIX.match(s, pos) if leveled else None
    if m is None and engine != _BRACKET and _level_near(s, pos, pos + 60):
        m = LEVEL_PREFIX.search(s, pos, pos + 60)
    if m:
        level, time, engine, pos = m.group(1), m.group(2), engine or _WRITER, m.end()
    elif leveled or s[pos : pos + 1].isdigit():
        m = SITE_LEVEL.match(s, pos)
        if m:
            level = m.group("l1") or m.group("l2")
            time = f"{m.group('d1') or m.group('d2')} {m.group('t1') or m.group('t2')}"
            pos = m.end()
    m = _find_match(TORCH_PREFIX, s, "[", pos, pos + 30, pos + 80) if s.find("[", pos, pos + 30) >= 0 else None
    if m:
        if m.group(1) is not None:
            rank = int(m.group(1))
        level = {"E": "ERROR", "W": "WARNING", "I": "INFO", "F": "CRITICAL"}[m.group(2)]
        if m.group(3):
            time = time or f"{int(m.group(3)):02d}-{m.group(4)} {m.group(5)}"
        pos = m.end()
        who = who or (f"rank{rank}" if rank is not None else None)
    elif s.startswith("[rank", pos) and (m := TORCH_RANK_LEAD.match(s, pos)) is not None:
        rank, pos = int(m.group(1)), m.end()  # "[rank3]: msg": the rank kept, the message read without it
        who = who or f"rank{rank}"
    elif rank is None and s.find("[rank", pos, pos + 40) >= 0:
        m = _find_match(TORCH_RANK, s, "[rank", pos, pos + 40, pos + 40)
        if m:
            rank = int(m.group(1))
            who = who or f"rank{rank}"
    return _new(Parsed, (s[pos:], time, who, rank, level or outer_level, engine))


# ----------------------------------------------------------------------------- failures

# The causes a failure can name, and how much of a root cause each is: a post-mortem names the
# first failure of the lowest tier (an OOM on rank 3 before the NCCL errors it caused on the others).
CAUSE_TIER = {
    "oom": 0,
    "cuda-error": 0,
    "killed": 0,
    "segfault": 0,
    "aborted": 0,
    "fatal-signal": 0,
    "nccl-error": 1,
    "watchdog-timeout": 1,
    "exception": 1,
    "nccl-timeout": 2,
    "terminated": 3,
    "died": 3,
}


def _hot(m: str) -> bool:
    """Whether a message holds a word that every failure, cause, stall tell, error or warning rule
    needs (one of them is in each of their matches: tests/read/test_logrules.py checks it on every line
    of the corpus): a line without one skips all those rules. `in` tests, cheaper than any regex."""
    return (
        "rror" in m
        or "RROR" in m
        or "xcept" in m
        or "ail" in m
        or "emory" in m
        or "died" in m
        or "dead" in m
        or "atchdog" in m
        or "SIG" in m
        or "ault" in m
        or "bort" in m
        or "illed" in m
        or "已杀死" in m
        or "oom-kill" in m
        or "Exit code" in m
        or "ermina" in m
        or "atal" in m
        or "timed out" in m
        or "WARN" in m
        or "CRITICAL" in m
        or "Traceback" in m
        or "FAILED" in m
        or "igquit" in m
        or "assert" in m
        or "isaligned" in m
        or "CUBLAS" in m
        or "kernel image" in m
        or "stored in KV" in m
        or "placement" in m
        or "NCCL" in m
        or "nccl" in m
    )


def _fail_words(m: str) -> bool:
    """Whether a message holds a word every failure rule (FAILURES) and stall tell (STALLS) needs: the
    gate for a line at INFO or DEBUG level, where no other of `_hot`'s families applies."""
    return (
        "xcept" in m
        or "rror" in m
        or "ail" in m
        or "died" in m
        or "dead" in m
        or "atchdog" in m
        or "Exit code" in m
        or "igquit" in m
        or "atal" in m
        or "timed out" in m
        or "ermina" in m
        or "ault" in m
        or "NCCL" in m
        or "emory" in m
        or "placement" in m
    )


# What the CUDA driver and runtime say of an error (cuGetErrorString's and cudaGetErrorString's table, by
# its enum name): the words torch's `CUDA error: ...`, Triton's `Triton Error [CUDA]: ...`, NCCL's `Cuda
# failure '...'` and the C check macros wrap. A wrapper names a CUDA error whatever follows it; a string of
# four words or more that is not also common English (CUDA_GENERIC) names one on its own, wrapped or not.
CUDA_ERRORS = [
    ("CUDA_ERROR_INVALID_VALUE", "invalid argument"),
    ("CUDA_ERROR_OUT_OF_MEMORY", "out of memory"),
    ("CUDA_ERROR_NOT_INITIALIZED", "initialization error"),
    ("CUDA_ERROR_DEINITIALIZED", "driver shutting down"),
    ("CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library"),
    ("CUDA_ERROR_DEVICE_UNAVAILABLE", "CUDA-capable device(s) is/are busy or unavailable"),
    ("CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"),
    ("CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"),
    ("CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"),
    ("CUDA_ERROR_INVALID_CONTEXT", "invalid device context"),
    ("CUDA_ERROR_CONTEXT_ALREADY_CURRENT", "context already current"),
    ("CUDA_ERROR_MAP_FAILED", "mapping of buffer object failed"),
    ("CUDA_ERROR_UNMAP_FAILED", "unmapping of buffer object failed"),
    ("CUDA_ERROR_ARRAY_IS_MAPPED", "array is mapped"),
    ("CUDA_ERROR_ALREADY_MAPPED", "resource already mapped"),
    ("CUDA_ERROR_NO_BINARY_FOR_GPU", "no kernel image is available for execution on the device"),
    ("CUDA_ERROR_ALREADY_ACQUIRED", "resource already acquired"),
    ("CUDA_ERROR_NOT_MAPPED", "resource not mapped"),
    ("CUDA_ERROR_ECC_UNCORRECTABLE", "uncorrectable ECC error encountered"),
    ("CUDA_ERROR_UNSUPPORTED_LIMIT", "limit is not supported on this architecture"),
    ("CUDA_ERROR_CONTEXT_ALREADY_IN_USE", "exclusive-thread device already in use by a different thread"),
    ("CUDA_ERROR_PEER_ACCESS_UNSUPPORTED", "peer access is not supported between these two devices"),
    ("CUDA_ERROR_INVALID_PTX", "a PTX JIT compilation failed"),
    ("CUDA_ERROR_NVLINK_UNCORRECTABLE", "uncorrectable NVLink error detected during the execution"),
    ("CUDA_ERROR_JIT_COMPILER_NOT_FOUND", "PTX JIT compiler library not found"),
    ("CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "the provided PTX was compiled with an unsupported toolchain"),
    ("CUDA_ERROR_JIT_COMPILATION_DISABLED", "PTX JIT compilation was disabled"),
    ("CUDA_ERROR_CONTAINED", "Invalid access of peer GPU memory over nvlink or a hardware error"),
    ("CUDA_ERROR_FILE_NOT_FOUND", "file not found"),
    ("CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND", "shared object symbol not found"),
    ("CUDA_ERROR_SHARED_OBJECT_INIT_FAILED", "shared object initialization failed"),
    ("CUDA_ERROR_OPERATING_SYSTEM", "OS call failed or operation not supported on this OS"),
    ("CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"),
    ("CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state"),
    ("CUDA_ERROR_NOT_FOUND", "named symbol not found"),
    ("CUDA_ERROR_NOT_READY", "device not ready"),
    ("CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"),
    ("CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "too many resources requested for launch"),
    ("CUDA_ERROR_LAUNCH_TIMEOUT", "the launch timed out and was terminated"),
    ("CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED", "peer access is already enabled"),
    ("CUDA_ERROR_PEER_ACCESS_NOT_ENABLED", "peer access has not been enabled"),
    ("CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE", "cannot set while device is active in this process"),
    ("CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed"),
    ("CUDA_ERROR_ASSERT", "device-side assert triggered"),
    ("CUDA_ERROR_TOO_MANY_PEERS", "peer mapping resources exhausted"),
    ("CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED", "part or all of the requested memory range is already mapped"),
    ("CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED", "pointer does not correspond to a registered memory region"),
    ("CUDA_ERROR_HARDWARE_STACK_ERROR", "hardware stack error"),
    ("CUDA_ERROR_ILLEGAL_INSTRUCTION", "an illegal instruction was encountered"),
    ("CUDA_ERROR_MISALIGNED_ADDRESS", "misaligned address"),
    ("CUDA_ERROR_INVALID_ADDRESS_SPACE", "operation not supported on global/shared address space"),
    ("CUDA_ERROR_INVALID_PC", "invalid program counter"),
    ("CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"),
    ("CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE", "too many blocks in cooperative launch"),
    ("CUDA_ERROR_NOT_PERMITTED", "operation not permitted"),
    ("CUDA_ERROR_NOT_SUPPORTED", "operation not supported"),
    ("CUDA_ERROR_SYSTEM_NOT_READY", "system not yet initialized"),
    ("CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", "system has unsupported display driver / cuda driver combination"),
    ("CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE", "forward compatibility was attempted on non supported HW"),
    ("CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "operation not permitted when stream is capturing"),
    ("CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", "operation failed due to a previous error during capture"),
    ("CUDA_ERROR_STREAM_CAPTURE_MERGE", "operation would result in a merge of separate capture sequences"),
    ("CUDA_ERROR_STREAM_CAPTURE_UNMATCHED", "capture was not ended in the same stream as it began"),
    ("CUDA_ERROR_STREAM_CAPTURE_UNJOINED", "capturing stream has unjoined work"),
    ("CUDA_ERROR_STREAM_CAPTURE_ISOLATION", "dependency created on uncaptured work in another stream"),
    (
        "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT",
        "operation would make the legacy stream depend on a capturing blocking stream",
    ),
    ("CUDA_ERROR_CAPTURED_EVENT", "operation not permitted on an event last recorded in a capturing stream"),
    ("CUDA_ERROR_TIMEOUT", "wait operation timed out"),
    ("CUDA_ERROR_UNKNOWN", "unknown error"),
    # the runtime's own (cudaGetErrorString) where the driver has none
    ("cudaErrorInvalidDeviceFunction", "invalid device function"),
    ("cudaErrorInsufficientDriver", "CUDA driver version is insufficient for CUDA runtime version"),
    ("cudaErrorInvalidConfiguration", "invalid configuration argument"),
    ("cudaErrorMissingConfiguration", "__global__ function call is not configured"),
]
# four words or more, yet said by other programs too: a CUDA error only behind a wrapper
CUDA_GENERIC = {
    "wait operation timed out",
    "system not yet initialized",
    "shared object symbol not found",
    "named symbol not found",
    "shared object initialization failed",
    "file not found",
    "peer access is already enabled",
    "PTX JIT compilation was disabled",
}
# (and one that holds a word of `_hot`'s, the gate of the cause rules: the others come wrapped). Searched apart
# from CAUSE_ANY, only in a message that holds one of `_cuda_words`'s (each phrase holds one).
CUDA_OWN = [text for _, text in CUDA_ERRORS if len(text.split()) >= 4 and text not in CUDA_GENERIC and _hot(text)]
CUDA_OWN_RX = re.compile("|".join(re.escape(text) for text in CUDA_OWN))


def _cuda_words(m: str) -> bool:
    """Whether a message holds a word of every CUDA_OWN phrase (tests/read/test_log_stops.py checks each)."""
    return (
        "ncounter" in m
        or "kernel image" in m
        or "buffer object" in m
        or "PTX" in m
        or "NVLink" in m
        or "nvlink" in m
        or "OS call" in m
        or "launch" in m
        or "memory r" in m
        or "capture" in m
        or "CUDA" in m
    )


# (cause, regex over the message): the first that matches names the cause of a line.
CAUSES = [
    (
        "oom",
        r"CUDA out of memory|OutOfMemoryError|(?:CUDA|HIP)(?: driver)? error: out of memory"
        r"|CUDA error \([^()\n]{1,300}:\d{1,6}\): out of memory|Triton Error \[CUDA\]: out of memory"
        r"|(?:HIP|NPU|XPU) out of memory|memory allocation failed with OOM on device"
        r"|Cuda (?:failure (?:2 )?|error [^\s']{0,300}:\d{1,6} )'out of memory'|cudaErrorMemoryAllocation"
        r"|CUDA_ERROR_OUT_OF_MEMORY"
        r"|Not enough memory\. Please try to increase --mem-fraction-static"
        r"|No available memory for the cache blocks|larger than the available KV cache memory"
        r"|larger than the maximum number of tokens that can be stored in KV cache"
        r"|Free memory on device [^\n]{0,200}? is less than desired GPU memory utilization",
    ),
    # torch's ProcessGroupNCCL (c10d) watchdog across 2.0-2.9: its timeout's own line, then (2.4-2.5) "Exception
    # (either an error or timeout) detected by watchdog at work: N", "Timeout at NCCL work: N", (2.6+)
    # "failure detected by watchdog at work sequence id: N", WorkNCCL::handleException's "Some NCCL operations
    # have failed or timed out", and the dump signal (2.4+) "from this local rank" or "from rank N"
    (
        "nccl-timeout",
        r"Watchdog caught collective operation timeout"
        r"|detected by watchdog at work|Timeout at NCCL work: "
        r"|Some NCCL operations have failed or timed out"
        r"|Received a dump signal due to a collective timeout from (?:this local rank| {0,2}rank \d+) and we will"
        r" try our best to dump the debug info\. Last enqueued NCCL",
    ),
    (
        "nccl-error",
        r"NCCL [Ee]rror|ncclUnhandledCudaError|ncclSystemError|ncclInternalError|ncclRemoteError"
        r"|ncclInvalidUsage|DistBackendError|NCCL communicator was aborted",
    ),
    # (HIP's are ROCm's twins of CUDA's: "HIP error: invalid device function", "hipErrorNoBinaryForGpu")
    (
        "cuda-error",
        r"CUDA error[: ]|HIP error[: ]|hipError[A-Z]\w+|cudaError[A-Z]\w+|CUDA_ERROR_[A-Z]\w+"
        r"|Triton Error \[CUDA\]|illegal memory access|device-side assert triggered"
        r"|CUBLAS_STATUS_(?!SUCCESS)[A-Z_]+|CUDA driver error|uncorrectable ECC error"
        r"|unspecified launch failure|misaligned address|no kernel image is available"
        r"|Cuda error |Cuda failure",
    ),  # C/C++ check macros: custom all-reduce's, NCCL's
    ("watchdog-timeout", r"Scheduler watchdog timeout|Watchdog timeout \(self\.watchdog_timeout="),
    ("segfault", r"Segmentation fault|SIGSEGV|Segfault encountered|Fatal Python error: Bus error|SIGBUS"),
    ("fatal-signal", r"Fatal Python error: (?:Floating point exception|Illegal instruction)|SIGFPE|SIGILL"),
    ("aborted", r"SIGABRT|Aborted \(core dumped\)|Fatal Python error: "),
    # the shell's notice of a SIGKILLed child (also in glibc's zh_CN wording)
    ("killed", r"SIGKILL|Killed process \d+|^\s*(?:Killed|已杀死)\s*$|oom-kill"),
]
CAUSE_RX = [(cause, re.compile(rx)) for cause, rx in CAUSES]
# An exit code's cause: a negative code is the signal that ended the process (-9 SIGKILL, often the
# kernel's OOM killer); 128+N is the same from a shell. SIGTERM, SIGQUIT, SIGINT, SIGHUP come from
# another process ending this one (the parent, after another rank failed): a consequence.
EXIT_CAUSE = {
    -9: "killed",
    137: "killed",
    -11: "segfault",
    139: "segfault",
    -6: "aborted",
    134: "aborted",
    -7: "segfault",
    135: "segfault",
    -8: "fatal-signal",
    136: "fatal-signal",
    -4: "fatal-signal",
    132: "fatal-signal",
    -15: "terminated",
    143: "terminated",
    -3: "terminated",
    131: "terminated",
    -2: "terminated",
    130: "terminated",
    -1: "terminated",
    129: "terminated",
}


@dataclass(frozen=True)
class FailureRule:
    """An engine's own message that a rank or the run is going down."""

    pattern: re.Pattern
    cause: str  # when neither the exit code nor the line names one
    consequence: bool = False  # it reports another's failure
    header: bool = False  # a traceback follows whose last exception line tells the cause


def _f(rx: str, cause: str = "exception", consequence: bool = False, header: bool = False) -> FailureRule:
    return FailureRule(re.compile(rx), cause, consequence, header)


# Groups a pattern may have: `rank` (the rank it names), `code` (the exit code it names).
FAILURES = [
    # the engines' own (cockpit/engines/), in the table's order
    *(_f(f.pattern, f.cause, f.consequence, f.header) for e in engines.logged() for f in e.failures),
    # torch (c10d ProcessGroupNCCL), the C++ runtime, Python's faulthandler
    _f(r"Watchdog caught collective operation timeout", "nccl-timeout"),
    # the same watchdog's other words for it, without that line (torch 2.4-2.9's ProcessGroupNCCL.cpp:
    # watchdogHandler, WorkNCCL::handleException); the rank from their "[PG ID 2 PG GUID 3 Rank 3]" prefix
    # ("Exception (either an error or timeout) detected by watchdog at work: N", 2.6+'s "failure detected by
    # watchdog at work sequence id: N")
    _f(
        r"detected by watchdog at work|Timeout at NCCL work: |Some NCCL operations have failed or timed out",
        "nccl-timeout",
    ),
    # the dump signal: this rank's own timeout, or rank N's ("from  rank 7": torch writes two spaces)
    _f(
        r"Received a dump signal due to a collective timeout from (?:this local rank| {0,2}rank (?P<rank>\d+)) and we "
        r"will try our best to dump the debug info\. Last enqueued NCCL",
        "nccl-timeout",
    ),
    # ProcessGroupNCCL's heartbeat monitor: the watchdog itself is stuck (a NCCL/CUDA call hangs); torch
    # terminates the process (the "watchdog got stuck" line is F, fatal)
    _f(
        r"Heartbeat monitor timed out! Process will be terminated|ProcessGroupNCCL's watchdog got stuck for \d+ seconds"
        r"|Terminating the process after attempting to dump debug info, due to ProcessGroupNCCL watchdog hang",
        "nccl-timeout",
    ),
    _f(r"Process group watchdog thread terminated with exception"),
    _f(r"terminate called after throwing an instance of", "aborted", consequence=True),
    # Python's faulthandler / Py_FatalError: "Fatal Python error: Segmentation fault", "... Aborted",
    # "... Floating point exception", ...: the cause words tell which; the process is gone either way
    _f(r"Fatal Python error: ", "aborted"),
    _f(r"!+ Segfault encountered !+", "segfault"),  # vLLM's own SIGSEGV handler (a native stack follows)
    # NCCL's proxy thread: an InfiniBand work completion failed (a peer gone, a link down); NCCL turns
    # it into ncclRemoteError ("-> 6") and the communicator is unusable, whether the job then aborts or hangs
    _f(r"NCCL WARN NET/IB ?: Got completion from peer [^\n]{0,200}? with error", "nccl-error"),
    # C/C++ check macros that print and exit, with no Python traceback: flash-attention's CHECK_CUDA
    # ("CUDA error (file:line): msg", then exit(1)), vLLM's custom all-reduce CUDACHECK ("Failed: Cuda
    # error file:line 'msg'", then exit), NCCL's CUDACHECK and its other WARNs of a failed call
    # ("[dev] include/alloc.h:103 NCCL WARN Cuda failure 'out of memory'"), the call then returns an error
    _f(r"CUDA error \([^()\n]{1,300}:\d{1,6}\): ", "cuda-error"),
    _f(r"^Failed: Cuda error [^\s']{1,300}:\d{1,6} '", "cuda-error"),
    _f(
        r"NCCL WARN (?:Cuda failure|[^\n]{0,300}?(?:[Ff]ailed|[Ff]ailure|[Ee]rror|[Cc]losed|[Aa]bort|[Tt]imeout))",
        "nccl-error",
    ),
]
_NAMED_GROUP = re.compile(r"\?P<\w+>")
FAILURE_ANY = re.compile("|".join("(?:" + _NAMED_GROUP.sub("", r.pattern.pattern) + ")" for r in FAILURES))
CAUSE_ANY = re.compile("|".join(f"(?:{rx})" for _, rx in CAUSES))

# A deliberate stop the server says it received (the operator's or a launcher's signal, a shutdown asked
# for): (regex over the message, what stopped it, else the signal the regex's group names). The failures
# after it are its shutdown's (LogTracker), unless one came first. Every one holds "hut", or "ermina" and a word
# of `_hot`'s (`_stop_words`). SGLang's sigquit is a failing child's, never a stop (FAILURES).
STOPS = [
    # vLLM V1 core.py and launcher.py (2026): the engine core's and the API server's own word
    (re.compile(r"\[shutdown\] EngineCore: trigger received signal=(SIG[A-Z]{2,8})"), None),
    (re.compile(r"\[shutdown\] API server: shutdown triggered"), "shutdown"),
    # vLLM launcher.py serve_http, its server task cancelled by SIGINT/SIGTERM (0.5-0.11)
    (re.compile(r"^(?:INFO: +)?Shutting down FastAPI HTTP server"), "shutdown"),
    # vLLM 0.5-0.6 api_server.py: a SIGTERM while initializing raises KeyboardInterrupt("terminated")
    (re.compile(r"^KeyboardInterrupt: terminated\s*$"), "SIGTERM"),
    # SGLang tokenizer_manager.py's (and its gRPC server's) sigterm_handler: "SIGTERM received. signum=... Draining
    # requests and shutting down..."
    (re.compile(r"^SIGTERM received\. [^\n]{0,600}?[Ss]hutting down"), "SIGTERM"),
    # uvicorn server.py on its exit signal (behind its own "INFO:     ")
    (re.compile(r"^(?:INFO: +)?Shutting down\s*$"), "shutdown"),
    # torch elastic (torchrun) agent api.py: "Received Signals.SIGTERM death signal, shutting down workers"
    # (Python 3.11+ writes the signal's number: "Received 15 death signal")
    (re.compile(r"Received (?:Signals\.)?(SIG[A-Z]{2,8}|\d{1,2}) death signal, shutting down workers"), None),
    # a shell's notice of its job ended by SIGTERM: "Terminated", "./run.sh: line 3:  1234 Terminated  python ..."
    (re.compile(r"^\s*Terminated\s*$|: line \d{1,9}: +\d{1,9} Terminated "), "SIGTERM"),
]
STOP_ANY = re.compile("|".join(f"(?:{rx.pattern})" for rx, _ in STOPS))  # one search rules out every stop
SIGNAL_NAMES = {"1": "SIGHUP", "2": "SIGINT", "3": "SIGQUIT", "9": "SIGKILL", "15": "SIGTERM"}


def _stop_words(m: str) -> bool:
    """Whether a message holds a word every stop rule (STOPS) needs: most lines hold none. ("ermina" is also
    `_hot`'s: classify looks for it on a hot line only.)"""
    return "hut" in m or "ermina" in m and _hot(m)


def stop_of(message: str) -> str | None:
    """The stop a message says the server received: the signal's name, else "shutdown"; None for none."""
    if not STOP_ANY.search(message):
        return None
    for rx, what in STOPS:
        m = rx.search(message)
        if m:
            said = what or m.group(1)
            return SIGNAL_NAMES.get(said, said)
    return None


# Stall tells: lines that say the run is waiting on something that may never come.
STALLS = [(re.compile(rx), cause) for e in engines.logged() for rx, cause in e.stalls]

# A rank reporting that a peer went away (NCCL's ncclRemoteError, torch's "remote process exited or there
# was a network error"): a victim; the rank that failed first is another.
VICTIM = re.compile(r"ncclRemoteError|remote process exit|remote process exiting|Got completion from peer")
# "[Rank 3]", torch's "[PG 0 (default_pg) Rank 2]" and "[PG ID 2 PG GUID 3 Rank 4]": the PG part is bounded
# and holds no "[", so the attempts from many "[PG " on one line never scan the same text twice
NAMED_RANK = re.compile(r"\[(?:PG [^\]\[]{0,200}?)?Rank (\d+)\]|\bTP rank (\d+)\b|\[rank(\d+)\]")
EXCEPTION_LINE = re.compile(
    r"^(?:[A-Za-z_]\w*\.)*(?:[A-Z]\w*(?:Error|Exception|Failure)|Exception|\w*ExceptionGroup)"
    r"(?::\s|:?$)"
)
TRACEBACK = re.compile(r"Traceback \(most recent call last\)")
FRAME = re.compile(r'^\s*File "([^"]+)", line \d+')
# A traceback's frame (faulthandler's stack dumps write "line N in f", without the comma: no traceback)
TRACE_FRAME = re.compile(r'^\s*File "[^"]+", line \d+, in ')
# A traceback's last line: the exception's (qualified) name, then its message
FINAL_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?::\s|:?$)")
# Python joining two tracebacks of one chain: the traceback that follows belongs to the same error
CHAINED = re.compile(
    r"^During handling of the above exception, another exception occurred|"
    r"^The above exception was the direct cause of the following exception"
)
# A traceback of one request, in a server that goes on: the web framework's own notice before it
# (uvicorn, asyncio, aiohttp) or a frame of the HTTP stack or of an engine's request handlers in it.
REQUEST_NOTICE = re.compile(
    r"Exception in ASGI application|Exception in callback |Error handling request"
    r"|Error in preprocessing prompt inputs"
)  # vLLM serving_chat.py: one request's template
REQUEST_FRAME = re.compile(
    r"/(?:uvicorn/(?:protocols|middleware)|starlette|fastapi|aiohttp)/"
    r"|/serving_\w+\.py$|/openai_api/adapter\.py$"
)
# Another program's traceback in the server's log (a CI job's test client, a benchmark script): a frame of a test
# harness or a client (unittest's, pytest's, SGLang's test utilities, vLLM's benchmarks, a test_*.py or bench_*.py
# script) and none of the engine's serving code (SGLang's retry helper in sglang/srt/utils wraps every test, and
# `vllm bench` comes in through vllm/entrypoints/cli)
HARNESS_FRAME = re.compile(
    "|".join(
        [
            r"/(?:unittest|_pytest|pytest)/",
            *(rx for e in engines.logged() for rx in e.harness_dirs),
            r"/(?:test_|bench_|benchmark_)[^/]*\.py$",
        ]
    )
)
ENGINE_FRAME = re.compile("|".join(rx for e in engines.logged() for rx in e.source_dirs))
ENGINE_MARKS = tuple(e.source_mark for e in engines.logged() if e.source_mark)
MAX_FOREIGN = 8  # another program's tracebacks said, the first ones; the rest counted
# Exceptions that end a request or a shutdown, not a process: a client gone, a task cancelled, Ctrl+C
BENIGN_EXCEPTION = re.compile(
    r"^(?:[\w.]*\.)?(?:CancelledError|BrokenPipeError|ConnectionResetError|KeyboardInterrupt"
    r"|SystemExit)\b"
)
# Any HTTP access-log line (uvicorn's, aiohttp's): an HTTP server wrote this log
ACCESS_LINE = re.compile(r'"(GET|POST|PUT|HEAD|DELETE|PATCH|OPTIONS) (/[^\s"]{0,2000}) HTTP/[\d.]+" (\d{3})')
# An access-log line of a probe (the cockpit's own, a load balancer's, Kubernetes'): it proves the HTTP
# server answers, not that a request is being worked on
PROBE_PATH = re.compile(
    r"/(?:health\w*|ping|metrics|v1/models|get_model_info|get_server_info"
    r'|version|ready|live)/?(?:\?[^" ]{0,200})?$'
)
# The engines' periodic stats lines (what they print, and when: docs/diagnosis.md#progress):
# vLLM's loggers.py every VLLM_LOG_STATS_INTERVAL (10 s) while it has work or just had some,
# SGLang's scheduler every decode_log_interval (40) decode steps and at each prefill batch.
RATE = r"(\d+(?:\.\d*)?|\.\d+)"  # a number as float() reads it ("1.2.3" or "." is none: a hostile line's, no crash)
INTERVAL_STATS = re.compile(
    rf"Avg prompt throughput: {RATE} tokens/s, Avg generation throughput: {RATE} tokens/s, "
    r"Running: (\d+) reqs"
)
DECODE_STATS = re.compile(r"Decode batch[.,]? #running-req: (\d+),[^\n]{0,300}?gen throughput \(token/s\): " + RATE)
PREFILL_STATS = re.compile(r"Prefill batch[.,]? #new-seq: \d+, #new-token: (\d+)(?:[^\n]{0,300}?#running-req: (\d+))?")
# vLLM's offline LLM.generate finished every prompt: "Processed prompts: 100%|...| 4/4 [..."
OFFLINE_DONE = re.compile(r"Processed prompts: 100%[^\n]{0,400}?\| ?(\d+)/(\1) ")
# how near an allocator's OOM warning must come before a rank's failure to name its cause
OOM_WARNING_LINES = 20
BARE_KILLED = re.compile(r"^\s*(?:Killed|已杀死)\s*$")
ERROR = re.compile(r"\b(ERROR|CRITICAL|Traceback|Exception|Error:|died|FAILED|failed|sigquit)\b")
WARNING = re.compile(r"\bWARN(ING)?\b")
SHARDS = re.compile(r"(?:checkpoint shards|loader|Streamer|shards|weights|GGUF|gguf):[^\n]{0,400}?\|\s{0,8}(\d+)/(\d+)")

# What tells the engines apart, for engine "auto": (regex over the raw line, weight).
SIGNATURES = {e.name: [(re.compile(rx), 1) for rx in e.signatures] for e in engines.logged()}


def exit_cause(code: int | None) -> str | None:
    return EXIT_CAUSE.get(code) if code is not None else None


def _words_of(names) -> tuple[str, ...] | None:
    """The words one of which every line marking a phase of these engines holds (a cheap test before
    their regexes: `Engine.phase_words`); None when an engine names none (every line is searched)."""
    words: list[str] = []
    for name in names:
        engine = engines.get(name)
        if engine is None or not engine.phase_words:
            return None
        words += [w for w in engine.phase_words if w not in words]
    return tuple(words)


# Text that lists what might have happened (Ray's "There are some potential root causes. (1) The process
# is killed by SIGKILL by OOM killer ... (3) The worker is crashed unexpectedly due to SIGSEGV"): the
# list names no cause; the line is read up to where the list begins, a list item alone not at all.
LISTED_CAUSES = re.compile(r"(?:some |the )?(?:potential|possible|probable|likely) (?:root )?causes?\b|\(1\) ")
LIST_ITEM = re.compile(r"^\s{0,8}\(\d{1,2}\) ")


def _unlisted(message: str) -> str:
    if "(" in message or "auses" in message:
        if LIST_ITEM.match(message):
            return ""
        m = LISTED_CAUSES.search(message)
        if m:
            return message[: m.start()]
    return message


def cause_of(message: str) -> str | None:
    """The cause a message names, if any: oom, nccl-timeout, nccl-error, cuda-error, ... (CAUSES);
    none from a list of possible causes."""
    if not _hot(message):
        return None
    message = _unlisted(message)
    if CAUSE_ANY.search(message):
        for cause, rx in CAUSE_RX:
            if rx.search(message):
                return cause
    if _cuda_words(message) and CUDA_OWN_RX.search(message):
        return "cuda-error"  # the driver's own words, unwrapped
    return None


def line_engine(text: str, parsed: Parsed | None = None) -> dict[str, int]:
    """How strongly a line says each engine wrote it: a prefix counts 3, a telling string 1."""
    p = parsed or parse(text)
    score = dict.fromkeys(SIGNATURES, 0)
    if p.engine:
        score[p.engine] += 3
    for engine, sigs in SIGNATURES.items():
        for rx, weight in sigs:
            heads = SIGNATURE_HEADS[rx]
            if (heads is None or _holds_any(text, heads)) and rx.search(text, 0, RULE_CHARS):
                score[engine] += weight
    return score


def _holds_any(text: str, words: tuple[str, ...]) -> bool:
    for word in words:
        if word in text:
            return True
    return False


def detect_engine(lines) -> str | None:
    """The engine that wrote these lines, or None when they do not say (or two say it alike)."""
    total = dict.fromkeys(SIGNATURES, 0)
    for text in lines:
        for engine, n in line_engine(text).items():
            total[engine] += n
    return _leader(total)


def _leader(scores: dict[str, int]) -> str | None:
    """The engine scored above every other, if any."""
    best = max(scores, key=scores.get)
    if scores[best] == 0 or any(n == scores[best] for e, n in scores.items() if e != best):
        return None
    return best


def _fields(text, rank, time, who, message, level, stats, probe, http, stop) -> dict[str, Any]:
    """The fields every LogLine of a weighed line shares, whatever its kind."""
    return dict(
        text=text,
        rank=rank,
        time=time,
        who=who,
        message=message,
        level=level,
        stats=stats,
        probe=probe,
        http=http,
        stop=stop,
    )


class LogRules:
    """An engine's rules (plus a layout's own phases) for classifying its log lines. Engine "auto"
    (or any unknown name) decides from the lines themselves as they come (`detected`)."""

    def __init__(self, engine: str = engines.DEFAULT, extra: list[PhaseRule] | None = None, general: bool = False):
        """`general`: every line parsed by `parse_general`, none by the common shapes' parse (the
        reference tests/read/test_log_fastpath.py compares `classify` with)."""
        self.engine = engine
        known = engines.get(engine)
        self._tables = {
            e.name: [(re.compile(rx), phase) for rx, phase in e.phases]
            for e in ([known] if known is not None and known.phases else engines.logged())
        }
        self._learning = known is None or not known.phases
        self._fast = not general
        self.extra = [(r.pattern, r.phase) for r in extra or []]
        self._scores = dict.fromkeys(self._tables, 0)
        self.detected: str | None = None if self._learning else engine
        self._set_phases()

    def _set_phases(self) -> None:
        if self.detected:
            table = self._tables[self.detected]
        else:  # not known yet: every engine's marks (the table's first last, so its win a tie)
            table = [rule for name in reversed(self._tables) for rule in self._tables[name]]
        self._words = _words_of([self.detected] if self.detected else self._tables)
        self.phases = table + self.extra
        self._table = table
        # one search rules out the many lines that mark none of the engine's phases
        self._any_phase = re.compile("|".join(f"(?:{rx.pattern})" for rx, _ in table))
        # an access or stats line (told by its shape) marks serving or nothing: its own rule only
        serving = [rx.pattern for rx, name in table if name == "serving"]
        self._serving = re.compile("|".join(f"(?:{rx})" for rx in serving))

    def _learn(self, text: str, parsed: Parsed) -> None:
        if not self._learning:
            return
        for engine, n in line_engine(text, parsed).items():
            if engine in self._scores:
                self._scores[engine] += n
        lead = _leader(self._scores)
        if lead is not None and lead != self.detected:
            self.detected = lead
            self._set_phases()

    def _phase_words(self, m: str) -> bool:
        return self._words is None or _holds_any(m, self._words)

    def phase_of(self, text: str) -> str | None:
        return self._phase(parse(text).message)

    def _phase(self, message: str) -> str | None:
        for rx, name in reversed(self.extra):  # a layout's own phases first, with their own flags
            if rx.search(message):
                return name
        return self._engine_phase(message) if self._phase_words(message) else None

    def _engine_phase(self, message: str) -> str | None:
        if not self._any_phase.search(message):
            return None
        for rx, name in reversed(self._table):
            if rx.search(message):
                return name
        return None

    def classify(self, text: str) -> LogLine:
        """One line's kind, rank, phase and cause. The rules read at most RULE_CHARS of it (the
        text itself is kept whole), each rule family only where its words stand (`_hot`,
        `_phase_words`); an access line or an engine's stats line is told by its shape alone (a
        client's URL is no failure)."""
        p = _parse_common(text) if self._fast else None  # `parse`, without its own call
        if p is None:
            p = parse_general(text)
        if self._learning:
            self._learn(text, p)
        msg, time, who, rank, level, _ = p
        stop = stop_of(msg) if "hut" in msg else None  # `_stop_words`: "hut" here, "ermina" on a hot line below
        if "throughput" in msg or "Prefill batch" in msg:
            stats, stats_of = _stats(msg)
        else:
            stats = stats_of = None
        access = ACCESS_LINE.search(msg) if "HTTP/" in msg else None
        if access is None:
            http = None
            probe = False
            shaped = stats is not None
        else:
            http = (access.group(1), int(access.group(3)))
            probe = http[0] in ("GET", "HEAD") and PROBE_PATH.match(access.group(2)) is not None
            shaped = True
        quiet = level == "INFO" or level == "DEBUG"
        # at INFO or DEBUG a line is a failure or a stall tell by its rule only: their words suffice
        hot = not shaped and (_fail_words(msg) if quiet else _hot(msg))
        if hot and stop is None and "ermina" in msg:
            stop = stop_of(msg)
        if hot or (not shaped and not quiet and msg[-1:].isalpha()):
            base = _fields(text, rank, time, who, msg, level, stats, probe, http, stop)
            failure = self._failure(msg, level, base, hot)
            if failure is not None:
                return failure
        if shaped and not self.extra:
            # an engine's own stats line is its serving mark; an access line the serving rule's if it matches
            served = stats_of is not None and self.detected in (None, stats_of)
            if not served and access is not None:  # the request itself, where its quote opens
                served = self._serving.match(msg, access.start()) is not None
            phase = "serving" if served else None
        elif self.extra:
            phase = self._phase(msg)
        else:
            phase = self._engine_phase(msg) if self._phase_words(msg) else None
        if quiet or level is None and not hot:  # the common line: no error, no warning
            return _new(
                LogLine,
                (
                    text,
                    "phase" if phase else None,
                    rank,
                    phase,
                    None,
                    None,
                    None,
                    _shards(msg) if phase == "loading weights" else None,
                    time,
                    who,
                    msg,
                    False,
                    False,
                    level,
                    stats,
                    probe,
                    http,
                    stop,
                ),
            )
        base = _fields(text, rank, time, who, msg, level, stats, probe, http, stop)
        shards = _shards(msg) if phase == "loading weights" else None
        if level in ("ERROR", "CRITICAL") or (
            level is None and hot and (ERROR.search(msg) or EXCEPTION_LINE.match(msg))
        ):
            return LogLine(kind="error", phase=phase, shards=shards, **base)
        if level == "WARNING" or (level is None and hot and WARNING.search(msg)):
            return LogLine(kind="warning", phase=phase, shards=shards, **base)
        return LogLine(kind="phase" if phase else None, phase=phase, shards=shards, **base)

    @staticmethod
    def _failure(msg: str, level: str | None, base: dict, hot: bool) -> LogLine | None:
        """A stall tell or a failure line: from a message that holds a hot word, or one cut mid-word."""
        if not hot:
            cut = _cut_failure(msg)
            return (
                None if cut is None else LogLine(kind="failure", cause=cut.cause, consequence=cut.consequence, **base)
            )
        for rx, cause in STALLS:
            if rx.search(msg):
                return LogLine(kind="stall", cause=cause, **base)
        told = _unlisted(msg)  # what a list of possible causes says is no failure
        frame = msg[:1].isspace() and not msg.lstrip().startswith("what():")  # a traceback's source line
        if frame and "] " not in msg and "pid=" not in msg:
            return None  # (nor a writer's prefix glued to it)
        header = FAILURE_ANY.search(told) if level != "DEBUG" else None
        glued = _glued(told, header.start()) if header is not None and header.start() > 0 else None
        if glued is not None:  # another writer's header stuck to this line: its own prefix, its own line
            at, p = glued
            msg = told = told[at:]
            level = p.level or level
            base = dict(
                base,
                message=msg,
                level=level,
                time=p.time or base["time"],
                who=p.who or base["who"],
                rank=p.rank if p.rank is not None else base["rank"],
            )
            header = FAILURE_ANY.search(told)
        elif frame:
            return None
        if header is not None:
            for rule in FAILURES:
                m = rule.pattern.search(told)
                if not m:
                    continue
                groups = m.groupdict()
                code = int(groups["code"]) if groups.get("code") else None
                failed = int(groups["rank"]) if groups.get("rank") else _named_rank(told)
                # a line with an exit code is told by it (SGLang's adds "If exit code is -9 (SIGKILL), ...")
                cause = (exit_cause(code) or rule.cause) if code is not None else (cause_of(told) or rule.cause)
                consequence = cause == "terminated" or (rule.consequence and cause == rule.cause)
                return LogLine(
                    kind="failure",
                    cause=cause,
                    failed_rank=failed,
                    exit_code=code,
                    consequence=consequence,
                    victim=bool(VICTIM.search(told)),
                    **base,
                )
        if level not in ("WARNING", "INFO", "DEBUG"):
            cause = cause_of(told)
            if cause and (
                EXCEPTION_LINE.match(told)
                or level in ("ERROR", "CRITICAL")
                or told.lstrip().startswith("what():")
                or cause in ("killed", "segfault", "aborted")
            ):
                return LogLine(
                    kind="failure", cause=cause, failed_rank=_named_rank(told), victim=bool(VICTIM.search(told)), **base
                )
        if msg[-1:].isalpha() and level not in ("INFO", "DEBUG"):
            cut = _cut_failure(msg)
            if cut is not None:
                return LogLine(kind="failure", cause=cut.cause, consequence=cut.consequence, **base)
        return None


def _glued(message: str, start: int) -> tuple[int, Parsed] | None:
    """A writer's prefix mid-line that a failure header at `start` follows (two processes' writes
    interleaved: `...Extension modules: numpy.core._multiarray_umath, ... (total: 40)[2025-04-17 11:44:15 TP3]
    Scheduler hit an exception: ...`, `..., PIL._imaging[rank5]:[E226 11:16:37.121617583 ProcessGroupNCCL.cpp:616]
    [Rank 5] Watchdog caught ...`, a faulthandler frame `  File "<internal>", line 7 in [..] Received sigquit ...`):
    where its message starts and the prefix read, or None. Tried from each `[` or `(` up to PREFIX_WINDOW
    before the header (the first GLUE_TRIES), each a parse of a bounded slice."""
    lo, tries = max(0, start - PREFIX_WINDOW), 0
    if message.find(":", lo, start) < 0 and message.find("=", lo, start) < 0:
        return None  # every prefix holds a time's, a rank's or a pid's ":" or "="
    i = _next_open(message, lo, start)
    while i >= 0 and tries < GLUE_TRIES:
        tries += 1
        chunk = message[i : start + 80]
        p = parse_general(chunk)
        at = i + len(chunk) - len(p.message)
        if at <= start and (p.who is not None or p.time is not None or p.rank is not None):
            return at, p
        i = _next_open(message, i + 1, start)
    return None


GLUE_TRIES = 16


def _next_open(s: str, start: int, end: int) -> int:
    """The first `[` or `(` in s[start:end], or -1."""
    a, b = s.find("[", start, end), s.find("(", start, end)
    return b if a < 0 else a if b < 0 else min(a, b)


# A failure line cut mid-word (an excerpt's end, two writers interleaved mid-line): the message ends
# inside the literal head of a failure rule ("... Error executing metho"), at least CUT_MIN characters of it.
CUT_MIN = 14


def _literal_head(pattern: str) -> str:
    """A rule's leading literal text: up to its first regex operator (escaped characters kept)."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern) and pattern[i + 1] in ".()[]{}|?*+^$\\-":
            out.append(pattern[i + 1])
            i += 2
            continue
        if c in ".()[]{}|?*+^$\\":
            break
        out.append(c)
        i += 1
    text = "".join(out)
    return text[:-1] if i < len(pattern) and pattern[i] in "?*{" else text  # a quantified last char is not literal


def _cut_index() -> dict[str, list[tuple[str, FailureRule]]]:
    """Every head of every failure rule cut after CUT_MIN or more of its characters, by its last four:
    a message's last four characters find the few it may end inside."""
    index: dict[str, list[tuple[str, FailureRule]]] = {}
    for rule in FAILURES:
        for branch in re.split(r"\|(?![^()]*\))", rule.pattern.pattern):
            head = _literal_head(branch.lstrip("^"))
            for k in range(CUT_MIN, len(head)):
                cut = head[:k].rstrip()
                entries = index.setdefault(cut[-4:], [])
                if all(c != cut for c, _ in entries):
                    entries.append((cut, rule))
    return index


CUT_INDEX = _cut_index()


def _branch_heads(rx: re.Pattern) -> tuple[str, ...] | None:
    """The literal each top-level branch of a pattern starts with; None where one starts with none.
    A line that holds none of them cannot match: `line_engine` searches only a line that does (a
    search for an alternation of common initials tries nearly every place of a line)."""
    heads = tuple(_literal_head(branch) for branch in re.split(r"\|(?![^()]*\))", rx.pattern))
    return heads if all(heads) else None


SIGNATURE_HEADS = {rx: _branch_heads(rx) for sigs in SIGNATURES.values() for rx, _ in sigs}


def _cut_failure(message: str) -> FailureRule | None:
    """The failure rule whose head a cut message ends inside ("... Error executing metho")."""
    for cut, rule in CUT_INDEX.get(message[-4:], ()):
        if message.endswith(cut):
            start = len(message) - len(cut)
            if start == 0 or not (message[start - 1].isalnum() or message[start - 1] == "_"):
                return rule
    return None


def _stats(message: str) -> tuple[tuple[float, int | None] | None, str | None]:
    """An engine's stats line: (tokens/s, requests running), and the engine whose it is. Cheap
    substring tests first: most lines are none."""
    if "throughput" in message:
        m = INTERVAL_STATS.search(message)
        if m:
            prompt, generation, running = m.group(1, 2, 3)
            return (float(prompt) + float(generation), int(running)), _WRITER
        m = DECODE_STATS.search(message)
        if m:
            running, generation = m.group(1, 2)
            return (float(generation), int(running)), _BRACKET
    if "Prefill batch" in message:
        m = PREFILL_STATS.search(message)
        if m:  # requests entering the batch: work, whatever their new tokens (a cached prefix has none)
            tokens, running = m.group(1, 2)
            return (1.0 + float(tokens), int(running) if running else None), _BRACKET
    return None, None


def _shards(message: str) -> tuple[int, int] | None:
    m = SHARDS.search(message)
    return (int(m.group(1)), int(m.group(2))) if m else None


def progress_of(line: LogLine) -> str:
    """`work` (the run did something: any other line, a phase mark, a stats line with work
    done), `idle` (a stats line: nothing running, nothing done), `frozen` (a stats line: requests
    running, nothing done), or `none` (a probe's access line, an error, a failure or a stall tell:
    the log moving is not the run moving)."""
    if line.probe or line.kind in ("failure", "stall", "error"):
        return "none"
    if line.stats is not None:
        rate, running = line.stats
        if rate > 0:
            return "work"
        return "frozen" if running else "idle"
    return "work"


def _named_rank(message: str) -> int | None:
    m = NAMED_RANK.search(message)
    if not m:
        return None
    return int(next(g for g in m.groups() if g is not None))


# ----------------------------------------------------------------------------- a run, read in order


@dataclass
class Failure:
    """One failure the log tells, with the traceback lines that name its cause."""

    line: int  # 1-based line number of the failure line
    text: str
    rank: int | None  # the failing rank: the one the line names, else its writer, else its traceback's
    cause: str
    consequence: bool
    time: str | None = None
    evidence: list[tuple[int, str]] = field(default_factory=list)  # (line, text): the line and what names its cause
    named: bool = False  # the line itself names the failed rank ("Worker proc VllmWorker-3 died", "Rank 3 ...")
    provisional: bool = False  # a traceback with no failure header: withdrawn if the run goes on after it
    together: tuple[int, ...] = ()  # ranks that failed the same way in the same second: no one of them is first

    @property
    def tier(self) -> int:
        """0 names a root cause (oom, cuda-error, killed, ...); a consequence that names no cause of its own is 3."""
        if self.consequence and self.cause in ("exception", "died", "terminated", "killed"):
            return 3
        return CAUSE_TIER.get(self.cause, 1)


@dataclass
class _Trace:
    """A traceback that no failure line opened, being read."""

    line: int
    text: str
    who: str | None
    rank: int | None
    request: bool = False  # one request's: the server's own notice before it, or a frame of the HTTP stack
    failure: Failure | None = None  # what its exception line made
    done: bool = False  # its exception line came
    chained: bool = False  # "During handling of the above exception ...": another traceback of the chain follows
    harness: bool = False  # a frame of a test harness or a client
    engine: bool = False  # a frame of the engine's serving code
    foreign: bool = False  # said as another program's (HARNESS_FRAME without ENGINE_FRAME)


@dataclass
class PhaseMark:
    phase: str
    line: int
    time: str | None


ORDER = {name: i for i, name in enumerate(PHASE_ORDER)}
MAX_FAILURES = 1000  # failures kept whole (with their evidence); past it only one of a tier not seen yet
MAX_EVIDENCE = 24  # lines cited for one failure
NRANKS = re.compile(r"\bnranks (\d{1,7})\b")  # NCCL's "ncclCommInitRank comm 0x.. rank 1 nranks 16 ..."


def _cite(f: Failure, n: int, text: str) -> None:
    if len(f.evidence) < MAX_EVIDENCE:
        f.evidence.append((n, text))


class LogTracker:
    """Reads a run's log lines in order (`feed`) and keeps its post-mortem: the phases reached (a
    timeline that only moves forward), the failures (each traceback's last exception line naming
    the cause of the failure that opened it), the ranks seen, the last stall tell. A new launch
    (the server printing its arguments) starts the failures and the timeline over.

    A traceback that no failure line opened (a process's uncaught exception, or one whose
    `Traceback` line the excerpt cut) is a failure by its final exception line, unless it is one
    request's (uvicorn's `Exception in ASGI application`, asyncio's `Exception in callback`, a frame
    of uvicorn, starlette, fastapi, aiohttp or an engine's `serving_*.py`): such a failure is
    provisional and withdrawn when the run goes on after it (a phase mark, a request served, a
    throughput line). A log that ends inside such a traceback ends on a failure too."""

    def __init__(self, rules: LogRules):
        self.rules = rules
        self.n = 0
        self.timeline: list[PhaseMark] = []
        self._failures: dict[int, Failure] = {}  # by id, in order: a withdrawn one goes in O(1)
        self.stalls: list[tuple[int, LogLine]] = []
        self.ranks: set[int] = set()
        self.last_progress = 0  # the last line that marked a phase or served a request
        self.last_time: str | None = None
        self.finished_at = 0  # the line where an offline run said it had done all its work
        self.requests = 0  # HTTP access lines: an inference server's, whatever else the lines lack
        self._block: Failure | None = None  # the failure whose traceback is being read
        self._block_who: str | None = None
        self._trace: _Trace | None = None  # a traceback without a failure header, being read
        self._notice_at = -10  # the last line with a web framework's request-error notice
        self._oom_warning: tuple[int, int | None, str] | None = None  # (line, rank, text) of an allocator's OOM warning
        self._pending: dict[int | None, list[Failure]] = {}  # provisional failures not yet withdrawn, by rank
        self._kept_tier: dict[int, int] = {}
        self._tiers: dict[int, int] = {}  # failures kept by their tier when kept
        self.dropped = 0  # failures past MAX_FAILURES that could not change the verdict, counted only
        self.world: int | None = None  # the ranks NCCL says the communicator has ("nranks 8"), the largest seen
        self.answered: PhaseMark | None = None  # the first line of the server answering HTTP (2xx): it was up
        self.stop: tuple[int, LogLine] | None = None  # (line, LogLine) of a deliberate stop no failure came before
        self.foreign: list[tuple[int, str]] = []  # (line, text): another program's traceback's last line
        self.foreign_more = 0  # past MAX_FOREIGN, counted
        self._captured_by: set[int | None] = set()  # the writers that ended a capture stage

    @property
    def phase(self) -> str | None:
        return self.timeline[-1].phase if self.timeline else None

    @property
    def failures(self) -> list[Failure]:
        """Every failure kept, in order."""
        return list(self._failures.values())

    def feed(self, text: str) -> LogLine:
        return self.add(self.rules.classify(text))

    def add(self, ll: LogLine) -> LogLine:
        """A line already classified (the live cockpit classifies each line once, on arrival)."""
        self.n += 1
        text, kind, rank, phase, _, _, _, _, time, _, msg, _, _, level, stats, probe, http, stop = ll
        msg = msg or ""
        if time:
            self.last_time = time
        if rank is not None:
            self.ranks.add(rank)
        if (
            _holds_any(msg, LAUNCH_HEADS)
            and LAUNCH.search(msg)
            and (self._failures or self.stop or self.timeline and self.phase != "starting")
        ):
            self._restart()
        if stop is not None and self.stop is None and not self._failures and kind != "failure":
            self.stop = (self.n, ll)  # the server was told to stop, and nothing had failed: what fails now is its end
        if "nranks " in msg and (m := NRANKS.search(msg)):
            self.world = max(self.world or 0, int(m.group(1)))
        continues = False
        if self._block is not None or self._trace is not None:  # a traceback is being read
            continues = self._continues(ll)
            if not continues:
                self._block = None
                self._trace = None
            elif self._trace is not None and self._trace.done and not self._trace.chained and msg.strip():
                if CHAINED.match(msg.strip()):
                    self._trace.chained = True
        if kind == "warning" and cause_of(msg) == "oom":
            self._oom_warning = (self.n, rank, text)
        if ("xception in" in msg or "rror " in msg and ("rror h" in msg or "rror in" in msg)) and REQUEST_NOTICE.search(
            msg
        ):
            self._notice_at = self.n
        if "Traceback" in msg or 'File "' in msg:
            self._read_trace(ll, msg, continues)
        if kind == "failure" and ll.cause == "killed" and BARE_KILLED.match(msg) and self._failures:
            ll = ll._replace(consequence=True)  # the shell's notice of a tree the failed run killed itself
        # the engine's stats: requests running, nothing done
        frozen = stats is not None and progress_of(ll) == "frozen"
        if kind == "failure":
            self._failure(ll, continues)
            if self._trace is not None and continues:
                self._trace.done, self._trace.chained = True, False
                self._trace.failure = self._trace.failure or self._block
        elif kind == "stall":
            self._stall(ll)
        elif frozen:
            self._stall(ll._replace(kind="stall", cause="requests-frozen"))
        elif continues and self._block is not None and EXCEPTION_LINE.match(msg):
            _cite(self._block, self.n, text)  # the traceback's own last word
        elif (
            continues
            and self._trace is not None
            and not self._trace.done
            and FINAL_LINE.match(msg)
            and level not in ("WARNING", "INFO", "DEBUG")
        ):
            self._trace_failure(ll, msg)
        served = False
        if http is not None:
            self.requests += 1
            method, status = http
            served = 200 <= status < 300 and method in ("GET", "POST", "PUT")
            if served and self.answered is None and kind != "failure":
                self.answered = PhaseMark("serving" if method == "POST" else "ready", self.n, time)
        if self._pending and kind != "failure" and (phase or served) and not frozen and not probe:
            self._progress(ll)
        if phase and kind != "failure":
            if self.timeline and phase == self.timeline[-1].phase and phase not in CAPTURE_PHASES:
                if not frozen:  # the phase it is in, marked again: only progress (as `_mark` does)
                    self.last_progress = self.n
            else:
                self._mark(ll, progress=not frozen)
        if "Processed prompts" in msg and OFFLINE_DONE.search(msg):
            self.finished_at = self.n
        return ll

    def _stall(self, ll: LogLine) -> None:
        """A stall tell: the first and the last few are what a verdict reads; those between go."""
        self.stalls.append((self.n, ll))
        if len(self.stalls) > 64:
            del self.stalls[1:-8]

    def _keep(self, f: Failure) -> None:
        """A failure recorded: every one up to MAX_FAILURES, past it only one whose tier none kept has
        (the verdict names the first of the lowest tier), the others counted."""
        tier = f.tier
        if len(self._failures) >= MAX_FAILURES and self._tiers.get(tier):
            self.dropped += 1
            return
        self._failures[id(f)] = f
        self._tiers[tier] = self._tiers.get(tier, 0) + 1
        self._kept_tier[id(f)] = tier
        if f.provisional:
            self._pending.setdefault(f.rank, []).append(f)

    def _read_trace(self, ll: LogLine, msg: str, continues: bool) -> None:
        """A traceback that no failure line opened: its start (also a frame whose `Traceback` line was
        cut), whether it is one request's, and a chained traceback joining the one before."""
        if ll.kind == "failure" or (continues and self._block is not None):
            return
        frame = FRAME.match(msg)
        trace = self._trace
        if ("Traceback" in msg and TRACEBACK.search(msg)) or (trace is None and frame and TRACE_FRAME.match(msg)):
            if trace is not None and trace.done and trace.chained:
                trace.done = trace.chained = False  # the next traceback of the same chain
            elif trace is None or trace.done or not continues:
                request = self.n - self._notice_at <= 3
                self._trace = trace = _Trace(self.n, ll.text, ll.who, ll.rank, request)
        if frame and trace is not None:
            path = frame.group(1)
            if REQUEST_FRAME.search(path):
                trace.request = True
            if not trace.harness and ("test" in path or "bench" in path):
                trace.harness = HARNESS_FRAME.search(path) is not None
            if not trace.engine and _holds_any(path, ENGINE_MARKS):
                trace.engine = ENGINE_FRAME.search(path) is not None

    def _trace_failure(self, ll: LogLine, msg: str) -> None:
        """A headerless traceback's final exception line: a provisional failure (none for one request's)."""
        trace = self._trace
        trace.done, trace.chained = True, False
        if trace.request or BENIGN_EXCEPTION.match(msg) or not EXCEPTION_LINE.match(msg) or trace.foreign:
            return  # one request's, a client gone, Ctrl+C, another program's said already
        if trace.harness and not trace.engine and trace.failure is None:
            trace.foreign = True  # a test client's or a harness's: a finding, not the server failing
            if len(self.foreign) < MAX_FOREIGN:
                self.foreign.append((self.n, ll.text))
            else:
                self.foreign_more += 1
            return
        if trace.failure is not None:  # a later traceback of the same chain: its last word
            _cite(trace.failure, self.n, ll.text)
            return
        rank = trace.rank if trace.rank is not None else ll.rank
        f = Failure(
            self.n,
            ll.text,
            rank,
            "exception",
            False,
            ll.time or self.last_time,
            [(trace.line, trace.text), (self.n, ll.text)],
            provisional=True,
        )
        trace.failure = f
        self._keep(f)
        if rank is not None:
            self.ranks.add(rank)

    def _progress(self, ll: LogLine) -> None:
        """The run went on: a traceback with no failure header before this line did not end it (unless
        it was another rank's). Only the pending ones of this line's rank are looked at (all of them
        for a line of no rank), each once: linear however many failures the log holds."""
        if not self._pending:
            return
        keys = list(self._pending) if ll.rank is None else [k for k in (None, ll.rank) if k in self._pending]
        gone = []
        for key in keys:
            left = [f for f in self._pending[key] if f.line >= self.n]
            gone += [f for f in self._pending[key] if f.line < self.n]
            if left:
                self._pending[key] = left
            else:
                del self._pending[key]
        for f in gone:
            del self._failures[id(f)]
            self._tiers[self._kept_tier.pop(id(f))] -= 1

    def _continues(self, ll: LogLine) -> bool:
        """Whether this line belongs to the traceback being read: same writer, or no prefix at all."""
        if self._block is None and self._trace is None:
            return False
        who = self._block_who if self._block is not None else self._trace.who
        if ll.who is None and ll.time is None:
            return True  # no prefix at all: a continuation line of a multi-line message
        if ll.who is None:  # the unnamed main process: its traceback lines are errors, its other lines end it
            return who is None and ll.kind in ("error", "failure")
        return ll.who == who

    def _failure(self, ll: LogLine, continues: bool) -> None:
        if continues and self._block is not None:
            inherited = self._block.rank
        else:
            inherited = self._trace.rank if (continues and self._trace is not None) else None
        rank = ll.failed_rank if ll.failed_rank is not None else ll.rank if ll.rank is not None else inherited
        if ll.victim and ll.failed_rank is None:
            rank = None  # it reports a peer's failure: the rank that writes it is not the one that failed
        if rank is not None:
            self.ranks.add(rank)
        if continues and self._block is not None and not ll.consequence:
            block = self._block
            _cite(block, self.n, ll.text)
            if ll.cause != "exception" and (
                block.cause == "exception" or CAUSE_TIER.get(ll.cause, 1) < CAUSE_TIER.get(block.cause, 1)
            ):
                block.cause = ll.cause  # the traceback's exception line names what the header did not
            if block.rank is None and not block.provisional:
                block.rank = rank
            return
        f = Failure(
            self.n,
            ll.text,
            rank,
            ll.cause or "exception",
            ll.consequence,
            ll.time,
            [(self.n, ll.text)],
            named=ll.failed_rank is not None,
        )
        warned = self._oom_warning
        if (
            f.cause == "exception"
            and not f.consequence
            and warned
            and self.n - warned[0] <= OOM_WARNING_LINES
            and warned[1] == rank
        ):
            # torch's caching allocator warned of an OOM on this rank just before: the exception is its OOM
            f.cause = "oom"
            f.evidence.insert(0, (warned[0], warned[2]))
        self._keep(f)
        if not (continues and self._block is not None):  # a notice inside a traceback leaves it open
            self._block, self._block_who = f, ll.who

    def _mark(self, ll: LogLine, progress: bool = True) -> None:
        phase = ll.phase
        current = self.timeline[-1].phase if self.timeline else None
        if phase == "serving" and current == "port open":
            phase = "warmup"  # SGLang's own warm-up request, before "fired up and ready"
        if progress:
            self.last_progress = self.n
        if phase in CAPTURE_PHASES and phase.endswith("captured"):
            self._captured_by.add(ll.rank)
        if phase == current:
            return
        if current is not None and ORDER.get(phase, -1) < ORDER.get(current, -1):
            # a slower rank printing a mark the run has passed; but a capture stage begun by a writer
            # that already ended one (a draft-extend capture after the draft's, a stage run again) moves it
            if not (phase.startswith("capturing") and current in CAPTURE_PHASES and ll.rank in self._captured_by):
                return
        self.timeline.append(PhaseMark(phase, self.n, ll.time))

    def _restart(self) -> None:
        self.timeline.clear()
        self._failures.clear()
        self._kept_tier.clear()
        self.stalls.clear()
        self._block = None
        self._trace = None
        self._oom_warning = None
        self.finished_at = 0
        self._pending.clear()
        self._tiers.clear()
        self._captured_by.clear()
        self.dropped = 0
        self.answered = None
        self.stop = None
        self.foreign.clear()
        self.foreign_more = 0

    def _unfinished(self) -> Failure | None:
        """The log ends inside a traceback no failure line opened and no exception line closed (not
        one request's, and nothing moved since it began): the process was going down."""
        t = self._trace
        if t is None or t.done or t.request or t.line <= self.last_progress or t.harness and not t.engine:
            return None
        return Failure(t.line, t.text, t.rank, "exception", False, self.last_time, [(t.line, t.text)], provisional=True)

    def first_failure(self) -> Failure | None:
        """The failure to name: the first of the lowest tier (a root cause before its consequences); none
        after a deliberate stop no failure came before (`stopped`)."""
        if self.stop is not None:
            return None
        if not self._failures:
            return self._unfinished()
        if self.finished_at and all(f.tier >= 3 and f.line > self.finished_at for f in self.failures):
            return None  # an offline run that did all its work, then a notice of its engine going at exit
        best = min(self.failures, key=lambda f: (f.tier, f.line))
        together = self._together(best)
        if together:
            return Failure(
                best.line, best.text, None, best.cause, best.consequence, best.time, best.evidence, together=together
            )
        if best.rank is None:  # the root-cause line names no rank: the first death notice that names one
            ranked = [
                f
                for f in self.failures
                if f.rank is not None
                and f.named
                and f.tier >= 3
                or f.rank is not None
                and f.cause in ("killed", "died", "terminated")
            ]
            if ranked:
                other = min(ranked, key=lambda f: (f.tier, f.line))
                best = Failure(
                    best.line,
                    best.text,
                    other.rank,
                    best.cause,
                    best.consequence,
                    best.time,
                    best.evidence + [(other.line, other.text)],
                )
        return best

    def _together(self, best: Failure) -> tuple[int, ...]:
        """The ranks that failed as `best` did (its cause, not a consequence) in the same second: all
        eight ranks hitting the NCCL watchdog at once have no first, whichever line was printed first."""
        if best.time is None or best.rank is None or best.consequence:
            return ()
        ranks = {
            f.rank
            for f in self.failures
            if f.cause == best.cause and f.time == best.time and f.rank is not None and not f.consequence
        }
        return tuple(sorted(ranks)) if len(ranks) > 1 else ()

    def all_ranks(self, ranks: tuple[int, ...]) -> bool:
        """Whether these are every rank of the run: all the log names, and as many as NCCL said."""
        return set(ranks) == self.ranks and (self.world is None or self.world == len(ranks))

    def reached(self) -> list[PhaseMark]:
        """The timeline; for a log with no phase mark, no failure and no stall tell but the server
        answering HTTP (an access log: health probes, requests served), that answer: it was up."""
        if self.timeline or self._failures or self.stalls or self.answered is None:
            return self.timeline
        return [self.answered]

    def findings(self) -> list[Finding]:
        """What the log says beside the verdict: another program's tracebacks (a test client's, a harness's)."""
        if not self.foreign:
            return []
        more = [f"and {self.foreign_more} more"] if self.foreign_more else []
        return [
            Finding(
                "log",
                [
                    f"line {n}: another program's traceback (a test harness's or a client's), not the "
                    f"server failing: {text.strip()[:160]}"
                    for n, text in self.foreign
                ]
                + more,
            )
        ]

    def stopped(self) -> bool:
        """The server said it was stopped, no failure came before, and failures came after: its shutdown's."""
        return self.stop is not None and bool(self._failures)

    def stalled(self) -> bool:
        """The log ends on a stall tell: no failure (but a stop's shutdown), and nothing moved since the last
        tell (a hang the operator then stopped is a hang)."""
        quiet = not self._failures or self.stop is not None and self.stalls and self.stalls[-1][0] < self.stop[0]
        return bool(quiet) and bool(self.stalls) and self.stalls[-1][0] > self.last_progress
