"""The real NVML path against nvidia-smi: the agent's figures and `nvidia-smi --query-gpu`, taken
right after each sample, side by side; and the compute processes the agent lists per GPU.

    python tests/gpu/validate_nvml.py [--samples 5] [--json OUT]
"""

import argparse
import asyncio
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cockpit.host.session import HostSession, SessionOptions, WatchList  # noqa: E402
from cockpit.host.snapshot import snapshot_doc  # noqa: E402
from cockpit.link.target import parse_target  # noqa: E402


def smi(query: str, fields: str) -> list[list[str]]:
    out = subprocess.run(
        ["nvidia-smi", f"--query-{query}={fields}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip()]


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()
    session = HostSession(parse_target("local"), SessionOptions(python=sys.executable), WatchList())
    await session.connect()
    await session.wait_samples(3)
    rows = []
    worst = {"mem_mib": 0, "power_w": 0.0}
    for _ in range(args.samples):
        await session.wait_samples(1)
        gpus = smi("gpu", "index,memory.used,memory.total,power.draw,utilization.gpu")
        apps = smi("compute-apps", "gpu_uuid,pid,used_memory")
        for g in gpus:
            i = int(g[0])
            ours = session.state.gpus[i]
            dm = abs(ours.mem_used_mib - int(g[1]))
            dp = abs(ours.power_w - float(g[3]))
            worst["mem_mib"] = max(worst["mem_mib"], dm)
            worst["power_w"] = max(worst["power_w"], round(dp, 1))
            rows.append(
                {
                    "gpu": i,
                    "agent_mem": ours.mem_used_mib,
                    "smi_mem": int(g[1]),
                    "agent_total": ours.mem_total_mib,
                    "smi_total": int(g[2]),
                    "agent_power": ours.power_w,
                    "smi_power": float(g[3]),
                    "agent_util": ours.util_pct,
                    "smi_util": int(g[4]),
                }
            )
    procs = [
        {"pid": p.pid, "title": p.title, "rank": p.rank, "gpus": p.gpus, "gpu_mem_mib": p.gpu_mem_mib}
        for p in session.state.ranks()
    ]
    smi_apps = {int(a[1]): int(a[2]) for a in apps}
    doc = snapshot_doc(session.state)
    await session.close()
    print(f"agent nvml: {doc['agent']['nvml']}, driver {doc['agent']['driver']}")
    print("| gpu | mem used agent / nvidia-smi (MiB) | total agent / smi | power agent / smi (W) | util agent / smi |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['gpu']} | {r['agent_mem']} / {r['smi_mem']} | {r['agent_total']} / {r['smi_total']} | "
            f"{r['agent_power']} / {r['smi_power']} | {r['agent_util']} / {r['smi_util']} |"
        )
    print(f"largest difference: memory {worst['mem_mib']} MiB, power {worst['power_w']} W")
    print("ranks as the agent lists them (pid, title, rank, gpus, GPU MiB) and nvidia-smi's MiB for that pid:")
    for p in procs:
        print(
            f"  {p['pid']} {p['title']} rank {p['rank']} gpus {p['gpus']} {p['gpu_mem_mib']} MiB | smi {smi_apps.get(p['pid'])}"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"rows": rows, "worst": worst, "procs": procs, "smi_apps": smi_apps, "snapshot": doc}, indent=1)
        )


if __name__ == "__main__":
    asyncio.run(main())
