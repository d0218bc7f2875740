"""GPU samplers: NVML (pynvml, else the ctypes shim over libnvidia-ml.so.1; the simulated NVML is
installed as `pynvml`), else one long-lived nvidia-smi per query, else none.
"""

import subprocess
import sys
import threading
import time

from .procs import _alive
from .xid import XidWatch, bus_key

NVML_ERROR_GPU_IS_LOST = 15
NVLINK_COUNTERS = (("nvlink_replay", 0), ("nvlink_recovery", 1), ("nvlink_crc", 2))  # NVML_NVLINK_ERROR_DL_*
GPU_PROCS_EVERY_S = 5.0  # a GPU's process list is asked again at least this often, else on a memory change
SMI_FIELDS = (
    "index,uuid,name,utilization.gpu,memory.used,memory.total,temperature.gpu,"
    "power.draw,power.limit,clocks.sm,clocks_event_reasons.active"
)


class NoGpus:
    """No NVML and no nvidia-smi: the host is watched without GPU data."""

    kind = "none"
    source = None
    driver = None

    def static(self):
        return []

    def sample(self, slow):
        return []

    def events(self):
        return None

    def close(self):
        pass


class NvmlGpus:
    """GPU sampler over pynvml, the ctypes shim (nvml.py) or the simulated module: one interface.

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
        self.kind = "nvml-ctypes" if getattr(nvml, "CTYPES", False) else "pynvml"
        self.source = "sim" if sim else "nvml-ctypes" if self.kind == "nvml-ctypes" else "pynvml " + str(version)
        self.driver = self._text(self._call(None, "driver", nvml.nvmlSystemGetDriverVersion))
        count = nvml.nvmlDeviceGetCount()
        self.handles = []
        for i in range(count):  # a GPU already lost is said so; the others are still watched through NVML
            try:
                self.handles.append(nvml.nvmlDeviceGetHandleByIndex(i))
            except nvml.NVMLError:
                self.handles.append(None)
        self.unsupported = [set() for _ in self.handles]
        self.ecc = [None] * count
        self.lost = [
            h is None for h in self.handles
        ]  # NVML said GPU_IS_LOST, or its handle stopped answering: for good
        self.health = [{} for _ in range(count)]  # the slow clock's fields (state.GPU_HEALTH on the other side)
        self._links = [None] * count  # the GPU's active NVLinks, asked once
        self._procs = [None] * count  # (memory used, process rows, when asked) per GPU
        self._reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
        )
        self._mem = self._memory_info()
        self._static = []
        for i, h in enumerate(self.handles):
            if self.lost[i]:
                self._static.append(
                    {"index": i, "uuid": None, "name": None, "mem_total_mib": None, "power_limit_w": None}
                )
                continue
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
        buses = {}
        for i, h in enumerate(self.handles):
            if self.lost[i]:
                continue
            pci = self._call(i, "pci", getattr(nvml, "nvmlDeviceGetPciInfo", _none), h)
            if pci is not None:
                buses[bus_key(pci.busId)] = i
        started = time.perf_counter()
        self._health_round()  # the first round finds the active links and what is not supported
        self.health_first_ms = round((time.perf_counter() - started) * 1000, 2)
        started = time.perf_counter()
        self._health_round()
        self.health_ms = round((time.perf_counter() - started) * 1000, 2)  # what each slow round costs
        self.xid = XidWatch(nvml, [h for i, h in enumerate(self.handles) if not self.lost[i]], buses)
        self._sent_xid = -1

    def _memory_info(self):
        """Memory as nvidia-smi reports it: v2 leaves the driver's reserved memory out of `used`
        (v1 counts it: about 600 MiB more on an H200)."""
        nvml = self.nvml
        v2 = getattr(nvml, "nvmlMemory_v2", None)
        first = next((h for h in self.handles if h is not None), None)
        if v2 is not None and first is not None:
            try:
                nvml.nvmlDeviceGetMemoryInfo(first, version=v2)
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
            elif i is not None and _is_lost(exc):
                self.lost[i] = True
            return None

    def _health_round(self):
        """The slow clock's fields (every SLOW_EVERY_S, as ECC is): uncorrected ECC since the
        last reset and over the GPU's life, row remapping (or, before Ampere, retired pages
        pending), NVLink replay/recovery/CRC errors summed over the active links, PCIe replays.
        A call a GPU does not support is remembered and never asked again. A handle that stops
        answering is a GPU lost."""
        nvml = self.nvml
        for i, h in enumerate(self.handles):
            if self.lost[i]:
                continue
            try:
                nvml.nvmlDeviceGetHandleByIndex(i)
            except nvml.NVMLError as exc:
                not_supported = getattr(nvml, "NVMLError_NotSupported", None)
                if not (not_supported is not None and isinstance(exc, not_supported)):
                    self.lost[i] = True
                    continue
            out = {}
            self.ecc[i] = self._call(
                i,
                "ecc",
                nvml.nvmlDeviceGetTotalEccErrors,
                h,
                nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                nvml.NVML_VOLATILE_ECC,
            )
            out["ecc_aggregate"] = self._call(
                i,
                "ecc_aggregate",
                nvml.nvmlDeviceGetTotalEccErrors,
                h,
                nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                getattr(nvml, "NVML_AGGREGATE_ECC", 1),
            )
            rows = self._call(i, "remap", getattr(nvml, "nvmlDeviceGetRemappedRows", _none), h)
            if rows is not None:
                out["remap_corrected"], out["remap_uncorrected"] = int(rows[0]), int(rows[1])
                out["remap_pending"], out["remap_failure"] = bool(rows[2]), bool(rows[3])
            else:
                pending = self._call(i, "retired", getattr(nvml, "nvmlDeviceGetRetiredPagesPendingStatus", _none), h)
                out["retired_pending"] = None if pending is None else bool(pending)
            links = self._active_links(i, h)
            counter = getattr(nvml, "nvmlDeviceGetNvLinkErrorCounter", _none)
            for name, code in NVLINK_COUNTERS if links else ():
                values = [self._call(i, name, counter, h, link, code) for link in links]
                out[name] = None if all(v is None for v in values) else sum(v or 0 for v in values)
            out["pcie_replay"] = self._call(i, "pcie_replay", getattr(nvml, "nvmlDeviceGetPcieReplayCounter", _none), h)
            if self.lost[i]:
                continue
            self.health[i] = {k: v for k, v in out.items() if v is not None}

    def _active_links(self, i, h):
        """The GPU's active NVLinks, asked once (NVML_NVLINK_MAX_LINKS of them at most)."""
        if self._links[i] is None:
            nvml = self.nvml
            state = getattr(nvml, "nvmlDeviceGetNvLinkState", None)
            links = []
            for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)) if state else ():
                on = self._call(i, "nvlink_state", state, h, link)
                if on is None:
                    break  # not supported, or past the GPU's last link
                if on:
                    links.append(link)
            self._links[i] = links
        return self._links[i]

    def events(self):
        """The recent Xid events, when they changed since last asked, else None."""
        if self.xid.version == self._sent_xid:
            return None
        self._sent_xid = self.xid.version
        return self.xid.events()

    def static(self):
        return self._static

    def sample(self, slow):
        nvml = self.nvml
        out = []
        if slow:
            self._health_round()
        for i, h in enumerate(self.handles):
            if self.lost[i]:
                out.append(self._lost_row(i))
                continue
            util = self._call(i, "util", nvml.nvmlDeviceGetUtilizationRates, h)
            mem = self._call(i, "mem", self._mem, h)
            power = self._call(i, "power", nvml.nvmlDeviceGetPowerUsage, h)
            reasons = self._call(i, "reasons", self._reasons, h) if self._reasons else None
            procs = self._gpu_procs(i, h, mem)
            if self.lost[i]:  # it went during this sample
                out.append(self._lost_row(i))
                continue
            out.append(
                {
                    **self.health[i],
                    "index": i,
                    "util_pct": None if util is None else util.gpu,
                    "mem_used_mib": None if mem is None else mem.used // 1048576,
                    "mem_total_mib": None if mem is None else mem.total // 1048576,
                    "temp_c": self._call(i, "temp", nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU),
                    "power_w": None if power is None else round(power / 1000.0, 1),
                    "power_limit_w": self._static[i]["power_limit_w"],
                    "sm_clock_mhz": self._call(i, "clock", nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_SM),
                    "throttle": reasons,
                    "ecc_uncorrected": self.ecc[i],
                    "processes": procs,
                }
            )
        return out

    def _lost_row(self, i):
        """A GPU NVML reports lost: said so, not left as a missing sample."""
        return {
            "index": i,
            "lost": True,
            "util_pct": None,
            "mem_used_mib": None,
            "temp_c": None,
            "power_w": None,
            "sm_clock_mhz": None,
            "throttle": None,
            "processes": [],
        }

    def _gpu_procs(self, i, h, mem):
        """The GPU's processes and their memory: the costliest NVML call of a sample (0.3 ms on an
        H200, most of the agent's per-second cost), so asked again only when the GPU's memory use
        moved (a process came, went, or grew), one of its processes ended, or every GPU_PROCS_EVERY_S."""
        now = time.monotonic()
        used = None if mem is None else mem.used
        last = self._procs[i]
        if (
            last is not None
            and used is not None
            and last[0] == used
            and now - last[2] < GPU_PROCS_EVERY_S
            and all(_alive(row[0]) for row in last[1])
        ):
            return last[1]
        procs = self._call(i, "procs", self.nvml.nvmlDeviceGetComputeRunningProcesses, h) or []
        rows = [[p.pid, None if p.usedGpuMemory is None else p.usedGpuMemory // 1048576] for p in procs]
        self._procs[i] = (used, rows, now)
        return rows

    def close(self):
        self.xid.close()
        try:
            self.nvml.nvmlShutdown()
        except Exception:
            pass


class SmiGpus:
    """Fallback without pynvml: one long-lived `nvidia-smi -lms` process per query, never one per
    sample. Its rows are read by threads and the latest row per GPU is kept."""

    kind = source = "nvidia-smi"

    def __init__(self, interval):
        ms = str(max(100, int(interval * 1000)))
        self.latest = {}
        self.apps = {}
        self._apps_pending = {}
        self.driver = None
        out = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=driver_version,index,uuid,name,memory.total,power.limit",
                "--format=csv,noheader,nounits",
            ],
            capture_output=True,
            text=True,
            timeout=20,
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
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            ),
            subprocess.Popen(
                [
                    "nvidia-smi",
                    "--query-compute-apps=gpu_uuid,pid,used_memory",
                    "--format=csv,noheader,nounits",
                    "-lms",
                    ms,
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
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

    def events(self):
        return None  # nvidia-smi has no Xid events: the bundle's kernel-log grep still has them

    def close(self):
        for p in self.procs:
            p.kill()


def _none(*_args):
    return None  # a call this binding does not have: nothing to say


def _is_lost(exc):
    """NVML_ERROR_GPU_IS_LOST, as pynvml, the ctypes shim and the simulated NVML raise it."""
    return getattr(exc, "value", None) == NVML_ERROR_GPU_IS_LOST or type(exc).__name__ == "NVMLError_GpuIsLost"


def _num(text, kind):
    try:
        return kind(float(text)) if kind is int else kind(text)
    except (TypeError, ValueError):
        return None  # "[N/A]", "[Not Supported]"


def open_gpus(interval, warnings):
    """The best GPU source the host has, with nothing installed: pynvml (nvidia-ml-py, or the
    simulated NVML installed under its name), else NVML through ctypes (the driver's own
    library), else nvidia-smi, else none. Each step down is said in `warnings`. Where the driver's
    library is missing nvidia-ml-py cannot work either and is not imported (a large module: a
    tenth of a one-shot look's wait on a host without GPUs)."""
    from . import nvml

    simulated = sys.modules.get("pynvml") is not None  # the simulated NVML is installed under that name
    missing = None if simulated else nvml.library()
    pynvml = None
    if not missing:
        try:
            import pynvml
        except ImportError:
            pass
    if pynvml is None:
        pynvml = nvml  # the same interface over libnvidia-ml.so.1
    try:
        return NvmlGpus(pynvml)
    except Exception as exc:
        msg = str(exc) or type(exc).__name__
        if "Driver Not Loaded" in msg or (
            not getattr(pynvml, "CTYPES", False)
            and ("LibraryNotFound" in type(exc).__name__ or "not found" in msg.lower())
        ):
            warnings.append("no NVIDIA driver on this host (" + msg + "): no GPU data")
            return NoGpus()
        if missing:
            warnings.append("no NVIDIA driver on this host (" + msg + "): trying nvidia-smi")
        elif getattr(pynvml, "CTYPES", False):
            warnings.append(
                "pynvml is not installed for "
                + sys.executable
                + " and NVML cannot load ("
                + msg
                + "): trying nvidia-smi"
            )
        else:
            warnings.append("pynvml failed (" + msg + "): trying nvidia-smi")
    try:
        return SmiGpus(interval)
    except (OSError, subprocess.SubprocessError) as exc:
        warnings.append("no GPUs: neither NVML nor nvidia-smi works here (" + str(exc).strip()[:120] + ")")
        return NoGpus()
