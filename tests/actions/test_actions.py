"""Operator actions against real processes, real files and real py-spy: kill then verify, shm audit
and clean, stack dumps grouped by rank. Locally and through the real sshd."""

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import free_port, run_cli
from simhost import SimRun, gone, kill_groups, wait_for

from cockpit.actions import dumps, kill as actions
from cockpit.read import findings, stacks
from cockpit.runs import run as runmod
from cockpit.runs.run import Run


def ready(run):
    return "ready to roll" in run.log_text()


async def kill_everything(run, scope=None, wait_s=3.0):
    plan = await actions.plan_kill(run.session, scope or Run().scope(run.session.watch))
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
        plan, report = await kill_everything(run, runmod.process_scope(victim.pid), wait_s=2.0)
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
        (shm / "psm_gone-since").write_text("x")
        names = list(by) + ["../victim-file", "/etc/passwd", ".", "psm_gone-since"]
        (shm / "psm_gone-since").unlink()  # listed, then gone before the clean
        refused = await asyncio.gather(actions.shm_clean(run.session, names, str(shm)), return_exceptions=True)
        assert "is not /dev/shm" in str(refused[0]) and (shm / psm).exists()  # another folder: only when confirmed
        done = await actions.shm_clean(run.session, names, str(shm), other_dir=True)
        assert done["removed"] == [psm]
        kept = {s["name"]: s["why"] for s in done["skipped"]}
        assert "held by pid" in kept[nccl[0]] and "alive" in kept[tok] and "symlink" in kept["evil-link"]
        assert "not an entry" in kept["../victim-file"] and "not an entry" in kept["/etc/passwd"]
        assert kept["psm_gone-since"] == "gone since it was listed"
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
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import time;f=open('{held}','wb');f.write(b'y'*4096);f.flush();print('ok',flush=True);time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "ok"
        res = run_cli("shm", "local", "--json")
        assert res.returncode == 0, res.stderr
        by = {e["name"]: e for e in json.loads(res.stdout)["audit"]["entries"]}
        assert by[held.name]["held_by"] == [holder.pid] and not by[held.name]["removable"]
        assert by[free.name]["removable"] and by[free.name]["bytes"] >= 8192
        from cockpit.agent import shm as agent_shm

        done = agent_shm.shm_clean("/dev/shm", [held.name, free.name])
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
        result = await dumps.dump_ranks(run.session, ranks, "test-run")
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
    assert findings.rank_ranges([0, 1, 2, 4, 5, 6, 7]) == "0-2,4-7"
    assert findings.rank_ranges([3]) == "3" and findings.rank_ranges([1, 3, 5]) == "1,3,5"
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
    proc = subprocess.Popen(
        [sys.executable, "-m", "cockpit.sim.server", "--tp-size", str(tp), "--port", str(port), "--sim-speed", "4"],
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
        env=dict(os.environ, COCKPIT_SIM_STATE=str(sim_state)),
        start_new_session=True,
    )
    deadline = time.monotonic() + 40
    while "ready to roll" not in log.read_text():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.2)
    return proc, port


def test_cli_kill_over_ssh_finds_the_run_by_the_port_it_owns(sim_state, tmp_path, sshd):
    proc, port = start_server_by_hand(sim_state, tmp_path, 4)
    try:
        layout = tmp_path / "l.yaml"
        layout.write_text(
            f"command: [-m, cockpit.sim.server]\nwatch: ['*--port {port}*']\nports: [{port}]\nkill_wait_s: 3\n"
        )
        common = [
            "cockpit-test",
            "--python",
            sys.executable,
            "--sim",
            str(sim_state),
            "--layout",
            str(layout),
            *sshd.cli_args(),
        ]
        no = run_cli("kill", *common)
        assert no.returncode == 1 and "--yes" in no.stderr and proc.poll() is None  # no answer: declined
        res = run_cli("kill", *common, "--yes", "--json")
        assert res.returncode == 0, res.stderr
        report = json.loads(res.stdout)  # stdout is the one JSON document
        assert (
            report["verified"] and len(report["term"]) + len(report["vanished"]) >= 6
        )  # launcher, 4 ranks, detok., tracker
        assert "the run: owns port" in res.stderr  # the rule that found it, printed with the plan under --yes
        assert proc.wait(5) is not None
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def bare_interpreter(tmp_path) -> str:
    """This Python by another path, in a folder with no py-spy beside it (the venv's is not)."""
    folder = tmp_path / "bare" / "bin"
    folder.mkdir(parents=True)
    (folder / "python3").symlink_to(sys.executable)
    return str(folder / "python3")


def test_dump_over_ssh_finds_the_pyspy_beside_the_layouts_interpreter(sim_state, tmp_path, sshd):
    """The ssh session's PATH has no py-spy; the layout's interpreter's own bin (this venv's) has:
    that one is used, nothing uploaded."""
    proc, port = start_server_by_hand(sim_state, tmp_path, 2)
    try:
        layout = tmp_path / "l.yaml"
        layout.write_text(
            f"command: [-m, cockpit.sim.server]\npython: {sys.executable}\nports: [{port}]\n"
            f"watch: ['*--port {port}*']\n"
        )
        res = run_cli(
            "dump",
            "cockpit-test",
            "--python",
            bare_interpreter(tmp_path),
            "--sim",
            str(sim_state),
            "--layout",
            str(layout),
            *sshd.cli_args(),
            "--json",
            env={"XDG_STATE_HOME": str(tmp_path / "state")},
        )
        assert res.returncode == 0, res.stderr
        doc = json.loads(res.stdout)
        assert doc["pyspy"] == str(Path(sys.executable).parent / "py-spy") and "uploading" not in res.stderr
        assert sorted(r for g in doc["groups"] for r in g["ranks"]) == [0, 1] and doc["failed"] == {}
    finally:
        os.killpg(proc.pid, signal.SIGKILL)


def test_dump_over_ssh_uploads_pyspy_when_the_host_has_none(sim_state, tmp_path, sshd):
    """Neither the interpreter's bin nor the ssh session's PATH has py-spy: the refusal says where
    it looked; --upload-pyspy sends ours."""
    uploaded = sshd.home / ".cache" / "gpu-cockpit" / "py-spy"
    existed = uploaded.exists()
    proc, port = start_server_by_hand(sim_state, tmp_path, 2)
    python = bare_interpreter(tmp_path)
    try:
        layout = tmp_path / "l.yaml"
        # the run is found as the kill finds it (its port): another sim server on this host is not dumped
        layout.write_text(f"command: [-m, cockpit.sim.server]\nports: [{port}]\nwatch: ['*--port {port}*']\n")
        common = [
            "cockpit-test",
            "--python",
            python,
            "--sim",
            str(sim_state),
            "--layout",
            str(layout),
            *sshd.cli_args(),
        ]
        env = {"XDG_STATE_HOME": str(tmp_path / "state")}
        if not existed:
            missing = run_cli("dump", *common, env=env)
            assert missing.returncode == 2 and "--upload-pyspy" in missing.stderr
            assert f"looked for: {Path(python).parent}/py-spy; PATH (" in missing.stderr
            assert f"; {uploaded})" in missing.stderr
        res = run_cli("dump", *common, "--upload-pyspy", "--json", env=env)
        assert res.returncode == 0, res.stderr
        doc = json.loads(res.stdout)
        assert uploaded.exists() and doc["failed"] == {} and doc["dead"] == []
        ours = dumps.pyspy_info(dumps.local_pyspy())
        said = (
            f"uploading py-spy {ours['version']} ({ours['path']}, {ours['size']} bytes, sha256 {ours['sha256']}) "
            f"to cockpit-test:{sshd.home}/.cache/gpu-cockpit/py-spy"
        )
        assert said in res.stderr.splitlines()  # said before it is sent
        assert doc["pyspy"] == str(uploaded) and doc["pyspy_version"] == ours["version"]
        again = run_cli("dump", *common, "--full", env=env)  # the uploaded one is found again, every frame shown
        assert again.returncode == 0, again.stderr
        assert "uploading" not in again.stderr and "every frame of rank 0, innermost first" in again.stdout
        assert sorted(r for g in doc["groups"] for r in g["ranks"]) == [0, 1]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        if not existed:
            uploaded.unlink(missing_ok=True)


# ----------------------------------------------------------------------------- stack dumps: native, dead ranks

PYSPY_DATA = Path(__file__).parents[1] / "data" / "pyspy"


def recorded(name: str) -> str:
    return (PYSPY_DATA / name).read_text()


def test_dump_parser_folds_the_native_tail_of_recorded_pyspy_output():
    """Real `py-spy dump --native` output: SGLang's scheduler on Ascend (from an SGLang issue) and
    the simulated ranks (recorded here). Python frames are told from native ones by their file."""
    threads = stacks.parse_dump(recorded("sglang-30453-tp0-native.txt"))
    assert [t.name for t in threads] == [
        "MainThread",
        "Thread-1 (_read_thread)",
        "Thread-2",
        "Thread-3 (_watchdog_thread)",
    ]
    main = stacks.main_thread(threads)
    assert main.tid == "163685" and main.state == "idle" and len(main.frames) == 42
    assert len(main.python) == 16 and len(main.native_tail) == 25
    assert str(main.python[0]) == "decorated (torch_npu/contrib/transfer_to_npu.py:182)"
    assert str(main.python[-1]) == "<module> (<string>:1)"
    assert main.native_tail[-1].name == "torch::autograd::THPVariable_to"  # where Python called in
    assert stacks.fold_native(main.native_tail) == "c10_npu::NPUStream::stream <- libc (25 frames)"
    templated = next(f.name for f in main.frames if f.name.startswith("c10::impl::wrap_kernel_functor_unboxed_"))
    assert len(templated) > 900 and stacks.short_symbol(templated) == "c10::impl::wrap_kernel_functor_unboxed_<>::call"
    watchdog = threads[3]
    assert stacks.fold_native(watchdog.native_tail) == "time_sleep <- libc (2 frames)"
    assert [f.name for f in watchdog.python] == [
        "_watchdog_once",
        "_watchdog_thread",
        "run",
        "_bootstrap_inner",
        "_bootstrap",
    ]

    sim = stacks.main_thread(stacks.parse_dump(recorded("sim-run-a-tp0.txt")))
    tail = sim.native_tail
    assert [str(f) for f in tail[2:]] == [
        "_multiprocessing_SemLock_acquire_impl (semaphore.c:357)",
        "_multiprocessing_SemLock_acquire (semaphore.c.h:127)",
    ]
    assert all(f.native for f in tail) and tail[0].address  # C source with debug lines is native too
    assert stacks.fold_native(tail) == "_multiprocessing_SemLock_acquire_impl <- libc (4 frames)"
    assert sim.frames[-1].native and sim.frames[-1].name.startswith("0x")  # the libc frame under <module>
    spinning = stacks.main_thread(stacks.parse_dump(recorded("sim-run-a-tp1.txt")))
    assert spinning.state == "active+gil" and spinning.native_tail == []  # on the CPU in Python: nothing to fold
    assert (
        stacks.library("libcuda.so.595.71.05") == "libcuda"
        and stacks.library("libpython3.11.so.1.0") == "libpython3.11"
    )


def test_dump_folds_a_real_cuda_wait_recorded_on_h200s():
    """The project's own H200 run: rank 0 waits in cudaDeviceSynchronize (8 anonymous libcuda
    frames under it), rank 1 sleeps in Python. Two ranks, no majority: neither is called odd."""
    r0, r1 = recorded("h200-tp0-cuda-native.txt"), recorded("h200-tp1-cuda-native.txt")
    main = stacks.main_thread(stacks.parse_dump(r0))
    assert sum(f.address for f in main.native_tail) == 9 and len(main.native_tail) == 13
    assert stacks.fold_native(main.native_tail) == "cudaDeviceSynchronize <- libcuda (13 frames)"
    groups = stacks.group_stacks({0: r0, 1: r1})
    assert [g.ranks for g in groups] == [[0], [1]] and not any(g.odd for g in groups)
    lines = stacks.describe_groups(groups)
    assert lines[:3] == [
        "rank 0 (1), main thread (active), Python frames innermost first:",
        "    synchronize (torch/cuda/__init__.py:1162)",
        "    decode_loop (tp_job.py:41)",
    ]
    assert "  native: cudaDeviceSynchronize <- libcuda (13 frames)" in lines
    assert "  native: clock_nanosleep (libc, 1 frame)" in lines
    assert not any("libcuda.so.580" in line for line in lines)
    assert "    cuCtxSynchronize_v2 (libcuda.so.580.159.04)" in stacks.describe_groups(groups, full=True)


def test_dump_groups_ranks_by_python_frames_whatever_their_native_addresses():
    """Ranks 0 and 2 are two processes in the same wait: their native frames differ in every
    address, so they group by Python frames; rank 1 spins elsewhere and is the odd one out."""
    a0, a1, b0 = recorded("sim-run-a-tp0.txt"), recorded("sim-run-a-tp1.txt"), recorded("sim-run-b-tp0.txt")
    assert "0x7fb70d8a3f16 (libc.so.6)" in a0 and "0x7fb70d8a3f16" not in b0
    groups = stacks.group_stacks({0: a0, 1: a1, 2: b0})
    assert [g.ranks for g in groups] == [[0, 2], [1]]
    assert groups[1].odd and any(d.startswith("+Rank.sample_tokens") for d in groups[1].diff)
    text = stacks.describe_groups(groups)
    head = text.index("ranks 0,2 (2), main thread (idle), Python frames innermost first:")
    assert text[head + 1] == "    Condition.wait (multiprocessing/synchronize.py:268)"  # Python frames first
    assert "  native: _multiprocessing_SemLock_acquire_impl <- libc (4 frames)" in text
    assert not any("0x7f" in line for line in text)  # addresses only in the full view
    assert "ODD ONE OUT: rank 1 (1), main thread (active+gil), Python frames innermost first:" in text
    full = stacks.describe_groups(groups, full=True)
    assert "  every frame of rank 0, innermost first (> a Python frame):" in full
    assert "    0x7fb70d8a3f16 (libc.so.6)" in full and "    > Rank.all_reduce (cockpit/sim/server.py:227)" in full

    # the same Python frames, different native waits: one group, a folded line per wait
    py = "    wait (threading.py:320)\n    all_reduce (x.py:10)\n"
    futex = 'Thread 1 (idle): "MainThread"\n    0x7f00000001 (libc.so.6)\n    pthread_cond_wait (libc.so.6)\n' + py
    futex2 = 'Thread 2 (idle): "MainThread"\n    0x7f00000777 (libc.so.6)\n    pthread_cond_wait (libc.so.6)\n' + py
    cuda = (
        'Thread 3 (idle): "MainThread"\n    0x7f00000002 (libcuda.so.580.126.20)\n'
        "    cuStreamSynchronize (libcuda.so.580.126.20)\n    cudaStreamSynchronize (libcudart.so.12)\n" + py
    )
    groups = stacks.group_stacks({0: futex, 1: cuda, 2: futex2})
    assert [g.ranks for g in groups] == [[0, 1, 2]]
    assert groups[0].natives() == [
        ("pthread_cond_wait (libc, 2 frames)", [0, 2]),
        ("cudaStreamSynchronize <- libcuda (3 frames)", [1]),
    ]
    lines = stacks.describe_groups(groups)
    assert "  native: pthread_cond_wait (libc, 2 frames) [ranks 0,2]" in lines
    assert "  native: cudaStreamSynchronize <- libcuda (3 frames) [rank 1]" in lines


def test_dump_targets_keep_dead_ranks_and_describe_them():
    from cockpit.host.state import HostState, Proc

    state = HostState()
    rows = [
        Proc(pid=10, rank=0),
        Proc(pid=11, rank=1, status="Z"),
        Proc(pid=12, rank=2, alive=False, status="X", exit_code=-6, gone_at=5.0),
        Proc(pid=13, rank=3, alive=False, status="X", gone_at=1.0),
        Proc(pid=14, rank=3),
        Proc(pid=15, rank=None),
    ]
    state.procs = {p.pid: p for p in rows}
    assert dumps.dump_targets(state) == [(0, 10), (1, 11), (2, 12), (3, 14)]  # rank 3's live process wins
    assert dumps.DeadRank(2, 12, "gone", -6).describe() == "rank 2: dead (exit code -6, SIGABRT), no stack"
    assert (
        dumps.DeadRank(1, 11, "Z", 1).describe()
        == "rank 1: dead (exit code 1; a zombie its parent has not reaped), no stack"
    )
    assert dumps.DeadRank(4, 16, "gone").describe() == "rank 4: dead (exit code unknown), no stack"
    assert (
        dumps.DeadRank(None, 17, "gone", -9, during=True).describe()
        == "pid 17: died during the dump (exit code -9, SIGKILL), no stack"
    )


def test_dump_agent_answers_zombie_and_gone_pids_as_dead_without_running_pyspy(tmp_path):
    """A child that exited and was not reaped (a real zombie), a pid that is gone, and a process
    that dies while py-spy reads it: dead, with the kernel's exit code, never a py-spy error."""
    from cockpit.agent import pyspy as agent_pyspy

    calls = tmp_path / "calls"
    fake = tmp_path / "py-spy"  # records each call; kills its target, then fails the way py-spy does on the dead
    fake.write_text(
        f"#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'py-spy 9.9.9'; exit 0; fi\n"
        f'echo "$*" >> {calls}\nkill -9 "$3"; sleep 0.2\n'
        "echo 'Error: Failed to get process executable name. Check that the process is running.' >&2\n"
        "exit 1\n"
    )
    fake.chmod(0o755)
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    zombie, reaped, dying = (subprocess.Popen(sleeper) for _ in range(3))
    try:
        zombie.send_signal(signal.SIGTERM)
        time.sleep(0.5)  # not waited for: it stays a zombie of this process
        assert agent_pyspy.pyspy_target(zombie.pid) == {"status": "Z", "exit_code": -15}
        reaped.kill()
        reaped.wait()
        assert agent_pyspy.pyspy_target(reaped.pid) == {"status": "gone", "exit_code": None}
        assert agent_pyspy.pyspy_target(dying.pid) is None
        out = agent_pyspy.pyspy_dump([zombie.pid, reaped.pid, dying.pid], str(fake), deadline_s=10)
        d = out["dumps"]
        assert out["check"]["pyspy"] == str(fake) and out["check"]["version"] == "9.9.9"
        assert {k: (v["ok"], v["dead"], v["status"], v["exit_code"]) for k, v in d.items()} == {
            str(zombie.pid): (False, True, "Z", -15),
            str(reaped.pid): (False, True, "gone", None),
            str(dying.pid): (False, True, "Z", -9),
        }
        assert d[str(zombie.pid)]["errors"] == [] and d[str(reaped.pid)]["errors"] == []
        said = "Error: Failed to get process executable name. Check that the process is running."
        assert d[str(dying.pid)]["errors"] == [said]
        assert calls.read_text().split("\n")[:-1] == [f"dump --pid {dying.pid} --native"]  # only the live one
    finally:
        for p in (zombie, reaped, dying):
            p.kill()
            p.wait()


RUN_WITH_RANKS = """
import os, sys, time, setproctitle
def hold_the_line():
    while True:
        time.sleep(0.2)
for rank in (0, 1):
    if os.fork() == 0:
        setproctitle.setproctitle("sglang::scheduler_TP%d" % rank)
        hold_the_line()
while True:
    time.sleep(1)  # never waits for its children: a rank that dies stays a zombie
"""

LONE_RANK = "import time, setproctitle; setproctitle.setproctitle('sglang::scheduler_TP2'); time.sleep(600)"


async def test_dump_says_a_zombie_and_a_gone_rank_are_dead_and_uses_the_cockpits_own_pyspy(
    sim_state, tmp_path, monkeypatch
):
    """Real ranks: 0 lives (dumped by real py-spy), 1 is killed and left a zombie by its parent,
    2 is killed and reaped (the agent launched it, so its exit code is known). A py-spy first on
    PATH is not the one used on local: the cockpit's own is."""
    from cockpit.host.session import HostSession, SessionOptions, WatchList
    from cockpit.link.target import parse_target

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    decoy = tmp_path / "bin" / "py-spy"
    decoy.parent.mkdir()
    decoy.write_text(f"#!/bin/sh\ntouch {tmp_path}/decoy-ran\nexit 1\n")
    decoy.chmod(0o755)
    monkeypatch.setenv("PATH", f"{decoy.parent}:{os.environ['PATH']}")
    session = HostSession(
        parse_target("local"),
        SessionOptions(python=sys.executable, interval=0.25, sim_state=str(sim_state)),
        WatchList(patterns=[]),
    )
    await session.connect()
    runs = []
    try:
        for code in (RUN_WITH_RANKS, LONE_RANK):
            runs.append(await session.request("launch", argv=[sys.executable, "-c", code], log=str(tmp_path / "log")))
        state = session.state

        def rank(n):
            return next((p for p in state.ranks() if p.rank == n), None)

        await wait_for(lambda: all(rank(n) and rank(n).status in "RS" for n in range(3)), 30, "three ranks")
        pids = [rank(n).pid for n in range(3)]
        os.kill(pids[1], signal.SIGKILL)
        os.kill(pids[2], signal.SIGTERM)
        await wait_for(lambda: state.procs[pids[1]].status == "Z", 15, "rank 1 a zombie")
        await wait_for(
            lambda: not state.procs[pids[2]].alive and state.procs[pids[2]].exit_code == -15,
            15,
            "rank 2 gone, its exit code known",
        )
        targets = dumps.dump_targets(state)
        assert targets == [(0, pids[0]), (1, pids[1]), (2, pids[2])]
        result = await dumps.dump_ranks(session, targets, "dead-ranks")

        assert result.failed == {}
        assert [g.ranks for g in result.groups] == [[0]]
        assert any("hold_the_line" in f for f in result.groups[0].frames)
        assert [fold for fold, _ in result.groups[0].natives()] == ["time_sleep <- libc (2 frames)"]
        report = result.report()
        assert report[-2:] == [
            "rank 1: dead (exit code -9, SIGKILL; a zombie its parent has not reaped), no stack",
            "rank 2: dead (exit code -15, SIGTERM), no stack",
        ]
        assert not any("py-spy" in line or "Error" in line for line in report)
        doc = result.as_json()
        assert doc["dead"] == [
            {"rank": 1, "pid": pids[1], "status": "Z", "exit_code": -9},
            {"rank": 2, "pid": pids[2], "status": "gone", "exit_code": -15},
        ]
        assert doc["failed"] == {} and [g["ranks"] for g in doc["groups"]] == [[0]]
        assert (result.folder / f"rank1-pid{pids[1]}.txt").read_text().startswith("rank 1: dead (exit code -9")
        assert "hold_the_line" in (result.folder / f"rank0-pid{pids[0]}.txt").read_text()
        assert result.pyspy == dumps.local_pyspy() and result.pyspy != str(decoy)
        assert Path(result.pyspy).parent == Path(sys.executable).parent  # the venv's own
        assert result.check["pyspy"] == result.pyspy and re.match(r"\d+\.\d+", result.check["version"])
        assert not (tmp_path / "decoy-ran").exists()
    finally:
        kill_groups(run["pgid"] for run in runs)
        await session.close()
