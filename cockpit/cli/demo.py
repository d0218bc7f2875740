"""`cockpit demo`: the simulated 8-GPU host, its own state folder and port, its run launched on
connect, and at the end every run it launched stopped, verified gone, and its folder removed."""

from __future__ import annotations

import argparse
import signal
import sys

from cockpit.cli.attach import build_monitor, session_options
from cockpit.cli.base import arg, command, need_terminal, run_async, say
from cockpit.common.errors import CockpitError
from cockpit.common.hosttext import count
from cockpit.monitor import demo
from cockpit.runs.layouts import resolve_layout
from cockpit.runs.ledger import record_seen
from cockpit.ui.app import CockpitApp


@command("demo", arg("--no-server", action="store_true", help="do not start the simulated server"))
def cmd_demo(args: argparse.Namespace) -> int:
    """One demo: a state folder of its own, its run launched on connect, and at the end every run
    it launched (relaunches included) stopped and verified gone, and its folder removed."""
    need_terminal(args)
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

    def handler(signum, frame) -> None:
        app.call_later(app.exit)

    for sig in (signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, handler)


def demo_app(args: argparse.Namespace, layout):
    """The demo's cockpit: its own folder and port; its run starts once connected and is the one
    the monitor follows (the ledger gets the verdict seen of it when it is stopped)."""
    layout = demo.with_free_port(layout)
    state = args.sim or demo.new_state()
    demo.save_layout(state, layout)

    async def on_connect(monitor) -> None:
        if not args.no_server:
            monitor.follow(await demo.start_demo(monitor))

    monitor = build_monitor(args, on_connect=on_connect, layout=layout, sim_state=state)
    return CockpitApp(monitor=monitor, read_only=args.read_only), layout, state


async def end_demo(args: argparse.Namespace, app, layout, state: str) -> list[str]:
    """Stop every run the demo launched, verified; remove its folder. Returns what to tell."""
    monitor = app.cockpit.monitor
    if monitor.state.link_state == "up" or monitor.state.seq:
        # the ledger keeps the verdict the screen showed last, not "stopped"
        record_seen(monitor.run, monitor.verdict, monitor.phase, monitor.watchdog.phase_times())
    try:
        stopped, left = await demo.stop_demo_runs(session_options(args, layout, monitor.target, state), layout, state)
    except CockpitError as exc:
        return [f"the demo's runs were not stopped: {exc}; the next `cockpit demo` stops them"]
    lines = [f"demo run not fully stopped: {line}" for line in left]
    if stopped and not left:
        lines.append(f"the demo's {count(stopped, 'run')} stopped, verified gone")
    if not args.sim and not left:
        demo.remove_state(state)
    return lines


async def _reap_stale_demos(args: argparse.Namespace, layout) -> list[str]:
    """A demo whose cockpit was killed (its terminal closed) left its runs: the next demo stops
    them and removes the folder."""
    stale = demo.stale_states()
    left: list[str] = []
    for state in stale:
        try:
            opts = session_options(args, layout, None, state)
            opts.python = sys.executable
            _stopped, not_gone = await demo.stop_demo_runs(opts, layout, state)
        except CockpitError as exc:
            not_gone = [f"{state}: {exc}"]
        left += not_gone
        if not not_gone:
            demo.remove_state(state)
    return left
