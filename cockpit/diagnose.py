"""Where a run is: its phase from the log lines, the processes and the port. Pure functions over
HostState; nothing here touches the network."""

from __future__ import annotations

import re
from dataclasses import dataclass

from cockpit.model import HostState

# (regex, phase) in the order a launch goes through them; the last line that matches wins.
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
    (r"scheduler died during initialization|Received sigquit from a child process", "crashed"),
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
    (r"Engine core initialization failed|EngineCore failed|Worker.*died", "crashed"),
]
SHARDS = re.compile(r"checkpoint shards:.*?\|\s*(\d+)/(\d+)")
RANK_PREFIX = re.compile(r"^\[[^\]]*\bTP(\d+)\]|^\((?:Worker_)?\w*TP(\d+) pid=\d+\)")


@dataclass
class Phase:
    name: str
    detail: str = ""
    line: str = ""

    def __str__(self) -> str:
        return f"{self.name} {self.detail}".strip()


def compile_phases(engine: str, extra: list[tuple[re.Pattern, str]] | None = None) -> list[tuple[re.Pattern, str]]:
    table = VLLM_PHASES if engine == "vllm" else SGLANG_PHASES if engine == "sglang" else []
    return [(re.compile(rx), name) for rx, name in table] + list(extra or [])


def classify_line(line: str, phases: list[tuple[re.Pattern, str]]) -> str | None:
    for rx, name in reversed(phases):
        if rx.search(line):
            return name
    return None


def line_rank(line: str) -> int | None:
    """The TP rank that wrote a log line: `[... TP3]` (SGLang) or `(Worker_TP3 pid=..)` (vLLM)."""
    m = RANK_PREFIX.search(line)
    if not m:
        return None
    return int(m.group(1) or m.group(2))


def phase_of(state: HostState, phases: list[tuple[re.Pattern, str]], log_path: str | None = None) -> Phase:
    """The run's phase from its log, corrected by what the processes and port say."""
    log = state.logs.get(log_path) if log_path else next(iter(state.logs.values()), None)
    current = Phase("starting" if state.live_procs() else "no run")
    if log is not None:
        for line in reversed(log.lines):
            name = classify_line(line, phases)
            if name is None:
                continue
            current = Phase(name, line=line)
            if name == "loading weights":
                m = SHARDS.search(line)
                if m:
                    current.detail = f"{m.group(1)}/{m.group(2)} shards"
                else:  # the bar may not have been drawn yet: look back for the last one
                    for earlier in reversed(log.lines):
                        m = SHARDS.search(earlier)
                        if m:
                            current.detail = f"{m.group(1)}/{m.group(2)} shards"
                            break
            break
    ranks = [p for p in state.procs.values() if p.rank is not None]
    if ranks and all(not p.alive for p in ranks) and current.name not in ("no run",):
        current = Phase("crashed" if current.name != "ready" and current.name != "serving" else "exited",
                        line=current.line)
    return current
