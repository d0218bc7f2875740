"""`cockpit explain` on hostile logs (issue 25): a 4 MB line of repeated rule prefixes and a
200 MB line without a newline (a sparse file, and stdin from a pipe) are read in bounded chunks,
cut where the live path cuts a line (64 KiB), and explained with bounded memory: the peak RSS of
the process doing it, read with getrusage, stays far below the line's size. No clock involved."""

from __future__ import annotations

import json
import subprocess
import sys

RUN = """\
import json, resource, sys
from cockpit.judge.explain import explain, read_log
doc = explain(read_log(sys.argv[1]))
print(json.dumps({"lines": doc["lines"], "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""
BASELINE = "import resource; import cockpit.judge.explain; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"


def explain_in_child(arg: str, stdin=None) -> dict:
    out = subprocess.run([sys.executable, "-c", RUN, arg], stdin=stdin, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def baseline_kib() -> int:
    return int(subprocess.run([sys.executable, "-c", BASELINE], capture_output=True, text=True, check=True).stdout)


def test_a_4_mb_line_of_rule_prefixes_is_cut_and_explained(tmp_path):
    log = tmp_path / "long.log"
    unit = "Processed prompts: 100%| checkpoint shards: | Free memory on device Got completion from peer "
    with log.open("w") as fh:
        fh.write("[2026-01-01 00:00:00] Load weight begin.\n")
        fh.write(unit * (4_000_000 // len(unit)) + "\n")
        fh.write("[2026-01-01 00:00:09] The server is fired up and ready to roll!\n")
    doc = explain_in_child(str(log))
    assert doc["lines"] == 3
    assert doc["maxrss_kib"] < baseline_kib() + 32 * 1024  # the 4 MB line was never held whole (nor copied)


def test_a_200_mb_line_without_a_newline_from_a_sparse_file_and_a_pipe(tmp_path):
    sparse = tmp_path / "sparse.log"
    with sparse.open("wb") as fh:
        fh.write(b"[2026-01-01 00:00:00] Load weight begin.\n")
        fh.truncate(200 << 20)  # 200 MB of NUL bytes, no newline: a sparse file, nothing on disk
    base = baseline_kib()
    doc = explain_in_child(str(sparse))
    assert doc["lines"] == 2 and doc["maxrss_kib"] < base + 32 * 1024
    feeder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys\nchunk = b'x' * (1 << 20)\nfor _ in range(200):\n    sys.stdout.buffer.write(chunk)\n",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        doc = explain_in_child("-", stdin=feeder.stdout)
    finally:
        feeder.stdout.close()
        feeder.wait(60)
    assert doc["lines"] == 1 and doc["maxrss_kib"] < base + 32 * 1024


def test_a_cut_line_says_how_much_was_skipped(tmp_path):
    from cockpit.judge.explain import read_log

    log = tmp_path / "cut.log"
    log.write_bytes(b"a" * (70 << 10) + b"\nnext\n")
    lines = list(read_log(str(log)))
    assert lines == ["a" * (64 << 10) + f" \u2026 [{6 << 10} bytes skipped]", "next"]
