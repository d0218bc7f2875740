"""What every family of commands shares: `@command` (a subcommand's arguments and handler, in
one place), the common options, the lines and documents printed, the plan confirmed, and
`handle`, through which every failure is one line (a CockpitError exit status 2, never a
traceback). Nothing here imports the monitor or asyncio: a one-shot `snapshot local` starts its
agent first (cockpit/link/early.py)."""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from cockpit.common.errors import CockpitError
from cockpit.common.hosttext import visible


@dataclass
class Command:
    name: str
    handler: Callable[[argparse.Namespace], int]
    arguments: list[tuple[tuple, dict]] = field(default_factory=list)
    common: bool = True  # takes the host options (--layout, --python, --ssh-config, ...)
    epilog: str | None = None  # said after the options in `--help` (exit statuses)


REGISTERED: dict[str, Command] = {}  # by the family modules imported so far


def arg(*names, **kw) -> tuple[tuple, dict]:
    return names, kw


YES = arg("--yes", action="store_true", help="do not ask: the plan is printed and carried out")
JSON = arg("--json", action="store_true", help="print JSON instead of a table")
TARGET = arg(
    "target",
    help="the host: local, demo, an ssh alias, user@host[:port], docker:NAME[@HOST], "
    "podman:NAME[@HOST] or slurm:JOBID[/NODE][@LOGIN-HOST]",
)
READ_ONLY_NOOP = arg(
    "--read-only", action="store_true", help="accepted as by every command; this one never acts on a host anyway"
)


def command(name: str, *arguments, common: bool = True, epilog: str | None = None):
    """Register a subcommand's arguments and handler in one place (its one-line help is with its
    name in `cockpit.cli.COMMANDS`)."""

    def wrap(fn):
        REGISTERED[name] = Command(name, fn, list(arguments), common, epilog)
        return fn

    return wrap


def common_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--layout", metavar="FILE", help="a layout (launch profile): a .yaml path or a shipped name")
    p.add_argument("--python", metavar="PATH", help="the interpreter on the host that runs the agent (default python3)")
    p.add_argument(
        "--trust-python",
        action="store_true",
        help="as root, run the agent's interpreter even where a user other than root can change it",
    )
    p.add_argument("--interval", type=float, default=None, metavar="S", help="sampling interval in seconds (default 1)")
    p.add_argument("--ssh-config", metavar="FILE", help="an ssh config file to read instead of ~/.ssh/config")
    p.add_argument("--known-hosts", metavar="FILE", help="a known_hosts file to use instead of ~/.ssh/known_hosts")
    p.add_argument(
        "--accept-new", action="store_true", help="trust an unknown host key and record it (never a changed one)"
    )
    p.add_argument("--sim", metavar="DIR", help="use the simulated NVML on the host, with its state in DIR there")
    p.add_argument("--read-only", action="store_true", help="watch only: every action (kill, shm clean, dump) is off")
    p.add_argument(
        "--no-forensics",
        action="store_true",
        help="do not gather a stall's forensics (every rank's stack, once per stall) automatically",
    )


def handle(parse: Callable[[], argparse.Namespace]) -> int:
    """Parse the command line (its command's family imported) and run the command's handler;
    every failure is one line on stderr: a CockpitError exit status 2, Ctrl+C 130, a bug or a
    broken install 1. A bad command line is argparse's own exit, status 2."""
    try:
        args = parse()
        return REGISTERED[args.command].handler(args)
    except CockpitError as exc:  # then what it lists (the runs to choose from), one per line
        say("\n".join([f"cockpit: {exc}"] + [f"  {line}" for line in getattr(exc, "lines", ())]), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `cockpit snapshot ... | head`: the reader has what it wanted
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except Exception as exc:  # a bug: still one line, with the way to the details
        if os.environ.get("COCKPIT_DEBUG"):
            raise
        say(
            f"cockpit: internal error: {type(exc).__name__}: {exc} (rerun with COCKPIT_DEBUG=1 for the traceback)",
            file=sys.stderr,
        )
        return 1


def say(*parts, file=None, flush: bool = False) -> None:
    """A line for people: text from the host in it is shown, never acted on (control characters
    made visible), whatever terminal reads it."""
    print(visible(" ".join(str(p) for p in parts), newlines=True), file=file or sys.stdout, flush=flush)


def finite(doc):
    """The document with every NaN and infinity as null: --json is always valid JSON."""
    if isinstance(doc, float):
        return doc if math.isfinite(doc) else None
    if isinstance(doc, dict):
        return {k: finite(v) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [finite(v) for v in doc]
    return doc


def json_text(doc) -> str:
    """The document as --json prints it: NaN and infinities as null, always valid JSON."""
    return json.dumps(finite(doc), indent=2, allow_nan=False)


def print_json(doc) -> None:
    sys.stdout.write(json_text(doc) + "\n")


def confirm(lines: list[str], question: str, yes: bool, json_out: bool = False) -> bool:
    """The plan said, then asked (or taken under --yes). With --json the plan goes to stderr:
    stdout carries the one JSON document only. Without a terminal the answer is stdin's first
    line, as a terminal's would be (`echo n | cockpit kill ...` declines, `yes | ...` goes);
    stdin ended without one, or silent for PIPE_ANSWER_S, is no answer, which declines (a script
    means --yes)."""
    say("\n".join(lines), file=sys.stderr if json_out else sys.stdout)
    if yes:
        return True
    answer = _ask(f"{question} [y/N] ") if sys.stdin is not None and not sys.stdin.closed else ""
    if not answer:
        say("no answer on stdin (a script passes --yes to confirm)", file=sys.stderr)
    return answer.strip().lower() in ("y", "yes")


class Prompt:
    """The terminal as an act's Asker (cockpit/operate/perform.py): the plan printed and asked, or
    taken under --yes (with --json, printed on stderr); what the act tells as it goes on stderr;
    py-spy sent only under --upload-pyspy."""

    def __init__(self, args: argparse.Namespace, upload: bool = False):
        self.args = args
        self.upload = upload

    async def confirm(self, title: str, lines: list[str], question: str) -> bool:
        return confirm(lines, question, getattr(self.args, "yes", False), getattr(self.args, "json", False))

    def found(self, lines: list[str]) -> None:
        for line in lines:
            self.tell(line)

    def tell(self, line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    def under_way(self, text: str) -> None:
        """The terminal keeps quiet while an act goes on: its report follows."""

    async def pyspy(self, then: str) -> bool:
        return self.upload


def declined(nothing: str) -> int:
    """A plan declined at the prompt: said, and exit status 1 (README "Exit status")."""
    say(f"declined: {nothing}", file=sys.stderr)
    return 1


PIPE_ANSWER_S = 10  # how long an answer is waited for on a stdin that is not a terminal


def _ask(prompt: str) -> str:
    """A line from the terminal that Ctrl+C ends at once (KeyboardInterrupt), as anywhere else.
    asyncio.run's own SIGINT handler only cancels a task, which cannot happen while the loop's
    thread waits here; and the kernel may hand the signal to another thread (asyncio's waitpid
    watcher), leaving a plain read() on the terminal uninterrupted. So the wait is a select() on
    the terminal and on a wakeup pipe the signal writes to, whichever thread receives it."""
    import select

    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    before_fd = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    try:
        print(visible(prompt), end="", file=sys.stderr, flush=True)
        tty = sys.stdin.isatty()
        deadline = None if tty else time.monotonic() + PIPE_ANSWER_S
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                print(file=sys.stderr, flush=True)
                return ""  # a pipe that never answers (a script's stdin left open) is no answer
            ready = select.select([sys.stdin, wake_r], [], [], left)[0]
            if sys.stdin in ready:
                break
            if wake_r in ready:
                os.read(wake_r, 512)  # a signal other than SIGINT, its handler run: still asking
        answer = sys.stdin.readline()
        if not answer or not tty:  # a pipe's answer shown, as a terminal shows what was typed
            print(visible(answer.rstrip("\n")), file=sys.stderr, flush=True)
        return answer
    finally:
        signal.set_wakeup_fd(before_fd)
        signal.signal(signal.SIGINT, before)
        os.close(wake_r)
        os.close(wake_w)


def writable(args: argparse.Namespace) -> None:
    if getattr(args, "read_only", False):
        raise CockpitError(f"{args.command}: refused, --read-only disables every action")


def run_async(coro):
    """`asyncio.run`, asyncio imported on the first call: a one-shot `snapshot local` starts its
    agent before that import (cockpit/link/early.py)."""
    import asyncio

    return asyncio.run(coro)


def need_terminal(args: argparse.Namespace) -> None:
    """The full screen needs a terminal (or a browser's, under `cockpit serve`)."""
    if os.environ.get("TEXTUAL_DRIVER"):
        return
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        target = "demo" if args.command == "demo" else getattr(args, "target", "local")
        raise CockpitError(
            f"no terminal to draw the cockpit on: for scripts use `cockpit snapshot {target} --json` (or --text)"
        )
