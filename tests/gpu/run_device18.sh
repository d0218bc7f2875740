#!/usr/bin/env bash
# Run 18 on one H200 (the monitor's one door; a run boundary the host state reports): run 16's loop
# again now that every launch, resume and adoption comes through `Monitor.follow` (a real
# vLLM-shaped TP-2 job, tests/gpu/vllm_job.py, two gloo ranks on GPU 0, launched by `cockpit launch`
# with rank 1 stopping while the ranks capture CUDA graphs; a cold look with no ledger; the relaunch
# with the flag set off); then a run started by hand, watched by the cockpit's screen (in tmux) and
# `cockpit exporter`, killed by hand (SIGKILL to its group, a crash) and started again by hand into
# the same log: what each said, phase included. Under ~7 minutes.
#   run(kind="nvidia-h200", carry=[".whl"], command="bash tests/gpu/run_device18.sh")
# .whl: `../shared/tools/device-wheels textual==8.2.8 rich==15.0.0 platformdirs linkify-it-py
# uc-micro-py mdit-py-plugins setproctitle prometheus-client==0.26.0 asyncssh cryptography cffi
# pycparser py-spy`
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/run18.txt") 2>&1
source tests/gpu/device_env.sh
export XDG_STATE_HOME=/tmp/st18
JOB=$PWD/tests/gpu/vllm_job.py
cat > /tmp/hang18.yaml <<EOF
name: hang18
engine: vllm
python: python3
command: [$JOB, serve]
base_flags: [--log, /dev/stdout, --port, "8018", --weights-gb, "2"]
flag_sets:
  hang: [--capture-hang-rank, "1"]
enabled: [hang]
env: {MASTER_PORT: "29518"}
log_dir: /tmp/runs18
ports: [8018]
kill_wait_s: 5
stall: {idle_s: 20, spin_s: 20}
EOF
echo "== 1. cockpit launch: rank 1 stops while capturing CUDA graphs"
start=$(date +%s.%N)
python3 -m cockpit launch local --layout /tmp/hang18.yaml --yes --timeout 240; code=$?
echo "exit status $code after $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s"
ss -ltnp | grep -E "29518|8018" || true
echo "== 2. a cold look from another process, with no ledger at all (the host's record only)"
rm -rf /tmp/st18/gpu-cockpit/ledger /tmp/st18/gpu-cockpit/runs
start=$(date +%s.%N)
python3 -m cockpit snapshot local --layout /tmp/hang18.yaml --json > "$OUT/cold18.json"; echo "exit status $?"
echo "cold look took $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s"
python3 - "$OUT/cold18.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
v = d["verdict"]
print("verdict:", v["name"], "odd rank:", v["odd_rank"], "looked_s:", d.get("looked_s"))
for e in v["evidence"]:
    print("  ", e)
print("ranks:", [(p["pid"], p.get("rank"), p["name"]) for p in d["processes"] if p.get("rank") is not None])
EOF
echo "== 3. relaunch with the flag set off"
python3 -m cockpit launch local --layout /tmp/hang18.yaml --off hang --yes --timeout 240; echo "exit status $?"
python3 -m cockpit kill local --layout /tmp/hang18.yaml --yes | tail -3
echo "== 4. a run started by hand, watched, killed by hand and started again by hand into the same log"
cat > /tmp/follow18.yaml <<EOF
name: follow18
engine: vllm
python: python3
command: [$JOB, serve]
log: /tmp/byhand18.log
ports: [8019]
kill_wait_s: 5
stall: {idle_s: 40, spin_s: 40}
EOF
rm -f /tmp/byhand18.log
MASTER_PORT=29519 setsid python3 "$JOB" serve --log /tmp/byhand18.log --port 8019 > /tmp/byhand18.out 2>&1 &
FIRST=$!
for i in $(seq 120); do grep -q "startup complete" /tmp/byhand18.log 2>/dev/null && break; sleep 1; done
tmux new-session -d -s s18 -x 160 -y 50 "python3 -m cockpit local --layout /tmp/follow18.yaml"
python3 -m cockpit exporter --hosts local --layout /tmp/follow18.yaml --interval 1 --listen 127.0.0.1:9518 \
  > /tmp/exporter18.log 2>&1 &
EXP=$!
python3 - > "$OUT/watch18.txt" <<'PY' &
import re, subprocess, time, urllib.request
last = None
end = time.time() + 150
while time.time() < end:
    try:
        text = urllib.request.urlopen("http://127.0.0.1:9518/metrics", timeout=3).read().decode()
        m = re.search(r'gpu_cockpit_verdict\{host="local",state="([^"]+)"\} 1\.0', text)
        p = re.search(r'gpu_cockpit_phase\{host="local",state="([^"]+)"\} 1\.0', text)
        exp = (m.group(1) if m else None, p.group(1) if p else None)
    except OSError:
        exp = (None, None)
    pane = subprocess.run(["tmux", "capture-pane", "-p", "-t", "s18"], capture_output=True, text=True).stdout
    head = pane.splitlines()[0].strip() if pane else ""
    if (head[:70], exp) != last:
        print(f"{time.strftime('%H:%M:%S')} exporter verdict={exp[0]} phase={exp[1]} | {head[:150]}", flush=True)
        last = (head[:70], exp)
    time.sleep(0.5)
PY
WATCH=$!
sleep 30
echo "-- killed by hand (SIGKILL to its process group) at $(date +%H:%M:%S)"
kill -9 -- -"$FIRST"
sleep 12
echo "-- started again by hand into the same log at $(date +%H:%M:%S)"
MASTER_PORT=29519 setsid python3 "$JOB" serve --log /tmp/byhand18.log --port 8019 > /tmp/byhand18b.out 2>&1 &
SECOND=$!
wait $WATCH
cat "$OUT/watch18.txt"
tmux capture-pane -p -t s18 > "$OUT/screen18_end.txt"
python3 -m cockpit snapshot local --layout /tmp/follow18.yaml --json > "$OUT/after18.json"; echo "cold look exit $?"
python3 -c "import json; d=json.load(open('$OUT/after18.json')); print('cold look:', (d.get('phase') or {}).get('name'), d['verdict']['name'])"
kill $EXP; tmux kill-server 2>/dev/null
kill -9 -- -"$SECOND" 2>/dev/null
pkill -9 -f "vllm_job.py serve" || true
date -u; ls -la "$OUT"
