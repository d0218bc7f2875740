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
nvmlClocksEventReasonGpuIdle = 0x1
nvmlClocksEventReasonSwPowerCap = 0x4

MODELS = {
    "rtx-pro-6000": {"name": "NVIDIA RTX PRO 6000 Blackwell Server Edition", "mem_total_mib": 97887,
                     "power_limit_w": 600.0, "idle_w": 38.0, "max_sm_mhz": 2617},
    "h200": {"name": "NVIDIA H200", "mem_total_mib": 143771, "power_limit_w": 700.0, "idle_w": 76.0,
             "max_sm_mhz": 1980},
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
    def __str__(self):
        return self.args[0] if self.args else "NVML error"


class NVMLError_NotSupported(NVMLError):
    pass


class NVMLError_Uninitialized(NVMLError):
    pass


class NVMLError_InvalidArgument(NVMLError):
    pass


class _Obj:
    def __init__(self, **kw):
        self.__dict__.update(kw)


_state = {"dir": None, "host": None, "procs": [], "read_at": -1.0}


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
    return index


def nvmlDeviceGetName(handle):
    return _model()["name"]


def nvmlDeviceGetUUID(handle):
    digest = hashlib.sha1(("%s-%d" % (_state["host"].get("seed", 0), handle)).encode()).hexdigest()
    return "GPU-%s-%s-%s-%s-%s" % (digest[:8], digest[8:12], digest[12:16], digest[16:20], digest[20:32])


nvmlMemory_v2 = 0x02000028


def nvmlDeviceGetMemoryInfo(handle, version=None):
    total = _model()["mem_total_mib"] * 1048576
    used = (512 + sum(int(p.get("used_mib", 0)) for p in _users(handle))) * 1048576
    used = min(used, total)
    return _Obj(total=total, used=used, free=total - used)


def nvmlDeviceGetUtilizationRates(handle):
    util, _, _ = ACTIVITY[_activity(handle)]
    if 0 < util < 100:
        util = int(max(1, min(99, util + _noise(handle, "u", 6))))
    return _Obj(gpu=int(util), memory=int(util * 0.6))


def nvmlDeviceGetPowerUsage(handle):
    m = _model()
    _, share, _ = ACTIVITY[_activity(handle)]
    watts = m["idle_w"] + share * (m["power_limit_w"] - m["idle_w"]) + _noise(handle, "p", 2.5)
    return int(watts * 1000)


def nvmlDeviceGetEnforcedPowerLimit(handle):
    return int(_model()["power_limit_w"] * 1000)


def nvmlDeviceGetTemperature(handle, sensor):
    _, share, _ = ACTIVITY[_activity(handle)]
    return int(31 + 45 * share + _noise(handle, "t", 1.5))


def nvmlDeviceGetClockInfo(handle, clock):
    _, _, clk = ACTIVITY[_activity(handle)]
    return int(_model()["max_sm_mhz"] * clk)


def nvmlDeviceGetCurrentClocksEventReasons(handle):
    return nvmlClocksEventReasonGpuIdle if _activity(handle) in ("idle", "blocked") else 0


def nvmlDeviceGetTotalEccErrors(handle, error_type, counter_type):
    return 0


def nvmlDeviceGetFanSpeed(handle):
    raise NVMLError_NotSupported("Not Supported")  # like an H200: no fan to read


def nvmlDeviceGetComputeRunningProcesses(handle):
    return [
        _Obj(pid=int(p["pid"]), usedGpuMemory=int(p.get("used_mib", 0)) * 1048576)
        for p in _users(handle)
    ]


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


def write_host(state_dir, gpus=8, model="rtx-pro-6000", seed=0, driver="580.95.05"):
    os.makedirs(os.path.join(state_dir, "procs"), exist_ok=True)
    with open(os.path.join(state_dir, "host.json"), "w") as fh:
        json.dump({"gpus": gpus, "model": model, "seed": seed, "driver": driver}, fh)
