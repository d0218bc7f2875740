"""The stall called in seconds on positive evidence (docs/diagnosis.md#stacks): real processes
in real waits dumped twice by py-spy without being stopped, and the watchdog's use of such a look;
the windows learned from the layout's good runs; and what is never the run's progress (#44): an
access line that makes no token, a log that moves while the token counters stand, a stale scrape."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from cockpit.actions.dumps import local_pyspy
from cockpit.agent.pyspy import pyspy_dump
from cockpit.host.state import HostState
from cockpit.judge.diagnose import LOOK_EVERY_S, QUIET_S, Watchdog
from cockpit.read.metrics import MetricsView, Scrape
from cockpit.read.stacks import StackLook, look_of

# Each function name is a frame py-spy shows; each blocks the way its name says.
WAITERS = textwrap.dedent("""\
    import multiprocessing as mp, os, select, socket, sys, time

    def all_reduce(barrier):
        barrier.wait()

    def wait_for_graph_pool():
        while True:
            time.sleep(0.5)

    def poll_requests():
        a, b = socket.socketpair()
        while True:
            select.select([a], [], [], 0.5)

    def rendezvous_wait_for_nodes():
        a, b = socket.socketpair()
        while True:
            select.select([a], [], [], 0.5)

    def read_shard(path):
        fd = os.open(path, os.O_RDONLY)
        while True:
            if not os.read(fd, 1 << 20):
                os.lseek(fd, 0, 0)
            time.sleep(0.05)

    def compile_kernels():
        x = 0
        while True:
            for i in range(1000):
                x = (x * 31 + i) % 1000003
            x = str(x).encode().hex().count("a") + x

    if __name__ == "__main__":
        what = sys.argv[1]
        print("ready", flush=True)
        if what == "all_reduce":
            all_reduce(mp.get_context("spawn").Barrier(2))
        elif what == "read_shard":
            read_shard(sys.argv[2])
        else:
            globals()[what]()
""")


@pytest.fixture
def waiters(tmp_path):
    script = tmp_path / "waiters.py"
    script.write_text(WAITERS)
    shard = tmp_path / "shard.bin"
    shard.write_bytes(os.urandom(1 << 20) * 8)
    procs = {}

    def start(*names):
        for name in names:
            argv = [sys.executable, str(script), name] + ([str(shard)] if name == "read_shard" else [])
            p = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
            assert p.stdout.readline().strip() == "ready"
            procs[name] = p
        time.sleep(0.5)  # each in its loop
        return {name: p.pid for name, p in procs.items()}

    yield start
    for p in procs.values():
        p.kill()
        p.wait()


def two_dumps(pids: dict[str, int], gap: float = 1.0) -> StackLook:
    """What forensics.look does through the agent: two non-blocking dumps `gap` apart."""
    ranks = dict(enumerate(pids.values()))
    first = pyspy_dump(list(ranks.values()), local_pyspy(), 20.0, nonblocking=True)["dumps"]
    time.sleep(gap)
    second = pyspy_dump(list(ranks.values()), local_pyspy(), 20.0, nonblocking=True)["dumps"]
    texts = [{r: d[str(pid)]["text"] for r, pid in ranks.items() if d[str(pid)]["ok"]} for d in (first, second)]
    for d in (first, second):
        assert all(d[str(pid)]["ok"] for pid in ranks.values()), d
    read = {r: second[str(pid)]["rchar"] - first[str(pid)]["rchar"] for r, pid in ranks.items()}
    return look_of(texts[0], texts[1], gap, time.monotonic(), read)


def test_ranks_still_in_waits_are_seen_so_by_two_non_blocking_dumps(waiters):
    """A collective, a sleep in a wait loop, a socket poll: every rank still, each in a wait; the
    verdict's words name the waits and the gap."""
    look = two_dumps(waiters("all_reduce", "wait_for_graph_pool", "poll_requests"))
    assert look.still, (look.waits, look.moved, look.where)
    assert look.waits[0].startswith("a collective (all_reduce)")
    assert look.waits[1] == "a sleep in a wait loop"
    assert look.waits[2] == "a socket poll" or look.waits[2] == "a sleep in a wait loop", look.waits
    said = look.evidence()[0]
    assert said.startswith("stacks unchanged across two dumps 1 s apart, all in waits: rank 0 in a collective")


@pytest.mark.parametrize(
    "busy, why",
    [("read_shard", "reading"), ("compile_kernels", "not in a wait"), ("rendezvous_wait_for_nodes", "in a rendezvous")],
)
def test_a_rank_reading_computing_or_in_a_rendezvous_is_never_still(waiters, busy, why):
    """A weight load from a slow disk (its read bytes grow), a JIT on the CPU, a rendezvous waiting
    for a late node: healthy however quiet the log; the look says why it is no stall."""
    look = two_dumps(waiters("all_reduce", busy))
    assert not look.still
    assert not look.parked or busy == "compile_kernels"  # a loop in place: a stall only where the GPUs spin
    assert why in look.evidence()[0] or (busy == "compile_kernels" and "moved" in look.evidence()[0]), look.evidence()


# ----------------------------------------------------------------------------- the watchdog's use


def host(port_open=False, lines=("[2026 TP0] Capture draft cuda graph begin.",), ranks=4):
    st = HostState("t")
    st.apply(
        {"t": "hello", "gpus": [{"index": i, "mem_total_mib": 97887, "power_limit_w": 600.0} for i in range(ranks)]}
    )
    st.apply(
        {
            "t": "sample",
            "seq": 1,
            "gpus": [
                {"index": i, "util_pct": 0, "power_w": 40.0, "mem_used_mib": 80000, "processes": [[100 + i, 79000]]}
                for i in range(ranks)
            ],
            "procs": [
                {
                    "pid": 100 + r,
                    "ppid": 1,
                    "name": f"sglang::scheduler_TP{r}",
                    "cmdline": [f"sglang::scheduler_TP{r}"],
                    "status": "S",
                    "cpu_pct": 0.0,
                }
                for r in range(ranks)
            ],
            "ports": [{"port": 8000, "listening": port_open, "pid": 100 if port_open else None}],
        }
    )
    st.apply({"t": "log", "path": "/l", "lines": list(lines)})
    st.logs["/l"].last_line_at = 0.0
    return st


def still(at: float, ranks=4, odd=None) -> StackLook:
    look = StackLook(
        at,
        4.0,
        {r: "a collective (Rank.all_reduce)" for r in range(ranks)},
        {r: "Condition.wait (synchronize.py:268)" for r in range(ranks)},
    )
    if odd is not None:
        look.waits[odd], look.where[odd] = "a sleep in a wait loop", "wait_for_graph_pool (server.py:265)"
        look.odd_rank, look.odd_said = odd, [f"rank {odd} not in Rank.all_reduce"]
    return look


def test_a_silent_run_asks_for_a_look_and_a_still_one_is_the_stall_with_its_evidence():
    dog = Watchdog()  # the defaults: nothing about stalls in the layout
    dog.looks = True
    st = host()
    assert dog.update(st, 0.0, "/l")[1].name == "ok" and not dog.want_look
    _, v = dog.update(st, QUIET_S + 1, "/l")
    assert dog.want_look and v.name in ("ok", "watching")
    dog.want_look = False
    dog.seen_stacks(still(QUIET_S + 6, odd=2))
    phase, v = dog.update(st, QUIET_S + 6.5, "/l")
    assert v.name == "stalled-idle" and v.odd_rank == 2, v
    assert v.evidence[0].startswith("stacks unchanged across two dumps 4 s apart, all in waits: ")
    assert any("port closed" in e for e in v.evidence) and v.detail == "launch stopped at 'capturing draft cuda graphs'"


def test_a_look_from_before_the_silence_or_one_that_moved_calls_nothing_and_the_next_waits_its_window():
    dog = Watchdog()
    dog.looks = True
    st = host()
    dog.update(st, 0.0, "/l")
    dog.seen_stacks(still(-2.0))  # its first dump came before the log went silent
    assert dog.update(st, QUIET_S + 1, "/l")[1].name != "stalled-idle" and dog.want_look
    moved = still(QUIET_S + 5)
    moved.moved = [1]
    dog.seen_stacks(moved)
    _, v = dog.update(st, QUIET_S + 6, "/l")
    assert v.name != "stalled-idle" and not dog.want_look  # at most one look per window
    assert dog.update(st, QUIET_S + 5 + LOOK_EVERY_S, "/l") and dog.want_look


def test_spinning_gpus_and_a_look_where_no_rank_moved_is_stalled_spinning_in_seconds():
    """Ranks 0-2's GPUs poll a flag at 100 % and low power, rank 3's is idle, the log silent: a
    look where no rank moved and the others wait in the collective is stalled-spinning, rank 3
    named, long before the 60 s spin window; a look where rank 3 moved calls nothing."""

    def spinning() -> HostState:
        st = host()
        for i in range(3):
            st.gpus[i].util_pct, st.gpus[i].power_w = 100, 120.0
        return st

    dog = Watchdog()
    dog.looks = True
    st = spinning()
    dog.update(st, 0.0, "/l")
    dog.update(st, QUIET_S + 1, "/l")
    assert dog.want_look
    look = still(QUIET_S + 6, odd=3)
    look.waits[3], look.where[3] = None, "capture_one_graph (server.py:270)"
    moved = StackLook(look.at, look.gap_s, dict(look.waits), dict(look.where), moved=[3])
    dog.seen_stacks(moved)
    assert dog.update(st, QUIET_S + 6.5, "/l")[1].name != "stalled-spinning"
    other = Watchdog()
    other.looks = True
    other.update(st, 0.0, "/l")
    other.update(st, QUIET_S + 1, "/l")
    other.seen_stacks(look)
    _, v = other.update(st, QUIET_S + 6.5, "/l")
    assert v.name == "stalled-spinning" and v.odd_rank == 3, v
    assert v.evidence[0].startswith("stacks: rank 3 not in a wait"), v.evidence


def test_without_looks_the_windows_decide_as_before():
    """A monitor that takes no look (--no-forensics, --read-only, a fleet's overview): no look is
    asked for, and the default windows decide."""
    dog = Watchdog()
    st = host()
    dog.update(st, 0.0, "/l")
    assert dog.update(st, 70.0, "/l")[1].name == "watching" and not dog.want_look
    assert dog.update(st, 121.0, "/l")[1].name == "stalled-idle"


def test_an_idle_server_with_no_request_is_ok_and_never_looked_at():
    """Ready, its port open, nothing in flight: idle is fine; a stall needs work waiting."""
    dog = Watchdog(ports=[8000])
    dog.looks = True
    st = host(port_open=True, lines=["[2026] The server is fired up and ready to roll!"])
    for t in (0.0, 10.0, 60.0, 400.0):
        _, v = dog.update(st, t, "/l")
        assert v.name == "ok" and not dog.want_look, v
    assert "ready and idle" in v.evidence[0]


def test_a_phase_silent_far_past_its_longest_in_good_runs_is_stalled_by_the_learned_window():
    dog = Watchdog(windows={"capturing draft cuda graphs": (6.0, 3)})
    st = host()
    dog.update(st, 0.0, "/l")
    assert dog.update(st, 11.0, "/l")[1].name != "stalled-idle"
    _, v = dog.update(st, 13.0, "/l")
    assert v.name == "stalled-idle", v
    assert v.evidence[0].startswith("phase 'capturing draft cuda graphs' took at most 6 s in 3 good runs")
    moving = Watchdog(windows={"capturing draft cuda graphs": (6.0, 3)})
    moving.looks = True
    moving.update(st, 0.0, "/l")
    look = still(8.0)
    look.reading = [0]  # a look that saw a rank read outranks the window
    moving.seen_stacks(look)
    assert moving.update(st, 13.0, "/l")[1].name != "stalled-idle"


# ----------------------------------------------------------------------------- what is not progress (#44)


def access(path: str, status: int, method: str = "GET") -> str:
    return f'INFO:     127.0.0.1:5555 - "{method} {path} HTTP/1.1" {status} Not Found'


def test_access_lines_that_make_no_token_are_not_work():
    """A hung server's front end answers 404s, probes and model lists: never `the log shows work`.
    A completion answered is."""
    for line in (
        access("/v1/completions/x", 404, "POST"),
        access("/v1/models", 200),
        access("/metrics", 200),
        access("/nothing", 404),
        access("/v1/completions", 400, "POST"),
    ):
        dog = Watchdog(ports=[8000])
        st = host(port_open=True)
        dog.update(st, 0.0, "/l")
        st.apply({"t": "log", "path": "/l", "lines": [line]})
        _, v = dog.update(st, 100.0, "/l")
        assert not any("the log shows work" in e for e in v.evidence), (line, v)
    dog = Watchdog(ports=[8000])
    st = host(port_open=True)
    dog.update(st, 0.0, "/l")
    st.apply({"t": "log", "path": "/l", "lines": [access("/v1/completions", 200, "POST")]})
    assert any("the log shows work" in e for e in dog.update(st, 100.0, "/l")[1].evidence)


def metrics_view(*rows: tuple[float, float, float]) -> MetricsView:
    """rows: (local time, generation tokens, running requests)."""
    view = MetricsView()
    for at, gen, running in rows:
        view.add(Scrape(at, 200, {"generation_tokens": gen, "running": running, "waiting": 0.0}))
    return view


def test_frozen_token_counters_hold_a_stall_whatever_the_log_says():
    """Requests running, the counter frozen: a 404 every 2 s and any other line moving the log is
    not the run moving; the run waits, so a still look calls it even with the port open."""
    dog = Watchdog(ports=[8000])
    dog.looks = True
    st = host(port_open=True, lines=["[2026] The server is fired up and ready to roll!"])
    st.metrics = metrics_view((0.0, 500.0, 3.0), (2.0, 500.0, 3.0))
    dog.update(st, 2.0, "/l")
    st.apply({"t": "log", "path": "/l", "lines": ["[2026] a warning that is no work", access("/x", 404)]})
    st.metrics = metrics_view((0.0, 500.0, 3.0), (2.0, 500.0, 3.0), (8.0, 500.0, 3.0))
    _, v = dog.update(st, 8.0, "/l")
    assert not any("the log shows work" in e for e in v.evidence), v
    assert dog.progress.pending and "generation tokens frozen" in dog.progress.said
    st.metrics = metrics_view((0.0, 500.0, 3.0), (8.0, 500.0, 3.0), (14.0, 500.0, 3.0))
    dog.seen_stacks(still(14.0))
    _, v = dog.update(st, 14.5, "/l")
    assert v.name == "stalled-idle" and v.detail == "requests frozen", v


def test_a_stale_scrape_never_says_tokens_moving():
    """The last two good scrapes read 500 tok/s; the endpoint then stopped answering: three
    intervals on, no tokens are said moving."""
    dog = Watchdog(ports=[8000])
    st = host(port_open=True, lines=["[2026] The server is fired up and ready to roll!"])
    st.metrics = metrics_view((0.0, 0.0, 1.0), (2.0, 1000.0, 1.0))
    assert any("tokens moving: 500 tok/s" in e for e in dog.update(st, 3.0, "/l")[1].evidence)
    st.metrics.add(Scrape(4.0, None, error="timed out"))
    _, v = dog.update(st, 2.0 + 3 * 2.0 + 1.0, "/l")
    assert not any("tokens moving" in e for e in v.evidence), v
