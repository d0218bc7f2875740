"""A stall's forensics, gathered once, automatically, when the monitor declares a stall on the run
it follows: every rank's stack (py-spy, grouped as `d` groups them), the flight recorder's dumps
where the run armed it, and from them the rank that is not where the others are. NCCL's RAS is
polled by the agent already and reaches the verdict on its own (cockpit/read/ras.py).

The result is a Finding (source `stacks`) the watchdog's verdict takes in (evidence.merge: the
odd rank where it had none), the dumps in the run's folder, and a line in the ledger. It runs at
most once per stall, never under --read-only, and a layout's `auto_dump: false` or the command
line's `--no-forensics` turns it off."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

from cockpit.actions import dumps, kill
from cockpit.common.errors import CockpitError
from cockpit.common.hosttext import visible
from cockpit.read.findings import Finding, rank_ranges
from cockpit.read.stacks import Group, Thread

DEADLINE_S = 20.0  # py-spy's own deadline per rank: a look waits at most this (plus the request's slack)

# torch.distributed's collectives and the engines' wrappers of them (vLLM's and SGLang's
# tensor_model_parallel_all_reduce, pynccl's and custom all-reduce's methods), by function name
COLLECTIVE = re.compile(r"(?:^|_)(all_?reduce|all_?gather|reduce_?scatter|broadcast|barrier|all_?to_?all|"
                        r"send|recv|isend|irecv|gather|scatter|reduce)(?:_|$)", re.I)


@dataclass
class Forensics:
    """What one stall's forensics found."""

    finding: Finding | None = None  # the stacks' word on the odd rank, for the verdict
    folder: str | None = None  # where the dumps are
    lines: list[str] = field(default_factory=list)  # the report, for the ledger and the bundle
    error: str | None = None  # why nothing could be gathered
    at: float = field(default_factory=time.time)

    def doc(self) -> dict:
        return {"folder": self.folder, "lines": self.lines, "error": self.error, "at": self.at,
                "odd_rank": self.finding.odd_rank if self.finding else None,
                "evidence": self.finding.evidence if self.finding else []}

    @classmethod
    def from_doc(cls, doc: dict) -> Forensics:
        """As the ledger keeps it (`doc`): another cockpit's forensics of the same stall."""
        evidence = [str(e) for e in doc.get("evidence") or []][:8]
        rank = doc.get("odd_rank") if isinstance(doc.get("odd_rank"), int) else None
        return cls(Finding("stacks", evidence, odd_rank=rank) if evidence else None,
                   str(doc["folder"]) if doc.get("folder") else None,
                   [str(x) for x in doc.get("lines") or []][:200], doc.get("error"), float(doc["at"]))


def _collective(thread: Thread | None):
    """The innermost Python frame of a collective, if the thread waits in one."""
    for f in thread.python if thread is not None else []:
        if COLLECTIVE.search(f.name):
            return f
    return None


def _where(thread: Thread | None) -> str:
    frames = thread.python if thread is not None else []
    if not frames:
        return "no Python frame"
    f = frames[0]
    return f"{f.name} ({f.file.rsplit('/', 1)[-1]}:{f.line})" if f.line is not None else f"{f.name} ({f.file})"


def odd_rank(groups: list[Group]) -> Finding | None:
    """The rank that is not where the others are: outside the collective the others wait in
    (with two ranks, the one outside is the odd one), else the one rank of a group smaller than
    the majority's. None when every rank is at the same place, or no single rank stands out."""
    threads = {r: g.stacks.get(r) for g in groups for r in g.ranks}
    inside = {r: f for r, t in threads.items() if (f := _collective(t)) is not None}
    outside = sorted(set(threads) - set(inside))
    if inside and outside and len(outside) <= len(inside):
        op = next(iter(inside.values()))
        ranks = sorted(inside)
        lines = [f"rank{'s' if len(outside) > 1 else ''} {rank_ranges(outside)} not in {op.name}: "
                 f"{'; '.join(f'rank {r} in {_where(threads[r])}' for r in outside[:3])}",
                 f"rank{'s' if len(ranks) > 1 else ''} {rank_ranges(ranks)} wait{'s' if len(ranks) == 1 else ''} in "
                 f"{op.name} ({op.file.rsplit('/', 1)[-1]}{':' + str(op.line) if op.line is not None else ''})"]
        return Finding("stacks", [visible(line) for line in lines], odd_rank=outside[0] if len(outside) == 1 else None)
    odd = [g for g in groups if g.odd]
    if len(odd) == 1 and len(odd[0].ranks) == 1:
        r = odd[0].ranks[0]
        major = groups[0]
        return Finding("stacks", [visible(f"rank {r} is not where the others are: rank {r} in {_where(threads[r])}; "
                                          f"ranks {rank_ranges(major.ranks)} in {_where(major.shown)}")], odd_rank=r)
    return None


async def gather(session, run, folder: str) -> Forensics:
    """Every live rank's stack and, where armed, the flight recorder's comparison, for `run` (a
    Run) as the kill finds it (never another user's ranks); the odd rank from them. The dumps go
    to the run's folder `folder`."""
    try:
        plan = await kill.member_plan(session, run, verb="dump")
        members, _left = kill.of_run(session.state, plan)
        ranks = kill.rank_pids(session.state, members)
        if not ranks:
            return Forensics(error="no live rank of the run to dump")
        stacks = await dumps.dump_ranks(session, ranks, folder, deadline_s=DEADLINE_S)
    except CockpitError as exc:
        return Forensics(error=str(exc))
    found = odd_rank(stacks.groups)
    out = Forensics(found, str(stacks.folder), stacks.report())
    try:
        answer, result = await dumps.collect(session, run, trigger=True)
        if answer.get("armed"):
            out.lines += [f"flight recorder: {line}" for line in result.get("lines") or []]
    except CockpitError as exc:
        out.lines.append(f"flight recorder: {exc}")
    return out
