"""The `cockpit` command.

    cockpit [TARGET]                 open the cockpit on a host (local, demo, alias, user@host[:port])
    cockpit demo                     the simulated 8-GPU host, started on first use
    cockpit snapshot TARGET --json   one document of the host's state and verdict, for scripts

Each subcommand is registered once, with its arguments and its handler (`@command`). Every
command that talks to a host goes through one HostMonitor (`attached`), so the verdict a script
reads is the one the screen shows. Every user-facing failure is one line on stderr and exit
status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from cockpit import __version__
from cockpit.common.errors import CockpitError
from cockpit.common.hosttext import count, these, visible
from cockpit.common.secrets import mask_argv


@dataclass
class Command:
    name: str
    help: str
    handler: Callable[[argparse.Namespace], int]
    arguments: list[tuple[tuple, dict]] = field(default_factory=list)
    common: bool = True  # takes the host options (--layout, --python, --ssh-config, ...)
    epilog: str | None = None  # said after the options in `--help` (exit statuses)


COMMANDS: dict[str, Command] = {}


def arg(*names, **kw) -> tuple[tuple, dict]:
    return names, kw


YES = arg("--yes", action="store_true", help="do not ask: the plan is printed and carried out")
JSON = arg("--json", action="store_true", help="print JSON instead of a table")
TARGET = arg("target", help="the host: local, demo, an ssh alias, user@host[:port], docker:NAME[@HOST], "
                            "podman:NAME[@HOST] or slurm:JOBID[/NODE][@LOGIN-HOST]")


def command(name: str, help: str, *arguments, common: bool = True, epilog: str | None = None):
    """Register a subcommand: its name, help, arguments and handler in one place."""
    def wrap(fn):
        COMMANDS[name] = Command(name, help, fn, list(arguments), common, epilog)
        return fn
    return wrap


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--layout", metavar="FILE", help="a layout (launch profile): a .yaml path or a shipped name")
    p.add_argument("--python", metavar="PATH", help="the interpreter on the host that runs the agent (default python3)")
    p.add_argument("--trust-python", action="store_true",
                   help="as root, run the agent's interpreter even where a user other than root can change it")
    p.add_argument("--interval", type=float, default=None, metavar="S", help="sampling interval in seconds (default 1)")
    p.add_argument("--ssh-config", metavar="FILE", help="an ssh config file to read instead of ~/.ssh/config")
    p.add_argument("--known-hosts", metavar="FILE", help="a known_hosts file to use instead of ~/.ssh/known_hosts")
    p.add_argument("--accept-new", action="store_true", help="trust an unknown host key and record it (never a changed one)")
    p.add_argument("--sim", metavar="DIR", help="use the simulated NVML on the host, with its state in DIR there")
    p.add_argument("--read-only", action="store_true", help="watch only: every action (kill, shm clean, dump) is off")
    p.add_argument("--no-forensics", action="store_true",
                   help="do not gather a stall's forensics (every rank's stack, once per stall) automatically")


READ_ONLY_NOOP = arg("--read-only", action="store_true",
                     help="accepted as by every command; this one never acts on a host anyway")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """Every subcommand's parser, or with `only` that one's alone (a one-shot command starts its
    work the sooner: building them all is most of the parsing's cost)."""
    parser = argparse.ArgumentParser(prog="cockpit", description="A terminal cockpit for multi-GPU inference hosts.")
    parser.add_argument("--version", action="version", version=f"gpu-cockpit {__version__}")
    sub = parser.add_subparsers(dest="command")
    parser.subcommands = {}
    for cmd in COMMANDS.values():
        if only is not None and cmd.name != only:
            continue
        p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.help, epilog=cmd.epilog)
        for names, kw in cmd.arguments:
            p.add_argument(*names, **kw)
        if cmd.common:
            _common(p)
        parser.subcommands[cmd.name] = p
    return parser


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line; an argument the subcommand does not take is refused with that
    subcommand's usage (not the top level's), exit status 2."""
    parser = build_parser(argv[0] if argv and argv[0] in COMMANDS else None)
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
    for name, least, strict in (("interval", 0.0, True), ("wait", 0.0, False), ("timeout", 0.0, True),
                                ("settle", 0.0, False)):
        value = getattr(args, name, None)
        if value is None:
            continue
        if value != value or value in (float("inf"), float("-inf")) or value < least or (strict and value == least):
            parser.exit(2, f"cockpit {args.command}: --{name} {value:g}: must be "
                           f"{'more than' if strict else 'at least'} {least:g} seconds\n")


# ----------------------------------------------------------------------------- shared parts

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


def print_json(doc) -> None:
    json.dump(finite(doc), sys.stdout, indent=2, allow_nan=False)
    sys.stdout.write("\n")


def _confirm(lines: list[str], question: str, yes: bool, json_out: bool = False) -> bool:
    """The plan said, then asked (or taken under --yes). With --json the plan goes to stderr:
    stdout carries the one JSON document only."""
    say("\n".join(lines), file=sys.stderr if json_out else sys.stdout)
    if yes:
        return True
    if not sys.stdin.isatty():
        raise CockpitError(f"{question}: no terminal to ask on; pass --yes to confirm")
    # asyncio.run's own SIGINT handler only cancels a task, which cannot happen inside input():
    # Ctrl+C at the prompt ends the command at once, as anywhere else
    import signal

    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")
    finally:
        signal.signal(signal.SIGINT, before)


def _writable(args: argparse.Namespace) -> None:
    if getattr(args, "read_only", False):
        raise CockpitError(f"{args.command}: refused, --read-only disables every action")


def run_async(coro):
    """`asyncio.run`, asyncio imported on the first call: a one-shot `snapshot local` starts its
    agent before that import (cockpit/link/early.py)."""
    import asyncio

    return asyncio.run(coro)


def session_options(args: argparse.Namespace, layout=None, target=None, sim_state: str | None = None):
    """The session options of the command line: the one place they are built."""
    from cockpit.host.session import SessionOptions
    from cockpit.link.target import agent_python

    named = layout.python if layout else None
    opts = SessionOptions(
        python=args.python or (agent_python(target, named) if target is not None else named or "python3"),
        python_named=bool(args.python or named),
        interval=args.interval or 1.0,
        ssh_config=args.ssh_config,
        known_hosts=args.known_hosts,
        accept_new=args.accept_new,
        sim_state=args.sim or sim_state,
        trust_python=bool(getattr(args, "trust_python", False) or (layout is not None and layout.trust_python)),
    )
    return opts


def build_monitor(args: argparse.Namespace, on_connect=None, layout=None, sim_state: str | None = None):
    """The host's monitor from the command line: target, layout, options. The demo host is
    watched through the runs it launched only (no process patterns: another demo's processes,
    or anything else on this machine, are not shown or judged); a command other than `demo`
    attaches to the running demo and follows its current run."""
    from cockpit.link.target import parse_target
    from cockpit.monitor.host import HostMonitor
    from cockpit.runs.layouts import resolve_layout

    target = parse_target("demo" if args.command == "demo" else getattr(args, "target", None) or "demo")
    if layout is None:
        layout_name = args.layout or ("demo" if target.kind == "demo" else None)
        layout = resolve_layout(layout_name) if layout_name else None
    watch = None
    if target.kind == "slurm" and not target.node:  # every node of the job, as one run
        from cockpit.monitor.cluster import ClusterMonitor

        return ClusterMonitor(target, session_options(args, layout, target), layout)
    if target.kind == "demo":
        from cockpit.monitor import demo

        if sim_state is None and not args.sim:
            sim_state = demo.need_live_state()  # the demo running now: its folder is prepared
            layout = demo.layout_of(sim_state, layout)
        else:
            demo.prepare_host(layout, args.sim or sim_state)
        watch, follow = demo.follower(layout, args.sim or sim_state)
        on_connect = on_connect or follow
    opts = session_options(args, layout, target, sim_state)
    monitor = HostMonitor(target, opts, layout, on_connect=on_connect, watch=watch)
    monitor.forensics_on = forensics_allowed(args, layout)
    return monitor


def forensics_allowed(args: argparse.Namespace, layout) -> bool:
    """A stall's forensics are gathered automatically unless --read-only, --no-forensics or the
    layout's `auto_dump: false` says no."""
    return not (getattr(args, "read_only", False) or getattr(args, "no_forensics", False)) \
        and (layout is None or layout.auto_dump)


@asynccontextmanager
async def attached(args: argparse.Namespace):
    """Attach to the host, do, close: every one-shot command's lifecycle."""
    monitor = build_monitor(args)
    async with monitor.attached():
        yield monitor


def _progress(phase, verdict) -> None:
    say(f"  {phase or ''}  {verdict}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- the TUI

def _need_terminal(args: argparse.Namespace) -> None:
    """The full screen needs a terminal (or a browser's, under `cockpit serve`)."""
    if os.environ.get("TEXTUAL_DRIVER"):
        return
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        target = "demo" if args.command == "demo" else getattr(args, "target", "local")
        raise CockpitError(f"no terminal to draw the cockpit on: for scripts use "
                           f"`cockpit snapshot {target} --json` (or --text)")


@command("open", "open the cockpit on a host (the default command)",
         arg("target", nargs="?", default="local", help="the host (default: local)"))
def cmd_open(args: argparse.Namespace) -> int:
    from cockpit.ui.app import CockpitApp

    _need_terminal(args)
    app = CockpitApp(monitor=build_monitor(args), read_only=args.read_only)
    app.run()
    if app.error:
        raise CockpitError(app.error)
    return 0


@command("demo", "open the cockpit on the simulated 8-GPU host",
         arg("--no-server", action="store_true", help="do not start the simulated server"))
def cmd_demo(args: argparse.Namespace) -> int:
    """One demo: a state folder of its own, its run launched on connect, and at the end every run
    it launched (relaunches included) stopped and verified gone, and its folder removed."""
    from cockpit.runs.layouts import resolve_layout

    _need_terminal(args)
    layout = resolve_layout(args.layout or "demo")
    for line in run_async(_reap_stale_demos(args, layout)):
        say(f"cockpit: an earlier demo's run is not fully stopped: {line}", file=sys.stderr)
    app, layout, state = demo_app(args, layout)
    _end_on_hangup(app)
    try:
        app.run()
    finally:
        for line in run_async(end_demo(args, app, layout, state)):
            try:
                say(f"cockpit: {line}", file=sys.stderr)
            except OSError:
                pass  # the terminal is gone (closed window): the runs are stopped all the same
    if app.error:
        raise CockpitError(app.error)
    return 0


def _end_on_hangup(app) -> None:
    """A closed terminal window (SIGHUP) or a plain kill (SIGTERM) ends the demo as q does, so its
    runs are stopped rather than left behind."""
    import signal

    def handler(signum, frame) -> None:
        app.call_later(app.exit)

    for sig in (signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, handler)


def demo_app(args: argparse.Namespace, layout):
    """The demo's cockpit: its own folder and port; its run starts once connected and is the one
    the monitor follows (the ledger gets the verdict seen of it when it is stopped)."""
    from cockpit.monitor import demo
    from cockpit.ui.app import CockpitApp

    layout = demo.with_free_port(layout)
    state = args.sim or demo.new_state()
    demo.save_layout(state, layout)

    async def on_connect(monitor) -> None:
        if not args.no_server:
            monitor.follow(await demo.start_demo(monitor.session, layout, state))

    monitor = build_monitor(args, on_connect=on_connect, layout=layout, sim_state=state)
    return CockpitApp(monitor=monitor, read_only=args.read_only), layout, state


async def end_demo(args: argparse.Namespace, app, layout, state: str) -> list[str]:
    """Stop every run the demo launched, verified; remove its folder. Returns what to tell."""
    from cockpit.monitor import demo
    from cockpit.runs.ledger import record_seen

    monitor = app.cockpit.monitor
    if monitor.state.link_state == "up" or monitor.state.seq:
        # the ledger keeps the verdict the screen showed last, not "stopped"
        record_seen(monitor.run, monitor.verdict, monitor.phase, monitor.watchdog.phase_times())
    try:
        stopped, left = await _stop_demo_runs(monitor.session.opts, layout, state)
    except CockpitError as exc:
        return [f"the demo's runs were not stopped: {exc}; the next `cockpit demo` stops them"]
    lines = [f"demo run not fully stopped: {line}" for line in left]
    if stopped and not left:
        lines.append(f"the demo's {count(stopped, 'run')} stopped, verified gone")
    if not args.sim and not left:
        demo.remove_state(state)
    return lines


async def _stop_demo_runs(opts, layout, sim_state: str) -> tuple[int, list[str]]:
    """Every run this demo launched (the first and each relaunch) ends with it, through a monitor
    of its own (the screen's is closed by now) and the one stop workflow."""
    from cockpit.host.session import WatchList
    from cockpit.link.target import parse_target
    from cockpit.monitor import demo
    from cockpit.monitor.host import HostMonitor

    monitor = HostMonitor(parse_target("demo"), opts, layout, watch=WatchList(patterns=[]), on_connect=_no_run)
    await monitor.session.connect()
    try:
        return await demo.stop_demo(monitor, sim_state)
    finally:
        await monitor.close()


async def _no_run(_monitor) -> None:
    """A monitor that follows no run until told (the demo's end names each run it stops)."""


async def _reap_stale_demos(args: argparse.Namespace, layout) -> list[str]:
    """A demo whose cockpit was killed (its terminal closed) left its runs: the next demo stops
    them and removes the folder."""
    from cockpit.monitor import demo

    stale = demo.stale_states()
    left: list[str] = []
    for state in stale:
        try:
            opts = session_options(args, layout, None, state)
            opts.python = sys.executable
            _stopped, not_gone = await _stop_demo_runs(opts, layout, state)
        except CockpitError as exc:
            not_gone = [f"{state}: {exc}"]
        left += not_gone
        if not not_gone:
            demo.remove_state(state)
    return left


# ----------------------------------------------------------------------------- headless

@command("snapshot", "render the host's state once, without a terminal, and exit",
         arg("target", nargs="?", help="the host; omit it with --replay"),
         arg("--json", action="store_true", help="print the JSON document (docs/snapshot-schema.md)"),
         arg("--svg", metavar="FILE", help="save the cockpit screen as SVG"),
         arg("--text", metavar="FILE", nargs="?", const="-", help="the screen as text (to FILE, or stdout)"),
         arg("--size", default="160x50", metavar="COLSxROWS", help="screen size for --svg/--text (default 160x50)"),
         arg("--wait", type=float, default=None, metavar="S",
             help="judge for exactly S seconds (0: the instant look); by default it looks until the verdict "
                  "is decided, at most the layout's stall window (docs/snapshot-schema.md)"),
         arg("--replay", metavar="FILE.json", help="render a saved --json document instead of a live host"),
         arg("--fleet", metavar="FLEET.yaml", help="every host of a fleet file, as one JSON document"),
         arg("--hosts", metavar="A,B,C", help="a fleet of these hosts, as one JSON document"),
         arg("--timeout", type=float, default=30.0, metavar="S",
             help="with --fleet/--hosts: give up on hosts not answering after S seconds (default 30)"))
def cmd_snapshot(args: argparse.Namespace) -> int:
    if not (args.json or args.svg or args.text):
        raise CockpitError("say what to make: --json, --svg FILE or --text")
    if args.fleet or args.hosts:
        from cockpit.monitor.fleet import take_fleet_snapshot

        if not args.json or args.svg or args.text or args.target:
            raise CockpitError("a fleet snapshot is --json only, with no target: snapshot --fleet FLEET.yaml --json")
        print_json(run_async(take_fleet_snapshot(_fleet_monitor(args), args.timeout)))
        return 0
    if args.replay is None and not args.target:
        raise CockpitError("name a target (local, demo, an ssh alias, user@host[:port]) or --replay FILE.json")
    if args.svg or args.text:
        from cockpit.ui.headless import check_output

        for option, path in (("--svg", args.svg), ("--text", args.text)):
            if path and path != "-":
                check_output(option, path)
        from cockpit.operate.snapshot import monitor_doc
        from cockpit.runs.layouts import resolve_layout
        from cockpit.ui.app import CockpitApp
        from cockpit.ui.headless import render

        size = _size(args.size)
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
    from cockpit.link.target import agent_python, parse_target

    target = parse_target(args.target)
    if target.kind == "local" and not args.layout:
        from cockpit.agent import agent_argv
        from cockpit.link import early
        from cockpit.link.target import python_checked

        python = args.python or agent_python(target, None)
        early.start(*agent_argv(python, args.interval or 1.0, args.sim,
                                python_checked(target, python, getattr(args, "trust_python", False))))


async def _snapshot_doc(args: argparse.Namespace) -> dict:
    from cockpit.operate.snapshot import take_snapshot

    return await take_snapshot(build_monitor(args), wait=args.wait)


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
        raise CockpitError(f"{path}:{getattr(exc, 'lineno', 1)}: not a JSON snapshot ({exc.msg}): make one with snapshot --json") from None
    if not isinstance(doc, dict) or not str(doc.get("schema", "")).startswith("gpu-cockpit.snapshot/"):
        raise CockpitError(f"{path}:1: not a gpu-cockpit snapshot (no schema field): make one with snapshot --json")
    return doc


# ----------------------------------------------------------------------------- many hosts

def _fleet_monitor(args: argparse.Namespace):
    """The fleet named by a file or --hosts, with the command line's options for every host."""
    from cockpit.monitor.fleet import FleetMonitor, fleet_from_hosts, load_fleet

    path = getattr(args, "fleet_file", None) or getattr(args, "fleet", None)
    if bool(path) == bool(args.hosts):
        raise CockpitError("name the hosts: a fleet file (FLEET.yaml) or --hosts a,b,c, not both")
    fleet = load_fleet(path) if path else fleet_from_hosts(args.hosts, args.layout, args.python)
    if path and (args.layout or args.python):
        for host in fleet.hosts:
            host.layout = host.layout or args.layout
            host.python = host.python or args.python
    if getattr(args, "concurrency", None):
        if args.concurrency < 1:
            raise CockpitError("--concurrency: at least 1")
        fleet.concurrency = args.concurrency
    if args.interval:
        fleet.interval = args.interval
    return FleetMonitor(fleet, session_options(args))


@command("fleet", "one row per host of a fleet; enter opens a host's cockpit",
         arg("fleet_file", nargs="?", metavar="FLEET.yaml", help="the fleet file (docs/fleet.md)"),
         arg("--hosts", metavar="A,B,C", help="these hosts instead of a fleet file"),
         arg("--concurrency", type=int, default=None, metavar="N", help="connections opened at once (default 16)"))
def cmd_fleet(args: argparse.Namespace) -> int:
    from cockpit.ui.fleet import FleetApp

    fleet = _fleet_monitor(args)
    _need_terminal(args)
    FleetApp(fleet, read_only=args.read_only).run()
    return 0


@command("serve", "serve the cockpit to a browser (textual-serve), on 127.0.0.1 by default, behind a token",
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
    from cockpit.serve import serve

    return serve(args)


@command("exporter", "serve the fleet's verdicts as Prometheus metrics (on 127.0.0.1 unless --listen says otherwise)",
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
    from cockpit import exporter

    if args.print_rules:
        sys.stdout.write(exporter.RULES.read_text())
        return 0
    return exporter.cmd_exporter(args, _fleet_monitor(args))


# ----------------------------------------------------------------------------- actions

@command("kill", "kill the run (or one process), then verify it is gone", TARGET,
         arg("--pid", type=int, help="kill this process (and what it started, as its user) instead of the run "
                                     "found; how to choose when two runs are found"),
         arg("--wait", type=float, default=None, metavar="S", help="seconds between SIGTERM and SIGKILL (default 10)"),
         YES, JSON)
def cmd_kill(args: argparse.Namespace) -> int:
    from cockpit.actions import kill as actions
    from cockpit.runs.run import process_scope

    _writable(args)

    async def go() -> dict | None:
        async with attached(args) as monitor:
            session = monitor.session
            scope = process_scope(args.pid) if args.pid else monitor.scope()
            plan = await actions.plan_kill(session, scope)
            if not plan.entries:
                why = "; ".join(plan.notes + [f"pid {f['root']} left alone: {f['why']}" for f in plan.foreign])
                raise CockpitError(f"nothing to kill on {session.target.label}: no process of the run is alive"
                                   + (f" ({why})" if why else "")
                                   if not args.pid else f"no process {args.pid} on {session.target.label}")
            if not _confirm(plan.describe(), f"kill {these(len(plan.entries), 'process', 'processes')}?", args.yes,
                            args.json):
                return None
            return await monitor.stop(plan, "cockpit kill: asked by the operator", args.wait, whole_run=not args.pid)

    report = run_async(go())
    if report is None:
        print("nothing was signalled")
        return 1
    if args.json:
        print_json(report)
    else:
        say("\n".join([report["summary"]] + actions.describe_kill(report)))
    return 0 if report["verified"] else 3


@command("shm", "audit the host's /dev/shm; --clean removes what is safe to remove", TARGET,
         arg("--dir", default="/dev/shm",
             help="the shm folder (default /dev/shm); cleaning another folder needs --yes-other-dir or a yes asked"),
         arg("--clean", action="store_true",
             help="remove files named like an inference run's (nccl-, torch_, psm_, sgl_shm_, vllm_, MPI...), "
                  "owned by the run's user, held by no process, whose creator is dead; the rest is kept, with why"),
         YES, arg("--yes-other-dir", action="store_true", help="confirm cleaning a --dir other than /dev/shm"), JSON)
def cmd_shm(args: argparse.Namespace) -> int:
    from cockpit.actions import kill as actions

    if args.clean:
        _writable(args)
    def refuse_other(folder: str) -> None:
        if args.clean and not args.yes_other_dir and not sys.stdin.isatty():
            raise CockpitError(f"--dir {args.dir} is not /dev/shm ({folder}): pass --yes-other-dir to clean it "
                               f"(--yes alone does not)")

    if os.path.normpath(args.dir) != actions.SHM_DEFAULT:
        refuse_other(args.dir)

    async def go():
        async with attached(args) as monitor:
            session = monitor.session
            audit = await actions.shm_audit(session, args.dir)
            other_dir = not audit.get("default", os.path.normpath(args.dir) == actions.SHM_DEFAULT)
            if other_dir:  # the folder as the host resolves it: `/dev/../dev/shm` is /dev/shm, a symlink is not
                refuse_other(audit["folder"])
            if not args.clean:
                return audit, None
            chosen = [actions.listed(e) for e in audit["entries"] if e["removable"]]
            if not args.json:
                say("\n".join(actions.describe_shm(audit)))
            if not chosen:
                return audit, {"removed": [], "skipped": [], "freed_bytes": 0}
            if not _confirm([f"  rm {visible(e['name'])}" for e in chosen],
                            f"remove {these(len(chosen), 'entry', 'entries')} of {audit['folder']}?", args.yes,
                            args.json):
                return audit, None
            if other_dir and not args.yes_other_dir and not _confirm(
                    [], f"{audit['folder']} is not /dev/shm: clean it anyway (--yes does not answer this; "
                        f"--yes-other-dir does)?", False):
                return audit, None
            return audit, await actions.shm_clean(session, chosen, audit["folder"], other_dir=other_dir)

    audit, cleaned = run_async(go())
    if args.json:
        print_json({"audit": audit, "clean": cleaned,
                    "summary": actions.summarize_clean(cleaned) if cleaned is not None else None})
    elif cleaned is None:
        if not args.clean:
            say("\n".join(actions.describe_shm(audit)))
    else:
        say("\n".join(actions.describe_clean(cleaned)))
    return 0


@command("dump", "py-spy stack dumps of every rank, grouped", TARGET,
         arg("--upload-pyspy", action="store_true",
             help="send this install's py-spy when the host has none (what is sent, and where, is said first)"),
         arg("--full", "--native", dest="full", action="store_true",
             help="every frame of each group's main thread, the native ones unfolded"),
         arg("--pid", type=int, metavar="ROOT", help="dump this run (its root process and what it started) instead of "
                                                     "the run found; how to choose when two runs are found"),
         JSON)
def cmd_dump(args: argparse.Namespace) -> int:
    from cockpit.actions import dumps, kill

    _writable(args)

    async def go():
        async with attached(args) as monitor:
            session = monitor.session
            plan = await kill.member_plan(session, monitor.run, args.pid, "dump")  # as the kill finds it
            members, left = kill.of_run(session.state, plan)
            for line in [f"the run: {plan.rule}"] + left:
                print(visible(line), file=sys.stderr, flush=True)
            ranks = dumps.dump_targets(session.state, members)
            if not ranks:
                raise CockpitError(f"no rank of the run to dump on {session.target.label}: no watched process of it "
                                   f"is alive")
            return await dumps.dump_ranks(session, ranks, monitor.run.folder_name(monitor.target.label), upload=args.upload_pyspy,
                                          say=lambda line: print(line, file=sys.stderr, flush=True))

    result = run_async(go())
    if args.json:
        print_json(result.as_json())
    else:
        say("\n".join(result.report(full=args.full)))
        say(f"raw dumps: {result.folder}")
    return 0


@command("bundle", "one .tar.gz of a hang, in the run's folder: stacks, NCCL RAS, flight recorder, nvidia-smi -q, "
                   "Xid lines, log tail, metrics, versions, verdict, manifest", TARGET,
         arg("--wait", type=float, default=None, metavar="S",
             help="judge for exactly S seconds first (default: until the verdict is decided, as snapshot does)"),
         JSON)
def cmd_bundle(args: argparse.Namespace) -> int:
    from cockpit.operate import bundle

    async def go():
        async with attached(args) as monitor:
            await monitor.look(args.wait)
            return await bundle.make_bundle(monitor, read_only=args.read_only)

    result = run_async(go())
    if args.json:
        print_json(result.doc())
    else:
        say("\n".join(bundle.describe(result)))
    return 0


@command("flightrec", "trigger torch's flight-recorder dump on every rank and compare their last collectives",
         TARGET, arg("--no-trigger", action="store_true", help="read the dumps already there (e.g. from a timeout)"),
         arg("--pid", type=int, metavar="ROOT", help="this run (its root process and what it started) instead of the "
                                                     "run found; how to choose when two runs are found"),
         JSON)
def cmd_flightrec(args: argparse.Namespace) -> int:
    from cockpit.actions import dumps
    from cockpit.read import flightrec

    if not args.no_trigger:
        _writable(args)

    async def go():
        async with attached(args) as monitor:
            if not dumps.recorder_pids(monitor.state):
                raise CockpitError(f"no rank on {monitor.target.label}: no watched process is alive")
            return await dumps.collect(monitor.session, monitor.run, trigger=not args.no_trigger, root=args.pid)

    answer, result = run_async(go())
    if args.json:
        print_json({"ranks": {r: {k: v for k, v in d.items() if k != "entries"} for r, d in answer["ranks"].items()},
                    "problems": answer.get("problems"), "comparison": result})
    else:
        say("\n".join(flightrec.describe(answer, result)))
    return 0 if answer.get("armed") else 3


def _on_off(args: argparse.Namespace) -> None:
    both = sorted(set(args.on) & set(args.off))
    if both:
        raise CockpitError(f"--on {both[0]} --off {both[0]}: a flag set cannot be both on and off: keep one of them")


def _spec(args: argparse.Namespace, layout):
    from cockpit.runs.spec import default_spec

    spec = default_spec(layout)
    _on_off(args)
    for name in args.on + args.off:
        if name not in layout.flag_sets:
            raise CockpitError(f"{layout.path}: no flag set {name!r} (flag sets: {', '.join(layout.flag_sets) or 'none'})")
    spec.enabled = [n for n in layout.flag_sets if (n in spec.enabled or n in args.on) and n not in args.off]
    for item in args.set:
        name, sep, value = item.partition("=")
        if not sep or name not in layout.params:
            raise CockpitError(f"--set {item!r}: expected NAME=VALUE with NAME one of {', '.join(layout.params) or 'no parameters'}")
        spec.params[name] = value
    return spec


@command("launch", "(re)launch the layout's server with flag sets toggled, and watch it", TARGET,
         arg("--on", action="append", default=[], metavar="SET", help="turn a flag set on (repeatable)"),
         arg("--off", action="append", default=[], metavar="SET", help="turn a flag set off (repeatable)"),
         arg("--set", action="append", default=[], metavar="NAME=VALUE", help="a parameter's value"),
         arg("--no-clean-shm", action="store_true", help="leave /dev/shm alone between runs"),
         arg("--timeout", type=float, default=900, metavar="S", help="give up watching after S seconds"),
         arg("--settle", type=float, default=0, metavar="S", help="keep watching S seconds after ready"),
         YES, arg("--json", action="store_true", help="print the run's ledger row as JSON instead of lines"))
def cmd_launch(args: argparse.Namespace) -> int:
    from cockpit.actions import launch
    from cockpit.operate import relaunch
    from cockpit.runs.spec import build_argv

    _writable(args)
    _on_off(args)
    if not args.layout and args.target != "demo":
        raise CockpitError("launch needs --layout: the launch profile to run")

    async def go():
        async with attached(args) as monitor:
            session, layout = monitor.session, monitor.layout
            spec = _spec(args, layout)
            argv = build_argv(layout, spec, launch.launch_python(layout, session)) + launch.sim_flags(layout, session)
            plan, names, lines = await relaunch.plan_relaunch(monitor, clean_shm=not args.no_clean_shm)
            if not _confirm(lines + ["then launched:", "  " + shlex.join(mask_argv(argv))], "launch?", args.yes,
                            args.json):
                return None
            return await relaunch.run_variant(monitor, spec, args.timeout, clean_shm=not args.no_clean_shm,
                                            progress=_progress, settle=args.settle, plan=plan, shm=names)

    row = run_async(go())
    if row is None:
        return 1
    if args.json:
        from cockpit.common.secrets import mask_record

        print_json(mask_record(row))  # secrets masked, as in the ledger
        return relaunch.exit_status([row["outcome"]])
    say(row["summary"])
    say(f"{row['run_id']}: {row['outcome']}")
    for line in row["evidence"]:
        say(f"  {line}")
    say(f"log: {row['log']}")
    return relaunch.exit_status([row["outcome"]])


@command("ablate", "each on/off combination of flag sets in turn, then a table of outcomes", TARGET,
         arg("--vary", required=True, metavar="SET,SET", help="flag sets to switch on and off"),
         arg("--timeout", type=float, default=900, metavar="S", help="per combination"),
         YES, JSON)
def cmd_ablate(args: argparse.Namespace) -> int:
    from cockpit.operate import relaunch
    from cockpit.runs.spec import combinations

    _writable(args)
    vary = [v for v in args.vary.split(",") if v]

    async def go():
        async with attached(args) as monitor:
            specs = combinations(monitor.layout, vary)
            plan, names, lines = await relaunch.plan_relaunch(monitor)
            if not _confirm(lines + [f"  {','.join(s.enabled) or '(no flag sets)'}" for s in specs],
                            f"run {these(len(specs), 'launch', 'launches')} one after another (each kills the one before)?",
                            args.yes, args.json):
                return None
            return await relaunch.ablate(monitor, vary, args.timeout, progress=_progress, first_plan=plan,
                                       first_shm=names)

    rows = run_async(go())
    if rows is None:
        return 1
    if args.json:
        print_json(rows)
    else:
        say("\n".join(relaunch.describe_ablation(rows, vary)))
    return relaunch.exit_status([r["outcome"] for r in rows])


BISECT_EXITS = ("exit status: 0 the smallest failing set found; 1 not confirmed; 2 bad input or an error; "
                "3 no failure reproduced with the failing configuration; 4 the good configuration fails too; "
                "5 the launch budget spent first; 130 interrupted (Ctrl+C: the current run is stopped, a second "
                "call with the same arguments resumes)")


def _names(text: str | None) -> list[str] | None:
    return None if text is None else [v for v in text.split(",") if v]


@command("bisect", "delta debugging (ddmin) over flag sets: the smallest set of them that still hangs", TARGET,
         arg("--vary", metavar="SET,SET", help="the flag sets (and parameters: NAME, or NAME=GOOD_VALUE) to search; "
                                               "default every flag set that differs between the two configurations"),
         arg("--good", metavar="SET,SET", default=None,
             help="the good configuration's flag sets (default none); the failing one is the layout's enabled sets "
                  "plus those --vary names"),
         arg("--repeat", type=int, default=1, metavar="N",
             help="a candidate passes only after N clean launches (flaky hangs); a failure is final"),
         arg("--budget", type=int, default=None, metavar="LAUNCHES", help="launch at most this many (resumed ones count)"),
         arg("--settle", type=float, default=None, metavar="S",
             help="a launch passes once ready (or serving) for S seconds (default 10)"),
         arg("--timeout", type=float, default=900, metavar="S", help="per launch: not ready by then fails"),
         arg("--fresh", action="store_true", help="start again instead of resuming the same bisect from the ledger"),
         YES, JSON, epilog=BISECT_EXITS)
def cmd_bisect(args: argparse.Namespace) -> int:
    from cockpit.operate import bisect, relaunch
    from cockpit.runs.bisect import DEFAULT_SETTLE_S, EXIT, check_counts, make_plan

    _writable(args)
    check_counts(args.repeat, args.budget)  # before connecting
    if not args.layout and args.target != "demo":
        raise CockpitError("bisect needs --layout: the launch profile whose flag sets to search")

    async def go():
        import asyncio
        import signal

        async with attached(args) as monitor:
            plan = make_plan(monitor.layout, monitor.target.label, good=_names(args.good), vary=_names(args.vary),
                             repeat=args.repeat, budget=args.budget,
                             settle=DEFAULT_SETTLE_S if args.settle is None else args.settle)
            before = None if args.fresh else bisect.resumable(monitor.layout, plan)
            first, names, kill_lines = await relaunch.plan_relaunch(monitor)
            if not _confirm(bisect.describe_plan(plan, before) + kill_lines, "bisect (each launch kills the one before)?", args.yes, args.json):
                return None
            asked = []

            def interrupt() -> None:
                if not asked:
                    say("interrupted: the current run is stopped, then the bisect ends (a second call resumes)",
                        file=sys.stderr, flush=True)
                asked.append(True)

            loop = asyncio.get_running_loop()
            loop.add_signal_handler(signal.SIGINT, interrupt)
            try:
                return await bisect.bisect(monitor, plan, args.timeout, progress=_progress, first_plan=first,
                                           first_shm=names, interrupted=lambda: bool(asked), fresh=args.fresh)
            finally:
                loop.remove_signal_handler(signal.SIGINT)

    doc = run_async(go())
    if doc is None:
        return 1
    if args.json:
        print_json(doc)
    else:
        say("\n".join(bisect.describe_bisect(doc)))
    return EXIT[doc["status"]]


@command("runs", "the ledger: every launch of a layout and what became of it",
         arg("--layout", required=True, metavar="FILE",
             help="the layout whose runs to list: a .yaml path or a shipped name (demo, sglang-tp8, vllm-tp8)"),
         JSON, READ_ONLY_NOOP, common=False)
def cmd_runs(args: argparse.Namespace) -> int:
    from cockpit.runs import ledger as runs
    from cockpit.runs.layouts import resolve_layout

    layout = resolve_layout(args.layout)
    rows = runs.read_ledger(layout)
    if args.json:
        print_json(rows)
    else:
        say("\n".join(runs.describe_ledger(rows, bisects=runs.read_bisects(layout))))
    return 0


@command("explain", "post-mortem of a saved server log: the phases reached, the rank that failed and why",
         arg("log", metavar="LOG", help="the server's log file (.gz is fine; - reads stdin)"),
         arg("--engine", choices=["sglang", "vllm", "auto"], default="auto",
             help="whose log it is (default: detected from the lines)"),
         JSON, READ_ONLY_NOOP, common=False)
def cmd_explain(args: argparse.Namespace) -> int:
    from cockpit.judge.explain import SILENT_S, describe, explain, read_log, silence
    from cockpit.runs.ledger import stall_window_of

    window = stall_window_of(args.log, SILENT_S) if args.log != "-" else SILENT_S
    result = explain(read_log(args.log, progress=True), getattr(args, "engine", None) or "auto", silence(args.log), window)
    result["window_s"] = window
    if getattr(args, "json", False):
        print(json.dumps(result, indent=2))
    else:
        print(visible("\n".join(describe(result)), newlines=True))
    return 1 if result["verdict"]["name"] == "not a server log" else 0


# ----------------------------------------------------------------------------- entry point

def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) > 1 and argv[0] not in COMMANDS and not argv[0].startswith("-") and not argv[1].startswith("-"):
        # `cockpit HOST` opens a host and takes one target: a second word means a command was meant
        import difflib

        near = difflib.get_close_matches(argv[0], list(COMMANDS), n=1, cutoff=0.7)
        say(f"cockpit: unknown command {argv[0]!r}" + (f": did you mean {near[0]!r}?" if near else
            f": one of {', '.join(sorted(COMMANDS))}"), file=sys.stderr)
        return 2
    if not argv or (argv[0] not in COMMANDS and not argv[0].startswith("-")):
        argv = ["open"] + argv
    elif argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version"):
        argv = ["open"] + argv
    args = parse_args(argv)
    try:
        return COMMANDS[args.command].handler(args)
    except CockpitError as exc:
        say(f"cockpit: {exc}", file=sys.stderr)
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
        say(f"cockpit: internal error: {type(exc).__name__}: {exc} (rerun with COCKPIT_DEBUG=1 for the traceback)",
              file=sys.stderr)
        return 1


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


if __name__ == "__main__":
    entry()
