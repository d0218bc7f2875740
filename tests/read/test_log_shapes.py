"""The log rules over whole runs' shapes: tracebacks and what they end on, wrapper prefixes, the
engines' stats lines, hostile lines (each pattern's worst case, judged), the shapes written from
the engines' and libraries' own formats (loader bars, capture stages, C/C++ errors, listed causes,
cut lines, access logs, ranks failing together), and the tracker linear in failures."""

import re

import pytest
from test_log_failures import one
from test_logrules import track

from cockpit.read.logrules import LogRules, LogTracker, parse

# ----------------------------------------------------------------------------- tracebacks with no failure header

CORPUS = __import__("pathlib").Path(__file__).parents[1] / "data" / "real-logs"


def corpus(name: str) -> list[str]:
    return (CORPUS / name).read_text(encoding="utf-8").splitlines()[2:]


UNCAUGHT = [  # vLLM V0's uniproc executor in a trainer: the interpreter's own traceback, no header
    "Traceback (most recent call last):",
    '  File "/home/user/.conda/envs/re-call/lib/python3.10/site-packages/vllm/worker/worker.py", line 156, in init_device',
    "    _check_if_gpu_supports_dtype(self.model_config.dtype)",
    '  File "/home/user/.conda/envs/re-call/lib/python3.10/site-packages/vllm/worker/worker.py", line 524, in '
    "_check_if_gpu_supports_dtype",
    "    raise ValueError(",
    "ValueError: Bfloat16 is only supported on GPUs with compute capability of at least 8.0. Your Quadro GV100 GPU has "
    "compute capability 7.0.",
]
THROUGHPUT = (
    "INFO 08-08 16:36:33 metrics.py:406] Avg prompt throughput: 10724.5 tokens/s, Avg generation throughput: "
    "651.8 tokens/s, Running: 77 reqs, Swapped: 0 reqs, Pending: 941 reqs"
)


def test_a_traceback_with_no_header_is_a_failure_by_its_exception_line():
    first = track(UNCAUGHT, "vllm").first_failure()
    assert (first.line, first.cause, first.rank) == (6, "exception", None)
    assert [n for n, _ in first.evidence] == [1, 6]
    assert track(UNCAUGHT[1:], "vllm").first_failure().line == 5  # its Traceback line cut: the frames tell it
    named = track(UNCAUGHT[:-1] + ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.50 GiB."], "vllm")
    assert named.first_failure().cause == "oom"


def test_a_log_that_ends_inside_a_traceback_ends_on_a_failure():
    first = track(UNCAUGHT[:4], "vllm").first_failure()
    assert (first.line, first.cause) == (1, "exception")
    assert track(UNCAUGHT[:4] + [THROUGHPUT], "vllm").first_failure() is None


def test_a_traceback_the_run_goes_on_after_is_withdrawn():
    """Ray's deserialization traceback in a V1 server that goes on serving (vllm#15199)."""
    assert track(UNCAUGHT + [THROUGHPUT], "vllm").first_failure() is None
    served = '[2025-08-07 20:17:13] INFO:     127.0.0.1:37734 - "POST /v1/chat/completions HTTP/1.1" 200 OK'
    assert track(UNCAUGHT + [served], "vllm").first_failure() is None
    # another rank's progress does not vouch for the rank whose traceback it was
    torch = ["[rank2]: " + line for line in UNCAUGHT]
    other = "(VllmWorker rank=1 pid=12231) INFO 03-25 21:13:53 [gpu_model_runner.py:1] Model loading took 6.3 GiB"
    assert track(torch + [other], "vllm").first_failure().rank == 2


def test_a_requests_traceback_in_a_server_that_goes_on_is_no_failure():
    """vllm#7309: uvicorn's notice, starlette and uvicorn frames, a chained CancelledError, then the engine's
    throughput lines. Any one of the three tells it is a request's."""
    lines = corpus("vllm-v0-asgi-request-exception-serving-on.log")
    assert track(lines, "vllm").first_failure() is None
    assert not track(lines, "vllm").failures
    traceback_only = [line for line in lines if "metrics.py" not in line]
    assert track(traceback_only, "vllm").first_failure() is None  # the notice and the frames
    no_notice = traceback_only[1:]
    assert track(no_notice, "vllm").first_failure() is None  # the frames alone
    no_frames = [line for line in no_notice if not re.search(r"starlette|uvicorn|anyio", line)]
    assert track(no_frames, "vllm").first_failure() is not None  # nothing says it was a request's
    assert track(no_frames + [THROUGHPUT], "vllm").first_failure() is None  # but the run went on


def test_a_healthy_servers_client_errors_stay_ok():
    t = track(corpus("sglang-ready-then-client-400s.log"))
    assert t.first_failure() is None and t.phase == "ready"


def test_a_bare_killed_after_the_failure_is_its_consequence():
    """SGLang's warm-up failure kills its own process tree; the shell then prints Killed."""
    t = track(corpus("sglang-warmup-403-then-killed.log"))
    assert [(f.cause, f.consequence) for f in t.failures] == [("exception", False), ("killed", True)]
    assert t.first_failure().cause == "exception"
    assert track(["Killed"]).first_failure().cause == "killed"  # alone, it is the cause


def test_an_offline_run_that_finished_then_lost_its_engine_at_exit_is_ok():
    done = (
        "Processed prompts: 100%|##########| 4/4 [00:00<00:00, 10.58it/s, est. speed input: 57.1 toks/s, "
        "output: 169.3 toks/s]"
    )
    died = "ERROR 01-07 20:00:59 [core_client.py:564] Engine core proc EngineCore_DP0 died unexpectedly, shutting down client."
    assert track([done, died], "vllm").first_failure() is None
    assert track([done.replace("4/4", "3/4"), died], "vllm").first_failure().cause == "died"
    assert track([died], "vllm").first_failure().cause == "died"


def test_ctrl_c_and_a_stack_dump_are_no_failure():
    ctrl_c = UNCAUGHT[:-1] + ["KeyboardInterrupt"]
    assert track(ctrl_c, "vllm").first_failure() is None
    dump = [
        "Thread 0x00007f1c2a7fc700 (most recent call first):",  # faulthandler.dump_traceback_later, a live process
        '  File "/usr/lib/python3.10/threading.py", line 320 in wait',
        '  File "/usr/lib/python3.10/threading.py", line 607 in wait',
    ]
    assert track(dump, "vllm").first_failure() is None


def test_an_allocators_oom_warning_names_the_cause_of_the_same_ranks_failure_only():
    """torch's CUDACachingAllocator warns before it raises; alone (a retry that then fit) it is no failure."""
    warn = (
        "[rank1]:[W906 07:46:05.008634648 CUDACachingAllocator.cpp:3933] memory allocation failed with OOM on "
        "device 1 while trying to allocate 4334813184 bytes (free: 3779919872, total: 287431131136)."
    )
    assert one(warn).kind == "warning"
    assert track([warn]).first_failure() is None
    header = "[2026-09-06 07:46:05 DP1 TP1 EP1] Scheduler hit an exception: Traceback (most recent call last):"
    f = track([warn, header]).first_failure()
    assert (f.cause, f.rank, f.evidence[0][0]) == ("oom", 1, 1)
    other = header.replace("DP1 TP1 EP1", "DP0 TP0 EP0")
    assert track([warn, other]).first_failure().cause == "exception"  # another rank's warning says nothing of it


def test_caret_notation_colour_codes_and_vllms_template_notice():
    """A terminal capture writes ESC as "^[": stripped like the byte. vLLM's serving_chat logs one request's
    chat-template failure as "Error in preprocessing prompt inputs" with its traceback: the server goes on."""
    p = parse(
        "^[[1;36m(APIServer pid=679631)^[[0;0m ERROR 08-22 21:36:14 [serving_chat.py:250] Error in "
        "preprocessing prompt inputs"
    )
    assert (p.who, p.level, p.message) == ("APIServer", "ERROR", "Error in preprocessing prompt inputs")
    lines = [
        "(APIServer pid=1) ERROR 08-22 21:36:14 [serving_chat.py:250] Error in preprocessing prompt inputs",
        "(APIServer pid=1) ERROR 08-22 21:36:14 [serving_chat.py:250] Traceback (most recent call last):",
        '(APIServer pid=1) ERROR 08-22 21:36:14 [serving_chat.py:250]   File "/x/chat_utils.py", line 1290, in f',
        "(APIServer pid=1) ERROR 08-22 21:36:14 [serving_chat.py:250] jinja2.exceptions.TemplateError: bad",
    ]
    assert track(lines, engine="vllm").first_failure() is None


@pytest.mark.parametrize(
    "text, rank, level, message",
    [
        # a log viewer's gutter of several columns, then a shipper's time and host before ">>"
        (
            "  |   | 2025-11-04 10:07:58 gpu-node-3 >> [2025-11-04 10:07:58 TP3] Scheduler hit an exception: Traceback",
            3,
            None,
            "Scheduler hit an exception: Traceback",
        ),
        # FastChat's "date | LEVEL | logger | message"
        (
            "2023-10-10 10:10:10 | ERROR | stderr | RuntimeError: CUDA error: an illegal memory access was encountered",
            None,
            "ERROR",
            "RuntimeError: CUDA error: an illegal memory access was encountered",
        ),
        # loguru's default "date | LEVEL    | module:function:line - message"
        (
            "2024-05-01 12:00:00.123 | WARNING  | sglang.srt.server:launch:42 - something slow",
            None,
            "WARNING",
            "something slow",
        ),
        # a wrapper's own time and program, a log viewer's "date time.ms | "
        (
            "[2025-09-25 20:03:20] [/bin/sh]: Traceback (most recent call last):",
            None,
            None,
            "Traceback (most recent call last):",
        ),
        (
            "2025-05-30 18:28:27.890 | RuntimeError: CUDA error: no kernel image",
            None,
            None,
            "RuntimeError: CUDA error: no kernel image",
        ),
    ],
)
def test_wrapper_prefixes_of_several_shapes_are_read_through(text, rank, level, message):
    p = parse(text)
    assert (p.rank, p.level, p.message) == (rank, level, message)


def test_a_crash_behind_pipe_fields_is_a_crash():
    lines = [
        "2023-10-10 10:10:09 | INFO | model_worker | [2023-10-10 10:10:09 TP0] Load weight begin. avail mem=9 GB",
        "2023-10-10 10:10:10 | ERROR | stderr | Traceback (most recent call last):",
        '2023-10-10 10:10:10 | ERROR | stderr |   File "/x/sglang/srt/model_executor/model_runner.py", line 5, in f',
        "2023-10-10 10:10:10 | ERROR | stderr | torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB",
    ]
    t = LogTracker(LogRules("auto"))
    for line in lines:
        t.feed(line)
    first = t.first_failure()
    assert first is not None and first.cause == "oom"


def test_the_engines_stats_lines_say_work_idle_or_frozen():
    from cockpit.read.logrules import progress_of

    rules = LogRules("auto")
    v = (
        "INFO 12-01 10:00:00 [loggers.py:123] Engine 000: Avg prompt throughput: {p} tokens/s, Avg generation "
        "throughput: {g} tokens/s, Running: {n} reqs, Waiting: 0 reqs"
    )
    assert progress_of(rules.classify(v.format(p="0.0", g="12.5", n=3))) == "work"
    assert progress_of(rules.classify(v.format(p="0.0", g="0.0", n=3))) == "frozen"
    assert progress_of(rules.classify(v.format(p="0.0", g="0.0", n=0))) == "idle"
    s = (
        "[2026-01-01 10:00:00 TP0] Decode batch, #running-req: 4, #token: 90, token usage: 0.01, cuda graph: True, "
        "gen throughput (token/s): {g}, #queue-req: 0"
    )
    assert rules.classify(s.format(g="98.20")).stats == (98.2, 4)
    assert progress_of(rules.classify(s.format(g="0.00"))) == "frozen"
    assert progress_of(rules.classify('INFO:     127.0.0.1:1 - "GET /health HTTP/1.1" 200 OK')) == "none"
    assert progress_of(rules.classify('INFO:     127.0.0.1:1 - "POST /v1/completions HTTP/1.1" 200 OK')) == "work"
    # numbers a float cannot be (a hostile line's): no stats line, no crash
    assert rules.classify(v.format(p=".", g="1.2.3", n=3)).stats is None
    assert rules.classify(v.format(p="12.", g=".5", n=3)).stats == (12.5, 3)
    assert rules.classify(s.format(g="...")).stats is None
    assert rules.classify(s.format(g="1.5.2")).stats == (1.5, 4)


# ----------------------------------------------------------------------------- hostile lines, and the gates


def _hostile():
    import importlib.util

    spec = importlib.util.spec_from_file_location("hostile_lines", CORPUS.parent / "hostile_lines.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.timeout(120)  # all of them take ~10 s on the 2-core machine; a quadratic pattern, minutes
def test_every_hostile_line_is_judged():
    """A 64 KiB line drawn from each pattern's worst case (tests/data/hostile_lines.py), classified and
    fed to a tracker, then all of them as one log through explain: crashed, at the first line that
    alone is a failure of its own (not a report of another's), for its cause. A quadratic pattern
    would hang here for minutes (the timeout fails it): the per-line time is
    tests/bench/explain_rate.py's (docs/BENCHMARKS.md)."""
    from cockpit.judge.explain import explain

    hostile = _hostile().HOSTILE
    assert len(hostile) > 500 and all(len(line) == 64 << 10 for line in hostile.values())
    assert {"NAMED_RANK/pg", "ANSI/osc", "HTTP/no-space", "BRACKET_TAG/0/near-miss"} <= hostile.keys()
    alone = []
    for n, (name, line) in enumerate(hostile.items(), 1):
        t = LogTracker(LogRules("auto"))
        ll = t.feed(line)
        assert ll.text == line and t.n == 1, name
        if ll.kind == "failure" and not ll.consequence:
            alone.append((n, ll.cause))
    doc = explain(list(hostile.values()))
    verdict = doc["verdict"]
    assert doc["lines"] == len(hostile) and alone, doc["lines"]
    assert (verdict["name"], verdict["line"], verdict["cause"]) == ("crashed", *alone[0]), (verdict, alone[:3])
    assert verdict["evidence_lines"][0] == alone[0][0]


def test_the_word_gates_never_skip_a_rule_that_matches():
    """`_hot`, `_fail_words` and the engines' `phase_words` let a line skip whole rule families; every string that walks a rule's
    pattern (and matches it), and every line of the real-log corpus, that a family matches holds a word."""
    from cockpit import engines
    from cockpit.read import logrules as L

    rules = L.LogRules("auto")
    families = (
        [rx for rx, _ in L.STALLS]
        + [r.pattern for r in L.FAILURES]
        + [rx for _, rx in L.CAUSE_RX]
        + [L.CUDA_OWN_RX, L.ERROR, L.WARNING]
    )
    phases = {name: [rx for rx, _ in table] for name, table in rules._tables.items()}
    samples = list(_hostile().PATHS.values())
    for path in sorted(CORPUS.glob("*.log")):
        samples += [parse(line).message for line in corpus(path.name)]
    failures = [rx for rx, _ in L.STALLS] + [r.pattern for r in L.FAILURES]
    checked = 0
    for msg in samples:
        if any(rx.search(msg) for rx in families) or L.EXCEPTION_LINE.match(msg):
            assert L._hot(msg), msg
            checked += 1
        if any(rx.search(msg) for rx in failures):
            assert L._fail_words(msg), msg  # the gate of a line at INFO or DEBUG level
        if any(rx.search(msg) for rx, _ in L.STOPS):
            assert L._stop_words(msg), msg  # classify's gate of the stop rules
        for name, table in phases.items():  # each engine's own words (Engine.phase_words) gate its phases
            if any(rx.search(msg) for rx in table):
                assert rules._phase_words(msg) and L._holds_any(msg, engines.get(name).phase_words), (name, msg)
                checked += 1
    assert checked > 500


# ----------------------------------------------------------------------------- shapes from the libraries' own formats


@pytest.mark.parametrize(
    "text, engine, shards",
    [
        # vLLM weight_utils.py: safetensors_weights_iterator, fastsafetensors_weights_iterator, runai_..._iterator
        ("Loading safetensors checkpoint shards:  25% Completed | 1/4 [00:01<00:03,  1.02s/it]", "vllm", (1, 4)),
        ("Loading safetensors using Fastsafetensor loader:   0%|          | 0/9 [00:00<?, ?it/s]", "vllm", (0, 9)),
        (
            "Loading safetensors using Runai Model Streamer:  50%|#####     | 2/4 [00:21<00:21, 10.60s/it]",
            "vllm",
            (2, 4),
        ),
        ("Loading pt checkpoint shards: 100% Completed | 2/2 [00:05<00:00,  2.51s/it]", "sglang", (2, 2)),
        ("Multi-thread loading shards:  40% Completed | 4/10 [00:04<00:06,  1.01s/it]", "vllm", (4, 10)),
        ("(VllmWorker TP1 pid=406) Loading GGUF weights: 30%|###       | 3/10 [00:02<00:05, 1.3it/s]", "auto", (3, 10)),
    ],
)
def test_every_loaders_bar_marks_loading_weights_with_its_shards(text, engine, shards):
    ll = one(text, engine)
    assert (ll.phase, ll.shards, ll.kind) == ("loading weights", shards, "phase")
    assert track([text], "vllm" if engine == "auto" else engine).phase == "loading weights"


def test_capture_stages_move_in_any_order_but_a_slower_rank_does_not_move_them_back():
    begin = "[2026-12-01 10:01:{s:02d} TP{r}] Capture {what}cuda graph begin. This can take up to several minutes."
    end = "[2026-12-01 10:01:{s:02d} TP{r}] Capture {what}cuda graph end. Time elapsed: 1.0 s."
    lines = [
        begin.format(s=0, r=0, what=""),
        end.format(s=1, r=0, what=""),
        begin.format(s=2, r=0, what="draft "),
        end.format(s=3, r=0, what="draft "),
        begin.format(s=4, r=0, what="draft extend "),
    ]
    t = track(lines)
    assert [m.phase for m in t.timeline] == [
        "capturing cuda graphs",
        "cuda graphs captured",
        "capturing draft cuda graphs",
        "draft cuda graphs captured",
        "capturing draft cuda graphs",
    ]
    assert track(lines + [end.format(s=5, r=0, what="draft extend ")]).phase == "draft cuda graphs captured"
    # a stage run again by the same writer moves the phase back into capture
    assert track(lines[:2] + [begin.format(s=9, r=0, what="")]).phase == "capturing cuda graphs"
    # rank 1 printing its first begin after rank 0's end: a slower rank, the run has passed it
    assert track(lines[:2] + [begin.format(s=2, r=1, what="")]).phase == "cuda graphs captured"


@pytest.mark.parametrize(
    "text, cause",
    [
        # flash-attention's CHECK_CUDA (hopper/*.h): fprintf then exit(1), no Python traceback
        (
            "CUDA error (/workspace/flash-attention/hopper/flash_fwd_launch_template.h:166): no kernel image is available "
            "for execution on the device",
            "cuda-error",
        ),
        ("CUDA error (/src/flash_fwd_launch_template.h:180): out of memory", "oom"),
        # vLLM csrc/custom_all_reduce.cuh CUDACHECK: printf then exit(EXIT_FAILURE)
        (
            "Failed: Cuda error /workspace/csrc/custom_all_reduce.cuh:455 'an illegal memory access was encountered'",
            "cuda-error",
        ),
        ("Failed: Cuda error /workspace/csrc/custom_all_reduce.cuh:307 'out of memory'", "oom"),
        # NCCL's CUDACHECK and its other WARNs (src/include/checks.h, debug.cc's "[dev] file:line NCCL WARN")
        ("gpu-1:2949601:2949642 [3] include/alloc.h:103 NCCL WARN Cuda failure 'out of memory'", "oom"),
        (
            "gpu-1:2949601:2949642 [3] enqueue.cc:1556 NCCL WARN Cuda failure 'an illegal memory access was encountered'",
            "cuda-error",
        ),
        (
            "gpu-1:91:205 [0] misc/socket.cc:50 NCCL WARN socketProgress: Connection closed by remote peer gpu-2<55438>",
            "nccl-error",
        ),
        (
            "gpu-1:91:205 [0] transport/net_ib.cc:1294 NCCL WARN NET/IB : Call to ibv_modify_qp failed with error "
            "Connection timed out",
            "nccl-error",
        ),
    ],
)
def test_c_and_cuda_errors_printed_without_a_traceback_are_failures(text, cause):
    ll = one(text)
    assert (ll.kind, ll.cause) == ("failure", cause)
    assert track(["[2026-12-01 10:00:00 TP0] Load weight begin.", text]).first_failure().cause == cause


def test_an_nccl_info_line_is_no_failure():
    assert one("gpu-1:91:205 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC").kind is None


def test_a_list_of_possible_causes_names_none():
    """Ray's ActorDiedError text (python/ray/exceptions.py) lists what might have happened."""
    ray = (
        "(raylet) A worker died or was killed while executing a task by an unexpected system error. Worker exit "
        "type: SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a connection error code 2. End of "
        "file. There are some potential root causes. (1) The process is killed by SIGKILL by OOM killer due to "
        "high memory usage. (2) ray stop --force is called. (3) The worker is crashed unexpectedly due to SIGSEGV "
        "or other unexpected errors."
    )
    assert one(ray).kind != "failure" and one(ray).cause is None
    item = "(3) The worker is crashed unexpectedly due to SIGSEGV or other unexpected errors."
    assert one(item).kind != "failure"
    timeout = (
        "[rank0]:[E1201 10:20:00.1 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE) ran for 600011 milliseconds before timing out."
    )
    first = track([timeout, ray, item], "vllm").first_failure()
    assert (first.rank, first.cause, first.line) == (0, "nccl-timeout", 1)
    # a real segfault is still one
    assert one("Fatal Python error: Segmentation fault").cause == "segfault"


@pytest.mark.parametrize(
    "text, cause",
    [
        ("(RayWorkerWrapper pid=2290) ERROR 12-01 10:30:00 worker_base.py:464] Error executing metho", "exception"),
        ("[2026-12-01 10:00:00 TP3] Scheduler hit an excep", "exception"),
        (
            "[rank2]:[E1201 10:00:00.1 ProcessGroupNCCL.cpp:616] [Rank 2] Watchdog caught collective operation ti",
            "nccl-timeout",
        ),
        ("(EngineCore_0 pid=210) ERROR 12-01 10:02:14 [core.py:700] EngineCore encountered a fatal er", "exception"),
    ],
)
def test_a_failure_line_cut_mid_word_is_still_one(text, cause):
    ll = one(text)
    assert (ll.kind, ll.cause) == ("failure", cause)


def test_a_line_ending_in_a_common_word_is_not_a_cut_failure():
    for text in [
        "INFO 12-01 10:00:00 [core.py:1] Scheduler hit an",
        "prefix Error",
        "the Exception in",
        "[2026-12-01 10:00:00 TP3] the Scheduler h",
    ]:
        assert one(text, "vllm").kind != "failure", text


def test_an_access_log_alone_says_the_server_was_up():
    probe = 'INFO:     10.0.0.9:50122 - "GET /health HTTP/1.1" 200 OK'
    t = track([probe, probe], "vllm")
    assert t.timeline == [] and [(m.phase, m.line) for m in t.reached()] == [("ready", 1)]
    served = 'INFO:     10.0.0.9:50122 - "POST /generate HTTP/1.1" 200 OK'
    assert [m.phase for m in track([served], "vllm").reached()] == ["serving"]
    refused = 'INFO:     10.0.0.9:50122 - "GET /health HTTP/1.1" 503 Service Unavailable'
    assert track([refused], "vllm").reached() == []
    died = "ERROR 11-08 11:01:29 [multiproc_executor.py:135] Worker proc VllmWorker-3 died unexpectedly."
    assert track([probe, died], "vllm").reached() == []  # a log with more than probes is read by its own marks
    # a client's URL is no failure, whatever it says
    assert one('INFO:     1.2.3.4:5 - "GET /Scheduler%20hit%20an%20exception HTTP/1.1" 404 Not Found').kind is None


def test_ranks_failing_the_same_way_in_the_same_second_have_no_first():
    line = (
        "[rank{r}]:[E223 11:14:34.99{r}762039 ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught collective "
        "operation timeout: WorkNCCL(SeqNum=91885, OpType=ALLREDUCE) ran for 600037 milliseconds before timing out."
    )
    t = track([line.format(r=r) for r in (4, 0, 1, 2, 3, 5, 6, 7)])
    first = t.first_failure()
    assert (first.rank, first.together, first.cause) == (None, tuple(range(8)), "nccl-timeout")
    assert t.all_ranks(first.together)
    # NCCL said the communicator has 16 ranks: eight are not all of them
    nccl = "node:1:2 [0] NCCL INFO ncclCommInitRank comm 0x55 rank 0 nranks 16 cudaDev 0 - Init COMPLETE"
    t16 = track([nccl] + [line.format(r=r) for r in range(8)])
    assert not t16.all_ranks(t16.first_failure().together)
    # another second: the first is named
    later = line.format(r=5).replace("11:14:34", "11:14:39")
    assert track([line.format(r=4), later]).first_failure().rank == 4


def test_describe_says_ranks_that_failed_together():
    from cockpit.judge.explain import describe, explain

    text = describe(explain(corpus("torch-eight-ranks-watchdog-same-second.log")))
    assert text[2].startswith("verdict: crashed: all 8 ranks together, cause nccl-timeout (line 1, 02-23 11:14:34)")
    text = describe(explain(corpus("torch-nccl-timeouts-no-engine.log")))
    assert text[2].startswith("verdict: crashed: ranks 0-2 together, cause nccl-timeout")


# ----------------------------------------------------------------------------- linear in failures


def test_failures_piling_up_keep_the_tracker_bounded():
    """Tracebacks with no header on every rank, each followed by another rank's progress: the pending
    ones are withdrawn by their own rank's progress only, and what is kept stays bounded."""
    from cockpit.read.logrules import MAX_EVIDENCE, MAX_FAILURES

    lines = []
    for i in range(3000):
        r = i % 8
        lines += [
            f"[rank{r}]: Traceback (most recent call last):",
            f'[rank{r}]:   File "/x/y.py", line {i}, in f',
            f"[rank{r}]: ValueError: boom {i}",
            f"[rank{(r + 1) % 8}]: Load weight begin.",
        ]
    t = track(lines, "sglang")
    assert len(t.failures) <= MAX_FAILURES + 4 and all(len(f.evidence) <= MAX_EVIDENCE for f in t.failures)
    assert sum(map(len, t._pending.values())) <= len(t.failures)
    # the last one is rank 7's (r=7 at i=2999); rank 0's line after it withdrew every rank 0 traceback
    assert all(f.rank != 0 for f in t.failures[-8:]) and t.first_failure() is not None
    assert track(lines + ["Load weight begin."], "sglang").first_failure() is None  # a line of no rank: all went on
