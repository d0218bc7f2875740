"""/dev/shm in the relaunch's dialog and outcome, on a real folder: the run's entries listed, what
is not the run's counted by reason and never listed (a shared host has hundreds), other users'
counted apart; the promise and the result in agreeing words when the run's own exit removed its
files before the clean came."""

from __future__ import annotations

import os
import time

from cockpit.actions import kill as actions
from cockpit.agent import shm as agent_shm
from cockpit.runs.run import Scope

NOBODY = 65534


def test_the_runs_entries_are_listed_and_the_rest_counted(tmp_path):
    pid = os.getpid()
    ours = [f"torch_{pid}_1_{n}" for n in range(3)]  # their names carry the run's pid
    untied = [f"psm_cockpit-words-{n}" for n in range(200)]  # this user's, tied to no run
    theirs = [f"psm_cockpit-theirs-{n}" for n in range(150)]  # another user's
    for name in ours + untied + theirs:
        (tmp_path / name).write_bytes(b"x")
    for name in theirs:
        os.chown(tmp_path / name, NOBODY, NOBODY)
    audit = agent_shm.shm_audit(str(tmp_path))
    plan = actions.KillPlan(Scope(), [{"pid": pid, "started": time.time() - 3600, "title": "the run"}], "rule")
    found = actions.shm_for_run(audit, plan)
    assert sorted(found.names) == sorted(ours) and found.others == 150
    lines = actions.describe_shm_for_run(found, str(tmp_path))
    text = "\n".join(lines)
    assert (
        lines[0] == f"then the run's 3 entries of {tmp_path}: removed, each checked again first (one the run's "
        f"own exit removed first is said so):"
    )
    assert all(f"rm {name}" in text for name in ours)
    assert not any(name in text for name in untied + theirs)  # counted, never listed
    assert f"  left (200 entries, not tied to this run): {actions.UNTIED}" in lines
    assert "  not touched (150 entries): another user's, or not named like an inference run's" in lines
    assert len(lines) == 1 + 3 + 3

    screen = "\n".join(actions.describe_shm(audit, others=False))  # the `s` dialog
    assert not any(name in screen for name in theirs) and all(name in screen for name in untied)
    assert "and 150 entries of other users, not listed" in screen
    assert all(name in "\n".join(actions.describe_shm(audit)) for name in theirs)  # `cockpit shm` lists them all

    for name in ours:  # the run's own exit removes its files before the clean comes
        (tmp_path / name).unlink()
    done = agent_shm.shm_clean(str(tmp_path), found.remove, other_dir=True)
    assert done["removed"] == [] and all(s["gone"] for s in done["skipped"])
    assert (
        actions.summarize_clean(done, len(found.left), by_exit=True)
        == "removed 0 /dev/shm entries, 3 already removed by the run's own exit, left 200 (not tied to this run)"
    )
    assert f"already removed by the run's own exit {ours[0]}" in actions.describe_clean(done, by_exit=True)
