"""NCCL RAS: the parsers on answers recorded on real H200s (tests/data/nccl-ras/, each file says
where it came from; `h200-*` are run 5's: a healthy job, rank 1 behind, rank 1 dead), the
judgement over time, the verdict it feeds, and the agent's RAS client meeting a real socket
(tests/fake_ras.py replays the recorded answers): JSON, an NCCL that knows no JSON, malformed JSON
(NCCL 2.28.9's own with a missing rank among them), and a socket that accepts but never answers
while samples keep coming."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import cannot_run, free_port
from simhost import wait_for

from cockpit.agent import ras as agent_ras
from cockpit.host.session import HostSession, SessionOptions, WatchList
from cockpit.host.state import HostState
from cockpit.judge.diagnose import Watchdog
from cockpit.judge.evidence import default_sources, merge
from cockpit.judge.verdict import Verdict, VerdictName
from cockpit.link.target import parse_target
from cockpit.read import ras

DATA = Path(__file__).parents[1] / "data" / "nccl-ras"


def answer(name: str) -> str:
    """A recorded answer, without its header."""
    return (DATA / name).read_text().split("#---\n", 1)[1]


def agent_answer(name: str, fmt: str, ts: float = 1000.0, **kw) -> dict:
    return {"ts": ts, "port": 28028, "format": fmt, "text": answer(name), **kw}


# ----------------------------------------------------------------------------- parsers


def test_healthy_text_report_is_one_running_group_without_skew():
    rep = ras.parse(agent_answer("healthy.txt", "text"))
    assert rep.format == "text" and rep.error is None
    assert [(c.status, c.errors) for c in rep.comms] == [("RUNNING", "OK")]
    assert ras.skews(rep) == []


def test_mismatch_text_report_names_each_rank_with_its_count_pid_and_gpu():
    rep = ras.parse(agent_answer("mismatch.txt", "text"))
    [comm] = rep.comms
    assert (comm.hash, comm.status, comm.errors) == ("d787ccde145b7afa", "RUNNING", "MISMATCH")
    assert {r: (x.counts, x.pid, x.cuda_dev, x.host) for r, x in comm.ranks.items()} == {
        0: ({"AllReduce": 42187}, 624, 0, "192.0.2.2"),
        1: ({"AllReduce": 42186}, 625, 1, "192.0.2.2"),
    }
    [skew] = ras.skews(rep)
    assert (skew.op, skew.behind, skew.ahead) == ("AllReduce", {1: 42186}, {0: 42187})


def test_mismatch_json_report_reads_every_rank_and_the_nccl_version():
    rep = ras.parse(agent_answer("mismatch.json.txt", "json"))
    assert rep.format == "json" and rep.nccl_version == "2.28.9" and rep.error is None
    [comm] = rep.comms
    assert comm.hash == "0xd787ccde145b7afa" and comm.size == 2
    assert {r: x.counts["AllReduce"] for r, x in comm.ranks.items()} == {0: 42187, 1: 42186}
    assert comm.ranks[1].pid == 625 and comm.ranks[1].counts["Broadcast"] == 0
    [skew] = ras.skews(rep)
    assert skew.behind == {1: 42186}


def test_the_recording_trimmed_to_one_rank_parses_and_shows_no_skew_on_its_own():
    rep = ras.parse(agent_answer("mismatch-one-rank.json.txt", "json"))
    assert [list(c.ranks) for c in rep.comms] == [[1]]
    assert rep.comms[0].ranks[1].counts["AllReduce"] == 42186
    assert ras.skews(rep) == []


def test_dead_rank_is_a_finding_naming_it():
    view = ras.RasView()
    view.add(agent_answer("dead-rank.json.txt", "json"))
    [comm] = view.latest.comms
    assert [(m.rank, m.pid, m.dead, m.unresponsive) for m in comm.missing] == [(1, 732, True, True)]
    [f] = ras.findings(view, 1000.0, 30)
    assert f.odd_rank == 1 and f.dead
    assert "rank 1 (pid 732, GPU 1) is considered dead" in f.evidence[0]


def test_malformed_json_falls_back_to_the_text_parser_and_says_so():
    rep = ras.parse(agent_answer("malformed.json.txt", "json"))
    assert rep.error.startswith("malformed JSON from RAS") and rep.comms == []
    # The agent asks again in text when its JSON does not parse: that answer carries json_error.
    rep = ras.parse(agent_answer("mismatch.txt", "text", json_error="Expecting value: line 14"))
    assert "malformed JSON" in rep.error and rep.comms[0].ranks[1].counts == {"AllReduce": 42186}


# ----------------------------------------------------------------------------- run 5: H200s, NCCL 2.28.9


def test_h200_hang_json_and_text_name_rank_1_behind():
    """Recorded 45 s after rank 1 stopped calling collectives: rank 1 launched up to AllReduce
    78,555, rank 0 up to 78,556 (the one it waits in), in both formats."""
    for name, fmt, comm_hash in (
        ("h200-hang.json.txt", "json", "0x10d16f9765b3101f"),
        ("h200-hang.txt", "text", "10d16f9765b3101f"),
    ):
        rep = ras.parse(agent_answer(name, fmt))
        assert (rep.format, rep.nccl_version, rep.error) == (fmt, "2.28.9", None), name
        [comm] = rep.comms
        assert comm.hash == comm_hash
        assert {r: (x.counts["AllReduce"], x.pid, x.cuda_dev, x.host) for r, x in comm.ranks.items()} == {
            0: (78556, 667, 0, "192.0.2.2"),
            1: (78555, 668, 1, "192.0.2.2"),
        }, name
        [skew] = ras.skews(rep)
        assert (skew.op, skew.behind, skew.ahead) == ("AllReduce", {1: 78555}, {0: 78556}), name
    assert (comm.status, comm.errors) == ("RUNNING", "MISMATCH")


def test_h200_healthy_answers_alone_call_no_skew_and_the_hang_is_named_once_counts_stop():
    """A healthy job's ranks are a launch or two apart at any instant: NCCL's own text report
    calls the healthy job MISMATCH (37,327 vs 37,326) and its JSON shows 26,039 vs 26,037. One look
    is no finding; counts that moved are none; only counts that stopped name the rank. The polls
    follow run 5's clock: healthy at 16:46:53, the hang at 16:47:55, the snapshot 12 s later."""
    for name, fmt, counts in (
        ("h200-healthy.json.txt", "json", {0: 26039, 1: 26037}),
        ("h200-healthy.txt", "text", {0: 37327, 1: 37326}),
    ):
        rep = ras.parse(agent_answer(name, fmt))
        assert {r: x.counts["AllReduce"] for r, x in rep.comms[0].ranks.items()} == counts
        assert [s.behind for s in ras.skews(rep)] == [{1: counts[1]}]  # a skew in one look...
        view = ras.RasView()
        view.add(agent_answer(name, fmt, ts=0.0))
        assert ras.findings(view, 0.0, 30) == [] and ras.findings(view, 0.0, 30, stalled=True) == []  # ...no finding
    assert ras.parse(agent_answer("h200-healthy.txt", "text")).comms[0].errors == "MISMATCH"
    view = ras.RasView()
    view.add(agent_answer("h200-healthy.json.txt", "json", ts=0.0))
    view.add(agent_answer("h200-hang.json.txt", "json", ts=62.0))
    assert ras.findings(view, 62.0, 30) == []  # the counts moved (26,039 -> 78,556): no stall, no rank
    assert all(f.odd_rank is None for f in ras.findings(view, 62.0, 30, stalled=True))
    view.add(agent_answer("h200-hang.json.txt", "json", ts=74.0))
    assert ras.findings(view, 74.0, 30) == []  # unchanged for 12 s: not a stall on RAS alone
    view.add(agent_answer("h200-hang.json.txt", "json", ts=107.0))
    [f] = ras.findings(view, 107.0, 30)  # 45 s without a count moving: a stall on its own
    assert f.odd_rank == 1 and f.stalled
    assert f.evidence[0] == "rank 1 launched up to AllReduce 78,555, rank 0 78,556; no progress for 45 s"
    # a cockpit opened during the hang (run 5's snapshot --wait 12): two polls 12 s apart and the
    # watchdog's stall name rank 1
    view = ras.RasView()
    view.add(agent_answer("h200-hang.json.txt", "json", ts=62.0))
    view.add(agent_answer("h200-hang.json.txt", "json", ts=74.0))
    [f] = ras.findings(view, 74.0, 30, stalled=True)
    assert f.odd_rank == 1 and not f.stalled
    assert f.evidence[0] == "rank 1 launched up to AllReduce 78,555, rank 0 78,556; unchanged over 12 s of polling"


def test_counts_that_stopped_after_moving_are_not_said_to_move():
    """A cockpit watching since before the hang: the counts moved, then stood still for 12 s over
    two polls when the watchdog called the stall."""
    view = ras.RasView()
    view.add(agent_answer("h200-healthy.json.txt", "json", ts=0.0))
    view.add(agent_answer("h200-hang.json.txt", "json", ts=62.0))
    view.add(agent_answer("h200-hang.json.txt", "json", ts=74.0))
    [f] = ras.findings(view, 74.0, 30, stalled=True)
    assert f.odd_rank == 1, f.evidence


# NCCL's JSON parse error as the agent recorded it on the H200s (run 5), with rank 1 dead
H200_DEAD_JSON_ERROR = "Expecting ',' delimiter: line 44 column 11 (char 1089)"


def test_h200_dead_rank_text_fallback_names_rank_1_missing():
    """Rank 1 died of a device-side assert and is a zombie: NCCL 2.28.9's JSON answer did not
    parse, the agent asked again in text (recorded verbatim), which says INCOMPLETE and names rank
    1, pid 1024, GPU 1."""
    rep = ras.parse(agent_answer("h200-dead.txt", "text", json_error=H200_DEAD_JSON_ERROR))
    assert rep.format == "text" and rep.nccl_version == "2.28.9"
    assert rep.error == (
        "RAS sent malformed JSON (Expecting ',' delimiter: line 44 column 11 (char 1089)): "
        "the text report was read instead"
    )
    assert rep.missing_processes == 1 and rep.dead_processes == 0
    [comm] = rep.comms
    assert (comm.hash, comm.status, comm.errors, comm.ranks) == ("591729a4ecb2e3fe", "RUNNING", "INCOMPLETE", {})
    assert [(m.rank, m.pid, m.cuda_dev, m.host) for m in comm.missing] == [(1, 1024, 1, "192.0.2.2")]
    view = ras.RasView()
    view.add(agent_answer("h200-dead.txt", "text", json_error=H200_DEAD_JSON_ERROR))
    [f] = ras.findings(view, 1000.0, 30)  # one look is enough: a missing rank is not a transient skew
    assert f.odd_rank == 1 and not f.dead
    assert f.evidence == ["rank 1 (pid 1024, GPU 1) is missing in communicator 591729a4ecb2e3fe"]


def test_nccl_2_28_9_json_with_a_missing_rank_is_malformed_and_read_as_text():
    """NCCL 2.28.7-2.28.9 write no comma after a missing rank's "nvml_dev" (fixed in 2.29): the
    answer is reconstructed from that writer and the recorded text answer (the recording kept only
    the text), and fails where the recorded one failed, at line 44 column 11."""
    text = answer("h200-dead-malformed.json.txt")
    with pytest.raises(ValueError, match="Expecting ',' delimiter: line 44 column 11"):
        json.loads(text)
    rep = ras.parse(agent_answer("h200-dead-malformed.json.txt", "json"))
    assert rep.error.startswith("malformed JSON from RAS (Expecting ',' delimiter: line 44 column 11")
    assert rep.comms == []


def test_the_agent_meets_nccl_2_28_9s_malformed_json_and_falls_back_to_the_text(fake_ras):
    server = fake_ras("json", json_file="h200-dead-malformed.json.txt", text_file="h200-dead.txt")
    got = agent_ras.ras_query("127.0.0.1", server.port, "json", timeout=10)
    assert got["format"] == "text" and got["json_error"].startswith("Expecting ',' delimiter: line 44 column 11")
    assert got["text"] == answer("h200-dead.txt")
    rep = ras.parse(got)
    assert "malformed JSON" in rep.error
    assert [(m.rank, m.pid, m.cuda_dev) for c in rep.comms for m in c.missing] == [(1, 1024, 1)]


def test_grouped_text_lines_of_a_larger_job():
    """NCCL groups ranks at the same count ("7 ranks have launched up to operation N") and lists
    the outlier with its own line: the parser keeps both."""
    text = (
        "Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors\n"
        "    #  in group  per comm  per node  per comm  in group\n"
        "    0         1         1         8         8         8   RUNNING  MISMATCH\n\n"
        "#0-0 (00000000000000aa) MISMATCH\n"
        "  Communicator ranks have different AllReduce operation counts\n"
        "  7 ranks have launched up to operation 1523\n"
        "  Rank 1 has launched up to operation 1522 -- GPU 1 managed by process 901 on node h200-a\n"
    )
    view = ras.RasView()
    view.add({"ts": 0.0, "format": "text", "text": text})
    view.add({"ts": 40.0, "format": "text", "text": text})
    [f] = ras.findings(view, 40.0, 30)
    assert f.odd_rank == 1 and f.stalled
    assert f.evidence[0] == "rank 1 launched up to AllReduce 1,522, 7 other ranks 1,523; no progress for 40 s"


def test_hostile_text_is_bounded_and_stays_data():
    junk = "[bold red]x[/]" * 10_000
    rep = ras.parse(
        {
            "ts": 1.0,
            "format": "json",
            "text": '{"communicators": [{"hash": "%s", "ranks": '
            '[{"rank": 0, "host": "%s", "collective_counts": {"AllReduce": "nan"}}]}]}' % (junk, junk),
        }
    )
    comm = rep.comms[0]
    assert len(comm.hash) <= 40 and len(comm.ranks[0].host) <= ras.FIELD_MAX
    assert comm.ranks[0].counts == {}  # a count that is not a number is dropped, not guessed
    assert ras.parse({"format": "json", "text": 12}).error == "the answer is not text"
    assert ras.parse({"error": "cannot connect to 127.0.0.1:28028: Connection refused"}).error.startswith(
        "cannot connect"
    )


# ----------------------------------------------------------------------------- judging


def test_a_rank_behind_with_no_count_moving_names_it_after_the_threshold_only():
    view = ras.RasView()
    view.add(agent_answer("mismatch.json.txt", "json", ts=1000.0))
    assert ras.findings(view, 1000.0, 30) == []  # one look: ranks are always a little apart
    view.add(agent_answer("mismatch.json.txt", "json", ts=1020.0))
    assert ras.findings(view, 1020.0, 30) == []  # still, but not for long enough
    view.add(agent_answer("mismatch.json.txt", "json", ts=1040.0))
    [f] = ras.findings(view, 1040.0, 30)
    assert f.odd_rank == 1 and f.stalled
    assert f.evidence[0] == "rank 1 launched up to AllReduce 42,186, rank 0 42,187; no progress for 40 s"
    assert view.doc()["skews"] == [
        {"communicator": "0xd787ccde145b7afa", "op": "AllReduce", "behind": {1: 42186}, "ahead": {0: 42187}}
    ]


def test_counts_that_move_reset_the_clock_and_name_the_blind_spots():
    view = ras.RasView()
    view.add(agent_answer("mismatch.json.txt", "json", ts=1000.0))
    moved = answer("mismatch.json.txt").replace("42187", "42190").replace("42186", "42190")
    view.add({"ts": 1030.0, "format": "json", "text": moved})
    assert view.still_for(1030.0) == 0.0
    [f] = ras.findings(view, 1030.0, 30, stalled=True)
    assert "still move" in f.evidence[0] and "custom all-reduce" in f.evidence[0]
    view.add({"ts": 1070.0, "format": "json", "text": moved})
    [f] = ras.findings(view, 1070.0, 30, stalled=True)
    assert "no skew" in f.evidence[0] and f.odd_rank is None  # symmetric: every rank at 42190


def test_a_stall_the_watchdog_called_gets_the_rank_from_two_polls_of_the_same_counts():
    """A cockpit opened long into a hang has polled RAS for seconds only: same counts twice, a skew,
    and the watchdog's stall are enough to name the rank (not to call a stall on RAS alone)."""
    view = ras.RasView()
    view.add(agent_answer("mismatch.json.txt", "json", ts=1000.0))
    view.add(agent_answer("mismatch.json.txt", "json", ts=1010.0))
    assert ras.findings(view, 1010.0, 30) == []
    [f] = ras.findings(view, 1010.0, 30, stalled=True)
    assert f.odd_rank == 1 and not f.stalled
    assert f.evidence[0].endswith("rank 0 42,187; unchanged over 10 s of polling")


def test_ras_turns_an_ok_verdict_into_a_stall_naming_the_rank():
    state = HostState("h")
    state.apply({"t": "sample", "seq": 1, "ts": 1040.0, "gpus": [], "procs": []})
    for ts in (1000.0, 1040.0):
        state.ras.add(agent_answer("mismatch.json.txt", "json", ts=ts))
    dog = Watchdog(spin_s=30, sources=default_sources())
    found = [f for src in dog.sources for f in src(state, 0.0, dog, False)]
    v = merge(Verdict(VerdictName.OK, []), found, state)
    assert v.name == VerdictName.STALLED_IDLE and v.odd_rank == 1
    assert v.evidence[0].startswith("RAS: rank 1 launched up to AllReduce 42,186")
    # A stall the watchdog already named keeps its name and rank; RAS agreeing adds its lines.
    v = merge(Verdict(VerdictName.STALLED_SPINNING, ["GPU of ranks 0 at 100 %"], 1), found, state)
    assert v.name == VerdictName.STALLED_SPINNING and v.odd_rank == 1 and len(v.evidence) == 3
    # Disagreement is said, the watchdog's rank kept.
    v = merge(Verdict(VerdictName.STALLED_SPINNING, ["x"], 0), found, state)
    assert v.odd_rank == 0 and "RAS names rank 1, the watchdog rank 0" in v.evidence[-1]


def test_port_label():
    assert ras.port_label(28028) == "NCCL RAS" and ras.port_label(30000) is None


# ----------------------------------------------------------------------------- a real socket


class FakeRas:
    def __init__(self, mode: str, json_file: str, text_file: str):
        self.port = free_port()
        env = dict(os.environ, NCCL_RAS_ADDR=f"127.0.0.1:{self.port}")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).parents[1] / "fake_ras.py"),
                str(self.port),
                mode,
                str(DATA / json_file),
                str(DATA / text_file),
            ],
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        assert self.proc.stdout.readline().strip() == "ready"

    def close(self):
        for pid in self.children():
            os.kill(pid, 9)
        self.proc.kill()
        self.proc.wait()

    def children(self) -> list[int]:
        try:
            return [int(p) for p in Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()]
        except OSError:
            return []


@pytest.fixture
def fake_ras():
    made = []

    def make(mode, json_file="mismatch.json.txt", text_file="mismatch.txt"):
        made.append(FakeRas(mode, json_file, text_file))
        return made[-1]

    yield make
    for f in made:
        f.close()


async def watching(pid: int) -> HostSession:
    session = HostSession(
        parse_target("local"), SessionOptions(python=sys.executable, interval=0.25), WatchList(patterns=[], pids=[pid])
    )
    await session.connect()
    await session.request("config", **session.watch.args())
    await session.request("ras_config", every_s=0.5, timeout=1.5)
    return session


async def test_agent_polls_a_rank_listening_on_ras_from_its_environment(fake_ras):
    server = fake_ras("json")
    session = await watching(server.proc.pid)
    try:
        st = session.state
        await wait_for(lambda: len(st.ras.reports) >= 2, 20, "two RAS polls")
        rep = st.ras.latest
        assert rep.format == "json" and rep.error is None
        assert {r: x.counts["AllReduce"] for r, x in rep.comms[0].ranks.items()} == {0: 42187, 1: 42186}
        assert st.ras.port == server.port and st.ras.raw["ms"] < 1500
        assert [p.pid for p in st.ports if p.port == server.port] == server.children()  # the titled rank listens
        assert ras.port_label(server.port, st.ras) == "NCCL RAS"
        [f] = ras.findings(st.ras, st.ras.reports[-1][0] + 60, 30)
        assert f.odd_rank == 1
        one = await session.request("ras")  # the bundle's one-shot query, at the polled address
        assert one["format"] == "json" and '"AllReduce": 42186' in one["text"]
    finally:
        await session.close()


async def test_an_nccl_without_json_is_read_as_text(fake_ras):
    server = fake_ras("old")
    session = await watching(server.proc.pid)
    try:
        await wait_for(lambda: session.state.ras.latest is not None, 20, "a RAS poll")
        rep = session.state.ras.latest
        assert rep.format == "text" and rep.comms[0].ranks[1].counts == {"AllReduce": 42186}
    finally:
        await session.close()


async def test_malformed_json_is_asked_again_as_text_and_remembered(fake_ras):
    server = fake_ras("json", json_file="malformed.json.txt")
    session = await watching(server.proc.pid)
    try:
        st = session.state
        await wait_for(lambda: len(st.ras.reports) >= 2, 20, "two RAS polls")
        assert st.ras.raw["format"] == "text"
        first = st.ras.reports[0][1]
        assert "malformed JSON" in first.error and first.comms[0].ranks[0].counts == {"AllReduce": 42187}
        assert st.ras.reports[-1][1].error is None  # the agent now asks in text from the start
    finally:
        await session.close()


async def test_a_silent_ras_never_stalls_the_samples(fake_ras):
    server = fake_ras("silent")
    session = await watching(server.proc.pid)
    try:
        st = session.state
        start = st.seq
        await wait_for(lambda: st.ras.raw is not None, 20, "the RAS poll to give up")
        assert "no answer" in st.ras.raw["error"] or "timed out" in st.ras.raw["error"]
        assert st.ras.latest.error and st.ras.latest.comms == []
        assert st.seq - start >= 4  # samples kept coming at 4 Hz while RAS said nothing
        seq = st.seq
        await asyncio.sleep(1.0)
        assert st.seq - seq >= 3
    finally:
        await session.close()


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1"])
def test_a_numeric_ras_address_is_connected_to_without_a_name_lookup(host, monkeypatch):
    """A numeric host never goes through getaddrinfo (glibc asks the kernel for every interface's
    addresses first); a name still does."""
    import socket

    family = socket.AF_INET6 if host == "::1" else socket.AF_INET
    try:
        srv = socket.socket(family)
        srv.bind(("::1" if host == "::1" else "127.0.0.1", 0))
    except OSError:
        cannot_run("no %s loopback here" % host)
    srv.listen()
    lookups = []
    real = socket.create_connection
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: (lookups.append(a[0]), real(*a, **k))[1])
    try:
        sock = agent_ras._connect(host, srv.getsockname()[1], 2.0)
        peer, _ = srv.accept()
        assert sock.getpeername()[1] == srv.getsockname()[1]
        assert lookups == ([] if host != "localhost" else [("localhost", srv.getsockname()[1])])
        peer.close()
        sock.close()
    finally:
        srv.close()
