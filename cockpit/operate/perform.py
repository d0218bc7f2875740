"""Each act on the run carried out once, for the screen and the CLI alike: plan through the
monitor's verbs, show exactly what will be touched and ask, carry it out, and hand back what the
report needs. Where they differ they differ only in how they ask and tell: an `Asker` is the
screen's dialogs and notifications (cockpit/ui/actions.py) or the terminal's prompt, --yes and
stderr (cockpit/cli/base.py's Prompt). A launch, an ablation and a bisect are agreed here the
same way (the stop and /dev/shm clean they begin with, and what they launch, shown and asked)
and carried out by operate/relaunch.py and operate/bisect.py. The acts themselves are named in
cockpit/operate/acts.py."""

from __future__ import annotations

import shlex
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from cockpit.actions.dumps import DumpPlan, DumpSet
from cockpit.actions.kill import KillPlan, ShmForRun, listed
from cockpit.common.errors import CockpitError
from cockpit.common.hosttext import count, these, visible
from cockpit.common.secrets import mask_argv
from cockpit.monitor.base import Monitor
from cockpit.operate.bisect import prepare
from cockpit.operate.relaunch import plan_relaunch
from cockpit.runs.bisect import Plan
from cockpit.runs.run import process_scope
from cockpit.runs.spec import RunSpec, build_argv, combinations


class Asker(Protocol):
    """How an act asks and tells, where the operator is."""

    async def confirm(self, title: str, lines: list[str], question: str) -> bool:
        """`lines` (what will be touched) shown, then `question` asked; False declines."""

    def found(self, lines: list[str]) -> None:
        """What the act found before it acts (the rule that found the run, ranks left alone)."""

    def tell(self, line: str) -> None:
        """A line as the act goes (what it sends where, what it waits for)."""

    def under_way(self, text: str) -> None:
        """What is under way now (the screen's header; the terminal keeps quiet)."""

    async def pyspy(self, then: str) -> bool:
        """Whether this install's py-spy is to be sent where the host has none, before `then`."""


class NothingToAct(CockpitError):
    """Nothing of the run is there to act on: said, not a failure (the screen warns; the CLI's
    one line and exit status are a CockpitError's)."""


@dataclass
class Outcome:
    """What an act carried out hands back: its one line (the screen's header, the CLI's first
    line), its report, its --json document, and whether it went as asked (else a red line on the
    screen and exit status 3)."""

    summary: str
    lines: list[str] = field(default_factory=list)
    doc: dict[str, Any] = field(default_factory=dict)
    ok: bool = True


Workflow = Callable[[Monitor, Asker], Awaitable[Outcome | None]]
WORKFLOWS: dict[str, Workflow] = {}  # the acts that the screen and the CLI carry out with nothing of their own


def workflow(name: str) -> Callable[[Workflow], Workflow]:
    """Register `fn` as the act `name`'s whole workflow (plan, ask through the Asker, carry out):
    the screen's key and the CLI's command then run it and show its Outcome (None: declined)."""

    def register(fn: Workflow) -> Workflow:
        WORKFLOWS[name] = fn
        return fn

    return register


async def stop(
    monitor: Monitor, asker: Asker, what: str, why: str, pid: int | None = None, wait: float | None = None
) -> dict[str, Any] | None:
    """Kill the run, or process `pid` and what it started: planned, shown and asked, then the
    monitor's one stop workflow (SIGTERM, wait, SIGKILL, verified). None when declined;
    NothingToAct when nothing of it is alive."""
    scope = process_scope(pid) if pid else monitor.scope()
    plan = await monitor.plan_stop(scope)
    if not plan.entries:
        label = monitor.target.label
        if pid:
            raise NothingToAct(f"no process {pid} on {label}")
        said = [plan.rule] if scope.pids and plan.rule and plan.rule != "no such process" else []
        why_not = "; ".join(said + plan.notes + [f"pid {f['root']} left alone: {f['why']}" for f in plan.foreign])
        raise NothingToAct(
            f"nothing to kill on {label}: no process of the run is alive" + (f" ({why_not})" if why_not else "")
        )
    if not await asker.confirm(what, plan.describe(), f"kill {these(len(plan.entries), 'process', 'processes')}?"):
        return None
    asker.under_way("SIGTERM sent, waiting")
    return await monitor.stop(plan, why, wait, whole_run=not pid)


async def clean_shm(
    monitor: Monitor, audit: dict[str, Any], asker: Asker, other_dir: bool = False
) -> dict[str, Any] | None:
    """Remove the audit's removable entries, each named and asked first, each checked again on the
    host before it goes. None when declined; with nothing removable, nothing is asked."""
    chosen = [listed(e) for e in audit["entries"] if e["removable"]]
    if not chosen:
        return {"removed": [], "skipped": [], "freed_bytes": 0}
    if not await asker.confirm(
        "clean shm",
        [f"  rm {visible(e['name'])}" for e in chosen],
        f"remove {these(len(chosen), 'entry', 'entries')} of {audit['folder']}?",
    ):
        return None
    asker.under_way(f"removing {count(len(chosen), 'entry', 'entries')} of {audit['folder']}")
    return await monitor.shm_clean(chosen, audit["folder"], other_dir=other_dir)


async def dump(monitor: Monitor, asker: Asker, root: int | None = None) -> tuple[DumpPlan, DumpSet]:
    """Every rank's stack: the run's ranks found as the kill finds them (never another's), said,
    py-spy made sure of, then dumped. NothingToAct when no rank of it is alive."""
    plan = await monitor.plan_dump(root, "dump")
    asker.found([visible(line) for line in plan.describe()])
    if not plan.ranks:
        raise NothingToAct(f"no rank of the run to dump on {monitor.target.label}: no watched process of it is alive")
    upload = await asker.pyspy("dump the stacks")
    asker.under_way(f"py-spy on {count(len(plan.ranks), 'process', 'processes')}")
    return plan, await monitor.dump_stacks(plan, upload=upload, say=asker.tell)


@dataclass
class Agreed:
    """What the operator was shown and said yes to before launching: the run's stop (`plan`) and
    its /dev/shm clean (`shm`, None when left alone), exactly what the first launch carries out,
    and the lines that described them (the screen's report begins with them)."""

    plan: KillPlan | None
    shm: ShmForRun | None
    lines: list[str]


async def _agree(
    monitor: Monitor,
    asker: Asker,
    title: str,
    question: Callable[[KillPlan | None, ShmForRun | None], str],
    before: list[str] | None = None,
    then: list[str] | None = None,
    clean_shm: bool = True,
    launches: bool = True,
) -> Agreed | None:
    """The stop and clean a launch begins with, planned, shown between `before` and `then`, asked."""
    plan, shm, lines = await plan_relaunch(monitor, clean_shm) if launches else (None, None, [])
    if not await asker.confirm(title, (before or []) + lines + (then or []), question(plan, shm)):
        return None
    return Agreed(plan, shm, lines)


def _then_launch(plan: KillPlan | None, shm: ShmForRun | None) -> str:
    steps = [f"kill {these(len(plan.entries), 'process', 'processes')}"] if plan is not None and plan.entries else []
    if shm is not None and shm.remove:
        steps.append(f"remove {these(len(shm.remove), 'entry', 'entries')} of /dev/shm")
    return ", ".join(steps) + " and launch?" if steps else "launch?"


async def agree_launch(monitor: Monitor, asker: Asker, spec: RunSpec, clean_shm: bool = True) -> Agreed | None:
    """A (re)launch of `spec`, which relaunch.run_variant carries out: the run's processes and
    /dev/shm entries it ends and the command line it runs (secrets masked), asked as one. None
    when declined."""
    if monitor.layout is None:
        raise CockpitError("a relaunch needs a layout: it names what is launched")
    argv = build_argv(monitor.layout, spec, monitor.launch_python()) + monitor.sim_flags()
    then = ["then launched:", "  " + shlex.join(mask_argv(argv))]
    return await _agree(monitor, asker, "relaunch", _then_launch, then=then, clean_shm=clean_shm)


async def agree_ablation(monitor: Monitor, asker: Asker, vary: list[str]) -> Agreed | None:
    """An ablation over `vary` (relaunch.ablate carries it out): the first launch's stop and
    clean, then each combination in the order launched. None when declined."""
    if monitor.layout is None:
        raise CockpitError("an ablation needs a layout: it names what is launched")
    specs = combinations(monitor.layout, vary)
    then = [f"{n + 1}. {','.join(s.enabled) or '(no flag sets)'}" for n, s in enumerate(specs)]
    question = f"run {these(len(specs), 'launch', 'launches')} one after another (each kills the one before)?"
    return await _agree(monitor, asker, "ablation", lambda *_: question, then=then)


async def agree_bisect(monitor: Monitor, asker: Asker, plan: Plan, fresh: bool = False) -> Agreed | None:
    """A bisection (bisect.bisect carries it out): what it resumes and sets aside, its suspects and
    launch budget, then the first launch's stop and clean; with nothing left to launch, only its
    answer is offered. None when declined."""
    ready = await prepare(monitor, plan, fresh)
    question = "bisect (each launch kills the one before)?" if ready.launches else "show its answer?"
    return await _agree(monitor, asker, "bisect", lambda *_: question, before=ready.describe(), launches=ready.launches)
