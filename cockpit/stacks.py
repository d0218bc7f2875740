"""Stack dumps of every rank at once (py-spy on the host), saved raw, and grouped: identical
stacks merged with their rank ranges, the odd rank out named with its difference from the
majority. Parsing and grouping are pure functions."""

from __future__ import annotations

import difflib
import os
import platform
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from cockpit.errors import CockpitError
from cockpit.hosttext import visible
from cockpit.session import HostSession

THREAD = re.compile(r'^Thread (\S+) \(([^)]*)\)(?:: "(.*)")?')
FRAME = re.compile(r"^\s+(.+?) \((.+?)(?::\d+)?\)\s*$")


@dataclass
class Thread:
    tid: str
    state: str
    name: str
    frames: list[str] = field(default_factory=list)  # innermost first, "func (file)"


def parse_dump(text: str) -> list[Thread]:
    threads: list[Thread] = []
    for line in text.splitlines():
        m = THREAD.match(line)
        if m:
            threads.append(Thread(m.group(1), m.group(2), m.group(3) or ""))
            continue
        f = FRAME.match(line)
        if f and threads:
            threads[-1].frames.append(f"{f.group(1)} ({f.group(2)})")
    return threads


def signature(text: str) -> tuple[str, ...]:
    """What identifies where a rank is: its main thread's frames, without line numbers or
    addresses (two ranks in the same wait differ only there)."""
    threads = parse_dump(text)
    if not threads:
        return ("(no stack)",)
    main = next((t for t in threads if t.name == "MainThread"), threads[0])
    frames = [re.sub(r"^ \(", "?? (", re.sub(r"0x[0-9a-f]+", "", fr)) for fr in main.frames]
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


@dataclass
class Group:
    ranks: list[int]
    frames: tuple[str, ...]
    odd: bool = False
    diff: list[str] = field(default_factory=list)


def group_stacks(dumps: dict[int, str]) -> list[Group]:
    """dumps: rank -> py-spy text. Largest group first; a smaller group is odd when one group
    holds most ranks, and carries its diff against that majority."""
    by_sig: dict[tuple[str, ...], list[int]] = {}
    for rank, text in dumps.items():
        by_sig.setdefault(signature(text), []).append(rank)
    groups = sorted((Group(sorted(r), sig) for sig, r in by_sig.items()), key=lambda g: (-len(g.ranks), g.ranks))
    if len(groups) > 1 and len(groups[0].ranks) > len(groups[1].ranks):
        major = groups[0]
        for g in groups[1:]:
            g.odd = True
            g.diff = [line for line in difflib.unified_diff(
                list(reversed(major.frames)), list(reversed(g.frames)),
                f"ranks {rank_ranges(major.ranks)}", f"rank {rank_ranges(g.ranks)}", lineterm="", n=1)]
    return groups


def describe_groups(groups: list[Group]) -> list[str]:
    lines = []
    for g in groups:
        head = f"ranks {rank_ranges(g.ranks)}" if len(g.ranks) > 1 else f"rank {g.ranks[0]}"
        lines.append(f"{'ODD ONE OUT: ' if g.odd else ''}{head} ({len(g.ranks)}), main thread, innermost first:")
        lines.extend(f"    {visible(fr)}" for fr in g.frames[:12])
        if len(g.frames) > 12:
            lines.append(f"    ... {len(g.frames) - 12} more frames")
        if g.diff:
            lines.append("  difference from the majority (outermost first):")
            lines.extend(f"    {visible(d)}" for d in g.diff[2:])
    return lines


def local_pyspy() -> str | None:
    """The py-spy this install carries (the `pyspy` extra), if any."""
    cand = Path(sys.prefix) / "bin" / "py-spy"
    return str(cand) if cand.exists() else shutil.which("py-spy")


async def ensure_pyspy(session: HostSession, upload: bool = False) -> tuple[str | None, dict]:
    """py-spy on the host: its own, or ours uploaded into its cache folder when asked and the
    architecture matches (the host needs no network). Returns the path to use and the check."""
    check = await session.request("dump_check")
    if check["pyspy"]:
        return check["pyspy"], check
    ours = local_pyspy()
    if session.target.kind in ("local", "demo") and ours:
        check = await session.request("dump_check", pyspy=ours)
        return ours, check
    if not upload:
        return None, check
    if not ours:
        raise CockpitError("py-spy is missing on the host and here: pip install 'gpu-cockpit[pyspy]' to carry it")
    if check["arch"] != platform.machine():
        raise CockpitError(f"py-spy is missing on the host, whose architecture ({check['arch']}) differs from "
                           f"this machine's ({platform.machine()}): install py-spy there")
    home = session.state.agent.home or "/tmp"
    dest = f"{home}/.cache/gpu-cockpit/py-spy"
    await session.link.run(["mkdir", "-p", f"{home}/.cache/gpu-cockpit"])
    res = await session.link.run(["dd", f"of={dest}", "status=none"], input=Path(ours).read_bytes(), timeout=120)
    if res.rc != 0:
        raise CockpitError(f"uploading py-spy to {dest} failed: {res.stderr.decode(errors='replace').strip()}")
    await session.link.run(["chmod", "700", dest])
    check = await session.request("dump_check", pyspy=dest)
    return dest, check


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


async def dump_ranks(session: HostSession, ranks: list[tuple[int | None, int]], run: str,
                     upload: bool = False, deadline_s: float = 20.0) -> DumpSet:
    pyspy, check = await ensure_pyspy(session, upload)
    if not pyspy:
        raise CockpitError("py-spy is not installed on the host: install it there (pip install py-spy), or "
                           "dump again with --upload-pyspy to send the one this install carries")
    if check["problems"]:
        raise CockpitError("cannot attach to the ranks: " + "; ".join(check["problems"]))
    data = await session.request("dump", timeout=deadline_s + 30, pids=[pid for _, pid in ranks], pyspy=pyspy,
                                 deadline_s=deadline_s)
    folder = dumps_dir(run)
    texts: dict[int, str] = {}
    failed: dict[int, list[str]] = {}
    for n, (rank, pid) in enumerate(ranks):
        key = rank if rank is not None else n
        d = data["dumps"].get(str(pid)) or {"ok": False, "errors": ["no answer"], "text": ""}
        name = f"rank{rank}-pid{pid}.txt" if rank is not None else f"pid{pid}.txt"
        _write_private(folder / name, d["text"] if d["ok"] else "\n".join(d["errors"]) + "\n")
        if d["ok"]:
            texts[key] = d["text"]
        else:
            failed[key] = d["errors"]
    groups = group_stacks(texts)
    _write_private(folder / "groups.txt", "\n".join(describe_groups(groups)) + "\n")
    return DumpSet(folder, groups, failed, data["check"])
