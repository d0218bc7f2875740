"""The simulated host under a layout that says nothing about stalls (every operator's first): its
hangs called stalled on the stacks' evidence, long before the default windows, with the rank
that is not where the others are; and its healthy phases that are silent in the log yet moving
(a JIT on the CPU, a rendezvous waiting for a late node, a weight load from a slow disk, a server
with no request) never called stalled. Each is a real `cockpit launch` watching a real run; the
verdicts it went through are read from the ledger. No time is asserted: the detection times are
tests/bench/stall_detect.py's (docs/BENCHMARKS.md)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import free_port

from cockpit.sim import fakenvml


def launch(tmp_path: Path, flags: list[str], timeout: int = 150) -> tuple[dict, list[dict]]:
    """`cockpit launch local --layout L --sim DIR --yes --json` of a layout with no stall
    settings; returns its outcome row and the verdicts the ledger kept."""
    state = tmp_path / "sim"
    fakenvml.write_host(str(state), gpus=8, model="rtx-pro-6000", seed=5)
    port = free_port()
    layout = tmp_path / "first.yaml"
    layout.write_text(json.dumps({
        "name": "first", "engine": "sglang", "python": sys.executable, "command": ["-m", "cockpit.sim.server"],
        "base_flags": ["--tp-size", "8", "--port", str(port), "--enable-metrics", "--sim-shm-dir", str(tmp_path),
                       *flags], "log_dir": str(tmp_path / "runs"), "ports": [port]}))
    env = {**os.environ, "HOME": str(tmp_path / "home"), "XDG_STATE_HOME": str(tmp_path / "home" / "state")}
    try:
        out = subprocess.run([sys.executable, "-m", "cockpit", "launch", "local", "--layout", str(layout), "--sim",
                              str(state), "--yes", "--json", "--timeout", str(timeout), "--settle", "5"],
                             capture_output=True, text=True, env=env, timeout=timeout + 120)
    finally:
        rows = [json.loads(line) for p in (tmp_path / "home").rglob("ledger/*.jsonl")
                for line in p.read_text().splitlines() if line.strip()]
        for pgid in {r["pgid"] for r in rows if isinstance(r.get("pgid"), int)}:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert out.stdout.strip().startswith("{"), out.stderr[-2000:]
    return json.loads(out.stdout), [r for r in rows if r.get("event") == "verdict"]


@pytest.mark.parametrize("flags, phase", [
    (["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/d"], "capturing draft cuda graphs"),
    (["--sim-stall-at", "init"], "loading weights"),
    (["--sim-stall-at", "serving", "--sim-traffic", "2"], "serving"),
], ids=["seed", "init", "serving"])
def test_a_hang_is_called_stalled_on_the_stacks_evidence(tmp_path, flags, phase):
    """Every rank blocked in a collective, the log silent: stalled on the positive evidence of two
    dumps, whatever the phase (before the weights, the seed's own, with requests frozen)."""
    row, verdicts = launch(tmp_path, ["--sim-speed", "4", *flags])
    assert row["outcome"] == "stalled-idle", row
    assert row["evidence"][0].startswith("stacks unchanged across two dumps 4 s apart, all in waits: ranks 0-7 in "
                                         "a collective (Rank.all_reduce)"), row["evidence"]
    assert not any(str(v["verdict"]).startswith("stalled") for v in verdicts[:-1])
    if phase == "serving":
        assert verdicts[-1]["detail"] == "requests frozen", verdicts[-1]
        assert any("generation tokens frozen" in e for e in row["evidence"]), row["evidence"]


def test_a_rank_outside_the_collective_is_named(tmp_path):
    """Rank 3 stops while capturing CUDA graphs, outside any collective; the others wait in it:
    stalled, rank 3 named from the stacks."""
    row, verdicts = launch(tmp_path, ["--sim-speed", "4", "--sim-capture-hang-rank", "3"])
    assert row["outcome"] == "stalled-idle" and verdicts[-1]["odd_rank"] == 3, (row, verdicts[-1])
    assert any("rank 3 not in Rank.all_reduce" in e for e in row["evidence"]), row["evidence"]


@pytest.mark.parametrize("flags", [["--sim-jit-s", "20"], ["--sim-late-node-s", "20"], ["--sim-slow-disk-s", "20"],
                                   []], ids=["jit", "late-node", "slow-disk", "idle-server"])
def test_a_healthy_phase_silent_in_the_log_is_never_stalled(tmp_path, flags):
    """The phase runs its 20 s silent in the log (a stack look or two is taken meanwhile), then the
    server comes up: ready, and no verdict on the way was a stall. The idle server (no request
    after its warm-up) is `ok`, ready and idle."""
    row, verdicts = launch(tmp_path, ["--sim-speed", "4", *flags])
    assert row["outcome"] == "ready", row
    assert verdicts and not any(str(v["verdict"]).startswith("stalled") for v in verdicts), verdicts
