"""Stack dumps of every rank at once (py-spy on the host), saved raw, and grouped: ranks whose
main thread has the same Python frames merged with their rank ranges, the odd rank out named
with its difference from the majority. A rank that is dead (gone, or a zombie its parent has
not reaped) is said to be dead, with its exit code where known, and py-spy is not run on it.

py-spy --native prints one frame a line, innermost first: Python frames as `func (file.py:LINE)`,
native ones as `symbol (libfoo.so.1)`, `0x7f3a… (libc.so.6)` or `symbol (source.c:LINE)` when
the library has debug information. The report shows the Python frames and folds the native
frames above the innermost Python one (where the thread actually waits) into one line,
`cudaStreamSynchronize <- libcuda (8 frames)`: the first named frame outside the innermost
library, that library, and how many frames the fold holds. The full frames are one key (or
`--full`) away. Parsing and grouping are pure functions."""

from __future__ import annotations

import difflib
import hashlib
import os
import platform
import re
import signal
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable

from cockpit.errors import CockpitError
from cockpit.hosttext import count, visible
from cockpit.model import HostState, Proc
from cockpit.session import HostSession

THREAD = re.compile(r'^Thread (\S+) \(([^)]*)\)(?:: "(.*)")?')
FRAME = re.compile(r"^    (\S.*) \(([^()]*)\)\s*$")  # 4 spaces: --locals lines are indented deeper
FILE_LINE = re.compile(r"^(.*?)(?::(\d+))?$")
PYTHON_FILE = re.compile(r"\.(py|pyw|pyx|pyi)$")
NATIVE_SOURCE = re.compile(r"\.(c|cc|cpp|cxx|c\+\+|h|hh|hpp|cu|cuh|rs|s|S|inc)$")
SHARED_LIB = re.compile(r"^(.*?)\.(?:so|dylib|dll)(?:\.[\w.]*)?$")
ADDRESS = re.compile(r"^0x[0-9a-fA-F]+$")
SHOWN_FRAMES = 12


@dataclass(frozen=True)
class Frame:
    name: str
    file: str
    line: int | None = None
    native: bool = False

    @property
    def key(self) -> str:
        """What stays the same between two ranks at the same place: no line number."""
        return f"{self.name} ({self.file})"

    @property
    def address(self) -> bool:
        return bool(ADDRESS.match(self.name))

    def __str__(self) -> str:
        return f"{self.name} ({self.file}:{self.line})" if self.line is not None else f"{self.name} ({self.file})"


def is_native(name: str, file: str, line: int | None) -> bool:
    """A frame of a shared library or of C/C++/Rust source, not of Python code."""
    if ADDRESS.match(name) or SHARED_LIB.match(file) or NATIVE_SOURCE.search(file):
        return True
    if PYTHON_FILE.search(file) or file.startswith("<"):  # <string>, <frozen importlib._bootstrap>
        return False
    return line is None  # a script without .py still has line numbers; a bare binary has none


def parse_frame(line: str) -> Frame | None:
    m = FRAME.match(line)
    if not m:
        return None
    fm = FILE_LINE.match(m.group(2))
    file, num = fm.group(1), int(fm.group(2)) if fm.group(2) else None
    return Frame(m.group(1), file, num, is_native(m.group(1), file, num))


@dataclass
class Thread:
    tid: str
    state: str
    name: str
    frames: list[Frame] = field(default_factory=list)  # innermost first

    @property
    def python(self) -> list[Frame]:
        return [f for f in self.frames if not f.native]

    @property
    def native_tail(self) -> list[Frame]:
        """The native frames above the innermost Python frame: where the thread is."""
        out = []
        for f in self.frames:
            if not f.native:
                break
            out.append(f)
        return out


def parse_dump(text: str) -> list[Thread]:
    threads: list[Thread] = []
    for line in text.splitlines():
        m = THREAD.match(line)
        if m:
            threads.append(Thread(m.group(1), m.group(2), m.group(3) or ""))
            continue
        f = parse_frame(line)
        if f and threads:
            threads[-1].frames.append(f)
    return threads


def main_thread(threads: list[Thread]) -> Thread | None:
    return next((t for t in threads if t.name == "MainThread"), threads[0] if threads else None)


def library(file: str) -> str:
    """libcuda.so.595.71.05 -> libcuda, libpython3.11.so.1.0 -> libpython3.11; a source file stays."""
    m = SHARED_LIB.match(file.rsplit("/", 1)[-1])
    return m.group(1) if m else file.rsplit("/", 1)[-1]


def short_symbol(name: str, width: int = 60) -> str:
    """A C++ symbol without its template arguments, cut to `width`."""
    prev = None
    while prev != name:
        prev, name = name, re.sub(r"<[^<>]*>", "\x00", name)
    name = name.replace("\x00", "<>")
    return name if len(name) <= width else name[: width - 1] + "…"


def fold_native(frames: list[Frame]) -> str | None:
    """The native tail in one line: `cudaStreamSynchronize <- libcuda (8 frames)` reads as
    "cudaStreamSynchronize, waiting inside libcuda"."""
    if not frames:
        return None
    inner = library(frames[0].file)
    named = [f for f in frames if not f.address]
    outside = next((f for f in named if library(f.file) != inner), None)
    n_frames = count(len(frames), "frame")
    if outside:
        return f"{short_symbol(outside.name)} <- {inner} ({n_frames})"
    if named:
        return f"{short_symbol(named[0].name)} ({inner}, {n_frames})"
    return f"{inner} ({n_frames})"


def signature(text: str) -> tuple[str, ...]:
    """What identifies where a rank is: its main thread's Python frames, without line numbers.
    Native frames differ between ranks in the same wait (addresses, the libc path taken), so
    they do not split a group; a thread without Python frames is known by its native symbols."""
    main = main_thread(parse_dump(text))
    if main is None:
        return ("(no stack)",)
    frames = [f.key for f in main.python] or [f.key for f in main.frames if not f.address]
    return tuple(frames) or (f"({main.state}, no frames)",)


def rank_ranges(ranks: list[int]) -> str:
    """[0, 1, 2, 4, 5, 6, 7] -> "0-2,4-7"."""
    ranks = sorted(ranks)
    out = []
    start = prev = None
    for r in ranks:
        if start is None:
            start = prev = r
        elif r == prev + 1:
            prev = r
        else:
            out.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = r
    if start is not None:
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ",".join(out)


def _who(ranks: list[int]) -> str:
    return f"ranks {rank_ranges(ranks)}" if len(ranks) > 1 else f"rank {ranks[0]}"


@dataclass
class Group:
    ranks: list[int]
    frames: tuple[str, ...]  # the signature: Python frames without line numbers, innermost first
    odd: bool = False
    diff: list[str] = field(default_factory=list)
    stacks: dict[int, Thread] = field(default_factory=dict)  # rank -> its parsed main thread

    @property
    def shown(self) -> Thread | None:
        """The lowest rank's main thread: its Python frames, with line numbers, stand for the group."""
        return self.stacks.get(self.ranks[0]) if self.stacks else None

    def natives(self) -> list[tuple[str, list[int]]]:
        """Each distinct folded native tail and its ranks, the most common first."""
        by: dict[str, list[int]] = {}
        for rank in self.ranks:
            t = self.stacks.get(rank)
            fold = fold_native(t.native_tail) if t else None
            if fold:
                by.setdefault(fold, []).append(rank)
        return sorted(by.items(), key=lambda kv: (-len(kv[1]), kv[1]))


def group_stacks(dumps: dict[int, str]) -> list[Group]:
    """dumps: rank -> py-spy text. Largest group first; a smaller group is odd when one group
    holds most ranks, and carries its diff against that majority."""
    by_sig: dict[tuple[str, ...], list[int]] = {}
    for rank, text in dumps.items():
        by_sig.setdefault(signature(text), []).append(rank)
    groups = sorted((Group(sorted(r), sig) for sig, r in by_sig.items()), key=lambda g: (-len(g.ranks), g.ranks))
    for g in groups:
        for rank in g.ranks:
            main = main_thread(parse_dump(dumps[rank]))
            if main is not None:
                g.stacks[rank] = main
    if len(groups) > 1 and len(groups[0].ranks) > len(groups[1].ranks):
        major = groups[0]
        for g in groups[1:]:
            g.odd = True
            g.diff = [line for line in difflib.unified_diff(
                list(reversed(major.frames)), list(reversed(g.frames)),
                f"ranks {rank_ranges(major.ranks)}", f"rank {rank_ranges(g.ranks)}", lineterm="", n=1)]
    return groups


def describe_groups(groups: list[Group], full: bool = False) -> list[str]:
    """Each group: its ranks, the Python frames of its main thread (innermost first), then its
    native tail folded into one line (a line per distinct tail, with its ranks, when the ranks
    of the group wait in different native code). `full`: every frame, native ones unfolded."""
    lines = []
    for g in groups:
        shown = g.shown
        state = f" ({shown.state})" if shown and shown.state else ""
        lines.append(f"{'ODD ONE OUT: ' if g.odd else ''}{_who(g.ranks)} ({len(g.ranks)}), "
                     f"main thread{state}, Python frames innermost first:")
        frames = [str(f) for f in shown.python] if shown else []
        frames = frames or list(g.frames)
        limit = len(frames) if full else SHOWN_FRAMES
        lines.extend(f"    {visible(fr)}" for fr in frames[:limit])
        if len(frames) > limit:
            lines.append(f"    ... {len(frames) - limit} more frames")
        natives = g.natives()
        for fold, ranks in natives:
            whose = f" [{_who(ranks)}]" if len(natives) > 1 or len(ranks) != len(g.ranks) else ""
            lines.append(f"  native: {visible(fold)}{whose}")
        if g.diff:
            lines.append("  difference from the majority (outermost first):")
            lines.extend(f"    {visible(d)}" for d in g.diff[2:])
        if full and g.stacks:
            seen = set()
            for fold, ranks in natives or [(None, g.ranks)]:
                rank = ranks[0]
                if rank in seen or rank not in g.stacks:
                    continue
                seen.add(rank)
                lines.append(f"  every frame of rank {rank}, innermost first (> a Python frame):")
                lines.extend(f"    {'' if f.native else '> '}{visible(str(f))}" for f in g.stacks[rank].frames)
    return lines


# ----------------------------------------------------------------------------- dead ranks


def exit_text(code: int | None) -> str:
    if code is None:
        return ""
    if code < 0:
        try:
            return f"exit code {code}, {signal.Signals(-code).name}"
        except ValueError:
            pass
    return f"exit code {code}"


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
    (the run's: actions.find_run and actions.of_run), so that two servers' rank 0 are never
    mixed. A run without ranked titles falls back to its live watched tree."""
    by_rank: dict[int, Proc] = {}
    for p in state.ranks():
        if pids is not None and p.pid not in pids:
            continue
        cur = by_rank.get(p.rank)
        if cur is None or (_dead(cur) and not _dead(p)) or \
                (_dead(cur) == _dead(p) and (p.gone_at or 0.0) > (cur.gone_at or 0.0)):
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
    return {"path": path, "version": version, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
            "data": data}


async def ensure_pyspy(session: HostSession, upload: bool = False,
                       say: Callable[[str], None] | None = None) -> tuple[str | None, dict]:
    """py-spy for the host. On `local` (and the demo) the cockpit's own py-spy; elsewhere the
    host's, else the one an earlier upload left in the host's cache folder, else (when asked,
    and the architecture matches: the host needs no network) ours uploaded there: what is sent,
    and where, is said before it is sent. Returns the path to use and the agent's check."""
    ours = local_pyspy()
    if session.target.kind in ("local", "demo") and ours:
        return ours, await session.request("dump_check", pyspy=ours)
    check = await session.request("dump_check")
    if check["pyspy"]:
        return check["pyspy"], check
    home = session.state.agent.home or "/tmp"
    dest = f"{home}/.cache/gpu-cockpit/py-spy"
    if not upload:
        cached = await session.request("dump_check", pyspy=dest)  # sent by an earlier --upload-pyspy
        return (dest, cached) if cached["pyspy"] == dest else (None, check)
    if not ours:
        raise CockpitError("py-spy is missing on the host and in this cockpit's environment (it is a dependency of "
                           "gpu-cockpit: reinstall it, or pip install py-spy next to it)")
    if check["arch"] != platform.machine():
        raise CockpitError(f"py-spy is missing on the host, whose architecture ({check['arch']}) differs from "
                           f"this machine's ({platform.machine()}): install py-spy there")
    info = pyspy_info(ours)
    if say:
        say(f"uploading py-spy {info['version']} ({info['path']}, {info['size']} bytes, sha256 {info['sha256']}) "
            f"to {session.target.label}:{dest}")
    await session.link.run(["mkdir", "-p", f"{home}/.cache/gpu-cockpit"])
    res = await session.link.run(["dd", f"of={dest}", "status=none"], input=info["data"], timeout=120)
    if res.rc != 0:
        raise CockpitError(f"uploading py-spy to {dest} failed: {res.stderr.decode(errors='replace').strip()}")
    await session.link.run(["chmod", "700", dest])
    got = await session.link.run(["sha256sum", dest])
    if got.rc == 0 and got.stdout.split()[:1] != [info["sha256"].encode()]:
        raise CockpitError(f"the py-spy uploaded to {dest} does not match this one (sha256 differs): not used")
    return dest, await session.request("dump_check", pyspy=dest)


def _write_private(path: Path, text: str) -> None:
    """Written whole or not at all (temp file and rename), readable by the owner only."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def dumps_dir(run: str) -> Path:
    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "gpu-cockpit"
    path = base / "runs" / re.sub(r"[^A-Za-z0-9._-]", "_", run) / "dumps" / time.strftime("%Y%m%d-%H%M%S")
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
        return {"folder": str(self.folder), "pyspy": self.pyspy, "pyspy_version": self.check.get("version"),
                "failed": self.failed, "dead": [d.as_json() for d in self.dead],
                "groups": [{"ranks": g.ranks, "odd": g.odd, "frames": list(g.frames), "diff": g.diff,
                            "native": [{"fold": fold, "ranks": ranks} for fold, ranks in g.natives()],
                            "stacks": {str(r): [str(f) for f in t.frames] for r, t in g.stacks.items()}}
                           for g in self.groups]}


async def dump_ranks(session: HostSession, ranks: list[tuple[int | None, int]], run: str,
                     upload: bool = False, deadline_s: float = 20.0,
                     say: Callable[[str], None] | None = None) -> DumpSet:
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
        pyspy, check = await ensure_pyspy(session, upload, say)
        if not pyspy:
            raise CockpitError("py-spy is not installed on the host: install it there (pip install py-spy), or "
                               "dump again with --upload-pyspy to send the one this install carries")
        if check["problems"]:
            raise CockpitError("cannot attach to the ranks: " + "; ".join(check["problems"]))
    data = {"dumps": {}, "check": check}
    if ask:
        data = await session.request("dump", timeout=deadline_s + 30, pids=[pid for _, _, pid in ask], pyspy=pyspy,
                                     deadline_s=deadline_s)
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
