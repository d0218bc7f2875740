"""Dumps of every rank of the run, as the kill finds it: py-spy stacks (saved raw in the run's
folder, grouped by cockpit.read.stacks; dead ranks said dead with their exit code, py-spy never run
on them) and torch's flight-recorder dumps (asked through each rank's pipe, compared by
cockpit.read.flightrec)."""

from __future__ import annotations

import hashlib
import os
import platform
import re
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cockpit.actions import kill
from cockpit.common.errors import CockpitError
from cockpit.host.session import HostSession
from cockpit.host.state import HostState, Proc
from cockpit.read import flightrec
from cockpit.read.stacks import Group, describe_groups, exit_text, group_stacks
from cockpit.runs.ledger import state_home
from cockpit.runs.run import Run


@dataclass
class DeadRank:
    """A rank that had exited when its stack was asked for: py-spy was not run on it."""

    rank: int | None
    pid: int
    status: str  # "Z": a zombie its parent has not reaped; "gone": no such process any more
    exit_code: int | None = None
    during: bool = False  # it died while py-spy read it

    def describe(self) -> str:
        who = f"rank {self.rank}" if self.rank is not None else f"pid {self.pid}"
        how = exit_text(self.exit_code) or "exit code unknown"
        if self.status == "Z":
            how += "; a zombie its parent has not reaped"
        return f"{who}: {'died during the dump' if self.during else 'dead'} ({how}), no stack"

    def as_json(self) -> dict:
        return {"rank": self.rank, "pid": self.pid, "status": self.status, "exit_code": self.exit_code}


def _dead(p: Proc) -> bool:
    return not p.alive or p.status in ("Z", "X")


def dump_targets(state: HostState, pids: set[int] | None = None) -> list[tuple[int | None, int]]:
    """(rank, pid) of every rank the host state knows, the dead ones included (dump_ranks says
    they are dead): one process per rank, the live one when a rank has both. `pids`: only these
    (the run's: kill.member_plan and kill.of_run), so that two servers' rank 0 are never
    mixed. A run without ranked titles falls back to its live watched tree."""
    by_rank: dict[int, Proc] = {}
    for p in state.ranks():
        if pids is not None and p.pid not in pids:
            continue
        cur = by_rank.get(p.rank)
        if (
            cur is None
            or (_dead(cur) and not _dead(p))
            or (_dead(cur) == _dead(p) and (p.gone_at or 0.0) > (cur.gone_at or 0.0))
        ):
            by_rank[p.rank] = p
    if by_rank:
        return [(rank, p.pid) for rank, p in sorted(by_rank.items())]
    return [(None, p.pid) for p in state.live_procs() if pids is None or p.pid in pids]


# ----------------------------------------------------------------------------- py-spy


def local_pyspy() -> str | None:
    """The py-spy of this cockpit's own environment (py-spy is a dependency of the package): in
    the scripts folder of the interpreter that runs the cockpit, not whatever PATH finds first."""
    folders = [sysconfig.get_path("scripts"), str(Path(sys.executable).parent), str(Path(sys.prefix) / "bin")]
    try:
        folders.append(sysconfig.get_path("scripts", f"{os.name}_user"))
    except KeyError:
        pass
    for folder in folders:
        cand = Path(folder) / "py-spy"
        if cand.is_file() and os.access(cand, os.X_OK):
            return str(cand)
    return None


def pyspy_info(path: str) -> dict:
    """What an upload would send: the file, its version, size and sha256."""
    data = Path(path).read_bytes()
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10)
        version = out.stdout.strip().rsplit(" ", 1)[-1] or "?"
    except (OSError, subprocess.SubprocessError):
        version = "?"
    return {
        "path": path,
        "version": version,
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "data": data,
    }


class PyspyMissing(CockpitError):
    """No py-spy on the host where it was looked for; `offer` is what an upload would send, and
    where (None when this cockpit has none to send, or the host's architecture differs), so a
    screen can ask before it sends anything."""

    def __init__(self, msg: str, offer: dict | None):
        super().__init__(msg)
        self.offer = offer


def interpreter_folders(session: HostSession, python: str | None = None) -> list[str]:
    """The bin folders of the interpreters the run is known by: the layout's (`python`) and the
    agent's; a bare name (python3) is PATH's, looked at anyway."""
    out: list[str] = []
    for exe in (python, session.opts.python):
        if exe and "/" in exe:
            folder = exe.rsplit("/", 1)[0] or "/"
            if folder not in out:
                out.append(folder)
    return out


def upload_dest(session: HostSession) -> str:
    return f"{session.state.agent.home or '/tmp'}/.cache/gpu-cockpit/py-spy"


async def ensure_pyspy(
    session: HostSession, upload: bool = False, say: Callable[[str], None] | None = None, python: str | None = None
) -> tuple[str | None, dict]:
    """py-spy for the host. On `local` (and the demo) the cockpit's own py-spy; elsewhere the one
    beside the layout's interpreter (`python`, and the agent's: its venv's bin), else the host's
    PATH, else the one an earlier upload left in the host's cache folder, else (when asked, and
    the architecture matches: the host needs no network) ours uploaded there: what is sent, and
    where, is said before it is sent. Returns the path to use (None: none) and the agent's check,
    whose `looked` says where it was looked for."""
    ours = local_pyspy()
    if session.target.kind in ("local", "demo") and ours:
        return ours, await session.request("dump_check", pyspy=ours)
    check = await session.request("dump_check", beside=interpreter_folders(session, python))
    if check["pyspy"]:
        return check["pyspy"], check
    dest = upload_dest(session)
    cached = await session.request("dump_check", pyspy=dest)  # sent by an earlier upload
    if cached["pyspy"] == dest:
        return dest, cached
    check["looked"] = list(check.get("looked") or []) + [dest]
    if not upload:
        return None, check
    offer = upload_offer(session, check)
    if isinstance(offer, str):
        raise CockpitError(offer)
    if say:
        say(
            f"uploading py-spy {offer['version']} ({offer['path']}, {offer['size']} bytes, sha256 {offer['sha256']}) "
            f"to {session.target.label}:{dest}"
        )
    home = dest.rsplit("/", 1)[0]
    await session.link.run(["mkdir", "-p", home])
    res = await session.link.run(["dd", f"of={dest}", "status=none"], input=offer["data"], timeout=120)
    if res.rc != 0:
        raise CockpitError(f"uploading py-spy to {dest} failed: {res.stderr.decode(errors='replace').strip()}")
    await session.link.run(["chmod", "700", dest])
    got = await session.link.run(["sha256sum", dest])
    if got.rc == 0 and got.stdout.split()[:1] != [offer["sha256"].encode()]:
        raise CockpitError(f"the py-spy uploaded to {dest} does not match this one (sha256 differs): not used")
    return dest, await session.request("dump_check", pyspy=dest)


def upload_offer(session: HostSession, check: dict) -> dict | str:
    """What an upload of this cockpit's py-spy would send (path, version, size, sha256, `dest`
    on the host), or why none can be sent."""
    ours = local_pyspy()
    if not ours:
        return (
            "py-spy is missing on the host and in this cockpit's environment (it is a dependency of "
            "gpu-cockpit: reinstall it, or pip install py-spy next to it)"
        )
    if check.get("arch") != platform.machine():
        return (
            f"py-spy is missing on the host, whose architecture ({check.get('arch')}) differs from this "
            f"machine's ({platform.machine()}): install py-spy there"
        )
    return dict(pyspy_info(ours), dest=upload_dest(session))


def missing(session: HostSession, check: dict) -> PyspyMissing:
    """No py-spy where it was looked for: said with where, and what can be done."""
    offer = upload_offer(session, check)
    looked = "; ".join(check.get("looked") or [])
    fix = (
        f"or dump again with --upload-pyspy to send this install's py-spy {offer['version']} to {offer['dest']}"
        if isinstance(offer, dict)
        else offer
    )
    return PyspyMissing(
        f"py-spy is not installed on {session.target.label} (looked for: {looked}): install it "
        f"there (pip install py-spy into the layout's environment), {fix}",
        offer if isinstance(offer, dict) else None,
    )


def _write_private(path: Path, text: str) -> None:
    """Written whole or not at all (temp file and rename), readable by the owner only."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def dumps_dir(run: str) -> Path:
    path = state_home() / "runs" / re.sub(r"[^A-Za-z0-9._-]", "_", run) / "dumps" / time.strftime("%Y%m%d-%H%M%S")
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


@dataclass
class DumpSet:
    folder: Path
    groups: list[Group]
    failed: dict[int, list[str]]
    check: dict
    dead: list[DeadRank] = field(default_factory=list)
    pyspy: str | None = None

    def report(self, full: bool = False) -> list[str]:
        """The groups, then the dead ranks, then the ranks py-spy could not read."""
        lines = describe_groups(self.groups, full)
        lines += [d.describe() for d in self.dead]
        lines += [f"rank {r}: no dump ({'; '.join(e)})" for r, e in self.failed.items()]
        return lines

    def as_json(self) -> dict:
        return {
            "folder": str(self.folder),
            "pyspy": self.pyspy,
            "pyspy_version": self.check.get("version"),
            "failed": self.failed,
            "dead": [d.as_json() for d in self.dead],
            "groups": [
                {
                    "ranks": g.ranks,
                    "odd": g.odd,
                    "frames": list(g.frames),
                    "diff": g.diff,
                    "native": [{"fold": fold, "ranks": ranks} for fold, ranks in g.natives()],
                    "stacks": {str(r): [str(f) for f in t.frames] for r, t in g.stacks.items()},
                }
                for g in self.groups
            ],
        }


async def dump_ranks(
    session: HostSession,
    ranks: list[tuple[int | None, int]],
    run: str,
    upload: bool = False,
    deadline_s: float = 20.0,
    say: Callable[[str], None] | None = None,
    python: str | None = None,
) -> DumpSet:
    """Dumps the ranks' stacks. A rank the host state already knows dead is reported dead with
    its exit code, and nothing runs on it; a zombie, or a rank that died since the last sample,
    the agent finds dead before py-spy runs (py-spy fails on those with an unhelpful error)."""
    state = session.state
    dead: list[DeadRank] = []
    ask: list[tuple[int, int | None, int]] = []
    for n, (rank, pid) in enumerate(ranks):
        key = rank if rank is not None else n
        p = state.procs.get(pid)
        if p is not None and not p.alive:
            dead.append(DeadRank(rank, pid, "gone", p.exit_code))
        else:
            ask.append((key, rank, pid))
    live = [pid for _, _, pid in ask if not (state.procs.get(pid) and state.procs[pid].status == "Z")]
    pyspy, check = None, {}
    if live:
        pyspy, check = await ensure_pyspy(session, upload, say, python)
        if not pyspy:
            raise missing(session, check)
        if check["problems"]:
            raise CockpitError("cannot attach to the ranks: " + "; ".join(check["problems"]))
    data = {"dumps": {}, "check": check}
    if ask:
        data = await session.request(
            "dump", timeout=deadline_s + 30, pids=[pid for _, _, pid in ask], pyspy=pyspy, deadline_s=deadline_s
        )
    folder = dumps_dir(run)
    texts: dict[int, str] = {}
    failed: dict[int, list[str]] = {}
    for key, rank, pid in ask:
        d = data["dumps"].get(str(pid)) or {"ok": False, "errors": ["no answer"], "text": ""}
        if d.get("dead"):
            known = state.procs.get(pid)
            code = d.get("exit_code") if d.get("exit_code") is not None else known.exit_code if known else None
            dead.append(DeadRank(rank, pid, d.get("status") or "gone", code, during=bool(d.get("errors"))))
        elif d["ok"]:
            texts[key] = d["text"]
        else:
            failed[key] = d["errors"]
    dead.sort(key=lambda x: (x.rank is None, x.rank or 0, x.pid))
    for n, (rank, pid) in enumerate(ranks):
        key = rank if rank is not None else n
        name = f"rank{rank}-pid{pid}.txt" if rank is not None else f"pid{pid}.txt"
        gone = next((x for x in dead if x.pid == pid), None)
        body = texts.get(key) or (gone.describe() + "\n" if gone else "\n".join(failed.get(key, ["no answer"])) + "\n")
        _write_private(folder / name, body)
    result = DumpSet(folder, group_stacks(texts), failed, data["check"] or check, dead, pyspy)
    _write_private(folder / "groups.txt", "\n".join(result.report(full=True)) + "\n")
    return result


@dataclass
class DumpPlan:
    """What a stack dump touches: the ranks of `run`, found as the kill finds them (never another
    run's or another user's), and a line for each watched rank left alone."""

    run: Run
    rule: str
    ranks: list[tuple[int | None, int]]
    left: list[str]

    def describe(self) -> list[str]:
        return [f"the run: {self.rule}"] + self.left


async def plan_dump(
    session: HostSession, run: Run, root: int | None = None, verb: str = "dump", live_only: bool = False
) -> DumpPlan:
    """The one way a dump finds the run's ranks (the screen's `d`, `cockpit dump`, a relaunch's
    stall, the bundle, the stall's forensics): kill.member_plan, then its members' ranks, the
    dead ones too (said dead) unless `live_only`."""
    plan = await kill.member_plan(session, run, root, verb)
    members, left = kill.of_run(session.state, plan)
    ranks = kill.rank_pids(session.state, members) if live_only else dump_targets(session.state, members)
    return DumpPlan(run, plan.rule, ranks, left)


# ----------------------------------------------------------------------------- flight recorder


def recorder_pids(state, pids: set[int] | None = None) -> list[int]:
    """The live ranks' pids (of these: the run's), whose pipes a dump is asked through."""
    return [pid for _, pid in kill.rank_pids(state, pids)]


async def run_rank_pids(session, run, root: int | None = None, verb: str = "flightrec") -> tuple[list[int], list[str]]:
    """The live ranks of `run` (a Run), found as the kill finds it (kill.member_plan: `root` names
    it; two runs: AmbiguousRun; none: CockpitError), and a line for each rank left alone. A run
    the host state does not watch (found only by the kill's rules) is asked through its plan's
    live processes."""
    plan = await kill.member_plan(session, run, root, verb)
    members, left = kill.of_run(session.state, plan)
    live = sorted(e["pid"] for e in plan.entries if e["pid"] in members)
    return recorder_pids(session.state, members) or live, left


async def collect(session, run, trigger: bool = True, root: int | None = None) -> tuple[dict, dict]:
    """Ask every live rank of `run` for its flight-recorder dump (through the pipe it holds
    open, with `trigger`) and compare them; an armed run's comparison is kept on the host state
    for the verdict. Ranks of another run or user are left alone and said so."""
    pids, left = await run_rank_pids(session, run, root)
    answer = await session.request("fr_dump", timeout=60, pids=pids, trigger=trigger)
    answer["problems"] = left + list(answer.get("problems") or [])
    result = flightrec.compare({int(r): d for r, d in (answer.get("ranks") or {}).items() if not d.get("error")})
    if answer.get("armed"):
        session.state.flight = result
    return answer, result
