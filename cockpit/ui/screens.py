"""Modal screens: a confirmation that names exactly what an action will touch, a scrollable report of
what happened, the relaunch dialog, help and search."""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Input, Static


class ConfirmScreen(ModalScreen[bool]):
    """y confirms, n or escape cancels. The body lists every pid / entry the action touches."""

    BINDINGS = [Binding("y", "answer(True)", "Yes, do it"), Binding("n,escape", "answer(False)", "No")]

    def __init__(self, title: str, lines: list[str], question: str):
        super().__init__()
        self.title_text, self.lines, self.question = title, lines, question

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(Text(self.title_text, style="bold"))
            with VerticalScroll(classes="dialog-body"):
                yield Static(Text("\n".join(self.lines)))
            yield Static(Text(f"{self.question}  [y] yes   [n] no", style="bold yellow"))

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class ReportScreen(ModalScreen[str | None]):
    """A report; extra keys (e.g. `c` to clean) dismiss with their name."""

    BINDINGS = [Binding("escape,q,enter", "close", "Close")]

    def __init__(self, title: str, lines: list[str], keys: dict[str, str] | None = None):
        super().__init__()
        self.title_text, self.lines, self.keys = title, lines, keys or {}
        for key, label in self.keys.items():
            self._bindings.bind(key, f"choose('{key}')", label)

    def compose(self) -> ComposeResult:
        hint = "   ".join(f"[{k}] {label}" for k, label in self.keys.items())
        with Vertical(classes="dialog"):
            yield Static(Text(self.title_text, style="bold"))
            with VerticalScroll(classes="dialog-body"):
                yield Static(Text("\n".join(self.lines)))
            yield Static(Text(f"{hint}   [esc] close".strip(), style="bold yellow"))

    def action_close(self) -> None:
        self.dismiss(None)

    def action_choose(self, key: str) -> None:
        self.dismiss(key)


class RelaunchScreen(ModalScreen["RunSpec | None"]):
    """Flag sets as toggles, parameters as fields, and the exact command line that will run,
    with what differs from the current run marked."""

    BINDINGS = [Binding("escape", "cancel", "Cancel"), Binding("ctrl+r", "launch", "Launch")]

    def __init__(self, layout, current, python: str, extra: list[str], title: str = "relaunch"):
        super().__init__()
        self.profile, self.current, self.python, self.extra, self.title_text = layout, current, python, extra, title

    def compose(self) -> ComposeResult:
        from textual.widgets import Input, SelectionList

        with Vertical(classes="dialog"):
            yield Static(Text(f"{self.title_text}: {self.profile.name}", style="bold"))
            yield SelectionList(*[(name, name, name in self.current.enabled) for name in self.profile.flag_sets],
                                id="sets")
            for name, value in self.profile.params.items():
                yield Input(value=str(self.current.params.get(name, value)), placeholder=name, id=f"param-{name}")
            yield Static(id="cmd")
            yield Static(Text("space toggles a flag set · ctrl+r launches (the current run is killed and verified "
                              "gone, /dev/shm cleaned first) · esc cancels", style="bold yellow"))

    def on_mount(self) -> None:
        self._show()

    def spec(self):
        from textual.widgets import Input, SelectionList

        from cockpit.runs import RunSpec

        chosen = self.query_one("#sets", SelectionList).selected
        params = {name: self.query_one(f"#param-{name}", Input).value for name in self.profile.params}
        return RunSpec(enabled=[n for n in self.profile.flag_sets if n in chosen], params=params)

    def _show(self) -> None:
        from cockpit.runs import build_argv

        from cockpit.secrets import mask_argv

        new = mask_argv(build_argv(self.profile, self.spec(), self.python) + self.extra)  # secrets never shown
        old = mask_argv(build_argv(self.profile, self.current, self.python) + self.extra)
        text = Text("command: ", style="bold")
        for arg in new:
            text.append(arg + " ", style="bold green" if arg not in old else "")
        gone = [a for a in old if a not in new]
        if gone:
            text.append("\nremoved from the current run: ", style="bold")
            text.append(" ".join(gone), style="strike red")
        self.query_one("#cmd", Static).update(text)

    def on_selection_list_selected_changed(self, event) -> None:
        self._show()

    def on_input_changed(self, event) -> None:
        self._show()

    def action_launch(self) -> None:
        self.dismiss(self.spec())

    def action_cancel(self) -> None:
        self.dismiss(None)


HELP = """\
[b]gpu-cockpit[/b] — keys

  [b]tab[/b] / [b]shift+tab[/b]   move between panes
  [b]↑ ↓[/b]            move in a table or scroll the log
  [b]enter[/b]          collapse or expand a process subtree (rank tree)
  [b]/[/b]              search the log (empty search clears it)
  [b]t[/b]              show one rank's log lines (cycles TP0…TPn, then all)
  [b]f[/b]              follow the log on / off
  [b]k[/b]              kill the selected process (asks first, names every pid)
  [b]K[/b]              kill the whole run: SIGTERM, wait, SIGKILL, then verify GPUs and ports
  [b]s[/b]              /dev/shm: every entry, who holds it; [b]c[/b] there cleans what is safe
  [b]d[/b]              py-spy dump of every rank, identical stacks grouped, the odd one out shown
  [b]r[/b]              relaunch: flag sets as toggles, parameters as fields, the command line shown
  [b]A[/b]              ablation: each on/off combination of the chosen flag sets, then a table
  [b]L[/b]              the ledger of this layout's runs
  [b]:[/b] or [b]ctrl+p[/b]     command palette
  [b]?[/b]              this help
  [b]escape[/b]         back to the fleet (a host's cockpit opened from it)
  [b]q[/b]              quit (a run keeps running on the host)

GPU panes: utilization with its history, memory, power against the limit (100 % utilization at
idle power is a collective that never completes), temperature, SM clock, the ranks on the GPU.
Fields a GPU does not report show as n/a, never 0.
"""


class HelpScreen(ModalScreen):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "Close")]

    def __init__(self, text: str = HELP):
        super().__init__()
        self.text = text

    def compose(self) -> ComposeResult:
        yield Static(self.text, id="help")


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
