"""Helpers of tests/gpu/run_device5.sh (the RAS / flight recorder / bundle run on H200s).

python tests/gpu/forensics.py ras DIR LABEL WHAT     # record RAS json + text answers, with a header
python tests/gpu/forensics.py show SNAPSHOT.json     # verdict, evidence, odd rank, RAS skews
python tests/gpu/forensics.py fr DIR                 # copy the flight-recorder dumps, compare them
"""

import glob
import json
import os
import shutil
import sys
import time

from cockpit.agent import flightrec as agent_flightrec, ras as agent_ras


def header(what, fmt):
    import platform

    try:
        import torch

        tv = f"PyTorch {torch.__version__}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}"
        gpus = f"{torch.cuda.device_count()}x {torch.cuda.get_device_name(0)}"
    except Exception as exc:  # the header says what it could not learn
        tv, gpus = f"torch unknown ({exc})", "GPUs unknown"
    return (
        f"# NCCL RAS VERBOSE STATUS, {fmt} format: {what}\n"
        f"# Recorded by tests/gpu/run_device5.sh on {gpus}, {tv}, Python {platform.python_version()}, "
        f"{time.strftime('%Y-%m-%d %H:%M:%S')}. Verbatim.\n#---\n"
    )


def record_ras(folder, label, what):
    os.makedirs(folder, exist_ok=True)
    for fmt in ("json", "text"):
        ans = agent_ras.ras_query("127.0.0.1", agent_ras.RAS_PORT, fmt, timeout=30)
        ext = "json.txt" if fmt == "json" else "txt"
        path = os.path.join(folder, f"ras-{label}.{ext}")
        with open(path, "w") as fh:
            fh.write(header(what, ans.get("format") or fmt) + (ans.get("text") or f"(no answer: {ans.get('error')})\n"))
        print(
            f"{path}: format={ans.get('format')} ms={ans.get('ms')} error={ans.get('error')} "
            f"json_error={ans.get('json_error')} bytes={len(ans.get('text') or '')}"
        )
        print((ans.get("text") or "")[:1500])


def show(path):
    doc = json.load(open(path))
    v = doc.get("verdict") or {}
    print(f"phase={doc.get('phase')} verdict={v.get('name')} odd_rank={v.get('odd_rank')}")
    for line in v.get("evidence") or []:
        print("   ", line)
    r = doc.get("ras") or {}
    print(
        f"ras: format={r.get('format')} nccl={r.get('nccl_version')} still_s={r.get('still_s')} "
        f"skews={r.get('skews')} error={r.get('error')}"
    )
    for c in r.get("communicators") or []:
        print("   comm", c["hash"], [(x["rank"], x["pid"], x["counts"]) for x in c["ranks"]], c["missing"])
    print("ranks:", [(p["rank"], p["pid"], p["status"], p["alive"]) for p in doc["processes"] if p["rank"] is not None])
    print("ports:", doc.get("ports"))


def fr(folder):
    os.makedirs(folder, exist_ok=True)
    from cockpit.read import flightrec

    dumps = {}
    for path in sorted(glob.glob("/tmp/fr/trace_rank_*")):
        rank = int(path.rsplit("_", 1)[1])
        shutil.copy(path, os.path.join(folder, f"fr-rank{rank}.pickle"))
        data = open(path, "rb").read()
        dumps[rank] = agent_flightrec.slim_fr_dump(agent_flightrec.read_fr_dump(data))
        print(
            f"rank {rank}: {len(data)} bytes, version {dumps[rank]['version']}, "
            f"{dumps[rank]['entries_total']} entries, pg_status {dumps[rank]['pg_status']}"
        )
        for e in dumps[rank]["entries"][-3:]:
            print("   ", {k: e.get(k) for k in ("collective_seq_id", "profiling_name", "state", "process_group")})
    print(json.dumps(flightrec.compare(dumps), indent=1, default=str))


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "ras":
        record_ras(sys.argv[2], sys.argv[3], sys.argv[4])
    elif cmd == "show":
        show(sys.argv[2])
    elif cmd == "fr":
        fr(sys.argv[2])
