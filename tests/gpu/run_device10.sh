#!/usr/bin/env bash
# Run 10 on one H200 (issue "the first look tells the truth"): a real vLLM-shaped TP-2 serving
# job (tests/gpu/vllm_job.py: two ranks on GPU 0 with gloo all-reduces, /health, /metrics, vLLM's
# stats lines) whose rank 1 stops calling the collective while 8 requests run. A live monitor
# (kept link, as the screen) records when it first says stalled and which rank; cold one-shot
# snapshots (default look, --wait 0, --text) 60 s and 150 s into the stall; explain of the log;
# the ledger-free kill. Under ~6 minutes.
#   run(kind="nvidia-h200", carry=[".whl"], command="bash tests/gpu/run_device10.sh")
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D=/tmp/run10; rm -rf "$D"; mkdir -p "$D"
exec > >(tee "$OUT/run10.txt") 2>&1
date -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 XDG_STATE_HOME=$D/state
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
L=$D/vllm.log; Y=$D/vllm.yaml
printf 'name: vllm-tp2\nengine: vllm\ncommand: [tests/gpu/vllm_job.py, serve]\nlog: %s\nports: [8011]\nendpoints: [/health]\nmetrics: /metrics\nwatch: ["VLLM::*", "*vllm_job.py*"]\nstall: {idle_s: 30, spin_s: 30}\nkill_wait_s: 5\n' "$L" > "$Y"
show() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); v=d.get('verdict') or {}; print('phase', (d.get('phase') or {}).get('name'), '| verdict', v.get('name'), '| detail', v.get('detail'), '| odd rank', v.get('odd_rank'), '| since', v.get('since'), '| looked', d.get('looked_s'), 's'); [print('   ', e) for e in v.get('evidence') or []]" "$1"; }
setsid python3 tests/gpu/vllm_job.py serve --log "$L" --port 8011 --hang-rank 1 --hang-after 35 > $D/job.out 2>&1 &
JOB=$!
for i in $(seq 120); do grep -q "Application startup complete" "$L" 2>/dev/null && break; sleep 1; done
sleep 12
echo "== healthy, cold snapshot (default look)"; python3 -m cockpit snapshot local --layout "$Y" --json > "$OUT/healthy10.json"; echo rc=$?; show "$OUT/healthy10.json"
echo "== live monitor from before the stall"
timeout 150 python3 - "$Y" "$L" <<'PY' &
import asyncio, sys, time
from cockpit.cli import parse_args
from cockpit.cli.attach import build_monitor
args = parse_args(["snapshot", "local", "--layout", sys.argv[1], "--json"])
m = build_monitor(args)
async def go():
    await m.open(kept=True)
    keep = asyncio.create_task(m.keep())
    seen = None
    t0 = time.time()
    while time.time() - t0 < 140:
        v = m.verdict
        if (v.name, v.odd_rank) != seen:
            seen = (v.name, v.odd_rank)
            print(f"live {time.strftime('%H:%M:%S')} ({time.time():.1f}): {v} detail={v.detail}", flush=True)
            for e in v.evidence[:6]:
                print("    ", e, flush=True)
        await asyncio.sleep(0.5)
    keep.cancel()
    await m.close()
asyncio.run(go())
PY
LIVE=$!
for i in $(seq 90); do [ -e "$L.hang-at" ] && break; sleep 1; done
echo "rank 1 left the collective at $(cat $L.hang-at) ($(date -u -d @$(cut -d. -f1 $L.hang-at) +%H:%M:%S))"
sleep 60
echo "== cold snapshot 60 s into the stall (default look)"; python3 -m cockpit snapshot local --layout "$Y" --json > "$OUT/cold60.json"; echo rc=$?; show "$OUT/cold60.json"; date +%s.%N
echo "== cold snapshot --wait 0"; python3 -m cockpit snapshot local --layout "$Y" --json --wait 0 --no-forensics > "$OUT/cold60-instant.json"; echo rc=$?; show "$OUT/cold60-instant.json"
wait $LIVE
sleep 20
echo "== cold snapshot 150 s into the stall (default look), text"; python3 -m cockpit snapshot local --layout "$Y" --json > "$OUT/cold150.json"; echo rc=$?; show "$OUT/cold150.json"
python3 -m cockpit snapshot local --layout "$Y" --text - --size 100x30 --no-forensics | head -8
echo "== explain"; python3 -m cockpit explain "$L" --json | python3 -c "import json,sys; d=json.load(sys.stdin); print(d['phase'], d['verdict'])"
echo "== dumps kept"; find "$D/state" -name groups.txt | head -3; cat "$(find "$D/state" -name groups.txt | head -1)" | head -20
echo "== kill --yes"; python3 -m cockpit kill local --layout "$Y" --yes | tail -3; echo rc=$?
kill -9 -- "-$JOB" 2>/dev/null
tail -5 "$L"
date -u
