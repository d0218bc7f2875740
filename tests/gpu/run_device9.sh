#!/usr/bin/env bash
# Run 9 on a 2-GPU H200 host (session 4): the run-finding, flight-recorder and dump rules made
# stricter this session (the run is the server command's own process and what it started; a dump
# pipe is written only when it is a FIFO the rank holds open; dump and flightrec act on the run the
# kill would find), and the log rules, on real NCCL jobs started by hand (not by the cockpit):
# (a) rank 1 stops calling collectives with the forensics env armed: snapshot, flightrec, dump,
# kill; (b) rank 1 dies of a device-side assert: snapshot, explain, kill. Under ~4 minutes.
#   run(kind="nvidia-h200-x2", carry=[".whl"], command="bash tests/gpu/run_device9.sh")
# What comes back in $OUT: run9.txt (everything printed), snapshot-hang9.json, snapshot-die9.json.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D=/tmp/run9; rm -rf "$D" /tmp/fr; mkdir -p "$D" /tmp/fr
exec > >(tee "$OUT/run9.txt") 2>&1
date -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 XDG_STATE_HOME=$D/state
python3 -c "import torch; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version())"
printf 'name: tp\ncommand: [tests/gpu/tp_job.py]\nengine: sglang\nlog: /tmp/tp.log\nwatch: ["sglang::*", "*tp_job.py*"]\nmetrics: false\nstall: {idle_s: 20, spin_s: 20}\nkill_wait_s: 5\n' > /tmp/tp.yaml
FORENSICS=(TORCH_NCCL_TRACE_BUFFER_SIZE=2000 TORCH_FR_BUFFER_SIZE=2000 TORCH_NCCL_DUMP_ON_TIMEOUT=1
  TORCH_NCCL_DEBUG_INFO_PIPE_FILE=/tmp/fr/pipe_rank_ TORCH_NCCL_DEBUG_INFO_TEMP_FILE=/tmp/fr/trace_rank_)
wait_log() { for i in $(seq "$2"); do grep -q "$1" /tmp/tp.log 2>/dev/null && return 0; sleep 1; done; echo "timed out waiting for: $1"; }
show() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); v=d.get('verdict') or {}; print('phase', (d.get('phase') or {}).get('name'), '| verdict', v.get('name'), '| odd rank', v.get('odd_rank'), '| evidence', (v.get('evidence') or [])[:3])" "$1"; }

echo "=================== (a) rank 1 stops calling collectives (forensics on)"
rm -f /tmp/tp.log
env "${FORENSICS[@]}" setsid python3 tests/gpu/tp_job.py --log /tmp/tp.log --weights-gb 2 --hang-rank 1 --hang-after 15 > /tmp/tp.out 2>&1 &
JOB=$!
wait_log "ready to roll" 120
wait_log "odd rank: leaving" 60
ls -la /tmp/fr
sleep 30
echo "== snapshot --wait 8"; python3 -m cockpit snapshot local --layout /tmp/tp.yaml --json --wait 8 > "$OUT/snapshot-hang9.json"; echo "rc=$?"; show "$OUT/snapshot-hang9.json"
echo "== flightrec"; timeout 60 python3 -m cockpit flightrec local --layout /tmp/tp.yaml; echo "rc=$?"; ls -la /tmp/fr
echo "== dump"; timeout 60 python3 -m cockpit dump local --layout /tmp/tp.yaml | head -30; echo "rc=$?"
echo "== kill (no --yes: the plan, refused without a terminal)"; python3 -m cockpit kill local --layout /tmp/tp.yaml < /dev/null | head -20
echo "== kill --yes"; python3 -m cockpit kill local --layout /tmp/tp.yaml --yes | tail -4; echo "rc=$?"
kill -9 -- "-$JOB" 2>/dev/null

echo "=================== (b) rank 1 dies (device-side assert), rank 0 hangs"
rm -f /tmp/tp.log /tmp/fr/*
setsid python3 tests/gpu/tp_job.py --log /tmp/tp.log --weights-gb 2 --die-rank 1 --die-after 10 > /tmp/tp-die.out 2>&1 &
JOB2=$!
wait_log "ready to roll" 120
wait_log "Scheduler hit an exception" 60
sleep 8
echo "== a fresh snapshot --wait 6"; python3 -m cockpit snapshot local --layout /tmp/tp.yaml --json --wait 6 > "$OUT/snapshot-die9.json"; echo "rc=$?"; show "$OUT/snapshot-die9.json"
echo "== explain"; python3 -m cockpit explain /tmp/tp.log; echo "rc=$?"
echo "== kill --yes"; python3 -m cockpit kill local --layout /tmp/tp.yaml --yes | tail -4; echo "rc=$?"
kill -9 -- "-$JOB2" 2>/dev/null  # the job's own process group (setsid), nothing else
date -u; ls -la "$OUT"
