"""The `cockpit` command.

    cockpit [TARGET]                 open the cockpit on a host (local, demo, alias, user@host[:port])
    cockpit demo                     the simulated 8-GPU host, started on first use
    cockpit snapshot TARGET --json   one document of the host's state and verdict, for scripts

Every subcommand is named here once, with its family module and its one-line help (`COMMANDS`);
the family registers its arguments and handler (`@command`, cockpit/cli/base.py) and is imported
only when one of its commands is parsed: a command's start costs its family's imports alone, and
`cockpit --help` none. The families go by what they import: `screen` and `demo` Textual; `act`
and `launch` the actions and the workflows that drive a monitor; `exporter` the exporter and the
fleet's monitors; `serve` cockpit/serve.py alone (each browser session runs its own `cockpit`,
so the serving process builds no monitor); `offline` no host and no asyncio; `snapshot` only
what starting the agent early needs, the rest after that start. Every command that talks to a host goes through one
HostMonitor (`attached`, cockpit/cli/attach.py), so the verdict a script reads is the one the
screen shows. Every user-facing failure is one line on stderr and exit status 2, never a
traceback (`base.handle`).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from cockpit import __version__
from cockpit.cli.base import REGISTERED, common_options, handle, say
from cockpit.operate import acts

COMMANDS: dict[str, tuple[str, str]] = {  # name: (its family module, its help), in --help's order
    "open": ("screen", "open the cockpit on a host (the default command)"),
    "demo": ("demo", "open the cockpit on the simulated 8-GPU host"),
    "snapshot": ("snapshot", "render the host's state once, without a terminal, and exit"),
    "fleet": ("screen", "one row per host of a fleet; enter opens a host's cockpit"),
    "serve": ("serve", "serve the cockpit to a browser (textual-serve), on 127.0.0.1 by default, behind a token"),
    "exporter": (
        "exporter",
        "serve the fleet's verdicts as Prometheus metrics (on 127.0.0.1 unless --listen says otherwise)",
    ),
    **acts.commands(),  # the acts on a host's run: their table (cockpit/operate/acts.py) names them
    "runs": ("offline", "the ledger: every launch of a layout and what became of it"),
    "explain": ("offline", "post-mortem of a saved server log: the phases reached, the rank that failed and why"),
}


def family(name: str):
    """The family module of command `name`, imported (its commands registered) on first use."""
    return importlib.import_module(f"cockpit.cli.{COMMANDS[name][0]}")


def build_parser(only: str | None = None, arguments: bool = True) -> argparse.ArgumentParser:
    """Every subcommand's parser, or with `only` that one's alone (a one-shot command starts its
    work the sooner: building them all, and importing every family for their arguments, is most
    of the parsing's cost). Without `arguments`, the subcommands by name and help only: all the
    top level's --help and --version need."""
    parser = argparse.ArgumentParser(prog="cockpit", description="A terminal cockpit for multi-GPU inference hosts.")
    parser.add_argument("--version", action="version", version=f"gpu-cockpit {__version__}")
    sub = parser.add_subparsers(dest="command")
    parser.subcommands = {}
    for name, (_family, text) in COMMANDS.items():
        if only is not None and name != only:
            continue
        if not arguments:
            sub.add_parser(name, help=text, description=text)
            continue
        family(name)
        cmd = REGISTERED[name]
        p = sub.add_parser(name, help=text, description=text, epilog=cmd.epilog)
        for names, kw in cmd.arguments:
            p.add_argument(*names, **kw)
        if cmd.common:
            common_options(p)
        parser.subcommands[name] = p
    return parser


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line; an argument the subcommand does not take is refused with that
    subcommand's usage (not the top level's), exit status 2."""
    only = argv[0] if argv and argv[0] in COMMANDS else None
    parser = build_parser(only, arguments=only is not None)
    args, extra = parser.parse_known_args(argv)
    sub = parser.subcommands.get(args.command) if args.command else None
    if extra:
        (sub or parser).error(f"unrecognized arguments: {' '.join(extra)}")
    if sub is not None:
        _check_numbers(args, sub)
    return args


def _check_numbers(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Durations that cannot be negative (nor zero, for an interval or a timeout) are refused at
    once, in one line."""
    for name, least, strict in (
        ("interval", 0.0, True),
        ("wait", 0.0, False),
        ("timeout", 0.0, True),
        ("settle", 0.0, False),
    ):
        value = getattr(args, name, None)
        if value is None:
            continue
        if value != value or value in (float("inf"), float("-inf")) or value < least or (strict and value == least):
            parser.exit(
                2,
                f"cockpit {args.command}: --{name} {value:g}: must be "
                f"{'more than' if strict else 'at least'} {least:g} seconds\n",
            )


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) > 1 and argv[0] not in COMMANDS and not argv[0].startswith("-") and not argv[1].startswith("-"):
        # `cockpit HOST` opens a host and takes one target: a second word means a command was meant
        import difflib

        near = difflib.get_close_matches(argv[0], list(COMMANDS), n=1, cutoff=0.7)
        say(
            f"cockpit: unknown command {argv[0]!r}"
            + (f": did you mean {near[0]!r}?" if near else f": one of {', '.join(sorted(COMMANDS))}"),
            file=sys.stderr,
        )
        return 2
    if not argv or (argv[0] not in COMMANDS and not argv[0].startswith("-")):
        argv = ["open"] + argv
    elif argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version"):
        argv = ["open"] + argv
    return handle(lambda: parse_args(argv))


def entry() -> None:
    """The `cockpit` command: `main`, its output flushed, then out at once. The interpreter's own
    teardown (freeing every module's objects, tens of milliseconds that the OS does at once) would
    be a third of a one-shot `snapshot --json`; nothing is left to release by then: the agent, the
    ledger and the files are closed by `main`."""
    rc = main()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, ValueError):
            pass
    os._exit(rc)
