"""The run's log, live. Lines arrive classified (cockpit.read.logrules, once, where they are received:
a failure, an error, a warning, a phase) in a bounded buffer; only the lines on screen are styled
and rendered (Textual's line API, as toolong does), so a flood of 20,000 lines a second costs what the
visible window costs. `/` search and the rank filter select from the same buffer."""

from __future__ import annotations

from collections import deque

from rich.segment import Segment
from rich.style import Style
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from cockpit.common.hosttext import as_text, visible
from cockpit.host.state import LOG_LINES
from cockpit.read.logrules import LogLine

MAX_WIDTH = 400
STYLE_OBJ = {
    "failure": Style(bold=True, color="bright_red"),
    "error": Style(bold=True, color="red"),
    "warning": Style(color="yellow"),
    "stall": Style(bold=True, color="yellow"),
    "phase": Style(color="cyan"),
    None: Style(),
}
MARK = Style(bold=True, color="cyan")
REVERSE = Style(reverse=True)


class LogView(ScrollView, can_focus=True):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.border_title = "log"
        self.search: str | None = None
        self.rank: int | None = None
        self.path: str | None = None
        self.auto_scroll = True
        self.last_phase: str | None = None
        self.shown: deque[tuple[str, str | None]] = deque(maxlen=LOG_LINES)
        self._width = 0

    # ------------------------------------------------------------------ content

    def mark(self, line: LogLine) -> str | None:
        """The style of a line: its kind, except that a phase is marked once, where it starts, and
        rank 0 speaks for all ranks."""
        if line.kind != "phase":
            return line.kind
        if line.phase != self.last_phase and line.rank in (None, 0):
            self.last_phase = line.phase
            return "phase"
        return None

    def passes(self, line: LogLine) -> bool:
        if self.rank is not None and line.rank != self.rank:
            return False
        return not self.search or self.search.lower() in visible(line.text).lower()  # what the screen shows

    def add_lines(self, lines: list[LogLine]) -> None:
        added = False
        for line in lines:
            kind = self.mark(line)
            if self.passes(line):
                self.shown.append((line.text, kind))
                self._width = max(self._width, min(MAX_WIDTH, len(line.text) + 2))
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

    def empty_reason(self) -> str | None:
        """Why a filtered log shows nothing: said in the pane, not left blank."""
        if self.search and self.rank is not None:
            return visible(
                f"no line of rank {self.rank} matches “{self.search}”: / then enter on an empty search "
                f"clears it, t shows the next rank"
            )
        if self.search:
            return visible(f"no line matches “{self.search}”: / then enter on an empty search clears it")
        if self.rank is not None:
            return f"no line of rank {self.rank} yet: t shows the next rank (then all)"
        return None

    def visible_lines(self) -> list[str]:
        return [line for line, _ in self.shown]

    # ------------------------------------------------------------------ rendering

    def render_line(self, y: int) -> Strip:
        """One visible line, built as segments directly (no console render per line)."""
        scroll_x, scroll_y = self.scroll_offset
        index = scroll_y + y
        width = self.scrollable_content_region.width
        if index == 0 and not self.shown and self.empty_reason():
            strip = Strip([Segment(self.empty_reason(), Style(color="yellow"))]).crop(scroll_x, scroll_x + width)
            return strip.extend_cell_length(width).apply_style(self.rich_style)
        if index >= len(self.shown):
            return Strip.blank(width, self.rich_style)
        line, kind = self.shown[index]
        line = visible(line)  # host text: control bytes shown, never sent to the terminal
        style = STYLE_OBJ.get(kind, STYLE_OBJ[None])
        segments = [Segment("▶ ", MARK)] if kind == "phase" else []
        if self.search:
            lower, term, start = line.lower(), self.search.lower(), 0
            while True:
                hit = lower.find(term, start)
                if hit < 0:
                    break
                segments += [Segment(line[start:hit], style), Segment(line[hit : hit + len(term)], style + REVERSE)]
                start = hit + len(term)
            segments.append(Segment(line[start:], style))
        else:
            segments.append(Segment(line, style))
        strip = Strip(segments).crop(scroll_x, scroll_x + width)
        return strip.extend_cell_length(width).apply_style(self.rich_style)

    def toggle_follow(self) -> None:
        self.auto_scroll = not self.auto_scroll
        if self.auto_scroll:
            self.scroll_end(animate=False)
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
        self.border_subtitle = as_text("  ".join(parts))  # the log's path and the search: text, never markup
