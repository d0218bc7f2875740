#!/usr/bin/env bash
# Run 20 on one H200 (issue 49: acting through the one door): a real vLLM-shaped TP-2 job
# (tests/gpu/vllm_job.py, two gloo ranks on GPU 0) started by hand, rank 1 stopping while the ranks
# capture CUDA graphs, with no layout: `cockpit dump local` (the ranks found as the kill finds
# them, py-spy on each, the odd one out), `cockpit kill local` declined at the prompt (nothing
# signalled), then with --yes (the one server followed, killed by its root's pid and start time,
# verified gone), then again (nothing to kill, said); then the agent's site check as root
# (tests/gpu/agent_site_check.py). Under ~3 minutes.
#   run(kind="nvidia-h200", carry=[".whl"], command="bash tests/gpu/run_device20.sh")
# .whl: as run 18's (`../shared/tools/device-wheels textual==8.2.8 rich==15.0.0 platformdirs
# linkify-it-py uc-micro-py mdit-py-plugins setproctitle prometheus-client==0.26.0 asyncssh
# cryptography cffi pycparser py-spy`)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/run20.txt") 2>&1
source tests/gpu/device_env.sh
export XDG_STATE_HOME=/tmp/st20
JOB=$PWD/tests/gpu/vllm_job.py
MASTER_PORT=29520 setsid python3 "$JOB" serve --log /tmp/h.log --port 8020 --capture-hang-rank 1 > /tmp/h.out 2>&1 &
H=$!
for i in $(seq 120); do grep -q -i "capturing cuda graph" /tmp/h.log 2>/dev/null && break; sleep 1; done
sleep 5
ps -o pid,pgid,stat,cmd -g "$H" | head -6
echo "== 1. cockpit dump local (no layout: the one server on the host)"
python3 -m cockpit dump local; echo "exit $?"
echo "== 2. cockpit kill local, declined at the prompt"
echo n | python3 -m cockpit kill local; echo "exit $?"
ps -o pid= -g "$H" | wc -l
echo "== 3. cockpit kill local --yes"
python3 -m cockpit kill local --yes --wait 3; echo "exit $?"
ps -o pid= -g "$H" | wc -l
echo "== 4. cockpit kill local --yes, again"
python3 -m cockpit kill local --yes; echo "exit $?"
echo "== 5. the agent's site check"
python3 tests/gpu/agent_site_check.py; echo "exit $?"
kill -9 -- -"$H" 2>/dev/null
date -u; ls -la "$OUT"
