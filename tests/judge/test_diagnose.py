"""Verdicts from figures seen on real hosts, fed to the watchdog as frames."""

from cockpit.host.state import HostState
from cockpit.judge.diagnose import Watchdog, phase_of
from cockpit.read.logrules import parse


def host(ranks, gpus, log=()):
    """ranks: [(rank, cpu_pct)], gpus: [(util, power_w, mem_used_mib)] with rank i on GPU i."""
    st = HostState("t")
    st.apply(
        {
            "t": "hello",
            "gpus": [{"index": i, "mem_total_mib": 143771, "power_limit_w": 700.0} for i in range(len(gpus))],
        }
    )
    st.apply(
        {
            "t": "sample",
            "seq": 1,
            "gpus": [
                {"index": i, "util_pct": u, "power_w": p, "mem_used_mib": m, "processes": [[100 + i, m - 8]]}
                for i, (u, p, m) in enumerate(gpus)
            ],
            "procs": [
                {
                    "pid": 100 + r,
                    "ppid": 1,
                    "name": f"sglang::scheduler_TP{r}",
                    "cmdline": [f"sglang::scheduler_TP{r}"],
                    "status": "R" if cpu > 50 else "S",
                    "cpu_pct": cpu,
                }
                for r, cpu in ranks
            ],
            "ports": [{"port": 8000, "listening": False, "pid": None}],
        }
    )
    st.apply({"t": "log", "path": "/l", "lines": list(log)})
    return st


def settle(dog, st, seconds):
    st.logs["/l"].last_line_at = 0.0
    dog.update(st, 0.0, "/l")
    return dog.update(st, seconds, "/l")


def test_h200_hung_all_reduce_is_stalled_spinning_with_the_odd_rank_named():
    # Measured on 2 x H200 (docs/VALIDATION.md, run 2): rank 0 waits in the all-reduce, rank 1 left it.
    st = host([(0, 100.0), (1, 0.0)], [(100, 124.0, 9866), (0, 119.5, 9866)], ["[x TP0] Decode batch. step 5000"])
    phase, verdict = settle(Watchdog(spin_s=15), st, 16)
    assert verdict.name == "stalled-spinning" and verdict.odd_rank == 1
    assert "124 W of 700 W" in verdict.evidence[0]
    _, early = settle(Watchdog(spin_s=15), st, 5)
    assert early.name == "ok"  # not before the threshold


def test_busy_gpus_are_not_a_stall():
    st = host([(0, 100.0), (1, 100.0)], [(86, 626.0, 9866), (76, 605.0, 9866)])
    assert settle(Watchdog(spin_s=1, idle_s=1), st, 100)[1].name == "ok"


def test_the_operator_story_is_stalled_idle():
    lines = ["[2026 TP0] Load weight end. mem usage=76.0 GB.", "[2026 TP0] Capture draft cuda graph begin."]
    st = host([(r, 0.0) for r in range(8)], [(0, 45.0, 78000)] * 8, lines)
    phase, verdict = settle(Watchdog(idle_s=120), st, 121)
    assert phase.name == "capturing draft cuda graphs"
    assert verdict.name == "stalled-idle" and any("port closed" in e for e in verdict.evidence)


def test_a_first_look_at_an_old_hang_reads_one_clock_tick_of_a_short_window_as_idle():
    """The one-sample look measures CPU over ~50 ms; /proc counts it in 10 ms ticks, so a hung rank
    that happened to cross one tick reads 20 %. That is no sign of work: still stalled-idle, at once;
    two ticks are."""
    lines = ["[2026 TP0] Load weight end. mem usage=76.0 GB.", "[2026 TP0] Capture draft cuda graph begin."]

    def first_look(cpu):
        st = host([(r, 0.0) for r in range(8)], [(0, 45.0, 78000)] * 8, lines)
        st.apply(
            {
                "t": "sample",
                "seq": 2,
                "gpus": [
                    {"index": r, "util_pct": 0, "power_w": 45.0, "mem_used_mib": 78000, "processes": [[100 + r, 77000]]}
                    for r in range(8)
                ],
                "procs": [
                    {
                        "pid": 100 + r,
                        "ppid": 1,
                        "name": f"sglang::scheduler_TP{r}",
                        "status": "S",
                        "cpu_pct": cpu(r),
                        "cpu_tick": 20.0,
                    }
                    for r in range(8)
                ],
            }
        )
        for p in st.procs.values():
            p.started = 400.0
        st.sample_ts, st.logs["/l"].written_at = 1000.0, 700.0  # silent for 300 s
        return Watchdog(idle_s=120).update(st, 0.0, "/l")[1]

    v = first_look(lambda r: 20.0 if r == 3 else 0.0)
    assert v.name == "stalled-idle", v
    assert "max 20 %: one clock tick, over a window too short to tell" in v.evidence[0], v.evidence
    assert first_look(lambda r: 40.0 if r == 3 else 0.0).name != "stalled-idle"


def test_a_run_hung_before_its_weights_is_stalled_with_only_its_cuda_context_on_the_gpus():
    """vLLM issues #8058, #50430: TP workers stop after `backend=nccl` / `vLLM is using nccl==...`,
    each GPU holding ~0.5 GiB (its CUDA context), CPU and GPU idle: stalled, not watching forever."""
    lines = [
        "(Worker pid=359277) INFO 07-30 12:25:05 [parallel_state.py:1615] world_size=2 rank=0 local_rank=0 "
        "distributed_init_method=tcp://127.0.0.1:33015 backend=nccl",
        "(Worker pid=359277) INFO 07-30 12:25:10 [pynccl.py:113] vLLM is using nccl==2.28",
    ]
    st = host([(0, 0.0), (1, 0.0)], [(0, 70.0, 520), (0, 70.0, 518)], lines)
    _, early = settle(Watchdog(idle_s=120), st, 200)
    assert early.name == "watching"  # no model resident: weaker evidence, twice the window
    _, v = settle(Watchdog(idle_s=120), st, 241)
    assert v.name == "stalled-idle", v
    assert "only 0.5 GiB or less in use (no model resident)" in v.evidence[1], v.evidence
    assert "threshold 240 s, twice the stall window" in v.evidence[-1], v.evidence


def test_where_the_gpus_cannot_be_read_idle_ranks_and_a_silent_log_are_a_stall():
    """NVML unusable (a driver/library mismatch, a container without it): no rank holds a GPU the
    agent can see; every rank idle on the CPU, the port closed and the log silent past the window
    are stalled-idle all the same, and the evidence says what it rests on."""
    lines = ["[2026 TP0] Load weight end. mem usage=76.0 GB.", "[2026 TP0] Capture cuda graph begin."]
    st = host([(0, 0.0), (1, 0.0)], [], lines)
    st.agent.gpu_source = "none"
    assert settle(Watchdog(idle_s=120), st, 200)[1].name == "watching"
    _, v = settle(Watchdog(idle_s=120), st, 241)
    assert v.name == "stalled-idle" and "the GPUs cannot be read on this host" in v.evidence[1], v
    busy = host([(0, 0.0), (1, 30.0)], [], lines)
    assert settle(Watchdog(idle_s=120), busy, 241)[1].name == "watching"  # a rank at work: not idle


def test_ranks_matched_to_no_gpu_are_idle_only_while_every_gpu_of_the_host_is():
    """In a container the GPUs' processes keep their host pids: no rank is matched to a GPU, so
    every GPU of the host stands in for them; a busy one is not an idle run."""
    lines = ["[2026 TP0] Load weight end. mem usage=76.0 GB.", "[2026 TP0] Capture cuda graph begin."]
    quiet = host([(0, 0.0), (1, 0.0)], [(0, 70.0, 70000), (0, 70.0, 70000)], lines)
    busy = host([(0, 0.0), (1, 0.0)], [(0, 70.0, 70000), (97, 600.0, 70000)], lines)
    for st in (quiet, busy):
        for g in st.gpus.values():
            g.processes = []
        for p in st.procs.values():
            p.gpus = []
    _, v = settle(Watchdog(idle_s=120), quiet, 241)
    assert v.name == "stalled-idle" and "no rank matched to a GPU; all 2 GPUs of the host" in v.evidence[1], v
    assert settle(Watchdog(idle_s=120), busy, 241)[1].name != "stalled-idle"


def test_a_dead_rank_is_crashed_with_its_exit_code():
    lines = ["[2026] Rank 5 scheduler died during initialization (exit code: -9). If your system ..."]
    st = host([(r, 10.0) for r in range(8)], [(0, 45.0, 30000)] * 8, lines)
    _, verdict = settle(Watchdog(), st, 1)
    assert verdict.name == "crashed" and verdict.odd_rank == 5 and "exit code -9" in verdict.evidence[0]


def test_with_nothing_in_the_log_the_rank_that_went_first_is_named():
    """Ranks 0 and 5 dead, the log silent: rank 5 went a sample before rank 0 (which the server took
    down after it), so rank 5 is named, not the lowest rank."""
    st = host([(r, 10.0) for r in range(8)], [(0, 45.0, 30000)] * 8)
    st.apply({"t": "sample", "seq": 2, "gone": [105]})
    st.procs[105].exit_code = 1
    st.apply({"t": "sample", "seq": 3, "gone": [100]})
    st.procs[100].exit_code = -9
    st.procs[105].gone_at, st.procs[100].gone_at = 10.0, 11.0
    _, verdict = settle(Watchdog(), st, 1)
    assert verdict.name == "crashed" and verdict.odd_rank == 5, verdict
    assert verdict.evidence[0] == "rank 5 died (exit code 1)" and "2 of 8 ranks gone: 0, 5" in verdict.evidence[1]


def test_phases_and_line_ranks():
    st = host(
        [(0, 1.0)],
        [(0, 45.0, 30000)],
        [
            "[2026-11-30 10:00:00 TP0] Load weight begin. avail mem=94 GB",
            "Loading safetensors checkpoint shards:  45% Completed | 29/64 [00:15<00:19, 1.80it/s]",
        ],
    )
    assert str(phase_of(st, "/l")) == "loading weights 29/64 shards"
    assert parse("[2026-11-30 10:00:00 TP3] x").rank == 3
    assert parse("(Worker_TP2 pid=130) INFO x").rank == 2 and parse("[2026-11-30 10:00:00] x").rank is None


def test_phases_read_together_in_one_late_sample_each_keep_their_own_time():
    """A loaded host's sample can bring loading, KV cache and graph capture in one batch of lines:
    each phase is in the run's phase times, placed by its line's own clock before the newest line."""
    st = host([(0, 1.0)], [(0, 45.0, 30000)])
    dog = Watchdog()
    dog.begin(st, started=10.0)
    st.apply(
        {
            "t": "log",
            "path": "/l",
            "lines": [
                "[2026-11-30 10:00:01 TP0] Load weight begin. avail mem=94 GB",
                "[2026-11-30 10:00:02 TP0] KV Cache is allocated. #tokens: 1000, K size: 1 GB, V size: 1 GB",
                "[2026-11-30 10:00:04 TP0] Capture cuda graph begin. This can take up to several minutes.",
            ],
        }
    )
    phase, _ = dog.update(st, 14.0, "/l")
    assert phase.name == "capturing cuda graphs"
    assert dog.phase_times() == {"loading weights": 1.0, "kv cache": 2.0, "capturing cuda graphs": 4.0}
    st.apply({"t": "log", "path": "/l", "lines": ["no clock here: The server is fired up and ready to roll!"]})
    dog.update(st, 15.0, "/l")
    assert list(dog.phase_times()) == ["loading weights", "kv cache", "capturing cuda graphs", "ready"]
    assert dog.phase_times()["ready"] == 5.0


def test_a_first_sight_of_a_run_under_way_keeps_only_its_current_phase():
    """A cockpit opened on a serving run reads the log's tail of phases at once: they are history,
    written before its clock started, never phase times of 0 s (the ledger's typical times)."""
    st = host(
        [(0, 1.0)],
        [(0, 45.0, 30000)],
        [
            "[2026-11-30 10:00:01 TP0] Load weight begin. avail mem=94 GB",
            "[2026-11-30 10:00:02 TP0] KV Cache is allocated. #tokens: 1000, K size: 1 GB, V size: 1 GB",
            "[2026-11-30 10:09:04 TP0] The server is fired up and ready to roll!",
        ],
    )
    dog = Watchdog()
    dog.update(st, 100.0, "/l")
    assert dog.phase_times() == {"ready": 0.0}


def test_begin_keeps_its_start_on_a_state_whose_run_was_replaced_before():
    st = host([(0, 1.0)], [(0, 45.0, 30000)], ["[2026-11-30 10:00:01 TP0] Load weight begin. avail mem=94 GB"])
    st.generation = 1  # a run replaced outside the cockpit, earlier
    dog = Watchdog()
    dog.begin(st, started=10.0)
    st.apply({"t": "log", "path": "/l", "lines": ["[2026-11-30 10:00:04 TP0] Capture cuda graph begin."]})
    dog.update(st, 14.0, "/l")
    assert dog.started == 10.0 and dog.phase_times() == {"capturing cuda graphs": 4.0}


def test_a_phase_several_times_slower_than_earlier_runs_is_slow():
    lines = ["[2026 TP0] Load weight begin. avail mem=94 GB"]
    st = host([(r, 30.0) for r in range(8)], [(3, 90.0, 30000)] * 8, lines)
    st.logs["/l"].last_line_at = 0.0
    dog = Watchdog(slow_factor=3.0, earlier={"loading weights": 30.0})
    dog.update(st, 0.0, "/l")
    early = dog.update(st, 80.0, "/l")[1]  # 80 s < 3 x 30 s: not slow; a silent log is no evidence of progress
    assert (
        early.name == "watching"
        and early.evidence[0] == "no sign of progress: log silent for 80 s, and no stall pattern yet"
    )
    phase, verdict = dog.update(st, 95.0, "/l")
    assert verdict.name == "slow" and "took 30 s" in verdict.evidence[0] and phase.name == "loading weights"


def test_a_traceback_with_no_header_is_a_crash_only_when_the_processes_say_so():
    """An uncaught exception ends its process; a traceback from a process that went on (every rank alive)
    is evidence, not a crash. `cockpit explain` has no processes: it judges the lines alone."""
    lines = [
        "[2026-11-30 10:00:00 TP0] Load weight begin. avail mem=94 GB",
        "Traceback (most recent call last):",
        '  File "/x/sglang/srt/utils.py", line 12, in f',
        "ValueError: boom",
    ]
    st = host([(0, 10.0), (1, 10.0)], [(0, 45.0, 30000)] * 2, lines)
    _, verdict = settle(Watchdog(), st, 1)
    assert verdict.name == "ok"
    st.apply(
        {
            "t": "sample",
            "seq": 2,
            "gone": [101],
            "procs": [
                {
                    "pid": 100,
                    "ppid": 1,
                    "name": "sglang::scheduler_TP0",
                    "cmdline": ["sglang::scheduler_TP0"],
                    "status": "S",
                    "cpu_pct": 0.0,
                }
            ],
        }
    )
    _, verdict = settle(Watchdog(), st, 2)
    assert verdict.name == "crashed" and any("ValueError: boom" in e for e in verdict.evidence)


# ----------------------------------------------------------------------------- ok needs evidence


def test_ok_is_a_claim_with_its_evidence():
    """A run whose log just moved is ok, and says so; one whose log has said nothing for longer
    than the stall windows while its GPUs neither compute nor poll is not called ok."""
    st = host([(0, 30.0), (1, 30.0)], [(40, 200.0, 9866), (40, 200.0, 9866)], ["[x TP0] Load weight begin."])
    _, v = settle(Watchdog(spin_s=10, idle_s=20), st, 2)
    assert v.name == "ok" and v.evidence == ["the log shows work 2 s ago"]
    _, v = settle(Watchdog(spin_s=10, idle_s=20), st, 15)
    assert v.name == "watching" and v.until is None  # no host clock in this state: no time to name
    assert "waiting for a sign of progress" in v.evidence[-1] and "decided by ?" in v.evidence[-1]
    st.sample_ts = 1000.0
    _, v = settle(Watchdog(spin_s=10, idle_s=20), st, 15)
    assert v.until == 1005.0  # the longest window (20 s) from the last work (15 s ago)


def test_busy_gpus_drawing_power_are_evidence_of_progress():
    st = host([(0, 100.0), (1, 100.0)], [(86, 626.0, 9866), (76, 605.0, 9866)])
    _, v = settle(Watchdog(spin_s=1, idle_s=1), st, 100)
    assert v.name == "ok" and v.evidence[0].startswith("GPUs computing: 2 at 76 % or more, up to 626 W")


VLLM_STATS = (
    "(APIServer pid=1) INFO 12-01 10:00:{s:02d} [loggers.py:123] Engine 000: Avg prompt throughput: 0.0 "
    "tokens/s, Avg generation throughput: {g} tokens/s, Running: {n} reqs, Waiting: 0 reqs, "
    "GPU KV cache usage: 1.2%, Prefix cache hit rate: 0.0%"
)


def test_stats_lines_at_zero_throughput_with_requests_running_are_a_stall_since_the_first():
    """vLLM keeps logging its stats line while its requests are frozen: the log moves, the run
    does not. The stall began at the first such line, measured back from the file's mtime through
    the lines' own clocks, so the first look says so at once (the port still answers)."""
    lines = [VLLM_STATS.format(s=0, g="512.3", n=8)] + [VLLM_STATS.format(s=s, g="0.0", n=8) for s in (10, 20, 30, 40)]
    st = host([(0, 0.0), (1, 0.0)], [(0, 80.0, 9866), (0, 80.0, 9866)], lines)
    st.ports = [type(st.ports[0])(8000, True, 100)]
    st.sample_ts, st.logs["/l"].written_at = 1000.0, 998.0  # the last stats line, 2 s ago
    dog = Watchdog(spin_s=15, idle_s=20, ports=[8000])
    _, v = dog.update(st, 0.0, "/l")
    assert v.name == "stalled-idle" and v.detail == "requests frozen", v
    assert v.evidence[0].startswith(
        "the engine's stats say 8 requests running at 0 tokens/s since 12-01 10:00:10 (32 s)"
    )
    assert v.since == 1000.0 - 42  # from the last work seen (the 10:00:00 line), not the first zero line
    assert "health alone does not prove progress" in v.evidence[-1]


def test_a_ready_server_with_nothing_in_flight_is_ok_and_idle():
    lines = ["[x TP0] The server is fired up and ready to roll!", VLLM_STATS.format(s=0, g="0.0", n=0)]
    st = host([(0, 0.0)], [(0, 80.0, 90000)], lines)
    st.ports = [type(st.ports[0])(8000, True, 100)]
    _, v = settle(Watchdog(spin_s=15, idle_s=20, ports=[8000]), st, 300)
    assert v.name == "ok" and v.evidence[0].startswith("ready and idle: port open, GPUs idle, no request in flight")


def test_probe_access_lines_are_no_progress():
    """The cockpit's own /health probes write access lines into vLLM's log every few seconds:
    they prove the HTTP server answers, not that the run moves."""
    lines = ["[x TP0] Capture cuda graph begin."] + [
        f'INFO:     127.0.0.1:5{n:04d} - "GET /health HTTP/1.1" 200 OK' for n in range(5)
    ]
    st = host([(0, 0.0), (1, 0.0)], [(0, 80.0, 90000), (0, 80.0, 90000)], lines)
    dog = Watchdog(spin_s=15, idle_s=20)
    dog.update(st, 0.0, "/l")
    st.apply({"t": "log", "path": "/l", "lines": ['INFO:     127.0.0.1:6000 - "GET /health HTTP/1.1" 200 OK']})
    st.logs["/l"].last_line_at = 30.0  # the probe's line arrived now
    _, v = dog.update(st, 30.0, "/l")
    assert v.name == "stalled-idle" and v.detail == "launch stopped at 'capturing cuda graphs'", v


def test_a_frozen_stats_line_under_fresh_probe_lines_dates_from_its_own_clock():
    """Seen on a real H200 (docs/VALIDATION.md, run 10): the cockpits' own /health and /metrics
    probes keep writing access lines without a timestamp into vLLM's log, so the file's mtime
    is always fresh. The frozen stats line's own clock, through the host's UTC offset, says how
    old the stall is; a clock that would put it before the run started or after the last write
    (a server in another time zone) is not believed."""
    import calendar

    stamp = calendar.timegm((2026, 12, 1, 10, 0, 10))
    lines = [VLLM_STATS.format(s=0, g="512.3", n=8), VLLM_STATS.format(s=10, g="0.0", n=8)] + [
        f'(APIServer pid=1) INFO:     127.0.0.1:5{n:04d} - "GET /health HTTP/1.1" 200 OK' for n in range(30)
    ]
    st = host([(0, 0.0), (1, 0.0)], [(0, 80.0, 9866), (0, 80.0, 9866)], lines)
    st.ports = [type(st.ports[0])(8000, True, 100)]
    st.agent.utc_offset = 3600  # the host's local time is UTC+1: the line's 10:00:10 is 09:00:10 UTC
    stamp_local = stamp - 3600
    for p in st.procs.values():
        p.started = stamp_local - 600
    st.sample_ts, st.logs["/l"].written_at = stamp_local + 60.0, stamp_local + 59.0
    _, v = Watchdog(spin_s=15, idle_s=20, ports=[8000]).update(st, 0.0, "/l")
    assert v.name == "stalled-idle" and v.detail == "requests frozen", v
    assert "since 12-01 10:00:10 (60 s)" in v.evidence[0]
    for p in st.procs.values():
        p.started = stamp_local + 30  # the run is younger than the line would be: the clock is not believed
    _, v = Watchdog(spin_s=15, idle_s=20, ports=[8000]).update(st, 0.0, "/l")
    assert v.name != "stalled-idle", v


# ----------------------------------------------------------------------------- the GPU's own word (issue 28)


def _xid_host(xid=(), gpu_extra=None, dead=(), ts=1_000_000.0):
    st = host([(r, 30.0) for r in range(4)], [(90, 500.0, 80000)] * 4, ["[2026 TP0] Decode batch. #running-req: 1"])
    st.apply(
        {
            "t": "sample",
            "seq": 2,
            "ts": ts,
            "gpus": [dict({"index": i}, **(gpu_extra or {}).get(i, {})) for i in range(4)],
            "procs": [
                {"pid": 100 + r, "ppid": 1, "name": f"sglang::scheduler_TP{r}", "status": "S", "cpu_pct": 30.0}
                for r in range(4)
                if r not in dead
            ],
            "gone": [100 + r for r in dead],
            "xid": [list(x) for x in xid],
        }
    )
    return st


def _more(st, seq, gpus):
    st.apply(
        {
            "t": "sample",
            "seq": seq,
            "gpus": gpus,
            "procs": [
                {"pid": 100 + r, "ppid": 1, "name": f"sglang::scheduler_TP{r}", "status": "S", "cpu_pct": 30.0}
                for r in range(4)
            ],
        }
    )


def test_a_rank_dead_after_an_xid_on_its_gpu_is_crashed_naming_the_xid():
    st = _xid_host(xid=[(3, 1_000_000.0 - 20, 79, None)], dead=(3,))
    _, verdict = Watchdog().update(st, 1.0, "/l")
    assert verdict.name == "crashed" and verdict.odd_rank == 3
    assert verdict.evidence[0].startswith("rank 3 died: GPU 3 Xid 79 (fallen off the bus) at ")


def test_an_old_xid_is_not_the_cause():
    st = _xid_host(xid=[(3, 1_000_000.0 - 3600, 13, 4242)], dead=(3,))
    _, verdict = Watchdog().update(st, 1.0, "/l")
    assert verdict.name == "crashed" and "Xid" not in verdict.evidence[0]


def test_a_rank_dead_on_a_lost_gpu_is_crashed_naming_the_loss():
    st = _xid_host(gpu_extra={2: {"lost": True, "util_pct": None}}, dead=(2,))
    _, verdict = Watchdog().update(st, 1.0, "/l")
    assert verdict.name == "crashed" and verdict.odd_rank == 2
    assert verdict.evidence[0] == "rank 2 died: GPU 2 lost (fallen off the bus: NVML answers GPU_IS_LOST)"


def test_a_pending_row_remap_is_evidence_not_a_crash():
    st = _xid_host(gpu_extra={1: {"remap_pending": True, "ecc_uncorrected": 1}})
    _, verdict = Watchdog().update(st, 1.0, "/l")
    assert verdict.name in ("ok", "watching")
    assert "GPU 1: row remap pending, uncorrected ECC 1" in verdict.evidence


def test_a_gpu_held_down_by_the_hardware_is_slow_naming_gpu_and_rank():
    st = _xid_host(gpu_extra={2: {"throttle": 0x8, "sm_clock_mhz": 1089}, 0: {"sm_clock_mhz": 1980}})
    dog = Watchdog()
    assert dog.update(st, 0.0, "/l")[1].name != "slow"  # not at the first sight
    _, verdict = dog.update(st, 6.0, "/l")
    assert verdict.name == "slow" and verdict.odd_rank == 2
    assert verdict.evidence[0].startswith("GPU 2 (rank 2) held down by the hardware: hw-slowdown, SM 1089 MHz")
    _more(st, 3, [{"index": 2, "throttle": 0}])
    assert dog.update(st, 7.0, "/l")[1].name == "ok"


def test_growing_nvlink_replays_read_slow_and_stopped_ones_do_not():
    st = _xid_host(gpu_extra={1: {"nvlink_replay": 10}})
    dog = Watchdog()
    assert dog.update(st, 0.0, "/l")[1].name != "slow"
    _more(st, 3, [{"index": 1, "nvlink_replay": 250}])
    _, verdict = dog.update(st, 10.0, "/l")
    assert verdict.name == "slow" and verdict.odd_rank == 1 and "NVLink replays growing: +240" in verdict.evidence[0]
    _more(st, 4, [{"index": 1, "nvlink_replay": 250}])
    assert dog.update(st, 100.0, "/l")[1].name == "ok"  # no growth for longer than the window


def test_xid_events_survive_a_reconnected_agent_and_bad_rows_are_dropped():
    st = _xid_host(xid=[(3, 999_990.0, 79, None)])
    st.apply({"t": "sample", "seq": 3, "xid": []})  # a new agent after a reconnect: it heard nothing yet
    st.apply(
        {
            "t": "sample",
            "seq": 4,
            "xid": [[1, 999_995.0, 13, 77], ["x", 1, 2, 3], [1, 999_995.2, 13, 77], [3, 999_990.4, 79, None]],
        }
    )  # the kernel log read again by the new agent
    assert [(e.gpu, e.code, e.pid) for e in st.xid] == [(3, 79, None), (1, 13, 77)] and st.dropped["xid"] == 1


def test_ranks_that_hit_the_watchdog_in_the_same_second_are_said_together():
    """All eight ranks' NCCL watchdog timeouts in one second: the live verdict names no first of them."""
    line = (
        "[rank{r}]:[E223 11:14:34.99{r}762039 ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught collective "
        "operation timeout: WorkNCCL(SeqNum=91885, OpType=ALLREDUCE) ran for 600037 milliseconds before timing out."
    )
    st = host(
        [(r, 10.0) for r in range(8)], [(0, 45.0, 30000)] * 8, [line.format(r=r) for r in (4, 0, 1, 2, 3, 5, 6, 7)]
    )
    _, verdict = settle(Watchdog(), st, 1)
    assert verdict.name == "crashed" and verdict.odd_rank is None
    assert verdict.evidence[0] == "all 8 ranks together: nccl-timeout"


def test_ranks_gone_after_a_stop_the_log_tells_are_stopped_not_crashed():
    """SGLang's tokenizer manager says it received the operator's SIGTERM (its sigterm_handler's words); the
    scheduler's error and the ranks going after it are its shutdown's. A failure before the stop is a crash."""
    stop = (
        "[2026-12-01 10:00:00] SIGTERM received. signum=<Signals.SIGTERM: 15> frame=None. Draining requests and "
        "shutting down..."
    )
    err = "[2026-12-01 10:00:01 TP0] Scheduler hit an exception: Traceback (most recent call last):"
    st = host(
        [(r, 10.0) for r in range(4)], [(0, 45.0, 30000)] * 4, ["[2026 TP0] Decode batch. #running-req: 1", stop, err]
    )
    st.apply(
        {
            "t": "sample",
            "seq": 2,
            "gpus": [{"index": i} for i in range(4)],
            "procs": [],
            "gone": [100 + r for r in range(4)],
        }
    )
    phase, verdict = Watchdog().update(st, 1.0, "/l")
    assert verdict.name == "stopped" and verdict.odd_rank is None, verdict
    assert "SIGTERM" in verdict.evidence[0] and phase.name != "crashed"
    st2 = host(
        [(r, 10.0) for r in range(4)], [(0, 45.0, 30000)] * 4, ["[2026 TP0] Decode batch. #running-req: 1", err, stop]
    )
    st2.apply(
        {
            "t": "sample",
            "seq": 2,
            "gpus": [{"index": i} for i in range(4)],
            "procs": [],
            "gone": [100 + r for r in range(4)],
        }
    )
    assert Watchdog().update(st2, 1.0, "/l")[1].name == "crashed"
