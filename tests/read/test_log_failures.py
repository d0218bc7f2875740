"""The failure rules on the errors SGLang, vLLM, torch and NCCL really print (each quoted from a public
issue or the engines' source; tests/data/real-logs holds whole excerpts): cause, rank, exit code, the
lines that only look like failures, and the stall tells."""

import pytest

from cockpit.read.logrules import LogRules, LogTracker

# ----------------------------------------------------------------------------- failures


def one(text: str, engine: str = "auto"):
    return LogRules(engine).classify(text)


@pytest.mark.parametrize(
    "text, cause, failed_rank, exit_code, consequence",
    [
        # SGLang
        (
            "[2025-04-21 04:13:43 TP3] Scheduler hit an exception: Traceback (most recent call last):",
            "exception",
            None,
            None,
            False,
        ),
        ("Exception in run_tp_server:", "exception", None, None, False),
        ("Exception in ControllerSingle:", "exception", None, None, False),
        (
            "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 448.00 MiB. GPU 7 has a total capacity of 95.00",
            "oom",
            None,
            None,
            False,
        ),
        (
            "Exception: Capture cuda graph failed: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection cl",
            "exception",
            None,
            None,
            False,
        ),
        (
            "[2025-04-21 04:13:43] Received sigquit from a child process. It usually means the child failed.",
            "exception",
            None,
            None,
            True,
        ),
        (
            "[2025-02-09 21:23:00] Received sigquit from a child proces. It usually means the child failed.",
            "exception",
            None,
            None,
            True,
        ),  # SGLang's older spelling
        (
            "RuntimeError: Rank 0 scheduler died during initialization (exit code: -3). If exit code is -9 (SIGKILL), a common "
            "cause is the OS OOM killer. Run `dmesg -T | grep -i oom` to check.",
            "terminated",
            0,
            -3,
            True,
        ),  # not "killed"
        (
            "RuntimeError: Rank 3 scheduler died during initialization (exit code: -9). If exit code is -9 (SIGKILL), a common "
            "cause is the OS OOM killer. Run `dmesg -T | grep -i oom` to check.",
            "killed",
            3,
            -9,
            False,
        ),
        (
            "RuntimeError: Rank 0 scheduler died during initialization (exit code: 255). If exit code is -9 (SIGKILL), a common "
            "cause is the OS OOM killer. Run `dmesg -T | grep -i oom` to check.",
            "exception",
            0,
            255,
            False,
        ),
        (
            "[12-16 14:27:08] Rank 0 scheduler is dead. Please check if there are relevant logs.",
            "exception",
            0,
            None,
            False,
        ),
        ("[12-16 14:27:10] Exit code: -9", "killed", None, -9, False),
        (
            "[2025-02-21 10:00:00 TP0] Watchdog timeout (self.watchdog_timeout=300)",
            "watchdog-timeout",
            None,
            None,
            False,
        ),
        (
            "RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)",
            "nccl-error",
            None,
            None,
            False,
        ),
        # vLLM
        (
            "(VllmWorker rank=1 pid=12231) ERROR 03-25 21:13:53 multiproc_executor.py:374] WorkerProc hit an exception: %s",
            "exception",
            None,
            None,
            False,
        ),
        (
            "(Worker_TP1 pid=56679) ERROR 08-14 02:42:27 [multiproc_executor.py:923] WorkerProc failed to start.",
            "exception",
            None,
            None,
            False,
        ),
        ("ERROR 07-07 15:19:51 [core.py:515] EngineCore failed to start.", "exception", None, None, False),
        (
            "(VllmWorkerProcess pid=25847) ERROR 03-06 01:17:36 multiproc_worker_utils.py:240] Exception in worker "
            "VllmWorkerProcess while processing method load_model.",
            "exception",
            None,
            None,
            False,
        ),
        (
            "ERROR 11-08 11:01:29 [multiproc_executor.py:135] Worker proc VllmWorker-3 died unexpectedly, shutting down executor.",
            "died",
            3,
            None,
            True,
        ),
        (
            "(EngineCore pid=12244) ERROR 07-15 21:01:01 [multiproc_executor.py:284] Worker proc VllmWorker-0 died unexpectedly "
            "(exit code: -15), shutting down executo",
            "terminated",
            0,
            -15,
            True,
        ),
        (
            "  | ERROR 07-01 13:54:43 multiproc_worker_utils.py:120] Worker VllmWorkerProcess pid 1159 died, exit code: -6",
            "aborted",
            None,
            -6,
            False,
        ),
        (
            "ERROR 07-04 12:00:00 multiproc_worker_utils.py:120] Worker VllmWorkerProcess pid 3283517 died, exit code: -15",
            "terminated",
            None,
            -15,
            True,
        ),
        (
            "(VllmWorker rank=5 pid=50999) ERROR 07-07 15:19:48 [multiproc_executor.py:492] torch.OutOfMemoryError: CUDA out of "
            "memory. Tried to allocate 2.50 GiB. GPU 5 has a total capacity of 79.25 GiB of which 1.79 GiB is free.",
            "oom",
            None,
            None,
            False,
        ),
        (
            "(EngineCore_DP0 pid=17374) ERROR 09-28 15:47:24 [core.py:718] ValueError: Free memory on device (3.22/4.0 GiB) on "
            "startup is less than desired GPU memory utilization (0.9, 3.6 GiB). Decrease GPU memory utilization or reduce GPU "
            "memory used by other processes.",
            "oom",
            None,
            None,
            False,
        ),
        (
            "│ ERROR 09-27 06:46:46 engine.py:157] RuntimeError: CUDA error: an illegal memory access was encountered      │",
            "cuda-error",
            None,
            None,
            False,
        ),
        (
            "(EngineCore pid=12244) ERROR 07-15 21:01:01 [core.py:1240] RuntimeError: Worker failed with error 'CUDA error: an "
            "illegal memory access was encountered",
            "cuda-error",
            None,
            None,
            False,
        ),
        (
            "(APIServer pid=1) ERROR 05-05 12:36:59 [serving.py:1173] vllm.v1.engine.exceptions.EngineDeadError: EngineCore "
            "encountered an issue. See stack trace (above) for the root cause.",
            "exception",
            None,
            None,
            True,
        ),
        (
            "(APIServer pid=223598) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
            "exception",
            None,
            None,
            True,
        ),
        ("ERROR 11-08 11:01:30 [core.py:502] EngineCore encountered a fatal error.", "exception", None, None, True),
        (
            "CRITICAL 03-15 17:24:18 [multiproc_executor.py:48] MulitprocExecutor got fatal signal from worker processes, "
            "shutting down. See stack trace above for root cause issue.",
            "exception",
            None,
            None,
            True,
        ),
        (
            "RuntimeError: NCCL error: unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
            "nccl-error",
            None,
            None,
            False,
        ),
        # torch
        (
            "[rank2]:[E1001 16:06:04.537131842 ProcessGroupNCCL.cpp:607] [Rank 2] Watchdog caught collective operation timeout: "
            "WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=128, NumelOut=128, Timeout(ms)=600000) ran for 600009 milliseconds "
            "before timing out.",
            "nccl-timeout",
            2,
            None,
            False,
        ),
        (
            "[E ProcessGroupNCCL.cpp:458] [Rank 7] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=64088, "
            "OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 25625251 milliseconds before timing out.",
            "nccl-timeout",
            7,
            None,
            False,
        ),
        (
            "  | [rank0]:[E ProcessGroupNCCL.cpp:1414] [PG 2 Rank 0] Process group watchdog thread terminated with exception: "
            "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2, OpType=ALLREDUCE, NumelIn=134217728, "
            "NumelOut=134217728, Timeout(ms)=600000) ran for 600059 milliseconds before timing out.",
            "nccl-timeout",
            0,
            None,
            False,
        ),
        ("terminate called after throwing an instance of 'std::runtime_error'", "aborted", None, None, True),
        ("  what():  NCCL Error 1: unhandled cuda error", "nccl-error", None, None, False),
        # SGLang's warm-up request failed; it then kills its own process tree (http_server.py _wait_and_warmup)
        (
            "[2026-01-10 13:23:27] Initialization failed. warmup error: Traceback (most recent call last):",
            "exception",
            None,
            None,
            False,
        ),
        # vLLM V1 0.7-0.9 (core.py run_engine_core), V0 workers (worker_base.py execute_method)
        (
            "ERROR 03-20 08:20:15 [core.py:340] EngineCore hit an exception: Traceback (most recent call last):",
            "exception",
            None,
            None,
            False,
        ),
        (
            "(RayWorkerWrapper pid=4139, ip=128.1.219.180) ERROR 07-03 14:43:50 worker_base.py:148] Error executing method "
            "init_device. This might cause deadlock in distributed execution.",
            "exception",
            None,
            None,
            False,
        ),
        (
            "ERROR 03-18 08:32:47 [worker_base.py:620] Error executing method 'initialize_cache'. This might cause deadlock in "
            "distributed execution.",
            "exception",
            None,
            None,
            False,
        ),
        # vLLM V1's front end: its engine process is gone (a consequence: the cause is told elsewhere, if at all)
        (
            "(APIServer pid=47974) ERROR 10-14 13:42:23 [core_client.py:564] Engine core proc EngineCore_DP0 died unexpectedly, "
            "shutting down client.",
            "died",
            None,
            None,
            True,
        ),
        # V0's KV cache too small for the model's length: an OOM in all but name, as V1's wording
        (
            "(VllmWorkerProcess pid=6499) ERROR 07-24 14:07:40 multiproc_worker_utils.py:226] ValueError: The model's max seq "
            "len (131072) is larger than the maximum number of tokens that can be stored in KV cache (79392). Try increasing "
            "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.",
            "oom",
            None,
            None,
            False,
        ),
        # a native crash: vLLM's segfault handler, Python's faulthandler
        ("!!!!!!! Segfault encountered !!!!!!!", "segfault", None, None, False),
        ("Fatal Python error: Segmentation fault", "segfault", None, None, False),
        ("Fatal Python error: Aborted", "aborted", None, None, False),
        (
            "\ufffd[36m(WorkerDict pid=129668)\ufffd[0m Fatal Python error: Floating point exception",
            "fatal-signal",
            None,
            None,
            False,
        ),
        (
            "Fatal Python error: PyThreadState_Get: the function must be called with the GIL held",
            "aborted",
            None,
            None,
            False,
        ),
        # NCCL's proxy: an InfiniBand completion failed, the communicator is broken
        (
            "[Node-A]:[PID]:[Thread] [0] NCCL WARN NET/IB : Got completion from peer [PRIVATE_IP] with error 12, opcode 0, "
            "len 0, vendor err 129 (Recv)",
            "nccl-error",
            None,
            None,
            False,
        ),
        ("Killed", "killed", None, None, False),
        # ROCm: HIP's runtime errors are the twins of CUDA's
        (
            "ERROR 03-17 03:57:17 [engine.py:411] RuntimeError: HIP error: invalid device function",
            "cuda-error",
            None,
            None,
            False,
        ),
        (
            "RuntimeError: HIP error: hipErrorNoBinaryForGpu: Unable to find code object for all current devices!",
            "cuda-error",
            None,
            None,
            False,
        ),
        # torch's wording of an allocation the driver refused: an OOM, not a kernel fault
        (
            "(EngineCore pid=74) ERROR 05-07 00:37:03 [core.py:1136] RuntimeError: CUDA driver error: out of memory",
            "oom",
            None,
            None,
            False,
        ),
        # ProcessGroupNCCL's heartbeat monitor: the watchdog itself is stuck; torch terminates the rank
        (
            "[rank0]:[E1019 01:04:03.356947152 ProcessGroupNCCL.cpp:1413] [PG 3 Rank 0] Heartbeat monitor timed out! Process "
            "will be terminated after dumping debug info. workMetaList_.size()=121",
            "nccl-timeout",
            0,
            None,
            False,
        ),
        (
            "[rank2]:[F1019 01:14:03.356851194 ProcessGroupNCCL.cpp:1224] [PG 3 Rank 2] [PG 3 Rank 2] ProcessGroupNCCL's "
            "watchdog got stuck for 600 seconds without making progress in monitoring enqueued collectives.",
            "nccl-timeout",
            2,
            None,
            False,
        ),
        (
            "[rank6]:[F429 14:03:49.385461578 ProcessGroupNCCL.cpp:1554] [PG ID 0 PG GUID 0(default_pg) Rank 6] [PG ID 0 PG "
            "GUID 0(default_pg) Rank 6] Terminating the process after attempting to dump debug info, due to ProcessGroupNCCL "
            "watchdog hang.",
            "nccl-timeout",
            6,
            None,
            False,
        ),
    ],
)
def test_failures_name_their_cause_rank_and_exit_code(text, cause, failed_rank, exit_code, consequence):
    ll = one(text)
    assert ll.kind == "failure"
    assert (ll.cause, ll.failed_rank, ll.exit_code, ll.consequence) == (cause, failed_rank, exit_code, consequence)


@pytest.mark.parametrize(
    "text",
    [
        # a "failed" that is a warning
        "[2025-11-01 16:50:36 TP1] Setup Custom allreduce failed with CUDART error: peer access is not supported between "
        "these two devices. To silence this warning, specify --disable-custom-all-reduce explicitly.",
        # an exception that mentions OOM only as a guess: an error, not an OOM
        "ValueError: TP rank 1 could finish the model loading, but there are other ranks that didn't finish loading. It is "
        "likely due to unexpected failures (e.g., OOM) or a slow node.",
        # a traceback's source line that quotes a failure message
        '    raise RuntimeError(f"NCCL error: {error_str}")',
        '(APIServer pid=223598)     raise RuntimeError("Engine core initialization failed. "',
        # torch's advice lines around a CUDA error
        "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.",
        "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
        # vLLM's advice about OOM during capture, at INFO
        "INFO 07-17 23:41:30 model_runner.py:851] CUDA graphs can take additional 1~3 GiB memory per GPU. If you are running "
        "out of memory, consider decreasing `gpu_memory_utilization` or enforcing eager mode.",
        "[rank8]:[W516 12:46:57.499514954 ProcessGroupNCCL.cpp:1826] [PG ID 0 PG GUID 0 Rank 8] Failed to check the "
        '"should dump" flag on TCPStore, (maybe TCPStore server has shut down too early), with error: Connection reset by peer',
    ],
)
def test_lines_that_only_look_like_failures_are_not(text):
    assert one(text).kind != "failure"


def test_a_rank_that_reports_a_peers_exit_is_a_victim():
    """torch's ncclRemoteError: the rank that prints it did not fail first; it names no failing rank."""
    ll = one(
        "[rank3]: torch.distributed.DistBackendError: NCCL error in: /opt/pytorch/pytorch/torch/csrc/distributed/"
        "c10d/ProcessGroupNCCL.cpp:3763, remote process exited or there was a network error, NCCL version 2.28.8"
    )
    assert (ll.kind, ll.cause, ll.rank, ll.victim) == ("failure", "nccl-error", 3, True)
    t = LogTracker(LogRules("auto"))
    t.feed(ll.text)
    t.feed(
        "[rank3]: ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely."
    )
    assert (t.first_failure().rank, t.first_failure().cause) == (None, "nccl-error")
    assert t.ranks == {3}


def test_the_error_and_warning_kinds():
    assert one("ValueError: TP rank 1 could finish the model loading, but there are other ranks th").kind == "error"
    assert (
        one(
            "(Worker_TP0 pid=34322) WARNING 05-06 21:00:09 [op.py:241] Priority not set for op rms_norm, using native "
            "implementation."
        ).kind
        == "warning"
    )
    assert (
        one(
            "[rank3]:[W208 00:55:32.444220068 socket.cpp:487] [c10d] waitForInput: socket SocketImpl(fd=103) timed out "
            "after 1800000ms"
        ).kind
        == "warning"
    )
    assert (
        one(
            "(VllmWorker rank=1 pid=12231) ERROR 03-25 21:13:53 multiproc_executor.py:374]     self._dummy_run(num_tokens)"
        ).kind
        == "error"
    )


@pytest.mark.parametrize(
    "text",
    [
        "(EngineCore_DP0 pid=77352) INFO 10-22 09:43:49 [shm_broadcast.py:466] No available shared memory broadcast block "
        "found in 60 seconds. This typically happens when some processes are hanging or doing some time-consuming work "
        "(e.g. compilation).",
        "DEBUG 07-04 17:35:10 [shm_broadcast.py:456] No available shared memory broadcast block found in 60 second.",
    ],
)
def test_the_shm_broadcast_warning_is_a_stall_tell_not_a_crash(text):
    ll = one(text)
    assert (ll.kind, ll.cause) == ("stall", "shm-broadcast")


@pytest.mark.parametrize(
    "text",
    [
        "INFO 04-01 02:46:20 ray_utils.py:214] Waiting for creating a placement group of specs for 30 seconds. specs=[{'GPU': "
        "1.0}, {'GPU': 1.0}]. Check `ray status` to see if you have enough resources.",
        "(EngineCore pid=84) INFO 06-07 18:13:55 [ray_utils.py:464] Waiting for creating a placement group of specs for 150 "
        "seconds. specs=[{'GPU': 1.0}, {'GPU': 1.0}].",
    ],
)
def test_a_ray_placement_group_wait_is_a_stall_tell(text):
    ll = one(text)
    assert (ll.kind, ll.cause) == ("stall", "placement-group")
