"""The import rules of docs/ARCHITECTURE.md, kept by import-linter over the whole package (every
import counts, function-level ones too): the layers import only downwards, nothing below the UI
imports Textual, the agent and the simulated host import nothing of the cockpit, the command
families of cockpit/cli/ import none of each other; and, module by module, no import circle
anywhere."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import grimp
import tomllib

ROOT = Path(__file__).resolve().parents[2]


def test_the_import_contracts_hold():
    lint = Path(sys.executable).with_name("lint-imports")
    res = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert "5 kept, 0 broken" in res.stdout, res.stdout[-2000:]


def _layers() -> list[str]:
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c["layers"] for c in conf if c["type"] == "layers")
    return [name.strip() for layer in layers for name in layer.split("|")]


def test_every_module_lives_in_a_layer():
    graph = grimp.build_graph("cockpit")
    named = _layers()
    homeless = sorted(
        m for m in graph.modules if m != "cockpit" and not any(m == n or m.startswith(n + ".") for n in named)
    )
    assert homeless == [], f"modules outside every layer of pyproject.toml: {homeless}"


def test_no_module_is_part_of_an_import_circle():
    """Tarjan's strongly connected components over grimp's graph of modules (function-level
    imports included): a component of more than one module is a circle."""
    graph = grimp.build_graph("cockpit")
    edges = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in edges:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for m in sorted(edges):
        if m not in index:
            visit(m)
    assert circles == [], f"import circles: {circles}"


def test_nothing_below_the_monitor_takes_a_monitor():
    """The workflows that drive a monitor live above it (cockpit/operate/); what they call below
    takes plain values (a session, a run, a state), so calls follow the arrows down."""
    import ast

    below = ["actions", "runs", "judge", "host", "read", "link", "common", "agent", "sim"]
    found = []
    for folder in below:
        for path in sorted((ROOT / "cockpit" / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names = [a.arg for a in node.args.args + node.args.kwonlyargs]
                    if "monitor" in names:
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert found == [], found


def test_no_test_file_is_over_600_lines():
    """A test file a newcomer can read: what grows past this is split by what it tests."""
    long = {
        p.name: n for p in sorted((ROOT / "tests").rglob("test_*.py")) if (n := len(p.read_text().splitlines())) > 600
    }
    assert long == {}, long


def test_the_architecture_drawing_is_the_codes():
    """docs/ARCHITECTURE.md's floors and arrows are drawn from pyproject.toml's layers and the
    code's imports (scripts/floors.py): a module added, moved or importing a new floor changes the
    drawing, and the document must say so (`.venv/bin/python scripts/floors.py --write`)."""
    spec = importlib.util.spec_from_file_location("floors", ROOT / "scripts" / "floors.py")
    floors = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(floors)
    assert floors.written() == floors.drawing(), (
        "docs/ARCHITECTURE.md's drawing is stale: run `.venv/bin/python scripts/floors.py --write`"
    )
