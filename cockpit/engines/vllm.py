"""vLLM: `vllm serve` or `python -m vllm.entrypoints...`, ranks titled `VLLM::Worker_TP0` (older
`VllmWorker-N`), log lines prefixed `(VllmWorker rank=3 pid=406) ERROR 03-25 21:13:53 [file.py:374] `
(docs/diagnosis.md lists the sources of each string)."""

from cockpit.engines.base import LOADER_BAR, Engine, Failure

ENGINE = Engine(
    name="vllm",
    title="vLLM",
    default_port=8000,
    metrics_path="/metrics",
    metrics={  # older names last
        "generation_tokens": ("vllm:generation_tokens_total",),
        "prompt_tokens": ("vllm:prompt_tokens_total",),
        "running": ("vllm:num_requests_running",),
        "waiting": ("vllm:num_requests_waiting",),
        "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    },
    titles=("VLLM::",),
    worker_title="VllmWorker",
    launchers=("vllm.entrypoints",),
    shm_prefixes=("vllm_",),
    packages=("vllm",),
    prefix="writer",
    writers=(
        r"(?:Vllm\w*|VLLM\w*|(?:DP)?EngineCore\w*|A[Pp][Ii]Server\w*|RayWorkerWrapper|Worker(?:_\w+)?"
        r"|WorkerProc|LLMEngine|MultiprocExecutor)(?: |$)"
    ),
    phase_words=(
        "aptur",
        "oad",
        "KV ",
        "HTTP/",
        "took",
        "Uvicorn",
        "Application startup",
        "LLM engine",
        "torch.compile",
        "Compiling a graph",
        "Dynamo",
        "blocks",
        "Maximum concurrency",
        "init engine",
        "API server",
        "throughput",
    ),
    phases=(
        (r"Initializing an? (?:V1 )?LLM engine", "starting"),
        (r"Starting to load model|" + LOADER_BAR, "loading weights"),
        (r"Loading weights took|Model loading took|Loading model weights took", "weights loaded"),
        (r"torch\.compile take|torch\.compile took|Compiling a graph for|Dynamo bytecode transform time", "compiling"),
        (r"Available KV cache memory|GPU KV cache size|# (?:GPU|cuda) blocks|Maximum concurrency for", "kv cache"),
        (r"Capturing CUDA graph|Capturing cudagraphs|Capturing the model for CUDA graphs", "capturing cuda graphs"),
        (r"Graph capturing finished", "cuda graphs captured"),
        (r"init engine \(profile, create kv cache, warmup model\) took", "engine initialized"),
        (r"Starting vLLM API server|Uvicorn running on", "port open"),
        (r"Application startup complete", "ready"),
        (r"Avg prompt throughput|\"POST /v1/[^\s\"]+ HTTP/[\d.]+\" 200", "serving"),
    ),
    # vllm/v1/executor/multiproc_executor.py, v1/engine/core.py, executor/multiproc_worker_utils.py
    failures=(
        Failure(r"WorkerProc hit an exception|WorkerProc failed to start", header=True),
        Failure(r"EngineCore failed to start", header=True),
        Failure(r"EngineCore hit an exception", header=True),  # V1 core.py, run_engine_core (0.7-0.9)
        # V0 worker_base.py execute_method (Ray and multiproc workers): logger.exception, the traceback follows
        Failure(r"Error executing method \S+\. This might cause deadlock in distributed execution", header=True),
        Failure(r"EngineCore encountered a fatal error", consequence=True, header=True),
        Failure(r"Exception in worker \S+ while processing method", header=True),
        Failure(
            r"Worker proc (?:VllmWorker|Worker)[-_](?:TP)?(?P<rank>\d+) died unexpectedly"
            r"(?: \(exit code: (?P<code>-?\d+)\))?",
            "died",
            consequence=True,
        ),
        Failure(r"Worker \w+ pid \d+ died, exit code: (?P<code>-?\d+)", "died", consequence=True),
        # V1 core_client.py: the front end saw its engine process go (whatever ended it is told elsewhere, if at all)
        Failure(r"Engine core proc \S+ died unexpectedly", "died", consequence=True),
        Failure(
            r"Engine core initialization failed|Engine process failed to start"
            r"|WorkerProc initialization failed due to an exception",
            consequence=True,
        ),
        Failure(r"EngineDeadError|Engine loop has died", consequence=True),  # also AsyncEngineDeadError, ...
        Failure(r"Mul(?:it|ti)procExecutor got fatal signal", consequence=True),
    ),
    stalls=(
        # vllm/distributed/device_communicators/shm_broadcast.py: a rank has not read the last broadcast
        (r"No available shared memory broadcast block found in \d+ seconds?", "shm-broadcast"),
        # vllm/executor/ray_utils.py: Ray cannot place the workers (no free GPU, wrong node IP); repeats until
        # it can, which may be never
        (r"Waiting for creating a placement group of specs for \d+ seconds", "placement-group"),
    ),
    signatures=(
        r"vllm|vLLM|VllmWorker|EngineCore|Avg prompt throughput|Graph capturing finished"
        r"|Model loading took|GPU KV cache size|shm_broadcast|WorkerProc",
    ),
    launch=(r"vLLM API server version", r"non-default args:"),
    # `vllm bench` comes in through vllm/entrypoints/cli: not serving code
    source_mark="/vllm/",
    source_dirs=(r"/vllm/(?!vllm/|benchmarks/|entrypoints/cli/)",),
    harness_dirs=(r"/vllm/benchmarks/",),
)
