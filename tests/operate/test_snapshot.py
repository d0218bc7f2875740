"""`cockpit snapshot --json` end to end: the real agent over the local link and over a real sshd,
against real titled processes that hold simulated GPU memory."""

import json
import os
import signal
import sys

import pytest
from conftest import run_cli

from cockpit.host.session import HostSession, SessionOptions
from cockpit.link.target import parse_target


@pytest.fixture
def tp8(ranks):
    """A TP-8 tree: eight schedulers on GPUs 0-7 and a detokenizer."""
    procs = [ranks.spawn(f"sglang::scheduler_TP{i}", gpu=i, mib=1000 * (i + 1)) for i in range(8)]
    procs.append(ranks.spawn("sglang::detokenizer"))
    return procs


def snapshot(*args):
    res = run_cli("snapshot", *args, "--json", "--wait", "0")  # the shape, not the verdict: the instant look
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def check_tp8(doc, tp8):
    assert doc["schema"] == "gpu-cockpit.snapshot/1"
    assert doc["agent"]["nvml"] == "sim"
    assert [g["index"] for g in doc["gpus"]] == list(range(8))
    by_pid = {p["pid"]: p for p in doc["processes"]}
    for i, proc in enumerate(tp8[:8]):
        gpu = doc["gpus"][i]
        assert gpu["processes"] == [{"pid": proc.pid, "used_mib": 1000 * (i + 1)}]
        assert gpu["mem_used_mib"] == 512 + 1000 * (i + 1)
        assert gpu["mem_total_mib"] == 97887 and gpu["power_limit_w"] == 600.0
        row = by_pid[proc.pid]
        assert (row["role"], row["rank"], row["gpus"], row["gpu_mem_mib"]) == ("scheduler", i, [i], 1000 * (i + 1))
        assert row["status"] in ("S", "R") and row["alive"]
    assert by_pid[tp8[8].pid]["role"] == "detokenizer"
    assert by_pid[tp8[8].pid]["rank"] is None


def test_local_snapshot_shows_every_rank_on_its_gpu(tp8, sim_state):
    doc = snapshot("local", "--sim", str(sim_state))
    check_tp8(doc, tp8)
    assert doc["target"] == "local"


def test_ssh_snapshot_agrees_with_local(tp8, sim_state, sshd):
    local = snapshot("local", "--sim", str(sim_state))
    remote = snapshot("cockpit-test", "--sim", str(sim_state), "--python", sys.executable, *sshd.cli_args())
    check_tp8(remote, tp8)
    assert remote["target"] == "cockpit-test"
    for key in ("uuid", "name", "mem_total_mib", "mem_used_mib", "processes", "power_limit_w"):
        assert [g[key] for g in remote["gpus"]] == [g[key] for g in local["gpus"]], key
    ours = {p.pid for p in tp8}  # other processes on this machine may come and go between the two
    pick = lambda doc: sorted((p["pid"], p["role"], p["rank"], p["gpus"]) for p in doc["processes"] if p["pid"] in ours)
    assert pick(remote) == pick(local) and len(pick(local)) == 9
    assert remote["agent"]["hostname"] == local["agent"]["hostname"]


async def test_a_dead_rank_releases_its_memory_within_two_samples(tp8, sim_state):
    session = HostSession(
        parse_target("local"), SessionOptions(python=sys.executable, interval=0.3, sim_state=str(sim_state))
    )
    await session.connect()
    try:
        await session.wait_samples(2)
        assert session.state.gpus[3].mem_used_mib == 4512
        os.killpg(tp8[3].pid, signal.SIGKILL)
        tp8[3].wait()
        await session.wait_samples(2)
        assert session.state.gpus[3].mem_used_mib == 512
        assert session.state.gpus[3].processes == []
        dead = session.state.procs[tp8[3].pid]
        assert not dead.alive and dead.status == "X" and dead.rank == 3  # stays visible, marked
        rtt = await session.ping()
        assert rtt > 0
    finally:
        await session.close()


def test_no_gpus_is_said_not_crashed(ranks):
    doc = snapshot("local")
    assert doc["gpus"] == []
    assert doc["agent"]["nvml"] is None
    assert any("no GPU" in w or "no NVIDIA driver" in w for w in doc["agent"]["warnings"])


def test_missing_log_file_is_waited_for(tmp_path, sim_state):
    layout = tmp_path / "l.yaml"
    log = tmp_path / "later.log"
    layout.write_text(f"command: [-m, sglang.launch_server]\nlog: {log}\nports: [1]\nwatch: []\n")
    doc = snapshot("local", "--sim", str(sim_state), "--layout", str(layout))
    assert doc["log"] == {"path": str(log), "event": "missing", "lines": []}
    assert doc["ports"] == [{"port": 1, "listening": False, "pid": None}]


# ----------------------------------------------------------------------------- bad input


def fails(*args, expect: str):
    res = run_cli(*args)
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and expect in lines[0], res.stderr
    return lines[0]


def test_unknown_host_key_is_refused_with_its_fingerprint_then_accepted_on_request(sshd, tmp_path, sim_state):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    args = [
        "snapshot",
        "cockpit-test",
        "--json",
        "--python",
        sys.executable,
        "--sim",
        str(sim_state),
        "--ssh-config",
        str(sshd.client_config),
        "--known-hosts",
        str(empty),
    ]
    line = fails(*args, expect="unknown host key")
    assert "SHA256:" in line and "--accept-new" in line
    assert empty.read_text() == ""
    ok = run_cli(*args, "--accept-new")
    assert ok.returncode == 0, ok.stderr
    assert empty.read_text().split()[1:] == sshd.host_key_line.split()[1:]
    again = run_cli(*args)  # now known: no flag needed
    assert again.returncode == 0, again.stderr


def test_changed_host_key_is_refused_loudly_even_with_accept_new(sshd, tmp_path, sim_state):
    other = tmp_path / "other"
    import subprocess

    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    known = tmp_path / "known_hosts"
    alg, blob = (tmp_path / "other.pub").read_text().split()[:2]
    known.write_text(f"[127.0.0.1]:{sshd.port} {alg} {blob}\n")
    line = fails(
        "snapshot",
        "cockpit-test",
        "--json",
        "--python",
        sys.executable,
        "--accept-new",
        "--ssh-config",
        str(sshd.client_config),
        "--known-hosts",
        str(known),
        expect="HOST KEY CHANGED",
    )
    assert f"{known}:1" in line and f"ssh-keygen -f {known} -R" in line


def test_refused_auth_says_what_to_do(sshd, tmp_path):
    import subprocess

    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "stranger")], check=True)
    cfg = tmp_path / "ssh_config"
    cfg.write_text(sshd.client_config.read_text().replace(f"{sshd.root}/client_key", str(tmp_path / "stranger")))
    fails(
        "snapshot",
        "cockpit-test",
        "--json",
        "--ssh-config",
        str(cfg),
        "--known-hosts",
        str(sshd.known_hosts),
        expect="authentication refused",
    )


def test_missing_python_on_the_host(sshd):
    line = fails(
        "snapshot",
        "cockpit-test",
        "--json",
        "--python",
        "/opt/no/python3",
        *sshd.cli_args(),
        expect="not found on cockpit-test",
    )
    assert "--python" in line


def test_host_python_without_any_package_runs_the_agent_over_ssh(sshd, tmp_path, ranks):
    """A host Python that can import neither psutil nor pynvml, whatever this machine has
    installed (the system Python without its site packages, -S): nothing to install, processes
    from /proc."""
    bare = tmp_path / "python3"
    bare.write_text('#!/bin/sh\nexec /usr/bin/python3 -S "$@"\n')
    bare.chmod(0o755)
    rank = ranks.spawn("sglang::scheduler_TP0", gpu=-1, mib=0)
    doc = snapshot("cockpit-test", "--python", str(bare), *sshd.cli_args())
    assert (doc["agent"]["procs_source"], doc["agent"]["psutil"]) == ("proc", None)
    assert doc["agent"]["gpu_source"] in ("none", "nvidia-smi", "nvml-ctypes")
    assert rank.pid in [p["pid"] for p in doc["processes"]]


@pytest.mark.parametrize(
    "target, expect",
    [
        ("user@", "malformed target"),
        ("host:99999", "not in 1-65535"),
        ("no-such-host.invalid", "cannot resolve"),
    ],
)
def test_bad_targets(target, expect):
    fails("snapshot", target, "--json", expect=expect)


def test_unreachable_port():
    from conftest import free_port

    fails("snapshot", f"root@127.0.0.1:{free_port()}", "--json", expect="connection refused")


def test_a_local_snapshot_starts_its_agent_before_the_monitor_and_the_session_takes_that_one(monkeypatch, sim_state):
    """`snapshot local --json` starts the agent before asyncio and the monitor's modules load
    (cockpit/link/early.py); the local link then takes that very process over (the link starts
    none of its own), and the document is the same kind of document as ever."""
    import asyncio

    from cockpit.cli import parse_args
    from cockpit.cli.snapshot import _snapshot_doc, start_agent_early
    from cockpit.link import early, local

    spawned = []
    spawn = local._spawn

    async def counted(argv, payload, env=None):
        spawned.append(argv)
        return await spawn(argv, payload, env)

    monkeypatch.setattr(local, "_spawn", counted)
    args = parse_args(["snapshot", "local", "--sim", str(sim_state), "--json"])
    start_agent_early(args)
    assert len(early._started) == 1
    doc = asyncio.run(_snapshot_doc(args))
    assert spawned == [] and early._started == {}  # taken over, not started again
    assert doc["schema"].startswith("gpu-cockpit.snapshot/") and len(doc["gpus"]) == 8


def test_the_watch_is_current_only_after_a_sample_that_follows_the_agents_answer(sim_state, tmp_path):
    """A look is decided only on samples taken under the watch asked for: after a watch change
    (a log followed) `watch_current` is false until the agent answered it and sent a sample since
    (its tick reads the new log before that sample)."""
    import asyncio

    from cockpit.host.session import HostSession, SessionOptions, WatchList
    from cockpit.link.target import parse_target

    log = tmp_path / "server.log"
    log.write_text("[2026-12-02 10:00:00] The server is fired up and ready to roll!\n")

    async def go():
        session = HostSession(
            parse_target("local"),
            SessionOptions(python=sys.executable, interval=0.5, sim_state=str(sim_state)),
            WatchList(),
        )
        await session.connect()
        try:
            await session.wait_samples(1)
            assert session.watch_current()
            changed = asyncio.create_task(session.follow_log(str(log)))
            await asyncio.sleep(0)  # sent, not yet answered
            assert not session.watch_current()
            await changed  # answered: current from the next sample on
            await session.wait_samples(1)
            assert session.watch_current()
            assert any("ready to roll" in line.text for line in session.state.logs[str(log)].lines)
        finally:
            await session.close()

    asyncio.run(go())
