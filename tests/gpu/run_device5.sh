#!/usr/bin/env bash
# Run 5 on a 2-GPU H200 host (no network, no sshd): NCCL RAS, torch's flight recorder and the hang
# bundle on real NCCL jobs. (a) rank 1 stops calling collectives, with the forensics env armed:
# raw RAS answers recorded, `cockpit snapshot`, `cockpit flightrec`, `cockpit bundle`. (b) rank 1
# dies of a device-side assert and stays a zombie while rank 0 hangs: raw RAS, then a fresh
# `cockpit snapshot`. Under ~8 minutes; what comes back (at most 8 files) is in $OUT:
#   run5.txt (everything printed), data.tar.gz (raw RAS answers, flight-recorder dumps, JSON
#   documents: for tests/data), bundle-hang.tar.gz, snapshot-hang.json, snapshot-die.json.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D=/tmp/run5; rm -rf "$D" /tmp/fr; mkdir -p "$D" /tmp/fr
exec > >(tee "$OUT/run5.txt") 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 XDG_STATE_HOME=$D/state
nvidia-smi --query-gpu=index,name,driver_version,memory.used --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version())"
printf 'name: tp\ncommand: [tests/gpu/tp_job.py]\nengine: sglang\nlog: /tmp/tp.log\nwatch: ["sglang::*", "*tp_job.py*"]\nmetrics: false\nstall: {idle_s: 30, spin_s: 30}\nkill_wait_s: 5\n' > /tmp/tp.yaml
FORENSICS=(TORCH_NCCL_TRACE_BUFFER_SIZE=2000 TORCH_FR_BUFFER_SIZE=2000 TORCH_NCCL_DUMP_ON_TIMEOUT=1
  TORCH_NCCL_DEBUG_INFO_PIPE_FILE=/tmp/fr/pipe_rank_ TORCH_NCCL_DEBUG_INFO_TEMP_FILE=/tmp/fr/trace_rank_
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL)
wait_log() { for i in $(seq "$2"); do grep -q "$1" /tmp/tp.log 2>/dev/null && return 0; sleep 1; done; echo "timed out waiting for: $1"; }

echo "=================== (a) rank 1 stops calling collectives (forensics on)"
rm -f /tmp/tp.log
env "${FORENSICS[@]}" setsid python3 tests/gpu/tp_job.py --log /tmp/tp.log --weights-gb 4 --hang-rank 1 --hang-after 25 > /tmp/tp.out 2>&1 &
JOB=$!
wait_log "ready to roll" 120
sleep 8
echo "== RAS while healthy"; python3 tests/gpu/forensics.py ras "$D/data" healthy "healthy two-rank job, all-reduce per step"
ss -ltnp 2>/dev/null | grep -E ":28028" | head -4
wait_log "odd rank: leaving" 60
sleep 45
echo "== RAS 45 s into the hang"; python3 tests/gpu/forensics.py ras "$D/data" hang "rank 1 stopped calling collectives 45 s ago, rank 0 waits in the all-reduce"
echo "== cockpit snapshot local --json --wait 12"
python3 -m cockpit snapshot local --layout /tmp/tp.yaml --json --wait 12 > "$OUT/snapshot-hang.json"; echo "rc=$?"
python3 tests/gpu/forensics.py show "$OUT/snapshot-hang.json"
echo "== cockpit flightrec local"; python3 -m cockpit flightrec local --layout /tmp/tp.yaml; echo "rc=$?"
python3 -m cockpit flightrec local --layout /tmp/tp.yaml --no-trigger --json > "$D/data/flightrec.json"; echo "rc=$?"
ls -la /tmp/fr; python3 tests/gpu/forensics.py fr "$D/data"
echo "== cockpit bundle local --json"
python3 -m cockpit bundle local --layout /tmp/tp.yaml --json > "$D/data/bundle.json"; echo "rc=$?"; cat "$D/data/bundle.json"
cp "$(python3 -c "import json; print(json.load(open('$D/data/bundle.json'))['path'])")" "$OUT/bundle-hang.tar.gz"
tar -xzOf "$OUT/bundle-hang.tar.gz" --wildcards '*/manifest.json' | head -80
tar -xzOf "$OUT/bundle-hang.tar.gz" --wildcards '*/stacks/groups.txt' | head -40
grep -c "NCCL INFO" /tmp/tp.out; tail -3 /tmp/tp.out | cut -c1-200
python3 -m cockpit kill local --layout /tmp/tp.yaml --yes | tail -3
kill -9 -- "-$JOB" 2>/dev/null

echo "=================== (b) rank 1 dies (device-side assert), a zombie; rank 0 hangs"
rm -f /tmp/tp.log /tmp/fr/*
env "${FORENSICS[@]}" setsid python3 tests/gpu/tp_job.py --log /tmp/tp.log --weights-gb 4 --die-rank 1 --die-after 20 > /tmp/tp-die.out 2>&1 &
JOB2=$!
wait_log "ready to roll" 120
wait_log "Scheduler hit an exception" 60
grep -A3 "Scheduler hit an exception" /tmp/tp.log | head -8
sleep 15
ps -eo pid,ppid,stat,args | grep -E "sglang|tp_job" | grep -v grep
echo "== RAS with a dead rank"; python3 tests/gpu/forensics.py ras "$D/data" dead "rank 1 died of a device-side assert 15 s ago (zombie), rank 0 waits in the all-reduce"
echo "== a fresh cockpit: snapshot local --json --wait 8"
python3 -m cockpit snapshot local --layout /tmp/tp.yaml --json --wait 8 > "$OUT/snapshot-die.json"; echo "rc=$?"
python3 tests/gpu/forensics.py show "$OUT/snapshot-die.json"
echo "== cockpit dump local (the dead rank reported dead, not as a py-spy error)"
python3 -m cockpit dump local --layout /tmp/tp.yaml --json > "$D/data/dump-die.json"; echo "rc=$?"
python3 -c "import json; d=json.load(open('$D/data/dump-die.json')); print('dead', d.get('dead')); print('failed', d.get('failed')); print('groups', [(g['ranks'], g['frames'][:3]) for g in d.get('groups', [])])"
echo "== cockpit explain /tmp/tp.log (the post-mortem without a host)"
cp /tmp/tp.log "$D/data/tp-die.log"; python3 -m cockpit explain /tmp/tp.log; echo "rc=$?"
python3 -m cockpit kill local --layout /tmp/tp.yaml --yes | tail -3
kill -9 -- "-$JOB2" 2>/dev/null  # the job's own process group (setsid), nothing else
tar -czf "$OUT/data.tar.gz" -C "$D" data
ls -la "$OUT"
