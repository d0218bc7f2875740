"""The run's log, live. Lines are classified once as they arrive (error, warning, the start of a
phase) and kept as plain strings in a bounded buffer; only the lines on screen are styled and
rendered (Textual's line API, as toolong does), so a flood of 20,000 lines a second costs what the
visible window costs. `/` search and the rank filter select from the same buffer."""

from __future__ import annotations

import re
from collections import deque

from rich.segment import Segment
from rich.style import Style
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from cockpit.diagnose import classify_line, line_rank
from cockpit.model import LOG_LINES

ERROR = re.compile(r"\b(ERROR|CRITICAL|Traceback|Exception|Error:|died|FAILED|failed)\b")
WARNING = re.compile(r"\bWARN(ING)?\b")
MAX_WIDTH = 400
STYLE_OBJ = {"error": Style(bold=True, color="red"), "warning": Style(color="yellow"), "phase": Style(color="cyan"),
             None: Style()}
MARK = Style(bold=True, color="cyan")
REVERSE = Style(reverse=True)


class LogView(ScrollView, can_focus=True):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.border_title = "log"
        self.search: str | None = None
        self.rank: int | None = None
        self.phases: list = []
        self.path: str | None = None
        self.auto_scroll = True
        self.last_phase: str | None = None
        self.shown: deque[tuple[str, str | None]] = deque(maxlen=LOG_LINES)
        self._width = 0

    # ------------------------------------------------------------------ content

    def classify(self, line: str) -> str | None:
        if ERROR.search(line):
            return "error"
        if WARNING.search(line):
            return "warning"
        phase = classify_line(line, self.phases) if self.phases else None
        if phase is not None and phase != self.last_phase and line_rank(line) in (None, 0):
            self.last_phase = phase  # the start of a phase, marked once: rank 0 speaks for all
            return "phase"
        return None

    def passes(self, line: str) -> bool:
        if self.rank is not None and line_rank(line) != self.rank:
            return False
        return not self.search or self.search.lower() in line.lower()

    def add_lines(self, lines: list[str]) -> None:
        added = False
        for line in lines:
            kind = self.classify(line)
            if self.passes(line):
                self.shown.append((line, kind))
                self._width = max(self._width, min(MAX_WIDTH, len(line) + 2))
                added = True
        if added:
            self._resize()

    def redraw(self, lines) -> None:
        self.shown.clear()
        self.last_phase = None
        self._width = 0
        self.add_lines(list(lines))
        self._resize()
        self._subtitle()

    def _resize(self) -> None:
        self.virtual_size = Size(self._width, len(self.shown))
        if self.auto_scroll:
            self.scroll_end(animate=False, immediate=False, x_axis=False)
        self.refresh()

    def visible_lines(self) -> list[str]:
        return [line for line, _ in self.shown]

    # ------------------------------------------------------------------ rendering

    def render_line(self, y: int) -> Strip:
        """One visible line, built as segments directly (no console render per line)."""
        scroll_x, scroll_y = self.scroll_offset
        index = scroll_y + y
        width = self.scrollable_content_region.width
        if index >= len(self.shown):
            return Strip.blank(width, self.rich_style)
        line, kind = self.shown[index]
        style = STYLE_OBJ[kind]
        segments = [Segment("▶ ", MARK)] if kind == "phase" else []
        if self.search:
            lower, term, start = line.lower(), self.search.lower(), 0
            while True:
                hit = lower.find(term, start)
                if hit < 0:
                    break
                segments += [Segment(line[start:hit], style), Segment(line[hit:hit + len(term)], style + REVERSE)]
                start = hit + len(term)
            segments.append(Segment(line[start:], style))
        else:
            segments.append(Segment(line, style))
        strip = Strip(segments).crop(scroll_x, scroll_x + width)
        return strip.extend_cell_length(width).apply_style(self.rich_style)

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

