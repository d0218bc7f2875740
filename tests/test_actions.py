"""Operator actions against real processes, real files and real py-spy: kill then verify, shm audit
and clean, stack dumps grouped by rank. Locally and through the real sshd."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


from cockpit import actions, stacks
from conftest import free_port, run_cli
from simhost import SimRun, gone, wait_for


def ready(run):
    return "ready to roll" in run.log_text()


async def kill_everything(run, scope=None, wait_s=3.0):
    plan = await actions.plan_kill(run.session, scope or actions.run_scope(run.session))
    return plan, await actions.kill(run.session, plan, wait_s, [run.port])


async def test_kill_a_healthy_run_and_verify(sim_state, tmp_path):
    async with SimRun(sim_state, tmp_path, free_port(), ["--sim-traffic", "2"]) as run:
        await wait_for(lambda: ready(run), 40, "ready")
        await run.session.wait_samples(2)
        plan, report = await kill_everything(run)
        titles = " ".join(e["title"] for e in plan.entries)
        assert titles.count("sglang::scheduler_TP") == 8 and "sglang::detokenizer" in titles
        assert {e["pgid"] for e in plan.entries} == {run.run["pgid"]}
        assert report["verified"], report
        assert report["remaining"] == [] and report["ports_open"] == [] and report["gpu_memory_left"] == []
        assert all(g["mem_used_mib"] == 512 for g in report["gpus_after"])
        assert all(gone(e["pid"]) for e in plan.entries)


async def test_kill_orphans_of_a_sigkilled_parent_that_ignore_sigterm(sim_state, tmp_path):
    """vllm 55510 and the story's hang together: the launcher is gone, the ranks are reparented,
    stuck (they ignore SIGTERM) and still hold the GPUs. The run's process group finds them;
    SIGKILL ends them."""
    args = ["--sim-orphans", "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/d"]
    async with SimRun(sim_state, tmp_path, free_port(), args) as run:
        await wait_for(lambda: "Capture draft cuda graph begin" in run.log_text(), 40, "the deadlock")
        await asyncio.sleep(0.5)
        os.kill(run.run["pid"], signal.SIGKILL)
        await asyncio.sleep(1.0)
        await run.session.wait_samples(2)
        assert len(run.ranks()) == 8 and all(g.mem_used_mib > 50000 for g in run.session.state.gpus.values())
        plan, report = await kill_everything(run, wait_s=1.0)
        assert run.run["pid"] not in [e["pid"] for e in plan.entries]
        assert sum("scheduler_TP" in e["title"] for e in plan.entries) == 8
        assert len(report["killed"]) >= 8  # SIGTERM was ignored: SIGKILL did it
        assert report["verified"], report


async def test_k_kills_only_the_selected_process(sim_state, tmp_path):
    async with SimRun(sim_state, tmp_path, free_port(), []) as run:
        await wait_for(lambda: len(run.ranks()) == 8, 40, "8 ranks")
        victim = run.ranks()[5]
        plan, report = await kill_everything(run, actions.process_scope(victim.pid), wait_s=2.0)
        assert [e["pid"] for e in plan.entries] == [victim.pid]
        assert report["term"] == [victim.pid] and report["remaining"] == []
        await run.session.wait_samples(2)
        others = [p for p in run.session.state.procs.values() if p.rank is not None and p.pid != victim.pid]
        assert len(others) == 7


async def test_shm_clean_removes_only_what_is_safe(sim_state, tmp_path):
    shm = tmp_path
    victim = tmp_path.parent / "victim-file"
    victim.write_text("precious")
    async with SimRun(sim_state, shm, free_port(), ["--sim-leak-shm"]) as run:
        await wait_for(lambda: ready(run), 40, "ready")
        os.symlink(victim, shm / "evil-link")
        (shm / "a-dir").mkdir()
        audit = await actions.shm_audit(run.session, str(shm))
        by = {e["name"]: e for e in audit["entries"]}
        nccl = [n for n in by if n.startswith("nccl-")]
        assert len(nccl) == 8 and all(by[n]["held_by"] and not by[n]["removable"] for n in nccl)
        tok = next(n for n in by if n.startswith("sgl_shm_tokenizer_"))
        assert by[tok]["creator"] == run.run["pid"] and by[tok]["creator_alive"] and not by[tok]["removable"]
        psm = next(n for n in by if n.startswith("psm_"))
        assert by[psm]["removable"]
        assert by["evil-link"]["kind"] == "symlink" and not by["evil-link"]["removable"]
        names = list(by) + ["../victim-file", "/etc/passwd", "."]
        refused = await asyncio.gather(actions.shm_clean(run.session, names, str(shm)), return_exceptions=True)
        assert "is not /dev/shm" in str(refused[0]) and (shm / psm).exists()  # another folder: only when confirmed
        done = await actions.shm_clean(run.session, names, str(shm), other_dir=True)
        assert done["removed"] == [psm]
        kept = {s["name"]: s["why"] for s in done["skipped"]}
        assert "held by pid" in kept[nccl[0]] and "alive" in kept[tok] and "symlink" in kept["evil-link"]
        assert "not an entry" in kept["../victim-file"] and "not an entry" in kept["/etc/passwd"]
        assert victim.read_text() == "precious" and (shm / "evil-link").is_symlink()
        await kill_everything(run)
        await asyncio.sleep(0.5)
        after = await actions.shm_audit(run.session, str(shm))
        left = [e["name"] for e in after["entries"] if e["removable"]]
        assert len(left) == 9  # the 8 nccl segments and the tokenizer's, their holders and creator dead
        done = await actions.shm_clean(run.session, left, str(shm), other_dir=True)
        assert sorted(done["removed"]) == sorted(left)
    assert victim.read_text() == "precious"


def test_shm_in_the_real_dev_shm_with_our_own_names(tmp_path):
    tag = f"psm_gpu-cockpit-test-{os.getpid()}"  # an inference run's name (psm_): a clean may remove it
    held, free = Path(f"/dev/shm/{tag}-held"), Path(f"/dev/shm/{tag}-free")
    free.write_bytes(b"x" * 8192)
    holder = subprocess.Popen([sys.executable, "-c", f"import time;f=open('{held}','wb');f.write(b'y'*4096);f.flush();"
                               "print('ok',flush=True);time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ok"
        res = run_cli("shm", "local", "--json")
        assert res.returncode == 0, res.stderr
        by = {e["name"]: e for e in json.loads(res.stdout)["audit"]["entries"]}
        assert by[held.name]["held_by"] == [holder.pid] and not by[held.name]["removable"]
        assert by[free.name]["removable"] and by[free.name]["bytes"] >= 8192
        from cockpit.agent import agent
        done = agent.shm_clean("/dev/shm", [held.name, free.name])
        assert done["removed"] == [free.name] and held.exists() and not free.exists()
        assert done["freed_bytes"] >= 8192
    finally:
        holder.kill()
        held.unlink(missing_ok=True)
        free.unlink(missing_ok=True)


async def test_dump_groups_every_rank_and_names_the_odd_one(sim_state, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    async with SimRun(sim_state, tmp_path, free_port(), ["--sim-hang-rank", "3", "--sim-traffic", "4"]) as run:
        await wait_for(lambda: ready(run), 40, "ready")
        await wait_for(lambda: any(p.rank == 3 and p.cpu_pct > 50 for p in run.ranks()), 30, "rank 3 spinning")
        ranks = actions.rank_pids(run.session.state)
        assert [r for r, _ in ranks] == list(range(8))
        result = await stacks.dump_ranks(run.session, ranks, "test-run")
        assert result.failed == {}
        assert [g.ranks for g in result.groups] == [[0, 1, 2, 4, 5, 6, 7], [3]]
        major, odd = result.groups
        assert not major.odd and odd.odd
        assert any("Rank.all_reduce" in f for f in major.frames)
        assert any("Rank.sample_tokens" in f for f in odd.frames)
        assert any(d.startswith("+Rank.sample_tokens") for d in odd.diff)
        text = "\n".join(stacks.describe_groups(result.groups))
        assert "ranks 0-2,4-7 (7)" in text and "ODD ONE OUT: rank 3" in text
        files = sorted(p.name for p in result.folder.iterdir())
        assert files == ["groups.txt"] + sorted(f"rank{r}-pid{pid}.txt" for r, pid in ranks)
        assert all(oct(p.stat().st_mode & 0o777) == "0o600" for p in result.folder.iterdir())
        assert "Thread" in (result.folder / f"rank3-pid{ranks[3][1]}.txt").read_text()


def test_rank_ranges_and_signature_grouping():
    assert stacks.rank_ranges([0, 1, 2, 4, 5, 6, 7]) == "0-2,4-7"
    assert stacks.rank_ranges([3]) == "3" and stacks.rank_ranges([1, 3, 5]) == "1,3,5"
    a = 'Thread 10 (idle): "MainThread"\n    wait (threading.py:320)\n    all_reduce (x.py:10)\n'
    b = 'Thread 11 (idle): "MainThread"\n    wait (threading.py:331)\n    all_reduce (x.py:10)\n'
    c = 'Thread 12 (active): "MainThread"\n    spin (x.py:99)\n'
    groups = stacks.group_stacks({0: a, 1: b, 2: c})
    assert [g.ranks for g in groups] == [[0, 1], [2]]  # line numbers do not split a group
    assert groups[1].odd and not groups[0].odd


def test_kill_asks_and_read_only_refuses(sim_state):
    res = run_cli("kill", "local", "--sim", str(sim_state), "--read-only")
    assert res.returncode == 2 and "read-only" in res.stderr


def start_server_by_hand(sim_state, tmp_path, tp: int) -> tuple[subprocess.Popen, int]:
    """A simulated server started outside the cockpit, as an operator would, and ready."""
    port = free_port()
    log = tmp_path / "run.log"
    proc = subprocess.Popen([sys.executable, "-m", "cockpit.sim.server", "--tp-size", str(tp), "--port", str(port),
                             "--sim-speed", "4"], stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            env=dict(os.environ, COCKPIT_SIM_STATE=str(sim_state)), start_new_session=True)
    deadline = time.monotonic() + 40
    while "ready to roll" not in log.read_text():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.2)
    return proc, port


def test_cli_kill_over_ssh_finds_the_run_by_the_port_it_owns(sim_state, tmp_path, sshd):
    proc, port = start_server_by_hand(sim_state, tmp_path, 4)
    try:
        layout = tmp_path / "l.yaml"
        layout.write_text(f"command: [-m, cockpit.sim.server]\nwatch: ['*--port {port}*']\nports: [{port}]\n"
                          f"kill_wait_s: 3\n")
        common = ["cockpit-test", "--python", sys.executable, "--sim", str(sim_state), "--layout", str(layout),
                  *sshd.cli_args()]
        no = run_cli("kill", *common)
        assert no.returncode == 2 and "--yes" in no.stderr and proc.poll() is None
        res = run_cli("kill", *common, "--yes", "--json")
        assert res.returncode == 0, res.stderr
        report = json.loads(res.stdout[res.stdout.index("{"):])
        assert report["verified"] and len(report["term"]) + len(report["vanished"]) >= 6  # launcher, 4 ranks, detok., tracker
        assert "the run: owns port" in res.stdout  # the rule that found it, printed with the plan under --yes
        assert proc.wait(5) is not None
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_dump_over_ssh_uploads_pyspy_when_the_host_has_none(sim_state, tmp_path, sshd):
    """The ssh session's PATH has no py-spy (it lives in this venv): --upload-pyspy sends ours."""
    uploaded = Path(os.path.expanduser("~")) / ".cache" / "gpu-cockpit" / "py-spy"
    existed = uploaded.exists()
    proc, port = start_server_by_hand(sim_state, tmp_path, 2)
    try:
        layout = tmp_path / "l.yaml"
        layout.write_text(f"command: [-m, cockpit.sim.server]\nwatch: ['*--port {port}*']\n")
        common = ["cockpit-test", "--python", sys.executable, "--sim", str(sim_state), "--layout", str(layout),
                  *sshd.cli_args()]
        env = {"XDG_STATE_HOME": str(tmp_path / "state")}
        if not existed:
            missing = run_cli("dump", *common, env=env)
            assert missing.returncode == 2 and "--upload-pyspy" in missing.stderr
        res = run_cli("dump", *common, "--upload-pyspy", "--json", env=env)
        assert res.returncode == 0, res.stderr
        doc = json.loads(res.stdout)
        assert uploaded.exists() and doc["failed"] == {}
        assert sorted(r for g in doc["groups"] for r in g["ranks"]) == [0, 1]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        if not existed:
            uploaded.unlink(missing_ok=True)
