"""The full screen in this terminal: `cockpit open` (one host, the default command) and `cockpit
fleet` (a row per host; enter opens a host's cockpit)."""

from __future__ import annotations

import argparse

from cockpit.cli.attach import build_monitor, fleet_monitor
from cockpit.cli.base import arg, command, declined, need_terminal
from cockpit.common.errors import CockpitError
from cockpit.ui.app import CockpitApp
from cockpit.ui.fleet import FleetApp


@command("open", arg("target", nargs="?", default="local", help="the host (default: local)"))
def cmd_open(args: argparse.Namespace) -> int:
    need_terminal(args)
    app = CockpitApp(monitor=build_monitor(args), read_only=args.read_only, ask_host_keys=True)
    app.run()
    if app.cockpit.declined:
        return declined(app.cockpit.declined)
    if app.error:
        raise CockpitError(app.error)
    return 0


@command(
    "fleet",
    arg("fleet_file", nargs="?", metavar="FLEET.yaml", help="the fleet file (docs/fleet.md)"),
    arg("--hosts", metavar="A,B,C", help="these hosts instead of a fleet file"),
    arg("--concurrency", type=int, default=None, metavar="N", help="connections opened at once (default 16)"),
)
def cmd_fleet(args: argparse.Namespace) -> int:
    fleet = fleet_monitor(args)
    need_terminal(args)
    FleetApp(fleet, read_only=args.read_only).run()
    return 0
