"""The cockpit as an app: a thin App around CockpitScreen (which the fleet reuses), and the screen
as plain text for `--text`."""

from __future__ import annotations

import asyncio
from pathlib import Path

from textual.app import App, SystemCommand
from textual.screen import Screen

from cockpit.model import HostState
from cockpit.ui.cockpit import CockpitScreen


# The palette's name for each of the cockpit's own actions (what one types: "kill", "dump", ...);
# each runs the very action its key runs, offered only while the key would work (check_action).
PALETTE_TITLES = {
    "relaunch": "Relaunch with flag sets toggled",
    "dump": "Dump every rank's stack (py-spy)",
    "kill_run": "Kill the run",
    "kill_one": "Kill the selected process",
    "shm": "Shm: audit /dev/shm (and clean)",
    "bundle": "Bundle: save the hang bundle",
    "flightrec": "Flight recorder: dump and compare every rank",
    "ledger": "Ledger: the runs of this layout",
    "ablate": "Ablate: each on/off combination of flag sets",
    "zoom": "Zoom the focused pane",
    "search": "Search the log",
    "rank_filter": "Rank: show one rank's log lines",
    "follow": "Follow the log on / off",
    "back": "Back to the fleet",
    "help": "Help: every key, verdict, phase and colour",
}


def cockpit_commands(screen: Screen):
    """The cockpit's actions as palette commands, for the screen the palette was opened on."""
    from rich.text import Text

    from cockpit.ui.screens import KEY_HELP, key_name

    if not isinstance(screen, CockpitScreen):
        return
    for binding in screen.BINDINGS:
        action = binding.action
        if action not in PALETTE_TITLES or not screen.check_action(action, ()):
            continue
        key = key_name(binding.key, binding.key_display)
        what = Text.from_markup(KEY_HELP.get(action, binding.description)).plain

        async def run(action: str = action) -> None:
            await screen.run_action(action)

        yield SystemCommand(PALETTE_TITLES[action], f"key {key}: {what}", run)


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
    console = Console(width=width, height=height, file=io.StringIO(), record=True, color_system=None,
                      legacy_windows=False, safe_box=False)
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    text = console.export_text()
    if path:
        Path(path).write_text(text)
    return text
