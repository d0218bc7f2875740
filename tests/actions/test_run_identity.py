"""What "the run" is, on a shared machine: a shared tmux server, a setsid wrapper, a same-model
server on the engine's default port, another network namespace, a reused process group whose
leader is gone, a run recorded as ended, a SIGTERM handler's child, an ablation's unasked kill:
never another user's or another job's processes."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import cannot_run, free_port, run_cli
from simhost import end_session, gone, sleeper
from test_reused_pids import _take_pid
from test_safety import all_alive, json_tail, layout_file, session_procs, start_by_hand, wait_ready

from cockpit.actions import kill as actions
from cockpit.agent import kill as agent_kill, ports as agent_ports, procs as agent_procs
from cockpit.common.errors import CockpitError
from cockpit.host.session import HostSession, SessionOptions, WatchList
from cockpit.link.target import parse_target
from cockpit.operate.relaunch import refuse_unasked
from cockpit.runs import run as runmod

NOBODY = 65534


# ----------------------------------------------------------------------------- what "the run" is, on a shared host


def sim_argv(port: int | None, model: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "cockpit.sim.server",
        "--tp-size",
        "2",
        *([] if port is None else ["--port", str(port)]),
        "--sim-speed",
        "4",
        "--model-path",
        model,
    ]


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
        tmux = int(
            subprocess.run(
                ["tmux", "-L", sock, "display", "-p", "#{pid}"], capture_output=True, text=True, check=True
            ).stdout
        )
        assert "cockpit.sim.server" in " ".join(agent_procs._read_cmdline(tmux))  # the trap: tmux's argv names it
        panes = subprocess.run(
            ["tmux", "-L", sock, "list-panes", "-a", "-F", "#{session_name} #{pane_pid}"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split("\n")
        pane = {line.split()[0]: int(line.split()[1]) for line in panes if line.strip()}
        server, bystanders = pane["sgl"], [tmux, pane["colleague"], pane["shell"]]
        command = ["-m", "cockpit.sim.server"]
        for how in (
            {"ports": [port], "command": command, "model": model},  # owns port N
            {"command": command, "model": model, "ports": [port], "default_port": 30000},
            {"command": command, "model": model},  # command matches
            {},
        ):  # no layout: title matches (other servers of this machine may be found too)
            found = agent_kill.find_runs(**how)
            members = {e["pid"] for run in found["runs"] for e in run["members"]}
            assert not members & set(bystanders), (how, found)
            assert server in [run["root"] for run in found["runs"]], (how, found)
        layout = layout_file(tmp_path, f"tmux{port}", port, ["--model-path", model])
        res = run_cli(
            "kill",
            "local",
            "--sim",
            str(sim_state),
            "--layout",
            str(layout),
            "--yes",
            "--json",
            env={"XDG_STATE_HOME": str(tmp_path / "state")},
        )
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
        kids = {
            agent_procs._read_cmdline(p)[0].rsplit("/", 1)[-1]: p
            for p in map(int, Path(f"/proc/{wrapper.pid}/task/{wrapper.pid}/children").read_text().split())
        }
        assert agent_procs._proc_stat(wrapper.pid)["sid"] == wrapper.pid  # setsid exec'd bash: it leads its session
        server, job = next(p for n, p in kids.items() if n.startswith("python")), kids["sleep"]
        for how in (
            {"ports": [port], "command": ["-m", "cockpit.sim.server"], "model": model},
            {"command": ["-m", "cockpit.sim.server"], "model": model},
            {},
        ):
            found = agent_kill.find_runs(**how)
            roots = [run["root"] for run in found["runs"]]
            members = {e["pid"] for run in found["runs"] for e in run["members"]}
            assert server in roots and wrapper.pid not in roots and not {wrapper.pid, job} & members, (how, found)
        layout = layout_file(tmp_path, f"wrap{port}", port, ["--model-path", model])
        res = run_cli(
            "kill",
            "local",
            "--sim",
            str(sim_state),
            "--layout",
            str(layout),
            "--yes",
            "--json",
            env={"XDG_STATE_HOME": str(tmp_path / "state")},
        )
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
    with socket.socket() as probe:
        try:
            probe.bind((host, 30000))
        except OSError as e:
            cannot_run(f"port 30000 on {host} is taken here ({e.strerror}): the colleague's server needs it")
    theirs = subprocess.Popen(
        sim_argv(None, model) + ["--host", host],
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
        env=dict(os.environ, COCKPIT_SIM_STATE=str(sim_state)),
        start_new_session=True,
    )
    try:
        wait_ready(log, theirs)
        assert 30000 in agent_kill._listens(theirs.pid)
        procs = session_procs(theirs.pid)
        port = free_port()
        found = agent_kill.find_runs(
            ports=[port], command=["-m", "cockpit.sim.server"], model=model, default_port=30000
        )
        assert found["runs"] == [] and f"no process listens on port {port}" in found["notes"], found
        found = agent_kill.find_runs(command=["-m", "cockpit.sim.server"], model=model)  # no ports named: it is one
        assert [r["root"] for r in found["runs"]] == [theirs.pid]
        layout = layout_file(tmp_path, f"dflt{port}", port, ["--model-path", model])
        res = run_cli(
            "kill",
            "local",
            "--sim",
            str(sim_state),
            "--layout",
            str(layout),
            "--yes",
            env={"XDG_STATE_HOME": str(tmp_path / "state")},
        )
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
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        cannot_run(f"cannot make a network namespace here: unshare -n: {probe.stderr.strip()}")
    proc = subprocess.Popen(
        ["unshare", "-n", "sh", "-c", script],
        env=dict(os.environ, COCKPIT_SIM_STATE=str(sim_state)),
        start_new_session=True,
    )
    try:
        wait_ready(log, proc, timeout=60)
        procs = session_procs(proc.pid)
        assert port not in agent_ports.listening_ports() and port in agent_kill._listens(proc.pid)
        found = agent_kill.find_runs(
            ports=[port], command=["-m", "cockpit.sim.server"], model=model, default_port=30000
        )
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
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
        for rec in records:
            runs.append_ledger(lay, rec)


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
    _ledger(
        layout,
        tmp_path,
        {"event": "launch", "run_id": "r1", "host": "local", "argv": ["x"]},
        {
            "event": "started",
            "run_id": "r1",
            "pid": ours.pid,
            "pgid": ours.pid,
            "start": start,
            "boot": agent_procs._boot_time(),
            "uid": os.geteuid(),
        },
        {"event": "seen", "run_id": "r1", "seen_ticks": seen},
    )
    os.killpg(ours.pid, signal.SIGKILL)
    ours.wait()
    time.sleep(0.1)
    setsid_then_exit = [
        sys.executable,
        "-c",
        f"import os,subprocess; os.setsid(); subprocess.Popen(['bash', '-c', {TITLED!r}]); os._exit(0)",
    ]
    imposter = _take_pid(ours.pid, setsid_then_exit, new_session=False)
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
        found = agent_kill.find_runs(
            launched=[
                {
                    "pgid": ours.pid,
                    "start": start,
                    "boot": agent_procs._boot_time(),
                    "uid": os.geteuid(),
                    "run_id": "r1",
                    "seen_ticks": seen,
                }
            ]
        )
        assert found["runs"] == [] and any("may have been reused" in n for n in found["notes"]), found
    finally:
        for pid in session_procs(ours.pid):
            os.kill(pid, signal.SIGKILL)

    for proof in ("seen", "marker"):  # the leader killed alone: its rank is found by either proof
        run_id = f"r-{proof}"
        leader = subprocess.Popen(
            ["bash", "-c", f"bash -c {shlex.quote(TITLED)} & wait"],
            start_new_session=True,
            env=dict(os.environ, GPU_COCKPIT_RUN=run_id) if proof == "marker" else None,
        )
        deadline = time.monotonic() + 10
        while len(session_procs(leader.pid)) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        rank = next(p for p in session_procs(leader.pid) if p != leader.pid)
        recs = [
            {"event": "launch", "run_id": run_id, "host": "local", "argv": ["x"]},
            {
                "event": "started",
                "run_id": run_id,
                "pid": leader.pid,
                "pgid": leader.pid,
                "start": agent_procs._start_ticks(leader.pid),
                "boot": agent_procs._boot_time(),
                "uid": os.geteuid(),
            },
        ]
        if proof == "seen":
            recs.append({"event": "seen", "run_id": run_id, "seen_ticks": agent_kill._now_ticks()})
        _ledger(layout, tmp_path, *recs)
        time.sleep(0.05)
        leader.kill()
        leader.wait()
        try:
            res = run_cli(
                "kill",
                "local",
                "--sim",
                str(sim_state),
                "--layout",
                str(layout),
                "--yes",
                "--json",
                "--wait",
                "1",
                env={"XDG_STATE_HOME": str(tmp_path / "state")},
            )
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
        _ledger(
            layout,
            tmp_path,
            {"event": "launch", "run_id": "r1", "host": "local", "argv": ["x"]},
            {
                "event": "started",
                "run_id": "r1",
                "pid": proc.pid,
                "pgid": proc.pid,
                "start": agent_procs._start_ticks(proc.pid),
                "boot": agent_procs._boot_time(),
                "uid": os.geteuid(),
            },
            {"event": "ended", "run_id": "r1", "ended": time.time(), "how": "killed"},
        )
        res = run_cli(
            "kill",
            "local",
            "--sim",
            str(sim_state),
            "--layout",
            str(layout),
            "--yes",
            env={"XDG_STATE_HOME": str(tmp_path / "state")},
        )
        assert res.returncode == 2 and "nothing to kill" in res.stderr and proc.poll() is None, res.stderr
    finally:
        proc.kill()
        proc.wait()


def test_a_child_spawned_by_a_sigterm_handler_is_found_and_the_kill_not_verified(tmp_path):
    """The planned process's SIGTERM handler starts `sleep 600` and exits: the sleep, reparented,
    is born into the process group and session the planned process led. It is reported (not
    signalled: it was not confirmed) and the kill is not verified."""
    code = (
        "import signal, subprocess, sys, os, time\n"
        "def bye(*_):\n    subprocess.Popen(['sleep', '600'])\n    os._exit(0)\n"
        "signal.signal(signal.SIGTERM, bye)\nprint('ok', flush=True)\ntime.sleep(600)\n"
    )
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
    session = HostSession(
        parse_target("local"), SessionOptions(python=sys.executable, interval=0.5), WatchList(patterns=[])
    )
    await session.connect()
    try:
        procs = session_procs(theirs.pid)
        launched = await session.request("launch", argv=["sleep", "600"], log=str(tmp_path / "ours.log"))
        found = await actions.plan_kill(session, runmod.Scope(ports=[port], command=["-m", "cockpit.sim.server"]))
        assert found.entries and found.rule == f"owns port {port}"
        with pytest.raises(CockpitError, match="not the one this ablation launched.*nothing was killed"):
            refuse_unasked(found, launched)
        assert all_alive(procs)
        ours = await actions.plan_kill(
            session, runmod.Scope(launched=[{k: launched[k] for k in runmod.LAUNCHED_KEYS if k in launched}])
        )
        assert ours.rule.startswith("launched by this cockpit (ledger)")
        refuse_unasked(ours, launched)  # its own run: no question
        report = await actions.kill(session, ours, wait_s=1.0)
        assert report["verified"] and gone(launched["pid"]) and all_alive(procs)
    finally:
        await session.close()
        end_session(theirs)
