"""The operator's actions, as the story's operator did them by hand: kill the run and verify it is
gone, audit and clean the shm folder. Each is planned first (the plan names exactly what will be
touched, for the confirmation), then carried out by the agent on the host, which re-checks every
pid's start time and every shm entry before it acts. No kill by name pattern across the host."""

from __future__ import annotations

from dataclasses import dataclass, field

from cockpit.errors import LinkLost
from cockpit.hosttext import visible
from cockpit.model import HostState
from cockpit.session import HostSession

DEFAULT_KILL_WAIT_S = 10.0


@dataclass
class Scope:
    """What belongs to a run: its process groups and sessions, and pids recorded for it."""

    pgids: list[int] = field(default_factory=list)
    sids: list[int] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)

    def args(self) -> dict:
        return {"pgids": self.pgids, "sids": self.sids, "pids": self.pids}


def run_scope(session: HostSession) -> Scope:
    """The run on screen: a run the cockpit launched is its own session and process group; a run
    found by its titles is the watched tree plus the process groups of its ranks and server."""
    state = session.state
    launched = list(session.watch.pgids)
    live = [p for p in state.procs.values() if p.alive]
    groups = set(launched) | {p.pgid for p in live if p.pgid and (p.role or p.rank is not None)}
    return Scope(pgids=sorted(groups), sids=launched, pids=sorted(p.pid for p in live))


def process_scope(pid: int) -> Scope:
    """One process (and what it started): the `k` key."""
    return Scope(pids=[pid])


@dataclass
class KillPlan:
    scope: Scope
    entries: list[dict]

    def describe(self) -> list[str]:
        lines = [f"{'pid':>7} {'pgid':>7} {'sid':>7} st  command"]
        for e in self.entries:
            lines.append(f"{e['pid']:>7} {e['pgid']:>7} {e['sid']:>7} {e['status']:<3} {visible(e['title'])[:90]}")
        groups = sorted({e["pgid"] for e in self.entries})
        lines.append(f"{len(self.entries)} processes in process groups {', '.join(map(str, groups)) or '-'}: "
                     f"SIGTERM, then SIGKILL after the wait")
        return lines


async def plan_kill(session: HostSession, scope: Scope) -> KillPlan:
    data = await session.request("kill_plan", **scope.args())
    return KillPlan(scope, data["plan"])


async def kill(session: HostSession, plan: KillPlan, wait_s: float = DEFAULT_KILL_WAIT_S,
               ports: list[int] | None = None) -> dict:
    """Kill what the plan names, then verify: processes left, their GPU memory, the ports."""
    try:
        report = await session.request("kill", timeout=wait_s + 30, plan=plan.entries, wait_s=wait_s,
                                       ports=list(ports or []), **plan.scope.args())
    except LinkLost:
        # The agent lived inside what was killed (a container whose main process ended, a Slurm job
        # whose script ended): the link's engine says whether anything of it is left.
        gone = getattr(session.link, "verify_gone", None)
        if gone is None:
            raise
        report = await gone(plan.entries)
    report["verified"] = not (report["remaining"] or report["gpu_memory_left"] or report["ports_open"])
    return report


def describe_kill(report: dict) -> list[str]:
    lines = [f"SIGTERM {len(report['term'])}, SIGKILL {len(report['killed'])} "
             f"({', '.join(map(str, report['killed'])) or 'none needed'})"]
    if report["verified"]:
        lines.append("verified: no process of the run left, no GPU memory held by it, its ports closed")
    lines += [f"  {line}" for line in report.get("notes", [])]
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


async def shm_audit(session: HostSession, folder: str = "/dev/shm") -> dict:
    return await session.request("shm_audit", timeout=60, folder=folder)


async def shm_clean(session: HostSession, names: list[str], folder: str = "/dev/shm") -> dict:
    return await session.request("shm_clean", timeout=60, folder=folder, names=names)


def human_bytes(n: int | float | None) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def describe_shm(audit: dict) -> list[str]:
    lines = [f"{'name':<44} {'size':>10} {'age':>8} {'owner':<8} held by / creator"]
    for e in audit["entries"]:
        held = ",".join(map(str, e["held_by"])) if e["held_by"] else "-"
        creator = "" if e["creator"] is None else f"  creator {e['creator']} {'alive' if e['creator_alive'] else 'dead'}"
        mark = "removable" if e["removable"] else "keep"
        lines.append(f"{visible(e['name'])[:44]:<44} {human_bytes(e['size']):>10} {e['age_s']:>7.0f}s {visible(e['owner'])[:8]:<8} "
                     f"{held}{creator}  [{mark}]")
    removable = [e for e in audit["entries"] if e["removable"]]
    lines.append(f"{audit['folder']}: {len(audit['entries'])} entries, {len(removable)} removable "
                 f"({human_bytes(sum(e['bytes'] for e in removable))}), free {human_bytes(audit['free_bytes'])} "
                 f"of {human_bytes(audit['total_bytes'])}")
    return lines


def rank_pids(state: HostState) -> list[tuple[int | None, int]]:
    """(rank, pid) of the live ranks; a run without ranked titles falls back to its watched tree."""
    ranks = [(p.rank, p.pid) for p in state.ranks() if p.alive]
    if ranks:
        return ranks
    return [(None, p.pid) for p in state.live_procs()]
