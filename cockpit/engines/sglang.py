"""SGLang: `python -m sglang.launch_server`, ranks titled `sglang::scheduler_TP3`, log lines prefixed
`[2025-04-21 04:13:43 DP0 TP3] ` (docs/diagnosis.md lists the sources of each string)."""

from cockpit.engines.base import LOADER_BAR, Engine, Failure

ENGINE = Engine(
    name="sglang",
    title="SGLang",
    default_port=30000,
    metrics_path="/metrics",
    metrics={
        "generation_tokens": ("sglang:generation_tokens_total",),
        "prompt_tokens": ("sglang:prompt_tokens_total",),
        "running": ("sglang:num_running_reqs",),
        "waiting": ("sglang:num_queue_reqs",),
        "kv_usage": ("sglang:token_usage",),
    },
    titles=("sglang::",),
    launchers=("sglang.launch_server",),
    shm_prefixes=("sgl_shm_", "multi_tokenizer_args_"),
    packages=("sglang",),
    prefix="bracket",
    phase_words=(
        "aptur",
        "oad",
        "KV ",
        "HTTP/",
        " batch",
        "Init torch",
        "Memory pool",
        "Uvicorn",
        "Application startup",
        "fired up",
    ),
    phases=(
        (r"Init torch distributed begin", "starting"),
        (r"Load weight begin|" + LOADER_BAR, "loading weights"),
        (r"Load weight end", "weights loaded"),
        (r"KV Cache is allocated|Memory pool end", "kv cache"),
        (r"Capture cuda graph begin|Capture cuda graph bs|^Capturing batches \(", "capturing cuda graphs"),
        (r"Capture cuda graph end", "cuda graphs captured"),
        (r"Capture draft (?:extend )?cuda graph begin", "capturing draft cuda graphs"),
        (r"Capture draft (?:extend )?cuda graph end", "draft cuda graphs captured"),
        (r"Uvicorn running on|Application startup complete", "port open"),
        (r"The server is fired up and ready to roll", "ready"),
        (r"\b(?:Prefill|Decode) batch\b|\"POST /(?:generate|v1/[^\s\"]+) HTTP/[\d.]+\" 200", "serving"),
    ),
    # python/sglang/srt/managers/scheduler.py, entrypoints/engine.py, launch_server
    failures=(
        Failure(r"Rank (?P<rank>\d+) scheduler died during initialization \(exit code: (?P<code>-?\d+)\)"),
        Failure(r"Rank (?P<rank>\d+) scheduler is dead"),
        Failure(r"^Exit code: (?P<code>-?\d+)\s*$"),
        Failure(r"Scheduler hit an exception", header=True),
        Failure(
            r"(?:TpModelWorkerClient|DataParallelController|DetokenizerManager|TokenizerManager) hit an exception",
            header=True,
        ),
        Failure(r"Exception in (?:run_tp_server|ModelTpServer|ControllerSingle|ControllerMulti)", header=True),
        Failure(r"Capture cuda graph failed", header=True),
        # http_server.py _wait_and_warmup: the warm-up request failed; SGLang then kills its own process tree
        Failure(r"Initialization failed\. warmup error", header=True),
        # the parent told by a failing child (a crash, never the operator's stop): 0.4's "Received sigquit from a
        # child process", newer "SIGQUIT received. signum=..., frame=.... It usually means one child failed.", and
        # the gRPC server's "Received SIGQUIT from scheduler process. Scheduler failed, shutting down gRPC server."
        Failure(
            r"Received (?:sigquit from a child proces|SIGQUIT from scheduler process\. Scheduler failed)"
            r"|^SIGQUIT received\. [^\n]{0,200}?child failed",
            consequence=True,
        ),
        # the scheduler's own watchdog: a forward pass that never finished; it dumps stacks and kills the server
        Failure(r"Scheduler watchdog timeout|Watchdog timeout \(self\.watchdog_timeout=", "watchdog-timeout"),
    ),
    # sglang/srt/entrypoints/http_server.py: the scheduler answers no health check
    stalls=((r"Health check failed\. Server couldn't get a response from detokenizer", "health-check"),),
    signatures=(
        r"sglang|Scheduler hit an exception|fired up and ready to roll|Load weight (?:begin|end)"
        r"|Capture cuda graph|Prefill batch\b|Decode batch\b|Memory pool end|KV Cache is allocated"
        r"|Received sigquit from a child|Watchdog timeout \(self\.watchdog_timeout=",
    ),
    launch=(r"server_args=ServerArgs\(",),
    # its retry helper in sglang/srt/utils wraps every test: not serving code
    source_mark="/sglang/srt/",
    source_dirs=(r"/sglang/srt/(?!utils\b)",),
    harness_dirs=(r"/sglang/test/",),
    metrics_hint="SGLang needs --enable-metrics",
)
