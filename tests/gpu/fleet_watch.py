"""The fleet screen on real hosts (here: the GPU host itself, through the local link), saved as
SVG once every host has sent a few samples.

    python tests/gpu/fleet_watch.py FLEET.yaml OUT.svg
"""

import asyncio
import sys
import time

from cockpit.monitor.fleet import FleetMonitor, load_fleet
from cockpit.ui.fleet import FleetApp


async def main(fleet: str, out: str) -> None:
    watch = FleetMonitor(load_fleet(fleet))
    app = FleetApp(watch)
    async with app.run_test(size=(160, 12)) as pilot:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(m.state.seq > 3 for m in watch.members):
            await pilot.pause(0.2)
        await pilot.pause(2)
        open(out, "w").write(app.export_screenshot(title="gpu-cockpit fleet"))
        for row in watch.rows():
            print(row)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
