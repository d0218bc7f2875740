"""The run this cockpit launched, found from its ledger record by the agent (kill.find_runs), in
process on real processes: a leader and its rank in a session of their own. A record that cannot
prove the processes are its run is refused with a note saying why: no start time, an earlier
boot, a leader pid that is now another process, a leader gone with no survivor proven (started
while the leader was seen alive, or carrying the launch marker); a proven one is the run."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time

import pytest

from cockpit.agent import kill as agent_kill, procs as agent_procs

TITLED = "exec -a sglang::scheduler_TP0 sleep 600"  # a rank's title, as SGLang sets it


def session_of(sid: int) -> list[int]:
    return sorted(
        int(n)
        for n in os.listdir("/proc")
        if n.isdigit()
        and (row := agent_procs._proc_stat(int(n))) is not None
        and row["sid"] == sid
        and row["status"] != "Z"
    )


@pytest.fixture
def run():
    """A launched run's shape: a leader (its session's and group's) and a titled rank it started."""
    started: list[subprocess.Popen] = []

    def start(marker: str | None = None) -> tuple[subprocess.Popen, int]:
        env = dict(os.environ, **{agent_kill.LAUNCH_MARKER: marker}) if marker else None
        leader = subprocess.Popen(
            ["bash", "-c", f"bash -c {shlex.quote(TITLED)} & wait"], start_new_session=True, env=env
        )
        started.append(leader)
        deadline = time.monotonic() + 30
        while len(session_of(leader.pid)) < 2:
            assert time.monotonic() < deadline, "the rank never started"
            time.sleep(0.02)
        return leader, next(p for p in session_of(leader.pid) if p != leader.pid)

    yield start
    for leader in started:
        try:
            os.killpg(leader.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        leader.wait(10)


def record(leader: subprocess.Popen, **changed) -> dict:
    rec = {
        "run_id": "r1",
        "pgid": leader.pid,
        "start": agent_procs._start_ticks(leader.pid),
        "boot": agent_procs._boot_time(),
        "uid": os.geteuid(),
    }
    rec.update(changed)
    return {k: v for k, v in rec.items() if v is not None}


def found(rec: dict, **kw) -> dict:
    return agent_kill.find_runs(launched=[rec], **kw)


def test_the_recorded_leader_alive_is_the_run_with_what_it_started(run):
    leader, rank = run()
    got = found(record(leader))
    assert got["rule"] == "ledger" and len(got["runs"]) == 1, got
    assert got["runs"][0]["rule"].startswith(
        f"launched by this cockpit (ledger): process group {leader.pid}, leader started "
    )
    assert {e["pid"] for e in got["runs"][0]["members"]} == {leader.pid, rank}


def test_a_record_without_its_leaders_start_time_is_trusted_only_by_the_agent_that_launched_it(run):
    leader, _ = run()
    rec = record(leader, start=None)
    got = found(rec)
    assert got["runs"] == [] and got["notes"] == [
        f"process group {leader.pid}: its leader's start time was not recorded, so it is not trusted as the run"
    ]
    known = {leader.pid: agent_procs._start_ticks(leader.pid)}  # the agent's own launches
    assert [r["root"] for r in found(rec, known=known)["runs"]] == [leader.pid]


def test_a_record_from_before_the_host_rebooted_is_not_the_run(run):
    leader, _ = run()
    got = found(record(leader, boot=agent_procs._boot_time() - 3600))
    assert got["runs"] == [] and got["notes"] == [
        f"process group {leader.pid} was recorded before the host rebooted: not the run"
    ]


def test_a_leader_pid_that_is_now_another_process_is_not_the_run(run):
    leader, rank = run()
    got = found(record(leader, start=agent_procs._start_ticks(leader.pid) - 7))
    assert got["runs"] == [] and len(got["notes"]) == 1, got
    assert got["notes"][0].startswith(f"pid {leader.pid} is now another process (started ")
    assert got["notes"][0].endswith(f": the run recorded as process group {leader.pid} has ended")


def test_a_malformed_record_is_no_run_and_no_note():
    assert found({"run_id": "r1", "pgid": "x"}) == {"runs": [], "rule": "none", "notes": [], "foreign": []}


@pytest.mark.parametrize("proof", ["none", "seen", "marker"])
def test_a_leader_gone_leaves_its_rank_the_run_only_on_proof(run, proof):
    """The leader killed alone: its rank, still in the group, is the run only when it started while
    the leader was seen alive (the record's `seen_ticks`) or carries the run's launch marker."""
    leader, rank = run(marker="r1" if proof == "marker" else None)
    rec = record(leader, seen_ticks=agent_kill._now_ticks() if proof == "seen" else None)
    leader.kill()
    leader.wait()
    got = found(rec)
    if proof == "none":
        assert got["runs"] == [] and len(got["notes"]) == 1, got
        assert got["notes"][0] == (
            f"process group {leader.pid}: its leader is gone and none of the 1 processes now in it was started while the "
            f"run's leader was seen alive or carries the run's launch marker ({agent_kill.LAUNCH_MARKER}): pid "
            f"{leader.pid} may have been reused, so they are not the run (name one with --pid to act on it anyway)"
        )
    else:
        assert [(r["root"], r["rule"]) for r in got["runs"]] == [
            (
                rank,
                f"launched by this cockpit (ledger): process group {leader.pid}, its leader gone, 1 processes of it left",
            )
        ]
        assert got["runs"][0]["sessions"] == [leader.pid]
