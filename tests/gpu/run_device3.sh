#!/usr/bin/env bash
# Run 3 on the GPU host: the hung NCCL job again with the corrected diagnosis, then `cockpit kill`.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
setsid python3 tests/gpu/tp_job.py --log /tmp/hang.log --weights-gb 8 --hang-rank 1 --hang-after 20 > /tmp/hang.out 2>&1 &
sleep 2
python3 tests/gpu/hang_watch.py --log /tmp/hang.log --out "$OUT" --timeout 120 --no-kill 2>&1 | tee "$OUT/hang3.txt" | grep -v "^t=" ; grep "^t=" "$OUT/hang3.txt" | awk 'NR%4==1' | cut -c1-250
printf 'command: [tests/gpu/tp_job.py]\nengine: sglang\nlog: /tmp/hang.log\nwatch: ["sglang::*", "*tp_job.py*"]\nkill_wait_s: 10\n' > /tmp/tp.yaml
echo "== cockpit kill"; python3 -m cockpit kill local --layout /tmp/tp.yaml --yes; echo "rc=$?"
echo "== after"; nvidia-smi --query-gpu=index,memory.used --format=csv,noheader; ps -eo pid,stat,args | grep -E "sglang|tp_job" | grep -v grep
