"""Modal screens for the actions: a confirmation that names exactly what will be touched, and a
scrollable report of what happened."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static


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
