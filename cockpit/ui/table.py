"""A DataTable kept in step with a list of rows: cells are updated in place, and only the cells
that changed; the table is rebuilt only when the set or order of rows changes."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable


def _same(a, b) -> bool:
    if isinstance(a, Text) or isinstance(b, Text):
        return isinstance(a, Text) and isinstance(b, Text) and a.plain == b.plain and a.style == b.style \
            and a.spans == b.spans
    return a == b


class LiveTable(DataTable):
    COLUMNS: list[tuple[str, int]] = []

    def __init__(self, **kw):
        super().__init__(cursor_type="row", **kw)
        self._keys: list[str] = []
        self._shown: dict[str, list] = {}

    def on_mount(self) -> None:
        for name, width in self.COLUMNS:
            self.add_column(name, width=width, key=name)

    def selected_key(self) -> str | None:
        if not self._keys or self.cursor_row is None or self.cursor_row >= len(self._keys):
            return None
        return self._keys[self.cursor_row]

    def sync(self, rows: list[tuple[str, list]]) -> None:
        keys = [k for k, _ in rows]
        if keys != self._keys:
            selected = self.selected_key()
            self.clear()
            for key, cells in rows:
                self.add_row(*cells, key=key)
            self._keys = keys
            self._shown = dict(rows)
            if selected in keys:
                self.move_cursor(row=keys.index(selected), animate=False)
            return
        for key, cells in rows:
            old = self._shown.get(key, [])
            for i, ((name, _), cell) in enumerate(zip(self.COLUMNS, cells)):
                if i >= len(old) or not _same(old[i], cell):
                    self.update_cell(key, name, cell)
            self._shown[key] = cells
