"""The GPU's own word (issue 28), each case driven through the simulated NVML with real processes:
the sim server's scenarios write what the driver would say; the real agent hears it (the event set,
GPU_IS_LOST, the slow clock's health fields); the verdict, the GPU pane, the fleet row's alerts and
the JSON snapshot (replayed) all say it."""

import asyncio

from conftest import free_port
from simhost import SimRun, wait_for

from cockpit.host.snapshot import gpu_health_doc, snapshot_doc, state_from_doc
from cockpit.judge.diagnose import Watchdog
from cockpit.monitor.fleet import alerts_of
from cockpit.ui.app import CockpitApp
from cockpit.ui.headless import render


def judge(run, dog):
    return dog.update(run.session.state, asyncio.get_running_loop().time(), run.run["log"])


async def screen_and_doc(state, verdict, phase):
    """The document as `snapshot --json` writes it, replayed, and the screen it renders."""
    doc = snapshot_doc(state, verdict=verdict, phase=phase)
    replayed = state_from_doc(doc)
    text = await render(CockpitApp(state=replayed), (160, 50), wait=0, svg=None, text=None)
    return doc, replayed, text


async def test_an_xid_79_on_rank_3s_gpu_before_it_dies_is_the_crash_named(sim_state, tmp_path):
    async with SimRun(
        sim_state, tmp_path, free_port(), ["--tp-size", "4", "--sim-xid-rank", "3", "--sim-xid", "79"]
    ) as run:
        st = run.session.state
        assert st.agent.xid_source == "nvml" and st.agent.health_ms is not None
        dog = Watchdog(idle_s=600, spin_s=600)
        await wait_for(lambda: [e for e in st.xid if e.gpu == 3 and e.code == 79], 60, "the Xid heard")
        await wait_for(lambda: judge(run, dog)[1].name == "crashed", 30, "the rank's death")
        await asyncio.sleep(0.6)
        phase, verdict = judge(run, dog)
        assert verdict.odd_rank == 3, verdict
        assert verdict.evidence[0].startswith("rank 3 died: GPU 3 Xid 79 (fallen off the bus) at "), verdict.evidence
        assert st.gpus[3].lost and st.gpu_flags(3)[:2] == ["LOST", "Xid 79"]
        assert verdict.evidence[0] in alerts_of(st, verdict) and "GPU3 LOST/Xid 79" in alerts_of(st, verdict)
        doc, replayed, text = await screen_and_doc(st, verdict, phase)
    assert [(e["gpu"], e["code"]) for e in doc["xid"]] == [(3, 79)] and doc["gpus"][3]["lost"] is True
    assert doc["verdict"]["odd_rank"] == 3 and doc["verdict"]["evidence"][0] == verdict.evidence[0]
    assert [(e.gpu, e.code) for e in replayed.xid] == [(3, 79)] and replayed.gpus[3].lost
    assert "! LOST Xid 79" in text and "crashed (rank 3)" in text
    health = gpu_health_doc(replayed)
    assert health["xid"][0]["meaning"] == "79 (fallen off the bus)" and "drain" in health["xid"][0]["next"]


async def test_a_lost_gpu_without_an_event_is_named_as_its_ranks_death(sim_state, tmp_path):
    async with SimRun(sim_state, tmp_path, free_port(), ["--tp-size", "4", "--sim-lost-rank", "2"]) as run:
        st = run.session.state
        dog = Watchdog(idle_s=600, spin_s=600)
        await wait_for(lambda: st.gpus.get(2) and st.gpus[2].lost, 60, "the GPU lost")
        assert st.gpus[2].util_pct is None and st.gpus[2].processes == []  # said lost, not left as a missing sample
        await wait_for(lambda: judge(run, dog)[1].name == "crashed", 30, "the rank's death")
        await asyncio.sleep(0.6)
        phase, verdict = judge(run, dog)
        assert verdict.odd_rank == 2
        assert verdict.evidence[0] == "rank 2 died: GPU 2 lost (fallen off the bus: NVML answers GPU_IS_LOST)"
        assert "GPU2 LOST" in alerts_of(st, verdict) and not st.xid
        doc, replayed, text = await screen_and_doc(st, verdict, phase)
    assert doc["gpus"][2]["lost"] is True and replayed.gpus[2].lost and "! LOST" in text


async def test_a_pending_row_remap_is_evidence_and_an_alert_not_a_crash(sim_state, tmp_path):
    async with SimRun(
        sim_state, tmp_path, free_port(), ["--tp-size", "4", "--sim-remap-rank", "1", "--sim-traffic", "2"]
    ) as run:
        st = run.session.state
        dog = Watchdog(idle_s=600, spin_s=600)
        await wait_for(lambda: "ready to roll" in run.log_text(), 60, "ready")
        await wait_for(lambda: st.gpus[1].remap_pending, 15, "the slow clock's remap field")
        await wait_for(lambda: judge(run, dog)[1].name == "ok", 20, "ok with progress")
        phase, verdict = judge(run, dog)
        assert "GPU 1: row remap pending, uncorrected ECC 1" in verdict.evidence
        assert (st.gpus[1].remap_uncorrected, st.gpus[1].ecc_aggregate, st.gpus[0].remap_pending) == (1, 1, False)
        assert "GPU1 remap pending/ECC 1" in alerts_of(st, verdict)
        doc, replayed, text = await screen_and_doc(st, verdict, phase)
    assert doc["gpus"][1]["remap_pending"] is True and doc["gpus"][1]["remap_uncorrected"] == 1
    assert replayed.gpus[1].remap_pending and replayed.gpus[1].ecc_aggregate == 1
    assert "! remap pending ECC 1" in text


async def test_a_hardware_slowdown_on_one_gpu_reads_slow_naming_gpu_and_rank(sim_state, tmp_path):
    async with SimRun(
        sim_state, tmp_path, free_port(), ["--tp-size", "4", "--sim-slowdown-rank", "2", "--sim-traffic", "2"]
    ) as run:
        st = run.session.state
        dog = Watchdog(idle_s=600, spin_s=600)
        await wait_for(lambda: "ready to roll" in run.log_text(), 60, "ready")
        await wait_for(lambda: judge(run, dog)[1].name == "slow", 20, "slow")
        phase, verdict = judge(run, dog)
        assert verdict.odd_rank == 2
        assert verdict.evidence[0].startswith("GPU 2 (rank 2) held down by the hardware: hw-slowdown"), verdict.evidence
        assert "GPU2 hw-slowdown" in alerts_of(st, verdict)
        doc, replayed, text = await screen_and_doc(st, verdict, phase)
    assert "hw-slowdown" in doc["gpus"][2]["throttle_reasons"] and replayed.gpus[2].hw_slowdown == ["hw-slowdown"]
    assert "slow (rank 2)" in text and "! hw-slowdown" in text
