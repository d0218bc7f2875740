"""Where the shipped layouts live, installed or in a checkout, and how a name finds its file."""

from __future__ import annotations

from pathlib import Path

import cockpit
from cockpit.runs.config import Layout, LayoutError


def layouts_dir() -> Path:
    here = Path(cockpit.__file__).resolve().parent
    for cand in (here / "layouts", here.parent / "layouts"):
        if cand.is_dir():
            return cand
    return here.parent / "layouts"


def resolve_layout(name_or_path: str) -> Layout:
    """A path to a YAML file, or the name of a shipped layout (`demo`, `sglang-tp8`). The file
    reader (and PyYAML) is imported here, when a layout is named: the ledger imports this module
    on every command."""
    from cockpit.runs.layoutfile import load_layout

    path = Path(name_or_path).expanduser()
    if path.suffix in (".yaml", ".yml") or path.exists() or "/" in name_or_path:
        return load_layout(path)
    shipped = layouts_dir() / f"{name_or_path}.yaml"
    if not shipped.exists():
        names = ", ".join(sorted(p.stem for p in layouts_dir().glob("*.yaml"))) or "none"
        raise LayoutError(f"{name_or_path}: no such layout (shipped: {names}; or give a path to a .yaml file)")
    return load_layout(shipped)
