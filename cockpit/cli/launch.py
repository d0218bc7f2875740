"""The commands that launch the layout's server and watch it to an outcome: `launch` (one, flag
sets toggled), `ablate` (each on/off combination in turn), `bisect` (delta debugging over flag
sets: the smallest that still hangs). Each launch kills the one before it, as planned and asked."""

from __future__ import annotations

import argparse
import asyncio
import shlex
import signal
import sys

from cockpit.actions import launch
from cockpit.cli.attach import attached
from cockpit.cli.base import JSON, TARGET, YES, arg, command, confirm, declined, print_json, run_async, say, writable
from cockpit.common.errors import CockpitError
from cockpit.common.hosttext import these
from cockpit.common.secrets import mask_argv, mask_record
from cockpit.operate import bisect, relaunch
from cockpit.runs.bisect import DEFAULT_SETTLE_S, EXIT, check_counts, make_plan
from cockpit.runs.spec import build_argv, combinations, default_spec


def _progress(phase, verdict) -> None:
    say(f"  {phase or ''}  {verdict}", file=sys.stderr, flush=True)


def _on_off(args: argparse.Namespace) -> None:
    both = sorted(set(args.on) & set(args.off))
    if both:
        raise CockpitError(f"--on {both[0]} --off {both[0]}: a flag set cannot be both on and off: keep one of them")


def _spec(args: argparse.Namespace, layout):
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


@command("launch", TARGET,
         arg("--on", action="append", default=[], metavar="SET", help="turn a flag set on (repeatable)"),
         arg("--off", action="append", default=[], metavar="SET", help="turn a flag set off (repeatable)"),
         arg("--set", action="append", default=[], metavar="NAME=VALUE", help="a parameter's value"),
         arg("--no-clean-shm", action="store_true", help="leave /dev/shm alone between runs"),
         arg("--timeout", type=float, default=900, metavar="S", help="give up watching after S seconds"),
         arg("--settle", type=float, default=0, metavar="S", help="keep watching S seconds after ready"),
         YES, arg("--json", action="store_true", help="print the run's ledger row as JSON instead of lines"))
def cmd_launch(args: argparse.Namespace) -> int:
    writable(args)
    _on_off(args)
    if not args.layout and args.target != "demo":
        raise CockpitError("launch needs --layout: the launch profile to run")

    async def go():
        async with attached(args) as monitor:
            session, layout = monitor.session, monitor.layout
            spec = _spec(args, layout)
            argv = build_argv(layout, spec, launch.launch_python(layout, session)) + launch.sim_flags(layout, session)
            plan, names, lines = await relaunch.plan_relaunch(monitor, clean_shm=not args.no_clean_shm)
            if not confirm(lines + ["then launched:", "  " + shlex.join(mask_argv(argv))], "launch?", args.yes,
                           args.json):
                return None
            return await relaunch.run_variant(monitor, spec, args.timeout, clean_shm=not args.no_clean_shm,
                                            progress=_progress, settle=args.settle, plan=plan, shm=names)

    row = run_async(go())
    if row is None:
        return declined("nothing was launched")
    if args.json:
        print_json(mask_record(row))  # secrets masked, as in the ledger
        return relaunch.exit_status([row["outcome"]])
    say(row["summary"])
    say(f"{row['run_id']}: {row['outcome']}")
    for line in row["evidence"]:
        say(f"  {line}")
    say(f"log: {row['log']}")
    return relaunch.exit_status([row["outcome"]])


@command("ablate", TARGET,
         arg("--vary", required=True, metavar="SET,SET", help="flag sets to switch on and off"),
         arg("--timeout", type=float, default=900, metavar="S", help="per combination"),
         YES, JSON)
def cmd_ablate(args: argparse.Namespace) -> int:
    writable(args)
    vary = [v for v in args.vary.split(",") if v]

    async def go():
        async with attached(args) as monitor:
            specs = combinations(monitor.layout, vary)
            plan, names, lines = await relaunch.plan_relaunch(monitor)
            if not confirm(lines + [f"  {','.join(s.enabled) or '(no flag sets)'}" for s in specs],
                           f"run {these(len(specs), 'launch', 'launches')} one after another (each kills the one before)?",
                           args.yes, args.json):
                return None
            return await relaunch.ablate(monitor, vary, args.timeout, progress=_progress, first_plan=plan,
                                       first_shm=names)

    rows = run_async(go())
    if rows is None:
        return declined("nothing was launched")
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


@command("bisect", TARGET,
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
    writable(args)
    check_counts(args.repeat, args.budget)  # before connecting
    if not args.layout and args.target != "demo":
        raise CockpitError("bisect needs --layout: the launch profile whose flag sets to search")

    async def go():
        async with attached(args) as monitor:
            plan = make_plan(monitor.layout, monitor.target.label, good=_names(args.good), vary=_names(args.vary),
                             repeat=args.repeat, budget=args.budget,
                             settle=DEFAULT_SETTLE_S if args.settle is None else args.settle)
            before = None if args.fresh else bisect.resumable(monitor.layout, plan)
            first, names, kill_lines = await relaunch.plan_relaunch(monitor)
            if not confirm(bisect.describe_plan(plan, before) + kill_lines, "bisect (each launch kills the one before)?", args.yes, args.json):
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
        return declined("nothing was launched")
    if args.json:
        print_json(doc)
    else:
        say("\n".join(bisect.describe_bisect(doc)))
    return EXIT[doc["status"]]
