"""Headless rendering: the same CockpitApp, run without a terminal, saved as SVG or text.

Every widget shows host text through cockpit.hosttext already; what is saved goes through
`visible()` once more (newlines kept), so neither `--text` on a terminal nor an SVG in a browser
ever carries a control character, whatever a widget let through."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from cockpit.common.errors import CockpitError
from cockpit.common.hosttext import visible
from cockpit.ui.app import CockpitApp, save_text


async def render(
    app: CockpitApp, size: tuple[int, int], wait: float | None, svg: str | None, text: str | None, timeout: float = 60.0
) -> str:
    """Run the app at `size`, wait for its first sample, then for the monitor's one-shot look to
    decide (`wait` None: as `snapshot --json` does) or `wait` seconds, and save what it shows."""
    async with app.run_test(size=size) as pilot:
        deadline = asyncio.get_running_loop().time() + timeout
        while not app.ready.is_set():
            if not app.is_running or asyncio.get_running_loop().time() > deadline:
                break  # a failed app raises as the context closes; a slow host renders what came
            await asyncio.sleep(0.05)
        monitor = app.cockpit.monitor
        start = time.monotonic()
        if app.error:
            pass  # nothing to look at: refused as soon as the link is (`snapshot --json` refuses as fast)
        elif wait is None and monitor.live:
            while app.is_running and monitor.still_looking(start):
                await asyncio.sleep(0.1)
            monitor.say_undecided()
        elif wait:
            await asyncio.sleep(wait)
        if monitor.live:
            monitor.looked_s = round(time.monotonic() - (monitor.opened_at or start), 1)
        app.cockpit.dirty = True
        app.cockpit._tick()
        # Deferred renders (a log view learns its size after layout) land over a few refreshes:
        # take the screen once two looks in a row agree.
        previous = None
        for _ in range(50):
            await pilot.pause(0.02)
            current = save_text(app, None)
            if current == previous:
                break
            previous = current
        if svg:
            write_output("--svg", svg, visible(app.export_screenshot(title="gpu-cockpit"), newlines=True, tabs=None))
        out = visible(save_text(app, None), newlines=True, tabs=None)
        if text and text != "-":
            write_output("--text", text, out)
    return out


def check_output(option: str, path: str) -> None:
    """An output file's place, checked before any work: one line naming the path, why and the fix."""
    import os

    target = Path(path)
    folder = target.parent if str(target.parent) else Path(".")
    if target.is_dir():
        raise CockpitError(f"{option} {path}: is a folder: name a file in it, e.g. {option} {target / 'screen'}")
    if not folder.exists():
        raise CockpitError(f"{option} {path}: the folder {folder} does not exist: create it or choose another path")
    if not folder.is_dir():
        raise CockpitError(f"{option} {path}: {folder} is not a folder: choose another path")
    if not os.access(folder, os.W_OK | os.X_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise CockpitError(f"{option} {path}: not writable by you: choose another path")


def write_output(option: str, path: str, content: str) -> None:
    try:
        Path(path).write_text(content)
    except OSError as exc:
        raise CockpitError(f"{option} {path}: cannot write: {exc.strerror or exc}: choose another path") from None
