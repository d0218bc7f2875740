"""The cockpit as an app: a thin App around CockpitScreen (which the fleet reuses), and the screen
as plain text for `--text`."""

from __future__ import annotations

import asyncio
from pathlib import Path

from rich.text import Text
from textual.app import App, SystemCommand
from textual.screen import Screen

from cockpit.host.state import HostState
from cockpit.ui.cockpit import CockpitScreen
from cockpit.ui.commands import COCKPIT, key_name


def cockpit_commands(screen: Screen):
    """The cockpit's actions as palette commands (its command table's palette titles), for the
    screen the palette was opened on; each runs the very action its key runs, offered only while
    the key would work (check_action)."""
    if not isinstance(screen, CockpitScreen):
        return
    for c in COCKPIT:
        if c.palette is None or not screen.check_action(c.action, ()):
            continue
        what = Text.from_markup(c.help).plain + ("; asks first" if c.asks else "")

        async def run(action: str = c.action) -> None:
            await screen.run_action(action)

        yield SystemCommand(c.palette, f"key {key_name(c.key, c.key_display)}: {what}", run)


class CockpitApp(App):
    """The cockpit on one host."""

    CSS_PATH = "cockpit.tcss"
    TITLE = "gpu-cockpit"

    def __init__(self, **kwargs):
        super().__init__()
        self.cockpit = CockpitScreen(**kwargs)

    def get_default_screen(self) -> CockpitScreen:
        return self.cockpit

    def get_system_commands(self, screen: Screen):
        yield from cockpit_commands(screen)
        yield from super().get_system_commands(screen)

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
    console = Console(
        width=width,
        height=height,
        file=io.StringIO(),
        record=True,
        color_system=None,
        legacy_windows=False,
        safe_box=False,
    )
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    text = console.export_text()
    if path:
        Path(path).write_text(text)
    return text
