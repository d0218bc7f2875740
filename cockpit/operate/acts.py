"""The acts on a host's run, in one table: each with its key on the screen, its command in the CLI,
its help, whether it asks first (it changes the host: the plan is shown and confirmed, or printed
under --yes), whether --read-only refuses it, and what it needs beyond a live link (relaunch,
ablate and bisect: a layout that names the command). k9s's KeyActions, with their Dangerous flag,
are the model.

The screen's bindings, footer, help, palette and allowed-check (cockpit/ui/commands.py,
cockpit/ui/cockpit.py) and the CLI's act commands and their --help lines (cockpit/cli/__init__.py)
are drawn from `ACTS`. Each act's plan, confirm and carry-out is written once, for both, in
cockpit/operate/perform.py: an act with a workflow there and no dialog or command of its own
(`register`) is offered by the screen and the CLI with nothing more. This module imports nothing:
`cockpit --help` reads it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Act:
    """One act: what it does and every way it is offered."""

    name: str  # the screen's action (`action_<name>`), the act's one name
    key: str  # the screen's key (Textual's key name)
    label: str  # the footer's word
    help: str  # the help screen's line (Rich markup)
    palette: str  # the command palette's title
    command: str  # the CLI command that does it (`cockpit kill`)
    family: str  # the CLI family module that registers the command (cockpit/cli/<family>.py)
    summary: str  # the command's line in `cockpit --help`
    asks: bool  # dangerous: it changes the host, so its plan is shown and confirmed first
    needs_command: bool = False  # a layout that names what is launched
    show: bool = True  # in the footer

    def allowed(self, live: bool, read_only: bool, launchable: bool) -> bool:
        """Whether the act can be offered now: a live link to the host, not --read-only (every act
        here attaches to or signals the run's processes), and a launch command where it needs one."""
        return live and not read_only and (launchable or not self.needs_command)


ACTS: tuple[Act, ...] = (
    Act(
        "kill_run",
        "K",
        "Kill run",
        "kill the whole run: SIGTERM, wait, SIGKILL, then verify GPUs and ports",
        "Kill the run",
        "kill",
        "act",
        "kill the run (or one process), then verify it is gone",
        asks=True,
    ),
    Act(
        "kill_one",
        "k",
        "Kill pid",
        "kill the selected process (asks first, names every pid)",
        "Kill the selected process",
        "kill",
        "act",
        "kill the run (or one process), then verify it is gone",
        asks=True,
    ),
    Act(
        "shm",
        "s",
        "Shm",
        "/dev/shm: every entry, who holds it; [b]c[/b] there cleans what is safe",
        "Shm: audit /dev/shm (and clean)",
        "shm",
        "act",
        "audit the host's /dev/shm; --clean removes what is safe to remove",
        asks=True,
    ),
    Act(
        "dump",
        "d",
        "Stacks",
        "py-spy dump of every rank, identical stacks grouped, the odd one out shown",
        "Dump every rank's stack (py-spy)",
        "dump",
        "act",
        "py-spy stack dumps of every rank, grouped",
        asks=False,
    ),
    Act(
        "bundle",
        "b",
        "Bundle",
        "save the hang bundle: one .tar.gz in the run's folder (stacks, NCCL RAS, flight "
        "recorder, nvidia-smi -q, Xid lines, log tail, metrics, versions, verdict, manifest)",
        "Bundle: save the hang bundle",
        "bundle",
        "act",
        "one .tar.gz of a hang, in the run's folder: stacks, NCCL RAS, flight recorder, nvidia-smi -q, Xid lines, "
        "log tail, metrics, versions, verdict, manifest",
        asks=False,
    ),
    Act(
        "flightrec",
        "F",
        "Flight rec.",
        "flight recorder: trigger torch's dump on every rank and compare their "
        "last collectives (the rank that never joined is named)",
        "Flight recorder: dump and compare every rank",
        "flightrec",
        "act",
        "trigger torch's flight-recorder dump on every rank and compare their last collectives",
        asks=False,
        show=False,
    ),
    Act(
        "relaunch",
        "r",
        "Relaunch",
        "relaunch: flag sets as \\[on]/\\[off] toggles, parameters as fields, the "
        "command shown as a diff of argument lists; ctrl+r launches (the current run is stopped first)",
        "Relaunch with flag sets toggled",
        "launch",
        "launch",
        "(re)launch the layout's server with flag sets toggled, and watch it",
        asks=True,
        needs_command=True,
    ),
    Act(
        "ablate",
        "A",
        "Ablate",
        "ablation: each on/off combination of the chosen flag sets, then a table",
        "Ablate: each on/off combination of flag sets",
        "ablate",
        "launch",
        "each on/off combination of flag sets in turn, then a table of outcomes",
        asks=True,
        needs_command=True,
    ),
    Act(
        "bisect",
        "B",
        "Bisect",
        "bisect: which flag sets make the launch hang, between the ledger's failing run "
        "and the good one (running, or in the ledger; else chosen as [on]/[off] toggles), one launch after "
        "another, a flaky hang too; the plan first, the odds as they move in the header, the answer with its "
        "odds in a report; [b]B[/b] again stops it cleanly (a later bisect resumes from the ledger)",
        "Bisect: which flag sets make the launch hang, with its odds",
        "bisect",
        "launch",
        "which flag sets make the launch hang, with its odds (a flaky hang too)",
        asks=True,
        needs_command=True,
        show=False,
    ),
)

ACT = {a.name: a for a in ACTS}
BUILT_IN = frozenset(ACT)  # carried out by the screen's and the CLI's own code; a registered act by its workflow


def register(act: Act) -> None:
    """One more act: its key on the screen and its command in the CLI follow from this row and
    its workflow (cockpit/operate/perform.py, `@workflow`); registered before the screen and the
    CLI are imported, as a plug-in's module is."""
    global ACTS
    if act.name in ACT or any(a.key == act.key for a in ACTS):
        raise ValueError(f"act {act.name!r} (key {act.key!r}): the name or the key is taken")
    if act.family != "act":
        raise ValueError(f"act {act.name!r}: a registered act's command is the act family's (family='act')")
    ACTS = ACTS + (act,)
    ACT[act.name] = act


def commands() -> dict[str, tuple[str, str]]:
    """The CLI's act commands: name -> (its family module, its --help line), in the table's order."""
    found: dict[str, tuple[str, str]] = {}
    for a in ACTS:
        found.setdefault(a.command, (a.family, a.summary))
    return found
