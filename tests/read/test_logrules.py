"""The log rules on the strings SGLang, vLLM and torch really print (each quoted from a public issue or
the engines' source; tests/data/real-logs holds whole excerpts)."""

import re

import pytest

from cockpit.read.logrules import LogRules, LogTracker, PhaseRule, detect_engine, parse

# ----------------------------------------------------------------------------- prefixes


@pytest.mark.parametrize(
    "text, rank, who, time",
    [
        (
            "[2025-04-21 04:13:43 TP3] Scheduler hit an exception: Traceback (most recent call last):",
            3,
            "TP3",
            "2025-04-21 04:13:43",
        ),
        (
            "[2025-05-27 04:36:06 DP1 TP4] Scheduler hit an exception: Traceback (most recent call last):",
            4,
            "DP1 TP4",
            "2025-05-27 04:36:06",
        ),
        (
            "[2026-05-08 15:56:27 DP5 TP5 EP5] Scheduler hit an exception: Traceback (most recent call last):",
            5,
            "DP5 TP5 EP5",
            "2026-05-08 15:56:27",
        ),
        (
            "[2025-09-22 10:25:22 DP1 PP1] Capture cuda graph begin. This can take up to several minutes. avail mem=8.73 GB",
            1,
            "DP1 PP1",
            "2025-09-22 10:25:22",
        ),  # no TP tag: the PP rank names the process
        ("[12-16 14:27:10] Exit code: -9", None, None, "12-16 14:27:10"),  # newer SGLang: no year
        (
            "[04:40:55 TP0] Decode batch. #running-req: 2, #token: 4078, token usage: 0.00, gen throughput (token/s): 447.31, #queue-req: 0",
            0,
            "TP0",
            "04:40:55",
        ),  # SGLang 2024: time only
        (
            "(VllmWorker rank=1 pid=12231) ERROR 03-25 21:13:53 multiproc_executor.py:374] WorkerProc hit an exception: %s",
            1,
            "VllmWorker rank=1",
            "03-25 21:13:53",
        ),
        (
            "(VllmWorker TP1 pid=406) INFO 04-21 04:13:43 [gpu_model_runner.py:1] Starting to load model",
            1,
            "VllmWorker TP1",
            "04-21 04:13:43",
        ),
        (
            "(Worker_TP1 pid=56679) ERROR 08-14 02:42:27 [multiproc_executor.py:923] WorkerProc failed to start.",
            1,
            "Worker_TP1",
            "08-14 02:42:27",
        ),
        (
            "(Worker_PP1_TP2 pid=130) INFO 08-14 02:42:27 [gpu_model_runner.py:1] Model loading took 1 GiB",
            2,
            "Worker_PP1_TP2",
            "08-14 02:42:27",
        ),
        (
            "(EngineCore_DP0 pid=77352) INFO 10-22 09:43:49 [shm_broadcast.py:466] No available shared memory broadcast block found in 60 seconds.",
            None,
            "EngineCore_DP0",
            "10-22 09:43:49",
        ),  # the engine core is no rank
        (
            "(APIServer pid=3646) INFO 05-19 10:13:11 [loggers.py:271] Engine 000: Avg prompt throughput: 0.0 tokens/s",
            None,
            "APIServer",
            "05-19 10:13:11",
        ),
        (
            "[rank2]:[E1001 16:06:04.537131842 ProcessGroupNCCL.cpp:607] [Rank 2] Watchdog caught collective operation timeout",
            2,
            "rank2",
            "10-01 16:06:04",
        ),
        (
            "[rank3]:[E421 04:13:43.426633564 ProcessGroupGloo.cpp:143] Rank 3 successfully reached monitoredBarrier",
            3,
            "rank3",
            "04-21 04:13:43",
        ),  # torch writes the month unpadded
        (
            "\x1b[1;36m(VllmWorker rank=5 pid=33503)\x1b[0;0m ERROR 03-06 06:49:30 [multiproc_executor.py:375] WorkerProc hit an exception: %s",
            5,
            "VllmWorker rank=5",
            "03-06 06:49:30",
        ),  # vLLM's cyan prefix on a terminal
        ("sglang-1  | [2025-11-01 16:50:36 TP1] sglang is using nccl==2.27.3", 1, "TP1", "2025-11-01 16:50:36"),
        (
            "2026-03-11T17:57:10.976518836Z (EngineCore_DP0 pid=469) ERROR 03-11 17:57:10 [multiproc_executor.py:783] WorkerProc failed to start.",
            None,
            "EngineCore_DP0",
            "03-11 17:57:10",
        ),  # docker logs --timestamps
        (
            "(RayWorkerWrapper pid=4009) [rank1]:[E ProcessGroupNCCL.cpp:563] [Rank 1] Watchdog caught collective operation timeout",
            1,
            "RayWorkerWrapper",
            None,
        ),
        (
            "sglang-0:100:1012 [1] NCCL INFO ncclCommInitRank comm 0x55c8b7ed9050 rank 1 nranks 16 cudaDev 1 - Init COMPLETE",
            None,
            None,
            None,
        ),  # NCCL's [device] is no rank prefix
        (
            "[2026-11-30 10:00:00 TP3] Load weight begin. avail mem=94.20 GB",
            3,
            "TP3",
            "2026-11-30 10:00:00",
        ),  # the simulator
        (
            "(Worker_TP2 pid=130) INFO 11-30 10:00:00 [loader.py:1] Starting to load model",
            2,
            "Worker_TP2",
            "11-30 10:00:00",
        ),
        # vLLM 0.10: the engine core's prefix in front of its worker's; the innermost writer wrote it
        (
            "(EngineCore_0 pid=675221) (VllmWorker TP1 pid=675229) INFO 08-25 11:01:23 [default_loader.py:267] Loading weights "
            "took 1.13 seconds",
            1,
            "VllmWorker TP1",
            "08-25 11:01:23",
        ),
        (
            "[gpu_id=1] Load weight end. type=Qwen2ForCausalLM, dtype=torch.bfloat16, avail mem=15.95 GB",
            1,
            "gpu_id=1",
            None,
        ),  # SGLang 0.2
        (
            "[rank3]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:3763, remote process exited",
            3,
            "rank3",
            None,
        ),  # torchrun's per-rank prefix
        # a site's own formatter, NVIDIA NIM's
        (
            "2024-12-19 21:40:35 ERROR 56542 [async_llm_engine.py:64] RuntimeError: Error in model execution: CUDA error: an "
            "illegal memory access was encountered^M",
            None,
            None,
            "2024-12-19 21:40:35",
        ),
        (
            "ERROR 2025-07-21 14:34:24.934 async_trtllm_engine_factory.py:62] Bfloat16 is only supported on GPUs with compute "
            "capability of at least 8.0.",
            None,
            None,
            "2025-07-21 14:34:24",
        ),
        # vLLM's cyan prefix whose ESC bytes a copy turned into U+FFFD
        (
            "\ufffd[36m(WorkerDict pid=129668)\ufffd[0m Fatal Python error: Floating point exception",
            None,
            "WorkerDict",
            None,
        ),
        # a Ray actor running SGLang: Ray's prefix is an outer layer, SGLang's own names the writer
        (
            "(SGLangEngine pid=6680) [2025-09-22 14:35:35 DP1 TP3] Scheduler hit an exception: Traceback (most recent call "
            "last):",
            3,
            "DP1 TP3",
            "2025-09-22 14:35:35",
        ),
        ("(SGLangEngine pid=6680)     scheduler.event_loop_overlap()", None, None, None),
        # torch's F (fatal) level
        (
            "[rank2]:[F1019 01:14:03.356851194 ProcessGroupNCCL.cpp:1224] [PG 3 Rank 2] msg",
            2,
            "rank2",
            "10-19 01:14:03",
        ),
    ],
)
def test_prefixes_name_the_writer_its_rank_and_time(text, rank, who, time):
    p = parse(text)
    assert (p.rank, p.who, p.time) == (rank, who, time)
    assert parse(text).rank == rank


def test_the_message_is_the_text_after_every_prefix():
    assert (
        parse(
            '(VllmWorker rank=1 pid=12231) ERROR 03-25 21:13:53 multiproc_executor.py:374]   File "x.py", line 1'
        ).message
        == '  File "x.py", line 1'
    )  # a traceback frame keeps its indentation
    assert parse("[2025-04-21 04:13:43 TP3] Load weight end. type=X").message == "Load weight end. type=X"
    assert parse(
        "eap-llm-server-on-arc  | ERROR 11-08 11:01:29 [multiproc_executor.py:135] Worker proc "
        "VllmWorker-3 died unexpectedly, shutting down executor."
    ).message.startswith("Worker proc VllmWorker-3")
    assert parse("│ ERROR 09-27 06:46:46 engine.py:157] RuntimeError: CUDA error: x   │").level == "ERROR"
    assert (
        parse("[rank3]:     return dist._verify_params_across_processes(process_group, tensors, logger)").message
        == "    return dist._verify_params_across_processes(process_group, tensors, logger)"
    )
    site = parse("2024-12-19 21:40:35 ERROR 56542 [async_llm_engine.py:64] RuntimeError: Error in model execution^M")
    assert (site.level, site.message) == ("ERROR", "RuntimeError: Error in model execution")
    nim = parse("ERROR 2025-07-21 14:34:24.934 async_trtllm_engine_factory.py:62] Bfloat16 is only supported")
    assert (nim.level, nim.message) == ("ERROR", "Bfloat16 is only supported")


# ----------------------------------------------------------------------------- phases


@pytest.mark.parametrize(
    "engine, text, phase",
    [
        ("sglang", "[2025-02-22 08:19:45 TP26] Init torch distributed begin.", "starting"),
        ("sglang", "[2025-02-22 08:19:45 TP26] Load weight begin. avail mem=78.38 GB", "loading weights"),
        (
            "sglang",
            "[2025-02-22 08:21:43 TP26] Load weight end. type=DeepseekV3ForCausalLM, dtype=torch.bfloat16, avail mem=37.21 GB",
            "weights loaded",
        ),
        (
            "sglang",
            "[2025-06-19 15:12:27] KV Cache is allocated. #tokens: 132681, K size: 9.11 GB, V size: 9.11 GB",
            "kv cache",
        ),
        ("sglang", "[2024-10-22 06:31:49 TP0] Memory pool end. avail mem=8.38 GB", "kv cache"),
        (
            "sglang",
            "[2025-06-19 15:12:27] Capture cuda graph begin. This can take up to several minutes. avail mem=2.85 GB",
            "capturing cuda graphs",
        ),
        (
            "sglang",
            "Capturing batches (avail_mem=2.85 GB):   0%|          | 0/4 [00:00<?, ?it/s]",
            "capturing cuda graphs",
        ),
        (
            "sglang",
            "[2025-04-29 16:19:34 TP7] Capture cuda graph end. Time elapsed: 56.90 s. mem usage=6.22 GB. avail mem=5.61 GB.",
            "cuda graphs captured",
        ),
        (
            "sglang",
            "[2026-05-08 15:55:20] INFO:     Uvicorn running on http://0.0.0.0:30000 (Press CTRL+C to quit)",
            "port open",
        ),
        ("sglang", "[2026-05-08 15:55:20] The server is fired up and ready to roll!", "ready"),
        (
            "sglang",
            "[2025-02-27 04:46:39 TP0] Decode batch. #running-req: 8, #token: 62531, token usage: 0.12, gen throughput "
            "(token/s): 186.64, #queue-req: 0",
            "serving",
        ),
        (
            "sglang",
            "[2026-04-05 20:02:51] Prefill batch, #new-seq: 1, #new-token: 158, #cached-token: 0, token usage: 0.08",
            "serving",
        ),
        (
            "sglang",
            '[2026-04-05 20:02:51] INFO:     127.0.0.1:40052 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
            "serving",
        ),
        (
            "vllm",
            "(VllmWorkerProcess pid=353) INFO 11-27 02:03:09 model_runner.py:1072] Starting to load model "
            "/models/Meta-Llama-3.1-70B-Instruct...",
            "loading weights",
        ),
        (
            "vllm",
            "(Worker_TP0 pid=34322) INFO 05-06 20:59:57 [default_loader.py:384] Loading weights took 24.84 seconds",
            "weights loaded",
        ),
        (
            "vllm",
            "(Worker_TP0 pid=34322) INFO 05-06 20:59:59 [gpu_model_runner.py:4879] Model loading took 12.66 GiB memory "
            "and 31.657031 seconds",
            "weights loaded",
        ),
        (
            "vllm",
            "(VllmWorkerProcess pid=185224) INFO 03-02 17:57:18 [model_runner.py:1117] Loading model weights took "
            "8.4050 GB and 81.775431 seconds",
            "weights loaded",
        ),
        ("vllm", "INFO 06-22 02:54:47 [monitor.py:34] torch.compile takes 18.40 s in total", "compiling"),
        (
            "vllm",
            "(Worker_TP0 pid=34322) INFO 05-06 21:00:16 [backends.py:1128] Dynamo bytecode transform time: 3.54 s",
            "compiling",
        ),
        ("vllm", "INFO 06-22 02:54:47 [kv_cache_utils.py:716] GPU KV cache size: 251,920 tokens", "kv cache"),
        (
            "vllm",
            "INFO 07-18 12:26:29 distributed_gpu_executor.py:57] # GPU blocks: 464716, # CPU blocks: 16384",
            "kv cache",
        ),
        ("vllm", "Capturing CUDA graphs: 100%|██████████| 67/67 [00:14<00:00,  4.71it/s]", "capturing cuda graphs"),
        (
            "vllm",
            "(VllmWorkerProcess pid=3311321) INFO 07-18 12:26:31 model_runner.py:1402] Capturing the model for CUDA "
            "graphs. This may lead to unexpected consequences if the model is not static.",
            "capturing cuda graphs",
        ),
        (
            "vllm",
            "INFO 06-22 02:55:02 [gpu_model_runner.py:2196] Graph capturing finished in 14 secs, took 0.84 GiB",
            "cuda graphs captured",
        ),
        (
            "vllm",
            "INFO 06-22 02:55:02 [core.py:172] init engine (profile, create kv cache, warmup model) took 44.51 seconds",
            "engine initialized",
        ),
        (
            "vllm",
            "(APIServer pid=460954) INFO 12-18 06:01:05 [api_server.py:1945] Starting vLLM API server 0 on "
            "http://0.0.0.0:8080",
            "port open",
        ),
        ("vllm", "INFO 03-27 23:19:15 api_server.py:958] Starting vLLM API server on http://0.0.0.0:8000", "port open"),
        ("vllm", "INFO:     Application startup complete.", "ready"),
        (
            "vllm",
            "(APIServer pid=3646) INFO 05-19 10:13:11 [loggers.py:271] Engine 000: Avg prompt throughput: 0.0 tokens/s, "
            "Avg generation throughput: 1055.3 tokens/s, Running: 18 reqs, Waiting: 43 reqs, GPU KV cache usage: 95.9%",
            "serving",
        ),
        (
            "vllm",
            "INFO 03-18 09:04:46 [metrics.py:481] Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 0.4 "
            "tokens/s, Running: 2 reqs, Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache usage: 0.6%, CPU KV cache usage: 0.0%.",
            "serving",
        ),
        ("vllm", 'INFO:     127.0.0.1:45354 - "POST /v1/completions HTTP/1.1" 200 OK', "serving"),
    ],
)
def test_phases_the_engines_print(engine, text, phase):
    rules = LogRules(engine)
    assert rules.phase_of(text) == phase
    assert rules.classify(text).phase == phase


def test_a_health_check_is_no_serving_and_an_unrelated_kv_line_no_phase():
    assert (
        LogRules("sglang").phase_of('[2025-03-14 02:15:58] INFO:     10.25.28.11:47260 - "GET /health HTTP/1.1" 200 OK')
        is None
    )
    assert (
        LogRules("vllm").phase_of(
            "WARNING 06-22 02:54:47 [utils.py:101] Unable to detect current VLLM config. "
            "Defaulting to NHD kv cache layout."
        )
        is None
    )


def test_shards_of_the_loading_bar():
    ll = LogRules("vllm").classify(
        "Loading safetensors checkpoint shards:  56% Completed | 5/9 [00:13<00:11,  2.87s/it]"
    )
    assert (ll.phase, ll.shards) == ("loading weights", (5, 9))


def test_a_layouts_own_phase_wins_over_the_engines():
    rules = LogRules("sglang", [PhaseRule(re.compile(r"Load weight end"), "my phase")])
    assert rules.phase_of("[2025-02-22 08:21:43 TP26] Load weight end. type=X") == "my phase"


# ----------------------------------------------------------------------------- engines


def test_engine_auto_decides_from_the_lines():
    rules = LogRules("auto")
    assert rules.detected is None
    rules.classify("[2025-02-22 08:19:45 TP26] Load weight begin. avail mem=78.38 GB")
    assert rules.detected == "sglang"
    # SGLang's port-open reading of uvicorn's line, not vLLM's "ready"
    assert rules.classify("[2026-05-08 15:55:20] INFO:     Application startup complete.").phase == "port open"
    vllm = LogRules("auto")
    vllm.classify(
        "(Worker_TP0 pid=34322) INFO 05-06 20:59:57 [default_loader.py:384] Loading weights took 24.84 seconds"
    )
    assert vllm.detected == "vllm"
    assert vllm.classify("INFO:     Application startup complete.").phase == "ready"


def test_detect_engine_from_a_block_of_lines():
    assert (
        detect_engine(
            [
                "[2025-04-21 04:13:43 TP3] Scheduler hit an exception: Traceback (most recent call last):",
                '  File "/x/site-packages/vllm/utils.py", line 928, in _patched_set_stream',
            ]
        )
        == "sglang"
    )
    assert detect_engine(["(EngineCore_DP0 pid=1) INFO 10-22 09:43:49 [core.py:1] x"]) == "vllm"
    assert (
        detect_engine(
            [
                "[rank0]:[E1001 16:06:04.539355394 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught "
                "collective operation timeout"
            ]
        )
        is None
    )


# ----------------------------------------------------------------------------- a run read in order

OOM_RANK3_THEN_NCCL = [
    "[2025-04-21 04:13:40 TP1] Load weight end. type=DeepseekV3ForCausalLM, dtype=torch.bfloat16, avail mem=37.21 GB",
    "[2025-04-21 04:13:41 TP3] Capture cuda graph begin. This can take up to several minutes. avail mem=8.73 GB",
    "[2025-04-21 04:13:43 TP1] Scheduler hit an exception: Traceback (most recent call last):",
    '  File "/sgl-workspace/sglang/python/sglang/srt/distributed/parallel_state.py", line 255, in __init__',
    "RuntimeError: NCCL error: unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
    "[2025-04-21 04:13:43 TP3] Scheduler hit an exception: Traceback (most recent call last):",
    '  File "/sgl-workspace/sglang/python/sglang/srt/model_executor/cuda_graph_runner.py", line 269, in __init__',
    "    raise Exception(",
    "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 448.00 MiB.",
    "[2025-04-21 04:13:43] Received sigquit from a child process. It usually means the child failed.",
]


def track(lines, engine="sglang"):
    t = LogTracker(LogRules(engine))
    for line in lines:
        t.feed(line)
    return t


def test_the_root_cause_wins_over_the_consequences_that_came_first():
    """Rank 1's NCCL error is printed before rank 3's OOM it came from; the OOM names the run's failure."""
    t = track(OOM_RANK3_THEN_NCCL)
    first = t.first_failure()
    assert (first.rank, first.cause, first.line) == (3, "oom", 6)
    assert [f.cause for f in t.failures] == ["nccl-error", "oom", "exception"]
    assert t.failures[-1].consequence


def test_a_tracebacks_last_line_names_the_cause_of_its_header():
    t = track(OOM_RANK3_THEN_NCCL[5:9])
    assert len(t.failures) == 1
    f = t.failures[0]
    assert (f.rank, f.cause) == (3, "oom")
    assert [n for n, _ in f.evidence] == [1, 4]


def test_a_vllm_workers_traceback_stays_with_its_worker():
    t = track(
        [
            "(VllmWorker rank=5 pid=33503) ERROR 03-06 06:49:30 [multiproc_executor.py:375] WorkerProc hit an exception: %s",
            "(VllmWorker rank=5 pid=33503) ERROR 03-06 06:49:30 [multiproc_executor.py:375] Traceback (most recent call last):",
            "(VllmWorker rank=2 pid=33500) INFO 03-06 06:49:30 [x.py:1] something else",
            "(VllmWorker rank=5 pid=33503) ERROR 03-06 06:49:30 [multiproc_executor.py:375] RuntimeError: CUDA error: an "
            "illegal memory access was encountered",
        ],
        "vllm",
    )
    first = t.first_failure()
    assert (first.rank, first.cause) == (5, "cuda-error")


def test_a_death_notice_names_the_rank_the_root_cause_line_does_not():
    t = track(
        [
            "(EngineCore pid=12244) ERROR 07-15 21:01:01 [core.py:1240] RuntimeError: Worker failed with error 'CUDA error: "
            "an illegal memory access was encountered",
            "(EngineCore pid=12244) ERROR 07-15 21:01:01 [multiproc_executor.py:284] Worker proc VllmWorker-0 died "
            "unexpectedly (exit code: -15), shutting down executo",
        ],
        "vllm",
    )
    first = t.first_failure()
    assert (first.rank, first.cause) == (0, "cuda-error")


def test_the_timeline_only_moves_forward_and_marks_sglangs_warmup():
    t = track(
        [
            "[2025-02-22 08:19:45 TP0] Load weight begin. avail mem=78.38 GB",
            "[2025-02-22 08:21:43 TP0] Load weight end. type=X",
            "[2025-02-22 08:21:44 TP1] Load weight begin. avail mem=78.38 GB",  # a slower rank
            "[2025-02-22 08:22:00] INFO:     Uvicorn running on http://0.0.0.0:30000 (Press CTRL+C to quit)",
            "[2025-02-22 08:22:01 TP0] Prefill batch. #new-seq: 1, #new-token: 7, #cached-token: 0",
            "[2025-02-22 08:22:02] The server is fired up and ready to roll!",
            "[2025-02-22 08:23:00 TP0] Decode batch. #running-req: 1, #token: 64",
        ]
    )
    assert [(m.phase, m.line) for m in t.timeline] == [
        ("loading weights", 1),
        ("weights loaded", 2),
        ("port open", 4),
        ("warmup", 5),
        ("ready", 6),
        ("serving", 7),
    ]
    assert t.timeline[0].time == "2025-02-22 08:19:45"
    assert t.ranks == {0, 1}


def test_a_relaunch_starts_the_post_mortem_over():
    t = track(
        OOM_RANK3_THEN_NCCL
        + [
            "[2025-04-21 05:00:00] server_args=ServerArgs(model_path='/models/x', tp_size=8)",
            "[2025-04-21 05:00:10 TP0] Load weight begin. avail mem=78.38 GB",
        ]
    )
    assert t.failures == [] and t.first_failure() is None
    assert [m.phase for m in t.timeline] == ["loading weights"]


def test_stalled_only_when_nothing_moves_after_the_tell():
    shm = (
        "(EngineCore_DP0 pid=77352) INFO 10-22 09:43:49 [shm_broadcast.py:466] No available shared memory broadcast "
        "block found in 60 seconds."
    )
    serving = (
        "(APIServer pid=1) INFO 10-22 09:44:49 [loggers.py:271] Engine 000: Avg prompt throughput: 0.0 tokens/s, "
        "Avg generation throughput: 12.0 tokens/s"
    )
    assert track([serving, shm], "vllm").stalled()
    assert not track([shm, serving], "vllm").stalled()  # a slow compile, then it went on
    died = "ERROR 07-04 17:35:16 [multiproc_executor.py:140] Worker proc VllmWorker-1 died unexpectedly, shutting down executor."
    assert not track([shm, died, shm], "vllm").stalled()  # a crash is no stall


def test_the_main_processs_next_line_ends_its_traceback():
    """SGLang with one rank names no writer: its traceback is the unprefixed lines, not the log's rest."""
    t = track(
        [
            "[2025-06-19 15:12:27] Scheduler hit an exception: Traceback (most recent call last):",
            '  File "/x/sglang/srt/managers/scheduler.py", line 2546, in run_scheduler_process',
            "ValueError: boom",
            '[2025-06-19 15:12:28] INFO:     127.0.0.1:40052 - "POST /generate HTTP/1.1" 200 OK',
            "RuntimeError: CUDA error: an illegal memory access was encountered",
        ]
    )
    assert [(f.line, f.cause) for f in t.failures] == [(1, "exception"), (5, "cuda-error")]
    assert [n for n, _ in t.failures[0].evidence] == [1, 3]  # the ValueError is the first one's last word
