"""The cockpit as an app: a thin App around CockpitScreen (which the fleet reuses), and the screen
as plain text for `--text`."""

from __future__ import annotations

import asyncio
from pathlib import Path

from textual.app import App

from cockpit.model import HostState
from cockpit.ui.cockpit import CockpitScreen


class CockpitApp(App):
    """The cockpit on one host."""

    CSS_PATH = "cockpit.tcss"
    TITLE = "gpu-cockpit"

    def __init__(self, **kwargs):
        super().__init__()
        self.cockpit = CockpitScreen(**kwargs)

    def get_default_screen(self) -> CockpitScreen:
        return self.cockpit

    @property
    def state(self) -> HostState:
        return self.cockpit.state

    @property
    def error(self) -> str | None:
        return self.cockpit.error

    @property
    def ready(self) -> asyncio.Event:
        return self.cockpit.ready


def save_text(app: App, path: str | None) -> str:
    """The screen as plain text (what `--text` prints)."""
    import io

    from rich.console import Console

    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), record=True, color_system=None,
                      legacy_windows=False, safe_box=False)
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    text = console.export_text()
    if path:
        Path(path).write_text(text)
    return text
