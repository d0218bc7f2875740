"""The suite itself as a safety net (tests/conftest.py): each test runs with a home and XDG folders
of its own, which the processes it starts inherit, so that a kill's record never lands in the
machine's own ~/.local/state (read by every cockpit of the host); under CI a check that cannot run
fails with its reason instead of skipping; a test that hangs fails alone at its timeout."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import SEALED, run_cli

from cockpit.agent import acts

TESTS = Path(__file__).resolve().parents[1]


def test_each_test_has_a_home_and_xdg_folders_of_its_own_that_its_processes_inherit(sealed, tmp_path):
    """HOME and every XDG folder are this test's (never the user's own home), and `cockpit kill
    local` in a subprocess writes its stop record there."""
    assert {key: os.environ[key] for key in SEALED} == {key: str(sealed / name) for key, name in SEALED.items()}
    assert not str(sealed).startswith(pwd.getpwuid(os.getuid()).pw_dir + "/")
    assert acts.acts_path() == str(sealed / "state" / "gpu-cockpit" / "host" / "acts.jsonl")
    proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        res = run_cli("kill", "local", "--pid", str(proc.pid), "--yes", "--json", "--wait", "5")
        assert res.returncode == 0, res.stderr
        assert proc.wait(10) is not None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    records = [json.loads(line) for line in Path(acts.acts_path()).read_text().splitlines()]
    assert [[row[0] for row in r["processes"]] for r in records if r["act"] == "stop"] == [[proc.pid]], records


def test_a_second_test_gets_other_folders(sealed):
    """Nothing one test wrote is seen by the next: the record above is not here."""
    assert not Path(acts.acts_path()).exists() and sorted(p.name for p in sealed.iterdir()) == sorted(SEALED.values())


PROBE = """\
import time
import pytest
from conftest import cannot_run, need

@pytest.mark.skipif(True, reason="marked away")
def test_marked():
    pass

def test_missing_tool():
    need("no-such-tool-gck", package="no-such-package")

def test_no_namespace():
    cannot_run("no network namespace here")

@pytest.mark.timeout(1)
def test_hangs():
    time.sleep(60)

def test_runs():
    pass
"""


def _probe(tmp_path: Path, ci: bool) -> subprocess.CompletedProcess:
    """The suite's conftest and the settings of pyproject.toml over a probe file, in a pytest of its own."""
    (tmp_path / "conftest.py").write_text((TESTS / "conftest.py").read_text())
    (tmp_path / "test_probe.py").write_text(PROBE)
    (tmp_path / "pytest.ini").write_text(
        textwrap.dedent("""\
        [pytest]
        addopts = -ra -p no:cacheprovider
        timeout = 300
        timeout_method = signal
        """)
    )
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = str(TESTS)  # the helpers the conftest loads (fixtures_shared, simhost)
    if ci:
        env["CI"] = "true"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "test_probe.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_under_ci_a_check_that_cannot_run_fails_with_its_reason_and_a_hang_fails_alone(tmp_path):
    res = _probe(tmp_path, ci=True)
    assert res.returncode == 1, res.stdout
    summary = res.stdout.strip().splitlines()[-1]
    assert summary.startswith("3 failed, 1 passed, 1 error in "), res.stdout
    assert "skipped under CI=true, which must run every test: Skipped: marked away" in res.stdout
    assert (
        "cannot run under CI: no-such-tool-gck not installed: apt-get install no-such-package (scripts/test does)"
        in res.stdout
    )
    assert "cannot run under CI: no network namespace here" in res.stdout
    assert "FAILED test_probe.py::test_hangs - Failed: Timeout (>1.0s) from pytest-timeout" in res.stdout


def test_on_a_developers_machine_the_same_checks_are_skipped_with_their_reason(tmp_path):
    res = _probe(tmp_path, ci=False)
    assert res.returncode == 1, res.stdout  # the hang still fails
    assert res.stdout.strip().splitlines()[-1].startswith("1 failed, 1 passed, 3 skipped in "), res.stdout
    assert "SKIPPED [1] test_probe.py:10: no-such-tool-gck not installed: apt-get install no-such-package" in res.stdout
    assert "SKIPPED [1] test_probe.py:13: no network namespace here" in res.stdout
