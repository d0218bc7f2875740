"""Each screen's one command table: every key with its action, its footer label, its line in the
help and its palette title. The bindings, the footer, the help screen and the command palette are
all drawn from these tables, so a key is described once; the acts on the run are the table of
acts' rows (cockpit/operate/acts.py), which the CLI's commands share."""

from __future__ import annotations

from dataclasses import dataclass

from textual.binding import Binding

from cockpit.operate.acts import ACT, ACTS, Act

KEY_NAMES = {"question_mark": "?", "slash": "/", "colon": ":", "escape": "esc", "space": "space"}
PALETTE_KEY = "ctrl+p"  # the App's own binding for the palette, beside `:`


@dataclass(frozen=True)
class Key:
    """One key of a screen: what it does and every way it is described."""

    key: str  # Textual's key names, comma-separated for several
    action: str
    label: str  # the footer's word
    help: str  # the help screen's line (Rich markup)
    palette: str | None = None  # the palette's title: offered there while the key would work
    show: bool = True  # in the footer
    key_display: str | None = None
    asks: bool = False  # an act that changes the host: its plan is shown and confirmed first

    def binding(self) -> Binding:
        return Binding(self.key, self.action, self.label, show=self.show, key_display=self.key_display)


def act_key(act: Act) -> Key:
    """An act of the table of acts (cockpit/operate/acts.py) as a key of the screen."""
    return Key(act.key, act.name, act.label, act.help, act.palette, show=act.show, asks=act.asks)


COCKPIT = (
    Key("question_mark", "help", "Help", "this help", "Help: every key, verdict, phase and colour", key_display="?"),
    Key("q", "app.quit", "Quit", "quit (a demo ends every run it launched; on a real host the run keeps running)"),
    Key("escape", "back", "Fleet", "back to the fleet (a host's cockpit opened from it)", "Back to the fleet"),
    Key(
        "e",
        "evidence",
        "Why",
        "the verdict's whole evidence, every line wrapped (the header shows the first as it fits)",
        "Why: the verdict's whole evidence",
    ),
    act_key(ACT["relaunch"]),
    act_key(ACT["dump"]),
    act_key(ACT["kill_run"]),
    act_key(ACT["shm"]),
    act_key(ACT["bundle"]),
    act_key(ACT["flightrec"]),
    Key(
        "L",
        "ledger",
        "Runs",
        "the ledger of this layout's runs: what the cockpit saw of each one",
        "Ledger: the runs of this layout",
    ),
    Key(
        "v",
        "report",
        "Report",
        "the last action's full report again (its one-line summary stays in the header)",
        "Report: the last action's full report",
    ),
    Key("z", "zoom", "Zoom", "zoom the focused pane to the full screen and back (or esc)", "Zoom the focused pane"),
    Key("slash", "search", "Find", "search the log (empty search clears it)", "Search the log", key_display="/"),
    Key(
        "t",
        "rank_filter",
        "Rank",
        "show one rank's log lines (cycles TP0…TPn, then all)",
        "Rank: show one rank's log lines",
    ),
    Key("f", "follow", "Follow", "follow the log on / off", "Follow the log on / off"),
    act_key(ACT["kill_one"]),
    act_key(ACT["ablate"]),
    act_key(ACT["bisect"]),
    Key(
        "colon",
        "app.command_palette",
        "Commands",
        "command palette: every action here by name (type kill, dump, shm, ...)",
        show=False,
    ),
    Key("tab", "app.focus_next", "Next pane", "move to the next pane: GPUs, ranks, ports, log", show=False),
    Key("shift+tab", "app.focus_previous", "Prev pane", "move to the previous pane", show=False),
)


def _registered(table: tuple[Key, ...]) -> tuple[Key, ...]:
    """The acts registered beyond those placed above, each on a key and an action of its own."""
    later = [a for a in ACTS if a.name not in {k.action for k in table}]
    for a in later:
        taken = next((k for k in table if a.key in k.key.split(",") or a.name == k.action), None)
        if taken is not None:
            raise ValueError(f"act {a.name!r}: key {a.key!r} or its name is the screen's {taken.action!r} already")
    return tuple(act_key(a) for a in later)


COCKPIT += _registered(COCKPIT)

FLEET = (
    Key("q", "app.quit", "Quit", "quit"),
    Key(
        "enter",
        "open",
        "Open host",
        "open the host's cockpit (on the fleet's own connection); [b]escape[/b] there comes back",
    ),
    Key("o", "sort", "Sort", "sort: problems first, name, utilization, memory, link"),
    Key("slash", "filter", "Filter", "filter by any text of a row (empty clears it)", key_display="/"),
    Key("question_mark", "help", "Help", "this help", key_display="?"),
    Key("colon", "app.command_palette", "Commands", "command palette: a host's actions once it is open", show=False),
)

RANK_TABLE = (
    Key("enter", "toggle_collapse", "Collapse", "collapse or expand a process subtree (rank tree)", show=False),
    Key(
        "o",
        "sort",
        "Sort",
        "sort the rank table: tree, gpu mem, cpu%, rank, pid (or click a column's title)",
        show=False,
    ),
)

RUNS_TABLE = (
    Key(
        "enter",
        "pick_run",
        "Follow",
        "follow the selected server as the run (no layout: every server on the "
        "host is a run of its own, each judged alone; the others stay listed as its neighbours)",
        show=False,
    ),
)


def bindings(table) -> list[Binding]:
    return [c.binding() for c in table]


def key_name(key: str, display: str | None = None) -> str:
    return display or KEY_NAMES.get(key, key)


def key_rows(table) -> list[tuple[str, str]]:
    """(keys, what they do) for each action, in the table's order; keys of one action together."""
    rows: dict[str, list[str]] = {}
    helps: dict[str, str] = {}
    for c in table:
        for key in c.key.split(","):
            rows.setdefault(c.action, []).append(key_name(key.strip(), c.key_display))
        helps.setdefault(c.action, c.help)
    if "app.command_palette" in rows:
        rows["app.command_palette"].append(PALETTE_KEY)
    return [(" or ".join(f"[b]{k}[/b]" for k in dict.fromkeys(keys)), helps[action]) for action, keys in rows.items()]
