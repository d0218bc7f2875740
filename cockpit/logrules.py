"""What a line of an inference server's log says: the one rule set for log lines.

Each line is classified once, where it arrives (`LogRules.classify`), into a `LogLine`: its kind
(a failure, an error, a warning, the mark of a launch phase), the rank that wrote it, the phase it
marks, and for a failure its cause and the rank it names. The watchdog, the log view and `cockpit
explain` all read these; nothing else matches log text. Pure: no I/O, no Textual."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple


class LogLine(NamedTuple):
    text: str
    kind: str | None = None  # failure | error | warning | phase | None
    rank: int | None = None  # the rank that wrote the line, from its prefix
    phase: str | None = None  # the launch phase this line marks
    cause: str | None = None  # of a failure: oom, nccl-timeout, nccl-error, cuda-error, exception, killed, ...
    failed_rank: int | None = None  # the rank a failure line names
    exit_code: int | None = None  # the exit code a failure line names
    shards: tuple[int, int] | None = None  # (done, total) of a checkpoint-loading bar


@dataclass(frozen=True)
class PhaseRule:
    """A layout's own phase: lines matching `pattern` mark `phase` (tried before the engine's)."""

    pattern: re.Pattern
    phase: str


# (regex, phase) in the order a launch goes through them; the last rule that matches a line wins.
SGLANG_PHASES = [
    (r"Init torch distributed begin", "starting"),
    (r"Load weight begin", "loading weights"),
    (r"Loading safetensors checkpoint shards", "loading weights"),
    (r"Load weight end", "weights loaded"),
    (r"KV Cache is allocated", "kv cache"),
    (r"Capture cuda graph begin", "capturing cuda graphs"),
    (r"Capture draft cuda graph begin", "capturing draft cuda graphs"),
    (r"Capture (draft )?cuda graph end", "cuda graphs captured"),
    (r"Uvicorn running on", "port open"),
    (r"The server is fired up and ready to roll", "ready"),
    (r"Decode batch\.", "serving"),
]
VLLM_PHASES = [
    (r"Loading safetensors checkpoint shards|Starting to load model", "loading weights"),
    (r"Model loading took", "weights loaded"),
    (r"GPU KV cache size|KV cache", "kv cache"),
    (r"Capturing CUDA graphs", "capturing cuda graphs"),
    (r"Graph capturing finished", "cuda graphs captured"),
    (r"Starting vLLM API server|Uvicorn running on", "port open"),
    (r"Application startup complete", "ready"),
    (r"Avg generation throughput", "serving"),
]
ENGINE_PHASES = {"sglang": SGLANG_PHASES, "vllm": VLLM_PHASES}

# Failures: lines that say the run (or one of its ranks) is going down.
FAILURES = [
    (re.compile(r"Rank (\d+) scheduler died during initialization \(exit code: (-?\d+)\)"), "exception"),
    (re.compile(r"Received sigquit from a child process"), "exception"),
    (re.compile(r"Engine core initialization failed|EngineCore failed|Worker.*died"), "exception"),
]
ERROR = re.compile(r"\b(ERROR|CRITICAL|Traceback|Exception|Error:|died|FAILED|failed|sigquit)\b")
WARNING = re.compile(r"\bWARN(ING)?\b")
SHARDS = re.compile(r"checkpoint shards:.*?\|\s*(\d+)/(\d+)")
RANK_PREFIX = re.compile(r"^\[[^\]]*\bTP(\d+)\]|^\((?:Worker_)?\w*TP(\d+) pid=\d+\)")


def line_rank(text: str) -> int | None:
    """The TP rank that wrote a log line: `[... TP3]` (SGLang) or `(Worker_TP3 pid=..)` (vLLM)."""
    m = RANK_PREFIX.search(text)
    if not m:
        return None
    return int(m.group(1) or m.group(2))


class LogRules:
    """An engine's rules (plus a layout's own phases) for classifying its log lines."""

    def __init__(self, engine: str = "sglang", extra: list[PhaseRule] | None = None):
        self.engine = engine
        table = ENGINE_PHASES.get(engine, [])
        self.phases = [(re.compile(rx), name) for rx, name in table] + [(r.pattern, r.phase) for r in extra or []]

    def phase_of(self, text: str) -> str | None:
        for rx, name in reversed(self.phases):
            if rx.search(text):
                return name
        return None

    def classify(self, text: str) -> LogLine:
        rank = line_rank(text)
        for rx, cause in FAILURES:
            m = rx.search(text)
            if m:
                groups = m.groups()
                failed = int(groups[0]) if groups and groups[0] is not None else None
                code = int(groups[1]) if len(groups) > 1 and groups[1] is not None else None
                return LogLine(text, "failure", rank, None, cause, failed, code)
        phase = self.phase_of(text)
        shards = None
        if phase == "loading weights":
            m = SHARDS.search(text)
            if m:
                shards = (int(m.group(1)), int(m.group(2)))
        if ERROR.search(text):
            return LogLine(text, "error", rank, phase, shards=shards)
        if WARNING.search(text):
            return LogLine(text, "warning", rank, phase, shards=shards)
        return LogLine(text, "phase" if phase else None, rank, phase, shards=shards)
