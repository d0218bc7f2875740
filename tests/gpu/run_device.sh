#!/usr/bin/env bash
# The GPU-host runs, in one device call: install carried wheels, start a real TP job (one process
# per GPU), validate the NVML path against nvidia-smi, measure the agent's sample cost and the
# host cost of monitors side by side, and render the cockpit on real data.
#   usage (device tool): bash tests/gpu/run_device.sh [healthy]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=index,name,driver_version,memory.total,power.limit --format=csv
python3 -c "import pynvml, torch; print('nvidia-ml-py', pynvml.__version__ if hasattr(pynvml,'__version__') else '?', 'torch', torch.__version__, torch.cuda.device_count())"
rm -f /tmp/tp.log
setsid python3 tests/gpu/tp_job.py --log /tmp/tp.log --weights-gb 8 > /tmp/tp.out 2>&1 &
for i in $(seq 60); do grep -q "ready to roll" /tmp/tp.log 2>/dev/null && break; sleep 1; done
sleep 5; tail -3 /tmp/tp.log
echo "== validate NVML"; python3 tests/gpu/validate_nvml.py --samples 5 --json "$OUT/validate.json"
echo "== sample cost"; python3 tests/bench/agent_cost.py --tree 50 --seconds 30 --json "$OUT/agent_cost.json" | tail -22
echo "== host cost"; python3 tests/gpu/host_cost.py --seconds 60 --json "$OUT/host_cost.json"
echo "== snapshot"; printf 'command: [tests/gpu/tp_job.py]\nengine: sglang\nlog: /tmp/tp.log\n' > /tmp/tp.yaml
python3 -m cockpit snapshot local --layout /tmp/tp.yaml --svg "$OUT/healthy.svg" --wait 2 --json > "$OUT/healthy.json"; echo rc=$?
pkill -9 -f tp_job.py; sleep 3; nvidia-smi --query-gpu=index,memory.used --format=csv
