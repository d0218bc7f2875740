"""The host's runs: one row per server on the host (user, ports, model, TP size, phase, verdict,
since). Without a layout every server is a run of its own, judged alone; enter follows one (its GPU
panes, rank tree, log and verdict), and the others stay listed as its neighbours. With a layout the
run's neighbours are listed too, never judged with it. Hidden while the host has one server only."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from rich.text import Text
from textual.message import Message

from cockpit.ui.commands import RUNS_TABLE, bindings
from cockpit.ui.table import LiveTable

COLUMNS = [("user", 8), ("ports", 11), ("model", 18), ("TP", 3), ("phase", 14), ("verdict", 16), ("since", 8)]
VERDICT_STYLE = {
    "crashed": "bold red",
    "stalled-idle": "bold red",
    "stalled-spinning": "bold red",
    "slow": "yellow",
    "ok": "green",
    "watching": "grey70",
    "stopped": "grey50",
    "stopping": "yellow",
}


def _since(iso: str | None) -> str:
    """How long ago a server started, in a few characters."""
    if not iso:
        return ""
    try:
        age = time.time() - dt.datetime.fromisoformat(iso).timestamp()
    except ValueError:
        return ""
    if age < 120:
        return f"{age:.0f} s"
    if age < 7200:
        return f"{age / 60:.0f} min"
    return f"{age / 3600:.1f} h"


def run_rows(doc: dict[str, Any]) -> list[tuple[str, list]]:
    """The rows of a monitor's `runs_doc()`: its runs first (the one followed marked), then its
    neighbours (not judged)."""
    rows = []
    for entry, judged in [(r, True) for r in doc.get("runs") or []] + [(n, False) for n in doc.get("neighbours") or []]:
        model = str(entry.get("model") or "")
        model = model if len(model) <= 18 else "…" + model[-17:]
        if judged:
            verdict = (entry.get("verdict") or {}).get("name", "")
            cell = Text(("▶ " if entry.get("followed") else "") + verdict, style=VERDICT_STYLE.get(verdict, ""))
            phase = (entry.get("phase") or {}).get("name", "")
        else:
            cell, phase = Text("neighbour", style="grey50"), ""
        rows.append(
            (
                str(entry.get("root")),
                [
                    str(entry.get("user") or "?"),
                    ",".join(str(p) for p in entry.get("ports") or []) or "—",
                    model,
                    str(entry.get("tp_size") or ""),
                    phase,
                    cell,
                    _since(entry.get("since")),
                ],
            )
        )
    return rows


class RunsTable(LiveTable):
    COLUMNS = COLUMNS
    BINDINGS = bindings(RUNS_TABLE)

    def __init__(self, **kw):
        super().__init__(**kw)
        self.border_title = "runs on this host"

    def show(self, doc: dict[str, Any]) -> bool:
        """Fill the table; whether there is anything to list (more than the run followed)."""
        rows = run_rows(doc)
        self.sync(rows)
        return len(rows) > 1 or bool(doc.get("neighbours"))

    def action_pick_run(self) -> None:
        key = self.selected_key()
        if key is not None and key.isdigit():
            self.post_message(self.Picked(int(key)))

    class Picked(Message):
        """The operator chose a server to follow (its root pid)."""

        def __init__(self, root: int) -> None:
            super().__init__()
            self.root = root
