"""`exporter`: a fleet's verdicts as Prometheus metrics (cockpit/exporter.py), its monitors built
from the command line."""

from __future__ import annotations

import argparse
import sys

from cockpit import exporter
from cockpit.cli.attach import fleet_monitor
from cockpit.cli.base import arg, command


@command(
    "exporter",
    arg("fleet_file", nargs="?", metavar="FLEET.yaml", help="the fleet file (docs/fleet.md)"),
    arg("--hosts", metavar="A,B,C", help="these hosts instead of a fleet file"),
    arg("--concurrency", type=int, default=None, metavar="N", help="connections opened at once (default 16)"),
    arg(
        "--listen",
        default="127.0.0.1:9841",
        metavar="ADDR:PORT",
        help="where to serve /metrics (default 127.0.0.1:9841)",
    ),
    arg(
        "--on-change",
        metavar="CMD",
        help="run CMD (split like a shell would, never run by one) on each "
        "verdict change, the change in GPU_COCKPIT_* variables",
    ),
    arg(
        "--on-change-timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="kill an --on-change run after S seconds (default 30)",
    ),
    arg("--print-rules", action="store_true", help="print the shipped Prometheus alert rules and exit"),
)
def cmd_exporter(args: argparse.Namespace) -> int:
    if args.print_rules:
        sys.stdout.write(exporter.RULES.read_text())
        return 0
    return exporter.cmd_exporter(args, fleet_monitor(args))
