"""Touch only the run, on a shared host: a colleague's server beside ours, a reused pid, a reused
process group in the ledger, another user's /dev/shm file, secrets in argv and env, planted log
symlinks, a process chain 1,000 deep with names that are not UTF-8. Real processes and files
throughout; nothing here assumes that no other `sglang::*` process runs on this machine."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cockpit.actions import kill as actions
from cockpit.actions import launch
from cockpit.agent import kill, kill as agent_kill, logs as agent_logs, ports as agent_ports, procs as agent_procs, protocol as agent_protocol, shm as agent_shm
from cockpit.agent import procs as procs_mod
from cockpit.common.errors import CockpitError
from cockpit.runs import run as runmod
from cockpit.link.target import parse_target
from cockpit.host.session import HostSession, SessionOptions, WatchList
from conftest import free_port, run_cli
from simhost import gone, wait_for

NOBODY = 65534


# ----------------------------------------------------------------------------- helpers


def session_procs(sid: int) -> dict[int, int]:
    """{pid: start ticks} of every live process of a session."""
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            row = agent_procs._proc_stat(int(name))
            if row is not None and row["sid"] == sid and row["status"] != "Z":
                out[row["pid"]] = row["_start"]
    return out


def all_alive(procs: dict[int, int]) -> bool:
    return all(agent_procs._start_ticks(pid) == start and not gone(pid) for pid, start in procs.items())


def wait_ready(log: Path, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while "ready to roll" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline and proc.poll() is None, log.read_text() if log.exists() else "no log"
        time.sleep(0.2)


def start_by_hand(sim_state, tmp_path: Path, port: int, *extra: str, with_sleep: bool = False):
    """A server started outside the cockpit, as a colleague does: the same titles, its own port,
    its own session. `with_sleep`: a wrapper shell starts it and an unrelated `sleep` in one
    process group (what the old scope swept in)."""
    log = tmp_path / f"by-hand-{port}.log"
    argv = [sys.executable, "-m", "cockpit.sim.server", "--tp-size", "2", "--port", str(port), "--sim-speed", "4",
            *extra]
    env = dict(os.environ, COCKPIT_SIM_STATE=str(sim_state))
    if with_sleep:
        cmd = ["bash", "-c", f"{shlex.join(argv)} > {shlex.quote(str(log))} 2>&1 & sleep 600 & wait"]
        proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    else:
        proc = subprocess.Popen(argv, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
    wait_ready(log, proc)
    return proc


def end_session(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(10)


def layout_file(tmp_path: Path, name: str, port: int | None, extra_flags=(), env=None, ports=True) -> Path:
    flags = ["--tp-size", "2", *([] if port is None else ["--port", str(port)]), *extra_flags]
    lines = [f"name: {name}", "engine: sglang", "command: [-m, cockpit.sim.server]",
             f"base_flags: {json.dumps(flags)}", f"log_dir: {tmp_path}/runs", "kill_wait_s: 2",
             "stall: {idle_s: 30, spin_s: 30}", "sim: {speed: 4, seed: 1}"]
    if port is not None and ports:
        lines.append(f"ports: [{port}]")
    if env:
        lines.append("env:")
        lines += [f"  {k}: {json.dumps(v)}" for k, v in env.items()]
    path = tmp_path / f"{name}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def json_tail(text: str):
    return json.loads(text[text.index("{"):])


# ----------------------------------------------------------------------------- two servers side by side


def test_launch_and_kill_ours_beside_a_colleagues_server_leave_theirs_alive(sim_state, tmp_path):
    """The issue's first report: `launch --yes` killed a colleague's server (same titles, its own
    port) and the `sleep` in its process group. Now: launch, relaunch and kill of ours touch
    none of theirs, and the kill still takes down every process of ours."""
    theirs = start_by_hand(sim_state, tmp_path, free_port(), with_sleep=True)
    try:
        their_procs = session_procs(theirs.pid)
        assert len(their_procs) >= 6  # bash, sleep, launcher, 2 ranks, detokenizer (tracker)
        port = free_port()
        layout = layout_file(tmp_path, f"ours{port}", port)
        target = ["local", "--sim", str(sim_state), "--layout", str(layout)]
        env = {"XDG_STATE_HOME": str(tmp_path / "state")}
        first = run_cli("launch", *target, "--yes", "--no-clean-shm", "--timeout", "90", env=env, timeout=150)
        assert first.returncode == 0, first.stderr[-2000:]
        assert ": ready" in first.stdout and "no current run to kill" in first.stdout
        assert not any(str(pid) in first.stdout.split("then launched")[0] for pid in their_procs)
        assert all_alive(their_procs)

        second = run_cli("launch", *target, "--yes", "--no-clean-shm", "--timeout", "90", env=env, timeout=150)  # relaunch
        assert second.returncode == 0, second.stderr[-2000:]
        plan_text = second.stdout.split("then launched")[0]
        assert "the run: launched by this cockpit (ledger)" in plan_text
        assert not any(f" {pid} " in plan_text for pid in their_procs)
        assert all_alive(their_procs)

        from cockpit.runs.layoutfile import parse_layout
        from cockpit.runs import ledger as runs
        os.environ["XDG_STATE_HOME"] = env["XDG_STATE_HOME"]
        try:
            ours = runs.read_ledger(parse_layout(layout.read_text(), str(layout)))[-1]
        finally:
            del os.environ["XDG_STATE_HOME"]
        our_procs = session_procs(int(ours["pgid"]))
        assert len(our_procs) >= 4 and ours["start"] == our_procs[int(ours["pgid"])]

        killed = run_cli("kill", *target, "--yes", "--json", env=env)
        assert killed.returncode == 0, killed.stderr
        report = json_tail(killed.stdout)
        assert report["verified"] and report["skipped"] == [] and report["newcomers"] == []
        assert "the run: launched by this cockpit (ledger)" in killed.stderr  # the plan; stdout is the JSON alone
        assert json.loads(killed.stdout)["summary"].startswith("stopped ")
        assert all(gone(pid) for pid in our_procs) and session_procs(int(ours["pgid"])) == {}
        assert all_alive(their_procs)
        os.environ["XDG_STATE_HOME"] = env["XDG_STATE_HOME"]
        try:  # killed whole and verified: recorded as ended, never resumed from its record
            assert runs.read_ledger(parse_layout(layout.read_text(), str(layout)))[-1].get("how") == "killed"
        finally:
            del os.environ["XDG_STATE_HOME"]
    finally:
        end_session(theirs)


def test_two_runs_of_one_layout_are_listed_never_merged(sim_state, tmp_path):
    """A layout without ports whose command and model path two servers both run: the kill
    refuses in one line naming both; --pid chooses one; the other is untouched."""
    model = f"/models/test-{os.getpid()}-{free_port()}"
    a = start_by_hand(sim_state, tmp_path, free_port(), "--model-path", model)
    b = start_by_hand(sim_state, tmp_path, free_port(), "--model-path", model)
    try:
        procs_a, procs_b = session_procs(a.pid), session_procs(b.pid)
        layout = layout_file(tmp_path, "shared-model", None, ["--model-path", model])
        target = ["local", "--sim", str(sim_state), "--layout", str(layout)]
        env = {"XDG_STATE_HOME": str(tmp_path / "state")}
        res = run_cli("kill", *target, "--yes", env=env)
        assert res.returncode == 2 and "2 runs found" in res.stderr and "not merged" in res.stderr, res.stderr
        assert f"pid {a.pid}" in res.stderr and f"pid {b.pid}" in res.stderr and "--pid ROOT" in res.stderr
        assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr
        assert all_alive(procs_a) and all_alive(procs_b)

        res = run_cli("kill", *target, "--pid", str(a.pid), "--yes", "--json", env=env)
        assert res.returncode == 0, res.stderr
        assert json_tail(res.stdout)["verified"] and all(gone(p) for p in procs_a)
        assert all_alive(procs_b)

        res = run_cli("kill", *target, "--yes", "--json", env=env)  # one run left: found by its command
        assert res.returncode == 0, res.stderr
        assert "the run: command matches: -m cockpit.sim.server with " + model in res.stderr
        assert all(gone(p) for p in procs_b)
    finally:
        end_session(a)
        end_session(b)


# ----------------------------------------------------------------------------- reused pids


def sleeper() -> subprocess.Popen:
    return subprocess.Popen(["sleep", "600"], start_new_session=True)


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
    proc = subprocess.Popen([sys.executable, "-c", "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                             "print('ok', flush=True); time.sleep(600)"], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
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


def _take_pid(pid: int, argv: tuple[str, ...] = ("sleep", "600"), new_session: bool = True,
              tries: int = 200) -> subprocess.Popen | None:
    """A new process running argv that gets exactly this (free) pid, through ns_last_pid (root
    only). It starts at least one clock tick after the pid's earlier process did: start times are
    counted in ticks (10 ms), and a pid reused within the same tick as the first start is not
    distinguishable."""
    time.sleep(0.05)
    for _ in range(tries):
        try:
            with open("/proc/sys/kernel/ns_last_pid", "w") as fh:
                fh.write(str(pid - 1))
        except OSError:
            return None
        p = subprocess.Popen(list(argv), start_new_session=new_session)
        if p.pid == pid:
            return p
        p.kill()
        p.wait()
    return None


def test_a_really_reused_pid_is_not_signalled():
    """The real thing: the planned process exits, a new process gets its pid, then the plan is
    carried out. The newcomer lives; the report names the pid as reused."""
    old = sleeper()
    plan = agent_kill.run_plan(pids=[old.pid])["plan"]
    old.kill()
    old.wait()
    new = _take_pid(old.pid)
    if new is None:
        pytest.skip("cannot steer pid allocation here (/proc/sys/kernel/ns_last_pid not writable)")
    try:
        report = agent_kill.kill_run(plan, wait_s=1.0)
        assert report["term"] == [] and "pid reused" in report["skipped"][0]["why"]
        assert new.poll() is None
    finally:
        new.kill()
        new.wait()


def test_a_pid_reused_between_the_check_and_the_signal_gets_nothing(monkeypatch):
    """The narrowest window: the start time matches, then (before the signal goes) the process
    exits and a new one takes its pid. The signal goes through the pidfd opened before the check,
    which still names the exited process: the newcomer gets nothing."""
    if not hasattr(os, "pidfd_open") or not hasattr(signal, "pidfd_send_signal"):
        pytest.skip("no pidfd on this Python/kernel: the check and the signal are then separate system calls")
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
    new = taken.get("new")
    if new is None:
        pytest.skip("cannot steer pid allocation here (/proc/sys/kernel/ns_last_pid not writable)")
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
    report = agent_kill.kill_run([entry, dict(entry, pid=os.getppid(), start=agent_procs._start_ticks(os.getppid()))], wait_s=0)
    assert report["term"] == [] and all("never signalled" in s["why"] for s in report["skipped"])


def test_a_process_that_appears_after_the_plan_is_reported_not_signalled(tmp_path):
    trigger = tmp_path / "go"
    parent = subprocess.Popen([sys.executable, "-c", f"import os,subprocess,time\n"
                               f"while not os.path.exists({str(trigger)!r}): time.sleep(0.05)\n"
                               f"subprocess.Popen(['sleep', '600'], start_new_session=False)\ntime.sleep(600)"],
                              start_new_session=True)
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


def test_resume_does_not_trust_a_reused_process_group(tmp_path, sim_state):
    """The ledger names process group P; P is now another process (its start time differs):
    not the run, nothing is killed. With the recorded start time right, it is the run."""
    proc = sleeper()
    try:
        port = free_port()
        layout = layout_file(tmp_path, f"resume{port}", port)
        env = {"XDG_STATE_HOME": str(tmp_path / "state")}
        from cockpit.runs import ledger as runs
        from cockpit.runs.layoutfile import parse_layout
        lay = parse_layout(layout.read_text(), str(layout))
        os.environ["XDG_STATE_HOME"] = env["XDG_STATE_HOME"]
        start = agent_procs._start_ticks(proc.pid)
        try:
            runs.append_ledger(lay, {"event": "launch", "run_id": "r1", "host": "local", "argv": ["x"]})
            runs.append_ledger(lay, {"event": "started", "run_id": "r1", "pid": proc.pid, "pgid": proc.pid,
                                     "start": start - 50, "boot": agent_procs._boot_time(), "uid": os.geteuid()})
        finally:
            del os.environ["XDG_STATE_HOME"]
        target = ["local", "--sim", str(sim_state), "--layout", str(layout)]
        res = run_cli("kill", *target, "--yes", env=env)
        assert res.returncode == 2 and "nothing to kill" in res.stderr and proc.poll() is None, res.stderr
        os.environ["XDG_STATE_HOME"] = env["XDG_STATE_HOME"]
        try:
            runs.append_ledger(lay, {"event": "launch", "run_id": "r2", "host": "local", "argv": ["x"]})
            runs.append_ledger(lay, {"event": "started", "run_id": "r2", "pid": proc.pid, "pgid": proc.pid,
                                     "start": start, "boot": agent_procs._boot_time(), "uid": os.geteuid()})
        finally:
            del os.environ["XDG_STATE_HOME"]
        res = run_cli("kill", *target, "--yes", "--wait", "1", env=env)
        assert res.returncode == 0, res.stderr
        assert "the run: launched by this cockpit (ledger): process group %d" % proc.pid in res.stdout
        assert proc.wait(5) == -signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# ----------------------------------------------------------------------------- /dev/shm


def test_shm_clean_keeps_other_users_files_and_other_names(tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    dead = next(p for p in range(pid_max - 1, 1, -1) if not Path(f"/proc/{p}").exists())
    files = {"nccl-ours1": None, "nccl-theirs": NOBODY, "dataset.bin": None, "psm_held": None,
             f"sgl_shm_tokenizer_{os.getpid()}_ab": None, f"torch_{dead}_1_2": None}
    for name, uid in files.items():
        (shm / name).write_bytes(b"x" * 4096)
        if uid is not None:
            os.chown(shm / name, uid, uid)
    bad = os.fsencode(str(shm)) + b"/nccl-\xff\xfe"
    with open(bad, "wb") as fh:
        fh.write(b"y" * 4096)
    os.symlink("/etc/passwd", shm / "nccl-link")
    holder = subprocess.Popen([sys.executable, "-c", f"f=open({str(shm / 'psm_held')!r},'rb'); print('ok', flush=True); "
                               "import time; time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ok"
        audit = run_cli("shm", "local", "--dir", str(shm), "--json")
        assert audit.returncode == 0, audit.stderr
        by = {e["name"]: e for e in json.loads(audit.stdout)["audit"]["entries"]}
        why = {n: e["why"] for n, e in by.items()}
        assert "owned by nobody (uid 65534), not the run's user (root)" in why["nccl-theirs"]
        assert "not an inference run's name" in why["dataset.bin"]
        assert why["psm_held"] == f"held by pid {holder.pid}"
        assert "creator pid" in why[f"sgl_shm_tokenizer_{os.getpid()}_ab"]
        assert "symlink" in why["nccl-link"]
        assert sorted(n for n, e in by.items() if e["removable"]) == sorted(["nccl-ours1", f"torch_{dead}_1_2",
                                                                             "nccl-\udcff\udcfe"])
        refused = run_cli("shm", "local", "--dir", str(shm), "--clean", "--yes")
        assert refused.returncode == 2 and "--yes-other-dir" in refused.stderr and (shm / "nccl-ours1").exists()

        res = run_cli("shm", "local", "--dir", str(shm), "--clean", "--yes", "--yes-other-dir")
        assert res.returncode == 0, res.stderr
        assert "removed 3 entries" in res.stdout and "removed nccl-\\xff\\xfe" in res.stdout
        left = sorted(os.listdir(shm))
        assert left == sorted(["nccl-theirs", "dataset.bin", "psm_held", f"sgl_shm_tokenizer_{os.getpid()}_ab",
                               "nccl-link"])
        assert Path("/etc/passwd").exists()
    finally:
        holder.kill()
        holder.wait()


def test_another_users_file_in_the_real_dev_shm_is_kept():
    theirs = Path(f"/dev/shm/nccl-gpu-cockpit-test-{os.getpid()}-nobody")
    theirs.write_bytes(b"z" * 4096)
    os.chown(theirs, NOBODY, NOBODY)
    try:
        res = run_cli("shm", "local", "--json")
        assert res.returncode == 0, res.stderr
        entry = next(e for e in json.loads(res.stdout)["audit"]["entries"] if e["name"] == theirs.name)
        assert not entry["removable"] and entry["owner"] == "nobody" and "not the run's user" in entry["why"]
        done = agent_shm.shm_clean("/dev/shm", [theirs.name])
        assert done["removed"] == [] and theirs.exists()
        with pytest.raises(agent_protocol.Refused):
            agent_shm.shm_clean("/tmp", ["x"])  # another folder, not confirmed
    finally:
        theirs.unlink(missing_ok=True)


# ----------------------------------------------------------------------------- secrets and logs


def test_secrets_in_argv_and_env_are_never_stored_or_shown(sim_state, tmp_path):
    port = free_port()
    secrets = ["sk-test-SECRET-1", "pw-SECRET-2", "ghp_SECRET3", "hf_SECRET4"]
    layout = layout_file(tmp_path, f"secret{port}", port, ["--api-key", secrets[0]],
                         env={"DATABASE_URL": f"postgres://app:{secrets[1]}@db/x", "GITHUB_PAT": secrets[2],
                              "HF_TOKEN": secrets[3]})
    target = ["local", "--sim", str(sim_state), "--layout", str(layout)]
    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    ours = Path(f"/dev/shm/psm_gpu-cockpit-test-{os.getpid()}-leak")  # left by an earlier run of ours
    theirs = Path(f"/dev/shm/psm_gpu-cockpit-test-{os.getpid()}-theirs")
    for path in (ours, theirs):
        path.write_bytes(b"x" * 4096)
    os.chown(theirs, NOBODY, NOBODY)
    try:
        res = run_cli("launch", *target, "--yes", "--timeout", "90", env=env, timeout=150)
        assert res.returncode == 0, res.stderr[-2000:]
        assert "--api-key '***'" in res.stdout or "--api-key ***" in res.stdout
        # the clean before the launch listed what it would remove, then said what it removed; another
        # user's file is neither listed nor removed by it. No run was there: a file of ours left
        # from before cannot be tied to a run, so it is said as left, not removed (`cockpit shm
        # --clean` removes it when asked).
        assert any(said in res.stdout for said in ("of /dev/shm are removed", "of /dev/shm is removed",
                                                   "nothing to remove from /dev/shm"))
        assert theirs.name not in res.stdout and theirs.name not in res.stderr and theirs.exists()
        said = next(line for line in res.stdout.splitlines() if ours.name in line)
        assert f"rm {ours.name}" not in res.stdout and said.startswith("  left (") and "cannot tell whose it is" in said
        assert ours.exists()
        snap = run_cli("snapshot", *target, "--json", "--wait", "0", env=env)
        assert snap.returncode == 0, snap.stderr
        assert "--api-key" in snap.stdout  # the launcher's command line is there, its key is not
        ledger = next((tmp_path / "state" / "gpu-cockpit" / "ledger").iterdir())
        listed = run_cli("runs", "--layout", str(layout), "--json", env=env)
        assert "postgres://app:***@db/x" in listed.stdout
        record = [r for r in json.loads(listed.stdout)][-1]
        log = Path(record["log"])
        assert oct(log.stat().st_mode & 0o777) == "0o600" and oct(ledger.stat().st_mode & 0o777) == "0o600"
        killed = run_cli("kill", *target, "--yes", "--json", env=env)
        assert killed.returncode == 0, killed.stderr
        for text in (res.stdout, res.stderr, snap.stdout, ledger.read_text(), listed.stdout, killed.stdout,
                     killed.stderr):
            for secret in secrets:
                assert secret not in text
    finally:
        subprocess.run(["pkill", "-9", "-f", f"sim.server.*--port {port}"])
        ours.unlink(missing_ok=True)
        theirs.unlink(missing_ok=True)


def test_the_run_log_is_created_0600_and_never_through_a_symlink(tmp_path):
    fd = agent_logs.open_log(str(tmp_path / "logs" / "a.log"))
    os.close(fd)
    assert oct((tmp_path / "logs" / "a.log").stat().st_mode & 0o777) == "0o600"
    victim = tmp_path / "victim"
    victim.write_text("precious")
    shared = tmp_path / "shared-logs"
    shared.mkdir(mode=0o1777)
    (shared / "run.log").symlink_to(victim)
    with pytest.raises(agent_protocol.Refused, match="symbolic link"):
        agent_logs.open_log(str(shared / "run.log"))
    theirs = shared / "theirs.log"
    theirs.write_text("their log")
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(agent_protocol.Refused, match="belongs to nobody"):
        agent_logs.open_log(str(theirs))

    async def through_the_agent():
        session = HostSession(parse_target("local"), SessionOptions(python=sys.executable, interval=0.5),
                              WatchList(patterns=[]))
        await session.connect()
        try:
            await session.request("launch", argv=["sleep", "1"], log=str(shared / "run.log"))
        finally:
            await session.close()

    with pytest.raises(CockpitError) as err:
        asyncio.run(through_the_agent())
    assert "symbolic link" in str(err.value) and "\n" not in str(err.value)
    assert victim.read_text() == "precious" and theirs.read_text() == "their log"


# ----------------------------------------------------------------------------- deep trees, odd names


async def test_a_process_chain_1000_deep_with_non_utf8_names(tmp_path):
    depth = 1000
    script = tmp_path / "chain.sh"
    script.write_text('#!/bin/sh\nif [ "$1" -gt 0 ]; then "$0" $(($1 - 1)) "$2"; else exec "$2" 600; fi\n')
    script.chmod(0o755)
    odd = os.fsencode(str(tmp_path)) + b"/\xff\xfe-sleep"
    os.symlink("/bin/sleep", odd)
    chain = subprocess.Popen([str(script), str(depth), odd], start_new_session=True)
    try:
        await wait_for(lambda: len(session_procs(chain.pid)) >= depth + 1, 120, "the chain")
        found = agent_kill.run_plan(patterns=[f"*{script}*"])
        assert len(found["candidates"]) == 1 and found["root"] == chain.pid and len(found["plan"]) == depth + 1

        session = HostSession(parse_target("local"), SessionOptions(python=sys.executable, interval=0.5),
                              WatchList(patterns=[], pids=[chain.pid]))
        await session.connect()
        try:
            await wait_for(lambda: len(session.state.procs) >= depth + 1, 60, "every process watched")
            tree = session.state.tree()
            assert len(tree) == depth + 1 and max(d for d, _ in tree) == depth
            from cockpit.host.snapshot import snapshot_doc
            json.dumps(snapshot_doc(session.state))
            plan = await actions.plan_kill(session, runmod.process_scope(chain.pid))
            assert len(plan.entries) == depth + 1
            text = "\n".join(plan.describe())
            assert "\\xff" in text or "\ufffd" in text  # the odd name made visible, never raw bytes
            report = await actions.kill(session, plan, wait_s=5.0)
            assert report["remaining"] == [] and report["skipped"] == []
        finally:
            await session.close()
        assert session_procs(chain.pid) == {}
    finally:
        try:
            os.killpg(chain.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        chain.wait(10)


# ----------------------------------------------------------------------------- what "the run" is, on a shared host


def sim_argv(port: int | None, model: str) -> list[str]:
    return [sys.executable, "-m", "cockpit.sim.server", "--tp-size", "2", *([] if port is None else ["--port", str(port)]),
            "--sim-speed", "4", "--model-path", model]


def wait_listening(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while port not in agent_ports.listening_ports():
        assert time.monotonic() < deadline, f"nothing listens on {port}"
        time.sleep(0.2)


def alive_pids(pids) -> bool:
    return all(not gone(p) for p in pids)


def test_a_shared_tmux_server_and_its_other_sessions_are_never_the_run(sim_state, tmp_path):
    """The tmux server's own command line carries the layout's command (`tmux new -d -s sgl python
    -m …`): it is not the server, so the run is never climbed up to it, and a colleague's job and an
    interactive shell in its other sessions are never planned, by any rule; the kill ends the
    server only."""
    port, model = free_port(), f"/models/tmux-{os.getpid()}-{free_port()}"
    sock = f"gpc-test-{os.getpid()}-{port}"
    env = dict(os.environ, COCKPIT_SIM_STATE=str(sim_state))
    subprocess.run(["tmux", "-L", sock, "new", "-d", "-s", "sgl", *sim_argv(port, model)], env=env, check=True)
    try:
        subprocess.run(["tmux", "-L", sock, "new", "-d", "-s", "colleague", "sleep", "600"], env=env, check=True)
        subprocess.run(["tmux", "-L", sock, "new", "-d", "-s", "shell", "bash"], env=env, check=True)
        wait_listening(port)
        tmux = int(subprocess.run(["tmux", "-L", sock, "display", "-p", "#{pid}"], capture_output=True, text=True,
                                  check=True).stdout)
        assert "cockpit.sim.server" in " ".join(agent_procs._read_cmdline(tmux))  # the trap: tmux's argv names it
        panes = subprocess.run(["tmux", "-L", sock, "list-panes", "-a", "-F", "#{session_name} #{pane_pid}"],
                               capture_output=True, text=True, check=True).stdout.split("\n")
        pane = {line.split()[0]: int(line.split()[1]) for line in panes if line.strip()}
        server, bystanders = pane["sgl"], [tmux, pane["colleague"], pane["shell"]]
        command = ["-m", "cockpit.sim.server"]
        for how in ({"ports": [port], "command": command, "model": model},  # owns port N
                    {"command": command, "model": model, "ports": [port], "default_port": 30000},
                    {"command": command, "model": model},  # command matches
                    {}):  # no layout: title matches (other servers of this machine may be found too)
            found = agent_kill.find_runs(**how)
            members = {e["pid"] for run in found["runs"] for e in run["members"]}
            assert not members & set(bystanders), (how, found)
            assert server in [run["root"] for run in found["runs"]], (how, found)
        layout = layout_file(tmp_path, f"tmux{port}", port, ["--model-path", model])
        res = run_cli("kill", "local", "--sim", str(sim_state), "--layout", str(layout), "--yes", "--json",
                      env={"XDG_STATE_HOME": str(tmp_path / "state")})
        assert res.returncode == 0, res.stderr
        assert f"the run: owns port {port}" in res.stderr and json_tail(res.stdout)["verified"]
        assert gone(server) and alive_pids(bystanders)
    finally:
        subprocess.run(["tmux", "-L", sock, "kill-server"])


def test_a_setsid_bash_wrapper_and_the_job_it_also_started_are_not_the_run(sim_state, tmp_path):
    """`setsid bash -c "server & unrelated_job & wait"`: the shell only runs a string that names
    the server; the run is rooted at the server, never at the shell (by the title rule too, whose
    "choose --pid" would have named the shell), and the unrelated job and the shell live on."""
    port, model = free_port(), f"/models/wrap-{os.getpid()}-{free_port()}"
    log = tmp_path / "wrapped.log"
    script = f"{shlex.join(sim_argv(port, model))} > {shlex.quote(str(log))} 2>&1 & sleep 600 & wait"
    wrapper = subprocess.Popen(["setsid", "bash", "-c", script], env=dict(os.environ, COCKPIT_SIM_STATE=str(sim_state)))
    try:
        wait_ready(log, wrapper)
        kids = {agent_procs._read_cmdline(p)[0].rsplit("/", 1)[-1]: p for p in
                map(int, Path(f"/proc/{wrapper.pid}/task/{wrapper.pid}/children").read_text().split())}
        assert agent_procs._proc_stat(wrapper.pid)["sid"] == wrapper.pid  # setsid exec'd bash: it leads its session
        server, job = next(p for n, p in kids.items() if n.startswith("python")), kids["sleep"]
        for how in ({"ports": [port], "command": ["-m", "cockpit.sim.server"], "model": model},
                    {"command": ["-m", "cockpit.sim.server"], "model": model}, {}):
            found = agent_kill.find_runs(**how)
            roots = [run["root"] for run in found["runs"]]
            members = {e["pid"] for run in found["runs"] for e in run["members"]}
            assert server in roots and wrapper.pid not in roots and not {wrapper.pid, job} & members, (how, found)
        layout = layout_file(tmp_path, f"wrap{port}", port, ["--model-path", model])
        res = run_cli("kill", "local", "--sim", str(sim_state), "--layout", str(layout), "--yes", "--json",
                      env={"XDG_STATE_HOME": str(tmp_path / "state")})
        assert res.returncode == 0 and json_tail(res.stdout)["verified"], res.stderr
        assert gone(server) and alive_pids([wrapper.pid, job])
    finally:
        end_session(wrapper)


def test_a_same_model_server_on_the_engines_default_port_is_not_the_layouts(sim_state, tmp_path):
    """Layout `--port P`, nothing on P: a colleague's server of the same model started without
    `--port` (SGLang's default, 30000) is not planned; the kill finds nothing and says why."""
    model = f"/models/default-port-{os.getpid()}-{free_port()}"
    log = tmp_path / "theirs.log"
    host = f"127.{os.getpid() % 200 + 1}.{free_port() % 250 + 1}.9"  # 30000 on its own loopback address: free
    theirs = subprocess.Popen(sim_argv(None, model) + ["--host", host], stdout=open(log, "w"), stderr=subprocess.STDOUT,
                              env=dict(os.environ, COCKPIT_SIM_STATE=str(sim_state)), start_new_session=True)
    try:
        try:
            wait_ready(log, theirs)
        except AssertionError:
            pytest.skip(f"port 30000 is taken on {host} here: the colleague's server needs it")
        assert 30000 in agent_kill._listens(theirs.pid)
        procs = session_procs(theirs.pid)
        port = free_port()
        found = agent_kill.find_runs(ports=[port], command=["-m", "cockpit.sim.server"], model=model, default_port=30000)
        assert found["runs"] == [] and f"no process listens on port {port}" in found["notes"], found
        found = agent_kill.find_runs(command=["-m", "cockpit.sim.server"], model=model)  # no ports named: it is one
        assert [r["root"] for r in found["runs"]] == [theirs.pid]
        layout = layout_file(tmp_path, f"dflt{port}", port, ["--model-path", model])
        res = run_cli("kill", "local", "--sim", str(sim_state), "--layout", str(layout), "--yes",
                      env={"XDG_STATE_HOME": str(tmp_path / "state")})
        assert res.returncode == 2 and "nothing to kill" in res.stderr, res.stdout + res.stderr
        assert all_alive(procs)
    finally:
        end_session(theirs)


def test_a_server_in_another_network_namespace_is_not_on_the_layouts_port(sim_state, tmp_path):
    """`unshare -n`: a server listening on P in its own network namespace is not on this host's P
    (which nothing holds): not planned, and the note says both."""
    port, model = free_port(), f"/models/netns-{os.getpid()}-{free_port()}"
    log = tmp_path / "netns.log"
    script = f"ip link set lo up && exec {shlex.join(sim_argv(port, model))} > {shlex.quote(str(log))} 2>&1"
    proc = subprocess.Popen(["unshare", "-n", "sh", "-c", script], env=dict(os.environ, COCKPIT_SIM_STATE=str(sim_state)),
                            start_new_session=True)
    try:
        try:
            wait_ready(log, proc, timeout=60)
        except AssertionError:
            pytest.skip("cannot make a network namespace here (unshare -n needs CAP_SYS_ADMIN)")
        procs = session_procs(proc.pid)
        assert port not in agent_ports.listening_ports() and port in agent_kill._listens(proc.pid)
        found = agent_kill.find_runs(ports=[port], command=["-m", "cockpit.sim.server"], model=model, default_port=30000)
        assert found["runs"] == [], found
        assert f"no process listens on port {port}" in found["notes"]
        assert any("another network namespace" in n and str(proc.pid) in n for n in found["notes"]), found["notes"]
        assert all_alive(procs)
    finally:
        end_session(proc)


def _ledger(layout: Path, tmp_path: Path, *records: dict) -> None:
    from cockpit.runs import ledger as runs
    from cockpit.runs.layoutfile import parse_layout

    lay = parse_layout(layout.read_text(), str(layout))
    os.environ["XDG_STATE_HOME"] = str(tmp_path / "state")
    try:
        for rec in records:
            runs.append_ledger(lay, rec)
    finally:
        del os.environ["XDG_STATE_HOME"]


TITLED = "exec -a sglang::scheduler_TP0 sleep 600"  # a rank's title, as SGLang sets it


def test_a_reused_process_group_whose_leader_is_gone_is_not_the_run(sim_state, tmp_path):
    """The launched run's group P was killed whole; a new process got pid P, called setsid() and
    started a colleague's rank (same titles, same user), then exited. The ledger's "leader gone"
    rule must not take it: none of its processes started while our leader was seen alive, none
    carries our launch marker. Then the real thing for contrast: a leader killed alone, its rank
    left (started while the leader was seen alive, or carrying the marker) is the run."""
    ours = sleeper()
    start = agent_procs._start_ticks(ours.pid)
    seen = agent_kill._now_ticks()
    port = free_port()
    layout = layout_file(tmp_path, f"reuse{port}", port)
    _ledger(layout, tmp_path, {"event": "launch", "run_id": "r1", "host": "local", "argv": ["x"]},
            {"event": "started", "run_id": "r1", "pid": ours.pid, "pgid": ours.pid, "start": start,
             "boot": agent_procs._boot_time(), "uid": os.geteuid()}, {"event": "seen", "run_id": "r1", "seen_ticks": seen})
    os.killpg(ours.pid, signal.SIGKILL)
    ours.wait()
    time.sleep(0.1)
    setsid_then_exit = [sys.executable, "-c", f"import os,subprocess; os.setsid(); "
                        f"subprocess.Popen(['bash', '-c', {TITLED!r}]); os._exit(0)"]
    imposter = _take_pid(ours.pid, setsid_then_exit, new_session=False)
    if imposter is None:
        pytest.skip("cannot steer pid allocation here (/proc/sys/kernel/ns_last_pid not writable)")
    imposter.wait()
    try:
        deadline = time.monotonic() + 10
        while not session_procs(ours.pid):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        theirs = session_procs(ours.pid)
        target = ["local", "--sim", str(sim_state), "--layout", str(layout)]
        res = run_cli("kill", *target, "--yes", env={"XDG_STATE_HOME": str(tmp_path / "state")})
        assert res.returncode == 2 and "nothing to kill" in res.stderr, res.stdout + res.stderr
        assert all_alive(theirs)
        found = agent_kill.find_runs(launched=[{"pgid": ours.pid, "start": start, "boot": agent_procs._boot_time(),
                                           "uid": os.geteuid(), "run_id": "r1", "seen_ticks": seen}])
        assert found["runs"] == [] and any("may have been reused" in n for n in found["notes"]), found
    finally:
        for pid in session_procs(ours.pid):
            os.kill(pid, signal.SIGKILL)

    for proof in ("seen", "marker"):  # the leader killed alone: its rank is found by either proof
        run_id = f"r-{proof}"
        leader = subprocess.Popen(["bash", "-c", f"bash -c {shlex.quote(TITLED)} & wait"], start_new_session=True,
                                  env=dict(os.environ, GPU_COCKPIT_RUN=run_id) if proof == "marker" else None)
        deadline = time.monotonic() + 10
        while len(session_procs(leader.pid)) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        rank = next(p for p in session_procs(leader.pid) if p != leader.pid)
        recs = [{"event": "launch", "run_id": run_id, "host": "local", "argv": ["x"]},
                {"event": "started", "run_id": run_id, "pid": leader.pid, "pgid": leader.pid,
                 "start": agent_procs._start_ticks(leader.pid), "boot": agent_procs._boot_time(), "uid": os.geteuid()}]
        if proof == "seen":
            recs.append({"event": "seen", "run_id": run_id, "seen_ticks": agent_kill._now_ticks()})
        _ledger(layout, tmp_path, *recs)
        time.sleep(0.05)
        leader.kill()
        leader.wait()
        try:
            res = run_cli("kill", "local", "--sim", str(sim_state), "--layout", str(layout), "--yes", "--json",
                          "--wait", "1", env={"XDG_STATE_HOME": str(tmp_path / "state")})
            assert res.returncode == 0, res.stdout + res.stderr
            assert f"process group {leader.pid}, its leader gone" in res.stderr and gone(rank)
        finally:
            if not gone(rank):
                os.kill(rank, signal.SIGKILL)


def test_a_run_recorded_as_ended_is_never_resumed(sim_state, tmp_path):
    """A ledger run killed and verified gone is written as ended; were its record to match a live
    process again, it is not resumed nor killed from it."""
    proc = sleeper()
    try:
        port = free_port()
        layout = layout_file(tmp_path, f"ended{port}", port)
        _ledger(layout, tmp_path, {"event": "launch", "run_id": "r1", "host": "local", "argv": ["x"]},
                {"event": "started", "run_id": "r1", "pid": proc.pid, "pgid": proc.pid,
                 "start": agent_procs._start_ticks(proc.pid), "boot": agent_procs._boot_time(), "uid": os.geteuid()},
                {"event": "ended", "run_id": "r1", "ended": time.time(), "how": "killed"})
        res = run_cli("kill", "local", "--sim", str(sim_state), "--layout", str(layout), "--yes",
                      env={"XDG_STATE_HOME": str(tmp_path / "state")})
        assert res.returncode == 2 and "nothing to kill" in res.stderr and proc.poll() is None, res.stderr
    finally:
        proc.kill()
        proc.wait()


def test_a_child_spawned_by_a_sigterm_handler_is_found_and_the_kill_not_verified(tmp_path):
    """The planned process's SIGTERM handler starts `sleep 600` and exits: the sleep, reparented,
    is born into the process group and session the planned process led. It is reported (not
    signalled: it was not confirmed) and the kill is not verified."""
    code = ("import signal, subprocess, sys, os, time\n"
            "def bye(*_):\n    subprocess.Popen(['sleep', '600'])\n    os._exit(0)\n"
            "signal.signal(signal.SIGTERM, bye)\nprint('ok', flush=True)\ntime.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "ok"
        res = run_cli("kill", "local", "--pid", str(proc.pid), "--wait", "1", "--yes", "--json")
        assert res.returncode == 3, res.stdout + res.stderr
        report = json_tail(res.stdout)
        left = [p for p in session_procs(proc.pid) if p != proc.pid]
        assert len(left) == 1 and not report["verified"]
        assert [n["pid"] for n in report["newcomers"]] == left and left[0] in report["remaining"]
        assert "appeared after the plan: not signalled" in report["newcomers"][0]["why"]
    finally:
        proc.wait(5)
        for pid in session_procs(proc.pid):
            os.kill(pid, signal.SIGKILL)


async def test_an_ablation_step_kills_unasked_only_the_run_it_launched(sim_state, tmp_path):
    """An ablation's later steps and its final kill are not confirmed by anyone: a plan that is not
    the run the previous step launched (found by the ledger rule in its own process group) stops
    the ablation with nothing signalled; the launched run itself is killed."""

    port = free_port()
    theirs = start_by_hand(sim_state, tmp_path, port)
    session = HostSession(parse_target("local"), SessionOptions(python=sys.executable, interval=0.5),
                          WatchList(patterns=[]))
    await session.connect()
    try:
        procs = session_procs(theirs.pid)
        launched = await session.request("launch", argv=["sleep", "600"], log=str(tmp_path / "ours.log"))
        found = await actions.plan_kill(session, runmod.Scope(ports=[port], command=["-m", "cockpit.sim.server"]))
        assert found.entries and found.rule == f"owns port {port}"
        with pytest.raises(CockpitError, match="not the one this ablation launched.*nothing was killed"):
            launch.refuse_unasked(found, launched)
        assert all_alive(procs)
        ours = await actions.plan_kill(session, runmod.Scope(launched=[{k: launched[k] for k in runmod.LAUNCHED_KEYS
                                                                         if k in launched}]))
        assert ours.rule.startswith("launched by this cockpit (ledger)")
        launch.refuse_unasked(ours, launched)  # its own run: no question
        report = await actions.kill(session, ours, wait_s=1.0)
        assert report["verified"] and gone(launched["pid"]) and all_alive(procs)
    finally:
        await session.close()
        end_session(theirs)
