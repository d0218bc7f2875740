"""NVML through ctypes (cockpit/agent/nvml.py) on real GPUs: every function the sampler calls,
per GPU, answers or says it is not supported; beside pynvml's answer where pynvml is importable
(the same figures: static ones equal, live ones close); then the real agent on a bare interpreter
(`--agent PYTHON`, e.g. a `python3 -S -E` wrapper: no pynvml, no psutil) through the local link.

    python3 -S -E tests/gpu/nvml_ctypes_check.py            # the shim alone, nothing importable
    python3 tests/gpu/nvml_ctypes_check.py --agent /tmp/bare-python3 [--json OUT]
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cockpit.agent import nvml as shim  # noqa: E402

# (field, call) in the sampler's order; each call takes (binding, handle).
CALLS = [
    ("name", lambda n, h: n.nvmlDeviceGetName(h)),
    ("uuid", lambda n, h: n.nvmlDeviceGetUUID(h)),
    (
        "mem_v2",
        lambda n, h: (lambda m: {"total": m.total, "used": m.used})(
            n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2)
        ),
    ),
    ("mem_v1", lambda n, h: (lambda m: {"total": m.total, "used": m.used})(n.nvmlDeviceGetMemoryInfo(h))),
    ("power_limit_mw", lambda n, h: n.nvmlDeviceGetEnforcedPowerLimit(h)),
    ("util", lambda n, h: (lambda u: {"gpu": u.gpu, "memory": u.memory})(n.nvmlDeviceGetUtilizationRates(h))),
    ("power_mw", lambda n, h: n.nvmlDeviceGetPowerUsage(h)),
    ("temp_c", lambda n, h: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)),
    ("sm_clock_mhz", lambda n, h: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)),
    (
        "clock_event_reasons",
        lambda n, h: (
            getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None) or n.nvmlDeviceGetCurrentClocksThrottleReasons
        )(h),
    ),
    (
        "ecc_uncorrected_volatile",
        lambda n, h: n.nvmlDeviceGetTotalEccErrors(h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC),
    ),
    ("compute_procs", lambda n, h: sorted([p.pid, p.usedGpuMemory] for p in n.nvmlDeviceGetComputeRunningProcesses(h))),
]


def read_all(n):
    out = {"driver": None, "cuda_driver": None, "gpus": []}
    n.nvmlInit()
    try:
        out["driver"] = n.nvmlSystemGetDriverVersion()
        out["cuda_driver"] = n.nvmlSystemGetCudaDriverVersion_v2()
        for i in range(n.nvmlDeviceGetCount()):
            h = n.nvmlDeviceGetHandleByIndex(i)
            row = {}
            for field, call in CALLS:
                try:
                    value = call(n, h)
                    row[field] = value.decode() if isinstance(value, bytes) else value
                except n.NVMLError_NotSupported:
                    row[field] = "not supported"
                except n.NVMLError as exc:
                    row[field] = "error: %s" % exc
            out["gpus"].append(row)
    finally:
        n.nvmlShutdown()
    for k in ("driver",):
        out[k] = out[k].decode() if isinstance(out[k], bytes) else out[k]
    return out


def through_the_agent(python):
    import asyncio

    from cockpit.host.session import HostSession, SessionOptions
    from cockpit.link.target import parse_target

    async def look():
        session = HostSession(parse_target("local"), SessionOptions(python=python, python_named=True))
        await session.connect()
        try:
            await session.wait_samples(3)
            facts = await session.request("host_facts", items=["versions"])
            return session.state, facts
        finally:
            await session.close()

    state, facts = asyncio.run(look())
    a = state.agent
    return {
        "executable": a.executable,
        "python": a.python,
        "gpu_source": a.gpu_source,
        "nvml": a.nvml,
        "procs_source": a.procs_source,
        "psutil": a.psutil,
        "driver": a.driver,
        "warnings": a.warnings,
        "cuda_driver": (facts.get("versions") or {}).get("data", {}).get("cuda_driver"),
        "gpus": [
            {
                k: getattr(g, k)
                for k in (
                    "index",
                    "name",
                    "uuid",
                    "util_pct",
                    "mem_used_mib",
                    "mem_total_mib",
                    "temp_c",
                    "power_w",
                    "power_limit_w",
                    "sm_clock_mhz",
                    "throttle",
                    "ecc_uncorrected",
                    "processes",
                )
            }
            for g in state.gpus.values()
        ],
        "watched_processes": len(state.procs),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--agent", metavar="PYTHON", help="also run the real agent with this interpreter")
    ap.add_argument("--json")
    args = ap.parse_args()
    res = {"python": sys.version.split()[0], "ctypes": read_all(shim)}
    try:
        import pynvml
    except ImportError:
        res["pynvml"] = "not importable here"
    else:
        res["pynvml_version"] = getattr(pynvml, "__version__", "?")
        res["pynvml"] = read_all(pynvml)
        same, differ = [], []
        for i, (a, b) in enumerate(zip(res["ctypes"]["gpus"], res["pynvml"]["gpus"])):
            for field, _ in CALLS:
                (same if a[field] == b[field] else differ).append("gpu%d.%s" % (i, field))
        res["equal_fields"], res["differing_fields"] = same, differ  # live figures may move between the reads
    if args.agent:
        res["agent"] = through_the_agent(args.agent)
    print(json.dumps(res, indent=1, default=str))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1, default=str))


if __name__ == "__main__":
    main()
