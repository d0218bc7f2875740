"""The code keeps one style: ruff's check and its formatter, as pyproject.toml configures them
([tool.ruff]; the agent's folder at Python 3.8, cockpit/agent/ruff.toml), pass on cockpit/ and tests/."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args, "cockpit", "tests"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def test_ruff_check_passes():
    done = _ruff("check", "--no-cache")
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_format_leaves_every_file_as_it_is():
    done = _ruff("format", "--check", "--no-cache")
    assert done.returncode == 0, "run `.venv/bin/ruff format cockpit tests`:\n" + done.stdout + done.stderr
