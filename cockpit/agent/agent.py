"""gpu-cockpit host agent: the only code that runs on the GPU host.

It is sent over the connection to the host's own interpreter and executed from memory, never
installed. Standard library only, plus pynvml and psutil when the host has them. It samples on its
own clock and writes newline-delimited JSON frames to stdout; it reads commands (one JSON object
per line, each with an id) from stdin and answers each exactly once.

The local side imports this module for the protocol constants, so the frame schema has one home.
"""

import fnmatch
import json
import os
import platform
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time

PROTOCOL = 1
AGENT_VERSION = "0.1.0"

# Frame types written by the agent.
HELLO, SAMPLE, LOG, RESULT, ERROR, FATAL = "hello", "sample", "log", "result", "error", "fatal"

DEFAULT_PATTERNS = [
    "sglang::*",
    "VLLM::*",
    "*sglang.launch_server*",
    "*vllm serve*",
    "*vllm.entrypoints*",
    "*cockpit.sim.server*",
]
FIRST_GAP_S = 0.2  # between the first two samples
NEWCOMERS_MAX = 256  # pids born in one tick beyond which every watched process's children are read
STAT_FDS_MAX = 512  # watched processes whose /proc/PID/stat stays open between ticks
SETTLE_S = 60.0  # a process younger than this may still retitle itself: each scan reads it afresh
GPU_PROCS_EVERY_S = 5.0  # a GPU's process list is asked again at least this often, else on a memory change
REREAD_EVERY_S = 30.0  # every process's stat is read afresh at least this often (late retitles)
SCAN_EVERY_S = 5.0
SCAN_QUIET_MAX_S = 30.0  # while no pid is born the full scan waits, but never longer than this  # full process-table scans are the costly part: not every tick
SLOW_EVERY_S = 10.0  # ECC counters and other rarely changing fields
LOG_INITIAL_BYTES = 32 * 1024
LOG_MAX_BYTES_PER_FRAME = 64 * 1024
LOG_LINE_MAX = 64 * 1024  # a longer log line keeps its head and says how much of it was skipped
SMI_FIELDS = (
    "index,uuid,name,utilization.gpu,memory.used,memory.total,temperature.gpu,"
    "power.draw,power.limit,clocks.sm,clocks_event_reasons.active"
)

_out_lock = threading.Lock()


def emit(frame):
    frame["v"] = PROTOCOL
    data = json.dumps(frame, separators=(",", ":"), default=str) + "\n"
    with _out_lock:
        try:
            sys.stdout.write(data)
            sys.stdout.flush()
        except (BrokenPipeError, ValueError):
            os._exit(0)


# ----------------------------------------------------------------------------- GPUs


class NoGpus:
    """No NVML and no nvidia-smi: the host is watched without GPU data."""

    source = None
    driver = None

    def static(self):
        return []

    def sample(self, slow):
        return []

    def close(self):
        pass


class NvmlGpus:
    """GPU sampler over pynvml (or the simulated module with the same interface).

    Calls that a device does not support are remembered and never repeated; slow calls
    (PCIe throughput, process utilization, energy) are not made at all.
    """

    def __init__(self, nvml):
        self.nvml = nvml
        nvml.nvmlInit()
        sim = getattr(nvml, "SIMULATED", False)
        version = getattr(nvml, "__version__", None)
        if not version:
            try:
                from importlib import metadata

                version = metadata.version("nvidia-ml-py")
            except Exception:
                version = "?"
        self.source = "sim" if sim else "pynvml " + str(version)
        self.driver = self._text(self._call(None, "driver", nvml.nvmlSystemGetDriverVersion))
        count = nvml.nvmlDeviceGetCount()
        self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        self.unsupported = [set() for _ in self.handles]
        self.ecc = [None] * count
        self._procs = [None] * count  # (memory used, process rows, when asked) per GPU
        self._reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
        )
        self._mem = self._memory_info()
        self._static = []
        for i, h in enumerate(self.handles):
            mem = self._call(i, "mem", self._mem, h)
            limit = self._call(i, "limit", nvml.nvmlDeviceGetEnforcedPowerLimit, h)
            self._static.append(
                {
                    "index": i,
                    "uuid": self._text(self._call(i, "uuid", nvml.nvmlDeviceGetUUID, h)),
                    "name": self._text(self._call(i, "name", nvml.nvmlDeviceGetName, h)),
                    "mem_total_mib": None if mem is None else mem.total // 1048576,
                    "power_limit_w": None if limit is None else round(limit / 1000.0, 1),
                }
            )

    def _memory_info(self):
        """Memory as nvidia-smi reports it: v2 leaves the driver's reserved memory out of `used`
        (v1 counts it: about 600 MiB more on an H200)."""
        nvml = self.nvml
        v2 = getattr(nvml, "nvmlMemory_v2", None)
        if v2 is not None and self.handles:
            try:
                nvml.nvmlDeviceGetMemoryInfo(self.handles[0], version=v2)
                return lambda h: nvml.nvmlDeviceGetMemoryInfo(h, version=v2)
            except (TypeError, nvml.NVMLError):
                pass
        return nvml.nvmlDeviceGetMemoryInfo

    @staticmethod
    def _text(value):
        return value.decode() if isinstance(value, bytes) else value

    def _call(self, i, field, fn, *args):
        if i is not None and field in self.unsupported[i]:
            return None
        try:
            return fn(*args)
        except self.nvml.NVMLError as exc:
            not_supported = getattr(self.nvml, "NVMLError_NotSupported", None)
            if i is not None and not_supported is not None and isinstance(exc, not_supported):
                self.unsupported[i].add(field)
            return None

    def static(self):
        return self._static

    def sample(self, slow):
        nvml = self.nvml
        out = []
        for i, h in enumerate(self.handles):
            util = self._call(i, "util", nvml.nvmlDeviceGetUtilizationRates, h)
            mem = self._call(i, "mem", self._mem, h)
            power = self._call(i, "power", nvml.nvmlDeviceGetPowerUsage, h)
            reasons = self._call(i, "reasons", self._reasons, h) if self._reasons else None
            if slow:
                self.ecc[i] = self._call(
                    i,
                    "ecc",
                    nvml.nvmlDeviceGetTotalEccErrors,
                    h,
                    nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                    nvml.NVML_VOLATILE_ECC,
                )
            procs = self._gpu_procs(i, h, mem)
            out.append(
                {
                    "index": i,
                    "util_pct": None if util is None else util.gpu,
                    "mem_used_mib": None if mem is None else mem.used // 1048576,
                    "mem_total_mib": None if mem is None else mem.total // 1048576,
                    "temp_c": self._call(
                        i, "temp", nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU
                    ),
                    "power_w": None if power is None else round(power / 1000.0, 1),
                    "power_limit_w": self._static[i]["power_limit_w"],
                    "sm_clock_mhz": self._call(
                        i, "clock", nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_SM
                    ),
                    "throttle": reasons,
                    "ecc_uncorrected": self.ecc[i],
                    "processes": procs,
                }
            )
        return out

    def _gpu_procs(self, i, h, mem):
        """The GPU's processes and their memory: the costliest NVML call of a sample (0.3 ms on an
        H200, most of the agent's per-second cost), so asked again only when the GPU's memory use
        moved (a process came, went, or grew), one of its processes ended, or every GPU_PROCS_EVERY_S."""
        now = time.monotonic()
        used = None if mem is None else mem.used
        last = self._procs[i]
        if (last is not None and used is not None and last[0] == used and now - last[2] < GPU_PROCS_EVERY_S
                and all(_alive(row[0]) for row in last[1])):
            return last[1]
        procs = self._call(i, "procs", self.nvml.nvmlDeviceGetComputeRunningProcesses, h) or []
        rows = [[p.pid, None if p.usedGpuMemory is None else p.usedGpuMemory // 1048576] for p in procs]
        self._procs[i] = (used, rows, now)
        return rows

    def close(self):
        try:
            self.nvml.nvmlShutdown()
        except Exception:
            pass


class SmiGpus:
    """Fallback without pynvml: one long-lived `nvidia-smi -lms` process per query, never one per
    sample. Its rows are read by threads and the latest row per GPU is kept."""

    source = "nvidia-smi"

    def __init__(self, interval):
        ms = str(max(100, int(interval * 1000)))
        self.latest = {}
        self.apps = {}
        self._apps_pending = {}
        self.driver = None
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version,index,uuid,name,memory.total,power.limit",
             "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=20,
        )
        if out.returncode != 0:
            raise OSError(out.stderr.strip() or "nvidia-smi failed")
        self._static = []
        for row in self._rows(out.stdout):
            self.driver = row[0]
            self._static.append(
                {
                    "index": int(row[1]),
                    "uuid": row[2],
                    "name": row[3],
                    "mem_total_mib": _num(row[4], int),
                    "power_limit_w": _num(row[5], float),
                }
            )
        self.procs = [
            subprocess.Popen(
                ["nvidia-smi", "--query-gpu=" + SMI_FIELDS, "--format=csv,noheader,nounits", "-lms", ms],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            ),
            subprocess.Popen(
                ["nvidia-smi", "--query-compute-apps=gpu_uuid,pid,used_memory",
                 "--format=csv,noheader,nounits", "-lms", ms],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            ),
        ]
        for target, proc in ((self._read_gpus, self.procs[0]), (self._read_apps, self.procs[1])):
            threading.Thread(target=target, args=(proc,), daemon=True).start()

    @staticmethod
    def _rows(text):
        return [[c.strip() for c in line.split(",")] for line in text.splitlines() if line.strip()]

    def _read_gpus(self, proc):
        for line in proc.stdout:
            row = [c.strip() for c in line.split(",")]
            if len(row) == 11 and row[0].isdigit():
                self.latest[int(row[0])] = row

    def _read_apps(self, proc):
        for line in proc.stdout:
            row = [c.strip() for c in line.split(",")]
            if len(row) == 3 and row[1].isdigit():
                self.apps.setdefault(row[0], {})[int(row[1])] = _num(row[2], int)

    def static(self):
        return self._static

    def sample(self, slow):
        out = []
        for st in self._static:
            row = self.latest.get(st["index"])
            if row is None:
                continue
            reasons = row[10]
            apps = self.apps.get(st["uuid"], {})
            out.append(
                {
                    "index": st["index"],
                    "util_pct": _num(row[3], int),
                    "mem_used_mib": _num(row[4], int),
                    "mem_total_mib": _num(row[5], int),
                    "temp_c": _num(row[6], int),
                    "power_w": _num(row[7], float),
                    "power_limit_w": _num(row[8], float),
                    "sm_clock_mhz": _num(row[9], int),
                    "throttle": int(reasons, 16) if reasons.startswith("0x") else None,
                    "ecc_uncorrected": None,
                    "processes": [[pid, mib] for pid, mib in sorted(apps.items())],
                }
            )
        self.apps = {}
        return out

    def close(self):
        for p in self.procs:
            p.kill()


def _num(text, kind):
    try:
        return kind(float(text)) if kind is int else kind(text)
    except (TypeError, ValueError):
        return None  # "[N/A]", "[Not Supported]"


def open_gpus(interval, warnings):
    try:
        import pynvml  # the simulated module is installed under this name too
    except ImportError:
        pynvml = None
    if pynvml is not None:
        try:
            return NvmlGpus(pynvml)
        except Exception as exc:
            msg = str(exc) or type(exc).__name__
            if "Driver Not Loaded" in msg or "LibraryNotFound" in type(exc).__name__ or "not found" in msg.lower():
                warnings.append("no NVIDIA driver on this host (" + msg + "): no GPU data")
                return NoGpus()
            warnings.append("pynvml failed (" + msg + "): trying nvidia-smi")
    else:
        warnings.append("pynvml is not installed for " + sys.executable
                        + ": using nvidia-smi (pip install nvidia-ml-py for lower overhead)")
    try:
        return SmiGpus(interval)
    except (OSError, subprocess.SubprocessError) as exc:
        warnings.append("no GPUs: neither pynvml nor nvidia-smi works here (" + str(exc).strip()[:120] + ")")
        return NoGpus()


# ----------------------------------------------------------------------------- processes

_STATUS = {
    "running": "R", "sleeping": "S", "disk-sleep": "D", "stopped": "T", "tracing-stop": "t",
    "zombie": "Z", "dead": "X", "idle": "I", "wake-kill": "K", "waking": "W", "parked": "P",
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
                _BOOT = next(float(l.split()[1]) for l in fh if l.startswith("btime"))
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


def _read_proc(path):
    """A small /proc file's bytes, through the bare system calls (a third of the cost of open()'s
    buffered file object, which a tick pays for every watched process): None when it is gone."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)


def _last_pid():
    """The most recently created pid (threads included), the last field of /proc/loadavg: while
    it stands still no process was born, so no watched process can have a new child."""
    data = _read_proc("/proc/loadavg")
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
    f = data[rpar + 2:].split()
    if len(f) < 22:
        return None
    state = f[0].decode()
    if state in ("X", "x"):
        return None
    start = int(f[19])
    return {
        "pid": pid,
        "ppid": int(f[1]),
        "name": data[lpar + 1:rpar].decode("utf-8", "replace"),
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
    """(start, ppid, pgid, comm) from /proc/PID/stat's bytes: what a scan needs, parsed no
    further. None when the process is gone."""
    if not data:
        return None
    lpar, rpar = data.find(b"("), data.rfind(b")")
    f = data[rpar + 2:].split(None, 21)
    if len(f) < 21 or f[0] in (b"X", b"x"):
        return None
    return int(f[19]), int(f[1]), int(f[2]), data[lpar + 1:rpar].decode("utf-8", "replace")


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

    def __init__(self, psutil):
        self.ps = psutil
        self.patterns = list(DEFAULT_PATTERNS)
        self.pgids = set()
        self.pids = set()
        self.watched = {}  # pid -> psutil.Process
        self.cmdlines = {}
        self.names = {}
        self.cpu = {}  # pid -> (start ticks, cpu ticks, monotonic time) of the last sample
        self._rows = {}  # pid -> (start, ppid, pgid, comm, argv) from the last scan
        self._reread_at = 0.0  # when every process's stat was last read afresh
        self.sent_cmdline = set()
        self.last_scan = 0.0
        self.last_pid = None  # /proc/loadavg's newest pid when children were last looked for
        self.scan_pid = None  # ... and when the process table was last scanned whole
        self.last_full = 0.0
        self._match = {}  # pid -> (comm, argv, matched) from the last scan: argv is the cached list
        self._stat = {}  # pid -> (its /proc/PID/stat bytes, the row they gave) from the last tick
        self._fds = {}  # pid -> an open /proc/PID/stat, read again with pread each tick

    def _read_stat(self, pid):
        """/proc/PID/stat through a descriptor kept open while the process is watched: pread at
        offset 0 makes the kernel write it afresh, at half the cost of open, read and close. The
        descriptor belongs to that process: once it has gone (whoever has its pid now) the read
        fails and the row is gone."""
        fd = self._fds.get(pid)
        if fd is None:
            if len(self._fds) >= STAT_FDS_MAX:
                return _read_proc("/proc/%d/stat" % pid)
            try:
                fd = self._fds[pid] = os.open("/proc/%d/stat" % pid, os.O_RDONLY)
            except OSError:
                return None
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

    def _matches(self, name, cmd):
        for pat in self.patterns:
            if fnmatch.fnmatchcase(name, pat) or fnmatch.fnmatchcase(cmd, pat):
                return True
        return False

    def _table(self, before=None, newest=None):
        """(pid, ppid, pgid, comm, argv) of every process. On Linux: the stat of a process not
        seen before, young, or whose pid may have been reused (the kernel's pid cursor passed it
        since the last scan, from `before` to `newest`) is read; an older one keeps its row from
        the last scan, and every row is read afresh every REREAD_EVERY_S. The command line is
        read only for a process not seen before or retitled since (the costly part)."""
        me = os.getpid()
        if not _HAVE_PROC:
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
        for name in os.listdir("/proc"):
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
                start, ppid, pgid, comm = ids
                argv = row[4] if row is not None and row[0] == start and row[3] == comm else _read_cmdline(pid)
                row = (start, ppid, pgid, comm, argv)
            seen[pid] = row
            yield pid, row[1], row[2], row[3], row[4]
        self._rows = seen

    def scan(self):
        before = self.scan_pid
        self.last_pid = self.scan_pid = _last_pid() if _HAVE_PROC else None  # a pid born after this: the next tick
        self.last_full = time.monotonic()
        children = {}
        roots = set()
        alive = set()
        memo, self._match = self._match, {}
        for pid, ppid, pgid, comm, argv in self._table(before, self.scan_pid):
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

    def _handle(self, pid):
        """A psutil handle where there is no /proc to read directly."""
        if _HAVE_PROC:
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
        stack = list(self.watched)
        newest = _last_pid() if _HAVE_PROC else None
        first, self.last_pid = self.last_pid, newest
        if newest is not None and first is not None and 0 <= newest - first <= NEWCOMERS_MAX:
            if newest == first:
                return
            parents = set()
            for pid in range(first + 1, newest + 1):
                row = _proc_stat(pid)  # a thread's own id reads too; its "parent" is checked below
                if row is not None and row["ppid"] in self.watched:
                    parents.add(row["ppid"])
            stack = list(parents)
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
        if force_scan or now - self.last_scan >= SCAN_EVERY_S:
            if (not force_scan and self.scan_pid is not None and now - self.last_full < SCAN_QUIET_MAX_S
                    and _last_pid() == self.scan_pid):
                # no process was born on the host since the last full scan: no new tree can have
                # appeared (a process that retitles itself into a pattern without any birth
                # waits for the next scan, at most SCAN_QUIET_MAX_S)
                self.last_scan = now
                self.adopt_children()
            else:
                self.scan()
        else:
            self.adopt_children()
        wall = time.monotonic()
        out = []
        gone = []
        stat = self._stat
        for pid, proc in self.watched.items():
            data = self._read_stat(pid) if _HAVE_PROC else None
            last = stat.get(pid)
            if last is not None and last[0] == data and pid in self.sent_cmdline:
                # not a byte of its stat moved (an idle process): the same row, no CPU since
                prev = self.cpu[pid]
                self.cpu[pid] = (prev[0], prev[1], wall)
                out.append(last[1])
                continue
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
                if prev is not None and prev[0] != start:
                    gone.append(pid)  # the pid was reused: not our process any more
                    continue
                row["cpu_pct"] = 0.0 if prev is None else round(
                    100.0 * (ticks - prev[1]) / _CLK_TCK / max(1e-3, wall - prev[2]), 1)
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
            out.append(row)
        for pid in gone:
            self.watched.pop(pid, None)
            self.names.pop(pid, None)
            self.cmdlines.pop(pid, None)
            self.cpu.pop(pid, None)
            self.sent_cmdline.discard(pid)
            stat.pop(pid, None)
            self._close_stat(pid)
        for pid in [p for p in stat if p not in self.watched]:
            del stat[pid]
        for pid in [p for p in self._fds if p not in self.watched]:
            self._close_stat(pid)
        return out

    def _psutil_argv(self, proc):
        try:
            return proc.cmdline()
        except (self.ps.Error, AttributeError):
            return []

    def _psutil_row(self, pid, proc):
        """Where there is no /proc (not Linux): psutil's portable way."""
        ps = self.ps
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
        self.sent_cmdline.clear()


# ----------------------------------------------------------------------------- ports


def _diag_listeners():
    """{port: inode} of listening TCP sockets through netlink sock_diag, asking the kernel for
    LISTEN sockets only: /proc/net/tcp makes it walk every socket on a busy host."""
    import struct

    ports = {}
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, 4)  # NETLINK_SOCK_DIAG
    try:
        sock.settimeout(1.0)
        for seq, family in enumerate((socket.AF_INET, socket.AF_INET6), 1):
            req = struct.pack("=BBBBI48x", family, socket.IPPROTO_TCP, 0, 0, 1 << 10)
            sock.send(struct.pack("=IHHII", 16 + len(req), 20, 0x301, seq, 0) + req)
            done = False
            while not done:
                data = sock.recv(65536)
                off = 0
                while off + 16 <= len(data):
                    length, kind = struct.unpack_from("=IH", data, off)
                    if kind == 3:  # NLMSG_DONE
                        done = True
                        break
                    if kind == 2 or length < 16:  # NLMSG_ERROR
                        raise OSError("sock_diag refused")
                    body = off + 16
                    port = struct.unpack_from(">H", data, body + 4)[0]
                    inode = struct.unpack_from("=I", data, body + 68)[0]
                    ports.setdefault(port, inode)
                    off += (length + 3) & ~3
    finally:
        sock.close()
    return ports


_DIAG_OK = [hasattr(socket, "AF_NETLINK")]


def listening_ports():
    """{port: inode} of listening TCP sockets: sock_diag where it works, else /proc/net/tcp{,6}."""
    if _DIAG_OK[0]:
        try:
            return _diag_listeners()
        except OSError:
            _DIAG_OK[0] = False
    ports = {}
    for port, inode in _proc_net_listeners():
        ports.setdefault(port, inode)
    return ports


def _proc_net_listeners(base="/proc/net"):
    """(port, socket inode) of each listening TCP socket, from /proc/net/tcp and tcp6 (`base`
    /proc/PID/net: that process's network namespace)."""
    for name in (base + "/tcp", base + "/tcp6"):
        try:
            with open(name) as fh:
                next(fh, None)
                for line in fh:
                    parts = line.split()
                    if len(parts) > 9 and parts[3] == "0A":
                        yield int(parts[1].rsplit(":", 1)[1], 16), int(parts[9])
        except OSError:
            continue


def socket_inodes(pid):
    inodes = set()
    try:
        fd_dir = "/proc/%d/fd" % pid
        for fd in os.listdir(fd_dir):
            try:
                link = os.readlink(fd_dir + "/" + fd)
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(int(link[8:-1]))
    except OSError:
        pass
    return inodes


class Ports:
    """Configured ports (open or not) and every port a watched process listens on.

    Owners are found by reading the watched processes' fds, which is the costly part, so it is
    done only when a listening socket appears that was not seen before or the watched set changes."""

    def __init__(self):
        self.configured = []
        self.owner = {}  # inode -> pid
        self.foreign = set()  # listening inodes no watched process held when last looked
        self._watched = frozenset()

    def sample(self, watched_pids):
        listening = listening_ports()
        watched = frozenset(watched_pids)
        inodes = set(listening.values())
        fresh = inodes - set(self.owner) - self.foreign
        if fresh or watched != self._watched:
            # a listener nobody was known to hold, or an owner gone (another process may share
            # its socket): every watched process's sockets; only newcomers in the watched set:
            # their sockets (a 200-process tree where one worker restarts reads one fd table)
            full = fresh or any(pid not in watched for pid in self.owner.values())
            look = watched if full else watched - self._watched
            if full:
                self.owner = {}
            self._watched = watched
            for pid in look:
                for inode in socket_inodes(pid) & inodes:
                    self.owner[inode] = pid
            self.foreign = inodes - set(self.owner)
        owners = {port: self.owner[inode] for port, inode in listening.items() if inode in self.owner}
        out = []
        for port in sorted(set(self.configured) | set(owners)):
            out.append({"port": port, "listening": port in listening, "pid": owners.get(port)})
        return out


# ----------------------------------------------------------------------------- logs


class LogTail:
    """Follows one file through rotation (new inode) and truncation (size below our offset);
    waits for a file that does not exist yet. Reads at most LOG_MAX_BYTES_PER_FRAME per poll.
    A line keeps at most LOG_LINE_MAX bytes, the rest is counted and said (" … [N bytes
    skipped]"), so a log that never writes a newline holds at most that much here."""

    def __init__(self, path, owners=None):
        self.path = path
        # who may own the file: the user of the process writing it when that is known (its
        # stdout), else root and the agent's own user; anyone else's file is refused, not read
        self.owners = set(owners) if owners is not None else {0, os.geteuid()}
        self.fh = None
        self.inode = self.dev = None
        self.pos = 0
        self.partial = b""  # the line being read, at most LOG_LINE_MAX bytes
        self.partial_skipped = 0  # bytes of that line beyond LOG_LINE_MAX, dropped
        self.state = None
        self.mtime = None  # when the file was last written (host clock): how long the run has been silent

    def _feed(self, data):
        """Whole lines out of `data` after what came before; the unfinished one is kept, bounded."""
        out = []
        start = 0
        while True:
            nl = data.find(b"\n", start)
            piece = data[start:] if nl < 0 else data[start:nl]
            room = max(0, LOG_LINE_MAX - len(self.partial))
            if len(piece) > room:
                self.partial_skipped += len(piece) - room
                piece = piece[:room]
            self.partial += piece
            if nl < 0:
                return out
            out.append(self._finish())
            start = nl + 1

    def _finish(self):
        text = self.partial.decode("utf-8", "replace").rstrip("\r")
        if self.partial_skipped:
            text += " \u2026 [%d bytes skipped]" % self.partial_skipped
        self.partial, self.partial_skipped = b"", 0
        return text

    def _open(self, initial):
        """Opens the file as open_regular allows; returns why it was refused, or None."""
        try:
            fd = open_regular(self.path, self.owners)
        except OSError as exc:
            return "%s %s" % (self.path, exc.strerror or exc)
        fh = os.fdopen(fd, "rb")
        st = os.fstat(fh.fileno())
        self.fh, self.inode, self.dev = fh, st.st_ino, st.st_dev
        self.pos = max(0, st.st_size - LOG_INITIAL_BYTES) if initial else 0
        fh.seek(self.pos)
        self.partial, self.partial_skipped = b"", 0
        if self.pos:
            fh.readline()  # skip the cut line
            self.pos = fh.tell()
        return None

    def poll(self):
        """Returns (event or None, [lines]). The path is looked at with lstat and every open (the
        first, after a rotation, after it was missing) is checked again: a log swapped for a
        symlink, a FIFO or another user's file is said once as `refused: why` and never read."""
        event = None
        try:
            st = os.lstat(self.path)
        except OSError:
            if self.state != "missing":
                self.state = "missing"
                return "missing", self._drain()
            return None, []
        self.mtime = st.st_mtime
        lines = []
        if self.fh is not None and (st.st_ino, st.st_dev) != (self.inode, self.dev):
            lines = self._drain()
            if self.fh is not None:
                self.fh.close()
                self.fh = None
            event = "rotated"
        if self.fh is None:
            was = self.state
            why = self._open(initial=self.inode is None)
            if why:
                self.state = "refused: " + why
                return (None if was == self.state else self.state), lines
            event = event or ("opened" if was is None else "created")
            st = os.fstat(self.fh.fileno())
        elif st.st_size < self.pos:
            self.fh.seek(0)
            self.pos = 0
            self.partial, self.partial_skipped = b"", 0
            event = "truncated"
        self.state = "open"
        behind = st.st_size - self.pos
        if behind > 4 * LOG_MAX_BYTES_PER_FRAME:
            # A flood: a tail shows the newest lines; say how much was skipped rather than lag.
            self.fh.seek(st.st_size - LOG_MAX_BYTES_PER_FRAME)
            self.fh.readline()
            self.pos = self.fh.tell()
            self.partial, self.partial_skipped = b"", 0
            event = "skipped %d bytes" % (self.pos - (st.st_size - behind))
        data = self.fh.read(LOG_MAX_BYTES_PER_FRAME)
        self.pos += len(data)
        if data:
            lines.extend(self._feed(data))
        return event, lines

    def _drain(self):
        if self.fh is None:
            return []
        lines = self._feed(self.fh.read(LOG_MAX_BYTES_PER_FRAME))
        if self.partial or self.partial_skipped:
            lines.append(self._finish())
        if self.state == "missing":
            self.fh.close()
            self.fh = None
        return [line for line in lines if line]


# ----------------------------------------------------------------------------- commands


def http_get(port, path, timeout=2.0, host="127.0.0.1"):
    """One HTTP GET on the host's loopback: the probe the operator ran with curl."""
    start = time.monotonic()
    try:
        sock = socket.create_connection((host, int(port)), timeout=timeout)
    except OSError as exc:
        return {"port": port, "path": path, "status": None, "error": exc.strerror or str(exc)}
    try:
        sock.settimeout(timeout)
        req = "GET %s HTTP/1.0\r\nHost: %s:%d\r\nUser-Agent: gpu-cockpit\r\n\r\n" % (path, host, int(port))
        sock.sendall(req.encode())
        data = b""
        while len(data) < 65536:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    except OSError as exc:
        return {"port": port, "path": path, "status": None, "error": str(exc) or "timeout"}
    finally:
        sock.close()
    ms = round((time.monotonic() - start) * 1000.0, 1)
    head, _, body = data.partition(b"\r\n\r\n")
    m = re.match(rb"HTTP/\d\.\d (\d{3})", head)
    return {
        "port": port,
        "path": path,
        "status": int(m.group(1)) if m else None,
        "ms": ms,
        "body": body[:4096].decode("utf-8", "replace"),
    }



# ----------------------------------------------------------------------------- NCCL RAS

RAS_PORT = 28028
RAS_EVERY_S = 5.0  # at most this often, and only while a watched process listens on the RAS port
RAS_TIMEOUT_S = 15.0  # a whole conversation; RAS itself waits for unresponsive peers
RAS_MAX_BYTES = 1 << 20


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


def ras_addr(text):
    """NCCL_RAS_ADDR's `host:port` (or `port`) as (host, port); None when unreadable."""
    host, _, port = (text or "").strip().rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65536:
        return None
    host = host.strip("[]") or "127.0.0.1"
    if host in ("0.0.0.0", "::", "*"):
        host = "127.0.0.1"
    return host, int(port)


class _Conversation:
    """Lines and the rest of one TCP conversation, every read under one deadline and bounded."""

    def __init__(self, sock, deadline, limit):
        self.sock, self.deadline, self.limit = sock, deadline, limit
        self.buf = b""
        self.truncated = False

    def _recv(self):
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout("no answer from RAS in time")
        self.sock.settimeout(left)
        return self.sock.recv(65536)

    def send(self, line):
        self.sock.settimeout(max(0.1, self.deadline - time.monotonic()))
        self.sock.sendall((line + "\n").encode())

    def line(self):
        while b"\n" not in self.buf:
            chunk = self._recv()
            if not chunk:
                break
            self.buf += chunk
            if len(self.buf) > 4096:
                break
        line, _, self.buf = self.buf.partition(b"\n")
        return line.decode("utf-8", "replace").strip()

    def rest(self):
        data = self.buf
        while len(data) < self.limit:
            chunk = self._recv()
            if not chunk:
                return data
            data += chunk
        self.truncated = True
        return data[:self.limit]


def ras_query(host="127.0.0.1", port=RAS_PORT, fmt="json", verbose=True, timeout=RAS_TIMEOUT_S,
              limit=RAS_MAX_BYTES):
    """One conversation with NCCL's RAS service, as NCCL's own client has it: CLIENT PROTOCOL 2,
    SET FORMAT json (NCCL >= 2.28; text when the server does not know it), VERBOSE STATUS, then
    the report until the server closes. Never raises: the answer says what went wrong. A JSON
    answer that does not parse is asked again as text (json_error says why)."""
    start = time.monotonic()
    out = {"ts": round(time.time(), 3), "host": host, "port": port, "format": fmt, "text": None}
    try:
        sock = socket.create_connection((host, int(port)), timeout=min(3.0, timeout))
    except OSError as exc:
        out["error"] = "cannot connect to %s:%d: %s" % (host, port, exc.strerror or exc)
        return out
    try:
        conv = _Conversation(sock, start + timeout, limit)
        conv.send("CLIENT PROTOCOL 2")
        hello = conv.line()
        if not hello.upper().startswith("SERVER PROTOCOL"):
            out["error"] = "not NCCL's RAS service: it answered %r" % hello[:80]
            return out
        if fmt == "json":
            conv.send("SET FORMAT json")
            if conv.line().upper() != "OK":
                out["format"] = "text"
        conv.send("VERBOSE STATUS" if verbose else "STATUS")
        data = conv.rest()
        out["text"] = data.decode("utf-8", "replace")
        out["truncated"] = conv.truncated
    except (OSError, socket.timeout) as exc:
        out["error"] = "RAS at %s:%d: %s" % (host, port, str(exc) or "timeout")
        return out
    finally:
        sock.close()
        out["ms"] = round((time.monotonic() - start) * 1000.0, 1)
    if out["format"] == "json":
        try:
            json.loads(out["text"])
        except ValueError as exc:
            again = ras_query(host, port, "text", verbose, max(1.0, timeout - (time.monotonic() - start)), limit)
            again["json_error"] = str(exc)[:200]
            return again
    return out


class RasPoller:
    """Asks NCCL's RAS service for its status from a thread, at most every RAS_EVERY_S, and only
    while a watched process listens on the RAS port (NCCL_RAS_ADDR from a rank's environment, else
    28028): a RAS that hangs never holds up a sample. Remembers a server whose JSON was broken."""

    def __init__(self):
        self.every_s = RAS_EVERY_S
        self.timeout = RAS_TIMEOUT_S
        self.enabled = True
        self.addr = None  # (host, port) forced by the cockpit
        self.env_addr = {}  # pid -> (host, port) or None, read once per process
        self.last = 0.0
        self.thread = None
        self.result = None
        self.text_only = False
        self.lock = threading.Lock()

    def target(self, procs):
        if self.addr:
            return self.addr
        for row in procs:
            pid = row["pid"]
            if pid not in self.env_addr:
                self.env_addr[pid] = ras_addr(environ_of(pid).get("NCCL_RAS_ADDR"))
            if self.env_addr[pid]:
                return self.env_addr[pid]
        return ("127.0.0.1", RAS_PORT)

    def poll(self, ports, procs):
        """Starts a query when one is due; returns the last finished answer once."""
        live = set(row["pid"] for row in procs)
        for pid in list(self.env_addr):
            if pid not in live:
                del self.env_addr[pid]
        with self.lock:
            done, self.result = self.result, None
        if not self.enabled:
            return done
        if not self.addr and not any(p.get("pid") in live for p in ports):
            return done  # no watched process listens anywhere: no RAS to ask, no environment to read
        owners = set(p.get("pid") for p in ports)
        host, port = self.target([row for row in procs if row["pid"] in owners])  # only a listener's environment
        listening = any(p["port"] == port and p.get("pid") in live for p in ports)
        now = time.monotonic()
        if listening and now - self.last >= self.every_s and (self.thread is None or not self.thread.is_alive()):
            self.last = now
            self.thread = threading.Thread(target=self._run, args=(host, port), daemon=True, name="ras")
            self.thread.start()
        return done

    def _run(self, host, port):
        answer = ras_query(host, port, "text" if self.text_only else "json", timeout=self.timeout)
        if answer.get("json_error"):
            self.text_only = True
        with self.lock:
            self.result = answer


# ----------------------------------------------------------------------------- flight recorder

FR_MAX_BYTES = 64 << 20
FR_KEEP_ENTRIES = 400  # per rank, the newest: what a comparison needs
FR_FIELDS = ("record_id", "pg_id", "process_group", "collective_seq_id", "p2p_seq_id", "op_id", "profiling_name",
             "state", "time_created_ns", "time_discovered_started_ns", "time_discovered_completed_ns", "is_p2p",
             "retired", "timeout_ms", "input_sizes", "duration_ms")
FR_BUFFER_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
FR_FILE_VARS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
FR_PIPE_VAR = "TORCH_NCCL_DEBUG_INFO_PIPE_FILE"


def _plain_list(*args):
    return list(args[0]) if args else []


def _tagged(value, *_):
    return value


def fr_unpickler():
    """A pickle reader that builds plain containers only: dicts, lists, tuples, strings, numbers,
    booleans and None. The only globals it accepts are torch's list builders and type tags (mapped
    to plain lists and the identity), so a hostile file cannot run code."""
    import io
    import pickle

    allowed = {
        ("torch.jit._pickle", "build_intlist"): _plain_list,
        ("torch.jit._pickle", "build_doublelist"): _plain_list,
        ("torch.jit._pickle", "build_boollist"): _plain_list,
        ("torch.jit._pickle", "build_list"): _plain_list,
        ("torch.jit._pickle", "restore_type_tag"): _tagged,
    }

    class Plain(pickle.Unpickler):
        def find_class(self, module, name):
            fn = allowed.get((module, name))
            if fn is None:
                raise pickle.UnpicklingError("refused %s.%s: only plain containers are read" % (module[:60], name[:60]))
            return fn

        def persistent_load(self, pid):
            raise pickle.UnpicklingError("refused a persistent id: only plain containers are read")

    return lambda data: Plain(io.BytesIO(data)).load()


def read_fr_dump(data):
    """A flight-recorder dump (torch's pickle, or its JSON) as plain data: raises ValueError."""
    import pickle

    if data[:1] in (b"{", b"["):
        doc = json.loads(data.decode("utf-8", "replace"))
    else:
        try:
            doc = fr_unpickler()(data)
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError,
                MemoryError, RecursionError, UnicodeDecodeError) as exc:
            raise ValueError("not a readable flight-recorder dump: %s" % (str(exc)[:160] or type(exc).__name__))
    if not isinstance(doc, dict):
        raise ValueError("not a flight-recorder dump: a %s, not a dict" % type(doc).__name__)
    return doc


def _plainify(value, depth=0):
    """JSON-safe: tuples to lists, keys to strings, bytes to text."""
    if depth > 20:
        return None
    if isinstance(value, dict):
        return {str(k)[:200]: _plainify(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plainify(v, depth + 1) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, float) and value != value:
        return None
    return value


def slim_fr_dump(doc):
    """What the cockpit compares, without stack frames: version, pg_status, pg_config and the
    newest FR_KEEP_ENTRIES entries with their identifying fields."""
    entries = doc.get("entries") if isinstance(doc.get("entries"), list) else []
    keep = [{k: e.get(k) for k in FR_FIELDS if k in e} for e in entries[-FR_KEEP_ENTRIES:] if isinstance(e, dict)]
    return _plainify({"version": doc.get("version"), "pg_status": doc.get("pg_status"), "pg_config": doc.get("pg_config"),
                      "comm_lib_version": doc.get("comm_lib_version") or doc.get("nccl_version"),
                      "entries": keep, "entries_total": len(entries)})


def _proc_path(pid, path):
    """A path from a process's environment as seen from here: relative to its working folder."""
    if path.startswith("/"):
        return path
    try:
        return os.path.join(os.readlink("/proc/%d/cwd" % pid), path)
    except OSError:
        return None


def open_regular(path, uids=None, limit=None):
    """A file the agent reads for a run (a log, a dump, package metadata), opened so that its owner
    cannot turn the open against root: no symlink followed (O_NOFOLLOW), never blocked on a FIFO
    (O_NONBLOCK), then checked on the descriptor: a regular file, owned by one of `uids` (an int
    or a set; None: any), at most `limit` bytes, no second hard link unless it is the agent's
    own user's. Returns the descriptor; OSError says why it was refused."""
    import errno
    import stat

    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError("is a symbolic link: not followed") from None
        raise
    try:
        st = os.fstat(fd)
        owners = {uids} if isinstance(uids, int) else uids
        if not stat.S_ISREG(st.st_mode):
            raise OSError("not a regular file: not read")
        if owners is not None and st.st_uid not in owners:
            raise OSError("owned by %s, not by the run's user (%s): not read"
                          % (_user(st.st_uid), ", ".join(sorted(_user(u) for u in owners))))
        if st.st_nlink > 1 and st.st_uid != os.geteuid():
            raise OSError("has other hard links: not read")
        if limit is not None and st.st_size > limit:
            raise OSError("%d bytes, more than the %d read" % (st.st_size, limit))
        os.set_blocking(fd, True)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _read_regular(path, limit, uid=None):
    """A regular file's bytes (open_regular's rules), at most `limit`; with `uid` (an int or a
    set), only a file one of them owns."""
    fd = open_regular(path, uid, limit)
    try:
        st = os.fstat(fd)
        chunks, n = [], 0
        while n < limit:
            chunk = os.read(fd, min(1 << 20, limit - n))
            if not chunk:
                break
            chunks.append(chunk)
            n += len(chunk)
        return b"".join(chunks), st.st_mtime
    finally:
        os.close(fd)


def _poke_fifo(path, uid, held, pid):
    """One byte into the FIFO a rank reads: a FIFO itself (lstat: never a symlink, never a
    regular file), owned by the rank's user, and held open by the rank (its (device, inode) among
    the rank's open descriptors: torch's DumpPipe keeps it open for reading). Checked again on the
    descriptor it is written through."""
    import stat

    st = os.lstat(path)
    if not stat.S_ISFIFO(st.st_mode):
        raise OSError("not a FIFO")
    if st.st_uid != uid:
        raise OSError("owned by %s, not by the rank's user (%s): not written" % (_user(st.st_uid), _user(uid)))
    if (st.st_dev, st.st_ino) not in held:
        raise OSError("not held open by the rank (pid %d): not its dump pipe" % pid)
    fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_NOFOLLOW", 0))
    try:
        now = os.fstat(fd)
        if not stat.S_ISFIFO(now.st_mode) or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            raise OSError("changed since it was checked")
        os.write(fd, b"1")
    finally:
        os.close(fd)


def _environ_and_source(pid, hops=4):
    """environ_of, and the pid whose environment it is (the rank's own, or an ancestor's)."""
    for _ in range(hops + 1):
        env = _environ(pid)
        if env:
            return env, pid
        row = _proc_stat(pid)
        if row is None or row["ppid"] <= 1:
            return {}, None
        pid = row["ppid"]
    return {}, None


def fr_dump(pids, trigger=True, wait_s=15.0, raw=False, limit=FR_MAX_BYTES):
    """Torch's flight recorder on every rank of the run: each rank's environment says whether it
    is armed and where its pipe and dump are; with `trigger`, one byte into every rank's pipe
    (`<stem><rank>.pipe`) asks each to dump; then every dump newer than the trigger (or the
    newest, without it) is read as plain data. Returns per rank its summary or why none."""
    import base64
    import glob

    problems, stems, prefixes = [], {}, {}
    for pid in pids:
        env, source = _environ_and_source(int(pid))
        if not env:
            continue
        uid = _uid(int(pid))
        if uid is None:
            continue
        if _uid(source) != uid:
            problems.append("pid %d: its environment is that of pid %d, of another user (%s): its pipe and dump "
                            "paths are not used" % (int(pid), source, _user(_uid(source))))
            continue
        size = next((env[v] for v in FR_BUFFER_VARS if env.get(v)), "")
        if not size.strip().isdigit() or int(size) <= 0:
            problems.append("pid %d: no %s: the flight recorder keeps nothing" % (int(pid), " or ".join(FR_BUFFER_VARS)))
            continue
        prefix = next((env[v] for v in FR_FILE_VARS if env.get(v)), None)
        if prefix is None:
            home = env.get("HOME") or "/tmp"
            prefix = os.path.join(env.get("XDG_CACHE_HOME") or os.path.join(home, ".cache"), "torch", "comm_lib_trace_rank_")
        prefix = _proc_path(int(pid), prefix)
        if prefix:
            prefixes[prefix] = uid
        stem = env.get(FR_PIPE_VAR)
        if stem and _proc_path(int(pid), stem):
            stems.setdefault(_proc_path(int(pid), stem), []).append((int(pid), uid))
        elif trigger:
            problems.append("pid %d: no %s: a dump can only come from a timeout" % (int(pid), FR_PIPE_VAR))
    started = time.time()
    poked, poke_errors = [], []
    if trigger:
        # only <stem><rank>.pipe, as torch's DumpPipe names it, and only the one the rank holds open
        for stem, owners in stems.items():
            pipe_name = re.compile(re.escape(os.path.basename(stem)) + r"[0-9]+\.pipe")
            paths = [p for p in sorted(glob.glob(glob.escape(stem) + "[0-9]*.pipe"))[:1024]
                     if pipe_name.fullmatch(os.path.basename(p))]
            for pid, uid in owners:
                held = _fd_ids(pid, None) or set()
                mine = []
                for path in paths:
                    if path in poked:
                        continue
                    try:
                        _poke_fifo(path, uid, held, pid)
                        mine.append(path)
                    except OSError as exc:
                        poke_errors.append("%s: %s" % (path, exc.strerror or exc))
                poked.extend(mine)
                if not mine:
                    problems.append("pid %d: no dump pipe %s<rank>.pipe of its own (a FIFO it holds open, of its "
                                    "user) to write to" % (pid, stem))
    ranks = {}
    deadline = time.monotonic() + (wait_s if poked else 0.0)
    want = len(poked)
    while True:
        found = {}
        for prefix in prefixes:
            for path in glob.glob(glob.escape(prefix) + "*")[:1024]:
                suffix = path[len(prefix):]
                if not suffix.isdigit():
                    continue
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                if trigger and poked and st.st_mtime < started - 1.0:
                    continue
                found[int(suffix)] = (path, prefixes[prefix])
        if len(found) >= want or time.monotonic() >= deadline:
            break
        time.sleep(0.25)
    time.sleep(0.3 if found and poked else 0.0)  # a dump being written: let it finish
    for rank, (path, uid) in sorted(found.items()):
        entry = {"file": path}
        try:
            data, mtime = _read_regular(path, limit, uid)
            entry.update(bytes=len(data), mtime=mtime)
            entry.update(slim_fr_dump(read_fr_dump(data)))
            if raw:
                entry["raw_b64"] = base64.b64encode(data).decode()
        except (OSError, ValueError) as exc:
            entry["error"] = str(exc)[:200]
        ranks[str(rank)] = entry
    if not prefixes:
        problems.insert(0, "no rank has the flight recorder armed (TORCH_NCCL_TRACE_BUFFER_SIZE, "
                           "TORCH_NCCL_DEBUG_INFO_PIPE_FILE, TORCH_NCCL_DUMP_ON_TIMEOUT=1: the forensics flag set)")
    elif trigger and not poked:
        problems.append("no rank's dump pipe (<stem><rank>.pipe) was found to write to: " + ("; ".join(poke_errors)
                                                                                            or "none exists yet"))
    return {"ranks": ranks, "poked": poked, "problems": problems[:20], "armed": bool(prefixes),
            "triggered_at": started if trigger else None}


# ----------------------------------------------------------------------------- metrics, host facts

METRICS_MAX_BYTES = 8 << 20


def http_body(port, path, timeout=5.0, limit=METRICS_MAX_BYTES, want=None, host="127.0.0.1"):
    """An HTTP GET whose body may be large (a metrics page): bounded at `limit`; with `want`, only
    the lines of those metric names (and their # TYPE/# HELP) travel back."""
    start = time.monotonic()
    try:
        sock = socket.create_connection((host, int(port)), timeout=timeout)
    except OSError as exc:
        return {"port": port, "path": path, "status": None, "error": exc.strerror or str(exc)}
    data, truncated = b"", False
    try:
        sock.settimeout(timeout)
        sock.sendall(("GET %s HTTP/1.0\r\nHost: %s:%d\r\nUser-Agent: gpu-cockpit\r\nAccept: text/plain\r\n\r\n"
                      % (path, host, int(port))).encode())
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
            if len(data) > limit:
                data, truncated = data[:limit], True
                break
            if time.monotonic() - start > timeout:
                raise socket.timeout("timed out")
    except OSError as exc:
        return {"port": port, "path": path, "status": None, "error": str(exc) or "timeout"}
    finally:
        sock.close()
    head, _, body = data.partition(b"\r\n\r\n")
    m = re.match(rb"HTTP/\d(?:\.\d)? (\d{3})", head)
    text = body.decode("utf-8", "replace")
    if want:
        names = tuple(want)
        text = "\n".join(line for line in text.splitlines()
                         if line.startswith(names) or (line.startswith("# ") and any(n in line for n in names)))
    return {"port": port, "path": path, "status": int(m.group(1)) if m else None,
            "ms": round((time.monotonic() - start) * 1000.0, 1), "body": text, "truncated": truncated}


def _run_argv(argv, timeout):
    """(rc, stdout, stderr) of an argument list, never a shell; rc None when it could not run."""
    try:
        out = subprocess.run(argv, capture_output=True, timeout=timeout)
    except FileNotFoundError:
        return None, "", "%s: not found on the host" % argv[0]
    except subprocess.TimeoutExpired:
        return None, "", "%s: no answer in %.0f s" % (" ".join(argv), timeout)
    except OSError as exc:
        return None, "", "%s: %s" % (argv[0], exc.strerror or exc)
    return out.returncode, out.stdout.decode("utf-8", "replace")[:8 << 20], out.stderr.decode("utf-8", "replace")[:4000]


VERSION_PACKAGES = ("torch", "sglang", "vllm", "nvidia-nccl-cu12", "nvidia-nccl-cu13", "flashinfer-python", "triton",
                    "transformers", "cuda-python")
METADATA_MAX = 1 << 20


def _dist_name(name):
    """A distribution's name as its dist-info folder spells it (PEP 503 normalized, `_` for `-`)."""
    return re.sub(r"[-_.]+", "_", name).lower()


def package_versions(sites, uids):
    """The run's package versions from their metadata on disk (`NAME-VER.dist-info/METADATA`'s
    `Version:` line), read as text: nothing of the run is imported nor run, so a file planted in
    its folders never runs as the agent's user. Folders are taken as they are (no symlink
    followed), files only when regular, small and owned by one of `uids`."""
    import stat

    want = {_dist_name(n): n for n in VERSION_PACKAGES}
    out, refused = {n: None for n in VERSION_PACKAGES}, []
    for site in sites:
        try:
            entries = sorted(os.listdir(site))
        except OSError:
            continue
        for entry in entries:
            name = want.get(_dist_name(entry.split("-", 1)[0])) if entry.endswith(".dist-info") else None
            if name is None or out[name] is not None:
                continue
            folder = os.path.join(site, entry)
            try:
                if not stat.S_ISDIR(os.lstat(folder).st_mode):
                    raise OSError("not a folder")
                data, _ = _read_regular(os.path.join(folder, "METADATA"), METADATA_MAX, uids)
            except OSError as exc:
                refused.append("%s: %s" % (folder, exc.strerror or exc))
                continue
            for line in data.decode("utf-8", "replace").splitlines()[:400]:
                if not line.strip():
                    break  # the headers end at the first empty line
                if line.startswith("Version:"):
                    out[name] = line[8:].strip()[:64] or None
                    break
    return out, refused


def _site_dirs(pid):
    """The package folders a process really imports from, read from the files it has mapped:
    /proc/PID/exe names the base interpreter behind a virtualenv's symlink, whose own
    site-packages lack the run's torch."""
    found = []
    try:
        with open("/proc/%d/maps" % pid) as fh:
            for line in fh:
                path = line.rstrip("\n").split(None, 5)[-1] if line.count(" ") >= 5 else ""
                for marker in ("/site-packages/", "/dist-packages/"):
                    cut = path.find(marker)
                    if cut > 0:
                        site = path[:cut + len(marker) - 1]
                        if site not in found:
                            found.append(site)
    except OSError:
        pass
    return found[:8]


def host_facts(items, pids=(), driver=None, nvml=None):
    """What a hang report needs from the host itself: `nvidia_smi` (nvidia-smi -q), `xid` (the
    kernel log's NVRM Xid lines, from dmesg or journalctl -k), `versions` (driver and CUDA from
    NVML, the engine's packages from their metadata in the run's package folders, read as text:
    nothing is run on behalf of a host process).
    Each item is {"text": ...} or {"error": why}."""
    out = {}
    if "nvidia_smi" in items:
        rc, text, err = _run_argv(["nvidia-smi", "-q"], 60)
        out["nvidia_smi"] = {"text": text} if rc == 0 else {"error": (err or text).strip()[:300] or "exit %s" % rc}
    if "xid" in items:
        tried = []
        for argv in (["dmesg", "--ctime"], ["dmesg"], ["journalctl", "-k", "--no-pager", "-q", "-n", "50000"]):
            rc, text, err = _run_argv(argv, 30)
            if rc == 0 and text.strip():
                lines = [line for line in text.splitlines() if "NVRM: Xid" in line or "Xid (" in line]
                out["xid"] = {"text": "\n".join(lines[-2000:]), "source": " ".join(argv), "lines_read": len(text.splitlines()),
                              "count": len(lines)}
                break
            tried.append("%s: %s" % (" ".join(argv), (err or text).strip().splitlines()[0][:160] if (err or text).strip()
                                     else "exit %s" % rc))
        else:
            out["xid"] = {"error": "; ".join(tried)}
    if "versions" in items:
        v = {"driver": driver, "nvml": nvml, "agent_python": platform.python_version()}
        if nvml and nvml != "sim":
            try:
                import pynvml

                cuda = pynvml.nvmlSystemGetCudaDriverVersion_v2()
                v["cuda_driver"] = "%d.%d" % (cuda // 1000, (cuda % 1000) // 10)
            except Exception:
                pass
        exe, sites, uid = None, [], None
        for pid in pids:
            try:
                exe = os.readlink("/proc/%d/exe" % int(pid))
            except (OSError, ValueError):
                continue
            sites, uid = _site_dirs(int(pid)), _uid(int(pid))
            break
        if exe and uid is not None:
            found, refused = package_versions(sites, {uid, 0, os.geteuid()})
            py = next((m.group(1) for m in (re.search(r"/python(\d+\.\d+)/", s) for s in sites) if m), None)
            v["run"] = dict(found, python=py, interpreter=exe, read_from="package metadata")
            if refused:
                v["run_refused"] = refused[:20]
        else:
            v["run_error"] = "no live process of the run to read its packages' versions from"
        out["versions"] = {"data": v}
    return out


# ----------------------------------------------------------------------------- actions

_SIGNALS = {"TERM": 15, "KILL": 9}
SHM_DEFAULT = "/dev/shm"
# What inference runs leave in /dev/shm (docs/layouts.md names the source of each). Only entries
# with one of these prefixes are ever removed by a clean.
SHM_FAMILIES = (
    ("nccl-", "NCCL"),
    ("torch_", "PyTorch"),
    ("__KMP_REGISTERED_LIB_", "OpenMP runtime (PyTorch)"),
    ("psm_", "Python shared memory"),
    ("sem.mp-", "Python multiprocessing"),
    ("sem.loky-", "joblib/loky"),
    ("sgl_shm_", "SGLang"),
    ("multi_tokenizer_args_", "SGLang"),
    ("vllm_", "vLLM"),
    ("vader_segment.", "Open MPI"),
    ("sm_segment.", "Open MPI"),
    ("psm2_", "MPI (PSM2)"),
    ("psm3_", "MPI (PSM3)"),
    ("ucx_", "MPI (UCX)"),
)
# Names that carry their creator's pid.
SHM_CREATOR = [re.compile(r"^sgl_shm_[A-Za-z_]*?_(\d+)_"), re.compile(r"^multi_tokenizer_args_(\d+)"),
               re.compile(r"^torch_(\d+)_"), re.compile(r"^__KMP_REGISTERED_LIB_(\d+)")]


class Refused(Exception):
    """An action the agent will not carry out; the message says why and what to do."""


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


def _matches(patterns, name, text):
    for pat in patterns or ():
        if fnmatch.fnmatchcase(name, pat) or fnmatch.fnmatchcase(text, pat):
            return True
    return False


class _Table:
    """One read of the process table, for one decision: every process with its uid, its children,
    its command line read on demand. Walks are iterative (a chain 1,000 deep is fine)."""

    def __init__(self):
        self.rows = {}
        self.children = {}
        self._argv = {}
        for name in os.listdir("/proc"):
            if name.isdigit():
                row = _proc_stat(int(name))
                if row is not None:
                    row["uid"] = _uid(row["pid"])
                    self.rows[row["pid"]] = row
        for pid, row in self.rows.items():
            self.children.setdefault(row["ppid"], []).append(pid)

    def argv(self, pid):
        if pid not in self._argv:
            self._argv[pid] = _read_cmdline(pid)
        return self._argv[pid]

    def text(self, pid):
        return " ".join(self.argv(pid)) or self.rows[pid]["name"]

    def tree(self, roots, uid, protected):
        """The roots and their descendants that run as `uid` (a process of another user is not
        in the run, nor is what it started)."""
        found = set()
        stack = list(roots)
        while stack:
            pid = stack.pop()
            row = self.rows.get(pid)
            if pid in found or row is None or pid in protected or row["uid"] != uid:
                continue
            found.add(pid)
            stack.extend(self.children.get(pid, ()))
        return found

    def entry(self, pid):
        r = self.rows[pid]
        return {"pid": pid, "start": r["_start"], "started": r["started"], "uid": r["uid"], "user": _user(r["uid"]),
                "ppid": r["ppid"], "pgid": r["pgid"], "sid": r["sid"], "status": r["status"], "name": r["name"],
                "title": self.text(pid)[:300]}

    def climb(self, pid, member, protected, memo=None):
        """From a process of the run up to the highest ancestor that is of the run too (same user,
        and `member` says so): a wrapper shell and its other children are not swept in. `memo`
        (pid -> root) makes climbing from every process of a 1,000-deep chain linear."""
        memo = {} if memo is None else memo
        path = []
        seen = set()
        uid = self.rows[pid]["uid"]
        root = pid
        while root not in seen:
            if root in memo:
                root = memo[root]
                break
            seen.add(root)
            path.append(root)
            parent = self.rows.get(self.rows[root]["ppid"])
            if parent is None or parent["pid"] in protected or parent["uid"] != uid or not member(parent["pid"]):
                break
            root = parent["pid"]
        for p in path:
            memo[p] = root
        return root


def _listening_inodes(ports):
    """{port: set of socket inodes} of listening TCP sockets on these ports (IPv4 and IPv6)."""
    want = set(int(p) for p in ports)
    out = {}
    for port, inode in _proc_net_listeners():
        if port in want:
            out.setdefault(port, set()).add(inode)
    return out


def _port_owners(table, ports):
    """{pid: [ports]} of the processes holding the listening sockets of these ports."""
    inodes = {}
    for port, found in _listening_inodes(ports).items():
        for inode in found:
            inodes[inode] = port
    owners = {}
    if not inodes:
        return owners
    for pid in table.rows:
        for inode in socket_inodes(pid) & set(inodes):
            owners.setdefault(pid, set()).add(inodes[inode])
    return {pid: sorted(p) for pid, p in owners.items()}


def _port_value(argv):
    for i, a in enumerate(argv):
        value = None
        if a == "--port" and i + 1 < len(argv):
            value = argv[i + 1]
        elif a.startswith("--port="):
            value = a[7:]
        if value is not None:
            try:
                return int(value)
            except ValueError:
                return None
    return None


# Programs that run another program named in their arguments (a module, a script, a string):
# their command line's first words are the interpreter, its options and what it runs.
_INTERPRETER = re.compile(r"^(python|pypy|perl|ruby|node|bash|sh|dash|zsh|ksh)[0-9.]*(-dbg)?\Z")
_VALUE_OPTS = ("-X", "-W", "-o")  # options whose value is the next word (python -X, -W; shells' -o)
_SUBCOMMAND = re.compile(r"^[A-Za-z][A-Za-z0-9_.:-]*\Z")


def _words(argv):
    """The command line as words: one retitled string (setproctitle) is split at its spaces."""
    argv = list(argv or ())
    if len(argv) == 1 and " " in argv[0]:
        return argv[0].split()
    return argv


def _head(argv):
    """The program a process runs, as its command line's first words: the executable; for an
    interpreter (python, a shell ...), the interpreter, its options and the module (`-m X`) or
    script it runs. `bash -c '…'` and `python -c '…'` run a string: their head ends at `-c` (the
    string's words are what it starts, not what it is). `tmux new … python -m X`, `timeout 60
    python -m X`, `srun python -m X`: the head is tmux, timeout, srun."""
    argv = _words(argv)
    if not argv:
        return []
    if not _INTERPRETER.match(argv[0].rsplit("/", 1)[-1]):
        return argv[:1]
    i = 1
    while i < len(argv):
        a = argv[i]
        if a == "--":
            return argv[:i + 2]
        if a.startswith("-") and not a.startswith("--") and len(a) > 1:
            if a[:2] in ("-X", "-W") and len(a) > 2:  # -Xdev, -Werror: the value attached
                i += 1
                continue
            if a[-1] == "m":  # -m MODULE (or -um MODULE)
                return argv[:i + 2]
            if "c" in a[1:]:  # -c STRING (or bash -lc STRING)
                return argv[:i + 1]
            i += 2 if a in _VALUE_OPTS else 1
            continue
        if a.startswith("--"):
            i += 1
            continue
        return argv[:i + 1]  # the script
    return argv


def _program_text(argv):
    """The head and the subcommands after it (`vllm serve`: plain words, at most two): what a
    title pattern is matched against to say a process IS a server, not one that mentions it."""
    words = _words(argv)
    head = _head(words)
    more = []
    for w in words[len(head):len(head) + 2]:
        if not _SUBCOMMAND.match(w):
            break
        more.append(w)
    return " ".join(head + more)


def _is_titled(patterns, name, argv):
    """The process is one of the patterns' servers: its name (its title) or its program (`_head`)
    matches; a command line that only carries a server's command among other arguments (a tmux
    server, `bash -c "… & …"`) does not."""
    text = _program_text(argv)
    for pat in patterns or ():
        if fnmatch.fnmatchcase(name, pat) or (text and fnmatch.fnmatchcase(text, pat)):
            return True
    return False


def command_matches(argv, command, model=None, ports=(), default_port=None):
    """The process runs the layout's command: the command (by base name, in order, contiguous)
    starts within the process's program (`_head`: the executable, or an interpreter's module or
    script), so a process that only mentions it among its arguments (`tmux new … python -m X`,
    `timeout 60 python -m X`) is not it. Its model path is there too; and its port, `--port` or,
    without one, the engine's default (`default_port`: SGLang 30000, vLLM 8000), is one of the
    layout's `ports` when the layout names some."""
    if not command or not argv:
        return False
    words = _words(argv)
    names = [a.rsplit("/", 1)[-1] for a in words]
    want = [c.rsplit("/", 1)[-1] for c in command]
    n = len(want)
    head = len(_head(words))
    if not any(names[i:i + n] == want for i in range(min(head, len(names) - n + 1))):
        return False
    if model and model not in words and not any(a.endswith("=" + model) for a in words):
        return False
    port = _port_value(words)
    if port is None:
        port = default_port
    if ports and port is not None and int(port) not in set(int(p) for p in ports):
        return False
    return True


def _netns(pid):
    try:
        return os.stat("/proc/%d/ns/net" % pid).st_ino
    except OSError:
        return None


def _listens(pid):
    """The TCP ports this process listens on, in its own network namespace."""
    mine = socket_inodes(pid)
    if not mine:
        return set()
    return set(port for port, inode in _proc_net_listeners("/proc/%d/net" % pid) if inode in mine)


def _now_ticks():
    """Clock ticks since boot now: comparable with a process's start time."""
    try:
        with open("/proc/uptime") as fh:
            return int(float(fh.read().split()[0]) * _CLK_TCK)
    except (OSError, ValueError, IndexError):
        return None


LAUNCH_MARKER = "GPU_COCKPIT_RUN"  # set by the cockpit in the environment of every run it launches


def _has_marker(pid, run_id):
    """The process carries the launch marker of this run (GPU_COCKPIT_RUN=<run id>) in its own
    environment (setproctitle wipes a retitled rank's: then it does not)."""
    return bool(run_id) and _environ(pid).get(LAUNCH_MARKER) == str(run_id)


def _candidate(table, root, rule, protected, extra=()):
    row = table.rows[root]
    uid = row["uid"]
    members = table.tree([root] + list(extra), uid, protected)
    return {"rule": rule, "root": root, "root_start": row["_start"], "uid": uid, "user": _user(uid),
            "started": row["started"], "title": table.text(root)[:300], "sessions": [],
            "members": [table.entry(p) for p in sorted(members)]}


def _launched_run(table, rec, known, patterns, command, protected, notes, seen=None):
    """The run this cockpit launched, from its record: process group P whose leader started at S.
    The leader alive with another start time is a reused pid: not the run. The leader alive and
    the recorded one: it and the members of its group and session started since S. The leader
    gone: the pid P may have been reused (a new process given pid P can call setsid() once every
    process of the old session is gone), so the processes now in group/session P are the run only
    if one of them provably belongs to it: it started while the leader was last seen alive (the
    agent's own watch, or `seen_ticks` in the record: a process born then into session P was born
    into the run's session, and while it lives pid P cannot be reused), or it carries the run's
    launch marker (GPU_COCKPIT_RUN=<run id>). Then: the survivors of its session that carry the
    run's titles, command or marker, and its user."""
    try:
        pgid = int(rec["pgid"])
    except (KeyError, TypeError, ValueError):
        return None
    start = rec.get("start")
    if start is None and known:
        start = known.get(pgid)
    if start is None:
        notes.append("process group %d: its leader's start time was not recorded, so it is not trusted as the run" % pgid)
        return None
    boot = rec.get("boot")
    if boot is not None and abs(float(boot) - _boot_time()) > 2:
        notes.append("process group %d was recorded before the host rebooted: not the run" % pgid)
        return None
    start = int(start)
    leader = table.rows.get(pgid)
    if leader is not None and leader["_start"] != start:
        notes.append("pid %d is now another process (started %s): the run recorded as process group %d has ended"
                     % (pgid, _when(leader["started"]), pgid))
        return None
    if leader is not None:
        uid = leader["uid"]
        extra = [p for p, r in table.rows.items()
                 if (r["pgid"] == pgid or r["sid"] == pgid) and r["uid"] == uid and r["_start"] >= start]
        cand = _candidate(table, pgid, "launched by this cockpit (ledger): process group %d, leader started %s"
                          % (pgid, _when(leader["started"])), protected, extra)
        cand["sessions"] = [pgid]
        cand["leader_seen_ticks"] = _now_ticks()
        return cand
    uid = rec.get("uid")
    run_id = rec.get("run_id")
    members = [p for p, r in table.rows.items()
               if (r["pgid"] == pgid or r["sid"] == pgid) and p not in protected and r["status"] != "Z"
               and (uid is None or r["uid"] == int(uid))]
    if not members:
        return None
    marks = [int(t) for t in (rec.get("seen_ticks"), (seen or {}).get(pgid)) if t is not None]
    last_seen = max(marks) if marks else None
    proof = [p for p in members if table.rows[p]["_start"] >= start
             and ((last_seen is not None and table.rows[p]["_start"] <= last_seen) or _has_marker(p, run_id))]
    if not proof:
        notes.append("process group %d: its leader is gone and none of the %d processes now in it was started while "
                     "the run's leader was seen alive or carries the run's launch marker (%s): pid %d may have been "
                     "reused, so they are not the run (name one with --pid to act on it anyway)"
                     % (pgid, len(members), LAUNCH_MARKER, pgid))
        return None
    pats = list(DEFAULT_PATTERNS) + list(patterns or [])
    survivors = [p for p in members if table.rows[p]["_start"] >= start
                 and (p in proof or _is_titled(pats, table.rows[p]["name"], table.argv(p))
                      or command_matches(table.argv(p), command))]
    tops = [p for p in survivors if table.rows[p]["ppid"] not in survivors]
    root = min(tops)
    cand = _candidate(table, root, "launched by this cockpit (ledger): process group %d, its leader gone, %d "
                      "processes of it left" % (pgid, len(survivors)), protected, survivors)
    cand["uid"] = table.rows[root]["uid"]
    cand["sessions"] = [pgid]
    return cand


def _group(table, found, member, rule_of, protected):
    """Candidate runs from processes found by one rule: each climbs to its run's root; a root
    inside another's tree is part of that run. Distinct roots are distinct runs, never merged."""
    memo = {}
    roots = sorted(set(table.climb(p, member, protected, memo) for p in found
                       if p in table.rows and p not in protected))
    trees = {r: table.tree([r], table.rows[r]["uid"], protected) for r in roots}
    inside = set()
    for r in roots:
        inside |= trees[r] - {r}
    keep = [r for r in roots if r not in inside]
    return [_candidate(table, r, rule_of(r, trees[r]), protected) for r in keep]


def _off_port(table, cand, ports, notes):
    """Why a run found by its command is not on the layout's ports (None: nothing says so): it
    runs in another network namespace (its port N is not this host's port N), or it listens on
    TCP ports none of which is the layout's while its command line names no port."""
    root = cand["root"]
    mine = _netns(os.getpid())
    theirs = _netns(root)
    want = set(int(p) for p in ports)
    if mine is not None and theirs is not None and mine != theirs:
        return ("pid %d (%s) runs the layout's command in another network namespace: its port is not this "
                "host's port %s" % (root, cand["user"], ", ".join(map(str, sorted(want)))))
    if _port_value(_words(table.argv(root))) is None:
        held = set()
        for e in cand["members"]:
            held |= _listens(e["pid"])
        if held and not held & want:
            return ("pid %d (%s) runs the layout's command but listens on port %s, not on %s"
                    % (root, cand["user"], ", ".join(map(str, sorted(held))), ", ".join(map(str, sorted(want)))))
    return None


def find_runs(launched=(), ports=(), command=(), model=None, patterns=None, known=None, table=None,
              default_port=None, seen=None):
    """The run, in this order: the one this cockpit launched (process group and its leader's start
    time, both checked; its leader gone, a survivor proven to be of it); else the tree of the
    process that owns the layout's ports; else of the processes whose program is the layout's
    command, with its model, on its port (`--port`, else the engine's `default_port`), in this
    host's network namespace. Without any hint (no launched run, no ports, no command: no layout):
    processes whose title or program matches the patterns. Title patterns never find a run
    host-wide when a layout says what the run is. A run's root is climbed to only through parents
    that are themselves the server (never a shell, a multiplexer or a wrapper that mentions it).
    Processes of another user than the agent's are never a run: they are listed under `foreign`.
    More than one run found: all are returned, never merged."""
    table = table or _Table()
    protected = _protected()
    me = os.geteuid()
    notes, foreign = [], []
    ports = [int(p) for p in ports or ()]
    command = list(command or ())
    pats = list(DEFAULT_PATTERNS if patterns is None else patterns)

    def finish(runs, how):
        mine = []
        for c in runs:
            if c["uid"] != me:
                foreign.append({"root": c["root"], "uid": c["uid"], "user": c["user"], "title": c["title"],
                                "rule": c["rule"], "why": "runs as %s, not as %s: another user's processes are "
                                "never in a run (name it with --pid to act on it anyway)" % (c["user"], _user(me))})
            else:
                mine.append(c)
        return {"runs": mine, "rule": how, "notes": notes, "foreign": foreign}

    runs = [c for c in (_launched_run(table, rec, known, pats, command, protected, notes, seen)
                        for rec in launched or ()) if c is not None]
    if runs:
        return finish(runs, "ledger")

    def serves(pid):
        return command_matches(table.argv(pid), command, model, ports, default_port)

    if ports:
        owners = _port_owners(table, ports)
        if owners:
            def member(pid):
                return pid in owners or serves(pid)

            def rule(root, tree):
                held = sorted(set(p for pid in tree if pid in owners for p in owners[pid]))
                return "owns port %s" % ", ".join(map(str, held))
            return finish(_group(table, list(owners), member, rule, protected), "ports")
        notes.append("no process listens on port %s" % ", ".join(map(str, ports)))
    if command:
        found = [p for p in table.rows if p not in protected and serves(p)]
        if found:
            what = " ".join(command) + (" with " + model if model else "")
            runs = _group(table, found, serves, lambda r, t: "command matches: " + what, protected)
            if ports:
                kept = []
                for c in runs:
                    why = _off_port(table, c, ports, notes)
                    if why is None:
                        kept.append(c)
                    else:
                        notes.append(why + ": not the run")
                runs = kept
            if runs or not ports:
                return finish(runs, "command")
        else:
            notes.append("no process runs %s%s" % (" ".join(command), " on port %s" % ", ".join(map(str, ports))
                                                   if ports else ""))
    if launched or ports or command:
        return finish([], "none")  # told what the run is: titles never find one host-wide
    found = [p for p, r in table.rows.items() if p not in protected and _is_titled(pats, r["name"], table.argv(p))]

    def member(pid):
        return _is_titled(pats, table.rows[pid]["name"], table.argv(pid))

    def rule(root, tree):
        r = table.rows[root]
        text = _program_text(table.argv(root))
        pat = next((p for p in pats if fnmatch.fnmatchcase(r["name"], p) or fnmatch.fnmatchcase(text, p)), "?")
        return "title matches %s (no layout: name one with --layout to find the run by its ports and command)" % pat
    return finish(_group(table, found, member, rule, protected), "titles")


def _summary(c):
    out = {k: c[k] for k in ("rule", "root", "root_start", "uid", "user", "started", "title")}
    out["processes"] = len(c["members"])
    return out


def run_plan(pids=(), launched=(), ports=(), command=(), model=None, patterns=None, known=None,
             default_port=None, seen=None):
    """What a kill will signal, for the operator to confirm: every pid with its start time, user
    and command, and the rule that found the run. Two runs found: no plan, both listed.
    `planned_at` (clock ticks since boot, read before the process table): a process of the run
    started since then was not in the plan, and the kill says so."""
    planned_at = _now_ticks()
    table = _Table()
    if pids:
        protected = _protected()
        entries, rules = [], []
        for pid in pids:
            pid = int(pid)
            if pid in protected:
                rules.append("pid %d is the agent, one of its ancestors or init: never signalled" % pid)
                continue
            row = table.rows.get(pid)
            if row is None:
                continue
            for p in sorted(table.tree([pid], row["uid"], protected)):
                if all(e["pid"] != p for e in entries):
                    entries.append(table.entry(p))
            rules.append("pid %d (%s) and what it started" % (pid, _user(row["uid"])))
        return {"plan": entries, "rule": "; ".join(rules) or "no such process", "candidates": [], "notes": [],
                "foreign": [], "sessions": [], "root": int(pids[0]) if len(pids) == 1 else None,
                "planned_at": planned_at}
    found = find_runs(launched, ports, command, model, patterns, known, table, default_port, seen)
    runs = found["runs"]
    out = {"plan": [], "rule": None, "candidates": [_summary(c) for c in runs], "notes": found["notes"],
           "foreign": found["foreign"], "sessions": [], "root": None, "planned_at": planned_at}
    if len(runs) == 1:
        run = runs[0]
        out.update(plan=run["members"], rule=run["rule"], sessions=run["sessions"], root=run["root"],
                   uid=run["uid"], user=run["user"])
    return out


def kill_plan(pgids=(), sids=(), pids=()):
    """The plan for processes named by pid (and what they started), as a list. Process groups
    alone are not trusted (a pid may have been reused): see run_plan's `launched`."""
    return run_plan(pids=list(pids))["plan"] if pids else []


def run_members(pgids=(), sids=(), pids=()):
    """Kept for callers of old: the rows of kill_plan."""
    return kill_plan(pgids, sids, pids)


def _pidfd(pid):
    fn = getattr(os, "pidfd_open", None)
    if fn is None:
        return None
    try:
        return fn(pid)
    except OSError:
        return None


def _still(entry, protected):
    """None while the pid is still the planned process (same start time, same user, not exited),
    else why not: 'gone', 'exited', or a reason to skip it."""
    pid = entry["pid"]
    if pid in protected or pid <= 1:
        return "the agent, one of its ancestors or init: never signalled"
    row = _proc_stat(pid)
    if row is None:
        return "gone"
    if row["_start"] != entry["start"]:
        return ("pid reused: now a process started %s, not the planned one (started %s): not signalled"
                % (_when(row["started"]), _when(entry.get("started"))))
    if entry.get("uid") is not None:
        uid = _uid(pid)
        if uid is not None and uid != entry["uid"]:
            return "now runs as %s, not %s as planned: not signalled" % (_user(uid), _user(entry["uid"]))
    if row["status"] == "Z":
        return "exited"
    return None


def _os_send(fd, pid, sig):
    if fd is not None and hasattr(signal, "pidfd_send_signal"):
        signal.pidfd_send_signal(fd, sig)
    else:
        os.kill(pid, sig)


def _signal_all(entries, sig, protected):
    """Signals each planned process only if it is still that process when the signal goes: a
    pidfd is opened on the pid first, then its start time and user are checked, then the signal
    goes through that pidfd, so a pid that dies and is reused in between gets nothing. All are
    checked first and signalled in one quick pass (a launcher that ends its own workers on
    SIGTERM does not race the rest of the pass). Returns (signalled pids, [(entry, why not)])."""
    sent, missed, ready = [], [], []
    for entry in entries:
        fd = _pidfd(entry["pid"])
        why = _still(entry, protected)
        if why is not None:
            if fd is not None:
                os.close(fd)
            missed.append((entry, why))
        elif fd is None:  # no pidfd here (Python < 3.9, Linux < 5.3): checked, then signalled at once
            try:
                os.kill(entry["pid"], sig)
                sent.append(entry["pid"])
            except ProcessLookupError:
                missed.append((entry, "gone"))
            except OSError as exc:
                missed.append((entry, exc.strerror or str(exc)))
        else:
            ready.append((entry, fd))
    for entry, fd in ready:
        try:
            _os_send(fd, entry["pid"], sig)
            sent.append(entry["pid"])
        except ProcessLookupError:
            missed.append((entry, "gone"))
        except OSError as exc:
            missed.append((entry, exc.strerror or str(exc)))
        finally:
            os.close(fd)
    return sent, missed


def _children(pid):
    """The pids of a process's children now (empty where the kernel does not say)."""
    out = []
    try:
        for tid in os.listdir("/proc/%d/task" % pid):
            data = _read_proc("/proc/%d/task/%s/children" % (pid, tid))
            out += [int(x) for x in (data or b"").split()]
    except (OSError, ValueError):
        pass
    return out


def _led_groups(plan):
    """(process groups, sessions) led by a planned process: a process born into one of them since
    the plan was started by the run (the pid of a group's or a session's leader is not reused while
    any process is still in it)."""
    pgids, sids = set(), set()
    for e in plan:
        pgid, sid = e.get("pgid"), e.get("sid")
        if pgid is None or sid is None:
            row = _proc_stat(e["pid"])
            if row is not None and row["_start"] == e["start"]:
                pgid, sid = row["pgid"], row["sid"]
        if pgid == e["pid"]:
            pgids.add(pgid)
        if sid == e["pid"]:
            sids.add(sid)
    return pgids, sids


def _newcomers(plan, sessions, protected, since=None, groups=((), ()), seen_children=()):
    """Processes of the run that the plan does not name: children of planned processes (still the
    planned ones, or seen as their children during the kill), and processes started since the plan
    (`since`, clock ticks) in the launched run's session or in a process group or session that a
    planned process leads: a child a planned process spawned while it was being killed (its SIGTERM
    handler) and that was reparented when its parent exited is still found."""
    planned = {e["pid"]: e for e in plan}
    table = _Table()
    live = set(p for p, e in planned.items() if p in table.rows and table.rows[p]["_start"] == e["start"])
    uids = set(e.get("uid") for e in plan)
    out = {}
    stack = [k for p in live for k in table.children.get(p, ())]
    stack += [pid for pid, start in seen_children if pid in table.rows and table.rows[pid]["_start"] == start]
    seen = set()
    while stack:
        pid = stack.pop()
        if pid in seen or pid in protected:
            continue
        seen.add(pid)
        row = table.rows.get(pid)
        if row is None:
            continue
        if pid not in planned and row["uid"] in uids and row["status"] != "Z":
            out[pid] = table.entry(pid)
        stack.extend(table.children.get(pid, ()))
    pgids, sids = groups
    for pid, row in table.rows.items():
        if pid in planned or pid in protected or row["uid"] not in uids or row["status"] == "Z":
            continue
        if row["sid"] in sessions or (since is not None and row["_start"] >= since
                                      and (row["pgid"] in pgids or row["sid"] in sids)):
            out[pid] = table.entry(pid)
            for kid in table.tree([pid], row["uid"], protected):
                if kid not in planned and table.rows[kid]["status"] != "Z":
                    out[kid] = table.entry(kid)
    return out


def kill_run(plan, wait_s=10.0, sessions=(), since=None, **_old):
    """Carries out exactly the plan: SIGTERM to each planned process that is still the planned one
    (its start time and user checked before the signal), a wait, then SIGKILL to those still there,
    checked again. A pid that no longer matches is skipped and reported. Processes that appeared
    since the plan (`since`: the plan's `planned_at`; else this call's start) are reported, not
    signalled (they were not confirmed), and count as remaining: children of planned processes,
    members of the launched run's session, and processes born into a group or session a planned
    process leads (a child spawned by a SIGTERM handler, reparented when its parent exits). Never
    signals the agent, its ancestors or init."""
    protected = _protected()
    sessions = set(int(s) for s in sessions or ())
    if since is None:
        since = _now_ticks()
    groups = _led_groups(plan)
    term, killed, vanished, skipped = [], [], [], []
    newcomers = _newcomers(plan, sessions, protected, since, groups)
    kids = {}  # (pid, start) of children of planned processes seen during the kill

    def watch_children(entries):
        planned = set(e["pid"] for e in plan)
        for e in entries:
            for kid in _children(e["pid"]):
                if kid not in planned and kid not in kids:
                    start = _start_ticks(kid)
                    if start is not None:
                        kids[kid] = start

    def note(missed, gone_list):
        for entry, why in missed:
            if why in ("gone", "exited"):
                if gone_list is not None:
                    gone_list.append(entry["pid"])
            elif all(s["pid"] != entry["pid"] for s in skipped):
                skipped.append({"pid": entry["pid"], "why": why, "title": entry.get("title", "")})

    term, missed = _signal_all(plan, _SIGNALS["TERM"], protected)
    note(missed, vanished)
    deadline = time.monotonic() + max(0.0, float(wait_s))
    pending = [e for e in plan if e["pid"] in term]
    while time.monotonic() < deadline:
        watch_children(pending)
        still = []
        for e in pending:
            why = _still(e, protected)
            if why is None:
                still.append(e)
            else:
                note([(e, why)], None)
        pending = still
        if not pending:
            break
        time.sleep(0.1)
    watch_children(pending)
    killed, missed = _signal_all(pending, _SIGNALS["KILL"], protected)
    note(missed, None)
    time.sleep(0.3)
    newcomers.update(_newcomers(plan, sessions, protected, since, groups, sorted(kids.items())))
    remaining = [e["pid"] for e in plan if _still(e, protected) is None]
    late = []
    for pid, e in sorted(newcomers.items()):
        if _still(e, protected) is None:
            late.append({"pid": pid, "title": e["title"], "user": e["user"], "started": e["started"],
                         "why": "appeared after the plan: not signalled"})
            remaining.append(pid)
    return {"term": term, "killed": killed, "vanished": vanished, "skipped": skipped, "newcomers": late,
            "remaining": remaining}


def _maps_ids(pid, dev):
    """(dev, inode) of every file a process maps that lives on `dev`, read from /proc/PID/maps's
    device (major:minor, hex) and inode columns: what the kernel mapped, whatever the path it
    prints (another mount namespace, a bind mount, a name with a newline or ending in
    " (deleted)")."""
    out = set()
    try:
        with open("/proc/%d/maps" % pid, "rb") as fh:
            for line in fh:
                parts = line.split(None, 5)
                if len(parts) < 5 or parts[4] == b"0":
                    continue
                major, _, minor = parts[3].partition(b":")
                try:
                    key = (os.makedev(int(major, 16), int(minor, 16)), int(parts[4]))
                except ValueError:
                    continue
                if dev is None or key[0] == dev:
                    out.add(key)
    except PermissionError:
        return None  # not ours to read (no ptrace rights): what it maps is unknown
    except OSError:
        pass
    return out


def _fd_ids(pid, dev):
    """(dev, inode) of every file a process holds open on `dev`: each /proc/PID/fd/N stat()ed,
    which reaches the open file itself (any mount namespace, renamed or unlinked)."""
    out = set()
    fd_dir = "/proc/%d/fd" % pid
    try:
        fds = os.listdir(fd_dir)
    except PermissionError:
        return None  # what it holds open is unknown
    except OSError:
        return out
    for fd in fds:
        try:
            if not os.readlink(fd_dir + "/" + fd).startswith("/"):
                continue  # socket:[…], pipe:[…], anon_inode:…: not a file of a folder
            st = os.stat(fd_dir + "/" + fd)
        except PermissionError:
            return None
        except OSError:
            continue
        if dev is None or st.st_dev == dev:
            out.add((st.st_dev, st.st_ino))
    return out


def _holders(folder):
    """{(dev, inode): [pids]} of the files on the shm folder's file system that a live process
    maps or holds open. Compared with os.lstat of each entry, never by path: a path in
    /proc/PID/maps is the one the process's own mount namespace sees, escapes a newline as
    `\\012` and may carry " (deleted)". Also the pids whose holdings cannot be read."""
    dev = os.stat(folder).st_dev
    held, blind = {}, []
    own = _protected()  # the agent and the login chain that started it (init, sshd) are no run
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        maps, fds = _maps_ids(pid, dev), _fd_ids(pid, dev)
        if (maps is None or fds is None) and pid not in own and not _kernel_thread(pid):
            blind.append(pid)  # its holdings cannot be read: it may hold any file here
        for key in (maps or set()) | (fds or set()):
            held.setdefault(key, set()).add(pid)
    return {k: sorted(v) for k, v in held.items()}, blind


def _kernel_thread(pid):
    """A kernel thread (PF_KTHREAD in /proc/PID/stat's flags): it maps no file of a folder."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            fields = fh.read().rpartition(b")")[2].split()
        return bool(int(fields[6]) & 0x00200000)
    except (OSError, ValueError, IndexError):
        return False


_LIBC = None


def _born(path, st, dir_fd=None):
    """When the file was created: its birth time (statx, where the file system keeps one: tmpfs
    does), else its status-change time, which is never earlier. (nanoseconds since the epoch,
    "birth" | "ctime"). With the inode it tells one file from another that got its inode number
    after it was removed (tmpfs and ext4 hand a freed number out again at once)."""
    global _LIBC
    try:
        import ctypes

        if _LIBC is None:
            _LIBC = ctypes.CDLL(None, use_errno=True)
        buf = ctypes.create_string_buffer(256)
        fn = getattr(_LIBC, "statx")
        fd = -100 if dir_fd is None else dir_fd  # AT_FDCWD
        if fn(fd, os.fsencode(path), 0x100 | 0x800, 0x800, buf) == 0:  # AT_SYMLINK_NOFOLLOW, STATX_BTIME
            mask = int.from_bytes(buf.raw[0:4], "little")
            ino = int.from_bytes(buf.raw[32:40], "little")
            if mask & 0x800 and ino == st.st_ino:
                sec = int.from_bytes(buf.raw[80:88], "little", signed=True)
                nsec = int.from_bytes(buf.raw[88:92], "little")
                return sec * 1000000000 + nsec, "birth"
    except (OSError, AttributeError, ValueError):
        pass
    return st.st_ctime_ns, "ctime"


def shm_family(name):
    for prefix, family in SHM_FAMILIES:
        if name.startswith(prefix):
            return family
    return None


def _shm_folder(folder):
    """The folder as the kernel resolves it (`/dev//shm`, `/dev/shm/.`, `/dev/../dev/shm` are
    /dev/shm) and whether it is the host's /dev/shm."""
    real = os.path.realpath(folder)
    return real, real == os.path.realpath(SHM_DEFAULT)


def _shm_folder_ok(folder, other_dir):
    real, default = _shm_folder(folder)
    if not default and not other_dir:
        raise Refused("%s is not /dev/shm: a clean touches another folder only when the operator names it and "
                      "confirms (cockpit shm --dir %s --clean --yes-other-dir)" % (folder, folder))
    return real


def _kind(mode):
    import stat as st_mod

    return ("symlink" if st_mod.S_ISLNK(mode) else "dir" if st_mod.S_ISDIR(mode)
            else "file" if st_mod.S_ISREG(mode) else "special file")


def shm_audit(folder=SHM_DEFAULT, uid=None):
    """Every entry of the folder, each with whether `cockpit shm --clean` may remove it and, if
    not, why: only a regular file with an inference run's name, owned by the run's user, mapped
    or held open by no live process (compared by device and inode), whose creator (when its name
    carries one) is dead. Where some process's maps or descriptors cannot be read (no ptrace
    rights: a non-root agent beside other users), nobody can say the file is unheld: kept. Each entry carries its device, inode and birth time, so that a clean
    removes exactly the file listed, and a clean after a kill only files tied to the run."""
    asked = folder
    folder, default = _shm_folder(folder)
    run_uid = os.geteuid() if uid is None else int(uid)
    now = time.time()
    holders, blind = _holders(folder)
    entries = []
    dfd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        for name in sorted(os.listdir(dfd)):
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except OSError:
                continue
            kind = _kind(st.st_mode)
            family = shm_family(name)
            creator = None
            for rx in SHM_CREATOR:
                m = rx.match(name)
                if m:
                    creator = int(m.group(1))
            born_ns, born_how = _born(name, st, dfd)
            born = born_ns / 1e9
            alive, creator_started = None, None
            if creator is not None:
                row = _proc_stat(creator)
                creator_started = row["started"] if row is not None else None
                # a creator pid alive but started after the file was made is a reused pid
                alive = row is not None and row["status"] != "Z" and row["started"] <= born + 2
            held = holders.get((st.st_dev, st.st_ino), [])
            if kind != "file":
                why = "a %s, not a file" % kind
            elif family is None:
                why = "not an inference run's name (%s…)" % ", ".join(p for p, _ in SHM_FAMILIES[:8])
            elif st.st_uid != run_uid:
                why = "owned by %s (uid %d), not the run's user (%s)" % (_user(st.st_uid), st.st_uid, _user(run_uid))
            elif held:
                why = "held by pid " + ",".join(map(str, held))
            elif blind:
                why = ("cannot tell who holds it: what %d processes map or hold open cannot be read here (pid %s%s, "
                       "not %s's; run as root to see them)"
                       % (len(blind), ",".join(map(str, blind[:5])), "…" if len(blind) > 5 else "", _user(os.geteuid())))
            elif alive:
                why = "its creator pid %d is alive" % creator
            else:
                why = None
            entries.append({
                "name": name, "kind": kind, "family": family, "bytes": st.st_blocks * 512 if kind == "file" else 0,
                "size": st.st_size, "age_s": round(now - st.st_mtime, 1), "owner": _user(st.st_uid), "uid": st.st_uid,
                "dev": st.st_dev, "ino": st.st_ino, "born": born, "born_ns": born_ns, "born_how": born_how, "held_by": held,
                "creator": creator, "creator_alive": alive, "creator_started": creator_started,
                "removable": why is None, "why": why,
            })
    finally:
        os.close(dfd)
    vfs = os.statvfs(folder)
    return {"folder": folder, "asked": asked, "default": default, "entries": entries,
            "free_bytes": vfs.f_bavail * vfs.f_frsize, "total_bytes": vfs.f_blocks * vfs.f_frsize, "uid": run_uid,
            "user": _user(run_uid), "prefixes": [p for p, _ in SHM_FAMILIES], "checked_at": now,
            "unreadable_pids": blind[:50], "unreadable": len(blind)}


def shm_clean(folder, names, uid=None, other_dir=False):
    """Removes only the named entries that the audit, taken again now, finds removable. Each name
    may carry the file it was when it was listed ({"name", "dev", "ino", "born_ns"}): another
    file under that name since is kept. Just before each unlink (relative to the folder's
    descriptor: no path followed, no symlink, nothing outside the folder) the entry is lstat()ed
    once more and must still be that regular file of that owner. Only /dev/shm (after resolving
    the path) unless `other_dir` says the operator confirmed another folder."""
    import stat as st_mod

    folder = _shm_folder_ok(folder, other_dir)
    audit = {e["name"]: e for e in shm_audit(folder, uid)["entries"]}
    removed, skipped, freed = [], [], 0
    dfd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0))
    try:
        for item in names:
            want = None
            if isinstance(item, dict):
                name = str(item.get("name"))
                if item.get("ino") is not None:
                    want = tuple(None if item.get(k) is None else int(item[k]) for k in ("dev", "ino", "born_ns"))
            else:
                name = item
            entry = audit.get(name)
            if "/" in name or name in (".", ".."):
                skipped.append({"name": name, "why": "not an entry of " + folder})
            elif entry is None:
                skipped.append({"name": name, "why": "gone since it was listed"})
            elif not entry["removable"]:
                skipped.append({"name": name, "why": entry["why"]})
            elif want is not None and (want[1] != entry["ino"] or want[0] not in (None, entry["dev"])
                                       or want[2] not in (None, entry["born_ns"])):
                skipped.append({"name": name, "why": "another file than the one listed (inode %d, made %s; now "
                                                     "inode %d, made %s): replaced since"
                                                     % (want[1], _when((want[2] or 0) / 1e9), entry["ino"],
                                                        _when(entry["born"]))})
            else:
                try:
                    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                    if (not st_mod.S_ISREG(st.st_mode) or st.st_ino != entry["ino"] or st.st_dev != entry["dev"]
                            or st.st_uid != entry["uid"] or _born(name, st, dfd)[0] != entry["born_ns"]):
                        skipped.append({"name": name, "why": "changed since it was checked (now a %s, inode %d)"
                                                             % (_kind(st.st_mode), st.st_ino)})
                        continue
                    os.unlink(name, dir_fd=dfd)
                    removed.append(name)
                    freed += entry["bytes"]
                except OSError as exc:
                    skipped.append({"name": name, "why": exc.strerror or str(exc)})
    finally:
        os.close(dfd)
    return {"removed": removed, "skipped": skipped, "freed_bytes": freed}


def open_log(path):
    """The run's log for appending: created 0600, never through a symlink (O_NOFOLLOW: one planted
    in a shared log folder is refused), never another user's file, never a hard link."""
    import errno
    import stat as st_mod

    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, mode=0o700, exist_ok=True)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Refused("the log %s is a symbolic link: refused (one may have been planted there); remove it or "
                          "set another log_dir in the layout" % path) from None
        raise Refused("cannot open the log %s: %s" % (path, exc.strerror or exc)) from None
    st = os.fstat(fd)
    problem = None
    if not st_mod.S_ISREG(st.st_mode):
        problem = "is not a regular file"
    elif st.st_uid != os.geteuid():
        problem = "belongs to %s, not to %s" % (_user(st.st_uid), _user(os.geteuid()))
    elif st.st_nlink > 1:
        problem = "has other hard links"
    if problem:
        os.close(fd)
        raise Refused("the log %s %s: refused; remove it or set another log_dir in the layout" % (path, problem))
    if st_mod.S_IMODE(st.st_mode) & 0o077:
        os.fchmod(fd, 0o600)
    return fd


def pyspy_check(pyspy=None):
    """What a stack dump needs, said before it is needed: py-spy (which one, which version), and
    ptrace rights."""
    import shutil

    path = pyspy if pyspy and os.access(pyspy, os.X_OK) else shutil.which("py-spy")
    version = None
    if path:
        try:
            out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10)
            version = out.stdout.strip().rsplit(" ", 1)[-1] or None
        except (OSError, subprocess.SubprocessError):
            version = None
    cap = False
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("CapEff:"):
                    cap = bool(int(line.split()[1], 16) & (1 << 19))  # CAP_SYS_PTRACE
    except OSError:
        pass
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as fh:
            scope = int(fh.read().strip())
    except (OSError, ValueError):
        scope = None
    root = os.geteuid() == 0
    problems = []
    if not path:
        problems.append("py-spy is not installed on the host")
    if root and not cap:
        problems.append("root without CAP_SYS_PTRACE (in a container: run it with --cap-add SYS_PTRACE)")
    elif not root and scope:
        problems.append("kernel.yama.ptrace_scope=%d: only root may attach (sysctl kernel.yama.ptrace_scope=0)" % scope)
    return {"pyspy": path, "version": version, "root": root, "cap_sys_ptrace": cap, "ptrace_scope": scope,
            "arch": platform.machine(), "problems": problems}


def pyspy_target(pid):
    """Whether py-spy can be pointed at this pid at all: {"status": "gone"} when no process has it,
    {"status": "Z", "exit_code": ...} for a zombie (it has exited, its parent has not reaped it:
    py-spy fails on one with an unhelpful error), None for a process that runs (or no /proc).
    The exit code is a zombie's wait status read as Python does: -N for a signal, else the code."""
    if not _HAVE_PROC:
        return None
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            data = fh.read()
    except OSError:
        return {"status": "gone", "exit_code": None}
    f = data[data.rfind(b")") + 2:].split()
    state = f[0].decode() if f else "?"
    if state not in ("Z", "X", "x"):
        return None
    code = None
    if len(f) > 49 and state == "Z":
        try:
            status = int(f[49])  # field 52, exit_code: the wait status (Linux 3.5+, readable with ptrace rights)
        except ValueError:
            status = None
        if status is not None:
            code = -(status & 0x7F) if status & 0x7F else (status >> 8) & 0xFF
    return {"status": "Z" if state == "Z" else "gone", "exit_code": code}


def pyspy_dump(pids, pyspy=None, deadline_s=20.0, native=True):
    """py-spy dumps of every pid at once: --native first, then a plain dump when native
    unwinding fails or runs past the deadline (py-spy 336, 398). A pid that is gone or a zombie
    is answered as dead (with its exit code where the kernel still has it), before py-spy runs on
    it and again when py-spy fails because it died meanwhile."""
    check = pyspy_check(pyspy)
    exe = check["pyspy"]
    results = {}

    def dead(pid, found, errors):
        results[pid] = {"ok": False, "dead": True, "status": found["status"], "exit_code": found["exit_code"],
                        "native": False, "text": "", "errors": errors}

    def one(pid):
        found = pyspy_target(pid)
        if found:
            dead(pid, found, [])
            return
        if not exe:
            results[pid] = {"ok": False, "dead": False, "native": False, "text": "",
                            "errors": ["py-spy is not installed on the host"]}
            return
        tries = [[exe, "dump", "--pid", str(pid), "--native"], [exe, "dump", "--pid", str(pid)]]
        if not native:
            tries = tries[1:]
        errors = []
        for argv in tries:
            try:
                out = subprocess.run(argv, capture_output=True, text=True, timeout=deadline_s / len(tries))
            except subprocess.TimeoutExpired:
                errors.append("%s timed out" % " ".join(argv[1:]))
                continue
            if out.returncode == 0 and out.stdout.strip():
                results[pid] = {"ok": True, "dead": False, "native": "--native" in argv, "text": out.stdout,
                                "errors": errors}
                return
            said = (out.stderr or out.stdout).strip()
            errors.append(said.splitlines()[0] if said else "exit %d" % out.returncode)
            found = pyspy_target(pid)
            if found:
                dead(pid, found, errors)  # it died while py-spy read it
                return
        results[pid] = {"ok": False, "dead": False, "native": False, "text": "", "errors": errors}

    threads = [threading.Thread(target=one, args=(int(p),), daemon=True) for p in pids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(deadline_s + 5)
    return {"dumps": {str(k): v for k, v in results.items()}, "check": check}


class Agent:
    THREADED = ("kill", "kill_plan", "find_runs", "dump", "dump_check", "shm_audit", "shm_clean", "http",
                "ras", "metrics", "fr_dump", "host_facts")  # may be slow: answered from a thread, so samples keep flowing

    def __init__(self, interval):
        self.interval = interval
        self.warnings = []
        self.gpus = open_gpus(interval, self.warnings)
        self.procs = None
        self.ports = Ports()
        self.logs = {}
        self.seq = 0
        self.force_scan = False
        self.last_slow = 0.0
        self.sent_gpus, self.sent_procs, self.sent_ports = {}, {}, None
        self.launched = {}  # pid -> Popen of runs this agent started: their exit codes are known
        self.launched_runs = {}  # pgid -> its leader's start time (clock ticks), for runs started here
        self.leader_seen = {}  # pgid -> clock ticks when its leader was last seen alive (each tick)
        self.ras = RasPoller()
        self.log_owners = {}  # path -> {uid}: the user of the process stdout_of found writing it

    def hello(self, psutil):
        return {
            "t": HELLO,
            "agent": AGENT_VERSION,
            "python": platform.python_version(),
            "executable": sys.executable,
            "hostname": socket.gethostname(),
            "home": os.path.expanduser("~"),
            "platform": platform.platform(),
            "arch": platform.machine(),
            "pid": os.getpid(),
            "time": time.time(),
            "utc_offset": time.localtime().tm_gmtoff,  # the host's: log lines carry local time without a zone
            "nvml": self.gpus.source,
            "driver": self.gpus.driver,
            "gpus": self.gpus.static(),
            "psutil": getattr(psutil, "__version__", None),
            "interval": self.interval,
            "caps": ["gpus", "procs", "ports", "logs", "http", "launch", "kill", "shm", "dump", "ras", "metrics", "fr_dump", "host_facts"],
            "warnings": self.warnings,
        }

    def tick(self):
        now = time.monotonic()
        slow = now - self.last_slow >= SLOW_EVERY_S
        if slow:
            self.last_slow = now
        gpus = self.gpus.sample(slow)
        procs = self.procs.sample(now, self.force_scan)
        self.force_scan = False
        ports = self.ports.sample([p["pid"] for p in procs])
        exits = []
        for pid, popen in list(self.launched.items()):
            ticks = _now_ticks()  # read before the check: the leader was alive at this time
            code = popen.poll()
            if code is None and ticks is not None:
                self.leader_seen[pid] = ticks
            if code is not None:
                exits.append([pid, code])
                del self.launched[pid]
        for path, tail in self.logs.items():  # logs first: the sample ends the tick, so it is judged whole
            try:
                event, lines = tail.poll()
            except OSError as exc:
                event, lines = "error: " + str(exc), []
            if event or lines:
                frame = {"t": LOG, "path": path, "lines": lines, "mtime": tail.mtime}
                if event:
                    frame["event"] = event
                emit(frame)
        self.seq += 1
        frame = {"t": SAMPLE, "seq": self.seq, "ts": round(time.time(), 3),
                 "gpus": self._delta(self.sent_gpus, gpus, "index"),
                 "procs": self._delta(self.sent_procs, procs, "pid")}
        if ports != self.sent_ports:
            frame["ports"] = self.sent_ports = ports
        if exits:
            frame["exits"] = exits
        ras = self.ras.poll(ports, procs)
        if ras is not None:
            frame["ras"] = ras
        emit(frame)

    @staticmethod
    def _delta(sent, rows, key):
        """Rows with only the fields that changed since they were last sent (the key always):
        the stream is ordered and a new connection starts a new agent, so the other end holds
        the rest. A row missing from `rows` is a process that is gone."""
        out = []
        live = set()
        for row in rows:
            k = row[key]
            live.add(k)
            last = sent.get(k)
            if last is None:
                out.append(row)
            elif last is row:  # the sampler reused the row: nothing changed
                out.append({key: k})
            else:
                out.append({f: v for f, v in row.items() if f == key or last.get(f) != v})
            sent[k] = row
        for k in list(sent):
            if k not in live:
                del sent[k]
        return out

    def handle(self, line):
        try:
            cmd = json.loads(line)
            cid = cmd["id"]
            name = cmd["cmd"]
            args = cmd.get("args") or {}
        except (ValueError, KeyError, TypeError):
            emit({"t": ERROR, "msg": "malformed command: " + line[:200]})
            return
        fn = getattr(self, "cmd_" + str(name), None)
        if fn is None:
            emit({"t": RESULT, "id": cid, "ok": False, "error": "unknown command " + repr(name)})
            return
        if name in self.THREADED:
            threading.Thread(target=self._answer, args=(cid, fn, args), daemon=True).start()
        else:
            self._answer(cid, fn, args)

    def _answer(self, cid, fn, args):
        try:
            data = fn(**args)
        except Exception as exc:  # every command is answered, whatever happens
            emit({"t": RESULT, "id": cid, "ok": False, "error": "%s: %s" % (type(exc).__name__, exc)})
            return
        emit({"t": RESULT, "id": cid, "ok": True, "data": data})

    # Each cmd_* answers one command; their keyword arguments are the command's args.

    def cmd_ping(self):
        return {"time": time.time()}

    def cmd_config(self, patterns=None, pgids=None, pids=None, logs=None, ports=None, interval=None):
        self.procs.configure(patterns, pgids, pids)
        if logs is not None:
            for path in list(self.logs):
                if path not in logs:
                    del self.logs[path]
            for path in logs:
                if path not in self.logs:
                    self.logs[path] = LogTail(path, self.log_owners.get(path))
        if ports is not None:
            self.ports.configured = [int(p) for p in ports]
        if interval is not None:
            self.interval = max(0.1, float(interval))
        self.procs.resend_cmdlines()
        self.sent_gpus, self.sent_procs, self.sent_ports = {}, {}, None  # next sample in full
        self.force_scan = True
        return {"patterns": self.procs.patterns, "logs": list(self.logs), "interval": self.interval}

    def cmd_launch(self, argv, env=None, cwd=None, log=None):
        """Start a run detached in its own session (it outlives the agent and the link), its
        output appended to `log` (created 0600, never through a symlink); the run's process group
        is watched from now on. The answer carries the leader's start time, so the run can be
        told from a later process that reuses its pid."""
        if not argv or not all(isinstance(a, str) for a in argv):
            raise ValueError("argv must be a non-empty list of strings")
        log = log or "~/.cache/gpu-cockpit/runs/run.log"
        cache = os.environ.get("XDG_CACHE_HOME", "")
        if log.startswith("~/.cache/") and os.path.isabs(cache):  # the XDG spec: only an absolute path counts
            log = os.path.join(cache, log[len("~/.cache/"):])
        log = os.path.expanduser(log)
        fd = open_log(log)
        full_env = dict(os.environ)
        full_env.update(env or {})
        try:
            popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=fd, stderr=subprocess.STDOUT,
                                     cwd=os.path.expanduser(cwd) if cwd else None, env=full_env,
                                     start_new_session=True)
        finally:
            os.close(fd)
        start = _start_ticks(popen.pid)
        self.launched[popen.pid] = popen
        self.launched_runs[popen.pid] = start
        self.leader_seen[popen.pid] = start
        self.procs.configure(pgids=self.procs.pgids | {popen.pid})
        self.force_scan = True
        return {"pid": popen.pid, "pgid": popen.pid, "log": log, "started": time.time(), "start": start,
                "boot": _boot_time(), "uid": os.geteuid(), "user": _user(os.geteuid())}

    def cmd_stdout_of(self, pids=()):
        """Where each process's standard output goes, when it is a regular file: the log of a run
        started elsewhere (`nohup ... > run.log 2>&1 &`)."""
        out = {}
        for pid in pids:
            try:
                path = os.readlink("/proc/%d/fd/1" % int(pid))
                uid = _uid(int(pid))
                if os.path.isfile(path) and uid is not None:
                    out[str(pid)] = path
                    self.log_owners[path] = {uid}  # followed only while that user owns it
            except (OSError, ValueError):
                pass
        return out

    def cmd_http(self, port, path="/health", timeout=2.0):
        return http_get(port, path, timeout)

    def cmd_find_runs(self, launched=(), ports=(), command=(), model=None, patterns=None, default_port=None):
        return find_runs(launched, ports, command, model, patterns, self.launched_runs,
                         default_port=default_port, seen=self.leader_seen)

    def cmd_kill_plan(self, pgids=(), sids=(), pids=(), launched=(), ports=(), command=(), model=None,
                      patterns=None, default_port=None):
        """The plan to confirm. `pids`: those processes and what they started. Otherwise the run
        found from the hints (find_runs); bare process groups count as launched runs only when
        this agent launched them (it knows their leaders' start times)."""
        launched = list(launched or []) + [{"pgid": int(g)} for g in pgids or ()
                                           if all(int(r.get("pgid", -1)) != int(g) for r in launched or [])]
        if pids:
            return run_plan(pids=list(pids))
        return run_plan(launched=launched, ports=ports, command=command, model=model, patterns=patterns,
                        known=self.launched_runs, default_port=default_port, seen=self.leader_seen)

    def cmd_kill(self, plan, wait_s=10.0, sessions=(), ports=(), since=None, **_old):
        """Carry out the plan, then verify: what is left of it, its GPU memory, its ports."""
        report = kill_run(plan, wait_s, sessions, since)
        time.sleep(self.interval + 0.5)  # let the sampler see the GPUs after the exits
        planned = set(e["pid"] for e in plan)
        gpus = [dict(g) for g in list(self.sent_gpus.values())]
        gpu_left = []
        for g in gpus:
            for pid, mib in g.get("processes") or []:
                if pid in planned:
                    gpu_left.append({"gpu": g["index"], "pid": pid, "mib": mib})
        listening = listening_ports()
        report["gpu_memory_left"] = gpu_left
        report["gpus_after"] = [{"index": g["index"], "mem_used_mib": g.get("mem_used_mib")} for g in gpus]
        report["ports_open"] = [p for p in ports if int(p) in listening]
        self.force_scan = True
        return report

    def cmd_shm_audit(self, folder=SHM_DEFAULT, uid=None):
        return shm_audit(folder, uid)

    def cmd_shm_clean(self, names, folder=SHM_DEFAULT, uid=None, other_dir=False):
        return shm_clean(folder, names, uid, other_dir)

    def cmd_dump_check(self, pyspy=None):
        return pyspy_check(pyspy)

    def cmd_dump(self, pids, pyspy=None, deadline_s=20.0, native=True):
        return pyspy_dump(pids, pyspy, deadline_s, native)

    def cmd_ras(self, host=None, port=None, fmt="json", verbose=True, timeout=RAS_TIMEOUT_S):
        """One RAS status now (the bundle's), at the polled address unless told otherwise."""
        procs = [{"pid": pid} for pid in self.procs.watched] if self.procs else []
        h, p = self.ras.target(procs)
        return ras_query(host or h, int(port or p), fmt, verbose, float(timeout))

    def cmd_ras_config(self, every_s=None, host=None, port=None, enabled=None, timeout=None):
        if every_s is not None:
            self.ras.every_s = max(0.5, float(every_s))
        if timeout is not None:
            self.ras.timeout = max(0.5, float(timeout))
        if port is not None:
            self.ras.addr = (host or "127.0.0.1", int(port))
        if enabled is not None:
            self.ras.enabled = bool(enabled)
        return {"every_s": self.ras.every_s, "addr": self.ras.addr, "enabled": self.ras.enabled}

    def cmd_metrics(self, port, path="/metrics", want=None, timeout=5.0, limit=METRICS_MAX_BYTES):
        return http_body(port, path, float(timeout), min(int(limit), METRICS_MAX_BYTES), want)

    def cmd_fr_dump(self, pids, trigger=True, wait_s=15.0, raw=False):
        return fr_dump([int(p) for p in pids], bool(trigger), float(wait_s), bool(raw))

    def cmd_host_facts(self, items=("nvidia_smi", "xid", "versions"), pids=()):
        return host_facts(list(items), [int(p) for p in pids], self.gpus.driver, self.gpus.source)

    def run(self):
        buf = b""
        next_tick = time.monotonic() + 2.0  # the first sample waits for the first config, briefly
        while True:
            wait = max(0.0, next_tick - time.monotonic())
            ready, _, _ = select.select([0], [], [], wait)
            if ready:
                data = os.read(0, 65536)
                if not data:
                    return  # the cockpit went away: so do we
                buf += data
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        self.handle(line.decode("utf-8", "replace"))
                if self.force_scan:
                    next_tick = time.monotonic()
            now = time.monotonic()
            if now >= next_tick:
                self.tick()
                # the second sample comes soon after the first: CPU % needs two, and a one-shot
                # look (`cockpit snapshot`) should not wait a whole interval for it
                step = min(self.interval, FIRST_GAP_S) if self.seq == 1 else self.interval
                next_tick += step
                if next_tick < now:
                    next_tick = now + step


def install_sim_nvml(nbytes):
    """Reads the simulated NVML module's source from stdin and installs it as `pynvml`, so the
    simulated host runs exactly the code path of a real one."""
    import types

    src = b""
    while len(src) < nbytes:
        chunk = os.read(0, nbytes - len(src))
        if not chunk:
            raise SystemExit(3)
        src += chunk
    mod = types.ModuleType("pynvml")
    mod.__file__ = "<gpu-cockpit sim nvml>"
    exec(compile(src, "cockpit-sim-nvml", "exec"), mod.__dict__)
    sys.modules["pynvml"] = mod


def main(argv):
    interval = 1.0
    args = list(argv)
    while args:
        flag = args.pop(0)
        if flag == "--interval":
            interval = max(0.1, float(args.pop(0)))
        elif flag == "--sim-nvml":
            install_sim_nvml(int(args.pop(0)))
        elif flag == "--sim-state":
            os.environ["COCKPIT_SIM_STATE"] = args.pop(0)
    if sys.version_info < (3, 8):
        emit({"t": FATAL, "code": "python-too-old",
              "msg": "Python %s on the host is too old: gpu-cockpit's agent needs Python >= 3.8 "
                     "(name another interpreter with --python)" % platform.python_version()})
        return 2
    try:
        import psutil
    except ImportError:
        emit({"t": FATAL, "code": "no-psutil",
              "msg": "psutil is not installed for %s on the host: run `%s -m pip install psutil` "
                     "there, or name another interpreter with --python" % (sys.executable, sys.executable)})
        return 2
    agent = Agent(interval)
    agent.procs = Procs(psutil)
    emit(agent.hello(psutil))
    profile = os.environ.get("COCKPIT_AGENT_PROFILE")  # benchmarks: cProfile's stats, written at the end
    if profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    try:
        agent.run()
    except KeyboardInterrupt:
        pass
    finally:
        agent.gpus.close()
        if profile:
            profiler.disable()
            profiler.dump_stats(profile)
    return 0


if __name__ in ("__main__", "__cockpit_agent__"):
    sys.exit(main(sys.argv[2:] if __name__ == "__cockpit_agent__" else sys.argv[1:]))
