"""Textual's footer showing only the entries that fit the width whole, in the command table's
order (the most used first): an entry is dropped whole, never cut mid-label. `shows(action)`
says whether an action's key is on screen, so a hint names only keys the operator can see."""

from __future__ import annotations

from textual.message import Message
from textual.widgets import Footer


class FittedFooter(Footer):
    class Fitted(Message):
        """The keys on screen changed: a hint that names keys is drawn again (the header's)."""

    def compose(self):
        width = self.app.size.width if self.size.width == 0 else self.size.width
        palette, entries = None, []
        for widget in super().compose():
            if widget.has_class("-command-palette"):
                palette = widget
            else:
                entries.append(widget)
        if palette is not None:
            width -= len(palette.key_display) + len(palette.description) + (3 if self.compact else 4)
        before = getattr(self, "shown", None)
        used, self.shown = 0, set()
        for widget in entries:
            need = _width(widget, self.compact)
            if used + need > width:
                break
            used += need
            self.shown.add(getattr(widget, "action", None))
            yield widget
        if palette is not None and width > 0:
            yield palette
        if self.shown != before:
            self.post_message(self.Fitted())

    def shows(self, action: str) -> bool:
        return action in getattr(self, "shown", ())

    def on_resize(self) -> None:
        self.call_after_refresh(self.recompose)


def _width(widget, compact: bool) -> int:
    """Cells a footer entry takes: its key, its label and the padding or margin around them
    (Textual's footer styles); entries are known by what they carry (Textual's FooterKey is not
    public)."""
    if not hasattr(widget, "key_display"):  # a group's label: the table has no groups
        return 0
    label = len(widget.description)
    if compact:
        return len(widget.key_display) + (1 + label if label else 0) + 1
    return len(widget.key_display) + 2 + (label + 1 if label else 0)
