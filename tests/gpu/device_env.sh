# Sourced by tests/gpu/run_device*.sh from the repository's root, after their output is teed: the
# carried wheels (.whl, `../shared/tools/device-wheels ...` as each script's head says) installed
# beside the device's own packages, this tree on the path, the rendezvous on the loopback, and what
# the device is (Python, torch, the GPUs and their driver).
date -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 MASTER_ADDR=127.0.0.1
python3 -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__)"
nvidia-smi --query-gpu=index,name,driver_version,memory.used --format=csv,noheader
