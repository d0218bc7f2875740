#!/usr/bin/env bash
# Every benchmark that runs without a GPU, one after another, results as JSON under $OUT
# (default bench-results/). The GPU-host side: tests/gpu/run_device.sh, run_device2.sh, run_device6.sh.
#   usage: tests/bench/run_all.sh [SECONDS]     (default 60 per timed run)
set -euo pipefail
cd "$(dirname "$0")/../.."
S=${1:-60}
OUT=${OUT:-bench-results}; mkdir -p "$OUT"
PY=.venv/bin/python
echo "== agent: sample cost and live cost (simulated 8 GPUs, 50- and 40-process trees)"
$PY tests/bench/agent_cost.py --sim --tree 50 --seconds "$S" --json "$OUT/agent_cost_tree50.json" | grep -E "ms|pct|bytes|floor"
$PY tests/bench/agent_cost.py --sim --tree 40 --seconds "$S" --json "$OUT/agent_cost_tree40.json" | grep -E "pct|bytes"
echo "== time to first frame over a real sshd"
$PY tests/bench/first_frame.py --runs 10 --json "$OUT/first_frame.json" | head -7
for rate in 0 2000 20000; do
  echo "== screen under load: $rate log lines/s"
  $PY tests/bench/ui_load.py --rate "$rate" --seconds "$S" --json "$OUT/ui_load_$rate.json" | grep -vE "^[{}]"
done
echo "== fleet: 64 hosts x 8 simulated GPUs behind 64 real sshd"
$PY tests/bench/fleet_scale.py --hosts 64 --seconds "$S" --json "$OUT/fleet_scale_64.json" | grep -E "cpu|key|redraw|up|rss"
echo "== one-shot snapshot: wall time and where it goes"
$PY tests/bench/snapshot_wall.py --runs 10 --json "$OUT/snapshot_wall.json" | grep -E "median|interpreter|import|agent|sample|document"
echo "== the command line's start, one command per family"
$PY tests/bench/cli_start.py --runs 10 --json "$OUT/cli_start.json" | grep -E "cockpit|pass"
echo "== the UI process in tmux, quiet host, 8 GPUs"
$PY tests/bench/ui_tmux_cpu.py --mode idle --seconds "$S" --json "$OUT/ui_tmux_idle.json" | grep -E "cpu|rss"
echo "== cockpit explain: lines per second, healthy and failure-heavy logs; hostile lines' worst case"
$PY tests/bench/explain_rate.py --lines 100000 1000000 --json "$OUT/explain_rate.json" 2>&1 | grep -E "lines/s|slowest"
echo "== cockpit bisect: launches to an answer at 0.95, a flaky hang (p 0.34, 0.2) and every deterministic one against ddmin"
$PY tests/bench/bisect_launches.py --seeds 20 --json "$OUT/bisect_launches.json" | grep -E '"(p|found_at_confidence|launches_median|launches_max)"'
