#!/usr/bin/env bash
# Run 14 on one H200 (issue 27): the cockpit's UI process in a real terminal (tmux 160x50, 1 s
# refresh), beside nvitop in another, over one 60 s window each: first the quiet GPU, then beside a
# busy PyTorch job titled like an SGLang rank (tests/gpu/tp_job.py), which the cockpit shows.
# Under ~5 minutes.
#   run(kind="nvidia-h200", carry=[".whl"], command="bash tests/gpu/run_device14.sh")
# .whl: `../shared/tools/device-wheels textual==8.2.8 rich==15.0.0 platformdirs linkify-it-py
# uc-micro-py mdit-py-plugins nvitop setproctitle prometheus-client==0.26.0 asyncssh cryptography
# cffi pycparser` (the machine has psutil, pyyaml, nvidia-ml-py and rich's own dependencies).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
WINDOW=${WINDOW:-60}
exec > >(tee "$OUT/run14.txt") 2>&1
date -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
python3 -c "import sys, textual, rich, pynvml, psutil; print('python', sys.version.split()[0], 'textual', textual.__version__)"
nvidia-smi --query-gpu=index,name,driver_version,utilization.gpu,memory.used --format=csv,noheader
tmux -V; nproc; ls /proc | grep -c '^[0-9]'
python3 -m compileall -q cockpit /tmp/site > /dev/null 2>&1  # bytecode cached, as an installed package has it
echo "== 1. quiet GPU, $WINDOW s"
timeout $((WINDOW + 90)) python3 tests/gpu/ui_beside_nvitop.py --seconds $WINDOW --label quiet --json "$OUT/ui14_quiet.json"
echo "== 2. beside a busy PyTorch job (tests/gpu/tp_job.py), $WINDOW s"
rm -f /tmp/tp14.log
setsid python3 tests/gpu/tp_job.py --log /tmp/tp14.log --weights-gb 2 > /tmp/tp14.out 2>&1 &
JOB=$!
for i in $(seq 90); do grep -q "ready to roll" /tmp/tp14.log 2>/dev/null && break; sleep 1; done
grep -c "ready to roll" /tmp/tp14.log || tail -5 /tmp/tp14.out
nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader
timeout $((WINDOW + 90)) python3 tests/gpu/ui_beside_nvitop.py --seconds $WINDOW --label "beside a job" --json "$OUT/ui14_job.json"
nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader
kill -9 -- "-$JOB" 2>/dev/null  # the job's own process group (setsid), nothing else
date -u; ls -la "$OUT"
