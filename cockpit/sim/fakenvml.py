"""Simulated NVML with the interface of `pynvml` (nvidia-ml-py), for hosts without GPUs.

The agent installs this module under the name `pynvml`, so the simulated host runs the very code
path of a real one. Standard library only: it travels to the host with the agent.

Its figures follow real processes. Whatever the simulated inference server runs registers itself
as a GPU user by writing `<state>/procs/<pid>.json` ({"gpu", "used_mib", "activity"}); a pid that is
gone (or a zombie) holds no memory, as with a real driver. The host's shape (GPU count, model,
memory, power limit) comes from `<state>/host.json`. Noise is a hash of the seed, the GPU and the
whole second, so a frozen clock (COCKPIT_SIM_CLOCK) gives identical figures run after run.
"""

import hashlib
import json
import os
import time

SIMULATED = True
__version__ = "sim"

NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_GRAPHICS = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_NVLINK_MAX_LINKS = 18
nvmlClocksEventReasonGpuIdle = 0x1
nvmlClocksEventReasonSwPowerCap = 0x4
nvmlClocksEventReasonHwSlowdown = 0x8
nvmlEventTypeSingleBitEccError = 0x1
nvmlEventTypeDoubleBitEccError = 0x2
nvmlEventTypeXidCriticalError = 0x8

MODELS = {
    "rtx-pro-6000": {
        "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
        "mem_total_mib": 97887,
        "power_limit_w": 600.0,
        "idle_w": 38.0,
        "max_sm_mhz": 2617,
    },
    "h200": {
        "name": "NVIDIA H200",
        "mem_total_mib": 143771,
        "power_limit_w": 700.0,
        "idle_w": 76.0,
        "max_sm_mhz": 1980,
    },
}

# activity -> (utilization %, share of the power span above idle, SM clock share)
ACTIVITY = {
    "idle": (0, 0.0, 0.15),
    "load": (3, 0.05, 0.5),
    "capture": (35, 0.2, 0.9),
    "busy": (92, 0.75, 1.0),
    "spin": (100, 0.06, 1.0),  # a collective that never completes: full utilization, idle power
    "blocked": (0, 0.01, 0.15),
}


class NVMLError(Exception):
    value = 999  # NVML_ERROR_UNKNOWN; each subclass has its code, as pynvml's do

    def __str__(self):
        return self.args[0] if self.args else "NVML error"


class NVMLError_NotSupported(NVMLError):
    value = 3


class NVMLError_Uninitialized(NVMLError):
    value = 1


class NVMLError_InvalidArgument(NVMLError):
    value = 2


class NVMLError_Timeout(NVMLError):
    value = 10


class NVMLError_GpuIsLost(NVMLError):
    value = 15


class _Obj:
    def __init__(self, **kw):
        self.__dict__.update(kw)


_state = {"dir": None, "host": None, "procs": [], "faults": {}, "read_at": -1.0}


def _dir():
    if _state["dir"] is None:
        raise NVMLError_Uninitialized("Uninitialized")
    return _state["dir"]


def _now():
    frozen = os.environ.get("COCKPIT_SIM_CLOCK")
    return float(frozen) if frozen else time.time()


def _alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def _refresh():
    now = time.monotonic()
    if now - _state["read_at"] < 0.2:
        return
    _state["read_at"] = now
    procs = []
    folder = os.path.join(_dir(), "procs")
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        names = []
    for name in names:
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(folder, name)) as fh:
                entry = json.load(fh)
            pid = int(entry["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a file being replaced, or junk: the next read sees it whole
        if _alive(pid):
            procs.append(entry)
    _state["procs"] = procs
    faults = {}
    folder = os.path.join(_dir(), "faults")
    for name in os.listdir(folder) if os.path.isdir(folder) else ():
        try:
            with open(os.path.join(folder, name)) as fh:
                faults[int(name.split(".")[0])] = json.load(fh)
        except (OSError, ValueError):
            continue
    _state["faults"] = faults


def _fault(handle):
    """What a scenario made of this GPU (`<state>/faults/<gpu>.json`); a lost GPU answers nothing."""
    _refresh()
    fault = _state["faults"].get(handle, {})
    if fault.get("lost"):
        raise NVMLError_GpuIsLost("GPU is lost")
    return fault


def _noise(index, salt, span):
    key = "%s/%d/%d/%s" % (_state["host"].get("seed", 0), index, int(_now()), salt)
    h = int(hashlib.sha1(key.encode()).hexdigest()[:8], 16)
    return (h / 0xFFFFFFFF - 0.5) * 2 * span


def _model():
    host = _state["host"]
    base = dict(MODELS.get(host.get("model", "rtx-pro-6000"), MODELS["rtx-pro-6000"]))
    base.update({k: v for k, v in host.items() if k in base})
    return base


def _users(index):
    _refresh()
    return [p for p in _state["procs"] if int(p.get("gpu", -1)) == index]


def _activity(index):
    users = _users(index)
    order = ["busy", "spin", "capture", "load", "blocked", "idle"]
    acts = [p.get("activity", "idle") for p in users]
    for act in order:
        if act in acts:
            return act
    return "idle"


# ----------------------------------------------------------------------------- the pynvml API


def nvmlInit():
    folder = os.environ.get("COCKPIT_SIM_STATE")
    if not folder:
        raise NVMLError("Driver Not Loaded (COCKPIT_SIM_STATE is not set)")
    try:
        with open(os.path.join(folder, "host.json")) as fh:
            _state["host"] = json.load(fh)
    except (OSError, ValueError):
        _state["host"] = {}
    _state["dir"] = folder
    _state["read_at"] = -1.0


def nvmlShutdown():
    _state["dir"] = None


def nvmlSystemGetDriverVersion():
    _dir()
    return _state["host"].get("driver", "580.95.05")


def nvmlDeviceGetCount():
    _dir()
    return int(_state["host"].get("gpus", 8))


def nvmlDeviceGetHandleByIndex(index):
    if not 0 <= index < nvmlDeviceGetCount():
        raise NVMLError_InvalidArgument("Invalid Argument")
    _fault(index)
    return index


def nvmlDeviceGetIndex(handle):
    return handle


def nvmlDeviceGetName(handle):
    _fault(handle)
    return _model()["name"]


def nvmlDeviceGetUUID(handle):
    digest = hashlib.sha1(("%s-%d" % (_state["host"].get("seed", 0), handle)).encode()).hexdigest()
    return "GPU-%s-%s-%s-%s-%s" % (digest[:8], digest[8:12], digest[12:16], digest[16:20], digest[20:32])


nvmlMemory_v2 = 0x02000028


def nvmlDeviceGetMemoryInfo(handle, version=None):
    _fault(handle)
    total = _model()["mem_total_mib"] * 1048576
    used = (512 + sum(int(p.get("used_mib", 0)) for p in _users(handle))) * 1048576
    used = min(used, total)
    return _Obj(total=total, used=used, free=total - used)


def nvmlDeviceGetUtilizationRates(handle):
    _fault(handle)
    util, _, _ = ACTIVITY[_activity(handle)]
    if 0 < util < 100:
        util = int(max(1, min(99, util + _noise(handle, "u", 6))))
    return _Obj(gpu=int(util), memory=int(util * 0.6))


def nvmlDeviceGetPowerUsage(handle):
    _fault(handle)
    m = _model()
    _, share, _ = ACTIVITY[_activity(handle)]
    watts = m["idle_w"] + share * (m["power_limit_w"] - m["idle_w"]) + _noise(handle, "p", 2.5)
    return int(watts * 1000)


def nvmlDeviceGetEnforcedPowerLimit(handle):
    return int(_model()["power_limit_w"] * 1000)


def nvmlDeviceGetTemperature(handle, sensor):
    _fault(handle)
    _, share, _ = ACTIVITY[_activity(handle)]
    return int(31 + 45 * share + _noise(handle, "t", 1.5))


def nvmlDeviceGetClockInfo(handle, clock):
    _, _, clk = ACTIVITY[_activity(handle)]
    if _fault(handle).get("throttle", 0) & 0xE8:  # held down by the hardware: about half the clock
        clk *= 0.55
    return int(_model()["max_sm_mhz"] * clk)


def nvmlDeviceGetCurrentClocksEventReasons(handle):
    extra = int(_fault(handle).get("throttle", 0))
    return extra | (nvmlClocksEventReasonGpuIdle if _activity(handle) in ("idle", "blocked") else 0)


def nvmlDeviceGetTotalEccErrors(handle, error_type, counter_type):
    fault = _fault(handle)
    return int(
        fault.get(
            "ecc_aggregate" if counter_type == NVML_AGGREGATE_ECC else "ecc_uncorrected",
            fault.get("ecc_uncorrected", 0),
        )
    )


def nvmlDeviceGetPciInfo(handle):
    _fault(handle)
    bus = 0x18 + 0x10 * handle
    return _Obj(busId=("00000000:%02X:00.0" % bus).encode(), bus=bus, domain=0, device=0)


def nvmlDeviceGetRemappedRows(handle):
    """(corrected, uncorrected, pending, failure): Ampere and later remap rows, as these GPUs do."""
    f = _fault(handle)
    return (
        int(f.get("remap_corrected", 0)),
        int(f.get("remap_uncorrected", 0)),
        int(bool(f.get("remap_pending"))),
        int(bool(f.get("remap_failure"))),
    )


def nvmlDeviceGetRetiredPagesPendingStatus(handle):
    raise NVMLError_NotSupported("Not Supported")  # page retirement is pre-Ampere; these remap rows


def _nvlinks():
    return int(_state["host"].get("nvlinks", 18 if _state["host"].get("model") == "h200" else 0))


def nvmlDeviceGetNvLinkState(handle, link):
    _fault(handle)
    if link >= _nvlinks():
        raise NVMLError_NotSupported("Not Supported")  # an RTX PRO 6000 has no NVLink
    return 1


def nvmlDeviceGetNvLinkErrorCounter(handle, link, counter):
    f = _fault(handle)
    if link >= _nvlinks():
        raise NVMLError_NotSupported("Not Supported")
    name = {0: "nvlink_replay", 1: "nvlink_recovery", 2: "nvlink_crc"}.get(counter)
    return int(f.get(name, 0)) if link == 0 and name else 0


def nvmlDeviceGetPcieReplayCounter(handle):
    return int(_fault(handle).get("pcie_replay", 0))


def nvmlDeviceGetSupportedEventTypes(handle):
    _fault(handle)
    return nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError | nvmlEventTypeXidCriticalError


class _EventSet:
    def __init__(self, path):
        self.path = path
        self.handles = {}
        try:
            self.offset = os.path.getsize(path)  # like the driver: only events from now on
        except OSError:
            self.offset = 0


def nvmlEventSetCreate():
    return _EventSet(os.path.join(_dir(), "events.jsonl"))


def nvmlDeviceRegisterEvents(handle, event_types, eventset):
    _fault(handle)
    eventset.handles[handle] = event_types


def nvmlEventSetWait_v2(eventset, timeout_ms):
    """The next event a scenario wrote to `<state>/events.jsonl` for a registered GPU, else
    NVMLError_Timeout after timeout_ms (the file is looked at every 50 ms meanwhile)."""
    deadline = time.monotonic() + timeout_ms / 1000.0
    while True:
        try:
            with open(eventset.path, "rb") as fh:
                fh.seek(eventset.offset)
                chunk = fh.read()
        except OSError:
            chunk = b""
        end = chunk.rfind(b"\n") + 1
        for line in chunk[:end].splitlines(True):
            eventset.offset += len(line)
            try:
                ev = json.loads(line)
                gpu, kind = int(ev["gpu"]), int(ev.get("type", nvmlEventTypeXidCriticalError))
            except (ValueError, KeyError, TypeError):
                continue
            if eventset.handles.get(gpu, 0) & kind:
                return _Obj(
                    device=gpu,
                    eventType=kind,
                    eventData=int(ev.get("data", 0)),
                    gpuInstanceId=0xFFFFFFFF,
                    computeInstanceId=0xFFFFFFFF,
                )
        left = deadline - time.monotonic()
        if left <= 0:
            raise NVMLError_Timeout("Timeout")
        time.sleep(min(0.05, left))


def nvmlEventSetFree(eventset):
    eventset.handles = {}


def nvmlDeviceGetFanSpeed(handle):
    raise NVMLError_NotSupported("Not Supported")  # like an H200: no fan to read


def nvmlDeviceGetComputeRunningProcesses(handle):
    _fault(handle)
    return [_Obj(pid=int(p["pid"]), usedGpuMemory=int(p.get("used_mib", 0)) * 1048576) for p in _users(handle)]


# ----------------------------------------------------------------------------- registration


def register(state_dir, pid, gpu, used_mib, activity):
    """Called by simulated workers: publishes what this pid holds on which GPU, atomically."""
    folder = os.path.join(state_dir, "procs")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "%d.json" % pid)
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump({"pid": pid, "gpu": gpu, "used_mib": int(used_mib), "activity": activity}, fh)
    os.replace(tmp, path)


def fault(state_dir, gpu, **fields):
    """Called by a scenario: what goes wrong with GPU `gpu` (lost, throttle bits, remap_pending,
    ecc_uncorrected, nvlink_replay, pcie_replay...), merged into what was there, atomically."""
    folder = os.path.join(state_dir, "faults")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "%d.json" % gpu)
    try:
        with open(path) as fh:
            now = json.load(fh)
    except (OSError, ValueError):
        now = {}
    now.update(fields)
    with open(path + ".tmp", "w") as fh:
        json.dump(now, fh)
    os.replace(path + ".tmp", path)


def xid(state_dir, gpu, code):
    """Called by a scenario: the driver reports Xid `code` on GPU `gpu` (one appended line)."""
    line = json.dumps({"gpu": gpu, "type": nvmlEventTypeXidCriticalError, "data": int(code)}) + "\n"
    fd = os.open(os.path.join(state_dir, "events.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def write_host(state_dir, gpus=8, model="rtx-pro-6000", seed=0, driver="580.95.05"):
    os.makedirs(os.path.join(state_dir, "procs"), exist_ok=True)
    with open(os.path.join(state_dir, "host.json"), "w") as fh:
        json.dump({"gpus": gpus, "model": model, "seed": seed, "driver": driver}, fh)
