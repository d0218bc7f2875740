"""The type check: mypy, strict on the monitors, the run and the workflows that drive a monitor
(pyproject.toml's [tool.mypy]), and every kind of monitor held to the `Monitor` protocol
(tests/architecture/monitor_kinds.py): a kind missing a member or changing a signature fails here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_monitor_run_and_workflow_modules_type_check_strictly():
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_kind_that_drifts_from_the_protocol_fails_the_check(tmp_path):
    """The check has teeth: a monitor whose `stop` lost its `why` is not a Monitor."""
    drifted = tmp_path / "drifted.py"
    drifted.write_text(
        "from typing import Any\n"
        "from cockpit.actions.kill import KillPlan\n"
        "from cockpit.monitor.base import Monitor\n"
        "from cockpit.monitor.replay import ReplayMonitor\n\n\n"
        "class Drifted(ReplayMonitor):\n"
        "    async def stop(self, plan: KillPlan) -> dict[str, Any]:  # type: ignore[override]\n"
        "        return {}\n\n\n"
        "def kind(m: Drifted) -> Monitor:\n"
        "    return m\n"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--no-error-summary",
            "--strict",
            "--follow-imports=silent",
            "--ignore-missing-imports",
            "--allow-untyped-calls",
            str(drifted),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert (
        done.returncode == 1 and 'expected "Monitor"' in done.stdout and "def stop(self, plan: KillPlan)" in done.stdout
    ), done.stdout
