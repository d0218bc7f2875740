"""The GPU's own word on why a rank died: Xid events, from NVML's event set (no root needed), else
from the kernel log (/dev/kmsg, where this user may read it). Each is kept as a GPU index, a host
epoch time, the Xid code and, from the kernel line, the pid; only the most recent are kept.

A daemon thread blocks in nvmlEventSetWait_v2 (or in select on /dev/kmsg) with a timeout: no busy
loop, and the sampler's own clock never waits for it."""

import os
import re
import select
import threading
import time
from collections import deque

MAX_EVENTS = 32  # recent events kept and sent: a flapping GPU cannot grow the frame
WAIT_MS = 10000  # one wait in the driver, which returns at once on an event: the thread checks its stop flag
# between waits and otherwise wakes only this often (each wake costs the interpreter a timeout exception)

# NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.
# NVRM: Xid (0000:01:00): 31, Ch 0000000b, engmask 00000120, ...      (older drivers: no "PCI:", no pid)
# NVRM: Xid (PCI:0000:c1:00): 94, pid='<unknown>', name=<unknown>, Contained: ...
# Anchored at the driver's own prefix, at the start of the message: text that merely contains it
# (a process name, a path, a user's line echoed by another kernel message) is no Xid.
_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.\d)?\):\s*(\d+)"
    r"(?:,\s*pid=['\"]?(\d+|<unknown>)['\"]?)?"
)
# A line of dmesg or syslog: the kernel's message after its timestamp and syslog's "HOST kernel:".
_LINE = re.compile(r"(?:[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \S+ kernel: )?(?:\[ *\d+\.\d+\] *)?")
KERNEL_FACILITY = 0  # a /dev/kmsg record's facility (its priority >> 3): userspace cannot write it


def parse_xid(line, start=None):
    """A kernel message's Xid as (bus id "0000:3b:00", code, pid or None), else None: the
    driver's prefix at the message's start (`start`), by default after a dmesg or syslog line's
    own prefix."""
    if start is None:
        start = _LINE.match(line).end()
    m = _XID.match(line, start)
    if m is None:
        return None
    domain, bus, dev, code, pid = m.groups()
    return (
        "%04x:%s:%s" % (int(domain, 16) & 0xFFFF, bus.lower(), dev.lower()),
        int(code),
        int(pid) if pid and pid.isdigit() else None,
    )


def bus_key(bus_id):
    """NVML's "00000000:3B:00.0" and the kernel's "0000:3b:00" as one key: "0000:3b:00"."""
    text = bus_id.decode() if isinstance(bus_id, bytes) else str(bus_id)
    parts = text.split(":")
    if len(parts) < 3:
        return text.lower()
    try:
        return "%04x:%s:%s" % (int(parts[0], 16) & 0xFFFF, parts[1].lower(), parts[2].split(".")[0].lower())
    except ValueError:
        return text.lower()


def kmsg_record(record):
    """A /dev/kmsg record ("6,1234,5678901,-;NVRM: ...") as (seconds since boot, message)."""
    head, _, msg = record.partition(";")
    fields = head.split(",")
    try:
        return int(fields[2]) / 1e6, msg.split("\n", 1)[0]
    except (IndexError, ValueError):
        return None, msg


def kmsg_xid(record):
    """A /dev/kmsg record's Xid as (seconds since boot or None, (bus, code, pid)), else None: only a
    record of the kernel's own facility (a user's write to /dev/kmsg carries LOG_USER or another,
    never the kernel's) whose message starts with the driver's prefix."""
    pri = record.split(",", 1)[0]
    if not pri.isdigit() or int(pri) >> 3 != KERNEL_FACILITY:
        return None
    since_boot, msg = kmsg_record(record)
    found = parse_xid(msg, 0)
    return None if found is None else (since_boot, found)


class XidWatch:
    """Recent Xid events of this host's GPUs. `events()` is a copy, oldest first: [gpu, ts, code, pid]."""

    def __init__(self, nvml, handles, buses):
        self.nvml = nvml
        self.buses = buses  # bus key -> GPU index (nvmlDeviceGetPciInfo)
        self.recent = deque(maxlen=MAX_EVENTS)
        self.source = None  # "nvml" | "kmsg" | None, with `why` when None
        self.why = None
        self.version = 0  # bumped per event: the sampler sends the list when it changed
        self._lock = threading.Lock()
        self._stop = False
        target = None
        try:
            target = self._nvml_set(handles)
        except Exception as exc:  # an old driver, a binding without the event API
            self.why = "NVML events: %s" % (str(exc) or type(exc).__name__)
        if target is None:
            target = self._kmsg()
        if target is not None:
            threading.Thread(target=target, name="xid", daemon=True).start()

    def _nvml_set(self, handles):
        nvml = self.nvml
        if not hasattr(nvml, "nvmlEventSetCreate") or not handles:
            self.why = "NVML has no event API here"
            return None
        xid = getattr(nvml, "nvmlEventTypeXidCriticalError", 0x8)
        ecc = getattr(nvml, "nvmlEventTypeDoubleBitEccError", 0x2)
        eventset = nvml.nvmlEventSetCreate()
        registered = 0
        for h in handles:
            try:
                supported = (
                    nvml.nvmlDeviceGetSupportedEventTypes(h)
                    if hasattr(nvml, "nvmlDeviceGetSupportedEventTypes")
                    else (xid | ecc)
                )
                want = supported & (xid | ecc)
                if want & xid:
                    nvml.nvmlDeviceRegisterEvents(h, want, eventset)
                    registered += 1
            except nvml.NVMLError:
                continue  # this GPU cannot tell (not supported, or lost): the others still can
        if not registered:
            try:
                nvml.nvmlEventSetFree(eventset)
            except Exception:
                pass
            self.why = "no GPU supports Xid events through NVML"
            return None
        self.source = "nvml"
        self.eventset = eventset
        return self._nvml_loop

    def _nvml_loop(self):
        nvml = self.nvml
        timeout = getattr(nvml, "NVMLError_Timeout", None)
        while not self._stop:
            try:
                data = nvml.nvmlEventSetWait_v2(self.eventset, WAIT_MS)
            except nvml.NVMLError as exc:
                if timeout is not None and isinstance(exc, timeout):
                    continue
                time.sleep(1.0)  # the driver said no: ask again later, never in a tight loop
                continue
            except Exception:
                return
            try:
                index = nvml.nvmlDeviceGetIndex(data.device)
            except Exception:
                index = None
            code = (
                int(data.eventData)
                if data.eventType & getattr(nvml, "nvmlEventTypeXidCriticalError", 0x8)
                else 48
                if data.eventType & getattr(nvml, "nvmlEventTypeDoubleBitEccError", 0x2)
                else int(data.eventData)
            )
            self._add(index, time.time(), code, None)

    def _kmsg(self):
        """The kernel log, where this user may read it (root, or dmesg_restrict off): its records
        from the buffer's start (Xids from before the agent came), then each one as it comes."""
        try:
            fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
        except OSError as exc:
            self.why = (self.why + "; " if self.why else "") + "kernel log: " + (exc.strerror or str(exc))
            return None
        self.source, self.why, self._fd = "kmsg", None, fd
        return self._kmsg_loop

    def _kmsg_loop(self):
        boot = time.time() - time.monotonic()  # the kernel's stamps count from boot, as CLOCK_MONOTONIC does
        while not self._stop:
            try:
                record = os.read(self._fd, 8192).decode("utf-8", "replace")
            except BlockingIOError:
                select.select([self._fd], [], [], WAIT_MS / 1000.0)
                continue
            except OSError as exc:
                if exc.errno == 32:  # EPIPE: records overwritten before they were read; go on
                    continue
                return
            if "Xid" not in record:
                continue
            found = kmsg_xid(record)
            if found is None:
                continue
            since_boot, (bus, code, pid) = found
            self._add(self.buses.get(bus), boot + since_boot if since_boot is not None else time.time(), code, pid)

    def _add(self, index, ts, code, pid):
        with self._lock:
            self.recent.append([index, round(ts, 3), code, pid])
            self.version += 1

    def events(self):
        with self._lock:
            return [list(e) for e in self.recent]

    def close(self):
        self._stop = True
