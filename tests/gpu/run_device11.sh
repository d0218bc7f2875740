#!/usr/bin/env bash
# Run 11 on one H200 (issue 27, nothing to install on the host): NVML through ctypes on a real GPU
# (every field the sampler reads, beside pynvml's), the real agent on a bare interpreter
# (`python3 -S -E`: no pynvml, no psutil importable) through the local link, then the agent's CPU
# beside `nvidia-smi --query-gpu ... -l 1` in one 60 s window: the agent on pynvml, the agent on
# the bare interpreter (NVML through ctypes) and the agent before the split
# (tests/gpu/agent_before_split.py.gz, 33133be's), with a busy PyTorch process and a 50-process
# tree. Under ~4 minutes. WINDOW=180 widens the CPU window; CPU_ONLY=1 skips steps 1 and 2.
#   run(kind="nvidia-h200", carry=[".whl"], command="bash tests/gpu/run_device11.sh")
# .whl: setproctitle for Python 3.12 (the tree's titles).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
WINDOW=${WINDOW:-60}; CPU_ONLY=${CPU_ONLY:-}
exec > >(tee "$OUT/run11${CPU_ONLY:+-cpu$WINDOW}.txt") 2>&1
date -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=index,name,driver_version,memory.used --format=csv,noheader
python3 -c "import psutil, pynvml, sys; print('python', sys.version.split()[0], 'psutil', psutil.__version__, 'nvidia-ml-py', getattr(pynvml, '__version__', '?'))"
nproc
BARE=/tmp/bare-python3
printf '#!/bin/sh\nexec python3 -S -E "$@"\n' > $BARE; chmod +x $BARE
$BARE -c "import importlib.util as u; print('bare python3 -S -E: pynvml', u.find_spec('pynvml'), '| psutil', u.find_spec('psutil'))"
echo "== a busy PyTorch process on the GPU (tests/gpu/tp_job.py)"
rm -f /tmp/tp11.log  # a warm machine keeps the last run's
setsid python3 tests/gpu/tp_job.py --log /tmp/tp11.log --weights-gb 2 > /tmp/tp11.out 2>&1 &
JOB=$!
for i in $(seq 90); do grep -q "ready to roll" /tmp/tp11.log 2>/dev/null && break; sleep 1; done
grep -c "ready to roll" /tmp/tp11.log || tail -5 /tmp/tp11.out
nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
if [ -z "$CPU_ONLY" ]; then
echo "== 1. the ctypes shim alone on the bare interpreter"
timeout 60 $BARE tests/gpu/nvml_ctypes_check.py --json "$OUT/nvml_ctypes_bare.json" > /dev/null; echo rc=$?
echo "== 2. the shim beside pynvml, and the real agent on the bare interpreter"
timeout 90 python3 tests/gpu/nvml_ctypes_check.py --agent $BARE --json "$OUT/nvml_ctypes11.json"
fi
echo "== 3. CPU, one $WINDOW s window: nvidia-smi -l 1, the agent (pynvml), the agent (bare: ctypes), the agent before the split"
timeout $((WINDOW + 140)) python3 tests/gpu/agent_vs_smi.py --seconds $WINDOW --tree 50 --runs 0 --bare $BARE \
  --before tests/gpu/agent_before_split.py.gz --json "$OUT/agent_vs_smi11${CPU_ONLY:+-$WINDOW}.json"
kill -9 -- "-$JOB" 2>/dev/null  # the job's own process group (setsid), nothing else
date -u; ls -la "$OUT"
