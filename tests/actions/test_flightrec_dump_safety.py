"""The flight recorder and stack dumps on a shared host, as root: another user's environment
never chooses a FIFO root writes into, a dump file root reads, nor ranks of another run; with
ranks of two runs watched, only the run's are asked (found as the kill finds it), or the
operator is asked to choose. Real FIFOs, real processes of another user (nobody)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from cockpit.actions import dumps, kill as actions
from cockpit.agent.flightrec import fr_dump
from cockpit.host.session import HostSession, SessionOptions, WatchList
from cockpit.link.target import parse_target
from cockpit.read import flightrec
from cockpit.runs.run import Run

DATA = Path(__file__).parents[1] / "data" / "flight-recorder"
FAKE = Path(__file__).parents[1] / "fake_fr_rank.py"
NOBODY = 65534


@pytest.fixture
def shared(shared):
    """conftest's shared folder, writable by another user too (its ranks make their pipes there)."""
    shared.chmod(0o777)
    return shared


def as_nobody():
    os.setgid(NOBODY)
    os.setgroups([])
    os.setuid(NOBODY)


def start_rank(rank: int, folder: Path, stem: str = "pipe_rank_", user: int | None = None) -> subprocess.Popen:
    """A fake torch rank (tests/fake_fr_rank.py: its launcher keeps the environment, the rank
    retitles itself sglang::scheduler_TP<rank> and holds <stem><rank>.pipe open)."""
    env = dict(
        os.environ,
        TORCH_NCCL_TRACE_BUFFER_SIZE="2000",
        TORCH_NCCL_DUMP_ON_TIMEOUT="1",
        TORCH_NCCL_DEBUG_INFO_PIPE_FILE=str(folder / stem),
        TORCH_NCCL_DEBUG_INFO_TEMP_FILE=str(folder / "trace_"),
    )
    if user == NOBODY:  # this venv is root's: another user's rank is a titled process of its own, armed alike
        os.mkfifo(folder / f"{stem}{rank}.pipe", 0o666)
        os.chown(folder / f"{stem}{rank}.pipe", NOBODY, NOBODY)
        script = f"exec 3<>{folder}/{stem}{rank}.pipe; echo ready; exec -a sglang::scheduler_TP{rank} cat"
        p = subprocess.Popen(
            ["bash", "-c", f"bash -c '{script}'; true"],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            stdin=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=as_nobody,
        )
    else:
        p = subprocess.Popen(
            [sys.executable, str(FAKE), str(rank), str(DATA / f"constructed-rank{rank}.pickle")],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )
    assert p.stdout.readline().strip() == "ready"
    return p


def kid(p: subprocess.Popen) -> int:
    return int(Path(f"/proc/{p.pid}/task/{p.pid}/children").read_text().split()[0])


def stop(*procs: subprocess.Popen) -> None:
    import time

    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait(10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the whole group gone (its rank reaped), not just the launcher
            try:
                os.killpg(p.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)


def test_another_users_environment_never_chooses_a_fifo_root_writes_into(shared):
    """A process of nobody names /…/attack-ctl as its pipe stem: root's FIFOs attack-ctl.pipe and
    attack-ctl0.pipe (which root reads) get nothing; nor does a FIFO of nobody's that the process
    does not hold open; nor is a root-owned dump file under its dump prefix read."""
    folder = shared
    root_fifos = [folder / "attack-ctl.pipe", folder / "attack-ctl0.pipe"]
    readers = []
    for path in root_fifos:
        os.mkfifo(path, 0o600)
        readers.append(os.open(path, os.O_RDONLY | os.O_NONBLOCK))  # root reads it: a write would land
    (folder / "secret_0").write_bytes((DATA / "constructed-rank0.pickle").read_bytes())  # root's, 0600
    (folder / "secret_0").chmod(0o600)
    env = dict(
        os.environ,
        TORCH_NCCL_TRACE_BUFFER_SIZE="2000",
        TORCH_NCCL_DEBUG_INFO_PIPE_FILE=str(folder / "attack-ctl"),
        TORCH_NCCL_DEBUG_INFO_TEMP_FILE=str(folder / "secret_"),
    )
    code = (
        "import os, sys, time; p = sys.argv[1] + '1.pipe'; os.mkfifo(p, 0o666); print('ok', flush=True); "
        "time.sleep(60)"
    )  # nobody's own FIFO, which it does not hold open
    attacker = subprocess.Popen(
        ["/usr/bin/python3", "-c", code, str(folder / "attack-ctl")],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=as_nobody,
    )
    try:
        assert attacker.stdout.readline().strip() == "ok"
        out = fr_dump([attacker.pid], trigger=True, wait_s=1)
        assert out["poked"] == []
        for fd in readers:
            try:
                assert os.read(fd, 1) == b""  # nothing was written (no writer: end of file)
            except BlockingIOError:
                pass  # nothing was written (a writer still open)
        text = "; ".join(out["problems"])
        assert "no dump pipe" in text and "not held open by the rank" in text
        assert "owned by root" in (out["ranks"].get("0") or {}).get(
            "error", ""
        )  # root's file under its prefix: not read
        assert "entries" not in (out["ranks"].get("0") or {})
    finally:
        attacker.kill()
        attacker.wait()
        for fd in readers:
            os.close(fd)


def test_a_rank_gets_a_byte_only_through_the_pipe_it_holds_open(tmp_path):
    rank = start_rank(0, tmp_path)
    try:
        pid = kid(rank)
        out = fr_dump([pid], trigger=True, wait_s=10)
        assert out["poked"] == [str(tmp_path / "pipe_rank_0.pipe")] and sorted(out["ranks"]) == ["0"]
        assert out["ranks"]["0"]["entries"]
    finally:
        stop(rank)


def test_no_dumps_are_said_as_none_not_as_every_rank_agreeing():
    lines = flightrec.describe({"ranks": {}, "problems": []}, flightrec.compare({}))
    assert "no dumps collected: nothing to compare" in lines
    assert not any("every rank completed" in line for line in lines)
    failed = flightrec.describe({"ranks": {"0": {"error": "not a FIFO"}}, "problems": []}, flightrec.compare({}))
    assert "no dumps collected: nothing to compare" in failed


async def watched(patterns: list[str]) -> HostSession:
    session = HostSession(
        parse_target("local"), SessionOptions(python=sys.executable, interval=0.25), WatchList(patterns=patterns)
    )
    await session.connect()
    await session.wait_samples(3)
    return session


def test_with_another_users_run_beside_ours_only_ours_is_dumped_and_asked(tmp_path, shared):
    """Ranks 0 and 1 of ours (root) and ranks 0 and 1 of nobody's, all titled alike: the dump
    targets and the flight recorder take ours only (nobody's are said as left alone); with a
    second run of ours, both are refused as ambiguous with the choices, and --pid chooses."""
    theirs_dir = shared
    ours_dir = tmp_path / "ours"
    ours_dir.mkdir()
    theirs = [start_rank(r, theirs_dir, user=NOBODY) for r in (0, 1)]
    ours = [start_rank(r, ours_dir) for r in (0, 1)]

    async def go():
        session = await watched(["sglang::*"])
        try:
            monitor = SimpleNamespace(session=session, layout=None, state=session.state, run=Run())
            their_pids = {kid(p) for p in theirs}
            # our two ranks are two runs by title (two launchers): the operator chooses
            with pytest.raises(actions.AmbiguousRun, match="cockpit dump local --pid ROOT"):
                await actions.member_plan(session, None, verb="dump")
            with pytest.raises(actions.AmbiguousRun, match="cockpit flightrec local --pid ROOT"):
                await dumps.collect(monitor.session, monitor.run)
            plan = await actions.member_plan(session, None, root=ours[0].pid)
            members, _left = actions.of_run(session.state, plan)
            targets = dumps.dump_targets(session.state, members)
            assert targets == [(0, kid(ours[0]))]
            assert not their_pids & {pid for _, pid in targets}
            answer, _ = await dumps.collect(monitor.session, monitor.run, root=ours[0].pid)
            assert answer["poked"] == [str(ours_dir / "pipe_rank_0.pipe")] and sorted(answer["ranks"]) == ["0"]
            assert any(line.startswith("left alone: rank 1") for line in answer["problems"])  # our other run's
            assert "left alone" in "\n".join(flightrec.describe(answer, flightrec.compare({})))
        finally:
            await session.close()

    try:
        asyncio.run(go())
    finally:
        stop(*theirs, *ours)


def test_without_a_choice_another_users_ranks_are_never_dumped(tmp_path, shared):
    theirs_dir = shared
    theirs = [start_rank(r, theirs_dir, user=NOBODY) for r in (0, 1)]
    ours = start_rank(0, tmp_path / "")

    async def go():
        session = await watched(["sglang::*"])
        try:
            plan = await actions.member_plan(session, None, verb="dump")  # nobody's are never the run
            members, _left = actions.of_run(session.state, plan)
            assert dumps.dump_targets(session.state, members) == [(0, kid(ours))]
            assert not {kid(p) for p in theirs} & members
            monitor = SimpleNamespace(session=session, layout=None, state=session.state, run=Run())
            answer, _ = await dumps.collect(monitor.session, monitor.run)
            assert answer["poked"] == [str(tmp_path / "pipe_rank_0.pipe")]
        finally:
            await session.close()

    try:
        asyncio.run(go())
    finally:
        stop(*theirs, ours)
