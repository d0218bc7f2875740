"""What an engine is to the cockpit: the data every floor asks of it, in one frozen record."""

from __future__ import annotations

from dataclasses import dataclass, field

# A weight loader's progress bar (tqdm's "desc: NN%|bar| done/total"): safetensors and pt checkpoints
# ("Loading safetensors checkpoint shards"), the fastsafetensors iterator ("Loading safetensors using
# Fastsafetensor loader"), the Run:ai streamer ("Loading safetensors using Runai Model Streamer"),
# multi-threaded shard loading, GGUF files. Shared by the engines whose loaders print it.
LOADER_BAR = (
    r"\b(?:Loading (?:(?:safetensors|pt|np_cache) checkpoint shards|safetensors using |GGUF|gguf)"
    r"|Multi-thread loading (?:shards|weights))"
)


@dataclass(frozen=True)
class Failure:
    """A line the engine prints when a rank or the run goes down (read/logrules.py's FailureRule)."""

    pattern: str  # may name groups `rank` and `code`
    cause: str = "exception"
    consequence: bool = False
    header: bool = False


@dataclass(frozen=True)
class Engine:
    """One inference engine: its name and what the host shows of it.

    Patterns are regex sources over a log line's message (phases, failures, stalls) or the raw line
    (signatures); read/logrules.py compiles them."""

    name: str
    title: str = ""  # its name as its makers write it, in the operator's words ("SGLang")
    default_port: int | None = None  # where the server listens without --port
    metrics_path: str = ""  # its Prometheus page on the first port ("" when it has none)
    metrics: dict[str, tuple[str, ...]] = field(default_factory=dict)  # family -> its names, newest first
    titles: tuple[str, ...] = ()  # process-title prefixes of its ranks (`sglang::scheduler_TP3`)
    worker_title: str = ""  # a rank titled `<worker_title><N>` (older multiprocessing workers)
    launchers: tuple[str, ...] = ()  # what a server's command line holds (`sglang.launch_server`)
    shm_prefixes: tuple[str, ...] = ()  # what it leaves in /dev/shm
    packages: tuple[str, ...] = ()  # its Python packages, whose versions the host's facts report
    phases: tuple[tuple[str, str], ...] = ()  # (regex, phase) in launch order; the last match wins
    phase_words: tuple[str, ...] = ()  # every line marking one of its phases holds one ("" none: all are searched)
    failures: tuple[Failure, ...] = ()  # its own words for a rank or the run going down
    stalls: tuple[tuple[str, str], ...] = ()  # (regex, cause): it says it waits on what may never come
    signatures: tuple[str, ...] = ()  # regexes over a raw line that tell this engine wrote it (engine auto)
    launch: tuple[str, ...] = ()  # regexes: a new launch printed its arguments
    source_mark: str = ""  # a path part every frame of its code holds (a cheap test before source_dirs)
    source_dirs: tuple[str, ...] = ()  # regexes: path parts of its serving code in a traceback's frames
    harness_dirs: tuple[str, ...] = ()  # regexes: its tests' and benchmarks' code (a client's traceback)
    writers: str = ""  # regex: the process names it prefixes its lines with, `(Name pid=N)`
    prefix: str = ""  # the log prefix shape it writes: "bracket" (`[time TP3] `) or "writer" (`(Name pid=N) `)
    metrics_hint: str = ""  # what a 404 from its metrics page means ("SGLang needs --enable-metrics")
