#!/usr/bin/env bash
# Run 13 on one H200 (issue 27: the agent at most 2x nvidia-smi's query loop, beside nvitop): with a
# busy PyTorch process on the GPU (tests/gpu/tp_job.py) and a 50-process tree, one WINDOW-second
# window (150 s unless told) measures side by side, from /proc/PID/stat's clock ticks and every
# thread's schedstat nanoseconds: `nvidia-smi --query-gpu=... --format=csv -l 1`, nvitop at a 1 s
# refresh in a tmux window (and that tmux server, its terminal, apart), the current agent (pynvml,
# and on a bare `python3 -S -E`: NVML through ctypes) and the agent before the issue-27 cost work
# (tests/gpu/agent_before_run13.zip.gz: e24aaa4's modules as the zip that travels). Then the current
# agent alone under cProfile for 30 s (what is left; NO_PROFILE=1 skips it). Under 6 minutes. RUN=13b
# names the output files of a second run; BEFORE=FILE runs another older agent as "before", and EXTRA
# adds agent_vs_smi.py options (run 15: BEFORE=tests/gpu/agent_before_run15.zip.gz, ad56e3c's
# modules, and EXTRA="--ras-every 10": the current agent once more, polling NCCL's RAS every 10 s).
#   run(kind="nvidia-h200", carry=[".whl"], command="bash tests/gpu/run_device13.sh")
# .whl: nvitop (1.7.2, pure Python: the host has psutil and nvidia-ml-py) and setproctitle, for
# Python 3.12.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
WINDOW=${WINDOW:-150}; RUN=${RUN:-13}; BEFORE=${BEFORE:-tests/gpu/agent_before_run13.zip.gz}; EXTRA=${EXTRA:-}
exec > >(tee "$OUT/run$RUN.txt") 2>&1
date -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=index,name,driver_version,memory.used --format=csv,noheader
python3 -c "import psutil, pynvml, nvitop, sys; print('python', sys.version.split()[0], 'psutil', psutil.__version__, 'nvidia-ml-py', getattr(pynvml, '__version__', '?'), 'nvitop', nvitop.__version__)"
echo "kernel $(uname -r), cores $(nproc), processes $(ls /proc | grep -c '^[0-9]'), $(tmux -V)"
BARE=/tmp/bare-python3
printf '#!/bin/sh\nexec python3 -S -E "$@"\n' > $BARE; chmod +x $BARE
echo "== a busy PyTorch process on the GPU (tests/gpu/tp_job.py)"
rm -f /tmp/tp$RUN.log  # a warm machine keeps the last run's
setsid python3 tests/gpu/tp_job.py --log /tmp/tp$RUN.log --weights-gb 2 > /tmp/tp$RUN.out 2>&1 &
JOB=$!
for i in $(seq 90); do grep -q "ready to roll" /tmp/tp$RUN.log 2>/dev/null && break; sleep 1; done
grep -c "ready to roll" /tmp/tp$RUN.log || tail -5 /tmp/tp$RUN.out
nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader
echo "== nvitop at a 1 s refresh in a tmux window"
tmux kill-server 2>/dev/null
tmux new-session -d -s nvitop -x 200 -y 50 "exec python3 -m nvitop --monitor full --interval 1"
sleep 5
NVITOP=$(tmux list-panes -t nvitop -F '#{pane_pid}' 2>/dev/null | head -1)
TMUXSRV=$(tmux display-message -p -t nvitop '#{pid}' 2>/dev/null)
ps -o pid,etime,args -p "${NVITOP:-1},${TMUXSRV:-1}"
WATCH=()
if [ -n "$NVITOP" ] && kill -0 "$NVITOP" 2>/dev/null; then
  WATCH=(--watch "nvitop --monitor full --interval 1 (tmux window)=$NVITOP" --watch "tmux server (nvitop's terminal)=$TMUXSRV")
  tmux capture-pane -p -t nvitop > "$OUT/nvitop_screen_start$RUN.txt"; head -12 "$OUT/nvitop_screen_start$RUN.txt"
else
  echo "nvitop did not stay up: measured without it"; tmux capture-pane -p -t nvitop 2>/dev/null | tail -20
fi
echo "== 1. CPU, one $WINDOW s window: nvidia-smi -l 1, nvitop, the agent (pynvml, bare), the agent before"
timeout $((WINDOW + 150)) python3 tests/gpu/agent_vs_smi.py --seconds $WINDOW --tree 50 --runs 0 --bare $BARE \
  --before "$BEFORE" $EXTRA "${WATCH[@]}" --json "$OUT/agent_vs_smi$RUN.json"
[ -n "$NVITOP" ] && tmux capture-pane -p -t nvitop > "$OUT/nvitop_screen_end$RUN.txt" 2>/dev/null
tmux kill-server 2>/dev/null
nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader
if [ -z "${NO_PROFILE:-}" ]; then
echo "== 2. the current agent alone under cProfile (30 s)"
timeout 150 python3 tests/bench/agent_cost.py --tree 50 --seconds 30 --profile "$OUT/agent$RUN.prof" \
  --json "$OUT/agent_cost$RUN.json" > /dev/null
python3 - "$OUT/agent$RUN.prof" "$OUT/agent_cost$RUN.json" <<'PY'
import json, pstats, sys
print(json.dumps(json.load(open(sys.argv[2])), indent=1))
pstats.Stats(sys.argv[1]).sort_stats("tottime").print_stats(22)
PY
fi
kill -9 -- "-$JOB" 2>/dev/null  # the job's own process group (setsid), nothing else
date -u; ls -la "$OUT"
