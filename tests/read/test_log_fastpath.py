"""The common shapes' parse (`_parse_common`, what `parse` tries first) against the general parse
(`parse_general`), on every line the repository holds: the real-log corpus and the other files of
tests/data, the fixtures' logs, the log strings of the log-rule tests, the hostile lines
(tests/data/hostile_lines.py), the benchmark's generated logs; then each message behind every
common prefix, the edges of what the fast parse rules out (a bracket, a parenthesis, a level, a
digit at every offset of the window it looks in; SGLang's prefix at the window's end), and seeded
mutations of the corpus. The parsed fields and the classification (`LogRules` against one that
parses every line the general way) must be the same, line for line."""

from __future__ import annotations

import ast
import importlib.util
import json
import random
import tarfile
from pathlib import Path

import pytest

from cockpit.read.logrules import LogRules, LogTracker, _parse_common, parse, parse_general

TESTS = Path(__file__).parents[1]
ROOT = TESTS.parent


def _module(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _strings(value) -> list[str]:
    if isinstance(value, str):
        return value.splitlines()
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def corpus_lines() -> list[str]:
    """Every line of tests/data's text files (a JSON file also by its strings, a bundle by its text
    members), the fixtures' strings and the log-rule tests' string constants."""
    lines: list[str] = []
    for path in sorted((TESTS / "data").rglob("*")):
        if not path.is_file() or path.suffix in (".py", ".pickle"):
            continue
        if path.name.endswith(".tar.gz"):
            with tarfile.open(path) as tar:
                for member in tar.getmembers():
                    if member.isfile() and member.name.endswith((".txt", ".log", ".json")):
                        lines += tar.extractfile(member).read().decode("utf-8", "replace").splitlines()
            continue
        text = path.read_bytes().decode("utf-8", "replace")
        lines += text.splitlines()
        if path.suffix == ".json" or path.name.endswith(".json.txt"):
            try:
                lines += _strings(json.loads(text))
            except ValueError:
                pass  # a malformed document kept as one on purpose
    for path in sorted((TESTS / "fixtures").glob("*.json")):
        lines += _strings(json.loads(path.read_text(encoding="utf-8")))
    for name in (
        "read/test_logrules.py",
        "read/test_log_shapes.py",
        "read/test_log_stops.py",
        "agent/test_log_lines.py",
        "judge/test_explain.py",
        "judge/test_diagnose.py",
    ):
        tree = ast.parse((TESTS / name).read_text(encoding="utf-8"))
        lines += [
            s
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            for s in node.value.splitlines()
        ]
    return lines


def bench_lines() -> list[str]:
    bench = _module(TESTS / "bench" / "explain_rate.py")
    return bench.healthy(3000, "vllm") + bench.healthy(3000, "sglang") + bench.failures(6000)


PREFIXES = [
    "",
    "[2026-12-01 10:00:00 TP1] ",
    "[2026-12-01 10:00:00] ",
    "[12-01 10:00:00.123 DP0 TP3 EP3] ",
    "[10:00:00 PP1]",
    "INFO 12-01 10:00:00 [x.py:1] ",
    "ERROR 12-01 10:00:00.5 [multiproc_executor.py:375] ",
    "WARNING 12-01 10:00:00 x.py:1] ",
    "DEBUG 12-01 10:00:00 [a/b.py:12]",
    "(VllmWorker rank=1 pid=5) INFO 12-01 10:00:00 [x.py:1] ",
    "(Worker_PP1_TP2 pid=130) ERROR 12-01 10:00:00 [x.py:1] ",
    "(APIServer pid=1) ",
    "(EngineCore_DP0 pid=2) ",
    "(RayWorkerWrapper pid=336, ip=10.0.0.1) ",
    "(SGLangEngine pid=6680) ",
    "(VllmWorker TP1 pid=406)",
    "    ",
    "\t",
    " \u2502 ",
]
EDGE_CHARS = [
    "[",
    "(",
    "]",
    "|",
    "\u2502",
    " ",
    "0",
    "[rank1]:",
    "[E421 04:13:43.4 x.cpp:1] ",
    "(VllmWorker TP1 pid=3) ",
    "INFO 12-01 10:00:00 [x.py:1] ",
    "[12:00:00 TP2] ",
    " pid=",
    "[gpu_id=1] ",
]


def edge_lines() -> list[str]:
    """Each common prefix with what the fast parse must rule out at every offset of its window, and
    SGLang's prefix grown to the window's end (its trailing space just inside, just outside)."""
    lines = []
    for prefix in PREFIXES:
        for edge in EDGE_CHARS:
            for k in range(0, 72):
                lines.append(prefix + "m" * k + edge + "rest of the message")
                lines.append(prefix + edge + "m" * k)
    for n in range(30, 42):
        for head in ("[10:00:00", "[2026-12-01 10:00:00", "[12-01 10:00:00.5"):
            for tail in ("] msg", "]  msg", "] [x]: msg", "]", "] INFO 12-01 10:00:00 [x.py:1] m"):
                lines.append(head + " TP1" * n + tail)
                lines.append(head + " TP1" * n + " DP12" + tail)
    return lines


def mutated(lines: list[str], count: int) -> list[str]:
    """Seeded mutations of real lines, alone or behind a common prefix: a piece of one prefix shape
    or another put anywhere in their first 120 characters."""
    rng = random.Random(37)
    pieces = EDGE_CHARS + [
        "\x1b[0m",
        "^M",
        "\r",
        "│ ",
        "svc-1  | ",
        "2025-05-30 18:28:27.890 | ",
        "\ufffd[1m",
        "已杀死",
        "INFO:     ",
        "Sep 22 23:46:42 host vllm[361991]: ",
        "Traceback",
        "]",
        ":",
        "-",
        "TP",
        "DP1 ",
    ]
    short = [line for line in lines if len(line) < 400]
    out = []
    for _ in range(count):
        line = rng.choice(short)
        for _ in range(rng.randint(1, 3)):
            at = rng.randint(0, min(len(line), 120))
            line = line[:at] + rng.choice(pieces) + line[at:]
        out.append(line if rng.random() < 0.5 else rng.choice(PREFIXES) + line)
    return out


def fast(line: str) -> bool:
    """Whether `parse` reads the line by the common shapes."""
    return _parse_common(line) is not None


@pytest.fixture(scope="module")
def lines() -> dict[str, list[str]]:
    corpus = corpus_lines()
    messages = sorted({parse_general(line).message for line in corpus if len(line) < 2000})
    return {
        "corpus": corpus,
        "bench": bench_lines(),
        "prefixed": [prefix + m for prefix in PREFIXES for m in messages],
        "edges": edge_lines(),
        "mutated": mutated(corpus, 12000),
        "hostile paths": list(_module(TESTS / "data" / "hostile_lines.py").PATHS.values()),
    }


def test_the_common_shapes_parse_every_line_as_the_general_parse_does(lines):
    taken = {}
    for name, group in lines.items():
        taken[name] = 0
        for line in group:
            assert parse(line) == parse_general(line), line
            taken[name] += fast(line)
    assert len(lines["corpus"]) > 3000 and len(lines["edges"]) > 10000
    # the fast parse is what reads them: every serving line of the benchmark's healthy logs, and many of the rest
    bench = _module(TESTS / "bench" / "explain_rate.py")
    for engine in ("vllm", "sglang"):
        serving = bench.healthy(2000, engine)[200:]
        assert all(fast(line) for line in serving), engine
    assert taken["corpus"] > 1000 and taken["prefixed"] > 10000 and taken["edges"] > 5000 and taken["mutated"] > 1000
    assert all(taken[name] < len(group) for name, group in lines.items())  # and the general parse the others


def test_the_hostile_lines_parse_and_classify_as_the_general_parse_does():
    """Each 64 KiB line alone: its parse, and where the fast parse reads it, its classification."""
    hostile = _module(TESTS / "data" / "hostile_lines.py").HOSTILE
    taken = 0
    for name, line in hostile.items():
        assert parse(line) == parse_general(line), name
        if fast(line):
            taken += 1
            assert LogRules("auto").classify(line) == LogRules("auto", general=True).classify(line), name
    assert taken > 50


@pytest.mark.parametrize("engine", ["auto", "vllm"])
def test_every_line_is_classified_and_tracked_as_with_the_general_parse(lines, engine):
    """Each group read in order as one log (an engine "auto" learns from the lines as they come),
    by rules that parse the common shapes fast and by rules that parse every line the general way."""
    for name, group in lines.items():
        fast, general = LogTracker(LogRules(engine)), LogTracker(LogRules(engine, general=True))
        for line in group:
            a, b = fast.feed(line), general.feed(line)
            assert a == b, (name, line)
        assert fast.rules.detected == general.rules.detected
        assert [(m.phase, m.line) for m in fast.timeline] == [(m.phase, m.line) for m in general.timeline]
        assert [(f.line, f.rank, f.cause) for f in fast.failures] == [
            (f.line, f.rank, f.cause) for f in general.failures
        ]
    kinds = {LogRules(engine).classify(line).kind for line in lines["corpus"]}
    assert {"failure", "phase", "error", "warning", None} <= kinds  # every kind of line went through both


def test_a_signature_is_searched_only_in_a_line_that_holds_one_of_its_heads(lines):
    """`line_engine` skips a signature's search in a line without any of its branches' literal heads:
    no line the signature matches lacks one (and the search finds something to skip it for)."""
    from cockpit.read.logrules import RULE_CHARS, SIGNATURE_HEADS, SIGNATURES, _holds_any

    found = 0
    for group in lines.values():
        for line in group:
            for sigs in SIGNATURES.values():
                for rx, _ in sigs:
                    if rx.search(line, 0, RULE_CHARS):
                        found += 1
                        assert _holds_any(line, SIGNATURE_HEADS[rx]), line
    assert found > 10000 and all(heads for heads in SIGNATURE_HEADS.values())
