#!/usr/bin/env bash
# Run 16 on one H200 (one truth per host): a real vLLM-shaped TP-2 job (tests/gpu/vllm_job.py, two
# gloo ranks on GPU 0) launched by `cockpit launch` with rank 1 stopping while the ranks capture
# CUDA graphs, before the port opens; the launch's exit status and frames; a cold look with no
# ledger at all (only the host's record); the relaunch with the flag set off; then a run started by
# hand, followed by the cockpit's screen (in tmux) and `cockpit exporter`, stopped with `cockpit
# kill` from another terminal: what each said. Under ~6 minutes.
#   run(kind="nvidia-h200", carry=[".whl"], command="bash tests/gpu/run_device16.sh")
# .whl: `../shared/tools/device-wheels textual==8.2.8 rich==15.0.0 platformdirs linkify-it-py
# uc-micro-py mdit-py-plugins setproctitle prometheus-client==0.26.0 asyncssh cryptography cffi
# pycparser py-spy`
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/run16.txt") 2>&1
source tests/gpu/device_env.sh
export XDG_STATE_HOME=/tmp/st16
JOB=$PWD/tests/gpu/vllm_job.py
cat > /tmp/hang16.yaml <<EOF
name: hang16
engine: vllm
python: python3
command: [$JOB, serve]
base_flags: [--log, /dev/stdout, --port, "8016", --weights-gb, "2"]
flag_sets:
  hang: [--capture-hang-rank, "1"]
enabled: [hang]
env: {MASTER_PORT: "29516"}
log_dir: /tmp/runs16
ports: [8016]
kill_wait_s: 5
stall: {idle_s: 20, spin_s: 20}
EOF
echo "== 1. cockpit launch: rank 1 stops while capturing CUDA graphs"
start=$(date +%s.%N)
python3 -m cockpit launch local --layout /tmp/hang16.yaml --yes --timeout 240; code=$?
echo "exit status $code after $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s"
ss -ltnp | grep -E "29516|8016" || true
echo "== 2. a cold look from another process, with no ledger at all (the host's record only)"
rm -rf /tmp/st16/gpu-cockpit/ledger /tmp/st16/gpu-cockpit/runs
start=$(date +%s.%N)
python3 -m cockpit snapshot local --layout /tmp/hang16.yaml --json > "$OUT/cold16.json"; echo "exit status $?"
echo "cold look took $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s"
python3 - "$OUT/cold16.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
v = d["verdict"]
print("verdict:", v["name"], "odd rank:", v["odd_rank"], "looked_s:", d.get("looked_s"))
for e in v["evidence"]:
    print("  ", e)
print("ranks:", [(p["pid"], p.get("rank"), p["name"]) for p in d["processes"] if p.get("rank") is not None])
EOF
echo "== 3. relaunch with the flag set off"
python3 -m cockpit launch local --layout /tmp/hang16.yaml --off hang --yes --timeout 240; echo "exit status $?"
python3 -m cockpit kill local --layout /tmp/hang16.yaml --yes | tail -3
echo "== 4. a run started by hand, followed by a screen and the exporter, killed from another terminal"
cat > /tmp/follow16.yaml <<EOF
name: follow16
engine: vllm
python: python3
command: [$JOB, serve]
log: /tmp/byhand16.log
ports: [8017]
kill_wait_s: 5
stall: {idle_s: 20, spin_s: 20}
EOF
rm -f /tmp/byhand16.log
MASTER_PORT=29517 setsid python3 "$JOB" serve --log /tmp/byhand16.log --port 8017 > /tmp/byhand16.out 2>&1 &
for i in $(seq 120); do grep -q "startup complete" /tmp/byhand16.log 2>/dev/null && break; sleep 1; done
tmux new-session -d -s s16 -x 160 -y 50 "python3 -m cockpit local --layout /tmp/follow16.yaml"
python3 -m cockpit exporter --hosts local --layout /tmp/follow16.yaml --interval 1 --listen 127.0.0.1:9516 \
  > /tmp/exporter16.log 2>&1 &
EXP=$!
python3 - > "$OUT/watch16.txt" <<'EOF' &
import re, subprocess, time, urllib.request
last = (None, None)
end = time.time() + 100
while time.time() < end:
    try:
        text = urllib.request.urlopen("http://127.0.0.1:9516/metrics", timeout=3).read().decode()
        m = re.search(r'gpu_cockpit_verdict\{host="local",state="([^"]+)"\} 1\.0', text)
        exp = m.group(1) if m else None
    except OSError:
        exp = None
    pane = subprocess.run(["tmux", "capture-pane", "-p", "-t", "s16"], capture_output=True, text=True).stdout
    head = pane.splitlines()[0] if pane else ""
    scr = next((w for w in ("stalled-idle", "stalled-spinning", "crashed", "stopping", "stopped", "no run", "watching", "ok")
                if w in head), None)
    if (scr, exp) != last:
        print(f"{time.strftime('%H:%M:%S')} screen={scr} exporter={exp} | {head.strip()[:150]}", flush=True)
        last = (scr, exp)
    time.sleep(0.5)
EOF
WATCH=$!
sleep 40
echo "-- cockpit kill from another terminal at $(date +%H:%M:%S)"
python3 -m cockpit kill local --layout /tmp/follow16.yaml --yes | tail -4
wait $WATCH
cat "$OUT/watch16.txt"
tmux capture-pane -p -t s16 > "$OUT/screen16_end.txt"
tail -20 /tmp/st16/gpu-cockpit/host/acts.jsonl | cut -c1-300 > "$OUT/acts16.txt"
kill $EXP; tmux kill-server 2>/dev/null
pkill -9 -f "vllm_job.py serve" || true
date -u; ls -la "$OUT"
