"""An engine lives in one module (cockpit/engines/): nothing else spells an engine's name, the agent's
and the simulated host's own copies of its words equal the engines', and a new engine plugs in by one
module."""

from __future__ import annotations

import ast
import importlib.util
import io
import re
import tokenize
from pathlib import Path

from cockpit import engines
from cockpit.agent import facts, kill, procs, shm
from cockpit.host import state
from cockpit.read import metrics
from cockpit.read.logrules import LogRules
from cockpit.runs.layoutfile import load_layout
from cockpit.runs.run import layout_default_port
from cockpit.sim import server

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "tests" / "data" / "engines" / "toy.py"
TRAVEL_ALONE = ("agent", "sim")  # they carry their own copies


def _spelled(path: Path, names: re.Pattern) -> list[tuple[int, str]]:
    """Where a module's code spells an engine's name: its identifiers and string literals (an f-string's
    text too), its docstrings and comments left out (they cite the engines' own sources)."""
    src = path.read_text()
    docs = set()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                docs.add((first.lineno, first.col_offset))
    kinds = {tokenize.NAME, tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING)}
    return [
        (tok.start[0], tok.string)
        for tok in tokenize.generate_tokens(io.StringIO(src).readline)
        if tok.type in kinds and tok.start not in docs and names.search(tok.string)
    ]


def test_the_engine_names_are_spelled_only_by_the_engines_and_their_table():
    names = re.compile("|".join(e.name for e in engines.ENGINES.values() if e.phases), re.IGNORECASE)
    spelled = {}
    for path in sorted((ROOT / "cockpit").rglob("*.py")):
        rel = path.relative_to(ROOT / "cockpit")
        if rel.parts[0] in TRAVEL_ALONE:
            continue
        if hits := _spelled(path, names):
            spelled[str(rel)] = hits[:3]
    assert sorted(spelled) == ["engines/__init__.py", "engines/sglang.py", "engines/vllm.py"], spelled


def test_the_agent_and_the_simulated_host_keep_copies_equal_to_the_engines():
    for e in engines.ENGINES.values():
        for title in e.titles:
            assert f"{title}*" in procs.DEFAULT_PATTERNS, (e.name, title)  # what the agent watches unasked
        for mark in e.launchers:
            assert f"*{mark}*" in procs.DEFAULT_PATTERNS, (e.name, mark)
        families = dict(shm.SHM_FAMILIES)
        for prefix in e.shm_prefixes:
            assert families.get(prefix) == e.title, (e.name, prefix)  # what a clean may remove, and whose
        assert set(e.packages) <= set(facts.VERSION_PACKAGES), e.name
        if e.name in server.TITLES:
            assert server.TITLES[e.name] in e.titles
            exported = {f"{e.name}:{name}" for name, *_ in server.METRICS[e.name]}
            assert {names[0] for names in e.metrics.values()} == exported, e.name
    assert sorted(server.TITLES) == sorted(server.METRICS) == sorted(e.name for e in engines.logged())
    # a rank's title, never a server's root: the agent's rule and the operator side's are one pattern
    assert kill._RANK_TITLE.pattern == state._ENGINE_TITLE.pattern


def _toy(monkeypatch):
    monkeypatch.setattr(engines, "ENGINES", dict(engines.ENGINES))  # the table as it was, after the test
    spec = importlib.util.spec_from_file_location("toy_engine", TOY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return engines.register(module.ENGINE)


def test_a_toy_engine_plugs_in_by_one_module(monkeypatch, tmp_path):
    toy = _toy(monkeypatch)
    assert "toy" in engines.names() and engines.get("toy") is toy
    layout_file = tmp_path / "toy.yaml"
    layout_file.write_text("engine: toy\ncommand: [-m, toy.serve]\nports: [7777]\n")
    layout = load_layout(layout_file)
    assert (layout.engine, layout.metrics, layout_default_port(layout)) == ("toy", "/stats", 7777)

    rules = LogRules(layout.engine, layout.phases)
    assert rules.detected == "toy"
    lines = ["[toy] TOY booting 2 ranks", "TOY weights 1/4", "some chatter", "TOY listening on :7777", "TOY ready"]
    assert [rules.classify(text).phase for text in lines] == ["starting", "loading weights", None, "port open", "ready"]
    assert LogRules("sglang").classify("TOY ready").phase is None  # another engine's rules know none of it

    assert {"toy_tokens_out_total", "toy_busy"} <= set(metrics.wanted())
    page = "# TYPE toy_tokens_out_total counter\ntoy_tokens_out_total 123\ntoy_busy 2\n"
    scrape = metrics.scrape_of({"status": 200, "body": page})
    assert (scrape.values["generation_tokens"], scrape.values["running"]) == (123.0, 2.0)


def test_a_second_engine_of_a_known_name_is_refused(monkeypatch):
    _toy(monkeypatch)
    try:
        _toy(monkeypatch)
    except ValueError as e:
        assert "toy" in str(e)
    else:
        raise AssertionError("a second toy engine was registered")
