"""A stall's verdict once given (judge/diagnose.py): it holds until the run itself moves, and progress
ends it only on UNSTALL_SAMPLES samples in a row (docs/verdicts.md), so a blip never clears an
alert; and the odd rank of a spinning stall named by its CPU when every GPU polls."""

from test_diagnose import host, settle

from cockpit.judge.diagnose import UNSTALL_SAMPLES, Watchdog

RANKS = 4


def spinning_host():
    """Every GPU at 100 % drawing 120 W of 700 W (a collective polling), rank 2's CPU idle."""
    return host(
        [(0, 100.0), (1, 100.0), (2, 3.0), (3, 100.0)],
        [(100, 120.0, 9866)] * RANKS,
        ["[x TP0] Decode batch. step 5000"],
    )


def sample(st, util, power, cpu):
    """The next sample: every GPU at `util` % drawing `power` W, every rank's CPU at `cpu` %."""
    st.apply(
        {
            "t": "sample",
            "seq": st.seq + 1,
            "gpus": [
                {"index": i, "util_pct": util, "power_w": power, "mem_used_mib": 9866, "processes": [[100 + i, 9858]]}
                for i in range(RANKS)
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
                for r in range(RANKS)
            ],
        }
    )


def test_every_gpu_polling_names_the_odd_rank_by_its_cpu():
    _, verdict = settle(Watchdog(spin_s=15), spinning_host(), 16)
    assert (verdict.name, verdict.odd_rank) == ("stalled-spinning", 2)
    assert verdict.evidence[:2] == [
        "GPU of ranks 0,1,2,3 at 100 % utilization drawing 120 W of 700 W: a kernel polling, not computing (a "
        "collective that never completes)",
        "rank 2 is the odd one out: CPU 3 % against 100 % for the others",
    ]


def test_no_odd_rank_when_the_cpus_do_not_single_one_out():
    st = host(
        [(0, 100.0), (1, 100.0), (2, 3.0), (3, 3.0)], [(100, 120.0, 9866)] * RANKS, ["[x TP0] Decode batch. step 5000"]
    )
    _, verdict = settle(Watchdog(spin_s=15), st, 16)
    assert (verdict.name, verdict.odd_rank) == ("stalled-spinning", None)
    assert not any("odd one out" in e for e in verdict.evidence), verdict.evidence


def test_progress_ends_a_stall_only_on_three_samples_in_a_row():
    st = spinning_host()
    dog = Watchdog(spin_s=15)
    _, stall = settle(dog, st, 16)
    assert stall.name == "stalled-spinning" and UNSTALL_SAMPLES == 3
    computing = "GPUs computing: 4 at 86 % or more, up to 626 W"
    said = []
    t = 16.0
    for util, power, cpu in [(86, 626.0, 100.0)] * 2 + [(0, 45.0, 0.0)] + [(86, 626.0, 100.0)] * 3:
        sample(st, util, power, cpu)
        t += 1
        _, verdict = dog.update(st, t, "/l")
        said.append((verdict.name, verdict.odd_rank, verdict.evidence[-1]))
        if len(said) == 1:  # a second look at the same sample counts nothing more
            assert dog.update(st, t + 0.5, "/l")[1].evidence[-1] == verdict.evidence[-1]
    assert said == [
        ("stalled-spinning", 2, f"held: progress seen on 1 of 3 samples in a row: {computing}"),
        ("stalled-spinning", 2, f"held: progress seen on 2 of 3 samples in a row: {computing}"),
        ("stalled-spinning", 2, "held: no sign of the run's own progress since"),  # the row broken: counted anew
        ("stalled-spinning", 2, f"held: progress seen on 1 of 3 samples in a row: {computing}"),
        ("stalled-spinning", 2, f"held: progress seen on 2 of 3 samples in a row: {computing}"),
        ("ok", None, computing),
    ]
    assert [e for e in dog.update(st, t + 1, "/l")[1].evidence if e.startswith("held: ")] == []


def test_a_stall_held_keeps_its_own_evidence_and_start():
    st = spinning_host()
    dog = Watchdog(spin_s=15)
    _, stall = settle(dog, st, 16)
    sample(st, 86, 626.0, 100.0)
    _, held = dog.update(st, 17.0, "/l")
    assert held.evidence[:-1] == stall.evidence and held.since == stall.since and held.detail == stall.detail


def test_a_run_whose_ranks_are_gone_is_not_held_stalled():
    st = spinning_host()
    dog = Watchdog(spin_s=15)
    settle(dog, st, 16)
    st.apply(
        {
            "t": "sample",
            "seq": st.seq + 1,
            "gone": [100 + r for r in range(RANKS)],
            "procs": [],
            "gpus": [
                {"index": i, "util_pct": 0, "power_w": 45.0, "mem_used_mib": 0, "processes": []} for i in range(RANKS)
            ],
        }
    )
    _, verdict = dog.update(st, 17.0, "/l")
    assert verdict.name == "crashed", verdict
