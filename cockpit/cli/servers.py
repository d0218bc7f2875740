"""The cockpit served over HTTP: `serve` (the screen to a browser, through textual-serve) and
`exporter` (a fleet's verdicts as Prometheus metrics)."""

from __future__ import annotations

import argparse
import sys

from cockpit import exporter
from cockpit.cli.attach import fleet_monitor
from cockpit.cli.base import arg, command
from cockpit.serve import serve


@command("serve",
         arg("target", nargs="?", default="demo", help="the host to open (default: the demo host)"),
         arg("--fleet", metavar="FLEET.yaml", help="serve the fleet view of these hosts instead"),
         arg("--hosts", metavar="A,B,C", help="serve the fleet view of these hosts instead"),
         arg("--port", type=int, default=8080, help="the port to serve on (default 8080)"),
         arg("--bind", default="127.0.0.1", metavar="ADDR", help="the address to serve on (default 127.0.0.1)"),
         arg("--allow-remote", action="store_true",
             help="allow an address other than loopback: plain HTTP, reach it with ssh -L instead"),
         arg("--allow-actions", action="store_true",
             help="let the browser kill, clean shm and relaunch (served read-only otherwise)"))
def cmd_serve(args: argparse.Namespace) -> int:
    return serve(args)


@command("exporter",
         arg("fleet_file", nargs="?", metavar="FLEET.yaml", help="the fleet file (docs/fleet.md)"),
         arg("--hosts", metavar="A,B,C", help="these hosts instead of a fleet file"),
         arg("--concurrency", type=int, default=None, metavar="N", help="connections opened at once (default 16)"),
         arg("--listen", default="127.0.0.1:9841", metavar="ADDR:PORT",
             help="where to serve /metrics (default 127.0.0.1:9841)"),
         arg("--on-change", metavar="CMD", help="run CMD (split like a shell would, never run by one) on each "
                                                "verdict change, the change in GPU_COCKPIT_* variables"),
         arg("--on-change-timeout", type=float, default=30.0, metavar="S",
             help="kill an --on-change run after S seconds (default 30)"),
         arg("--print-rules", action="store_true", help="print the shipped Prometheus alert rules and exit"))
def cmd_exporter(args: argparse.Namespace) -> int:
    if args.print_rules:
        sys.stdout.write(exporter.RULES.read_text())
        return 0
    return exporter.cmd_exporter(args, fleet_monitor(args))
