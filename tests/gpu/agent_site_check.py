"""On a GPU host (issue 45): the agent now starts without `site` (`-I -S`) and adds the
site-packages folders itself, never a .pth. Check that it still finds nvidia-ml-py where the host's
Python has it: `agent.gpu_source` is `pynvml ...` whenever `python3 -I -c "import pynvml"` works,
for the system's python3 and (if given) a venv's; and that a server launched as root passes the
launch check (its interpreter, import path and `/` as its folder) with no --trust-python.

    python3 tests/gpu/agent_site_check.py [--python /path/to/venv/bin/python]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from cockpit.agent.guard import check_python


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--python", action="append", default=["python3"])
    args = ap.parse_args()
    bad = 0
    for python in args.python:
        has = subprocess.run([python, "-I", "-c", "import pynvml"], capture_output=True).returncode == 0
        res = subprocess.run(
            [sys.executable, "-m", "cockpit", "snapshot", "local", "--python", python, "--json", "--wait", "0"],
            capture_output=True,
            text=True,
            cwd="/",
            timeout=120,
        )
        if res.returncode != 0:
            print(f"{python}: snapshot failed: {res.stderr.strip()[-500:]}")
            bad += 1
            continue
        source = json.loads(res.stdout)["agent"].get("gpu_source") or ""
        ok = source.startswith("pynvml") if has else True
        print(f"{python}: pynvml importable {has}, the agent's gpu_source {source!r}: {'ok' if ok else 'WRONG'}")
        bad += not ok
    refused = check_python([args.python[-1], "-c", "pass"], "/", dict(os.environ))
    print(f"the launch check as uid {os.geteuid()} for {args.python[-1]} in /: {refused or 'passes'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
