#!/usr/bin/env bash
# Run 7 on a 2-GPU H200 host (issue 21, the scan keeping settled rows): the agent's CPU beside
# `nvidia-smi --query-gpu ... -l 1` in one 150 s window (a 50-process tree, one busy PyTorch
# process per GPU), with the agent of the commit before (tests/gpu/agent_before_scan_rows.py.gz)
# running beside it; then the live agent under cProfile. Under ~5 minutes.
#   run(kind="nvidia-h200-x2", carry=[".whl"], command="RUN=8 bash tests/gpu/run_device7.sh")
# What comes back in $OUT: runN.txt (everything printed), agent_vs_smiN.json, agent_costN.json,
# agentN.prof (N: $RUN, default 7).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; N=${RUN:-7}
exec > >(tee "$OUT/run$N.txt") 2>&1
date -u
python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 XDG_STATE_HOME=/tmp/run$N-state
unset PYTHONDONTWRITEBYTECODE
nvidia-smi --query-gpu=index,name,driver_version,memory.used --format=csv,noheader
python3 -c "import psutil, pynvml, sys; print('python', sys.version.split()[0], 'psutil', psutil.__version__, 'nvidia-ml-py', getattr(pynvml, '__version__', '?'))"
echo "cores $(nproc), processes $(ls -d /proc/[0-9]* | wc -l), threads $(ls -d /proc/[0-9]*/task/[0-9]* | wc -l), pid_max $(cat /proc/sys/kernel/pid_max)"
echo "== a busy PyTorch process per GPU (tests/gpu/tp_job.py)"
setsid python3 tests/gpu/tp_job.py --log /tmp/tp$N.log --weights-gb 2 > /tmp/tp$N.out 2>&1 &
JOB=$!
for i in $(seq 90); do grep -q "ready to roll" /tmp/tp$N.log 2>/dev/null && break; sleep 1; done
grep -c "ready to roll" /tmp/tp$N.log || tail -5 /tmp/tp$N.out
echo "processes now $(ls -d /proc/[0-9]* | wc -l), newest pid $(awk '{print $5}' /proc/loadavg)"
echo "== 1. agent vs nvidia-smi --query-gpu -l 1 and the agent before, same 150 s window"
timeout 260 python3 tests/gpu/agent_vs_smi.py --seconds 150 --tree 50 --runs 5 \
  --before tests/gpu/agent_before_scan_rows.py.gz --json "$OUT/agent_vs_smi$N.json"
echo "newest pid $(awk '{print $5}' /proc/loadavg)"
echo "== 2. the live agent under cProfile (30 s)"
timeout 120 python3 tests/bench/agent_cost.py --tree 50 --seconds 30 --reps 100 --profile "$OUT/agent$N.prof" \
  --json "$OUT/agent_cost$N.json" | grep -E "ms|pct|bytes|floor|watched|gpus|nvml"
python3 -c "import pstats; pstats.Stats('$OUT/agent$N.prof').sort_stats('tottime').print_stats(14)" | tail -20
kill -9 -- "-$JOB" 2>/dev/null  # the job's own process group (setsid), nothing else
sleep 2; nvidia-smi --query-gpu=index,memory.used --format=csv,noheader
date -u; ls -la "$OUT"
