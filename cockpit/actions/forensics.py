"""A stall's forensics, gathered once, automatically, when the monitor declares a stall on the run
it follows: every rank's stack (py-spy, grouped as `d` groups them), the flight recorder's dumps
where the run armed it, and from them the rank that is not where the others are. NCCL's RAS is
polled by the agent already and reaches the verdict on its own (cockpit/read/ras.py).

The result is a Finding (source `stacks`) the watchdog's verdict takes in (evidence.merge: the
odd rank where it had none), the dumps in the run's folder, and a line in the ledger. It runs at
most once per stall, never under --read-only, and a layout's `auto_dump: false` or the command
line's `--no-forensics` turns it off."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from cockpit.actions import dumps
from cockpit.common.errors import CockpitError
from cockpit.common.hosttext import visible
from cockpit.read.findings import Finding, rank_ranges
from cockpit.read.stacks import COLLECTIVE, Group, StackLook, Thread, group_stacks, look_of

DEADLINE_S = 20.0  # py-spy's own deadline per rank: a look waits at most this (plus the request's slack)


@dataclass
class Forensics:
    """What one stall's forensics found."""

    finding: Finding | None = None  # the stacks' word on the odd rank, for the verdict
    folder: str | None = None  # where the dumps are
    lines: list[str] = field(default_factory=list)  # the report, for the ledger and the bundle
    error: str | None = None  # why nothing could be gathered
    at: float = field(default_factory=time.time)

    def doc(self) -> dict:
        return {
            "folder": self.folder,
            "lines": self.lines,
            "error": self.error,
            "at": self.at,
            "odd_rank": self.finding.odd_rank if self.finding else None,
            "evidence": self.finding.evidence if self.finding else [],
        }

    @classmethod
    def from_doc(cls, doc: dict) -> Forensics:
        """As the ledger keeps it (`doc`): another cockpit's forensics of the same stall."""
        evidence = [str(e) for e in doc.get("evidence") or []][:8]
        rank = doc.get("odd_rank") if isinstance(doc.get("odd_rank"), int) else None
        return cls(
            Finding("stacks", evidence, odd_rank=rank) if evidence else None,
            str(doc["folder"]) if doc.get("folder") else None,
            [str(x) for x in doc.get("lines") or []][:200],
            doc.get("error"),
            float(doc["at"]),
        )


def _collective(thread: Thread | None):
    """The innermost Python frame of a collective, if the thread waits in one."""
    for f in thread.python if thread is not None else []:
        if COLLECTIVE.search(f.name.rsplit(".", 1)[-1]):
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
        lines = [
            f"rank{'s' if len(outside) > 1 else ''} {rank_ranges(outside)} not in {op.name}: "
            f"{'; '.join(f'rank {r} in {_where(threads[r])}' for r in outside[:3])}",
            f"rank{'s' if len(ranks) > 1 else ''} {rank_ranges(ranks)} wait{'s' if len(ranks) == 1 else ''} in "
            f"{op.name} ({op.file.rsplit('/', 1)[-1]}{':' + str(op.line) if op.line is not None else ''})",
        ]
        return Finding("stacks", [visible(line) for line in lines], odd_rank=outside[0] if len(outside) == 1 else None)
    odd = [g for g in groups if g.odd]
    if len(odd) == 1 and len(odd[0].ranks) == 1:
        r = odd[0].ranks[0]
        major = groups[0]
        return Finding(
            "stacks",
            [
                visible(
                    f"rank {r} is not where the others are: rank {r} in {_where(threads[r])}; "
                    f"ranks {rank_ranges(major.ranks)} in {_where(major.shown)}"
                )
            ],
            odd_rank=r,
        )
    return None


async def gather(session, run, folder: str, python: str | None = None) -> Forensics:
    """Every live rank's stack and, where armed, the flight recorder's comparison, for `run` (a
    Run) as the kill finds it (never another user's ranks); the odd rank from them. The dumps go
    to the run's folder `folder`; py-spy is looked for beside `python` (the layout's) first."""
    try:
        plan = await dumps.plan_dump(session, run, live_only=True)
        if not plan.ranks:
            return Forensics(error="no live rank of the run to dump")
        stacks = await dumps.dump_ranks(session, plan.ranks, folder, deadline_s=DEADLINE_S, python=python)
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


LOOK_DEADLINE_S = 8.0  # py-spy's deadline for one non-blocking dump of a rank


async def look(session, run, gap_s: float, python: str | None = None) -> StackLook:
    """A stack look (read/stacks.py: StackLook): every live rank of `run` (as the kill finds it)
    dumped twice with py-spy --nonblocking, `gap_s` apart, never paused, with the bytes each read
    meanwhile; the odd rank from the second dump. Nothing is written: the stall's forensics, if it
    is one, come after. A CockpitError when no rank can be dumped (no py-spy, no ptrace rights).
    py-spy is looked for beside `python` (the layout's interpreter) first, as a dump does."""
    ranks = (await dumps.plan_dump(session, run, live_only=True)).ranks
    if not ranks:
        raise CockpitError("no live rank of the run to look at")
    pyspy, check = await dumps.ensure_pyspy(session, python=python)
    if not pyspy:
        raise CockpitError("py-spy is not installed on the host: the stall windows alone decide")
    if check.get("problems"):
        raise CockpitError("cannot read the ranks' stacks: " + "; ".join(check["problems"]))
    keys = {pid: (rank if rank is not None else n) for n, (rank, pid) in enumerate(ranks)}

    async def one() -> tuple[dict[int, str], dict[int, int], dict[int, str], float]:
        data = await session.request(
            "dump",
            timeout=LOOK_DEADLINE_S + 30,
            pids=list(keys),
            pyspy=pyspy,
            deadline_s=LOOK_DEADLINE_S,
            nonblocking=True,
        )
        texts, read, bad = {}, {}, {}
        for pid, key in keys.items():
            d = data["dumps"].get(str(pid)) or {"ok": False, "errors": ["no answer"]}
            if d.get("ok"):
                texts[key] = d["text"]
                if isinstance(d.get("rchar"), int):
                    read[key] = d["rchar"]
            else:
                bad[key] = "dead" if d.get("dead") else "; ".join(d.get("errors") or ["no dump"])[:200]
        return texts, read, bad, time.monotonic()

    first, read1, bad1, at1 = await one()
    await asyncio.sleep(gap_s)
    second, read2, bad2, at2 = await one()
    read = {k: read2[k] - read1[k] for k in read1.keys() & read2.keys()}
    out = look_of(first, second, at2 - at1, at2, read, {**bad1, **bad2})
    found = odd_rank(group_stacks(second))
    if found is not None:
        out.odd_rank, out.odd_said = found.odd_rank, list(found.evidence)
    return out
