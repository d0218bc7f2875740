"""Processes from /proc: one read of /proc/PID/stat per watched process and tick, the process table
scanned whole only when a pid was born; psutil only where there is no /proc (not Linux).
"""

import bisect
import errno
import fnmatch
import heapq
import os
import select
import time

DEFAULT_PATTERNS = [
    "sglang::*",
    "VLLM::*",
    "*sglang.launch_server*",
    "*vllm serve*",
    "*vllm.entrypoints*",
    "*cockpit.sim.server*",
]


NEWCOMERS_MAX = 256  # pids born in one tick beyond which every watched process's children are read
STAT_FDS_MAX = 512  # watched processes whose /proc/PID/stat stays open between ticks (and a quarter of the fd limit)
SETTLE_S = 60.0  # a process younger than this may still retitle itself: each scan reads it afresh
REREAD_EVERY_S = 120.0  # every process's stat is read afresh at least this often (late retitles, reparenting)
SCAN_EVERY_S = 5.0
STILL_AFTER = 3  # unchanged reads of a watched process's stat after which it is read only every STILL_EVERY_S
STILL_EVERY_S = 5.0  # ... its exit still seen at the next tick, through a pidfd
PRIMED_KEEP_S = 60.0  # a process first watched this soon after the agent's start: its CPU % since then
TICK_SAID_PCT = 2.0  # a busy row says what one clock tick reads as (`cpu_tick`) where it is this much or more
PIDFDS_MAX = 256  # watched processes read less often while still: one pidfd each (and an eighth of the fd limit)
UNREAD = object()  # a live process's stat that could not be read this tick (no descriptor left): its row stands
SCAN_QUIET_MAX_S = (
    120.0  # while no pid is born the full scan waits, but never longer than this (a whole scan of a host costs ms)
)

_STATUS = {
    "running": "R",
    "sleeping": "S",
    "disk-sleep": "D",
    "stopped": "T",
    "tracing-stop": "t",
    "zombie": "Z",
    "dead": "X",
    "idle": "I",
    "wake-kill": "K",
    "waking": "W",
    "parked": "P",
}


_HAVE_PROC = os.path.isdir("/proc/self/task")
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_BOOT = None


def _boot_time():
    global _BOOT
    if _BOOT is None:
        try:
            with open("/proc/stat") as fh:
                _BOOT = next(float(line.split()[1]) for line in fh if line.startswith("btime"))
        except (OSError, StopIteration):
            _BOOT = 0.0
    return _BOOT


def _alive(pid):
    """Whether a process with this pid exists here (one that cannot be seen from this pid
    namespace reads as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _fd_limit():
    """The soft limit on open descriptors (1024 where it cannot be read): the kept stat files and
    pidfds stay well inside it, leaving NVML, the logs and a kill's pidfds their share."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return soft if soft > 0 else 1 << 20
    except (ImportError, OSError, ValueError):
        return 1024


def pidfd(pid):
    """A pidfd on the process (Linux >= 5.3, Python >= 3.9): it names that process, not whoever
    has the pid later, and polls readable once it exits. None where there is none."""
    fn = getattr(os, "pidfd_open", None)
    if fn is None:
        return None
    try:
        return fn(pid)
    except OSError:
        return None


_OUT_OF_FDS = (errno.EMFILE, errno.ENFILE, errno.ENOMEM)


def _read_proc(path, unread=None):
    """A small /proc file's bytes, through the bare system calls (a third of the cost of open()'s
    buffered file object, which a tick pays for every watched process): None when it is gone,
    `unread` when the agent is out of descriptors (it may well be there)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        return unread if exc.errno in _OUT_OF_FDS else None
    try:
        return os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)


_LOADAVG = []  # /proc/loadavg kept open: pread at 0 has the kernel write it afresh


def _last_pid():
    """The most recently created pid (threads included), the last field of /proc/loadavg: while
    it stands still no process was born, so no watched process can have a new child."""
    try:
        if not _LOADAVG:
            _LOADAVG.append(os.open("/proc/loadavg", os.O_RDONLY))
        data = os.pread(_LOADAVG[0], 128, 0)
    except OSError:
        data = None
    try:
        return int(data.rsplit(None, 1)[1])
    except (AttributeError, IndexError, ValueError):
        return None


def _proc_stat(pid, data=None):
    """Everything a tick needs from one read of /proc/PID/stat (psutil would read three files
    and make two more system calls per process): None when the process is gone."""
    if data is None:
        data = _read_proc("/proc/%d/stat" % pid)
    if not data:
        return None
    lpar, rpar = data.find(b"("), data.rfind(b")")
    f = data[rpar + 2 :].split()
    if len(f) < 22:
        return None
    state = f[0].decode()
    if state in ("X", "x"):
        return None
    start = int(f[19])
    return {
        "pid": pid,
        "ppid": int(f[1]),
        "name": data[lpar + 1 : rpar].decode("utf-8", "replace"),
        "status": state,
        "rss_mib": round(int(f[21]) * _PAGE / 1048576.0, 1),
        "threads": int(f[17]),
        "started": round(_boot_time() + start / _CLK_TCK, 2),
        "pgid": int(f[2]),
        "sid": int(f[3]),
        "_start": start,
        "_ticks": int(f[11]) + int(f[12]),
    }


def _stat_ids(data):
    """(start, ppid, pgid, comm, CPU ticks) from /proc/PID/stat's bytes: what a scan needs,
    parsed no further. None when the process is gone."""
    if not data:
        return None
    lpar, rpar = data.find(b"("), data.rfind(b")")
    f = data[rpar + 2 :].split(None, 21)
    if len(f) < 21 or f[0] in (b"X", b"x"):
        return None
    return int(f[19]), int(f[1]), int(f[2]), data[lpar + 1 : rpar].decode("utf-8", "replace"), int(f[11]) + int(f[12])


def _swept(pid, before, newest):
    """Whether the kernel's pid cursor passed `pid` between two readings of the newest pid (so
    the pid may belong to a process born since). Unknown readings: it may have."""
    if before is None or newest is None:
        return True
    if newest >= before:
        return before < pid <= newest
    return pid > before or pid <= newest  # the cursor wrapped


def _trim(argv):
    argv = list(argv or [])
    while argv and not argv[-1]:
        argv.pop()  # setproctitle pads the old argv area with NULs
    return argv


def _read_cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as fh:
            data = fh.read()
    except OSError:
        return []
    return _trim(data.decode("utf-8", "replace").split("\0"))


class Procs:
    """Watches process trees: roots found by title patterns, process groups or pids, plus every
    descendant. The whole process table is scanned every SCAN_EVERY_S; each tick only samples the
    processes already watched."""

    def __init__(self, psutil=None):
        self.ps = psutil  # only where there is no /proc
        self.patterns = list(DEFAULT_PATTERNS)
        self.pgids = set()
        self.pids = set()
        self.watched = {}  # pid -> psutil.Process
        self.cmdlines = {}
        self.names = {}
        self.cpu = {}  # pid -> (start ticks, cpu ticks, monotonic time) of the last sample
        self.unread = []  # the last sample's live processes it could not read (out of descriptors)
        self.read_at = None  # when the last sample read CPU times (local monotonic)
        self._rows = {}  # pid -> (start, ppid, pgid, comm, argv) from the last scan
        self._names = None  # the last scan's listing of /proc, as listed
        self._pids = []  # its pids, sorted
        self._young = []  # its pids that were younger than SETTLE_S
        self._reread_at = 0.0  # when every process's stat was last read afresh
        self.sent_cmdline = set()
        self.last_scan = 0.0
        self.last_pid = None  # /proc/loadavg's newest pid when children were last looked for
        self.scan_pid = None  # ... and when the process table was last scanned whole
        self.last_full = 0.0
        self._match = {}  # pid -> (comm, argv, matched) from the last scan: argv is the cached list
        self._stat = {}  # pid -> (its /proc/PID/stat bytes, the row they gave) from the last tick
        self._fds = {}  # pid -> an open /proc/PID/stat, read again with pread each tick
        self._dirty = True  # what the tree is built from changed (patterns, groups, pids): the next scan is whole
        self._primed = None  # pid -> (start ticks, CPU ticks, when) read by `prime`, for PRIMED_KEEP_S
        self.primed_at = None
        self._unchanged_reads = {}  # pid -> reads in a row that found its stat unchanged
        self._still = {}  # pid -> when its stat is read next: it stood still, its pidfd tells of an exit
        self._pidfds = {}  # pid -> the pidfd registered with _exits
        self._exits = None  # an epoll of the still processes' pidfds: readable ones have exited
        self._still_heap = []  # (when, pid) of the still processes' next reads
        limit = _fd_limit() if _HAVE_PROC else 1024
        self._stat_fds_max = min(STAT_FDS_MAX, limit // 4)
        self._pidfds_max = min(PIDFDS_MAX, limit // 8)
        self._active = set()  # watched pids read each tick: not still
        self._tree = None  # the watched dict _active was built from, and its size then
        self._tree_size = 0
        self.rows = {}  # pid -> its last row: what the other side holds
        self.generation = 0  # moves whenever the watched set changes

    def prime(self):
        """The process table scanned whole at the agent's start, each process's CPU ticks kept: the
        first sample measures CPU % from here, so a one-shot look needs one sample, not two a
        gap apart. The first sample's scan then rereads only what is young or new."""
        if not _HAVE_PROC:
            return
        self._primed = {}
        self.scan(ticks=self._primed)
        self.primed_at = time.monotonic()

    def _read_stat(self, pid):
        """/proc/PID/stat through a descriptor kept open while the process is watched: pread at
        offset 0 makes the kernel write it afresh, at half the cost of open, read and close. The
        descriptor belongs to that process: once it has gone (whoever has its pid now) the read
        fails and the row is gone."""
        fd = self._fds.get(pid)
        if fd is None:
            if len(self._fds) >= self._stat_fds_max:
                return _read_proc("/proc/%d/stat" % pid, UNREAD)
            try:
                fd = self._fds[pid] = os.open("/proc/%d/stat" % pid, os.O_RDONLY)
            except OSError as exc:
                return UNREAD if exc.errno in _OUT_OF_FDS else None
        try:
            return os.pread(fd, 4096, 0)
        except OSError:
            self._close_stat(pid)
            return None

    def _close_stat(self, pid):
        fd = self._fds.pop(pid, None)
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    def close(self):
        for pid in list(self._fds):
            self._close_stat(pid)
        for pid in list(self._pidfds):
            self._stir(pid)
        if self._exits is not None:
            self._exits.close()
            self._exits = None

    def _stood_still(self, pid, now, row):
        """Another read found the stat unchanged: after STILL_AFTER of them the process is read
        every STILL_EVERY_S instead of each tick, once a pidfd watches for its exit (a helper
        waiting on a queue, an idle rank: on a real host most of a tree). Its CPU, state and
        memory reach the screen up to STILL_EVERY_S late when it wakes; its exit does not."""
        n = self._unchanged_reads.get(pid, 0) + 1
        self._unchanged_reads[pid] = n
        if n < STILL_AFTER or row["status"] == "Z":
            return
        if pid not in self._pidfds and not self._watch_exit(pid):
            return
        when = now + STILL_EVERY_S
        self._still[pid] = when
        heapq.heappush(self._still_heap, (when, pid))
        self._active.discard(pid)

    def _watch_exit(self, pid):
        if len(self._pidfds) >= self._pidfds_max or pid not in self._fds or not hasattr(select, "epoll"):
            return False
        fd = pidfd(pid)
        if fd is None:
            return False
        try:
            os.pread(self._fds[pid], 4096, 0)  # still the process the kept stat names, not a reused pid
            if self._exits is None:
                self._exits = select.epoll()
            self._exits.register(fd, select.EPOLLIN)
        except OSError:
            os.close(fd)
            return False
        self._pidfds[pid] = fd
        return True

    def _stir(self, pid):
        """Read the process each tick again: its stat moved, it exited, or it is watched no more."""
        self._unchanged_reads.pop(pid, None)
        if self._still.pop(pid, None) is not None and pid in self.watched:
            self._active.add(pid)
        fd = self._pidfds.pop(pid, None)
        if fd is not None:
            try:
                self._exits.unregister(fd)
            except (OSError, ValueError):
                pass
            os.close(fd)

    def _exited(self):
        """Stirs the still processes whose pidfd says they exited since the last tick (one syscall)."""
        if not self._pidfds:
            return
        fds = set(fd for fd, _ in self._exits.poll(0))
        for pid in [pid for pid, fd in self._pidfds.items() if fd in fds]:
            self._stir(pid)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def configure(self, patterns=None, pgids=None, pids=None):
        if patterns is not None:
            self.patterns = list(patterns)
        if pgids is not None:
            self.pgids = set(int(p) for p in pgids)
        if pids is not None:
            self.pids = set(int(p) for p in pids)
        self.last_scan = 0.0
        self._match = {}
        self._dirty = True

    def _matches(self, name, cmd):
        for pat in self.patterns:
            if fnmatch.fnmatchcase(name, pat) or fnmatch.fnmatchcase(cmd, pat):
                return True
        return False

    def _table(self, before=None, newest=None, ticks=None):
        """(pid, ppid, pgid, comm, argv) of every process. On Linux: the stat of a process not
        seen before, young, or whose pid may have been reused (the kernel's pid cursor passed it
        since the last scan, from `before` to `newest`) is read; an older one keeps its row from
        the last scan, and every row is read afresh every REREAD_EVERY_S. The command line is
        read only for a process not seen before or retitled since (the costly part). `ticks`, when
        given, gets each process read's (start, CPU ticks, when)."""
        me = os.getpid()
        if not _HAVE_PROC:
            if self.ps is None:
                return  # said in the hello's warnings
            for p in self.ps.process_iter(["pid", "ppid", "name", "cmdline"]):
                if p.info["pid"] != me:
                    try:
                        pgid = os.getpgid(p.info["pid"])
                    except OSError:
                        pgid = None
                    yield p.info["pid"], p.info["ppid"], pgid, p.info["name"] or "", _trim(p.info["cmdline"])
            return
        now = time.time()
        reread = before is None or newest is None or now - self._reread_at >= REREAD_EVERY_S
        if reread:
            self._reread_at = now
        settled_before = (now - _boot_time() - SETTLE_S) * _CLK_TCK  # started before this: settled
        last = self._rows
        seen = {}
        names = self._names = os.listdir("/proc")
        for name in names:
            if not name.isdigit():
                continue
            pid = int(name)
            if pid == me:
                continue
            row = last.get(pid)
            if row is None or reread or row[0] > settled_before or _swept(pid, before, newest):
                ids = _stat_ids(_read_proc("/proc/%d/stat" % pid))
                if ids is None:
                    continue
                start, ppid, pgid, comm, cpu = ids
                if ticks is not None:
                    ticks[pid] = (start, cpu, time.monotonic())
                argv = row[4] if row is not None and row[0] == start and row[3] == comm else _read_cmdline(pid)
                row = (start, ppid, pgid, comm, argv)
            seen[pid] = row
            yield pid, row[1], row[2], row[3], row[4]
        self._rows = seen
        self._pids = sorted(seen)
        young_after = settled_before
        self._young = [pid for pid, row in seen.items() if row[0] > young_after]

    def scan(self, quick=False, ticks=None):
        before = self.scan_pid
        self.last_pid = self.scan_pid = _last_pid() if _HAVE_PROC else None  # a pid born after this: the next tick
        self.last_full = time.monotonic()
        if quick and _HAVE_PROC and not self._dirty and self._unchanged(before, self.scan_pid):
            self.last_scan = time.monotonic()
            return
        self._dirty = False
        children = {}
        roots = set()
        alive = set()
        memo, self._match = self._match, {}
        for pid, ppid, pgid, comm, argv in self._table(before, self.scan_pid, ticks):
            alive.add(pid)
            children.setdefault(ppid, []).append(pid)
            self.cmdlines[pid] = argv
            last = memo.get(pid)
            if last is not None and last[0] == comm and last[1] is argv:
                matched = last[2]  # the same title and command line as at the last scan
            else:
                matched = self._matches(comm, " ".join(argv))
            self._match[pid] = (comm, argv, matched)
            if pid in self.pids or pgid in self.pgids or matched:
                roots.add(pid)
        watched = {}
        stack = list(roots)
        while stack:
            pid = stack.pop()
            if pid in watched or pid not in alive:
                continue
            watched[pid] = self.watched.get(pid) or self._handle(pid)
            stack.extend(children.get(pid, ()))
        for pid in list(self.cmdlines):
            if pid not in watched:
                del self.cmdlines[pid]
        self.watched = watched
        self.last_scan = time.monotonic()

    def _unchanged(self, before, newest):
        """Whether the watched tree is the one the last scan built, told from what changed in
        /proc's listing (compared whole, then as sets) rather than by walking every process's
        row: the processes born since are read (none is a new root: no pid, group or title the
        watch asks for), those gone are dropped, and of the rest the rows that may have moved
        (young ones that may still retitle, pids the kernel's cursor passed: perhaps reused)
        read the same start, parent, group and title. Deaths and new children of watched
        processes are the ticks' work. On a real host kernel workers and short commands come and
        go all the time: the walk of every row was most of a scan's cost."""
        last = self._rows
        if not last or time.time() - self._reread_at >= REREAD_EVERY_S or before is None or newest is None:
            return False
        names = os.listdir("/proc")
        settled_before = (time.time() - _boot_time() - SETTLE_S) * _CLK_TCK
        born = {}
        died = ()
        if names != self._names:
            listed, was = set(names), set(self._names)
            new = [int(n) for n in listed - was if n.isdigit()]
            if len(new) > NEWCOMERS_MAX:
                return False
            me = os.getpid()
            for pid in new:
                ids = _stat_ids(_read_proc("/proc/%d/stat" % pid)) if pid != me else None
                if ids is None:
                    continue
                start, ppid, pgid, comm, _ = ids
                argv = _read_cmdline(pid)
                if (
                    ppid in self.watched
                    or pid in self.pids
                    or pgid in self.pgids
                    or self._matches(comm, " ".join(argv))
                ):
                    return False  # a new child (the ticks' cursor may have passed it) or a new root: built again
                born[pid] = (start, ppid, pgid, comm, argv)
                self._match[pid] = (comm, argv, False)
            died = [int(n) for n in was - listed if n.isdigit()]
        pids = self._pids
        if newest >= before:
            swept = pids[bisect.bisect_right(pids, before) : bisect.bisect_right(pids, newest)]
        else:  # the cursor wrapped
            swept = pids[bisect.bisect_right(pids, before) :] + pids[: bisect.bisect_right(pids, newest)]
        young = [pid for pid in self._young if pid in last and last[pid][0] > settled_before]
        for pid in set(swept).union(young).difference(died):
            row = last.get(pid)
            if row is None:
                continue
            ids = _stat_ids(_read_proc("/proc/%d/stat" % pid))
            if ids is None or ids[:4] != row[:4]:  # (start, parent, group, title): its CPU may move
                return False
        if born or died:
            for pid in died:
                last.pop(pid, None)
                self._match.pop(pid, None)
            last.update(born)
            self._pids = sorted(last)
            young.extend(born)
        self._names = names
        self._young = young
        return True

    def _handle(self, pid):
        """A psutil handle where there is no /proc to read directly."""
        if _HAVE_PROC or self.ps is None:
            return pid
        try:
            return self.ps.Process(pid)
        except self.ps.Error:
            return None

    def adopt_children(self):
        """New children of watched processes, found each tick rather than at the next full scan.
        Only pids born since the last look can be new children: /proc/loadavg names the newest,
        each newcomer's stat names its parent, and only a watched parent's
        /proc/PID/task/PID/children is read. Nothing born (the usual tick): one small read in all.
        Too many newcomers, or pids that wrapped: every watched process's children, as before."""
        newest = _last_pid() if _HAVE_PROC else None
        first, self.last_pid = self.last_pid, newest
        stack = None
        if newest is not None and first is not None and 0 <= newest - first <= NEWCOMERS_MAX:
            if newest == first:
                return
            parents = set()
            for pid in range(first + 1, newest + 1):
                ids = _stat_ids(
                    _read_proc("/proc/%d/stat" % pid)
                )  # a thread's own id reads too; its "parent" is checked below
                if ids is not None and ids[1] in self.watched:
                    parents.add(ids[1])
            stack = list(parents)
        if stack is None:
            stack = list(self.watched)
        while stack:
            pid = stack.pop()
            try:
                kids = [int(k) for k in (_read_proc("/proc/%d/task/%d/children" % (pid, pid)) or b"").split()]
            except ValueError:
                continue
            for kid in kids:
                if kid in self.watched:
                    continue
                self.watched[kid] = self._handle(kid)
                self.cmdlines[kid] = _read_cmdline(kid)
                stack.append(kid)

    def sample(self, now, force_scan=False):
        """(rows, gone): the rows of the processes whose stat moved since their last row (new
        ones whole), and the pids no longer watched (exited, reused, out of the tree). A process
        that did not move is not in `rows`: its last row stands (`self.rows`). Each tick reads the
        processes that moved lately and those due; one that stood still waits STILL_EVERY_S."""
        if force_scan or now - self.last_scan >= SCAN_EVERY_S:
            if (
                not force_scan
                and self.scan_pid is not None
                and now - self.last_full < SCAN_QUIET_MAX_S
                and _last_pid() == self.scan_pid
            ):
                # no process was born on the host since the last full scan: no new tree can have
                # appeared (a process that retitles itself into a pattern without any birth
                # waits for the next scan, at most SCAN_QUIET_MAX_S)
                self.last_scan = now
                self.adopt_children()
            else:
                self.scan(quick=not force_scan)
        else:
            self.adopt_children()
        wall = self.read_at = time.monotonic()  # the CPU readings' time: a config's sample waits from here
        rows, gone = [], []
        self.unread = []
        if self.watched is not self._tree or len(self.watched) != self._tree_size:
            gone = self._retree()
        self._exited()
        stat = self._stat
        for pid in list(self._active) + self._due(now):
            proc = self.watched[pid]
            last = stat.get(pid)
            data = self._read_stat(pid) if _HAVE_PROC else None
            if data is UNREAD:
                self.unread.append(pid)  # alive, unread this tick: its row stands, read again next tick
                continue
            if last is not None and last[0] == data and pid in self.sent_cmdline:
                # not a byte of its stat moved (an idle process): its row stands, no CPU since
                prev = self.cpu[pid]
                self.cpu[pid] = (prev[0], prev[1], wall)
                self._stood_still(pid, now, last[1])
                continue
            if pid in self._unchanged_reads:
                self._stir(pid)
            row = _proc_stat(pid, data) if data else None
            if row is None:
                row = self._psutil_row(pid, proc) if not _HAVE_PROC else None
                if row is None:
                    gone.append(pid)
                    continue
            start = row.pop("_start", None)
            ticks = row.pop("_ticks", None)
            if ticks is not None:
                prev = self.cpu.get(pid)
                if prev is None and self._primed and self._primed.get(pid, (None,))[0] == start:
                    prev = self._primed.pop(pid)  # first read since the agent's start: CPU % since then
                if prev is not None and prev[0] != start:
                    gone.append(pid)  # the pid was reused: not our process any more
                    self._dirty = True  # the next scan is whole: the newcomer may belong to the tree
                    continue
                if prev is None:
                    row["cpu_pct"] = 0.0
                else:
                    # /proc counts CPU time in clock ticks: over the first sample's short window one
                    # tick of an idle rank reads as tens of percent, so the row says what a tick is
                    tick = 100.0 / _CLK_TCK / max(1e-3, wall - prev[2])
                    row["cpu_pct"] = round((ticks - prev[1]) * tick, 1)
                    if tick >= TICK_SAID_PCT and ticks != prev[1]:
                        row["cpu_tick"] = round(tick, 1)
                self.cpu[pid] = (start, ticks, wall)
            comm = row["name"]
            if self.names.get(pid) != comm:  # a new title (setproctitle): its argv changed too
                self.names[pid] = comm
                self.cmdlines[pid] = _read_cmdline(pid) if _HAVE_PROC else _trim(self._psutil_argv(proc))
                self.sent_cmdline.discard(pid)
            argv = self.cmdlines.get(pid) or []
            if len(argv) == 1 and argv[0].startswith(comm):
                row["name"] = argv[0]  # the full title, past the kernel's 15 characters
            if pid not in self.sent_cmdline:
                row["cmdline"] = argv
                self.sent_cmdline.add(pid)
            if data is not None and row["cpu_pct"] == 0.0 and "cmdline" not in row:
                stat[pid] = (data, row)  # what an idle next tick can reuse whole
            else:
                stat.pop(pid, None)
            self.rows[pid] = row
            rows.append(row)
        for pid in gone:
            self.watched.pop(pid, None)
            self._forget(pid)
        self._tree_size = len(self.watched)
        if self._primed is not None and time.monotonic() - self.primed_at > PRIMED_KEEP_S:
            self._primed = None
        return rows, gone

    def _retree(self):
        """The watched set changed (a scan, a child adopted): who is read each tick, and the pids
        that left it, forgotten."""
        watched = self.watched
        self._tree = watched
        still = self._still
        self._active = set(pid for pid in watched if pid not in still)
        gone = [pid for pid in self.rows if pid not in watched]
        for pid in gone:
            self._forget(pid)
        for pid in [p for p in self._fds if p not in watched]:
            self._close_stat(pid)
        for pid in [p for p in self._unchanged_reads if p not in watched]:
            self._stir(pid)
        self.generation += 1
        return gone

    def _forget(self, pid):
        self.rows.pop(pid, None)
        self.names.pop(pid, None)
        self.cmdlines.pop(pid, None)
        self.cpu.pop(pid, None)
        self.sent_cmdline.discard(pid)
        self._stat.pop(pid, None)
        self._close_stat(pid)
        self._stir(pid)
        self._active.discard(pid)
        self.generation += 1

    def _due(self, now):
        """The still processes whose next read has come (a heap of (when, pid); stale entries,
        of processes stirred or rescheduled since, are dropped)."""
        heap, still, out = self._still_heap, self._still, []
        while heap and heap[0][0] <= now:
            when, pid = heapq.heappop(heap)
            if still.get(pid) == when and pid in self.watched:
                out.append(pid)
        return out

    def _psutil_argv(self, proc):
        try:
            return proc.cmdline()
        except (self.ps.Error, AttributeError):
            return []

    def _psutil_row(self, pid, proc):
        """Where there is no /proc (not Linux): psutil's portable way."""
        ps = self.ps
        if proc is None:
            return None  # gone before its handle was made
        try:
            with proc.oneshot():
                return {
                    "pid": pid,
                    "ppid": proc.ppid(),
                    "name": proc.name(),
                    "status": _STATUS.get(proc.status(), "?"),
                    "cpu_pct": round(proc.cpu_percent(None), 1),
                    "rss_mib": round(proc.memory_info().rss / 1048576.0, 1),
                    "threads": proc.num_threads(),
                    "started": round(proc.create_time(), 2),
                    "pgid": os.getpgid(pid),
                    "sid": os.getsid(pid),
                }
        except (ps.NoSuchProcess, ps.AccessDenied, ps.ZombieProcess, OSError):
            return None

    def resend_cmdlines(self):
        """Every row whole at the next sample, command lines included: the still are read too."""
        self.sent_cmdline.clear()
        for pid in list(self._still):
            self._stir(pid)


def _environ(pid, limit=1 << 20):
    """A process's environment as a dict ({} when unreadable), bounded."""
    try:
        with open("/proc/%d/environ" % pid, "rb") as fh:
            data = fh.read(limit)
    except OSError:
        return {}
    out = {}
    for item in data.split(b"\0"):
        key, eq, value = item.partition(b"=")
        if eq and key:
            out[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return out


def environ_of(pid, hops=4):
    """The environment a process was started with: its own, or, where setproctitle has wiped it
    (SGLang's and vLLM's ranks retitle themselves, which zeroes /proc/PID/environ), that of its
    nearest ancestor that still has one (the launcher, which passed it down)."""
    for _ in range(hops + 1):
        env = _environ(pid)
        if env:
            return env
        row = _proc_stat(pid)
        if row is None or row["ppid"] <= 1:
            return {}
        pid = row["ppid"]
    return {}


def _start_ticks(pid):
    row = _proc_stat(pid)
    return None if row is None else row["_start"]


def _uid(pid):
    """The process's real uid (who started it), from /proc/PID/status."""
    try:
        with open("/proc/%d/status" % pid, "rb") as fh:
            for line in fh:
                if line.startswith(b"Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _user(uid):
    import pwd

    try:
        return pwd.getpwuid(int(uid)).pw_name
    except (KeyError, TypeError, ValueError, OverflowError):
        return str(uid)


def _when(epoch):
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(epoch)))
    except (TypeError, ValueError, OverflowError):
        return "?"


def _protected():
    """The agent itself and its ancestors (the ssh session, the shell): never signalled."""
    out = set()
    pid = os.getpid()
    while pid > 1:
        out.add(pid)
        row = _proc_stat(pid)
        if row is None:
            break
        pid = row["ppid"]
    out.add(1)
    out.add(0)
    return out
