"""`serve`: the screen to a browser, through textual-serve (cockpit/serve.py). A family of its
own: each browser session runs its own `cockpit open` or `fleet`, so the serving process needs
neither a monitor nor the exporter's imports."""

from __future__ import annotations

import argparse

from cockpit.cli.base import arg, command
from cockpit.serve import serve


@command(
    "serve",
    arg("target", nargs="?", default="demo", help="the host to open (default: the demo host)"),
    arg("--fleet", metavar="FLEET.yaml", help="serve the fleet view of these hosts instead"),
    arg("--hosts", metavar="A,B,C", help="serve the fleet view of these hosts instead"),
    arg("--port", type=int, default=8080, help="the port to serve on (default 8080)"),
    arg("--bind", default="127.0.0.1", metavar="ADDR", help="the address to serve on (default 127.0.0.1)"),
    arg(
        "--allow-remote",
        action="store_true",
        help="allow an address other than loopback: plain HTTP, reach it with ssh -L instead",
    ),
    arg(
        "--allow-actions",
        action="store_true",
        help="let the browser kill, clean shm and relaunch (served read-only otherwise)",
    ),
)
def cmd_serve(args: argparse.Namespace) -> int:
    return serve(args)
