#!/usr/bin/env bash
# Run 17 on one H200 (bisect): the real vLLM-shaped TP-2 job (tests/gpu/vllm_job.py, two gloo
# ranks on GPU 0) with four flag sets on: the one that hangs the launch (rank 1 stops while the
# ranks capture CUDA graphs) among three harmless ones. `cockpit bisect` finds it; then the same
# call again resumes from the ledger and launches nothing. Under ~8 minutes.
#   run(kind="nvidia-h200", carry=[".whl"], command="bash tests/gpu/run_device17.sh")
# .whl: as run 16 (tests/gpu/run_device16.sh)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/run17.txt") 2>&1
source tests/gpu/device_env.sh
export XDG_STATE_HOME=/tmp/st17
JOB=$PWD/tests/gpu/vllm_job.py
cat > /tmp/bisect17.yaml <<EOF
name: bisect17
engine: vllm
python: python3
command: [$JOB, serve]
base_flags: [--log, /dev/stdout, --port, "8018", --weights-gb, "2"]
flag_sets:
  seqs: [--max-num-seqs, "128"]
  blocks: [--block-size, "32"]
  hang: [--capture-hang-rank, "1"]
  quiet: [--disable-log-requests]
enabled: [seqs, blocks, hang, quiet]
env: {MASTER_PORT: "29518"}
log_dir: /tmp/runs17
ports: [8018]
kill_wait_s: 5
stall: {idle_s: 10, spin_s: 10}
EOF
echo "== 1. cockpit bisect: which of the four flag sets hangs the launch"
start=$(date +%s)
python3 -m cockpit bisect local --layout /tmp/bisect17.yaml --settle 5 --timeout 180 --yes; code=$?
echo "exit status $code after $(( $(date +%s) - start )) s"
python3 -m cockpit bisect local --layout /tmp/bisect17.yaml --settle 5 --timeout 180 --yes --json > "$OUT/bisect17.json"
echo "== 2. the same call again: exit status $? (resumed from the ledger)"
python3 - "$OUT/bisect17.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
print({k: d.get(k) for k in ("status", "answer_text", "launches", "launched_now", "resumed", "exit")})
for s in d.get("steps") or []:
    print("  ", s.get("applied"), s.get("outcome"), s.get("seconds"))
EOF
python3 -m cockpit runs --layout /tmp/bisect17.yaml | tail -12
pkill -9 -f "vllm_job.py serve" || true
date -u; ls -la "$OUT"
