"""A DataTable kept in step with a list of rows: cells are updated in place, and only the cells
that changed; the table is rebuilt only when the set or order of rows changes.

A cell given as a str is host text (a pid, a role, a node name, an endpoint): DataTable would
parse it as markup, so it becomes a Text of `visible()` first, shown as it is."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable

from cockpit.common.hosttext import visible


def _same(a, b) -> bool:
    if isinstance(a, Text) or isinstance(b, Text):
        return (
            isinstance(a, Text)
            and isinstance(b, Text)
            and a.plain == b.plain
            and a.style == b.style
            and a.spans == b.spans
        )
    return a == b


def as_cell(cell):
    """A str cell as a Text (no markup, controls visible); a Text as it is."""
    return Text(visible(cell), end="", no_wrap=True) if isinstance(cell, str) else cell  # as DataTable makes one


class LiveTable(DataTable):
    COLUMNS: list[tuple[str, int]] = []

    def __init__(self, **kw):
        super().__init__(cursor_type="row", **kw)
        self._keys: list[str] = []
        self._shown: dict[str, list] = {}

    def on_mount(self) -> None:
        self.set_columns(self.COLUMNS)

    def set_columns(self, columns: list[tuple[str, int]]) -> None:
        """Show these of COLUMNS, at these widths (a narrower screen shows fewer): the rows are
        rebuilt on the next sync. Rows always carry every column's cell."""
        if columns == getattr(self, "_visible_columns", None):
            return
        names = [name for name, _ in self.COLUMNS]
        self._visible_columns = list(columns)
        self._pick = [names.index(name) for name, _ in columns]
        self.clear(columns=True)
        for name, width in columns:
            self.add_column(name, width=width, key=name)
        self._keys, self._shown = [], {}

    def selected_key(self) -> str | None:
        if not self._keys or self.cursor_row is None or self.cursor_row >= len(self._keys):
            return None
        return self._keys[self.cursor_row]

    def _fit_caches(self, nrows: int) -> None:
        """DataTable keeps render caches sized for huge tables (10,000 cells, 1,000 rows). A live
        table rewrites cells every second, so those caches fill with stale renders that every
        full garbage-collector pass walks (measured on a 64-row table: 160,000 objects, ~170 ms a
        pass). Sized to a few screens of this table instead (textual is pinned; unknown names
        are skipped)."""
        rows = max(64, 4 * nrows)
        for name, size in (
            ("_row_render_cache", rows),
            ("_row_renderable_cache", rows),
            ("_line_cache", rows),
            ("_cell_render_cache", rows * max(1, len(self._visible_columns))),
        ):
            cache = getattr(self, name, None)
            if cache is not None and hasattr(cache, "maxsize") and cache.maxsize != size:
                cache.maxsize = size
                cache.clear()

    def sync(self, rows: list[tuple[str, list]]) -> None:
        rows = [(key, [as_cell(cells[i]) for i in self._pick]) for key, cells in rows]
        keys = [k for k, _ in rows]
        if keys != self._keys:
            self._fit_caches(len(rows))
            selected = self.selected_key()
            self.clear()
            for key, cells in rows:
                self.add_row(*cells, key=key)
            self._keys = keys
            self._shown = dict(rows)
            if selected in keys:
                self.move_cursor(row=keys.index(selected), animate=False)
            return
        self._update_cells(rows)

    def _update_cells(self, rows: list[tuple[str, list]]) -> None:
        for key, cells in rows:
            old = self._shown.get(key, [])
            for i, ((name, _), cell) in enumerate(zip(self._visible_columns, cells)):
                if i >= len(old) or not _same(old[i], cell):
                    self.update_cell(key, name, cell)
            self._shown[key] = cells
