"""Issue 28 on a real GPU: every NVML call the GPU's own word needs answers or says it is not
supported, through the ctypes shim (cockpit/agent/nvml.py) and pynvml alike; the event set
registers and waits (a timeout when no Xid comes); the sampler's slow-clock round, timed; the
real agent's hello and sample through the local link.

    python3 tests/gpu/gpu_word_check.py [--json OUT]
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cockpit.agent import (
    gpus as agent_gpus,  # noqa: E402
    nvml as shim,  # noqa: E402
    xid as agent_xid,  # noqa: E402
)


def answer(n, fn, *args):
    try:
        value = fn(*args)
    except n.NVMLError as exc:
        ns = getattr(n, "NVMLError_NotSupported", None)
        return "not supported" if ns is not None and isinstance(exc, ns) else "error: %s" % exc
    if isinstance(value, bytes):
        return value.decode()
    if hasattr(value, "busId"):
        return {"busId": value.busId.decode() if isinstance(value.busId, bytes) else value.busId, "bus": value.bus}
    return value


def calls(n):
    out = {"gpus": []}
    n.nvmlInit()
    try:
        for i in range(n.nvmlDeviceGetCount()):
            h = n.nvmlDeviceGetHandleByIndex(i)
            row = {
                "index": answer(n, n.nvmlDeviceGetIndex, h),
                "pci": answer(n, n.nvmlDeviceGetPciInfo, h),
                "remapped_rows": answer(n, n.nvmlDeviceGetRemappedRows, h),
                "retired_pages_pending": answer(n, n.nvmlDeviceGetRetiredPagesPendingStatus, h),
                "ecc_uncorrected_volatile": answer(n, n.nvmlDeviceGetTotalEccErrors, h, 1, 0),
                "ecc_uncorrected_aggregate": answer(n, n.nvmlDeviceGetTotalEccErrors, h, 1, 1),
                "pcie_replay": answer(n, n.nvmlDeviceGetPcieReplayCounter, h),
                "clock_event_reasons": answer(
                    n,
                    getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None)
                    or n.nvmlDeviceGetCurrentClocksThrottleReasons,
                    h,
                ),
                "supported_event_types": answer(n, n.nvmlDeviceGetSupportedEventTypes, h),
                "nvlink_state": [answer(n, n.nvmlDeviceGetNvLinkState, h, link) for link in range(18)],
            }
            active = [link for link, s in enumerate(row["nvlink_state"]) if s == 1]
            row["nvlink_errors_link0"] = {
                name: answer(n, n.nvmlDeviceGetNvLinkErrorCounter, h, active[0] if active else 0, code)
                for name, code in (("replay", 0), ("recovery", 1), ("crc_flit", 2))
            }
            started = time.perf_counter()
            s = n.nvmlEventSetCreate()
            try:
                want = (row["supported_event_types"] if isinstance(row["supported_event_types"], int) else 0xB) & 0xB
                n.nvmlDeviceRegisterEvents(h, want, s)
                row["event_registered"] = hex(want)
                t0 = time.perf_counter()
                try:
                    data = n.nvmlEventSetWait_v2(s, 1500)
                    row["event_wait"] = {"eventType": data.eventType, "eventData": data.eventData}
                except n.NVMLError as exc:
                    row["event_wait"] = "%s after %.0f ms" % (type(exc).__name__, (time.perf_counter() - t0) * 1000)
            except n.NVMLError as exc:
                row["event_registered"] = "error: %s" % exc
            finally:
                n.nvmlEventSetFree(s)
            row["event_set_total_ms"] = round((time.perf_counter() - started) * 1000, 1)
            out["gpus"].append(row)
    finally:
        n.nvmlShutdown()
    return out


def sampler(n):
    g = agent_gpus.NvmlGpus(n)
    try:
        rounds = []
        for _ in range(20):
            t0 = time.perf_counter()
            g._health_round()
            rounds.append((time.perf_counter() - t0) * 1000)
        fast = []
        for _ in range(20):
            t0 = time.perf_counter()
            g.sample(False)
            fast.append((time.perf_counter() - t0) * 1000)
        rounds.sort()
        fast.sort()
        return {
            "gpus": len(g.handles),
            "health_first_ms": g.health_first_ms,
            "health_ms": g.health_ms,
            "health_round_ms_median": round(rounds[len(rounds) // 2], 3),
            "health_round_ms_max": round(rounds[-1], 3),
            "sample_ms_median_without_slow": round(fast[len(fast) // 2], 3),
            "active_links": g._links,
            "unsupported": [sorted(u) for u in g.unsupported],
            "health": g.health,
            "lost": g.lost,
            "xid_source": g.xid.source,
            "xid_why": g.xid.why,
            "events": g.xid.events(),
        }
    finally:
        g.close()


def kmsg():
    """The kernel-log fallback where NVML gives no events: readable here? how many Xid lines?"""
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        return {"readable": False, "why": str(exc)}
    n = xids = 0
    try:
        while True:
            try:
                rec = os.read(fd, 8192).decode("utf-8", "replace")
            except BlockingIOError:
                break
            except OSError:
                continue
            n += 1
            if agent_xid.parse_xid(agent_xid.kmsg_record(rec)[1]):
                xids += 1
    finally:
        os.close(fd)
    return {"readable": True, "records": n, "xid_lines": xids}


def through_the_agent():
    import asyncio

    from cockpit.host.session import HostSession, SessionOptions
    from cockpit.link.target import parse_target

    async def look():
        session = HostSession(parse_target("local"), SessionOptions(python=sys.executable, python_named=True))
        await session.connect()
        try:
            await session.wait_samples(3)
            return session.state
        finally:
            await session.close()

    st = asyncio.run(look())
    return {
        "xid_source": st.agent.xid_source,
        "health_ms": st.agent.health_ms,
        "nvml": st.agent.nvml,
        "gpus": [
            {
                k: getattr(g, k)
                for k in (
                    "index",
                    "lost",
                    "ecc_uncorrected",
                    "ecc_aggregate",
                    "remap_corrected",
                    "remap_uncorrected",
                    "remap_pending",
                    "remap_failure",
                    "retired_pending",
                    "nvlink_replay",
                    "nvlink_recovery",
                    "nvlink_crc",
                    "pcie_replay",
                    "throttle",
                )
            }
            for g in st.gpus.values()
        ],
        "xid": [vars(e) for e in st.xid],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    res = {"python": sys.version.split()[0], "ctypes": calls(shim), "sampler_ctypes": sampler(shim)}
    try:
        import pynvml
    except ImportError:
        res["pynvml"] = "not importable here"
    else:
        res["pynvml_version"] = getattr(pynvml, "__version__", "?")
        res["pynvml"] = calls(pynvml)
        res["sampler_pynvml"] = sampler(pynvml)
    res["kmsg"] = kmsg()
    res["agent"] = through_the_agent()
    text = json.dumps(res, indent=1, default=str)
    print(text)
    if args.json:
        Path(args.json).write_text(text)


if __name__ == "__main__":
    main()
