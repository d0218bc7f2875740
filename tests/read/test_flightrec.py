"""Torch's flight recorder: the agent's reader on dumps shaped as torch writes them (constructed
here, and the two torch 2.11 wrote on H200s in run 5: see tests/data/flight-recorder/README.md),
a hostile pickle refused, the comparison that names the rank that never joined
collective N, and the agent triggering every rank's dump through its pipe (tests/fake_fr_rank.py
plays torch's DumpPipe) and reading them back."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from cockpit.agent.flightrec import fr_dump, read_fr_dump, slim_fr_dump
from cockpit.host.session import HostSession, SessionOptions, WatchList
from cockpit.host.state import HostState
from cockpit.judge.evidence import merge
from cockpit.judge.verdict import Verdict, VerdictName
from cockpit.link.target import parse_target
from cockpit.read import flightrec

DATA = Path(__file__).parents[1] / "data" / "flight-recorder"


def dump_of(name: str) -> dict:
    return slim_fr_dump(read_fr_dump((DATA / name).read_bytes()))


def test_the_reader_gives_plain_data_shaped_as_torch_writes_it():
    d = dump_of("constructed-rank0.pickle")
    assert d["version"] == "2.10" and d["entries_total"] == 42
    last = d["entries"][-1]
    assert (last["collective_seq_id"], last["profiling_name"], last["state"]) == (42, "nccl:all_reduce", "started")
    assert last["process_group"] == ["0", "default_pg"] and "frames" not in last
    assert d["pg_status"]["0"]["last_completed_collective"] == 41


def test_torchs_int_list_builder_is_read_as_a_plain_list():
    doc = read_fr_dump((DATA / "constructed-intlist.pickle").read_bytes())
    assert doc == {"entries": [{"input_sizes": [1, 2], "collective_seq_id": 7}]}


def test_a_hostile_pickle_is_refused_without_running_anything(tmp_path):
    marker = Path("/tmp/cockpit-pwned")
    marker.unlink(missing_ok=True)
    with pytest.raises(ValueError, match="refused os.system"):
        read_fr_dump((DATA / "hostile.pickle").read_bytes())
    assert not marker.exists()
    for bad in (b"", b"\x80\x02", b"not a pickle", pickle.dumps([1, 2])):
        with pytest.raises(ValueError):
            read_fr_dump(bad)


def test_comparison_names_the_rank_that_never_called_the_collective():
    result = flightrec.compare({0: dump_of("constructed-rank0.pickle"), 1: dump_of("constructed-rank1.pickle")})
    assert result["odd_rank"] == 1
    assert result["lines"] == ["rank 1 never called all_reduce #42 (last collective #41); rank 0 is in it"]
    [g] = result["groups"]
    assert (g["last_enqueued"], g["last_completed"]) == ({0: 42, 1: 41}, {0: 41, 1: 41})
    # as evidence: a stall the watchdog called without a rank gets the flight recorder's
    state = HostState("h")
    state.flight = result
    v = merge(Verdict(VerdictName.STALLED_SPINNING, ["GPU of rank 0 at 100 %"]), flightrec.findings(result), state)
    assert v.odd_rank == 1 and v.evidence[-1].startswith("flight recorder: rank 1 never called all_reduce #42")


def test_symmetric_and_mismatched_collectives_are_said_as_such():
    d0 = dump_of("constructed-rank0.pickle")
    both = {0: d0, 1: d0}
    result = flightrec.compare(both)
    assert result["odd_rank"] is None and "every rank is inside all_reduce #42" in result["lines"][0]
    other = dump_of("constructed-rank0.pickle")
    other["entries"][-1]["profiling_name"] = "nccl:all_gather"
    result = flightrec.compare({0: d0, 1: other})
    assert result["lines"][-1] == "collective #42 differs across ranks: rank 0 all_reduce, rank 1 all_gather"


def test_dumps_recorded_on_h200s_name_the_hung_rank():
    """Torch 2.11's own dumps from run 5 (2x H200, NCCL 2.28.9): rank 1 left the decode loop after
    all_reduce #78555, rank 0 enqueued #78556 and waits in it. Without TORCH_NCCL_ENABLE_TIMING
    torch tracks no starts (pg_status last_started_collective -1, entries scheduled -> completed):
    rank 0 is said to have enqueued it and to wait, not to be "in it", and never "ranks none"."""
    dumps = {r: dump_of(f"recorded-rank{r}.pickle") for r in (0, 1)}
    assert {r: (d["version"], d["entries_total"], d["comm_lib_version"]) for r, d in dumps.items()} == {
        0: ("2.10", 2000, "2.28.9"),
        1: ("2.10", 2000, "2.28.9"),
    }
    assert dumps[0]["pg_status"]["0"] == {
        "last_enqueued_collective": 78556,
        "last_started_collective": -1,
        "last_completed_collective": 78555,
    }
    assert [(e["collective_seq_id"], e["state"]) for e in dumps[0]["entries"][-2:]] == [
        (78555, "completed"),
        (78556, "scheduled"),
    ]
    assert dumps[1]["entries"][-1]["collective_seq_id"] == 78555
    result = flightrec.compare(dumps)
    assert result["odd_rank"] == 1
    assert result["lines"] == [
        ("rank 1 never called all_reduce #78556 (last collective #78555); rank 0 enqueued it and waits")
    ]
    [g] = result["groups"]
    assert (g["collective"], g["op"], g["last_enqueued"], g["last_completed"]) == (
        78556,
        "all_reduce",
        {0: 78556, 1: 78555},
        {0: 78555, 1: 78555},
    )
    assert g["starts_tracked"] == {0: False, 1: False}
    # what `cockpit flightrec` prints: started is a lower bound here, and said so
    answer = {"ranks": {str(r): {"entries_total": 2000, "file": f"/tmp/fr/trace_rank_{r}"} for r in (0, 1)}}
    assert flightrec.describe(answer, result)[2:] == [
        (
            "process group 0: last enqueued {0: 78556, 1: 78555}, started at least {0: 78555, 1: 78555}, "
            "completed {0: 78555, 1: 78555} (starts not tracked: TORCH_NCCL_ENABLE_TIMING unset)"
        ),
        "rank 1 never called all_reduce #78556 (last collective #78555); rank 0 enqueued it and waits",
    ]
    # the same numbers as `cockpit flightrec --json` gave on the GPUs (tests/data/gpu-run5/flightrec.json),
    # whose line still had the old wording ("ranks none are in it")
    recorded = json.loads((DATA.parent / "gpu-run5" / "flightrec.json").read_text())["comparison"]
    [rg] = recorded["groups"]
    assert {k: {int(r): v for r, v in rg[k].items()} for k in ("last_enqueued", "last_started", "last_completed")} == {
        k: g[k] for k in ("last_enqueued", "last_started", "last_completed")
    }
    assert recorded["lines"] == ["rank 1 never called all_reduce #78556 (last collective #78555); ranks none are in it"]


def test_without_start_tracking_a_symmetric_hang_names_no_rank_and_says_why():
    d0 = dump_of("recorded-rank0.pickle")
    result = flightrec.compare({0: d0, 1: d0})  # both ranks enqueued #78556, neither completed it
    assert result["odd_rank"] is None
    assert result["lines"] == [
        (
            "every rank enqueued all_reduce #78556 and none completed it (starts not tracked: "
            "TORCH_NCCL_ENABLE_TIMING unset): a hang in or before the collective on every rank; "
            "the flight recorder cannot name a rank"
        )
    ]
    # and a rank whose start is tracked beside one that only enqueued: each said as what it is
    started = dump_of("constructed-rank0.pickle")  # #42 started (timing on)
    queued = dump_of("constructed-rank0.pickle")
    queued["entries"][-1]["state"] = "scheduled"
    queued["pg_status"]["0"]["last_started_collective"] = 41
    behind = dump_of("constructed-rank1.pickle")
    result = flightrec.compare({0: started, 1: behind, 2: queued})
    assert result["lines"] == [
        ("rank 1 never called all_reduce #42 (last collective #41); rank 0 is in it, rank 2 enqueued it and waits")
    ]


@pytest.fixture
def fake_ranks(tmp_path):
    procs = []
    env = dict(
        os.environ,
        TORCH_NCCL_TRACE_BUFFER_SIZE="2000",
        TORCH_NCCL_DUMP_ON_TIMEOUT="1",
        TORCH_NCCL_DEBUG_INFO_PIPE_FILE=str(tmp_path / "pipe_rank_"),
        TORCH_NCCL_DEBUG_INFO_TEMP_FILE=str(tmp_path / "trace_rank_"),
    )
    for rank in (0, 1):
        p = subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).parents[1] / "fake_fr_rank.py"),
                str(rank),
                str(DATA / f"constructed-rank{rank}.pickle"),
            ],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert p.stdout.readline().strip() == "ready"
        procs.append(p)
    yield procs
    for p in procs:
        for kid in Path(f"/proc/{p.pid}/task/{p.pid}/children").read_text().split():
            os.kill(int(kid), 9)
        p.kill()
        p.wait()


def kids(p) -> list[int]:
    return [int(k) for k in Path(f"/proc/{p.pid}/task/{p.pid}/children").read_text().split()]


def test_the_agent_pokes_every_ranks_pipe_and_reads_the_dumps(fake_ranks, tmp_path):
    pids = [kid for p in fake_ranks for kid in kids(p)]
    out = fr_dump(pids, trigger=True, wait_s=10, raw=True)
    assert out["armed"] and out["problems"] == []
    assert sorted(out["poked"]) == [str(tmp_path / "pipe_rank_0.pipe"), str(tmp_path / "pipe_rank_1.pipe")]
    assert sorted(out["ranks"]) == ["0", "1"]
    assert out["ranks"]["1"]["entries"][-1]["collective_seq_id"] == 41
    assert pickle.loads(__import__("base64").b64decode(out["ranks"]["0"]["raw_b64"]))["version"] == "2.10"
    result = flightrec.compare({int(r): d for r, d in out["ranks"].items()})
    assert result["odd_rank"] == 1


async def test_flight_recorder_through_a_session_and_unarmed_ranks(fake_ranks):
    session = HostSession(
        parse_target("local"),
        SessionOptions(python=sys.executable, interval=0.25),
        WatchList(patterns=[], pids=[p.pid for p in fake_ranks]),
    )
    await session.connect()
    try:
        pids = [kid for p in fake_ranks for kid in kids(p)]
        answer = await session.request("fr_dump", pids=pids, trigger=True, wait_s=10)
        assert sorted(answer["ranks"]) == ["0", "1"] and "raw_b64" not in answer["ranks"]["0"]
        plain = await session.request("fr_dump", pids=[os.getpid()], trigger=True, wait_s=1)
        assert not plain["armed"] and "forensics flag set" in plain["problems"][0]
    finally:
        await session.close()


def test_forensics_env_arms_every_switch():
    env = flightrec.forensics_env("/data/runs/r1")
    assert env["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] == "/data/runs/r1.fr_pipe_rank_"
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1" and int(env["TORCH_NCCL_TRACE_BUFFER_SIZE"]) > 0
    assert env["NCCL_DEBUG_SUBSYS"] == "COLL"


def test_the_simulated_server_keeps_a_flight_recorder_that_names_its_hung_rank(sim_state, tmp_path):
    """The demo's server armed by the forensics flag set's environment: each rank holds its dump
    pipe open as torch does, and `cockpit flightrec` names the rank that spins in the sampler."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    from conftest import free_port, run_cli

    from cockpit.read.flightrec import forensics_env

    port = free_port()
    layout = tmp_path / "fr.yaml"
    layout.write_text(
        f"name: fr\nengine: sglang\ncommand: [-m, cockpit.sim.server]\nports: [{port}]\n"
        f"log: {tmp_path}/server.log\nmetrics: false\n"
    )
    env = {**os.environ, "COCKPIT_SIM_STATE": str(sim_state), **forensics_env(str(tmp_path / "run"))}
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cockpit.sim.server",
            "--tp-size",
            "4",
            "--port",
            str(port),
            "--sim-speed",
            "4",
            "--sim-shm-dir",
            str(tmp_path),
            "--sim-hang-rank",
            "2",
            "--sim-traffic",
            "2",
        ],
        stdout=open(tmp_path / "server.log", "w"),
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        pipes = [f"run.fr_pipe_rank_{r}.pipe" for r in range(4)]
        while sorted(p.name for p in tmp_path.glob("run.fr_pipe_rank_*.pipe")) != pipes:  # each rank made its own
            assert time.monotonic() < deadline and server.poll() is None, (tmp_path / "server.log").read_text()[-2000:]
            time.sleep(0.5)
        text = ""
        while "rank 2 never called all_reduce" not in text:  # once rank 2 spins (after 40 steps of traffic)
            assert time.monotonic() < deadline, text[-3000:]
            res = run_cli("flightrec", "local", "--sim", str(sim_state), "--layout", str(layout), "--json", timeout=90)
            assert res.returncode == 0, res.stdout + res.stderr
            text = json.dumps(json.loads(res.stdout))
            time.sleep(1)
        assert all((tmp_path / f"run.fr_rank_{r}").exists() for r in range(4))  # torch's dump files, one per rank
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
