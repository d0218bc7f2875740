"""Launch profiles, verdicts, the ledger and ablation, on the simulated host with real processes."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import free_port, run_cli

from cockpit.runs.layoutfile import parse_layout
from cockpit.runs.ledger import masked, read_ledger
from cockpit.runs.spec import RunSpec, build_argv, combinations

LAYOUT = """\
name: {name}
engine: sglang
command: [-m, cockpit.sim.server]
base_flags: [--tp-size, "8", --port, "{port}", --sim-traffic, "2"]
flag_sets:
  eagle3: [--speculative-algorithm, EAGLE3, --speculative-draft-model-path, /d]
  hang: [--sim-hang-rank, "3"]
  crash: [--sim-crash-rank, "5"]
enabled: []
params:
  mem_fraction_static: 0.85
env:
  NCCL_DEBUG: INFO
  HF_TOKEN: hf_secret_value
log_dir: {tmp}/runs
ports: [{port}]
watch: []
stall: {{idle_s: 3, spin_s: 3}}
kill_wait_s: 2
sim: {{speed: 4, seed: 1}}
"""


@pytest.fixture
def sim_layout(tmp_path, sim_state):
    port = free_port()
    path = tmp_path / "t.yaml"
    path.write_text(LAYOUT.format(name=f"t{port}", port=port, tmp=tmp_path))
    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    yield path, ["local", "--sim", str(sim_state), "--layout", str(path)], env
    subprocess.run(["pkill", "-9", "-f", f"sim.server.*port {port}"])


def test_command_lines_are_argument_lists_in_layout_order(tmp_path):
    layout = parse_layout(LAYOUT.format(name="x", port=1, tmp=tmp_path))
    argv = build_argv(layout, RunSpec(enabled=["crash", "eagle3"], params={"mem_fraction_static": 0.8}), "py")
    assert argv[:3] == ["py", "-m", "cockpit.sim.server"]
    assert argv.index("--speculative-algorithm") < argv.index("--sim-crash-rank")  # layout order
    assert argv[-2:] == ["--mem-fraction-static", "0.8"]
    assert [s.enabled for s in combinations(layout, ["eagle3", "hang"])] == [
        ["eagle3", "hang"],
        ["eagle3"],
        ["hang"],
        [],
    ]
    assert masked({"HF_TOKEN": "x", "API_KEY": "y", "NCCL_DEBUG": "INFO"}) == {
        "HF_TOKEN": "***",
        "API_KEY": "***",
        "NCCL_DEBUG": "INFO",
    }


def test_ablation_over_eagle3_shows_it_decides_the_outcome(sim_layout):
    path, target, env = sim_layout
    res = run_cli("ablate", *target, "--vary", "eagle3", "--timeout", "60", "--yes", "--json", env=env, timeout=240)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = json.loads(res.stdout[res.stdout.index("[") :])
    assert [(r["flag_sets"], r["outcome"]) for r in rows] == [(["eagle3"], "stalled-idle"), ([], "ready")]
    stalled, ready = rows
    assert any("log silent" in e for e in stalled["evidence"]) and stalled["dumps"]
    assert any("ranks 0-7 (8)" in e for e in stalled["evidence"])  # every rank in the same wait
    assert ready["phase_times"]["ready"] > ready["phase_times"]["loading weights"]
    ledger = run_cli("runs", "--layout", str(path), "--json", env=env)
    runs = json.loads(ledger.stdout)
    assert [r["outcome"] for r in runs] == ["stalled-idle", "ready"]
    assert runs[0]["env"]["HF_TOKEN"] == "***" and "hf_secret_value" not in ledger.stdout
    ledger_file = Path(env["XDG_STATE_HOME"]) / "gpu-cockpit" / "ledger" / f"{path.read_text().split()[1]}.jsonl"
    assert oct(ledger_file.stat().st_mode & 0o777) == "0o600"
    table = run_cli("runs", "--layout", str(path), env=env).stdout
    assert "stalled-idle" in table and "ready" in table


@pytest.mark.parametrize(
    "flag, outcome, evidence, status",
    [
        ("hang", "stalled-spinning", "rank 3 is the odd one out", 4),
        ("crash", "crashed", "rank 5 died (exit code -9)", 5),
    ],
)
def test_launch_reaches_the_verdict_with_its_evidence(sim_layout, flag, outcome, evidence, status):
    """The outcome, its evidence, and the exit status that says it (README "Exit status")."""
    path, target, env = sim_layout
    res = run_cli("launch", *target, "--on", flag, "--timeout", "60", "--settle", "30", "--yes", env=env, timeout=180)
    assert res.returncode == status, res.stderr[-2000:]
    assert f": {outcome}" in res.stdout and evidence in res.stdout, res.stdout


def test_killing_the_cockpit_mid_ablation_loses_no_ledger_row(sim_layout, monkeypatch):
    path, target, env = sim_layout
    proc = subprocess.Popen(
        [sys.executable, "-m", "cockpit", "ablate", *target, "--vary", "eagle3", "--yes", "--timeout", "60"],
        env=dict(os.environ, **env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    layout = parse_layout(path.read_text(), str(path))
    monkeypatch.setenv("XDG_STATE_HOME", env["XDG_STATE_HOME"])
    deadline = time.monotonic() + 60
    while not read_ledger(layout):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(1.0)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    rows = read_ledger(layout)
    assert len(rows) == 1 and rows[0]["flag_sets"] == ["eagle3"] and rows[0]["outcome"] == "unknown"
    assert rows[0]["argv"][1:3] == ["-m", "cockpit.sim.server"]
    res = run_cli("runs", "--layout", str(path), env=env)
    assert rows[0]["run_id"] in res.stdout
    alive = subprocess.run(["pgrep", "-f", f"sim.server.*port {layout.ports[0]}"], capture_output=True, text=True)
    assert alive.stdout.strip()  # the run outlives the cockpit that launched it
    # the next start finds it again (the layout watches no titles: only the ledger knows it)
    res = run_cli("kill", *target, "--yes", "--json", env=env)
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout[res.stdout.index("{") :])
    assert report["verified"] and len(report["term"]) + len(report["vanished"]) >= 10  # a launcher may end some first


async def test_a_runs_log_follows_xdg_cache_home_as_the_xdg_spec_says(tmp_path, monkeypatch):
    """A layout's log_dir under ~/.cache/ moves to $XDG_CACHE_HOME on the host when that is an
    absolute path (a relative one is ignored, as the spec says)."""
    from cockpit.host.session import HostSession, SessionOptions
    from cockpit.link.target import parse_target

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for cache, expect in (
        (str(tmp_path / "cache"), tmp_path / "cache" / "gpu-cockpit" / "runs" / "x.log"),
        ("relative/cache", tmp_path / "home" / ".cache" / "gpu-cockpit" / "runs" / "x.log"),
    ):
        monkeypatch.setenv("XDG_CACHE_HOME", cache)
        session = HostSession(parse_target("local"), SessionOptions(python=sys.executable, interval=0.25))
        await session.connect()
        try:
            run = await session.request(
                "launch", argv=[sys.executable, "-c", "print('hi')"], log="~/.cache/gpu-cockpit/runs/x.log"
            )
            assert run["log"] == str(expect)
        finally:
            await session.close()
        deadline = time.monotonic() + 10
        while "hi" not in expect.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "hi" in expect.read_text()
