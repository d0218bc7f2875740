"""What run 5 on 2x H200 left behind (tests/data/gpu-run5/, see its README): the dying job's own
log explained after the fact, the hang bundle `cockpit bundle` wrote on the GPUs (read as it is,
to pin down what a real bundle holds), and `cockpit dump` with a dead rank. The RAS answers and
flight-recorder dumps of that run are tested with their parsers (tests/read/test_ras.py,
tests/read/test_flightrec.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

from cockpit.agent.flightrec import read_fr_dump, slim_fr_dump
from cockpit.read import flightrec, ras

DATA = Path(__file__).parents[1] / "data"
RUN5 = DATA / "gpu-run5"
ROOT = Path(__file__).parents[2]


def test_explain_names_rank_1_crashed_of_a_cuda_error_in_the_real_log():
    """`cockpit explain tests/data/gpu-run5/tp-die.log --json`: the post-mortem without a host."""
    out = subprocess.run(
        [sys.executable, "-m", "cockpit", "explain", str(RUN5 / "tp-die.log"), "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert (doc["engine"], doc["detected"], doc["lines"], doc["phase"], doc["ranks"]) == (
        "sglang",
        True,
        682,
        "serving",
        [0, 1],
    )
    v = doc["verdict"]
    assert (v["name"], v["rank"], v["cause"], v["line"], v["time"]) == (
        "crashed",
        1,
        "cuda-error",
        670,
        "2026-11-30 16:48:58",
    )
    assert v["evidence"] == [
        "[2026-11-30 16:48:58 TP1] Scheduler hit an exception: Traceback (most recent call last):",
        "torch.AcceleratorError: CUDA error: device-side assert triggered",
    ]


def test_the_real_hang_bundle_holds_what_its_manifest_lists():
    with tarfile.open(RUN5 / "bundle-hang.tar.gz") as tar:
        files = {m.name.split("/", 1)[1]: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
        top = {m.name.split("/", 1)[0] for m in tar.getmembers()}
    assert top == {"bundle-20261130-164826"}  # one folder, no absolute or parent paths
    assert set(files) == {
        "manifest.json",
        "flight-recorder/comparison.json",
        "flight-recorder/rank0.pickle",
        "flight-recorder/rank1.pickle",
        "log-tail.txt",
        "nvidia-smi-q.txt",
        "ras-parsed.json",
        "ras-status.json",
        "snapshot.json",
        "stacks/groups.txt",
        "stacks/rank0-pid667.txt",
        "stacks/rank1-pid668.txt",
        "verdict.json",
        "versions.json",
        "xid.txt",
    }
    # `cockpit bundle --json` on the GPUs listed exactly these
    said = json.loads((RUN5 / "bundle.json").read_text())
    assert sorted(said["contents"]) == sorted(f"bundle-20261130-164826/{n}" for n in files)
    assert said["missing"] == [{"item": "metrics", "why": "the layout names no metrics endpoint and port"}]
    manifest = json.loads(files["manifest.json"])
    assert (manifest["schema"], manifest["run"]) == ("gpu-cockpit.bundle/1", "tp")
    assert {m["name"]: m["bytes"] for m in manifest["members"]} == {
        n: len(b) for n, b in files.items() if n != "manifest.json"
    }
    verdict = manifest["verdict"]
    assert (verdict["name"], verdict["odd_rank"]) == ("stalled-spinning", 1)
    assert json.loads(files["verdict.json"])["verdict"] == verdict
    assert verdict["evidence"][-1].startswith("flight recorder: rank 1 never called all_reduce #78556")
    versions = json.loads(files["versions.json"])
    assert (versions["driver"], versions["nccl_ras"]) == ("580.159.04", "2.28.9")
    assert files["nvidia-smi-q.txt"].count(b"NVIDIA H200") >= 2
    assert b"odd_rank_waits_elsewhere" in files["stacks/rank1-pid668.txt"]
    assert b"synchronize" in files["stacks/rank0-pid667.txt"]
    # NCCL's RAS answer as it came (JSON), and the flight-recorder dumps: the same as the recorded files
    rep = ras.parse_json(files["ras-status.json"].decode())
    assert {r: x.counts["AllReduce"] for r, x in rep.comms[0].ranks.items()} == {0: 78556, 1: 78555}
    for rank in (0, 1):
        assert (
            files[f"flight-recorder/rank{rank}.pickle"]
            == (DATA / "flight-recorder" / f"recorded-rank{rank}.pickle").read_bytes()
        )
    dumps = {r: slim_fr_dump(read_fr_dump(files[f"flight-recorder/rank{r}.pickle"])) for r in (0, 1)}
    result = flightrec.compare(dumps)
    assert result["odd_rank"] == 1 and result["lines"][0].endswith("rank 0 enqueued it and waits")


def test_dump_with_a_dead_rank_reports_it_dead_not_as_a_pyspy_failure():
    """`cockpit dump local --json` while rank 1 was a zombie (exit code 1) and rank 0 hung."""
    doc = json.loads((RUN5 / "dump-die.json").read_text())
    assert doc["dead"] == [{"rank": 1, "pid": 1024, "status": "Z", "exit_code": 1}] and doc["failed"] == {}
    [group] = doc["groups"]
    assert group["ranks"] == [0] and group["frames"][:2] == [
        "synchronize (torch/cuda/__init__.py)",
        "decode_loop (tp_job.py)",
    ]
