#!/usr/bin/env bash
# Run 4 on the GPU host: the fleet view and its JSON on real NVML beside a real TP job (one rank
# per GPU), then `cockpit kill` of the job.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
setsid python3 tests/gpu/tp_job.py --log /tmp/tp.log --weights-gb 8 > /tmp/tp.out 2>&1 &
for i in $(seq 90); do grep -q "ready to roll" /tmp/tp.log 2>/dev/null && break; sleep 1; done
printf 'command: [tests/gpu/tp_job.py]\nengine: sglang\nlog: /tmp/tp.log\nwatch: ["sglang::*", "*tp_job.py*"]\n' > /tmp/tp.yaml
printf 'hosts:\n  - target: local\n    name: h200-box\n    layout: /tmp/tp.yaml\n    python: python3\n' > /tmp/fleet.yaml
echo "== snapshot --fleet"; python3 -m cockpit snapshot --fleet /tmp/fleet.yaml --json --timeout 20 > "$OUT/fleet_h200.json"; echo "rc=$?"
nvidia-smi --query-gpu=index,name,memory.used,power.draw,utilization.gpu --format=csv,noheader | tee "$OUT/smi.txt"
python3 -c "
import json; d = json.load(open('$OUT/fleet_h200.json'))
for h in d['hosts']:
    print(h['name'], h['link'], h['phase'], h['verdict'] and h['verdict']['name'], h['alerts'])
    for g in h['snapshot']['gpus']: print('  GPU', g['index'], g['name'], g['mem_used_mib'], 'MiB', g['power_w'], 'W', g['util_pct'], '%', [p['pid'] for p in g['processes']])
    print('  ranks', [(p['rank'], p['pid'], p['gpu_mem_mib']) for p in h['snapshot']['processes'] if p['rank'] is not None])
"
echo "== fleet screen"; python3 tests/gpu/fleet_watch.py /tmp/fleet.yaml "$OUT/fleet_h200.svg"
echo "== cockpit kill"; python3 -m cockpit kill local --layout /tmp/tp.yaml --yes | tail -4; echo "rc=$?"
nvidia-smi --query-gpu=index,memory.used --format=csv,noheader
