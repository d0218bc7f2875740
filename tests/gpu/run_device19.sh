#!/usr/bin/env bash
# Run 19 on one H200 (issue 47: a stall called in seconds with default settings): a real
# vLLM-shaped TP-2 job (tests/gpu/vllm_job.py, two gloo ranks on GPU 0) whose rank 1 stops while
# the ranks capture CUDA graphs, under a layout that says nothing about stalls; the time from the
# log's last line to the stalled verdict measured as on the simulated host (tests/bench/stall_detect.py:
# a cockpit that watched the launch, and a cold look started one second after the last line),
# three times each. Under ~6 minutes.
#   run(kind="nvidia-h200", carry=[".whl"], command="bash tests/gpu/run_device19.sh")
# .whl: as run 18's (`../shared/tools/device-wheels textual==8.2.8 rich==15.0.0 platformdirs
# linkify-it-py uc-micro-py mdit-py-plugins setproctitle prometheus-client==0.26.0 asyncssh
# cryptography cffi pycparser py-spy`)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/run19.txt") 2>&1
source tests/gpu/device_env.sh
export MASTER_PORT=29519
cat > /tmp/hang19.yaml <<YAML
name: hang19
engine: vllm
python: python3
command: [$PWD/tests/gpu/vllm_job.py, serve]
base_flags: [--log, /dev/stdout, --port, "8019", --weights-gb, "2", --capture-hang-rank, "1"]
ports: [8019]
env: {MASTER_PORT: "29519"}
YAML
python3 tests/bench/stall_detect.py --layout /tmp/hang19.yaml --marker "Capturing CUDA graphs" --runs 3 \
  --json "$OUT/stall19.json"
echo "exit status $?"
