"""Touch only the run when a pid or a process group is reused: a pid whose start time no longer matches
its plan is skipped and reported, at the SIGTERM and again at the SIGKILL pass; the agent and its
ancestors are never planned; a process born after the plan is reported, not signalled; a resumed
run never trusts a reused process group from the ledger. Real processes throughout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import cannot_run
from simhost import end_session, gone, sleeper

from cockpit.agent import (
    kill,
    kill as agent_kill,
    procs as agent_procs,
    procs as procs_mod,
)
from cockpit.host.session import WatchList
from cockpit.runs.run import Run

NOBODY = 65534

# ----------------------------------------------------------------------------- reused pids


def test_a_pid_that_no_longer_matches_its_planned_start_is_skipped_and_reported():
    """The plan's start time for the pid is another process's (what a reused pid looks like):
    it is not signalled, in either pass, and the report says why."""
    proc = sleeper()
    try:
        plan = agent_kill.run_plan(pids=[proc.pid])["plan"]
        assert [e["pid"] for e in plan] == [proc.pid] and plan[0]["uid"] == os.geteuid()
        plan[0]["start"] -= 7  # planned for an earlier process that had this pid
        report = agent_kill.kill_run(plan, wait_s=1.0)
        assert report["term"] == [] and report["killed"] == [] and report["remaining"] == []
        assert report["skipped"][0]["pid"] == proc.pid and "pid reused" in report["skipped"][0]["why"]
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()


def test_the_sigkill_pass_checks_the_start_time_again(monkeypatch):
    """A process that ignores SIGTERM, whose pid looks reused by the time SIGKILL would go:
    the SIGKILL is not sent (the old code re-read the start time and killed whatever it found)."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ok', flush=True); time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout.readline().strip() == "ok"
        plan = agent_kill.run_plan(pids=[proc.pid])["plan"]
        real = agent_procs._proc_stat
        reused = threading.Event()

        def stat(pid):
            row = real(pid)
            if row is not None and pid == proc.pid and reused.is_set():
                row["_start"] += 1  # from now on the pid reads as another process
            return row

        for owner in (kill, procs_mod):  # the kill's own reads and those of the helpers it calls
            monkeypatch.setattr(owner, "_proc_stat", stat)
        threading.Timer(0.5, reused.set).start()
        report = agent_kill.kill_run(plan, wait_s=1.5)
        assert report["term"] == [proc.pid] and report["killed"] == []
        assert "pid reused" in report["skipped"][0]["why"]
        assert proc.poll() is None  # SIGTERM ignored, SIGKILL never sent
    finally:
        proc.kill()
        proc.wait()


def _take_pid(
    pid: int, argv: tuple[str, ...] = ("sleep", "600"), new_session: bool = True, tries: int = 500
) -> subprocess.Popen:
    """A new process running argv that gets exactly this (free) pid, through ns_last_pid (root
    only: else it cannot run here). It starts at least one clock tick after the pid's earlier
    process did: start times are counted in ticks (10 ms), and a pid reused within the same tick as
    the first start is not distinguishable. Another process of this busy machine may take the pid
    first: tried again, and a race lost every time fails the test as what it is."""
    time.sleep(0.05)
    deadline = time.monotonic() + 60
    for _ in range(tries):
        try:
            with open("/proc/sys/kernel/ns_last_pid", "w") as fh:
                fh.write(str(pid - 1))
        except OSError as e:
            cannot_run(f"cannot steer pid allocation here: /proc/sys/kernel/ns_last_pid: {e.strerror}")
        p = subprocess.Popen(list(argv), start_new_session=new_session)
        if p.pid == pid:
            return p
        p.kill()
        p.wait()
        while not gone(pid) and time.monotonic() < deadline:  # taken meanwhile: free again when that one ends
            time.sleep(0.05)
    held = "" if gone(pid) else f" (it is held now by {Path(f'/proc/{pid}/comm').read_text().strip()!r})"
    pytest.fail(f"pid {pid}: other processes of this machine took it first, {tries} tries in a row{held}")


def test_a_really_reused_pid_is_not_signalled():
    """The real thing: the planned process exits, a new process gets its pid, then the plan is
    carried out. The newcomer lives; the report names the pid as reused."""
    old = sleeper()
    plan = agent_kill.run_plan(pids=[old.pid])["plan"]
    old.kill()
    old.wait()
    new = _take_pid(old.pid)
    try:
        report = agent_kill.kill_run(plan, wait_s=1.0)
        assert report["term"] == [] and "pid reused" in report["skipped"][0]["why"]
        assert new.poll() is None
    finally:
        new.kill()
        new.wait()


def test_the_server_followed_is_planned_only_while_its_pid_is_the_process_seen():
    """With no layout, the one server followed is killed as its own tree, by its root's pid: the
    start the cockpit saw travels with it, and a pid reused since (another process now) is left
    alone, said; the process seen is planned whole."""
    proc = sleeper()
    try:
        start = agent_kill.run_plan(pids=[proc.pid])["plan"][0]["start"]
        watch = WatchList(patterns=[], pids=[proc.pid])
        seen = Run(None, {"root": proc.pid, "root_start": start}).scope(watch)
        assert seen.args() == {"pids": [proc.pid], "starts": {str(proc.pid): start}}
        planned = agent_kill.run_plan(**seen.args())
        assert [e["pid"] for e in planned["plan"]] == [proc.pid]
        reused = Run(None, {"root": proc.pid, "root_start": start - 100}).scope(watch)
        refused = agent_kill.run_plan(**reused.args())
        assert refused["plan"] == [] and "pid was reused" in refused["rule"] and str(proc.pid) in refused["rule"]
        assert proc.poll() is None
    finally:
        end_session(proc)


def test_a_pid_reused_between_the_check_and_the_signal_gets_nothing(monkeypatch):
    """The narrowest window: the start time matches, then (before the signal goes) the process
    exits and a new one takes its pid. The signal goes through the pidfd opened before the check,
    which still names the exited process: the newcomer gets nothing."""
    if not hasattr(os, "pidfd_open") or not hasattr(signal, "pidfd_send_signal"):
        cannot_run("no pidfd on this Python/kernel: the check and the signal are then separate system calls")
    old = sleeper()
    plan = agent_kill.run_plan(pids=[old.pid])["plan"]
    real = agent_kill._still
    taken: dict = {}

    def still(entry, protected):
        why = real(entry, protected)
        if why is None and "new" not in taken:
            old.kill()
            old.wait()
            taken["new"] = _take_pid(old.pid)
        return why

    monkeypatch.setattr(kill, "_still", still)
    report = agent_kill.kill_run(plan, wait_s=0.5)
    new = taken["new"]
    try:
        assert report["term"] == [] and report["vanished"] == [old.pid]
        assert new.poll() is None
    finally:
        new.kill()
        new.wait()


def test_the_agent_and_its_ancestors_are_never_planned_nor_signalled():
    me = os.getpid()  # the agent's functions run in this process here: it is "the agent"
    found = agent_kill.run_plan(pids=[me])
    assert found["plan"] == [] and "never signalled" in found["rule"]
    entry = {"pid": me, "start": agent_procs._start_ticks(me), "uid": os.geteuid()}
    report = agent_kill.kill_run(
        [entry, dict(entry, pid=os.getppid(), start=agent_procs._start_ticks(os.getppid()))], wait_s=0
    )
    assert report["term"] == [] and all("never signalled" in s["why"] for s in report["skipped"])


def test_a_process_that_appears_after_the_plan_is_reported_not_signalled(tmp_path):
    trigger = tmp_path / "go"
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import os,subprocess,time\n"
            f"while not os.path.exists({str(trigger)!r}): time.sleep(0.05)\n"
            f"subprocess.Popen(['sleep', '600'], start_new_session=False)\ntime.sleep(600)",
        ],
        start_new_session=True,
    )
    child = None
    try:
        plan = agent_kill.run_plan(pids=[parent.pid])["plan"]
        assert [e["pid"] for e in plan] == [parent.pid]
        trigger.write_text("")
        deadline = time.monotonic() + 10
        while child is None:
            assert time.monotonic() < deadline
            kids = Path(f"/proc/{parent.pid}/task/{parent.pid}/children").read_text().split()
            child = int(kids[0]) if kids else None
            time.sleep(0.05)
        report = agent_kill.kill_run(plan, wait_s=2.0, sessions=[parent.pid])
        assert report["term"] == [parent.pid]
        assert [n["pid"] for n in report["newcomers"]] == [child] and "not signalled" in report["newcomers"][0]["why"]
        assert child in report["remaining"] and not gone(child)  # honest: the run is not fully gone
    finally:
        end_session(parent)
