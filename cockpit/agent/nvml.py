"""NVML through ctypes, for a host whose Python has no `pynvml` (nvidia-ml-py): the driver's own
libnvidia-ml.so.1, with the names, errors and return shapes of pynvml's functions that the
sampler (gpus.NvmlGpus) calls, so one sampler serves both. Structure layouts follow nvml.h
(and pynvml.py, its reference binding). The library is loaded by nvmlInit: importing this module
never fails, a host without the driver gets NVMLError_LibraryNotFound there."""

import ctypes
import threading

CTYPES = True  # tells the sampler which binding it runs on
__version__ = "ctypes"

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13

NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_FEATURE_ENABLED = 1
NVML_NVLINK_MAX_LINKS = 18
NVML_NVLINK_ERROR_DL_REPLAY = 0
NVML_NVLINK_ERROR_DL_RECOVERY = 1
NVML_NVLINK_ERROR_DL_CRC_FLIT = 2
NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE = 32
NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE = 16
nvmlEventTypeSingleBitEccError = 0x1
nvmlEventTypeDoubleBitEccError = 0x2
nvmlEventTypeXidCriticalError = 0x8
NVML_VALUE_NOT_AVAILABLE_ulonglong = 0xFFFFFFFFFFFFFFFF
NVML_DEVICE_NAME_V2_BUFFER_SIZE = 96
NVML_DEVICE_UUID_V2_BUFFER_SIZE = 96
NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE = 80

_lib = None
_lock = threading.Lock()


class NVMLError(Exception):
    """An NVML return code other than success; `value` is the code, as in pynvml."""

    def __init__(self, value, msg=None):
        Exception.__init__(self, value)
        self.value = value
        self.msg = msg

    def __str__(self):
        if self.msg:
            return self.msg
        try:
            fn = _lib.nvmlErrorString
            fn.restype = ctypes.c_char_p
            return fn(self.value).decode("utf-8", "replace")
        except Exception:
            return "NVML error %s" % self.value


class NVMLError_NotSupported(NVMLError):
    pass


class NVMLError_LibraryNotFound(NVMLError):
    pass


class NVMLError_FunctionNotFound(NVMLError):
    pass


class NVMLError_DriverNotLoaded(NVMLError):
    pass


class NVMLError_Timeout(NVMLError):
    pass


class NVMLError_GpuIsLost(NVMLError):
    pass


_ERRORS = {
    NVML_ERROR_NOT_SUPPORTED: NVMLError_NotSupported,
    NVML_ERROR_DRIVER_NOT_LOADED: NVMLError_DriverNotLoaded,
    NVML_ERROR_TIMEOUT: NVMLError_Timeout,
    NVML_ERROR_GPU_IS_LOST: NVMLError_GpuIsLost,
    NVML_ERROR_LIBRARY_NOT_FOUND: NVMLError_LibraryNotFound,
    NVML_ERROR_FUNCTION_NOT_FOUND: NVMLError_FunctionNotFound,
}


class c_nvmlUtilization_t(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class c_nvmlMemory_t(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class c_nvmlMemory_v2_t(ctypes.Structure):
    """v2 counts the driver's reserved memory apart, so `used` is what nvidia-smi shows."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("total", ctypes.c_ulonglong),
        ("reserved", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


nvmlMemory_v2 = ctypes.sizeof(c_nvmlMemory_v2_t) | (2 << 24)  # 0x02000028, as NVML_STRUCT_VERSION makes it


class c_nvmlProcessInfo_t(ctypes.Structure):
    """nvmlProcessInfo_v2_t, which the _v3 process queries fill."""

    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


class c_nvmlPciInfo_t(ctypes.Structure):
    """nvmlPciInfo_t (the _v3 call): busId is "00000000:3B:00.0", the kernel log's is shorter."""

    _fields_ = [
        ("busIdLegacy", ctypes.c_char * NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE),
        ("domain", ctypes.c_uint),
        ("bus", ctypes.c_uint),
        ("device", ctypes.c_uint),
        ("pciDeviceId", ctypes.c_uint),
        ("pciSubSystemId", ctypes.c_uint),
        ("busId", ctypes.c_char * NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE),
    ]


class c_nvmlEventData_t(ctypes.Structure):
    """nvmlEventData_t: which device, the event's type bit, its data (the Xid code for an Xid
    event) and, since CUDA 11, the MIG instance ids."""

    _fields_ = [
        ("device", ctypes.c_void_p),
        ("eventType", ctypes.c_ulonglong),
        ("eventData", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


class ProcessInfo:
    """A process row as pynvml gives it: usedGpuMemory None when NVML cannot tell (no rights)."""

    __slots__ = ("pid", "usedGpuMemory")

    def __init__(self, pid, used):
        self.pid = pid
        self.usedGpuMemory = None if used == NVML_VALUE_NOT_AVAILABLE_ulonglong else used


def _fn(name):
    if _lib is None:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    try:
        return getattr(_lib, name)
    except AttributeError:
        raise NVMLError_FunctionNotFound(NVML_ERROR_FUNCTION_NOT_FOUND) from None


def _check(ret):
    if ret != NVML_SUCCESS:
        raise _ERRORS.get(ret, NVMLError)(ret)


def _call(name, *args):
    _check(_fn(name)(*args))


def _uint(name, *args):
    out = ctypes.c_uint()
    _call(name, *(args + (ctypes.byref(out),)))
    return out.value


def _text(name, size, *args):
    buf = ctypes.create_string_buffer(size)
    _call(name, *(args + (buf, ctypes.c_uint(size))))
    return buf.value.decode("utf-8", "replace")


def library():
    """Loads libnvidia-ml.so.1 (the driver's: present wherever the driver is) once; None, or
    why it cannot be loaded (pynvml loads the same file by the same name)."""
    global _lib
    with _lock:
        if _lib is None:
            try:
                _lib = ctypes.CDLL("libnvidia-ml.so.1")
            except OSError as exc:
                return "NVML Shared Library Not Found (%s)" % exc
    return None


def nvmlInit():
    """Loads libnvidia-ml.so.1 and initialises it."""
    missing = library()
    if missing:
        raise NVMLError_LibraryNotFound(NVML_ERROR_LIBRARY_NOT_FOUND, missing)
    _call("nvmlInit_v2")


def nvmlShutdown():
    _call("nvmlShutdown")


def nvmlSystemGetDriverVersion():
    return _text("nvmlSystemGetDriverVersion", NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE)


def nvmlSystemGetCudaDriverVersion_v2():
    out = ctypes.c_int()
    _call("nvmlSystemGetCudaDriverVersion_v2", ctypes.byref(out))
    return out.value


def nvmlDeviceGetCount():
    return _uint("nvmlDeviceGetCount_v2")


def nvmlDeviceGetHandleByIndex(index):
    handle = ctypes.c_void_p()  # nvmlDevice_t: an opaque pointer
    _call("nvmlDeviceGetHandleByIndex_v2", ctypes.c_uint(index), ctypes.byref(handle))
    return handle


def nvmlDeviceGetName(handle):
    return _text("nvmlDeviceGetName", NVML_DEVICE_NAME_V2_BUFFER_SIZE, handle)


def nvmlDeviceGetUUID(handle):
    return _text("nvmlDeviceGetUUID", NVML_DEVICE_UUID_V2_BUFFER_SIZE, handle)


def nvmlDeviceGetMemoryInfo(handle, version=None):
    if version:
        mem = c_nvmlMemory_v2_t(version=version)
        _call("nvmlDeviceGetMemoryInfo_v2", handle, ctypes.byref(mem))
    else:
        mem = c_nvmlMemory_t()
        _call("nvmlDeviceGetMemoryInfo", handle, ctypes.byref(mem))
    return mem


def nvmlDeviceGetUtilizationRates(handle):
    util = c_nvmlUtilization_t()
    _call("nvmlDeviceGetUtilizationRates", handle, ctypes.byref(util))
    return util


def nvmlDeviceGetPowerUsage(handle):
    return _uint("nvmlDeviceGetPowerUsage", handle)  # milliwatts


def nvmlDeviceGetEnforcedPowerLimit(handle):
    return _uint("nvmlDeviceGetEnforcedPowerLimit", handle)  # milliwatts


def nvmlDeviceGetTemperature(handle, sensor):
    return _uint("nvmlDeviceGetTemperature", handle, ctypes.c_int(sensor))


def nvmlDeviceGetClockInfo(handle, clock):
    return _uint("nvmlDeviceGetClockInfo", handle, ctypes.c_int(clock))


def nvmlDeviceGetCurrentClocksEventReasons(handle):
    """The clock event (throttle) reasons' bit mask; drivers before 535 name it ThrottleReasons."""
    out = ctypes.c_ulonglong()
    try:
        fn = _fn("nvmlDeviceGetCurrentClocksEventReasons")
    except NVMLError_FunctionNotFound:
        fn = _fn("nvmlDeviceGetCurrentClocksThrottleReasons")
    _check(fn(handle, ctypes.byref(out)))
    return out.value


def nvmlDeviceGetTotalEccErrors(handle, error_type, counter_type):
    out = ctypes.c_ulonglong()
    _call(
        "nvmlDeviceGetTotalEccErrors", handle, ctypes.c_int(error_type), ctypes.c_int(counter_type), ctypes.byref(out)
    )
    return out.value


def nvmlDeviceGetComputeRunningProcesses(handle):
    """The GPU's compute processes (the _v3 call), asked with room to spare as pynvml does: the
    list may grow between asking its size and reading it."""
    count = ctypes.c_uint(0)
    fn = _fn("nvmlDeviceGetComputeRunningProcesses_v3")
    ret = fn(handle, ctypes.byref(count), None)
    if ret == NVML_SUCCESS:
        return []
    if ret != NVML_ERROR_INSUFFICIENT_SIZE:
        _check(ret)
    for _ in range(3):
        size = count.value * 2 + 5
        rows = (c_nvmlProcessInfo_t * size)()
        count = ctypes.c_uint(size)
        ret = fn(handle, ctypes.byref(count), rows)
        if ret != NVML_ERROR_INSUFFICIENT_SIZE:
            _check(ret)
            return [ProcessInfo(r.pid, r.usedGpuMemory) for r in rows[: count.value]]
    _check(ret)


def _ulonglong(name, *args):
    out = ctypes.c_ulonglong()
    _call(name, *(args + (ctypes.byref(out),)))
    return out.value


def nvmlDeviceGetIndex(handle):
    return _uint("nvmlDeviceGetIndex", handle)


def nvmlDeviceGetPciInfo(handle):
    info = c_nvmlPciInfo_t()
    try:
        fn = _fn("nvmlDeviceGetPciInfo_v3")
    except NVMLError_FunctionNotFound:
        fn = _fn("nvmlDeviceGetPciInfo_v2")
    _check(fn(handle, ctypes.byref(info)))
    return info


def nvmlDeviceGetRemappedRows(handle):
    """(corrected rows, uncorrected rows, remap pending, remap failed): Ampere and later."""
    out = [ctypes.c_uint() for _ in range(4)]
    _call("nvmlDeviceGetRemappedRows", handle, *[ctypes.byref(v) for v in out])
    return tuple(v.value for v in out)


def nvmlDeviceGetRetiredPagesPendingStatus(handle):
    """Page retirement (before Ampere): 1 while retired pages wait for a reset."""
    return _uint("nvmlDeviceGetRetiredPagesPendingStatus", handle)


def nvmlDeviceGetNvLinkState(handle, link):
    return _uint("nvmlDeviceGetNvLinkState", handle, ctypes.c_uint(link))


def nvmlDeviceGetNvLinkErrorCounter(handle, link, counter):
    return _ulonglong("nvmlDeviceGetNvLinkErrorCounter", handle, ctypes.c_uint(link), ctypes.c_int(counter))


def nvmlDeviceGetPcieReplayCounter(handle):
    return _uint("nvmlDeviceGetPcieReplayCounter", handle)


def nvmlDeviceGetSupportedEventTypes(handle):
    return _ulonglong("nvmlDeviceGetSupportedEventTypes", handle)


def nvmlEventSetCreate():
    eventset = ctypes.c_void_p()  # nvmlEventSet_t: an opaque pointer
    _call("nvmlEventSetCreate", ctypes.byref(eventset))
    return eventset


def nvmlDeviceRegisterEvents(handle, event_types, eventset):
    _call("nvmlDeviceRegisterEvents", handle, ctypes.c_ulonglong(event_types), eventset)


def nvmlEventSetWait_v2(eventset, timeout_ms):
    """Blocks in the driver up to timeout_ms for one event (NVMLError_Timeout when none came)."""
    data = c_nvmlEventData_t()
    _call("nvmlEventSetWait_v2", eventset, ctypes.byref(data), ctypes.c_uint(timeout_ms))
    return data


def nvmlEventSetFree(eventset):
    _call("nvmlEventSetFree", eventset)
