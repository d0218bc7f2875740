"""The import rules of docs/ARCHITECTURE.md, kept by import-linter over the whole package (every
import counts, function-level ones too): nothing below the UI imports Textual; the agent and the
simulated host import nothing of the cockpit above them."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_import_contracts_hold():
    lint = Path(sys.executable).with_name("lint-imports")
    res = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert "2 kept, 0 broken" in res.stdout, res.stdout[-2000:]
