#!/usr/bin/env bash
# Run 2 on the GPU host: re-validate NVML memory (v2), re-measure the agent's cost beside nvidia-smi,
# nvitop and gpustat, then the hung NCCL job watched, dumped and killed through the cockpit.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
which py-spy; nvidia-smi --query-gpu=index,memory.used --format=csv
setsid python3 tests/gpu/tp_job.py --log /tmp/tp.log --weights-gb 8 > /tmp/tp.out 2>&1 &
for i in $(seq 60); do grep -q "ready to roll" /tmp/tp.log 2>/dev/null && break; sleep 1; done; sleep 4
echo "== validate NVML"; python3 tests/gpu/validate_nvml.py --samples 3 | tail -12
echo "== sample cost"; python3 tests/bench/agent_cost.py --tree 50 --seconds 30 --json "$OUT/agent_cost2.json" | grep -E "ms|pct|bytes|floor"
echo "== host cost"; python3 tests/gpu/host_cost.py --seconds 60 --json "$OUT/host_cost2.json"
pkill -9 -f "sglang::scheduler"; pkill -9 -f tp_job.py; sleep 3
echo "== hung job"; nvidia-smi --query-gpu=index,memory.used --format=csv,noheader
setsid python3 tests/gpu/tp_job.py --log /tmp/hang.log --weights-gb 8 --hang-rank 1 --hang-after 20 > /tmp/hang.out 2>&1 &
sleep 2
python3 tests/gpu/hang_watch.py --log /tmp/hang.log --out "$OUT" --timeout 150 2>&1 | tee "$OUT/hang.txt" | grep -v "^t=" ; grep "^t=" "$OUT/hang.txt" | awk 'NR%5==1' | cut -c1-330
echo "== after"; nvidia-smi --query-gpu=index,memory.used --format=csv,noheader; ps -eo pid,stat,args | grep -E "sglang|tp_job" | grep -v grep
