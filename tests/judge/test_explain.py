"""`cockpit explain` on real SGLang and vLLM logs from public issues (tests/data/real-logs), and on
the ways a log arrives (.gz, stdin, bytes that are not UTF-8, a file that is not there).

Each corpus file starts with two header lines:
    # source: URL (how it was cut)
    # expect: engine=E phase="P" verdict=V rank=R cause=C [ranks=0,1 | ranks=24-31] [together=0-7]
`none` stands for no value. Every key given is checked."""

import argparse
import gzip
import io
import json
import re
import shlex
from pathlib import Path

import pytest

from cockpit.cli.offline import cmd_explain
from cockpit.common.errors import CockpitError
from cockpit.judge.explain import describe, explain, read_log

CORPUS = Path(__file__).parents[1] / "data" / "real-logs"
FILES = sorted(CORPUS.glob("*.log"))


def header(path: Path) -> tuple[str, dict[str, str], list[str]]:
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith("# source: https://github.com/"), f"{path.name}: first line must name its source"
    assert lines[1].startswith("# expect: "), f"{path.name}: second line must say what to expect"
    expect = dict(item.split("=", 1) for item in shlex.split(lines[1][len("# expect: ") :]))
    assert {"engine", "phase", "verdict", "rank"} <= expect.keys(), (
        f"{path.name}: expect needs engine, phase, verdict, rank"
    )
    return lines[0], expect, lines[2:]


def ranks_of(text: str) -> list[int]:
    if "-" in text:
        a, b = map(int, text.split("-"))
        return list(range(a, b + 1))
    return [int(x) for x in text.split(",")]


def none(value):
    return "none" if value is None else str(value)


def test_the_corpus_covers_both_engines_crashes_stalls_and_healthy_runs():
    expects = [header(p)[1] for p in FILES]
    assert len(FILES) >= 20
    assert {e["engine"] for e in expects} >= {"sglang", "vllm"}
    assert {e["verdict"] for e in expects} == {"crashed", "ok", "stalled"}
    causes = {e.get("cause") for e in expects if e["verdict"] == "crashed"}
    assert {"oom", "nccl-error", "nccl-timeout", "cuda-error", "killed", "exception"} <= causes


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_real_log(path):
    _, expect, lines = header(path)
    result = explain(lines)
    verdict = result["verdict"]
    got = {
        "engine": none(result["engine"]),
        "phase": none(result["phase"]),
        "verdict": verdict["name"],
        "rank": none(verdict["rank"]),
        "cause": none(verdict["cause"]),
    }
    for key in ("engine", "phase", "verdict", "rank", "cause"):
        if key in expect:
            assert got[key] == expect[key], f"{path.name}: {key} {got[key]!r}, expected {expect[key]!r}"
    if "ranks" in expect:
        assert result["ranks"] == ranks_of(expect["ranks"])
    # ranks that failed the same way in the same second: none of them named, all of them said
    assert verdict["together"] == (ranks_of(expect["together"]) if "together" in expect else [])
    if verdict["together"]:
        assert verdict["rank"] is None
    if verdict["name"] != "ok":
        assert verdict["evidence"] and all(len(e) <= 200 for e in verdict["evidence"])
        assert all(1 <= n <= len(lines) for n in verdict["evidence_lines"])
    if result["phase"] is not None:
        assert result["timeline"][-1]["phase"] == result["phase"]


def test_an_engine_given_is_the_one_used():
    _, _, lines = header(CORPUS / "sglang-tp24-31-weights-loaded.log")
    result = explain(lines, engine="sglang")
    assert (result["engine"], result["detected"]) == ("sglang", False)
    auto = explain(lines)
    assert (auto["engine"], auto["detected"]) == ("sglang", True)
    with pytest.raises(CockpitError, match="--engine 'tgi'"):
        explain(lines, engine="tgi")


def test_json_shape(capsys):
    path = CORPUS / "sglang-tp1-capture-graph-exception.log"
    assert cmd_explain(argparse.Namespace(log=str(path), engine="auto", json=True)) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {
        "engine",
        "detected",
        "lines",
        "phase",
        "verdict",
        "ranks",
        "timeline",
        "failures",
        "last_time",
        "silent_s",
        "window_s",
        "findings",
    }
    assert set(doc["verdict"]) == {
        "name",
        "rank",
        "cause",
        "line",
        "time",
        "evidence",
        "evidence_lines",
        "together",
        "all_ranks",
    }
    assert doc["phase"] == "capturing cuda graphs" and doc["verdict"]["name"] == "crashed"
    # the header lines count as lines of the file: line numbers are the file's
    assert [m["phase"] for m in doc["timeline"]] == [
        "loading weights",
        "weights loaded",
        "kv cache",
        "capturing cuda graphs",
    ]
    assert doc["timeline"][1] == {"phase": "weights loaded", "line": 5, "time": "2025-06-19 15:12:27"}
    assert doc["verdict"]["line"] == 11 and doc["verdict"]["time"] == "2025-06-19 15:12:27"
    assert doc["failures"][0] == {
        "line": 11,
        "rank": None,
        "cause": "exception",
        "consequence": False,
        "text": "[2025-06-19 15:12:27] Scheduler hit an exception: Traceback (most recent call last):",
    }
    assert doc["last_time"] == "2025-06-19 15:12:27"


def test_text_output(capsys):
    path = CORPUS / "vllm-rank5-oom-enginecore-failed.log"
    assert cmd_explain(argparse.Namespace(log=str(path), engine="auto", json=False)) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("engine vllm (detected), 9 lines, ranks 5")
    assert out[1] == "phase: no phase mark seen"
    assert out[2] == "verdict: crashed: rank 5, cause oom (line 3, 07-07 15:19:48)"
    assert "torch.OutOfMemoryError: CUDA out of memory" in out[3]


def test_describe_a_stall_and_a_healthy_run():
    _, _, lines = header(CORPUS / "vllm-shm-broadcast-hang.log")
    text = describe(explain(lines))
    assert text[2].startswith("verdict: stalled: the log ends on a hang tell (shm-broadcast)")
    _, _, lines = header(CORPUS / "vllm-startup-compile-to-engine-init.log")
    text = describe(explain(lines))
    assert text[2] == "verdict: ok: no failure in the log"
    assert text[3] == "timeline:" and text[-1].endswith("engine initialized")


def test_a_gzipped_log(tmp_path):
    src = CORPUS / "sglang-scheduler-dead-killed.log"
    gz = tmp_path / "server.log.gz"
    gz.write_bytes(gzip.compress(src.read_bytes()))
    result = explain(read_log(str(gz)))
    assert (result["verdict"]["name"], result["verdict"]["rank"], result["verdict"]["cause"]) == (
        "crashed",
        0,
        "killed",
    )


def test_a_truncated_gzip_is_one_line_error(tmp_path):
    gz = tmp_path / "cut.log.gz"
    gz.write_bytes(gzip.compress(b"[2025-02-22 08:19:45 TP26] Load weight begin.\n" * 50)[:30])
    with pytest.raises(CockpitError, match=r"cut\.log\.gz: not a readable gzip file"):
        list(read_log(str(gz)))


def test_stdin(monkeypatch):
    data = (CORPUS / "vllm-shm-then-worker-died.log").read_bytes()
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data)))
    result = explain(read_log("-"))
    assert (result["verdict"]["name"], result["verdict"]["rank"], result["verdict"]["cause"]) == ("crashed", 1, "died")


def test_bytes_that_are_not_utf8_are_replaced(tmp_path):
    path = tmp_path / "latin1.log"
    path.write_bytes(
        b"[2025-02-22 08:19:45 TP0] Load weight begin. caf\xe9\n"
        b"[2025-02-22 08:19:46 TP0] Scheduler hit an exception: \xff\xfe\n"
    )
    lines = list(read_log(str(path)))
    assert lines[0].endswith("caf\ufffd")
    result = explain(lines)
    assert (result["phase"], result["verdict"]["rank"]) == ("loading weights", 0)


def test_crlf_line_ends(tmp_path):
    path = tmp_path / "crlf.log"
    path.write_bytes(b"[2025-02-22 08:19:45 TP0] Load weight begin.\r\n[2025-02-22 08:19:46 TP0] Load weight end.\r\n")
    assert list(read_log(str(path))) == [
        "[2025-02-22 08:19:45 TP0] Load weight begin.",
        "[2025-02-22 08:19:46 TP0] Load weight end.",
    ]


def test_a_missing_file_is_one_line_naming_it_and_the_fix(tmp_path):
    missing = tmp_path / "nope.log"
    with pytest.raises(CockpitError) as exc:
        read_log(str(missing))
    message = str(exc.value)
    assert str(missing) in message and "no such file" in message and "- to read stdin" in message
    assert "\n" not in message


def test_a_directory_is_refused(tmp_path):
    with pytest.raises(CockpitError, match="is a directory"):
        read_log(str(tmp_path))


def test_an_empty_log():
    result = explain([])
    assert result["lines"] == 0 and result["phase"] is None and result["verdict"]["name"] == "empty"
    assert result["engine"] is None and describe(result)[0].startswith("engine unknown,")
    assert describe(result)[2].startswith("verdict: none: the log is empty (0 lines)")
    assert "ok" not in describe(result)[2]


# ----------------------------------------------------------------------------- the file's own clock


def _run(args_log, capsys, json_out=True):
    rc = cmd_explain(argparse.Namespace(log=str(args_log), engine="auto", json=json_out))
    out = capsys.readouterr().out
    return rc, (json.loads(out) if json_out else out)


def test_a_log_silent_short_of_ready_is_stalled_if_it_is_the_live_log(tmp_path, capsys):
    """A launch log that stopped at 'capturing draft cuda graphs' and has not been written for
    three minutes: stalled (cause silent), and the text says it holds only for the live log."""
    import os
    import time as _time

    log = tmp_path / "run.log"
    log.write_text(
        "[2026-12-01 10:00:00 TP0] Load weight begin. avail mem=94 GB\n"
        "[2026-12-01 10:00:30 TP0] Capture draft cuda graph begin. This can take up to several minutes.\n"
    )
    old = _time.time() - 180
    os.utime(log, (old, old))
    rc, doc = _run(log, capsys)
    assert rc == 0 and doc["verdict"]["name"] == "stalled" and doc["verdict"]["cause"] == "silent"
    assert doc["phase"] == "capturing draft cuda graphs" and 179 <= doc["silent_s"] < 240
    rc, text = _run(log, capsys, json_out=False)
    assert (
        "verdict: stalled: silent for 3 min at 'capturing draft cuda graphs' (threshold 60 s), short of ready "
        "(if this is the live log)" in text
    )
    os.utime(log, None)  # written just now: a launch under way, no failure
    assert _run(log, capsys)[1]["verdict"]["name"] == "ok"
    ready = tmp_path / "ready.log"  # a server that came up and went quiet is not stalled by its silence
    ready.write_text(
        "[2026-12-01 10:00:00 TP0] Load weight begin.\n[2026-12-01 10:01:00] The server is fired up and "
        "ready to roll!\n"
    )
    os.utime(ready, (old, old))
    assert _run(ready, capsys)[1]["verdict"]["name"] == "ok"


def test_a_file_that_is_not_a_server_log_says_so_and_exits_non_zero(tmp_path, capsys):
    notes = tmp_path / "notes.txt"
    notes.write_text("shopping list\neggs\nmilk\n")
    rc, text = _run(notes, capsys, json_out=False)
    assert rc == 1 and "verdict: not a server log" in text
    access = tmp_path / "access.log"  # an inference server's access log is one, engine unknown
    access.write_text('INFO:     10.0.0.1:4000 - "POST /v1/chat/completions HTTP/1.1" 200 OK\n')
    assert _run(access, capsys)[0] == 0


def test_a_large_file_shows_its_progress_on_a_terminal_only(tmp_path):
    """`cockpit explain` of an 11 MB log: on a terminal (a real pty as stderr) a bar says how far the
    reading got, and is wiped at the end; with stderr a pipe nothing but the result is written."""
    import os
    import subprocess
    import sys

    log = tmp_path / "big.log"
    line = '[2026-12-01 11:00:00] INFO:     10.0.1.2:31234 - "POST /generate HTTP/1.1" 200 OK\n'
    log.write_text("[2026-12-01 10:00:00 TP0] Load weight begin.\n" + line * ((11 << 20) // len(line)))
    master, slave = os.openpty()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "cockpit", "explain", str(log)], stdout=subprocess.PIPE, stderr=slave, timeout=600
        )
        os.close(slave)
        seen = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the pty's other end closed: all read
                break
            if not chunk:
                break
            seen += chunk
    finally:
        os.close(master)
    assert proc.returncode == 0 and b"verdict: ok" in proc.stdout
    assert re.search(rb"reading .*big\.log: \[[#.]{30}\] +\d+% of 11 MB", seen), seen[-300:]
    assert seen.endswith(b"\r\x1b[K")
    piped = subprocess.run([sys.executable, "-m", "cockpit", "explain", str(log)], capture_output=True, timeout=600)
    assert piped.returncode == 0 and piped.stderr == b""
