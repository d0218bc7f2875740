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
import time
from pathlib import Path

import pytest
from conftest import free_port, run_cli
from simhost import end_session, gone, sleeper, wait_for

from cockpit.actions import kill as actions
from cockpit.agent import (
    kill as agent_kill,
    logs as agent_logs,
    procs as agent_procs,
    protocol as agent_protocol,
    shm as agent_shm,
)
from cockpit.common.errors import CockpitError
from cockpit.host.session import HostSession, SessionOptions, WatchList
from cockpit.link.target import parse_target
from cockpit.runs import run as runmod

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
    argv = [
        sys.executable,
        "-m",
        "cockpit.sim.server",
        "--tp-size",
        "2",
        "--port",
        str(port),
        "--sim-speed",
        "4",
        *extra,
    ]
    env = dict(os.environ, COCKPIT_SIM_STATE=str(sim_state))
    if with_sleep:
        cmd = ["bash", "-c", f"{shlex.join(argv)} > {shlex.quote(str(log))} 2>&1 & sleep 600 & wait"]
        proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    else:
        proc = subprocess.Popen(argv, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
    wait_ready(log, proc)
    return proc


def layout_file(tmp_path: Path, name: str, port: int | None, extra_flags=(), env=None, ports=True) -> Path:
    flags = ["--tp-size", "2", *([] if port is None else ["--port", str(port)]), *extra_flags]
    lines = [
        f"name: {name}",
        "engine: sglang",
        "command: [-m, cockpit.sim.server]",
        f"base_flags: {json.dumps(flags)}",
        f"log_dir: {tmp_path}/runs",
        "kill_wait_s: 2",
        "stall: {idle_s: 30, spin_s: 30}",
        "sim: {speed: 4, seed: 1}",
    ]
    if port is not None and ports:
        lines.append(f"ports: [{port}]")
    if env:
        lines.append("env:")
        lines += [f"  {k}: {json.dumps(v)}" for k, v in env.items()]
    path = tmp_path / f"{name}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def json_tail(text: str):
    return json.loads(text[text.index("{") :])


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

        second = run_cli(
            "launch", *target, "--yes", "--no-clean-shm", "--timeout", "90", env=env, timeout=150
        )  # relaunch
        assert second.returncode == 0, second.stderr[-2000:]
        plan_text = second.stdout.split("then launched")[0]
        assert "the run: launched by this cockpit (ledger)" in plan_text
        assert not any(f" {pid} " in plan_text for pid in their_procs)
        assert all_alive(their_procs)

        from cockpit.runs import ledger as runs
        from cockpit.runs.layoutfile import parse_layout

        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("XDG_STATE_HOME", env["XDG_STATE_HOME"])
            ours = runs.read_ledger(parse_layout(layout.read_text(), str(layout)))[-1]
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
        with (
            pytest.MonkeyPatch.context() as mp
        ):  # killed whole and verified: recorded as ended, never resumed from its record
            mp.setenv("XDG_STATE_HOME", env["XDG_STATE_HOME"])
            assert runs.read_ledger(parse_layout(layout.read_text(), str(layout)))[-1].get("how") == "killed"
    finally:
        end_session(theirs)


def test_two_runs_of_one_layout_are_listed_never_merged(sim_state, tmp_path):
    """A layout without ports whose command and model path two servers both run: the kill
    refuses in one line, then names each on a line of its own; --pid chooses one; the other is
    untouched."""
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
        assert len(res.stderr.strip().splitlines()) == 3 and "Traceback" not in res.stderr
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
        start = agent_procs._start_ticks(proc.pid)
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("XDG_STATE_HOME", env["XDG_STATE_HOME"])
            runs.append_ledger(lay, {"event": "launch", "run_id": "r1", "host": "local", "argv": ["x"]})
            runs.append_ledger(
                lay,
                {
                    "event": "started",
                    "run_id": "r1",
                    "pid": proc.pid,
                    "pgid": proc.pid,
                    "start": start - 50,
                    "boot": agent_procs._boot_time(),
                    "uid": os.geteuid(),
                },
            )
        target = ["local", "--sim", str(sim_state), "--layout", str(layout)]
        res = run_cli("kill", *target, "--yes", env=env)
        assert res.returncode == 2 and "nothing to kill" in res.stderr and proc.poll() is None, res.stderr
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("XDG_STATE_HOME", env["XDG_STATE_HOME"])
            runs.append_ledger(lay, {"event": "launch", "run_id": "r2", "host": "local", "argv": ["x"]})
            runs.append_ledger(
                lay,
                {
                    "event": "started",
                    "run_id": "r2",
                    "pid": proc.pid,
                    "pgid": proc.pid,
                    "start": start,
                    "boot": agent_procs._boot_time(),
                    "uid": os.geteuid(),
                },
            )
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
    files = {
        "nccl-ours1": None,
        "nccl-theirs": NOBODY,
        "dataset.bin": None,
        "psm_held": None,
        f"sgl_shm_tokenizer_{os.getpid()}_ab": None,
        f"torch_{dead}_1_2": None,
    }
    for name, uid in files.items():
        (shm / name).write_bytes(b"x" * 4096)
        if uid is not None:
            os.chown(shm / name, uid, uid)
    bad = os.fsencode(str(shm)) + b"/nccl-\xff\xfe"
    with open(bad, "wb") as fh:
        fh.write(b"y" * 4096)
    os.symlink("/etc/passwd", shm / "nccl-link")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"f=open({str(shm / 'psm_held')!r},'rb'); print('ok', flush=True); import time; time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
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
        assert sorted(n for n, e in by.items() if e["removable"]) == sorted(
            ["nccl-ours1", f"torch_{dead}_1_2", "nccl-\udcff\udcfe"]
        )
        refused = run_cli("shm", "local", "--dir", str(shm), "--clean", "--yes")
        assert refused.returncode == 2 and "--yes-other-dir" in refused.stderr and (shm / "nccl-ours1").exists()

        res = run_cli("shm", "local", "--dir", str(shm), "--clean", "--yes", "--yes-other-dir")
        assert res.returncode == 0, res.stderr
        assert "removed 3 entries" in res.stdout and "removed nccl-\\xff\\xfe" in res.stdout
        left = sorted(os.listdir(shm))
        assert left == sorted(
            ["nccl-theirs", "dataset.bin", "psm_held", f"sgl_shm_tokenizer_{os.getpid()}_ab", "nccl-link"]
        )
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
    layout = layout_file(
        tmp_path,
        f"secret{port}",
        port,
        ["--api-key", secrets[0]],
        env={"DATABASE_URL": f"postgres://app:{secrets[1]}@db/x", "GITHUB_PAT": secrets[2], "HF_TOKEN": secrets[3]},
    )
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
        assert any(
            said in res.stdout
            for said in (
                "of /dev/shm: removed, each checked again first",
                "nothing of the run's to remove from /dev/shm",
            )
        )
        assert theirs.name not in res.stdout and theirs.name not in res.stderr and theirs.exists()
        assert ours.name not in res.stdout  # not tied to a run: counted by its reason, not listed
        said = next(line for line in res.stdout.splitlines() if "cannot tell whose it is" in line)
        assert said.startswith("  left (") and "not tied to this run" in said
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
        for text in (
            res.stdout,
            res.stderr,
            snap.stdout,
            ledger.read_text(),
            listed.stdout,
            killed.stdout,
            killed.stderr,
        ):
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
        session = HostSession(
            parse_target("local"), SessionOptions(python=sys.executable, interval=0.5), WatchList(patterns=[])
        )
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

        session = HostSession(
            parse_target("local"),
            SessionOptions(python=sys.executable, interval=0.5),
            WatchList(patterns=[], pids=[chain.pid]),
        )
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
