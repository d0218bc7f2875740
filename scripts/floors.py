"""The floors and arrows of docs/ARCHITECTURE.md, drawn from the code: the layers of pyproject.toml's
import-linter contract, the modules on each, and for each floor the floors its modules import
(grimp's graph of every import, function-level ones too). tests/architecture/test_layers.py checks that the
drawing in the document is this one; `--write` puts it there.

    .venv/bin/python scripts/floors.py            # print the drawing
    .venv/bin/python scripts/floors.py --write    # replace it in docs/ARCHITECTURE.md
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "ARCHITECTURE.md"
BEGIN = "<!-- floors: drawn by scripts/floors.py from pyproject.toml's layers and the code's imports -->"
END = "<!-- /floors -->"


def layers() -> list[list[str]]:
    """The layers, top floor first, each a list of its packages or modules."""
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    return [[n.strip() for n in layer.split("|")] for layer in next(c["layers"] for c in conf if c["type"] == "layers")]


def drawing() -> str:
    floors = layers()
    graph = grimp.build_graph("cockpit")

    def floor_of(module: str) -> int | None:
        for k, names in enumerate(floors):
            if any(module == n or module.startswith(n + ".") for n in names):
                return k
        return None

    below: dict[int, set[int]] = {k: set() for k in range(len(floors))}
    for module in graph.modules:
        k = floor_of(module)
        for imported in graph.find_modules_directly_imported_by(module):
            j = floor_of(imported)
            if k is not None and j is not None and j != k:
                below[k].add(j)
    top = len(floors)
    lines = []
    for k, names in enumerate(floors):
        for n, name in enumerate(names):
            lines.append((f"{top - k:>2}  " if n == 0 else "    ") + _with_modules(name, graph.modules))
        lines.append(f"      \u2192 {' '.join(str(top - j) for j in sorted(below[k])) or 'nothing of the cockpit'}")
    head = "floor  package/ modules (top floor first; \u2192 the floors its modules import)"
    return "\n".join(["```", head, *lines, "```"])


def _with_modules(name: str, modules: set[str]) -> str:
    """A package with its modules (`ui/ app cockpit ...`), or a module alone."""
    inside = sorted(m[len(name) + 1:] for m in modules if m.startswith(name + ".") and "." not in m[len(name) + 1:])
    short = name.removeprefix("cockpit.")
    return f"{short + '/':<10}{' '.join(inside)}" if inside else short


def written() -> str | None:
    """The drawing docs/ARCHITECTURE.md holds now, between its markers."""
    text = DOC.read_text()
    if BEGIN not in text or END not in text:
        return None
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip()


def write() -> None:
    text = DOC.read_text()
    head, rest = text.split(BEGIN, 1)
    DOC.write_text(head + BEGIN + "\n" + drawing() + "\n" + END + rest.split(END, 1)[1])


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write()
    else:
        print(drawing())
