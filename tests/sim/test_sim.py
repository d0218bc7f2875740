"""The simulated inference host: each scenario started for real and observed through the agent."""

import asyncio
import os
import signal
import time

import pytest
from conftest import free_port
from simhost import SimRun, wait_for

from cockpit.read import metrics


def generated(body: str) -> float:
    """The generation-token counter of a metrics page, read as the cockpit reads it."""
    samples, bad = metrics.parse(body)
    value = metrics.family_value(samples, metrics.families()["generation_tokens"])
    assert value is not None and bad == 0, body
    return value


MIB_TOTAL = 97887


def ready(run):
    return "The server is fired up and ready to roll!" in run.log_text()


async def test_healthy_run_loads_opens_its_port_and_serves(sim_state, tmp_path):
    port = free_port()
    async with SimRun(
        sim_state, tmp_path, port, ["--mem-fraction-static", "0.85", "--sim-traffic", "2", "--enable-metrics"]
    ) as run:
        health = await run.http("/health")
        assert health["status"] in (None, 503)  # the port is closed while loading
        await wait_for(lambda: ready(run), 40, "the ready line", run.said)
        log = run.log_text()
        for phase in (
            "Load weight begin",
            "Loading safetensors checkpoint shards: 100% Completed | 64/64",
            "Load weight end",
            "KV Cache is allocated",
            "Capture cuda graph end",
            "Uvicorn running on",
        ):
            assert phase in log, phase
        assert (await run.http("/health"))["status"] == 200
        models = await run.http("/v1/models")
        assert models["status"] == 200 and "kimi" in models["body"]
        await run.session.wait_samples(2)
        st = run.session.state
        ranks = run.ranks()
        assert [(p.role, p.rank, p.gpus) for p in ranks] == [("scheduler", i, [i]) for i in range(8)]
        for p in ranks:
            assert abs(p.gpu_mem_mib - MIB_TOTAL * 0.85) < 600
        assert any(p.role == "detokenizer" for p in st.live_procs())
        launcher = st.procs[run.run["pid"]]
        assert launcher.role == "server" and all(p.ppid == launcher.pid for p in ranks)
        assert [p for p in st.ports if p.port == port and p.listening and p.pid == launcher.pid]
        first = generated((await run.http("/metrics"))["body"])
        deadline = time.monotonic() + 30
        while generated((await run.http("/metrics"))["body"]) <= first:  # the traffic is served: the counter moves
            assert time.monotonic() < deadline, "the generation-token counter never moved"
            await asyncio.sleep(0.2)
        assert max(g.util_pct for g in st.gpus.values()) > 50


async def test_eagle3_deadlocks_after_weight_load_with_the_port_closed(sim_state, tmp_path):
    port = free_port()
    async with SimRun(
        sim_state, tmp_path, port, ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/d"]
    ) as run:
        await wait_for(
            lambda: run.log_text().count("Capture draft cuda graph begin") == 8,
            40,
            "every rank's draft capture",
            run.said,
        )
        await wait_for(
            lambda: len(run.ranks()) == 8 and all(p.status == "S" and p.cpu_pct < 10 for p in run.ranks()),
            30,
            "every rank asleep in the draft's collective",
            lambda: run.ranks(),
        )
        lines_before = len(run.log_text())
        await run.session.wait_samples(3)  # three of the agent's intervals (its own clock): nothing more is said
        st = run.session.state
        assert all(p.status == "S" and p.cpu_pct < 10 for p in run.ranks())
        for g in st.gpus.values():
            assert g.util_pct == 0 and g.mem_used_mib > 0.8 * MIB_TOTAL
        assert not [p for p in st.ports if p.port == port and p.listening]
        assert (await run.http("/health"))["status"] is None
        assert len(run.log_text()) == lines_before  # the log is silent
        assert "ready to roll" not in run.log_text()


async def test_hang_rank_spins_while_the_others_wait_and_tokens_freeze(sim_state, tmp_path):
    port = free_port()
    async with SimRun(
        sim_state, tmp_path, port, ["--sim-hang-rank", "3", "--sim-traffic", "4", "--enable-metrics"]
    ) as run:
        await wait_for(lambda: ready(run), 40, "ready", run.said)
        st = run.session.state

        def spinning():
            r = {p.rank: p for p in run.ranks()}
            return len(r) == 8 and r[3].cpu_pct > 50 and all(r[i].cpu_pct < 30 for i in r if i != 3)

        await wait_for(spinning, 30, "rank 3 to spin alone")
        await wait_for(
            lambda: all(g.util_pct == (0 if i == 3 else 100) for i, g in st.gpus.items()),
            10,
            "the waiting ranks' GPUs pinned, the odd rank's idle",
        )
        for g in st.gpus.values():
            assert g.power_w < 0.2 * g.power_limit_w  # pinned utilization at idle power
        first = generated((await run.http("/metrics"))["body"])
        await asyncio.sleep(1.0)
        assert generated((await run.http("/metrics"))["body"]) == first
        assert (await run.http("/health"))["status"] == 200  # health alone proves nothing


async def test_crash_rank_dies_with_exit_minus_9_and_sglangs_message(sim_state, tmp_path):
    async with SimRun(sim_state, tmp_path, free_port(), ["--sim-crash-rank", "5"]) as run:
        await wait_for(lambda: "scheduler died" in run.log_text(), 40, "the crash line", run.said)
        assert "Rank 5 scheduler died during initialization (exit code: -9)" in run.log_text()
        assert "Received sigquit from a child process" in run.log_text()
        st = run.session.state
        await wait_for(lambda: not st.live_procs(), 10, "every process gone")
        await wait_for(lambda: st.procs[run.run["pid"]].exit_code == 1, 5, "the launcher's exit code")
        assert all(g.mem_used_mib == 512 for g in st.gpus.values())


async def test_leak_shm_leaves_entries_held_while_alive(sim_state, tmp_path):
    async with SimRun(sim_state, tmp_path, free_port(), ["--sim-leak-shm"]) as run:
        await wait_for(lambda: ready(run), 40, "ready", run.said)
        launcher = run.run["pid"]
        names = sorted(os.listdir(tmp_path))
        assert sum(n.startswith("nccl-") for n in names) == 8
        assert any(n.startswith("psm_") for n in names)
        assert f"sgl_shm_tokenizer_{launcher}_" in " ".join(names)
        rank0 = run.ranks()[0].pid
        maps = open(f"/proc/{rank0}/maps").read()
        assert str(tmp_path / "nccl-") in maps  # a live rank maps its segment
    await asyncio.sleep(0.5)
    assert sum(n.startswith("nccl-") for n in os.listdir(tmp_path)) == 8  # leaked after the kill


@pytest.mark.parametrize("orphans", [True, False])
async def test_workers_outlive_a_sigkilled_parent_only_as_orphans(sim_state, tmp_path, orphans):
    extra = ["--sim-orphans"] if orphans else []
    async with SimRun(sim_state, tmp_path, free_port(), extra) as run:
        await wait_for(lambda: ready(run), 40, "ready", run.said)
        rank_pids = [p.pid for p in run.ranks()]
        os.kill(run.run["pid"], signal.SIGKILL)
        st = run.session.state
        if not orphans:  # SGLang's ranks notice their parent is gone and exit
            await wait_for(lambda: not [pid for pid in rank_pids if st.procs[pid].alive], 15, "the ranks to exit")
        await asyncio.sleep(1.5)
        await run.session.wait_samples(2)
        alive = [pid for pid in rank_pids if st.procs[pid].alive]
        if orphans:
            assert alive == rank_pids
            assert all(st.procs[pid].ppid != run.run["pid"] for pid in rank_pids)  # reparented
            assert all(g.mem_used_mib > 0.5 * MIB_TOTAL for g in st.gpus.values())  # GPUs still held
        else:
            assert alive == []


async def test_vllm_shape_engine_core_owns_its_workers(sim_state, tmp_path):
    port = free_port()
    async with SimRun(sim_state, tmp_path, port, ["--engine", "vllm"]) as run:
        await wait_for(lambda: "Application startup complete" in run.log_text(), 40, "vLLM's startup line", run.said)
        await run.session.wait_samples(2)
        st = run.session.state
        engine = next(p for p in st.live_procs() if p.role == "engine")
        workers = run.ranks()
        assert engine.title == "VLLM::EngineCore" and engine.ppid == run.run["pid"]
        assert [(w.title, w.rank, w.ppid) for w in workers] == [
            (f"VLLM::Worker_TP{i}", i, engine.pid) for i in range(8)
        ]
        log = run.log_text()
        assert "(Worker_TP0 pid=" in log and "Model loading took" in log and "Starting vLLM API server" in log
        metrics = await run.http("/metrics")
        assert "vllm:generation_tokens_total" in metrics["body"]
