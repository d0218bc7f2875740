"""The log rules on what a run's end and a failure's cause look like beyond a crash's header: a deliberate
stop the server says it received (its shutdown's failures are no crash), another program's traceback in the
server's log (a finding), a failure header glued mid-line by interleaved writes, torch's other watchdog words,
and CUDA's own error strings (issue 48). Each line quoted from a public source, named beside it."""

import pytest
from test_log_failures import one
from test_logrules import track

# vLLM V1's shutdown after the operator's SIGTERM (gpustack/gpustack#5740, as posted)
VLLM_STOP = [
    "(APIServer pid=1) INFO 07-07 19:14:41 [core_client.py:657] [shutdown] MPClient: stopping engine manager",
    "(EngineCore pid=99) INFO 07-07 19:14:41 [core.py:1214] [shutdown] EngineCore: trigger received signal=SIGTERM",
    "(APIServer pid=1) INFO 07-07 19:14:41 [core_client.py:659] [shutdown] MPClient: engine manager stopped",
]
# the output handler's traceback as the API server prints it (snowflakedb/ArcticInference#223, as posted; its
# first line's words are vLLM's logger.exception in v1/engine/async_llm.py, quoted in vllm-project/vllm#49000):
# what vllm-project/vllm#48745 reports after a graceful shutdown, and what a real engine death prints too
OUTPUT_HANDLER = [
    "(APIServer pid=3314) ERROR 11-10 04:36:43 [async_llm.py:430] AsyncLLM output_handler failed.",
    "(APIServer pid=3314) ERROR 11-10 04:36:43 [async_llm.py:430] Traceback (most recent call last):",
    '(APIServer pid=3314) ERROR 11-10 04:36:43 [async_llm.py:430]   File "/usr/local/lib/python3.12/dist-packages/'
    'vllm/v1/engine/core_client.py", line 843, in get_output_async',
    "(APIServer pid=3314) ERROR 11-10 04:36:43 [async_llm.py:430]     raise self._format_exception(outputs) from None",
    "(APIServer pid=3314) ERROR 11-10 04:36:43 [async_llm.py:430] vllm.v1.engine.exceptions.EngineDeadError: "
    "EngineCore encountered an issue. See stack trace (above) for the root cause.",
    "(APIServer pid=1) INFO:     Shutting down",
]


@pytest.mark.parametrize(
    "text, stop",
    [
        (VLLM_STOP[1], "SIGTERM"),
        # vllm-project/vllm#43707: the operator's Ctrl+C
        (
            "^C(EngineCore pid=3946143) INFO 05-26 19:19:56 [core.py:1155] [shutdown] EngineCore: trigger received "
            "signal=SIGINT",
            "SIGINT",
        ),
        (
            "(APIServer pid=3945527) INFO 05-26 19:19:56 [launcher.py:100] [shutdown] API server: shutdown triggered",
            "shutdown",
        ),
        # vLLM's launcher on SIGINT, as vllm-project/vllm-ascend's quick start shows it (after `kill -2`)
        ("INFO:     Shutting down FastAPI HTTP server.", "shutdown"),
        ("INFO 09-18 00:35:13 [launcher.py:60] Shutting down FastAPI HTTP server.", "shutdown"),
        # uvicorn's own (gpustack/gpustack#5740), behind vLLM's writer and bare
        ("(APIServer pid=1) INFO:     Shutting down", "shutdown"),
        ("INFO:     Shutting down", "shutdown"),
        # SGLang tokenizer_manager.py SignalHandler.sigterm_handler, as its f-string writes it
        (
            "[2026-12-01 10:00:00] SIGTERM received. signum=<Signals.SIGTERM: 15> frame=<frame at 0x7f, file "
            "'/sgl-workspace/sglang/python/sglang/srt/entrypoints/http_server.py', line 1, code serve>. Draining requests "
            "and shutting down...",
            "SIGTERM",
        ),
        # torchrun's agent (PrimeIntellect-ai/prime-rl#1360, as posted: Python 3.11+ writes the signal's number); its
        # `logger.warning("Received %s death signal, ...", e.sigval)` (elastic/agent/server/api.py) before 3.11 the enum's
        (
            "W1130 12:13:49.388000 124326 torch/distributed/elastic/agent/server/api.py:723] Received 15 death signal, "
            "shutting down workers",
            "SIGTERM",
        ),
        (
            "W0616 00:37:22.830000 4015698 torch/distributed/elastic/agent/server/api.py:719] Received Signals.SIGTERM death "
            "signal, shutting down workers",
            "SIGTERM",
        ),
        ("WARNING:torch.distributed.elastic.agent.server.api:Received 1 death signal, shutting down workers", "SIGHUP"),
        # a shell's notice of its job ended by SIGTERM, and vLLM 0.5-0.6's SIGTERM while initializing
        ("Terminated", "SIGTERM"),
        ("./launch.sh: line 12: 40213 Terminated              python3 -m sglang.launch_server --tp 8", "SIGTERM"),
        ("KeyboardInterrupt: terminated", "SIGTERM"),
    ],
)
def test_a_stop_the_server_says_it_received(text, stop):
    ll = one(text)
    assert ll.stop == stop and ll.kind != "failure"


@pytest.mark.parametrize(
    "text",
    [
        # SGLang's parent told by a failing child: a crash, never the operator's stop
        "[2025-02-09 21:23:00] Received sigquit from a child proces. It usually means the child failed.",
        "[2026-12-01 10:00:00] SIGQUIT received. signum=<Signals.SIGQUIT: 3>, frame=<frame at 0x7f>. It usually means "
        "one child failed.",
        "[2026-12-01 10:00:00] Received SIGQUIT from scheduler process. Scheduler failed, shutting down gRPC server.",
        # a worker's death notice that says it shuts down is a failure, not a stop
        "ERROR 11-08 11:01:29 [multiproc_executor.py:135] Worker proc VllmWorker-3 died unexpectedly, shutting down "
        "executor.",
    ],
)
def test_a_failing_childs_signal_is_no_stop(text):
    ll = one(text)
    assert ll.stop is None and ll.kind == "failure" and ll.consequence


def test_the_failures_after_a_stop_are_its_shutdowns():
    """vllm-project/vllm#48745: the operator's SIGTERM, then the output handler's EngineDeadError as the engine goes:
    the consequence line was the only failure, so it read crashed."""
    t = track(VLLM_STOP + OUTPUT_HANDLER, "vllm")
    assert t.failures and t.first_failure() is None and t.stopped()
    assert t.stop[0] == 2 and t.stop[1].stop == "SIGTERM"
    # a failure of its own before the stop is the crash, whatever the stop then says
    crashed = track(OUTPUT_HANDLER[:5] + VLLM_STOP + OUTPUT_HANDLER[5:], "vllm")
    assert not crashed.stopped() and crashed.first_failure().cause == "exception"
    # the next launch starts over: its failures are its own
    relaunch = VLLM_STOP + ["INFO 07-07 19:14:46 [api_server.py:1] vLLM API server version 0.11.0"] + OUTPUT_HANDLER
    assert track(relaunch, "vllm").first_failure() is not None
    # the launcher's shutdown after the engine died (vLLM's own order when the engine fails: its server task
    # ends, then the launcher says so): the failure came first
    failed = OUTPUT_HANDLER[:5] + ["INFO 09-18 00:35:13 [launcher.py:60] Shutting down FastAPI HTTP server."]
    assert track(failed, "vllm").first_failure().line == 5 and not track(failed, "vllm").stopped()
    # a stop with nothing failing after it is a healthy shutdown
    assert not track(VLLM_STOP, "vllm").stopped() and track(VLLM_STOP, "vllm").first_failure() is None


def test_explain_says_stopped_with_the_stop_and_what_failed_after():
    from cockpit.judge.explain import describe, explain

    doc = explain(VLLM_STOP + OUTPUT_HANDLER, engine="vllm")
    v = doc["verdict"]
    assert (v["name"], v["rank"], v["cause"], v["line"]) == ("stopped", None, "SIGTERM", 2)
    assert v["evidence_lines"] == [2, 8] and "trigger received signal=SIGTERM" in v["evidence"][0]
    assert describe(doc)[2] == (
        "verdict: stopped: the server said it was stopped (SIGTERM, line 2); 1 failure after "
        "it: its shutdown's, no crash"
    )
    # a hang the operator then stopped is the hang
    shm = (
        "(VllmWorker rank=0 pid=1) INFO 10-22 09:43:49 [shm_broadcast.py:466] No available shared memory broadcast "
        "block found in 60 seconds."
    )
    assert explain([shm] + VLLM_STOP + OUTPUT_HANDLER, engine="vllm")["verdict"]["name"] == "stalled"


# SGLang's CI: the server served the benchmark, then the test harness failed its threshold (the shape of the log
# issue 48 quotes; the chained retry traceback as sgl-project/sglang's CustomTestCase prints it)
HARNESS = [
    "[2025-06-01 10:00:00 TP0] Decode batch. #running-req: 1, #token: 60, token usage: 0.00, gen throughput "
    "(token/s): 95.12, #queue-req: 0",
    "Traceback (most recent call last):",
    '  File "/actions-runner/_work/sglang/sglang/test/srt/test_bench_serving.py", line 123, in test_online_latency',
    '    self.assertLessEqual(res["median_e2e_latency_ms"], 45.9)',
    '  File "/usr/lib/python3.10/unittest/case.py", line 1244, in assertLessEqual',
    "    self.fail(self._formatMessage(msg, standardMsg))",
    '  File "/usr/lib/python3.10/unittest/case.py", line 675, in fail',
    "    raise self.failureException(msg)",
    "AssertionError: 79.59 not less than or equal to 45.9",
    "",
    "During handling of the above exception, another exception occurred:",
    "",
    "Traceback (most recent call last):",
    '  File "/opt/.venv/lib/python3.12/site-packages/sglang/test/test_utils.py", line 2215, in _callTestMethod',
    "    retry(",
    '  File "/opt/.venv/lib/python3.12/site-packages/sglang/srt/utils/common.py", line 3183, in retry',
    '    raise Exception(f"retry() exceed maximum number of retries.")',
    "Exception: retry() exceed maximum number of retries.",
]
# `vllm bench serve` giving up on its endpoint (ai-dynamo/dynamo#3728, as posted; its last line is the benchmark's)
VLLM_BENCH = [
    "Traceback (most recent call last):",
    '  File "/workspace/devvenv/bin/vllm", line 10, in <module>',
    "    sys.exit(main())",
    '  File "/workspace/vllm/vllm/entrypoints/cli/main.py", line 54, in main',
    "    args.dispatch_function(args)",
    '  File "/workspace/vllm/vllm/entrypoints/cli/benchmark/serve.py", line 21, in cmd',
    "    main(args)",
    '  File "/workspace/vllm/vllm/benchmarks/serve.py", line 959, in main',
    "    return asyncio.run(main_async(args))",
    "ValueError: Initial test run failed - Please make sure benchmark arguments are correctly specified.",
]


def test_another_programs_traceback_is_a_finding_not_the_server_failing():
    t = track(HARNESS)
    assert t.first_failure() is None and not t.failures
    assert [n for n, _ in t.foreign] == [9]  # the chain is one traceback, said once
    said = t.findings()[0]
    assert said.source == "log" and "AssertionError: 79.59 not less than or equal to 45.9" in said.evidence[0]
    assert track(VLLM_BENCH, "vllm").first_failure() is None and track(VLLM_BENCH, "vllm").foreign
    # the engine's own frame in it: the server's traceback, a failure (an in-process engine under a test)
    engine = HARNESS[1:3] + [
        '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 1, in f',
        "RuntimeError: boom",
    ]
    assert track(engine).first_failure() is not None
    # and the log that ends inside a harness's traceback has not failed either
    assert track(HARNESS[:6]).first_failure() is None


def test_explain_says_a_harness_traceback_as_a_finding():
    from cockpit.judge.explain import describe, explain

    doc = explain(HARNESS, engine="sglang")
    assert doc["verdict"]["name"] == "ok" and len(doc["findings"]) == 1
    assert "line 9: another program's traceback" in doc["findings"][0]
    assert any(line.startswith("finding: line 9: ") for line in describe(doc))


@pytest.mark.parametrize(
    "text, rank, who, cause, consequence",
    [
        # a faulthandler dump's "Extension modules:" line with a rank's header stuck to its end (issue 48's shape)
        (
            "Extension modules: numpy.core._multiarray_umath, numpy.core._multiarray_tests, numpy.linalg._umath_linalg, "
            "torch._C, torch._C._fft, psutil._psutil_linux, zmq.backend.cython._zmq, yaml._yaml (total: 40)"
            "[2025-04-17 11:44:15 TP3] Scheduler hit an exception: Traceback (most recent call last):",
            3,
            "TP3",
            "exception",
            False,
        ),
        # sgl-project/sglang#3836: rank 5's torch watchdog line glued to the same kind of line
        (
            "Extension modules: charset_normalizer.md, requests.packages.charset_normalizer.md, uvloop.loop, setproctitle, "
            "zmq.backend.cython._zmq, yaml._yaml, markupsafe._speedups, PIL._imaging[rank5]:[E226 11:16:37.121617583 "
            "ProcessGroupNCCL.cpp:616] [Rank 5] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5653, "
            "OpType=ALLREDUCE, NumelIn=58720256, NumelOut=5872",
            5,
            "rank5",
            "nccl-timeout",
            False,
        ),
        # the parent's sigquit after a faulthandler frame (no comma: a stack dump's), past where a prefix is looked for
        (
            '  File "/usr/lib/python3.10/multiprocessing/connection.py", line 7 in [2025-04-17 11:44:15] Received '
            "sigquit from a child process. It usually means the child failed.",
            None,
            None,
            "exception",
            True,
        ),
    ],
)
def test_a_failure_header_glued_mid_line_is_read_with_its_own_prefix(text, rank, who, cause, consequence):
    ll = one(text)
    assert (ll.kind, ll.rank, ll.who, ll.cause, ll.consequence) == ("failure", rank, who, cause, consequence)
    assert ll.time is not None and ll.text == text


def test_a_header_glued_behind_junk_that_is_no_prefix_stays_unnamed():
    ll = one("Exception: Capture cuda graph failed: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection cl")
    assert (ll.kind, ll.rank, ll.who) == ("failure", None, None)


@pytest.mark.parametrize(
    "text, rank, failed",
    [
        # torch 2.4-2.5 (vllm-project/vllm#8978, hiyouga/LlamaFactory#2902, as posted)
        (
            "[rank2]:[E1001 16:06:04.537356909 ProcessGroupNCCL.cpp:1664] [PG 0 (default_pg) Rank 2] Exception (either an "
            "error or timeout) detected by watchdog at work: 1, last enqueued NCCL work: 1, last completed NCCL work: -1.",
            2,
            2,
        ),
        (
            "[rank0]:[E1123 00:52:57.665427695 ProcessGroupNCCL.cpp:1664] [PG 1 Rank 0] Exception (either an error or "
            "timeout) detected by watchdog at work: 1516, last enqueued NCCL work: 1516, last completed NCCL work: 1515.",
            0,
            0,
        ),
        # issue 48's: a process group's own prefix
        (
            "[rank3]:[E1003 18:37:01.833575187 ProcessGroupNCCL.cpp:1664] [PG ID 2 PG GUID 3 Rank 3] Exception (either an "
            "error or timeout) detected by watchdog at work: 32, last enqueued NCCL work: 32, last completed NCCL work: 31.",
            3,
            3,
        ),
        (
            "[rank3]:[E1003 18:37:01.833621509 ProcessGroupNCCL.cpp:1709] [PG ID 2 PG GUID 3 Rank 3] Timeout at NCCL work: "
            "32, last enqueued NCCL work: 32, last completed NCCL work: 31.",
            3,
            3,
        ),
        (
            "[rank3]:[E1003 18:37:01.833637681 ProcessGroupNCCL.cpp:621] [Rank 3] Some NCCL operations have failed or timed "
            "out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete "
            "data.",
            3,
            3,
        ),
        # torch 1.x: no rank anywhere
        (
            "[E ProcessGroupNCCL.cpp:414] Some NCCL operations have failed or timed out. Due to the asynchronous nature of "
            "CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data. To avoid this inconsistency, we "
            "are taking the entire process down.",
            None,
            None,
        ),
        # torch 2.6+: "failure detected by watchdog at work sequence id"
        (
            "[rank1]:[E813 12:25:30.692163833 ProcessGroupNCCL.cpp:2271] [PG ID 1 PG GUID 1 Rank 1]  failure detected by "
            "watchdog at work sequence id: 57 PG status: last enqueued work: 57, last completed work: 56",
            1,
            1,
        ),
        # the dump signal: this rank's own timeout (sgl-project/sglang#10216), or another's, "from  rank 7"
        (
            "[rank6]:[E909 08:45:31.970959174 ProcessGroupNCCL.cpp:1870] [PG ID 0 PG GUID 0 Rank 6] Received a dump signal "
            "due to a collective timeout from this local rank and we will try our best to dump the debug info. Last enqueued "
            "NCCL work: -1, last completed NCCL work: -1.",
            6,
            6,
        ),
        (
            "[rank6]:[E703 21:51:54.112142364 ProcessGroupNCCL.cpp:1987] [PG ID 0 PG GUID 0(default_pg) Rank 6] Received a "
            "dump signal due to a collective timeout from  rank 7 and we will try our best to dump the debug info. Last "
            "enqueued NCCL work: 56116, last completed NCCL work: 56116.",
            6,
            7,
        ),
    ],
)
def test_torchs_other_watchdog_words_are_an_nccl_timeout_of_the_rank(text, rank, failed):
    ll = one(text)
    assert (ll.kind, ll.cause, ll.rank, ll.failed_rank) == ("failure", "nccl-timeout", rank, failed)
    f = track([text]).first_failure()
    assert (f.cause, f.rank) == ("nccl-timeout", failed)


@pytest.mark.parametrize(
    "text, cause",
    [
        # Triton's wrapper of the driver's string (triton-lang/triton#2971, vllm-project/vllm#18580)
        ("RuntimeError: Triton Error [CUDA]: device kernel image is invalid.", "cuda-error"),
        ("RuntimeError: Triton Error [CUDA]: out of memory", "oom"),
        # the driver's and runtime's strings, wrapped by torch or bare in an exception
        ("torch.AcceleratorError: CUDA error: an illegal instruction was encountered", "cuda-error"),
        ("RuntimeError: device kernel image is invalid", "cuda-error"),
        ("RuntimeError: a PTX JIT compilation failed", "cuda-error"),
        ("RuntimeError: device-side assert triggered", "cuda-error"),  # three words, yet CUDA's own
        ("RuntimeError: uncorrectable NVLink error detected during the execution", "cuda-error"),
        ("RuntimeError: CUDA error: no CUDA-capable device is detected", "cuda-error"),
        ("pycuda._driver.LogicError: cuCtxCreate failed: CUDA_ERROR_INVALID_DEVICE", "cuda-error"),
        ("RuntimeError: cudaErrorLaunchTimeout: the launch timed out and was terminated", "cuda-error"),
        # a string that is common English names no CUDA error without its wrapper
        ("FileNotFoundError: file not found", None),
    ],
)
def test_cuda_errors_are_named_from_the_drivers_table(text, cause):
    ll = one(text)
    assert ll.cause == cause and (ll.kind == "failure") == (cause is not None)


def test_the_cuda_table_is_the_one_source_of_its_phrases():
    from cockpit.read import logrules as L

    names = [name for name, _ in L.CUDA_ERRORS]
    assert len(names) == len(set(names)) and len(names) > 60
    for text in L.CUDA_OWN:  # each bare phrase names a CUDA error on its own, and reaches the rules through the gate
        assert L._hot(text) and L.cause_of(f"RuntimeError: {text}") == "cuda-error", text
    for text in L.CUDA_OWN:
        assert L._cuda_words(text), text
    for _, text in L.CUDA_ERRORS:  # every string of the table does behind torch's wrapper
        assert L.cause_of(f"RuntimeError: CUDA error: {text}") in ("cuda-error", "oom"), text
