"""The commands that read this machine's files and talk to no host: `runs` (a layout's ledger)
and `explain` (a saved server log's post-mortem)."""

from __future__ import annotations

import argparse
import json

from cockpit import engines
from cockpit.cli.base import JSON, READ_ONLY_NOOP, arg, command, print_json, say
from cockpit.common.hosttext import visible
from cockpit.judge.explain import SILENT_S, describe, explain, read_log, silence
from cockpit.runs import ledger as runs
from cockpit.runs.layouts import resolve_layout


@command(
    "runs",
    arg(
        "--layout",
        required=True,
        metavar="FILE",
        help="the layout whose runs to list: a .yaml path or a shipped name (demo, "
        + ", ".join(f"{e.name}-tp8" for e in engines.logged())
        + ")",
    ),
    JSON,
    READ_ONLY_NOOP,
    common=False,
)
def cmd_runs(args: argparse.Namespace) -> int:
    layout = resolve_layout(args.layout)
    rows = runs.read_ledger(layout)
    if args.json:
        print_json(rows)
    else:
        say("\n".join(runs.describe_ledger(rows, bisects=runs.read_bisects(layout))))
    return 0


@command(
    "explain",
    arg("log", metavar="LOG", help="the server's log file (.gz is fine; - reads stdin)"),
    arg(
        "--engine",
        choices=[*(e.name for e in engines.logged()), "auto"],
        default="auto",
        help="whose log it is (default: detected from the lines)",
    ),
    JSON,
    READ_ONLY_NOOP,
    common=False,
)
def cmd_explain(args: argparse.Namespace) -> int:
    window = runs.stall_window_of(args.log, SILENT_S) if args.log != "-" else SILENT_S
    result = explain(
        read_log(args.log, progress=True), getattr(args, "engine", None) or "auto", silence(args.log), window
    )
    result["window_s"] = window
    if getattr(args, "json", False):
        print(json.dumps(result, indent=2))
    else:
        print(visible("\n".join(describe(result)), newlines=True))
    return 1 if result["verdict"]["name"] == "not a server log" else 0
