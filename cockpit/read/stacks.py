"""Stack dumps of every rank (py-spy --native output) read and grouped: ranks whose
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
import re
import signal
from dataclasses import dataclass, field

from cockpit.common.hosttext import count, visible
from cockpit.read.findings import rank_ranges

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
            g.diff = [
                line
                for line in difflib.unified_diff(
                    list(reversed(major.frames)),
                    list(reversed(g.frames)),
                    f"ranks {rank_ranges(major.ranks)}",
                    f"rank {rank_ranges(g.ranks)}",
                    lineterm="",
                    n=1,
                )
            ]
    return groups


def describe_groups(groups: list[Group], full: bool = False) -> list[str]:
    """Each group: its ranks, the Python frames of its main thread (innermost first), then its
    native tail folded into one line (a line per distinct tail, with its ranks, when the ranks
    of the group wait in different native code). `full`: every frame, native ones unfolded."""
    lines = []
    for g in groups:
        shown = g.shown
        state = f" ({shown.state})" if shown and shown.state else ""
        lines.append(
            f"{'ODD ONE OUT: ' if g.odd else ''}{_who(g.ranks)} ({len(g.ranks)}), "
            f"main thread{state}, Python frames innermost first:"
        )
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
            for _fold, ranks in natives or [(None, g.ranks)]:
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


# ----------------------------------------------------------------------------- waits

# torch.distributed's collectives and the engines' wrappers of them (vLLM's and SGLang's
# tensor_model_parallel_all_reduce, pynccl's and custom all-reduce's methods), by function name
COLLECTIVE = re.compile(
    r"(?:^|[_.])(all_?reduce|all_?gather|reduce_?scatter|broadcast|barrier|all_?to_?all|"
    r"send|recv|isend|irecv|gather|scatter|reduce)(?:_|$)",
    re.I,
)
# Waiting for peers that may still come (torch's rendezvous and its store, a node not yet up):
# healthy for as long as the rendezvous timeout, never called from the stacks alone
RENDEZVOUS = re.compile(
    r"rendezvous|store_based_barrier|init_process_group|(?:TCP|File|Prefix|Hash)Store|"
    r"wait_for_peers|wait_for_workers|wait_for_nodes",
    re.I,
)
# The innermost Python frames of a thread that waits for something else to happen
WAIT_FRAMES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("a CUDA synchronize", re.compile(r"synchronize|cuda.*wait|event_wait|stream_wait", re.I)),
    ("a queue get", re.compile(r"(?:^|\.)(?:get|_recv_bytes|_recv|recv_pyobj|recv_multipart)$", re.I)),
    ("a socket poll", re.compile(r"(?:^|\.)(?:select|poll|epoll|_poll|recv|recv_into|accept|_run_once)$|zmq", re.I)),
    ("a lock or condition wait", re.compile(r"(?:^|\.)(?:wait|wait_for|acquire|join|_wait_for_tstate_lock)$", re.I)),
)
# A thread in these is reading (weights from a disk, a file): moving however still its stack
READING = re.compile(r"(?:^|[._])(?:read|readinto|pread|load_file|safe_open|mmap|copyfileobj)", re.I)
WAIT_LOOP = re.compile(r"wait|sleep|idle|poll|spin|block|hang|pending", re.I)


def wait_of(thread: Thread | None) -> tuple[str | None, str]:
    """What the thread waits in, read from its Python frames: `rendezvous` (peers that may still
    come), a collective (by name), a CUDA synchronize, a queue get, a socket poll, a lock or
    condition wait, a sleep in a wait loop (py-spy saw it idle in a function named for waiting);
    None when it is not waiting (reading, computing, or no frame), with where it is."""
    frames = thread.python if thread is not None else []
    if not frames:
        return None, "no Python frame"
    where = f"{frames[0].name} ({frames[0].file.rsplit('/', 1)[-1]}" + (
        f":{frames[0].line})" if frames[0].line is not None else ")"
    )
    if any(RENDEZVOUS.search(f.name) or RENDEZVOUS.search(f.file.rsplit("/", 1)[-1]) for f in frames):
        return "rendezvous", where
    if READING.search(frames[0].name):
        return None, where
    op = next((f for f in frames if COLLECTIVE.search(f.name.rsplit(".", 1)[-1])), None)
    if op is not None:
        return f"a collective ({op.name})", where
    for kind, pattern in WAIT_FRAMES:
        if any(pattern.search(f.name) for f in frames[:3]):
            return kind, where
    if thread is not None and thread.state == "idle" and WAIT_LOOP.search(frames[0].name):
        return "a sleep in a wait loop", where
    return None, where


def same_place(a: Thread | None, b: Thread | None) -> bool:
    """The same Python frames, line numbers included: the thread did not move between the dumps
    (or came back to exactly where it was, which a wait loop does)."""
    return (
        a is not None and b is not None and bool(a.python) and [str(f) for f in a.python] == [str(f) for f in b.python]
    )


def _same_frames(a: Thread | None, b: Thread | None) -> bool:
    """The same functions, lines aside: a loop that spins in place reads at its lines in turn."""
    return a is not None and b is not None and bool(a.python) and [f.key for f in a.python] == [f.key for f in b.python]


@dataclass
class StackLook:
    """Every rank of the run dumped twice without stopping it (py-spy --nonblocking), `gap_s`
    apart: where each rank is, whether it moved, and what it waits in. `still` is the positive
    evidence of a stall: every rank read, none moved, none reading, each in a wait no one else
    can end (a rendezvous waits for peers that may still come: it never is)."""

    at: float  # local monotonic time of the second dump
    gap_s: float
    waits: dict[int, str | None] = field(default_factory=dict)  # rank -> what it waits in (None: not waiting)
    where: dict[int, str] = field(default_factory=dict)  # rank -> its innermost Python frame
    moved: list[int] = field(default_factory=list)  # ranks whose stack changed between the dumps
    reading: list[int] = field(default_factory=list)  # ranks that read bytes between the dumps
    unread: dict[int, str] = field(default_factory=dict)  # rank -> why no dump of it was read
    odd_rank: int | None = None
    odd_said: list[str] = field(default_factory=list)  # what the stacks say of the odd rank

    @property
    def still(self) -> bool:
        return (
            bool(self.waits)
            and not self.moved
            and not self.reading
            and not self.unread
            and all(w is not None and w != "rendezvous" for w in self.waits.values())
        )

    @property
    def parked(self) -> bool:
        """No rank moved, and some wait in a collective: with the GPUs spinning, the ranks outside
        it (a rank looping where it should not) hold the others there."""
        return (
            bool(self.waits)
            and not self.moved
            and not self.reading
            and not self.unread
            and "rendezvous" not in self.waits.values()
            and any((w or "").startswith("a collective") for w in self.waits.values())
        )

    def evidence(self) -> list[str]:
        """What the look saw, in words for the verdict."""
        n = len(self.waits) + len(self.unread)
        if self.still:
            kinds: dict[str, list[int]] = {}
            for rank, w in sorted(self.waits.items()):
                kinds.setdefault(str(w), []).append(rank)
            said = "; ".join(f"{_who(r)} in {k} at {self.where[r[0]]}" for k, r in kinds.items())
            return [f"stacks unchanged across two dumps {self.gap_s:.0f} s apart, all in waits: {visible(said)}"] + [
                visible(s) for s in self.odd_said
            ]
        why = []
        if self.unread:
            why.append(
                f"{len(self.unread)} of {n} ranks not read ({visible('; '.join(sorted(set(self.unread.values()))))})"
            )
        if self.moved:
            why.append(f"{_who(self.moved)} moved between two dumps {self.gap_s:.0f} s apart")
        if self.reading:
            why.append(f"{_who(self.reading)} reading")
        rdv = sorted(r for r, w in self.waits.items() if w == "rendezvous")
        if rdv:
            why.append(
                f"{_who(rdv)} in a rendezvous at {visible(self.where[rdv[0]])}: waiting for peers that may still come"
            )
        busy = sorted(r for r, w in self.waits.items() if w is None and r not in self.moved)
        if busy:
            why.append(f"{_who(busy)} not in a wait: {visible(self.where[busy[0]])}")
        return ["stacks: " + "; ".join(why)]


def look_of(
    first: dict[int, str],
    second: dict[int, str],
    gap_s: float,
    at: float,
    read_bytes: dict[int, int] | None = None,
    unread: dict[int, str] | None = None,
) -> StackLook:
    """Two dumps of the same ranks (rank -> py-spy text) compared; `read_bytes`: bytes each rank
    read between them (its /proc io), a rank reading more than READ_MOVING bytes moves."""
    look = StackLook(at, gap_s, unread=dict(unread or {}))
    for rank in sorted(set(first) | set(second)):
        if rank not in first or rank not in second:
            look.unread.setdefault(rank, "one of the two dumps failed")
            continue
        a, b = main_thread(parse_dump(first[rank])), main_thread(parse_dump(second[rank]))
        wait, where = wait_of(b)
        look.waits[rank], look.where[rank] = wait, where
        if not (same_place(a, b) if wait is not None else _same_frames(a, b)):
            look.moved.append(rank)
        if (read_bytes or {}).get(rank, 0) > READ_MOVING:
            look.reading.append(rank)
    return look


READ_MOVING = 1 << 20  # bytes a rank reads between the two dumps that say it is loading, not waiting
