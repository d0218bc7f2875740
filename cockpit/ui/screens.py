"""Modal screens: a confirmation that names exactly what an action will touch, a scrollable report of
what happened, the relaunch dialog, help and search. Each dialog puts its keys in its own footer.

A dialog's title and body carry host text (process titles, shm names, py-spy frames, error
messages): each is a rich Text of `visible()` lines, so nothing is parsed as markup and no control
character reaches the terminal; an item of a body is one line (a newline in it shows as ^J)."""

from __future__ import annotations

import difflib

from rich.table import Table
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Footer, Input, Label, Static

from cockpit.common.hosttext import as_text, visible
from cockpit.common.secrets import mask_argv
from cockpit.runs.config import param_flag
from cockpit.runs.spec import RunSpec, build_argv
from cockpit.ui.commands import COCKPIT, RANK_TABLE, RUNS_TABLE, key_rows


class Hanging:
    """A dialog's lines, each wrapped at the dialog's width with its continuation lines indented
    under it (a table row's command goes on under the row, never cut); a word longer than the
    width is folded, not cut. Each line is `visible()` (its own newlines, carriage returns and
    escape sequences shown, never acted on), no markup parsed."""

    def __init__(self, lines: list[str], style: str = ""):
        self.lines = [visible(line) for line in lines]
        self.style = style

    def __rich_console__(self, console, options):
        width = max(8, options.max_width)
        for line in self.lines:
            lead = len(line) - len(line.lstrip(" "))
            indent = min(lead + 4, width // 2)
            text = Text(line, style=self.style)
            first, *rest = text.wrap(console, width, overflow="fold") or [Text("")]
            yield first
            if rest:
                tail = Text(line[len(first.plain) :].lstrip(" "), style=self.style)
                for piece in tail.wrap(console, width - indent, overflow="fold"):
                    yield Text(" " * indent) + piece

    def __rich_measure__(self, console, options):
        from rich.measure import Measurement

        longest = max((len(line) for line in self.lines), default=1)
        return Measurement(min(longest, 8), min(longest, options.max_width))


def body(lines: list[str]) -> Hanging:
    return Hanging(lines)


class ConfirmScreen(ModalScreen[bool]):
    """y confirms, n or escape cancels. The body lists every pid / entry the action touches."""

    BINDINGS = [Binding("y", "answer(True)", "Yes, do it"), Binding("n,escape", "answer(False)", "No", key_display="n")]

    def __init__(self, title: str, lines: list[str], question: str):
        super().__init__()
        self.title_text, self.lines, self.question = title, lines, question

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(as_text(self.title_text, "bold"))
            with VerticalScroll(classes="dialog-body"):
                yield Static(body(self.lines))
            yield Static(as_text(f"{self.question}  y yes · n no", "bold yellow"))
        yield Footer()

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class ReportScreen(ModalScreen[str | None]):
    """A report; an offered key (`c` to clean, with the shm audit; `n` for every frame, with the
    stacks) dismisses with its name; the report's body says what it does."""

    BINDINGS = [
        Binding("escape,q,enter", "close", "Close", key_display="esc"),
        Binding("c", "choose('c')", "Clean what is safe"),  # each shown only when offered
        Binding("n", "choose('n')", "Native frames"),
    ]

    def __init__(
        self,
        title: str,
        lines: list[str],
        keys: dict[str, str] | None = None,
        unavailable: dict[str, str] | None = None,
    ):
        super().__init__()
        self.title_text, self.lines, self.keys = title, lines, keys or {}
        self.unavailable = unavailable or {}  # a key that says why it does nothing here, when pressed

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(as_text(self.title_text, "bold"))
            with VerticalScroll(classes="dialog-body"):
                yield Static(body(self.lines))
            yield Static(id="said").set_styles(
                "display: none;"
            )  # why a pressed key does nothing here (a notification would hide under the dialog)
        yield Footer()

    def check_action(self, action: str, parameters) -> bool | None:
        if action == "choose":
            return parameters[0] in self.keys or parameters[0] in self.unavailable
        return True

    def action_close(self) -> None:
        self.dismiss(None)

    def action_choose(self, key: str) -> None:
        if key not in self.keys:
            said = self.query_one("#said", Static)
            said.update(as_text(self.unavailable[key], "bold yellow"))
            said.display = True
            return
        self.dismiss(key)


def _is_flag(arg: str) -> bool:
    if not arg.startswith("-") or arg == "-":
        return False
    try:
        float(arg)
        return False  # a negative number is a value
    except ValueError:
        return True


def arg_items(argv: list[str]) -> list[str]:
    """An argument list as the operator reads it: a flag with its value is one item
    (`--speculative-eagle-topk 1`), each shell-quoted as it would be typed."""
    import shlex

    items, i = [], 0
    while i < len(argv):
        if _is_flag(argv[i]) and i + 1 < len(argv) and not _is_flag(argv[i + 1]) and "=" not in argv[i]:
            items.append(shlex.join(argv[i : i + 2]))
            i += 2
        else:
            items.append(shlex.quote(argv[i]))
            i += 1
    return items


def arg_diff(old: list[str], new: list[str]) -> tuple[list[tuple[str, bool]], list[str]]:
    """The new command's items, each marked when it is not in the old one at that place, and the
    old items that are gone: a diff of the two argument lists, in order, repeats kept."""
    a, b = arg_items(old), arg_items(new)
    shown: list[tuple[str, bool]] = []
    removed: list[str] = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag == "equal":
            shown += [(item, False) for item in b[j1:j2]]
        else:
            removed += a[i1:i2]
            shown += [(item, True) for item in b[j1:j2]]
    return shown, removed


def flag_prompt(layout, name: str, on: bool) -> Text:
    """A flag set as a toggle reads it: [on] / [off] (not by colour alone), its name, its flags."""
    flags = visible(" ".join(layout.flag_sets[name]))
    return Text.assemble(
        ("[on]  " if on else "[off] ", "bold" if on else "grey62"),
        (visible(name), "bold" if on else ""),
        (f"  {flags}", "grey50"),
    )


class RelaunchScreen(ModalScreen["RunSpec | None"]):
    """Flag sets as toggles that read [on] / [off] (not by colour alone), parameters as labelled
    fields, and the exact command line that will run, with what differs from the current run
    marked: a diff of argument lists, a flag with its value."""

    BINDINGS = [
        Binding("ctrl+r", "launch", "Launch"),
        Binding("space", "toggle", "Toggle flag set"),
        Binding("tab", "focus_next", "Next field", show=False),
        Binding("escape", "cancel", "Cancel", key_display="esc"),
    ]

    RELAUNCH = "ctrl+r: the current run is killed and verified gone, /dev/shm cleaned, then this runs"
    ABLATE = (
        "ctrl+r: the flag sets switched on here are varied, every on/off combination of them launched in "
        "turn (the current run stopped first, each launch killing the one before); the list is shown "
        "to confirm first"
    )

    def __init__(self, layout, current, python: str, extra: list[str], title: str = "relaunch", note: str = RELAUNCH):
        super().__init__()
        self.profile, self.current, self.python, self.extra, self.title_text = layout, current, python, extra, title
        self.note = note

    def compose(self) -> ComposeResult:
        from textual.widgets import SelectionList

        with Vertical(classes="dialog"):
            yield Static(as_text(f"{self.title_text}: {self.profile.name}", "bold"))
            yield Static(
                "flag sets (space switches the highlighted one on or off, tab goes to the fields):",
                classes="field-label",
            )
            yield SelectionList(
                *[
                    (self._prompt(name, name in self.current.enabled), name, name in self.current.enabled)
                    for name in self.profile.flag_sets
                ],
                id="sets",
                compact=True,
            )
            for name, value in self.profile.params.items():
                with Horizontal(classes="field"):
                    yield Label(as_text(f"{name} ({param_flag(name)}):"), classes="field-label")
                    yield Input(value=str(self.current.params.get(name, value)), id=f"param-{name}", compact=True)
            yield Static(id="cmd")
            yield Static(Text(self.note, style="yellow"))
        yield Footer()

    def _prompt(self, name: str, on: bool) -> Text:
        return flag_prompt(self.profile, name, on)

    def on_mount(self) -> None:
        self.query_one("#sets").focus()
        self._show()

    def on_descendant_focus(self, event) -> None:
        self.refresh_bindings()  # space toggles only in the list: the footer follows the focus

    def spec(self):
        from textual.widgets import SelectionList

        chosen = self.query_one("#sets", SelectionList).selected
        params = {name: self.query_one(f"#param-{name}", Input).value for name in self.profile.params}
        return RunSpec(enabled=[n for n in self.profile.flag_sets if n in chosen], params=params)

    def _show(self) -> None:
        new = mask_argv(build_argv(self.profile, self.spec(), self.python) + self.extra)  # secrets never shown
        old = mask_argv(build_argv(self.profile, self.current, self.python) + self.extra)
        shown, removed = arg_diff(old, new)
        grid = Table.grid(padding=(0, 1, 0, 0))  # a wrapped command hangs under its first argument
        grid.add_column(style="bold", no_wrap=True)
        grid.add_column(ratio=1)
        grid.add_row(
            "command:", Text(" ").join(as_text(item, "bold green" if changed else "") for item, changed in shown)
        )
        added = [item for item, changed in shown if changed]
        for label, items, style in (("added:", added, "bold green"), ("removed:", removed, "red")):
            if items:
                grid.add_row(label, Text(" · ").join(as_text(item, style) for item in items))
        self.query_one("#cmd", Static).update(grid)

    def on_selection_list_selected_changed(self, event) -> None:
        sets = event.selection_list
        for index, name in enumerate(self.profile.flag_sets):
            sets.replace_option_prompt_at_index(index, self._prompt(name, name in sets.selected))
        self._show()

    def on_input_changed(self, event) -> None:
        self._show()

    def check_action(self, action: str, parameters) -> bool | None:
        if action == "toggle":
            from textual.widgets import SelectionList

            return isinstance(self.focused, SelectionList)
        return True

    def action_toggle(self) -> None:
        from textual.widgets import SelectionList

        sets = self.query_one("#sets", SelectionList)
        if sets.highlighted is not None:
            sets.toggle(sets.get_option_at_index(sets.highlighted).value)

    def action_launch(self) -> None:
        self.dismiss(self.spec())

    def action_cancel(self) -> None:
        self.dismiss(None)


class BisectScreen(ModalScreen["tuple[list[str], list[str]] | None"]):
    """`B` when the ledger does not name both sides: the failing configuration and the good one
    as the relaunch screen's [on]/[off] toggles, the suspects (the flag sets that differ) said as
    they change; ctrl+r takes them, never with nothing to search (it says what to switch)."""

    BINDINGS = [
        Binding("ctrl+r", "bisect", "Bisect"),
        Binding("space", "toggle", "Toggle flag set"),
        Binding("tab", "focus_next", "Other side", show=False),
        Binding("escape", "cancel", "Cancel", key_display="esc"),
    ]

    def __init__(self, layout, failing: list[str], good: list[str], why: str):
        super().__init__()
        self.profile, self.failing, self.good, self.why = layout, failing, good, why

    DEFAULT_CSS = """
    BisectScreen { align: center middle; }
    BisectScreen .sides { height: 1fr; }
    BisectScreen .side { width: 1fr; height: 1fr; }
    BisectScreen SelectionList { height: 1fr; }
    """

    def compose(self) -> ComposeResult:
        from textual.widgets import SelectionList

        with Vertical(classes="dialog"):
            yield Static(as_text(f"bisect: {self.profile.name}", "bold"))
            yield Static(as_text(self.why, "yellow"))
            yield Static(as_text("space: on/off · tab: the other side · ctrl+r: bisect", "grey62"))
            yield Static(id="suspects")
            with Horizontal(classes="sides"):
                for side, on, label in (
                    ("failing", self.failing, "the failing configuration"),
                    ("good", self.good, "the good configuration"),
                ):
                    with Vertical(classes="side"):
                        yield Static(as_text(label, "bold"), classes="field-label")
                        yield SelectionList(
                            *[
                                (flag_prompt(self.profile, name, name in on), name, name in on)
                                for name in self.profile.flag_sets
                            ],
                            id=side,
                            compact=True,
                        )
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#failing").focus()
        self._show()

    def chosen(self) -> tuple[list[str], list[str]]:
        from textual.widgets import SelectionList

        sides = [self.query_one(f"#{side}", SelectionList).selected for side in ("failing", "good")]
        return tuple([n for n in self.profile.flag_sets if n in on] for on in sides)  # type: ignore[return-value]

    def suspects(self) -> list[str]:
        failing, good = self.chosen()
        return [n if n in failing else f"{n} off" for n in self.profile.flag_sets if (n in failing) != (n in good)]

    def _show(self, refused: bool = False) -> None:
        said = self.suspects()
        text = (
            as_text("suspects: " + ", ".join(said), "bold")
            if said
            else as_text(
                "the same configuration on both sides: switch a suspect on in the failing one (or off in the good one)",
                "bold red" if refused else "yellow",
            )
        )
        self.query_one("#suspects", Static).update(text)

    def on_selection_list_selected_changed(self, event) -> None:
        lst = event.selection_list
        for index, name in enumerate(self.profile.flag_sets):
            lst.replace_option_prompt_at_index(index, flag_prompt(self.profile, name, name in lst.selected))
        self._show()

    def action_toggle(self) -> None:
        from textual.widgets import SelectionList

        lst = self.focused
        if isinstance(lst, SelectionList) and lst.highlighted is not None:
            lst.toggle(lst.get_option_at_index(lst.highlighted).value)

    def action_bisect(self) -> None:
        if not self.suspects():
            self._show(refused=True)
            return
        self.dismiss(self.chosen())

    def action_cancel(self) -> None:
        self.dismiss(None)


VERDICT_HELP = [
    ("[green]ok[/green]", "the run is alive and moving (or ready and serving)"),
    ("watching", "processes are there; not enough seen yet to judge"),
    ("no run", "nothing of a run is watched on this host"),
    (
        "[bold red]stalled-idle[/bold red]",
        "every rank alive, CPU and GPU idle with the model resident, port closed, "
        "log silent for the layout's idle_s: a deadlock before serving",
    ),
    (
        "[bold red]stalled-spinning[/bold red]",
        "GPUs pinned at 100 % utilization at idle power (a kernel polling a "
        "flag: a collective that never completes), log silent; the odd rank "
        "is named",
    ),
    ("[bold red]crashed[/bold red]", "a rank died or the log tells a failure; the first failing rank is named"),
    ("[yellow]slow[/yellow]", "a phase has taken slow_factor times what earlier runs took"),
    ("[yellow]stopping[/yellow]", "the operator's own kill or relaunch is under way: not a crash"),
    (
        "stopped",
        "ranks the operator killed are gone (and those of the run that went down after them): "
        "not a crash; a run killed whole and verified gone reads no run",
    ),
    (
        "[bold red]unknown: no connection[/bold red]",
        "the cockpit could not connect to the host (the header's next lines say why); q exits with status 2",
    ),
]

COLOUR_HELP = [
    (
        "bars",
        "[green]green[/green] below 60 %, [yellow]yellow[/yellow] from 60 %, [red]red[/red] from 90 %; "
        "memory [magenta]magenta[/magenta], power [cyan]cyan[/cyan]",
    ),
    (
        "log",
        "[bold bright_red]failure[/bold bright_red], [bold red]error[/bold red], [yellow]warning[/yellow], "
        "[cyan]▶ phase[/cyan] (marked once, where it starts)",
    ),
    (
        "ranks",
        "state [green]R[/green] running, S sleeping, [yellow]D[/yellow] disk wait, [bold red]Z[/bold red] "
        "zombie; a dead rank is struck through with its exit code",
    ),
    (
        "ports",
        "[bold green]listen[/bold green] / [grey50]closed[/grey50], http status [green]2xx[/green] / [red]error[/red]",
    ),
    (
        "link",
        "[green]up[/green], [yellow]connecting[/yellow], [bold red]lost / down / failed[/bold red] "
        "(the panes dim: the data is old)",
    ),
]


def _table(rows: list[tuple[str, str]], indent: int = 2):
    """Two columns: a wrapped description continues under itself (a hanging indent), never at
    column 1."""
    table = Table.grid(padding=(0, 2, 0, 0))
    table.add_column(no_wrap=True)
    table.add_column(ratio=1)
    table.box = None
    table.padding = (0, 2, 0, 0)
    for left, right in rows:
        table.add_row(Text.from_markup(left), Text.from_markup(right))
    from rich.padding import Padding

    return Padding(table, (0, 0, 0, indent))


def help_renderable(commands=COCKPIT + RANK_TABLE + RUNS_TABLE):
    """The cockpit's help: the keys from its command tables, then the header, verdicts, phases, colours
    and sizes; every list a two-column table, so wrapped lines hang under their description."""
    from rich.console import Group

    def para(markup: str) -> Text:
        return Text.from_markup(markup)

    return Group(
        para("[b]gpu-cockpit[/b] — keys, verdicts, phases and colours ([b]↑ ↓[/b] scroll, [b]esc[/b] closes)\n"),
        para("[b]Keys[/b]  (the footer shows the most used first, as many as the width allows)"),
        _table(key_rows(commands)),
        para(
            "\n[b]The header[/b] is always on screen: host, phase, verdict, link, the age of the data; then the "
            "verdict's first evidence (or what to do when there is nothing to show); then what lasts: the "
            "action under way, the last action's outcome, or why the link is down.\n"
        ),
        para("[b]Verdicts[/b]"),
        _table(VERDICT_HELP),
        para("\n[b]Phases[/b] (read from the log, in launch order)"),
        _table(
            [
                (
                    "",
                    "starting · loading weights N/M · weights loaded · kv cache · capturing cuda graphs · "
                    "cuda graphs captured · capturing draft cuda graphs · draft cuda graphs captured · port open · "
                    "ready · serving; an engine may add compiling and engine initialized. crashed / exited: every rank "
                    "gone.",
                )
            ],
            indent=0,
        ),
        para("\n[b]Colours[/b]"),
        _table(COLOUR_HELP),
        para("  Every colour has a word beside it: nothing is said by colour alone.\n"),
        para(
            "[b]Sizes[/b]: from 120x35 a pane per GPU (utilization history, memory, power against its limit, "
            "temperature, SM clock, ranks); below, a line per GPU (two to a line on a short screen), as "
            "nvitop's compact view. Fields a GPU does not report show as n/a, never 0."
        ),
    )


class HelpScreen(ModalScreen):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "Close", key_display="esc")]

    def __init__(self, text=None):
        super().__init__()
        self.text = text  # a screen's own help (markup or a renderable); None: every key of the cockpit's

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help"):
            yield Static(self.text if self.text is not None else help_renderable())
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#help").focus()


class SearchScreen(ModalScreen[str | None]):
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, current: str | None, placeholder: str = "search the log"):
        super().__init__()
        self.current = current or ""
        self.placeholder = placeholder

    def compose(self) -> ComposeResult:
        yield Input(value=self.current, placeholder=f"{self.placeholder} (enter to apply, empty to clear)", id="search")

    @on(Input.Submitted)
    def submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)

    def action_cancel(self) -> None:
        self.dismiss(self.current or None)
