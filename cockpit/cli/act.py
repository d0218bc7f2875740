"""The commands that act on a host's run or gather its evidence: `kill`, `shm` (audit, clean),
`dump` (every rank's stack), `bundle` (a hang's .tar.gz), `flightrec` (torch's flight recorder),
and any act registered with a generic workflow (cockpit/operate/perform.py).
Each plans, says the plan and asks (or takes --yes), then carries it out through the host's one
monitor; --read-only refuses each that would act."""

from __future__ import annotations

import argparse
import os
import sys

from cockpit import engines
from cockpit.actions import kill as actions
from cockpit.cli.attach import attached
from cockpit.cli.base import (
    JSON,
    REGISTERED,
    TARGET,
    YES,
    Prompt,
    arg,
    command,
    confirm,
    declined,
    print_json,
    run_async,
    say,
    writable,
)
from cockpit.common.errors import CockpitError
from cockpit.operate import bundle, perform
from cockpit.operate.acts import ACT, ACTS
from cockpit.read import flightrec


class ShmPrompt(Prompt):
    """A clean of another folder than /dev/shm is asked twice: --yes answers the list, only
    --yes-other-dir (or a second yes) the folder."""

    def __init__(self, args: argparse.Namespace, folder: str, other_dir: bool):
        super().__init__(args)
        self.folder, self.other_dir = folder, other_dir

    async def confirm(self, title: str, lines: list[str], question: str) -> bool:
        if not await super().confirm(title, lines, question):
            return False
        return (
            not self.other_dir
            or self.args.yes_other_dir
            or confirm(
                [],
                f"{self.folder} is not /dev/shm: clean it anyway (--yes does not answer this; --yes-other-dir does)?",
                False,
            )
        )


ENGINE_SHM = ", ".join(e.shm_prefixes[0] for e in engines.ENGINES.values() if e.shm_prefixes)  # each engine's own


@command(
    "kill",
    TARGET,
    arg(
        "--pid",
        type=int,
        help="kill this process (and what it started, as its user) instead of the run "
        "found; how to choose when two runs are found",
    ),
    arg("--wait", type=float, default=None, metavar="S", help="seconds between SIGTERM and SIGKILL (default 10)"),
    YES,
    JSON,
)
def cmd_kill(args: argparse.Namespace) -> int:
    writable(args)

    async def go() -> dict | None:
        async with attached(args) as monitor:
            return await perform.stop(
                monitor, Prompt(args), "kill", "cockpit kill: asked by the operator", args.pid, args.wait
            )

    report = run_async(go())
    if report is None:
        return declined("nothing was signalled")
    if args.json:
        print_json(report)
    else:
        say("\n".join([report["summary"]] + actions.describe_kill(report)))
    return 0 if report["verified"] else 3


@command(
    "shm",
    TARGET,
    arg(
        "--dir",
        default="/dev/shm",
        help="the shm folder (default /dev/shm); cleaning another folder needs --yes-other-dir or a yes asked",
    ),
    arg(
        "--clean",
        action="store_true",
        help=f"remove files named like an inference run's (nccl-, torch_, psm_, {ENGINE_SHM}, MPI...), "
        "owned by the run's user, held by no process, whose creator is dead; the rest is kept, with why",
    ),
    YES,
    arg("--yes-other-dir", action="store_true", help="confirm cleaning a --dir other than /dev/shm"),
    JSON,
)
def cmd_shm(args: argparse.Namespace) -> int:
    if args.clean:
        writable(args)

    def refuse_other(folder: str) -> None:
        if args.clean and not args.yes_other_dir and not sys.stdin.isatty():
            raise CockpitError(
                f"--dir {args.dir} is not /dev/shm ({folder}): pass --yes-other-dir to clean it (--yes alone does not)"
            )

    if os.path.normpath(args.dir) != actions.SHM_DEFAULT:
        refuse_other(args.dir)

    async def go():
        async with attached(args) as monitor:
            audit = await monitor.shm_audit(args.dir)
            other_dir = not audit.get("default", os.path.normpath(args.dir) == actions.SHM_DEFAULT)
            if other_dir:  # the folder as the host resolves it: `/dev/../dev/shm` is /dev/shm, a symlink is not
                refuse_other(audit["folder"])
            if not args.clean:
                return audit, None
            if not args.json:
                say("\n".join(actions.describe_shm(audit)))
            return audit, await perform.clean_shm(
                monitor, audit, ShmPrompt(args, audit["folder"], other_dir), other_dir=other_dir
            )

    audit, cleaned = run_async(go())
    if args.json:
        print_json(
            {
                "audit": audit,
                "clean": cleaned,
                "summary": actions.summarize_clean(cleaned) if cleaned is not None else None,
            }
        )
    elif cleaned is None:
        if not args.clean:
            say("\n".join(actions.describe_shm(audit)))
    else:
        say("\n".join(actions.describe_clean(cleaned)))
    return declined("nothing was removed") if args.clean and cleaned is None else 0


@command(
    "dump",
    TARGET,
    arg(
        "--upload-pyspy",
        action="store_true",
        help="send this install's py-spy when the host has none (what is sent, and where, is said first)",
    ),
    arg(
        "--full",
        "--native",
        dest="full",
        action="store_true",
        help="every frame of each group's main thread, the native ones unfolded",
    ),
    arg(
        "--pid",
        type=int,
        metavar="ROOT",
        help="dump this run (its root process and what it started) instead of "
        "the run found; how to choose when two runs are found",
    ),
    JSON,
)
def cmd_dump(args: argparse.Namespace) -> int:
    writable(args)

    async def go():
        async with attached(args) as monitor:
            return (await perform.dump(monitor, Prompt(args, upload=args.upload_pyspy), args.pid))[1]

    result = run_async(go())
    if args.json:
        print_json(result.as_json())
    else:
        say("\n".join(result.report(full=args.full)))
        say(f"raw dumps: {result.folder}")
    return 0


@command(
    "bundle",
    TARGET,
    arg(
        "--wait",
        type=float,
        default=None,
        metavar="S",
        help="judge for exactly S seconds first (default: until the verdict is decided, as snapshot does)",
    ),
    arg(
        "--upload-pyspy",
        action="store_true",
        help="send this install's py-spy when the host has none, for the stacks (what is sent, and where, is "
        "said first)",
    ),
    JSON,
)
def cmd_bundle(args: argparse.Namespace) -> int:
    if args.upload_pyspy:
        writable(args)

    async def go():
        async with attached(args) as monitor:
            if args.upload_pyspy:
                await monitor.pyspy_check(
                    upload=True,
                    say=lambda line: print(line, file=sys.stderr, flush=True),
                )
            await monitor.look(args.wait)
            return await bundle.make_bundle(monitor, read_only=args.read_only)

    result = run_async(go())
    if args.json:
        print_json(result.doc())
    else:
        say("\n".join(bundle.describe(result)))
    return 0


@command(
    "flightrec",
    TARGET,
    arg("--no-trigger", action="store_true", help="read the dumps already there (e.g. from a timeout)"),
    arg(
        "--pid",
        type=int,
        metavar="ROOT",
        help="this run (its root process and what it started) instead of the "
        "run found; how to choose when two runs are found",
    ),
    JSON,
)
def cmd_flightrec(args: argparse.Namespace) -> int:
    if not args.no_trigger:
        writable(args)

    async def go():
        async with attached(args) as monitor:
            return await monitor.flight_record(trigger=not args.no_trigger, root=args.pid)

    answer, result = run_async(go())
    if args.json:
        print_json(
            {
                "ranks": {r: {k: v for k, v in d.items() if k != "entries"} for r, d in answer["ranks"].items()},
                "problems": answer.get("problems"),
                "comparison": result,
            }
        )
    else:
        say("\n".join(flightrec.describe(answer, result)))
    return 0 if answer.get("armed") else 3


def _generic(name: str) -> None:
    """`cockpit COMMAND TARGET [--yes] [--json]` for an act whose workflow is generic
    (cockpit/operate/perform.py): planned, asked (or --yes), carried out, its Outcome printed; exit
    status 3 when it did not go as asked, 1 when declined."""
    act = ACT[name]

    @command(act.command, TARGET, YES, JSON)
    def cmd(args: argparse.Namespace) -> int:
        writable(args)

        async def go():
            async with attached(args) as monitor:
                return await perform.WORKFLOWS[name](monitor, Prompt(args))

        outcome = run_async(go())
        if outcome is None:
            return declined(f"{act.command}: nothing was done")
        if args.json:
            print_json(outcome.doc)
        else:
            say("\n".join([outcome.summary] + outcome.lines))
        return 0 if outcome.ok else 3


for _name in perform.WORKFLOWS:  # the acts with nothing of their own here
    if ACT[_name].family == "act" and ACT[_name].command not in REGISTERED:
        _generic(_name)
for _act in ACTS:  # a registered act that came without its workflow: its command says so, in one line
    if _act.family == "act" and _act.command not in REGISTERED:

        @command(_act.command, TARGET, common=False)
        def _no_workflow(args: argparse.Namespace, name: str = _act.name) -> int:
            raise CockpitError(f"the act {name!r} has no workflow (cockpit/operate/perform.py): nothing to run")
