"""Each screen's one command table: every key with its action, its footer label, its line in the
help and its palette title. The bindings, the footer, the help screen and the command palette are
all drawn from these tables, so a key is described once."""

from __future__ import annotations

from dataclasses import dataclass

from textual.binding import Binding

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

    def binding(self) -> Binding:
        return Binding(self.key, self.action, self.label, show=self.show, key_display=self.key_display)


COCKPIT = (
    Key("question_mark", "help", "Help", "this help", "Help: every key, verdict, phase and colour",
        key_display="?"),
    Key("q", "app.quit", "Quit", "quit (a demo ends every run it launched; on a real host the run keeps running)"),
    Key("escape", "back", "Fleet", "back to the fleet (a host's cockpit opened from it)", "Back to the fleet"),
    Key("e", "evidence", "Why", "the verdict's whole evidence, every line wrapped (the header shows the first "
        "as it fits)", "Why: the verdict's whole evidence"),
    Key("r", "relaunch", "Relaunch", "relaunch: flag sets as \\[on]/\\[off] toggles, parameters as fields, the "
        "command shown as a diff of argument lists; ctrl+r launches (the current run is stopped first)",
        "Relaunch with flag sets toggled"),
    Key("d", "dump", "Stacks", "py-spy dump of every rank, identical stacks grouped, the odd one out shown",
        "Dump every rank's stack (py-spy)"),
    Key("K", "kill_run", "Kill run", "kill the whole run: SIGTERM, wait, SIGKILL, then verify GPUs and ports",
        "Kill the run"),
    Key("s", "shm", "Shm", "/dev/shm: every entry, who holds it; [b]c[/b] there cleans what is safe",
        "Shm: audit /dev/shm (and clean)"),
    Key("b", "bundle", "Bundle", "save the hang bundle: one .tar.gz in the run's folder (stacks, NCCL RAS, flight "
        "recorder, nvidia-smi -q, Xid lines, log tail, metrics, versions, verdict, manifest)",
        "Bundle: save the hang bundle"),
    Key("F", "flightrec", "Flight rec.", "flight recorder: trigger torch's dump on every rank and compare their "
        "last collectives (the rank that never joined is named)", "Flight recorder: dump and compare every rank",
        show=False),
    Key("L", "ledger", "Runs", "the ledger of this layout's runs: what the cockpit saw of each one",
        "Ledger: the runs of this layout"),
    Key("v", "report", "Report", "the last action's full report again (its one-line summary stays in the header)",
        "Report: the last action's full report"),
    Key("z", "zoom", "Zoom", "zoom the focused pane to the full screen and back (or esc)", "Zoom the focused pane"),
    Key("slash", "search", "Find", "search the log (empty search clears it)", "Search the log", key_display="/"),
    Key("t", "rank_filter", "Rank", "show one rank's log lines (cycles TP0…TPn, then all)",
        "Rank: show one rank's log lines"),
    Key("f", "follow", "Follow", "follow the log on / off", "Follow the log on / off"),
    Key("k", "kill_one", "Kill pid", "kill the selected process (asks first, names every pid)",
        "Kill the selected process"),
    Key("A", "ablate", "Ablate", "ablation: each on/off combination of the chosen flag sets, then a table",
        "Ablate: each on/off combination of flag sets"),
    Key("B", "bisect", "Bisect", "bisect: which flag sets make the launch hang, between the ledger's failing run "
        "and the good one (running, or in the ledger; else chosen as [on]/[off] toggles), one launch after "
        "another, a flaky hang too; the plan first, the odds as they move in the header, the answer with its "
        "odds in a report; [b]B[/b] again stops it cleanly (a later bisect resumes from the ledger)",
        "Bisect: which flag sets make the launch hang, with its odds", show=False),
    Key("colon", "app.command_palette", "Commands",
        "command palette: every action here by name (type kill, dump, shm, ...)", show=False),
    Key("tab", "app.focus_next", "Next pane", "move to the next pane: GPUs, ranks, ports, log", show=False),
    Key("shift+tab", "app.focus_previous", "Prev pane", "move to the previous pane", show=False),
)

FLEET = (
    Key("q", "app.quit", "Quit", "quit"),
    Key("enter", "open", "Open host", "open the host's cockpit (on the fleet's own connection); "
        "[b]escape[/b] there comes back"),
    Key("o", "sort", "Sort", "sort: problems first, name, utilization, memory, link"),
    Key("slash", "filter", "Filter", "filter by any text of a row (empty clears it)", key_display="/"),
    Key("question_mark", "help", "Help", "this help", key_display="?"),
    Key("colon", "app.command_palette", "Commands", "command palette: a host's actions once it is open",
        show=False),
)

RANK_TABLE = (
    Key("enter", "toggle_collapse", "Collapse", "collapse or expand a process subtree (rank tree)", show=False),
    Key("o", "sort", "Sort", "sort the rank table: tree, gpu mem, cpu%, rank, pid (or click a column's title)",
        show=False),
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
