#!/usr/bin/env bash
# Run 6 on a 2-GPU H200 host (issue 21): the agent's CPU beside `nvidia-smi --query-gpu ... -l 1`
# in the same 60 s window (a 50-process tree, one busy PyTorch process per GPU, the agent before
# issue 21 running beside the current one), one-shot `cockpit snapshot local --json` against
# `nvidia-smi --query-gpu ... --format=csv` (median of 10), the sample's cost against NVML's floor
# with the live agent profiled, and the snapshot's wall time split into its steps. Under ~6 minutes.
#   run(kind="nvidia-h200-x2", carry=[".whl"], command="bash tests/gpu/run_device6.sh")
# What comes back in $OUT: run6.txt (everything printed), agent_vs_smi.json, agent_cost6.json,
# agent6.prof (pstats of the live agent), snapshot_wall6.json.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/run6.txt") 2>&1
date -u
python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 XDG_STATE_HOME=/tmp/run6-state
unset PYTHONDONTWRITEBYTECODE
nvidia-smi --query-gpu=index,name,driver_version,memory.used --format=csv,noheader
python3 -c "import psutil, pynvml, sys; print('python', sys.version.split()[0], 'psutil', psutil.__version__, 'nvidia-ml-py', getattr(pynvml, '__version__', '?'))"
nproc
echo "== a busy PyTorch process per GPU (tests/gpu/tp_job.py)"
setsid python3 tests/gpu/tp_job.py --log /tmp/tp6.log --weights-gb 2 > /tmp/tp6.out 2>&1 &
JOB=$!
for i in $(seq 90); do grep -q "ready to roll" /tmp/tp6.log 2>/dev/null && break; sleep 1; done
grep -c "ready to roll" /tmp/tp6.log || tail -5 /tmp/tp6.out
nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader
echo "== 1. agent vs nvidia-smi --query-gpu -l 1, same 60 s window; one-shot snapshot vs nvidia-smi query"
timeout 200 python3 tests/gpu/agent_vs_smi.py --seconds 60 --tree 50 --runs 10 \
  --before tests/gpu/agent_before_issue21.py.gz --json "$OUT/agent_vs_smi.json"
echo "== 2. sample cost vs NVML's floor; the live agent under cProfile (30 s)"
timeout 120 python3 tests/bench/agent_cost.py --tree 50 --seconds 30 --reps 100 --profile "$OUT/agent6.prof" \
  --json "$OUT/agent_cost6.json" | grep -E "ms|pct|bytes|floor|watched|gpus|nvml"
python3 -c "import pstats; pstats.Stats('$OUT/agent6.prof').sort_stats('tottime').print_stats(16)" | tail -22
echo "== 3. one-shot snapshot wall time, where it goes"
timeout 120 python3 tests/bench/snapshot_wall.py --runs 10 --json "$OUT/snapshot_wall6.json" | grep -vE '"(p90|min)_ms|"runs"'
kill -9 -- "-$JOB" 2>/dev/null  # the job's own process group (setsid), nothing else
sleep 2; nvidia-smi --query-gpu=index,memory.used --format=csv,noheader
date -u; ls -la "$OUT"
