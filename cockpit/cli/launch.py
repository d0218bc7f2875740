"""The commands that launch the layout's server and watch it to an outcome: `launch` (one, flag
sets toggled), `ablate` (each on/off combination in turn), `bisect` (which flag sets make the
launch hang, with its odds, a flaky hang too). Each launch kills the one before it, as planned and
asked."""

from __future__ import annotations

import argparse
import asyncio
import os
import select
import signal
import sys

from cockpit.cli.attach import attached
from cockpit.cli.base import JSON, TARGET, YES, Prompt, arg, command, declined, json_text, run_async, say, writable
from cockpit.common.errors import CockpitError
from cockpit.common.secrets import mask_record
from cockpit.operate import bisect, perform, relaunch
from cockpit.runs.bisect import DEFAULT_CONFIDENCE, DEFAULT_SETTLE_S, EXIT, check_counts, make_plan
from cockpit.runs.spec import default_spec


class Interrupt:
    """SIGINT, SIGTERM, SIGHUP and a closed output (a pipe whose reader left: `| head`, a Ctrl+C
    that ended `| tail`; a closed terminal) during a launch, an ablation or a bisect: each asks the
    workflow to stop the run under way as Ctrl+C does (its watch ends `interrupted`, the run it
    launched is stopped, verified gone and written in the ledger), then the command exits 130.
    Called, it says whether that was asked; stdout is looked at each time (a pipe's writing end
    polls POLLERR once its reader is gone), stderr when a progress line fails to go out."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self, what: str):
        self.what = what
        self.why: str | None = None
        self.last = ""
        self.poll = select.poll()
        try:
            self.poll.register(sys.stdout.fileno(), 0)
        except (AttributeError, ValueError, OSError):  # no stdout at all (started with it closed)
            pass

    def __enter__(self) -> Interrupt:
        loop = asyncio.get_running_loop()
        for sig in self.SIGNALS:
            loop.add_signal_handler(sig, self.ask, sig.name)
        return self

    def __exit__(self, *exc) -> None:
        loop = asyncio.get_running_loop()
        for sig in self.SIGNALS:
            loop.remove_signal_handler(sig)

    def ask(self, why: str) -> None:
        if self.why is None:
            self.why = why
            self.progress(None, f"interrupted ({why}): the run under way is stopped, then the {self.what} ends")

    def __call__(self) -> bool:
        if self.why is None and any(ev & (select.POLLERR | select.POLLHUP) for _, ev in self.poll.poll(0)):
            self.ask("the output was closed")
        return self.why is not None

    def progress(self, phase, verdict) -> None:
        """The progress on stderr, a line per change of state (a sample that says the same again
        prints nothing)."""
        line = f"  {phase or ''}  {verdict}"
        if line == self.last:
            return
        self.last = line
        try:
            say(line, file=sys.stderr, flush=True)
        except OSError:  # stderr closed too (a pipe gone, a terminal hung up): the stop goes on unsaid
            if self.why is None:
                self.why = "the output was closed"

    def out(self, text: str, raw: bool = False) -> None:
        """The command's result on stdout (`raw`: a JSON document, as it is), unless it was closed."""
        try:
            if raw:
                sys.stdout.write(text + "\n")
                sys.stdout.flush()
            else:
                say(text, flush=True)
        except OSError:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _on_off(args: argparse.Namespace) -> None:
    both = sorted(set(args.on) & set(args.off))
    if both:
        raise CockpitError(f"--on {both[0]} --off {both[0]}: a flag set cannot be both on and off: keep one of them")


def _spec(args: argparse.Namespace, layout):
    spec = default_spec(layout)
    _on_off(args)
    for name in args.on + args.off:
        if name not in layout.flag_sets:
            raise CockpitError(
                f"{layout.path}: no flag set {name!r} (flag sets: {', '.join(layout.flag_sets) or 'none'})"
            )
    spec.enabled = [n for n in layout.flag_sets if (n in spec.enabled or n in args.on) and n not in args.off]
    for item in args.set:
        name, sep, value = item.partition("=")
        if not sep or name not in layout.params:
            raise CockpitError(
                f"--set {item!r}: expected NAME=VALUE with NAME one of {', '.join(layout.params) or 'no parameters'}"
            )
        spec.params[name] = value
    return spec


@command(
    "launch",
    TARGET,
    arg("--on", action="append", default=[], metavar="SET", help="turn a flag set on (repeatable)"),
    arg("--off", action="append", default=[], metavar="SET", help="turn a flag set off (repeatable)"),
    arg("--set", action="append", default=[], metavar="NAME=VALUE", help="a parameter's value"),
    arg("--no-clean-shm", action="store_true", help="leave /dev/shm alone between runs"),
    arg("--timeout", type=float, default=900, metavar="S", help="give up watching after S seconds"),
    arg("--settle", type=float, default=0, metavar="S", help="keep watching S seconds after ready"),
    YES,
    arg("--json", action="store_true", help="print the run's ledger row as JSON instead of lines"),
)
def cmd_launch(args: argparse.Namespace) -> int:
    writable(args)
    _on_off(args)
    if not args.layout and args.target != "demo":
        raise CockpitError("launch needs --layout: the launch profile to run")

    async def go():
        async with attached(args) as monitor:
            spec = _spec(args, monitor.layout)
            agreed = await perform.agree_launch(monitor, Prompt(args), spec, clean_shm=not args.no_clean_shm)
            if agreed is None:
                return None
            with Interrupt("launch") as stop:
                row = await relaunch.run_variant(
                    monitor,
                    spec,
                    args.timeout,
                    clean_shm=not args.no_clean_shm,
                    progress=stop.progress,
                    settle=args.settle,
                    plan=agreed.plan,
                    shm=agreed.shm,
                    interrupted=stop,
                )
                if stop():
                    await relaunch.end_own_run(monitor, "stopped: the launch is interrupted", stop.progress)
                return row, stop

    done = run_async(go())
    if done is None:
        return declined("nothing was launched")
    row, stop = done
    if args.json:
        stop.out(json_text(mask_record(row)), raw=True)  # secrets masked, as in the ledger
    else:
        stop.out("\n".join(relaunch.describe_launch(row)))
    return 130 if stop.why else relaunch.exit_status([row["outcome"]])


@command(
    "ablate",
    TARGET,
    arg("--vary", required=True, metavar="SET,SET", help="flag sets to switch on and off"),
    arg("--timeout", type=float, default=900, metavar="S", help="per combination"),
    YES,
    JSON,
)
def cmd_ablate(args: argparse.Namespace) -> int:
    writable(args)
    vary = [v for v in args.vary.split(",") if v]

    async def go():
        async with attached(args) as monitor:
            agreed = await perform.agree_ablation(monitor, Prompt(args), vary)
            if agreed is None:
                return None
            with Interrupt("ablation") as stop:
                return await relaunch.ablate(
                    monitor,
                    vary,
                    args.timeout,
                    progress=stop.progress,
                    first_plan=agreed.plan,
                    first_shm=agreed.shm,
                    interrupted=stop,
                ), stop

    done = run_async(go())
    if done is None:
        return declined("nothing was launched")
    rows, stop = done
    stop.out(json_text(rows) if args.json else "\n".join(relaunch.describe_ablation(rows, vary)), raw=args.json)
    return 130 if stop.why else relaunch.exit_status([r["outcome"] for r in rows])


BISECT_EXITS = (
    "exit status: 0 the smallest failing set found (at the confidence asked); 1 not confirmed; 2 bad input or an error; "
    "3 no failure reproduced with the failing configuration; 4 the good configuration fails too; "
    "5 the launch budget spent first; 130 interrupted (Ctrl+C, SIGTERM, SIGHUP or a closed output: the current run is stopped, a second "
    "call with the same arguments resumes)"
)


def _names(text: str | None) -> list[str] | None:
    return None if text is None else [v for v in text.split(",") if v]


@command(
    "bisect",
    TARGET,
    arg(
        "--vary",
        metavar="SET,SET",
        help="the flag sets (and parameters: NAME, or NAME=GOOD_VALUE) to search; "
        "default every flag set that differs between the two configurations",
    ),
    arg(
        "--good",
        metavar="SET,SET",
        default=None,
        help="the good configuration's flag sets (default none); the failing one is the layout's enabled sets "
        "plus those --vary names",
    ),
    arg(
        "--confidence",
        type=float,
        default=DEFAULT_CONFIDENCE,
        metavar="P",
        help="end when one answer is at least P likely (default 0.95); every launch is weighed, a flaky "
        "hang's passes too",
    ),
    arg(
        "--budget",
        type=int,
        default=None,
        metavar="LAUNCHES",
        help="launch at most this many (resumed ones count; default 16 + 8 per suspect)",
    ),
    arg(
        "--settle",
        type=float,
        default=None,
        metavar="S",
        help="a launch passes once ready (or serving) for S seconds (default 10)",
    ),
    arg("--timeout", type=float, default=900, metavar="S", help="per launch: not ready by then fails"),
    arg("--fresh", action="store_true", help="start again instead of resuming the same bisect from the ledger"),
    YES,
    JSON,
    epilog=BISECT_EXITS,
)
def cmd_bisect(args: argparse.Namespace) -> int:
    writable(args)
    check_counts(args.confidence, args.budget)  # before connecting
    if not args.layout and args.target != "demo":
        raise CockpitError("bisect needs --layout: the launch profile whose flag sets to search")

    async def go():
        async with attached(args) as monitor:
            plan = make_plan(
                monitor.layout,
                monitor.target.label,
                good=_names(args.good),
                vary=_names(args.vary),
                confidence=args.confidence,
                budget=args.budget,
                settle=DEFAULT_SETTLE_S if args.settle is None else args.settle,
            )
            agreed = await perform.agree_bisect(monitor, Prompt(args), plan, args.fresh)
            if agreed is None:
                return None
            with Interrupt("bisect (a second call resumes it)") as stop:
                return await bisect.bisect(
                    monitor,
                    plan,
                    args.timeout,
                    progress=stop.progress,
                    first_plan=agreed.plan,
                    first_shm=agreed.shm,
                    interrupted=stop,
                    fresh=args.fresh,
                ), stop

    done = run_async(go())
    if done is None:
        return declined("nothing was launched")
    doc, stop = done
    stop.out(json_text(doc) if args.json else "\n".join(bisect.describe_bisect(doc)), raw=args.json)
    return EXIT["interrupted"] if stop.why else EXIT[doc["status"]]
