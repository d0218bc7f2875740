#!/usr/bin/env bash
# Run 12 on one H200 (issue 28, the GPU's own word): every new NVML call answers or says it is not
# supported, through the ctypes shim and pynvml; the event set registers and waits; the slow-clock
# round timed; the real agent's hello (xid_source, health_ms) and health fields. Under a minute.
#   run(kind="nvidia-h200", command="bash tests/gpu/run_device12.sh")
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/run12.txt") 2>&1
date -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=index,name,driver_version,pci.bus_id,ecc.errors.uncorrected.volatile.total,retired_pages.pending,remapped_rows.pending --format=csv,noheader
nvidia-smi nvlink -s 2>&1 | head -5
timeout 120 python3 tests/gpu/gpu_word_check.py --json "$OUT/gpu_word12.json" > /dev/null; echo rc=$?
python3 - "$OUT/gpu_word12.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for k in ("ctypes", "pynvml"):
    if isinstance(d.get(k), dict):
        for g in d[k]["gpus"]:
            print(k, {x: y for x, y in g.items() if x != "nvlink_state"}, "nvlink_state:", g["nvlink_state"])
for k in ("sampler_ctypes", "sampler_pynvml"):
    if k in d:
        s = d[k]
        print(k, {x: s[x] for x in ("health_first_ms", "health_ms", "health_round_ms_median", "health_round_ms_max",
                                    "sample_ms_median_without_slow", "xid_source", "xid_why", "unsupported", "health")})
print("kmsg", d["kmsg"]); print("agent", d["agent"])
PY
date -u
