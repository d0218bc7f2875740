"""`cockpit snapshot`: the host's state once, without a terminal: one JSON document
(docs/snapshot-schema.md), the screen as SVG or text, a saved document replayed, or a fleet's.

This module imports only what starting the agent early needs: on this machine the agent starts
before asyncio and the monitor's modules are imported, so its start and its first CPU window pass
while they load (cockpit/link/early.py, docs/BENCHMARKS.md). The monitor's modules are imported
after that start, and Textual only for --svg and --text."""

from __future__ import annotations

import argparse
import json
import sys

from cockpit.agent import agent_argv
from cockpit.cli.base import arg, command, print_json, run_async
from cockpit.common.errors import CockpitError
from cockpit.link import early
from cockpit.link.target import agent_python, parse_target, python_checked


@command(
    "snapshot",
    arg("target", nargs="?", help="the host; omit it with --replay"),
    arg("--json", action="store_true", help="print the JSON document (docs/snapshot-schema.md)"),
    arg("--svg", metavar="FILE", help="save the cockpit screen as SVG"),
    arg(
        "--text",
        metavar="FILE",
        nargs="?",
        const="-",
        help="the screen as text (to FILE, or stdout); the default when no format is named",
    ),
    arg(
        "--size",
        default=None,
        metavar="COLSxROWS",
        help="screen size for --svg/--text (default: the terminal's for text on a terminal, else 160x50)",
    ),
    arg(
        "--wait",
        type=float,
        default=None,
        metavar="S",
        help="judge for exactly S seconds (0: the instant look); by default it looks until the verdict "
        "is decided, at most the layout's stall window (docs/snapshot-schema.md)",
    ),
    arg("--replay", metavar="FILE.json", help="render a saved --json document instead of a live host"),
    arg("--fleet", metavar="FLEET.yaml", help="every host of a fleet file, as one JSON document"),
    arg("--hosts", metavar="A,B,C", help="a fleet of these hosts, as one JSON document"),
    arg(
        "--timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="with --fleet/--hosts: give up on hosts not answering after S seconds (default 30)",
    ),
)
def cmd_snapshot(args: argparse.Namespace) -> int:
    if not (args.json or args.svg or args.text):  # what a person reads, on a terminal or through a pipe
        if args.fleet or args.hosts:
            args.json = True  # a fleet's is one document only
        else:
            args.text = "-"
    if args.fleet or args.hosts:
        from cockpit.cli.attach import fleet_monitor
        from cockpit.monitor.fleet import take_fleet_snapshot

        if not args.json or args.svg or args.text or args.target:
            raise CockpitError("a fleet snapshot is --json only, with no target: snapshot --fleet FLEET.yaml --json")
        print_json(run_async(take_fleet_snapshot(fleet_monitor(args), args.timeout)))
        return 0
    if args.replay is None and not args.target:
        raise CockpitError("name a target (local, demo, an ssh alias, user@host[:port]) or --replay FILE.json")
    if args.svg or args.text:
        from cockpit.ui.headless import check_output

        for option, path in (("--svg", args.svg), ("--text", args.text)):
            if path and path != "-":
                check_output(option, path)
        from cockpit.cli.attach import build_monitor
        from cockpit.operate.snapshot import monitor_doc
        from cockpit.runs.layouts import resolve_layout
        from cockpit.ui.app import CockpitApp
        from cockpit.ui.headless import render

        size = _size(args.size) if args.size else _default_size(args.text == "-")
        if args.replay:
            from cockpit.host.snapshot import state_from_doc

            layout = resolve_layout(args.layout) if args.layout else None
            app = CockpitApp(state=state_from_doc(_replay_doc(args.replay)), layout=layout)
        else:
            app = CockpitApp(monitor=build_monitor(args))
        text = run_async(render(app, size, args.wait, args.svg, args.text))
        if app.error:
            raise CockpitError(app.error)
        if args.text == "-":
            sys.stdout.write(text if text.endswith("\n") else text + "\n")
        if args.json:
            monitor = app.cockpit.monitor
            print_json(monitor_doc(monitor) if monitor.live else _replay_doc(args.replay))
        return 0
    if args.replay:
        print_json(_replay_doc(args.replay))
        return 0
    start_agent_early(args)
    print_json(run_async(_snapshot_doc(args)))
    return 0


def start_agent_early(args: argparse.Namespace) -> None:
    """On this machine, without a layout: the agent started before asyncio and the monitor's
    modules are imported, so its start and its first CPU window pass while they load
    (docs/BENCHMARKS.md). With a layout the interpreter may be the layout's: the session starts
    the agent as usual, as it does whenever this guess differs from what it asks for."""
    target = parse_target(args.target)
    if target.kind == "local" and not args.layout:
        python = args.python or agent_python(target, None)
        early.start(
            *agent_argv(
                python,
                args.interval or 1.0,
                args.sim,
                python_checked(target, python, getattr(args, "trust_python", False)),
            )
        )


async def _snapshot_doc(args: argparse.Namespace) -> dict:
    from cockpit.cli.attach import build_monitor
    from cockpit.operate.snapshot import take_snapshot

    return await take_snapshot(build_monitor(args), wait=args.wait)


def _default_size(to_stdout: bool) -> tuple[int, int]:
    """The terminal's own size for text printed on it (within --size's bounds), else 160x50."""
    import os
    import shutil

    if to_stdout and sys.stdout.isatty():
        cols, rows = shutil.get_terminal_size((160, 50))
        if not os.environ.get("COLUMNS"):
            rows -= 1  # the shell's next prompt: the screen's top line stays in view
        return min(max(cols, 40), 1000), min(max(rows, 10), 500)
    return 160, 50


def _size(text: str) -> tuple[int, int]:
    try:
        cols, rows = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise CockpitError(f"--size {text!r}: expected COLSxROWS, e.g. 160x50") from None
    if not (40 <= cols <= 1000 and 10 <= rows <= 500):
        raise CockpitError(f"--size {text!r}: between 40x10 and 1000x500")
    return cols, rows


def _replay_doc(path: str) -> dict:
    try:
        doc = json.loads(open(path).read())
    except OSError as exc:
        raise CockpitError(f"{path}: cannot read: {exc.strerror}") from None
    except ValueError as exc:
        raise CockpitError(
            f"{path}:{getattr(exc, 'lineno', 1)}: not a JSON snapshot ({exc.msg}): make one with snapshot --json"
        ) from None
    if not isinstance(doc, dict) or not str(doc.get("schema", "")).startswith("gpu-cockpit.snapshot/"):
        raise CockpitError(f"{path}:1: not a gpu-cockpit snapshot (no schema field): make one with snapshot --json")
    return doc
