"""The run's log, live: errors, warnings and phase lines marked; a search and a rank filter that
redraw from HostState's bounded buffer; follow on or off. Memory is bounded by max_lines."""

from __future__ import annotations

import re

from rich.text import Text
from textual.widgets import RichLog

from cockpit.diagnose import classify_line, line_rank
from cockpit.model import LOG_LINES

ERROR = re.compile(r"\b(ERROR|CRITICAL|Traceback|Exception|Error:|died|FAILED|failed)\b")
WARNING = re.compile(r"\bWARN(ING)?\b")


class LogView(RichLog):
    def __init__(self, **kw):
        super().__init__(max_lines=LOG_LINES, wrap=False, highlight=False, markup=False, auto_scroll=True, **kw)
        self.border_title = "log"
        self.search: str | None = None
        self.rank: int | None = None
        self.phases: list = []
        self.path: str | None = None
        self.last_phase: str | None = None

    def styled(self, line: str) -> Text | None:
        """A line as shown, or None when the current filter hides it."""
        if self.rank is not None and line_rank(line) != self.rank:
            return None
        if self.search and self.search.lower() not in line.lower():
            return None
        if ERROR.search(line):
            text = Text(line, style="bold red")
        elif WARNING.search(line):
            text = Text(line, style="yellow")
        else:
            phase = classify_line(line, self.phases) if self.phases else None
            if phase is not None and phase != self.last_phase and line_rank(line) in (None, 0):
                # mark where a phase begins, once (rank 0 or the launcher speaks for all ranks)
                self.last_phase = phase
                text = Text("▶ ", style="bold cyan") + Text(line, style="cyan")
            else:
                text = Text(line)
        if self.search:
            text.highlight_words([self.search], style="reverse", case_sensitive=False)
        return text

    def add_lines(self, lines: list[str]) -> None:
        for line in lines:
            text = self.styled(line)
            if text is not None:
                self.write(text)

    def redraw(self, lines) -> None:
        self.clear()
        self.last_phase = None
        self.add_lines(list(lines))
        self._subtitle()

    def _subtitle(self) -> None:
        parts = []
        if self.path:
            parts.append(self.path)
        if self.rank is not None:
            parts.append(f"rank {self.rank}")
        if self.search:
            parts.append(f"/{self.search}")
        parts.append("follow" if self.auto_scroll else "paused")
        self.border_subtitle = "  ".join(parts)
