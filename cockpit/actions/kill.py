"""The operator's actions, as the story's operator did them by hand: kill the run and verify it is
gone, audit and clean the shm folder. Each is planned first (the plan names exactly what will be
touched, for the confirmation), then carried out by the agent on the host, which re-checks every
pid's start time and user before each signal and every shm entry before it unlinks it.

What "the run" is (`run_scope`, resolved on the host by the agent's `find_runs`), in this order:
1. the run this cockpit launched: its process group and its leader's start time, both checked;
2. else the tree of the process that owns the layout's ports;
3. else the tree of the processes that run the layout's command (and model path, and port);
4. without a layout only: processes whose title matches the watch patterns.
Processes of another user are never in a run; two runs found are never merged: the operator
chooses one (`--pid ROOT`, or `k` on its root). No kill by name pattern across the host."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from cockpit.common.errors import CockpitError, LinkLost
from cockpit.common.hosttext import count, visible
from cockpit.common.secrets import mask_text
from cockpit.host.session import HostSession
from cockpit.host.state import HostState
from cockpit.runs.ledger import operator_id
from cockpit.runs.run import Run, Scope, process_scope

DEFAULT_KILL_WAIT_S = 10.0
SHM_DEFAULT = "/dev/shm"


class AmbiguousRun(CockpitError):
    """More than one run matches: the operator must choose; the candidates are attached, and
    `lines` names each on a line of its own (the message says how to choose)."""

    def __init__(self, message: str, candidates: list[dict]):
        super().__init__(message)
        self.candidates = candidates
        self.lines = [describe_candidate(n, c) for n, c in enumerate(candidates, 1)]


# ----------------------------------------------------------------------------- kill


def when(epoch) -> str:
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(epoch)))
    except (TypeError, ValueError, OverflowError):
        return "?"


TITLE_SHOWN = 400  # a command line shown whole up to this, its length said past it


def elide(text: str, limit: int) -> str:
    """The text whole, or its first `limit` characters and how many more there are: never a word
    silently cut."""
    return text if len(text) <= limit else f"{text[:limit]}… (+{len(text) - limit} characters)"


def describe_candidate(n: int, c: dict) -> str:
    return (
        f"[{n}] pid {c['root']} ({c['user']}, started {when(c.get('started'))}, {c.get('processes', '?')} processes, "
        f"{c['rule']}): {visible(mask_text(c.get('title', '')))[:80]}"
    )


@dataclass
class KillPlan:
    scope: Scope
    entries: list[dict]
    rule: str | None = None
    candidates: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    foreign: list[dict] = field(default_factory=list)
    sessions: list[int] = field(default_factory=list)
    root: int | None = None
    uid: int | None = None
    planned_at: int | None = None  # the host's clock ticks when the plan was made

    def describe(self) -> list[str]:
        """Every process the kill will signal: pid, user, start time, command (secrets masked);
        and the rule that found the run, what is left alone and why."""
        lines = [f"the run: {self.rule}"] if self.rule else []
        lines.append(f"{'pid':>7} {'user':<8} {'started':<19} {'pgid':>7} st  command")
        for e in self.entries:
            lines.append(
                f"{e['pid']:>7} {str(e.get('user', '?'))[:8]:<8} {when(e.get('started')):<19} {e['pgid']:>7} "
                f"{e['status']:<3} {elide(visible(e['title']), TITLE_SHOWN)}"
            )
        for f in self.foreign:
            lines.append(f"left alone: pid {f['root']} ({f['rule']}): {f['why']}")
        for note in self.notes:
            lines.append(f"note: {note}")
        groups = sorted({e["pgid"] for e in self.entries})
        lines.append(
            f"{count(len(self.entries), 'process', 'processes')} in "
            f"{'process group' if len(groups) == 1 else 'process groups'} {', '.join(map(str, groups)) or '-'}: "
            f"SIGTERM, then SIGKILL after the wait, each only while its start time still matches"
        )
        return lines


def _masked_plan(entries: list[dict]) -> list[dict]:
    return [dict(e, title=mask_text(e.get("title", ""))) for e in entries]


async def plan_kill(session: HostSession, scope: Scope, allow_ambiguous: bool = False) -> KillPlan:
    """The plan for the operator to confirm. Two runs or more: AmbiguousRun (one line naming each
    and how to choose), unless `allow_ambiguous` (then the plan is empty, the candidates listed)."""
    data = await session.request("kill_plan", timeout=60, **scope.args())
    plan = KillPlan(
        scope,
        _masked_plan(data.get("plan") or []),
        data.get("rule"),
        data.get("candidates") or [],
        data.get("notes") or [],
        data.get("foreign") or [],
        data.get("sessions") or [],
        data.get("root"),
        data.get("uid"),
        data.get("planned_at"),
    )
    if len(plan.candidates) > 1 and not allow_ambiguous:
        raise AmbiguousRun(
            f"{len(plan.candidates)} runs found on {session.target.label}, not merged: choose one: "
            f"`cockpit kill {session.target.label} --pid ROOT` (in the cockpit: select its root "
            f"process and press k)",
            plan.candidates,
        )
    return plan


async def member_plan(
    session: HostSession, run: Run | None = None, root: int | None = None, verb: str = "dump"
) -> KillPlan:
    """The processes of `run` a dump or a flight-recorder read acts on, found exactly as a kill
    finds them (the same plan, nothing signalled): `root` (`--pid ROOT`) names the run; else the
    run followed (its scope); which run that is, find_live_run decides. Two runs or more:
    AmbiguousRun naming each and how to choose; none: a CockpitError saying why (another user's
    processes are never the run unless named)."""
    scope = process_scope(root) if root else (run or Run()).scope(session.watch)
    plan = await plan_kill(session, scope, allow_ambiguous=True)
    label = session.target.label
    if len(plan.candidates) > 1:
        raise AmbiguousRun(
            f"{len(plan.candidates)} runs found on {label}, not merged: choose one: "
            f"`cockpit {verb} {label} --pid ROOT`",
            plan.candidates,
        )
    if not plan.entries:
        why = "; ".join(
            plan.notes + [f"pid {f['root']} ({f.get('user', '?')}) left alone: {f['why']}" for f in plan.foreign]
        )
        raise CockpitError(
            f"{verb}: no run found on {label}, and processes that are not the run's are never "
            f"touched" + (f" ({why})" if why else "") + f"; name one with `cockpit {verb} {label} "
            f"--pid ROOT`"
        )
    return plan


def of_run(state: HostState, plan: KillPlan) -> tuple[set[int], list[str]]:
    """The pids of the host state that are the run's (the plan's; a dead rank counts when it was
    in one of the run's sessions), and a line for each watched rank left alone."""
    members = {e["pid"] for e in plan.entries}
    sessions = {e.get("sid") for e in plan.entries} - {None}
    keep, left = set(members), []
    for p in state.procs.values():
        if p.pid in members:
            continue
        if not p.alive and p.sid in sessions:
            keep.add(p.pid)
        elif p.rank is not None or p.alive:
            if p.rank is not None:
                left.append(
                    f"left alone: rank {p.rank} pid {p.pid} ({visible(p.title)[:60]}): not a process of the "
                    f"run ({plan.rule or 'the plan'})"
                )
    return keep, left


async def kill(
    session: HostSession,
    plan: KillPlan,
    wait_s: float = DEFAULT_KILL_WAIT_S,
    ports: list[int] | None = None,
    why: str | None = None,
    run_id: str | None = None,
) -> dict:
    """Carry out exactly the plan (each pid checked against its planned start time and user before
    each signal), then verify: processes left, their GPU memory, the ports. With `why`, the agent
    first records on the host who stops which processes (and, a whole run verified gone, that it
    ended): every cockpit watching reads the deaths as the operator's, not as a crash."""
    entries = [
        {k: e[k] for k in ("pid", "start", "uid", "started", "title", "pgid", "sid") if k in e} for e in plan.entries
    ]
    who = {"why": why, "by": operator_id(), "run_id": run_id, "whole": not plan.scope.pids} if why else {}
    try:
        report = await session.request(
            "kill",
            timeout=wait_s + 60,
            plan=entries,
            wait_s=wait_s,
            sessions=plan.sessions,
            ports=list(ports or []),
            since=plan.planned_at,
            **who,
        )
    except LinkLost:
        # The agent lived inside what was killed (a container whose main process ended, a Slurm job
        # whose script ended): the link's engine says whether anything of it is left.
        gone = getattr(session.link, "verify_gone", None)
        if gone is None:
            raise
        report = await gone(plan.entries)
    for key in ("skipped", "newcomers"):
        report[key] = [dict(s, title=mask_text(s.get("title", ""))) for s in report.get(key) or []]
    report["verified"] = not (report["remaining"] or report["gpu_memory_left"] or report["ports_open"])
    return report


def summarize_kill(plan: KillPlan, report: dict) -> str:
    """The kill in one line: how many processes were stopped, how long it took, and whether that
    is verified (what is left, when it is not)."""
    took = f" in {report['seconds']:.1f} s" if report.get("seconds") is not None else ""
    line = f"stopped {count(len(plan.entries), 'process', 'processes')}{took}"
    if report["verified"]:
        return line + ", verified gone"
    left = [f"{count(len(report['remaining']), 'process', 'processes')} alive"] if report["remaining"] else []
    left += [f"GPU memory held on {count(len(report['gpu_memory_left']), 'GPU')}"] if report["gpu_memory_left"] else []
    left += [f"port {', '.join(map(str, report['ports_open']))} open"] if report["ports_open"] else []
    return line + ", NOT verified: " + "; ".join(left)


def summarize_clean(done: dict, left: int = 0, by_exit: bool = False) -> str:
    """A /dev/shm clean in one line: removed, already gone (`by_exit`, a clean after the run was
    stopped: its own exit removed them, as the plan said it might), kept at the last check, left
    (not tied to the run): each entry counted where it really went."""
    line = f"removed {count(len(done['removed']), '/dev/shm entry', '/dev/shm entries')}"
    skipped = done.get("skipped") or []
    gone = [s for s in skipped if s.get("gone")]
    if gone:
        line += f", {len(gone)} already removed by the run's own exit" if by_exit else f", {len(gone)} already gone"
    if len(skipped) > len(gone):
        line += f", kept {len(skipped) - len(gone)} (changed since listed)"
    if left:
        line += f", left {left} (not tied to this run)"
    return line


def describe_kill(report: dict) -> list[str]:
    lines = [
        f"SIGTERM {len(report['term'])}, SIGKILL {len(report['killed'])} "
        f"({', '.join(map(str, report['killed'])) or 'none needed'})"
    ]
    if report["verified"]:
        lines.append("verified: no process of the run left, no GPU memory held by it, its ports closed")
    for s in report.get("skipped") or []:
        lines.append(f"skipped pid {s['pid']}: {s['why']}")
    for s in report.get("newcomers") or []:
        lines.append(f"pid {s['pid']} {visible(s.get('title', ''))[:60]}: {s['why']}")
    lines += [f"  {visible(line)}" for line in report.get("notes", [])]
    if report["remaining"]:
        lines.append(f"STILL ALIVE: {', '.join(map(str, report['remaining']))}")
    for g in report["gpu_memory_left"]:
        lines.append(f"GPU {g['gpu']} still lists pid {g['pid']} with {g['mib']} MiB")
    if report["ports_open"]:
        lines.append(f"ports still open: {', '.join(map(str, report['ports_open']))}")
    mem = ", ".join(f"GPU{g['index']} {g['mem_used_mib']} MiB" for g in report.get("gpus_after", []))
    if mem:
        lines.append(f"GPU memory now: {mem}")
    return lines


# ----------------------------------------------------------------------------- shm


async def shm_audit(session: HostSession, folder: str = SHM_DEFAULT, uid: int | None = None) -> dict:
    """Every entry of the folder, each removable or kept with its reason. `uid`: the run's user
    (default: the user the agent runs as)."""
    return await session.request("shm_audit", timeout=60, folder=folder, uid=uid)


async def shm_clean(
    session: HostSession, names: list, folder: str = SHM_DEFAULT, uid: int | None = None, other_dir: bool = False
) -> dict:
    """Remove these entries, each re-checked by the agent. Each is a name or, better, the entry
    as listed ({"name", "dev", "ino", "born_ns"}: `listed`), so that only the file the operator saw is
    removed. A folder other than /dev/shm is refused unless `other_dir` says the operator named
    it and confirmed."""
    return await session.request("shm_clean", timeout=60, folder=folder, names=names, uid=uid, other_dir=other_dir)


def listed(e: dict) -> dict:
    """An audit entry as a clean is asked to remove it: its name and the file it was (device,
    inode and birth time: an inode number is handed out again once its file is removed)."""
    return {"name": e["name"], "dev": e.get("dev"), "ino": e.get("ino"), "born_ns": e.get("born_ns")}


@dataclass
class ShmForRun:
    """What a clean after a kill removes (each file tied to the run, and how) and what it
    leaves (each with why)."""

    remove: list[dict] = field(default_factory=list)
    left: list[dict] = field(default_factory=list)  # the run's user's, not tied to the run: {name, why, kind}
    others: int = 0  # entries no clean ever removes (another user's, not named like a run's, not a file)

    @property
    def names(self) -> list[str]:
        return [e["name"] for e in self.remove]


def shm_for_run(audit: dict, plan: KillPlan | None, held_before: dict | None = None) -> ShmForRun:
    """The files of the shm folder a clean after this kill will remove: a file named like an
    inference run's, owned by the run's user, that can be tied to the run by what its processes
    did, from an audit taken before the kill (while they still hold their files):
    - mapped or held open only by processes of the plan;
    - held by the run's processes earlier while it lived (`held_before`: (device, inode) ->
      when, as the monitor remembered it: `HostMonitor.note_shm_held`);
    - its name carries the pid of a process of the plan (torch_<pid>_…, sgl_shm_…_<pid>_…), and
      it was created after that process started.
    Any other such file is left: "cannot tell whose it is" (`cockpit shm --clean` shows it and
    removes it when asked); on a shared machine its creation time proves nothing. Each removal is
    the file listed (device and inode), checked again by the agent then."""
    out = ShmForRun()
    members = {e["pid"]: e for e in (plan.entries if plan else [])}
    held_before = held_before or {}
    for e in audit["entries"]:
        if e["kind"] != "file" or not e.get("family") or e.get("uid") != audit.get("uid"):
            out.others += 1  # never removed by any clean: counted, never listed
            continue
        held = set(e.get("held_by") or [])
        born = float(e.get("born") or 0.0)
        creator = e.get("creator")
        seen = held_before.get((e.get("dev"), e.get("ino")))
        tie = None
        if held - set(members):
            out.left.append(
                {
                    "name": e["name"],
                    "why": "held by pid " + ",".join(map(str, sorted(held))),
                    "kind": "held by processes that are not the run's",
                }
            )
            continue
        if held:
            tie = "held by the run's pid " + ",".join(map(str, sorted(held)))
        elif seen is not None and (not e.get("born") or born <= seen + 1.0):
            tie = f"held by the run while it lived (seen {when(seen)})"
        elif creator in members and born >= float(members[creator].get("started") or 0.0) - 1.0:
            tie = f"its name carries the run's pid {creator}"
        elif e.get("creator_alive"):
            out.left.append(
                {
                    "name": e["name"],
                    "why": f"its creator pid {creator} is alive",
                    "kind": "their creator, not the run's, is alive",
                }
            )
            continue
        if tie:
            out.remove.append(dict(listed(e), why=tie))
        else:
            out.left.append(
                {
                    "name": e["name"],
                    "why": f"{unclaimed(e)}; not held by the run while the cockpit "
                    f"watched it, no pid of it in its name: `cockpit shm --clean` "
                    f"removes it if asked",
                    "kind": UNTIED,
                }
            )
    return out


UNTIED = (
    "cannot tell whose it is: held by no process, not held by the run while the cockpit watched it, no pid "
    "of it in the name (`cockpit shm --clean` removes such entries if asked)"
)


def unclaimed(e: dict) -> str:
    """An entry no process holds, that no run can be tied to: said in these same words by
    `cockpit shm` (removable when asked) and by a relaunch's clean (left: not this run's)."""
    creator = e.get("creator")
    return "cannot tell whose it is: held by no process, " + (
        f"its creator pid {creator} dead" if creator is not None else "no creator pid in its name"
    )


def human_bytes(n: int | float | None) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def describe_shm(audit: dict, others: bool = True) -> list[str]:
    """A line per entry: the name column as wide as the longest name (at most 44), then size, age,
    owner, removable or kept, its holders and creator. Why an entry is kept is said once, as a
    numbered note under the list: many entries share one reason. Without `others` (a screen's
    dialog), other users' entries are counted, not listed: no clean of this user touches them."""
    mine = [e for e in audit["entries"] if others or e.get("uid") == audit.get("uid")]
    width = min(44, max((len(visible(e["name"])) for e in mine), default=4))
    notes: dict[str, int] = {}
    lines = [f"{'name':<{width}} {'size':>10} {'age':>8} {'owner':<8} removable?"]
    for e in mine:
        held = f"  held by {','.join(map(str, e['held_by']))}" if e["held_by"] else ""
        creator = (
            "" if e["creator"] is None else f"  creator {e['creator']} {'alive' if e['creator_alive'] else 'dead'}"
        )
        why = f"removable: {unclaimed(e)}" if e["removable"] else f"kept: {e.get('why') or 'kept'}"
        mark = f"{why.split(':', 1)[0]} ({notes.setdefault(why, len(notes) + 1)})"
        lines.append(
            f"{visible(e['name'])[:44]:<{width}} {human_bytes(e['size']):>10} {e['age_s']:>7.0f}s "
            f"{visible(e['owner'])[:8]:<8} {mark}{held}{creator}"
        )
    lines += [f"({n}) {why}" for why, n in notes.items()]
    if len(mine) < len(audit["entries"]):
        lines.append(
            f"and {count(len(audit['entries']) - len(mine), 'entry', 'entries')} of other users, not listed "
            f"(never removed by a clean of {audit.get('user') or 'this user'}'s: `cockpit shm` lists them)"
        )
    removable = [e for e in audit["entries"] if e["removable"]]
    lines.append(
        f"{audit['folder']}: {len(audit['entries'])} entries, {len(removable)} removable "
        f"({human_bytes(sum(e['bytes'] for e in removable))}), free {human_bytes(audit['free_bytes'])} "
        f"of {human_bytes(audit['total_bytes'])}"
    )
    if audit.get("user"):
        lines.append(
            f"removable: files named like an inference run's ({', '.join(audit.get('prefixes') or [])}), "
            f"owned by {audit['user']}, held by no process, their creator dead"
        )
    return lines


def describe_shm_for_run(found: ShmForRun, folder: str) -> list[str]:
    """What a clean after a kill removes: the run's entries, each listed with how it is tied to
    the run (one the run's own exit removes first is said so after); what it leaves is counted by
    reason, never listed (on a shared host, hundreds of other runs' and users' files: `s` and
    `cockpit shm` list them)."""
    lines = []
    if found.remove:
        lines.append(
            f"then the run's {count(len(found.remove), 'entry', 'entries')} of {folder}: removed, each "
            f"checked again first (one the run's own exit removed first is said so):"
        )
        lines += [f"  rm {visible(e['name'])}  ({e['why']})" for e in found.remove]
    else:
        lines.append(f"nothing of the run's to remove from {folder}")
    kinds: dict[str, int] = {}
    for e in found.left:
        kinds[e.get("kind") or e["why"]] = kinds.get(e.get("kind") or e["why"], 0) + 1
    for kind, n in kinds.items():
        lines.append(f"  left ({count(n, 'entry', 'entries')}, not tied to this run): {kind}")
    if found.others:
        lines.append(
            f"  not touched ({count(found.others, 'entry', 'entries')}): another user's, or not named like "
            f"an inference run's"
        )
    if found.left or found.others:
        lines.append(f"  (`s`, or `cockpit shm`, lists every entry of {folder} with why)")
    return lines


def describe_clean(done: dict, by_exit: bool = False) -> list[str]:
    """A clean's entries, each where it went (`by_exit`: as summarize_clean)."""
    gone = "already removed by the run's own exit" if by_exit else "already gone"
    lines = [f"removed {count(len(done['removed']), 'entry', 'entries')}, freed {human_bytes(done['freed_bytes'])}"]
    lines += [f"removed {visible(n)}" for n in done["removed"]]
    lines += [
        f"{gone} {visible(s['name'])}" if s.get("gone") else f"kept {visible(s['name'])}: {s['why']}"
        for s in done["skipped"]
    ]
    return lines


def rank_pids(state: HostState, pids: set[int] | None = None) -> list[tuple[int | None, int]]:
    """(rank, pid) of the live ranks (of these pids: the run's, `of_run`); a run without ranked
    titles falls back to its watched tree."""
    ranks = [(p.rank, p.pid) for p in state.ranks() if p.alive and (pids is None or p.pid in pids)]
    if ranks:
        return ranks
    return [(None, p.pid) for p in state.live_procs() if pids is None or p.pid in pids]
