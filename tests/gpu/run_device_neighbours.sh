#!/usr/bin/env bash
# Issue 44 on one H200: two real jobs on one GPU host, two process groups, two ports, both started
# by hand (tests/gpu/vllm_job.py, two gloo ranks each on GPU 0): A serves, B's rank 1 stops while the
# ranks capture CUDA graphs (a hang). Each read through its own layout, a plain look with no layout
# (each its own run in `runs`), then A killed with `cockpit kill --layout A`: B untouched and still
# its own verdict, A's layout reads `no run` with B among its neighbours. Under ~5 minutes.
#   run(kind="nvidia-h200", carry=[".whl"], command="bash tests/gpu/run_device_neighbours.sh")
# .whl: as run_device18.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/neighbours.txt") 2>&1
source tests/gpu/device_env.sh
export XDG_STATE_HOME=/tmp/stn
JOB=$PWD/tests/gpu/vllm_job.py
for n in a b; do
  port=$([ $n = a ] && echo 8041 || echo 8042)
  cat > /tmp/$n.yaml <<EOF
name: nb-$n
engine: vllm
python: python3
command: [$JOB, serve]
ports: [$port]
kill_wait_s: 5
stall: {idle_s: 20, spin_s: 20}
EOF
done
MASTER_PORT=29541 setsid python3 "$JOB" serve --log /tmp/a.log --port 8041 > /tmp/a.out 2>&1 &
A=$!
MASTER_PORT=29542 setsid python3 "$JOB" serve --log /tmp/b.log --port 8042 --capture-hang-rank 1 > /tmp/b.out 2>&1 &
B=$!
for i in $(seq 120); do grep -q "startup complete" /tmp/a.log 2>/dev/null && break; sleep 1; done
sleep 30  # B's hang outlasts its layout's stall window
show() {
  python3 - "$1" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
print("  top:", (d.get("phase") or {}).get("name"), "|", d["verdict"]["name"], "|", "; ".join(d["verdict"]["evidence"][:2]))
print("  ranks:", [(p["pid"], p.get("rank")) for p in d["processes"] if p.get("rank") is not None])
for r in d.get("runs") or []:
    print("  run:", r["root"], r["user"], r["ports"], "tp", r["tp_size"], r["ranks"], (r["phase"] or {}).get("name"),
          (r["verdict"] or {}).get("name"), "followed" if r.get("followed") else "")
for r in d.get("neighbours") or []:
    print("  neighbour:", r["root"], r["user"], r["ports"], "tp", r["tp_size"])
EOF
}
echo "== 1. A through its layout"
python3 -m cockpit snapshot local --layout /tmp/a.yaml --json > "$OUT/a1.json"; echo "exit $?"; show "$OUT/a1.json"
echo "== 2. B through its layout"
python3 -m cockpit snapshot local --layout /tmp/b.yaml --json > "$OUT/b1.json"; echo "exit $?"; show "$OUT/b1.json"
echo "== 3. a plain look, no layout: each server its own run"
python3 -m cockpit snapshot local --json --wait 25 > "$OUT/plain.json"; echo "exit $?"; show "$OUT/plain.json"
echo "== 4. A killed through its layout"
python3 -m cockpit kill local --layout /tmp/a.yaml --yes | tail -3
ps -o pid,pgid,cmd -g "$B" | head -5
echo "== 5. A's layout after the kill, and B's"
python3 -m cockpit snapshot local --layout /tmp/a.yaml --json > "$OUT/a2.json"; echo "exit $?"; show "$OUT/a2.json"
python3 -m cockpit snapshot local --layout /tmp/b.yaml --json > "$OUT/b2.json"; echo "exit $?"; show "$OUT/b2.json"
kill -9 -- -"$A" -"$B" 2>/dev/null
date -u; ls -la "$OUT"
