"""The hang bundle for real: `cockpit bundle demo --json` against the simulated host (a demo run
launched as `cockpit demo` launches it, at 4x speed) lists the stacks of every rank, the log tail,
two metrics scrapes and the manifest, and the manifest names what the simulated host cannot give
(no NCCL RAS port, no flight recorder armed, no nvidia-smi), each with why."""

from __future__ import annotations

import json
import stat
import sys
import tarfile
from pathlib import Path

from conftest import free_port, run_cli
from simhost import kill_groups, wait_for

from cockpit.host.session import SessionOptions
from cockpit.link.target import parse_target
from cockpit.monitor import demo
from cockpit.monitor.host import HostMonitor
from cockpit.runs.layoutfile import load_layout


def fast_demo(tmp_path: Path, port: int) -> Path:
    text = (Path(__file__).parents[2] / "layouts" / "demo.yaml").read_text()
    text = text.replace('"30000"', f'"{port}"').replace("ports: [30000]", f"ports: [{port}]")
    text = text.replace("enabled: [eagle3]", "enabled: []").replace("speed: 1.0", "speed: 4.0")
    text = text.replace("log_dir: ~/.cache/gpu-cockpit/demo/runs", f"log_dir: {tmp_path / 'runs'}")
    text += "watch: []\n"  # this run only (its process group), not other simulated runs on this machine
    path = tmp_path / "demo-fast.yaml"
    path.write_text(text)
    return path


async def test_cockpit_bundle_demo_json_lists_every_ranks_stacks_log_metrics_and_manifest(tmp_path, monkeypatch):
    env = {"XDG_STATE_HOME": str(tmp_path / "state"), "XDG_RUNTIME_DIR": str(tmp_path / "rt")}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    port = free_port()
    layout_path = fast_demo(tmp_path, port)
    layout = load_layout(layout_path)
    sim_state = demo.new_state()  # a running demo's own folder (this test process owns it)
    demo.prepare_host(layout, sim_state)
    runs = []

    async def on_connect(monitor):
        run = await demo.start_demo(monitor)
        runs.append(run.record)
        monitor.follow(run)

    monitor = HostMonitor(
        parse_target("demo"),
        SessionOptions(python=sys.executable, interval=0.5, sim_state=sim_state),
        layout,
        on_connect=on_connect,
    )
    try:
        async with monitor.attached():
            await wait_for(
                lambda: any("ready to roll" in log.text() for log in monitor.state.logs.values()),
                60,
                "the demo run to serve",
            )
        res = run_cli("bundle", "demo", "--layout", str(layout_path), "--json", env=env, timeout=180)
        assert res.returncode == 0, res.stderr
        doc = json.loads(res.stdout)
        path = Path(doc["path"])
        assert path.parent == tmp_path / "state" / "gpu-cockpit" / "runs" / runs[0]["run_id"]
        assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        names = [n.split("/", 1)[1] for n in doc["contents"]]
        stacks = sorted(n for n in names if n.startswith("stacks/rank"))
        assert [n.split("-")[0] for n in stacks] == [f"stacks/rank{r}" for r in range(8)], stacks
        for needed in (
            "manifest.json",
            "stacks/groups.txt",
            "log-tail.txt",
            "metrics-1.txt",
            "metrics-2.txt",
            "metrics-summary.json",
            "verdict.json",
            "snapshot.json",
            "versions.json",
            "gpu-health.json",
        ):
            assert needed in names, (needed, names)
        with tarfile.open(path) as tar:
            members = tar.getnames()
            assert sorted(members) == sorted(doc["contents"])
            root = members[0].split("/")[0]
            manifest = json.load(tar.extractfile(f"{root}/manifest.json"))
            metrics_text = tar.extractfile(f"{root}/metrics-2.txt").read().decode()
            tail = tar.extractfile(f"{root}/log-tail.txt").read().decode()
            stack = tar.extractfile(f"{root}/{stacks[3]}").read().decode()
            health = json.load(tar.extractfile(f"{root}/gpu-health.json"))
        assert health["xid_source"] == "nvml" and health["xid"] == [] and len(health["gpus"]) == 8
        assert health["gpus"][0]["lost"] is False and health["gpus"][0]["remap_pending"] is False
        assert "sglang:generation_tokens_total" in metrics_text and "sglang:num_running_reqs" in metrics_text
        assert "ready to roll" in tail
        assert "event_loop" in stack or "all_reduce" in stack  # the simulated rank's own frames
        missing = {m["item"]: m["why"] for m in manifest["not_collected"]}
        assert "NCCL's RAS port" in missing["ras"]
        assert "forensics flag set" in missing["flight recorder"]
        assert "nvidia-smi" in missing["nvidia-smi -q"]
        assert {m["name"] for m in manifest["members"]} | {"manifest.json"} == set(names)
        assert manifest["run"] == runs[0]["run_id"] and manifest["verdict"]["name"] in ("ok", "watching")
        assert doc["missing"] == manifest["not_collected"]
    finally:
        kill_groups(run["pgid"] for run in runs)


def test_a_reason_shared_by_many_ranks_is_said_once_and_a_long_one_ends_with_an_ellipsis():
    from cockpit.operate.bundle import _Members
    from cockpit.read.flightrec import by_reason, describe

    why = "no TORCH_FR_BUFFER_SIZE or TORCH_NCCL_TRACE_BUFFER_SIZE: the flight recorder keeps nothing"
    problems = [f"pid {p}: {why}" for p in (10, 11, 12)] + ["left alone: pid 9 is another user's"]
    assert by_reason(problems) == [f"pids 10, 11, 12: {why}", "left alone: pid 9 is another user's"]
    said = describe({"ranks": {}, "problems": problems}, {})  # what F shows: each reason once
    assert said[:2] == [f"not armed: pids 10, 11, 12: {why}", "left alone: pid 9 is another user's"]
    m = _Members()
    m.miss("x", "y" * 600)
    assert len(m.missing[0]["why"]) == 500 and m.missing[0]["why"].endswith("\u2026")
