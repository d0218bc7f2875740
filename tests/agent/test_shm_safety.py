"""/dev/shm on a shared host, as root: a file is held when a live process maps it or holds it
open, whatever path that process sees (another mount namespace through a bind mount, a name
with a newline, a name ending in " (deleted)"); the folder is resolved before the /dev/shm gate;
a clean after a kill removes only files tied to the run; a clean removes only the file that was
listed, and nothing swapped in after the check. Real files in /dev/shm and real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import run_cli

from cockpit.actions import kill as actions
from cockpit.agent import kill as agent_kill, protocol as agent_protocol, shm as agent_shm, shm as shm_mod
from cockpit.runs import run as runmod

SHM = Path("/dev/shm")
TAG = f"gpu-cockpit-test-{os.getpid()}"


def holder(path: str, *, namespace_bind: str | None = None, fd_only: bool = False) -> subprocess.Popen:
    """A live process that maps `path` (or only holds it open) and waits. `namespace_bind`: it
    runs in a mount namespace of its own where /dev/shm is bind-mounted there, and maps the
    file through that path."""
    code = (
        f"import mmap, os, sys, time\n"
        f"f = open(sys.argv[1], 'r+b')\n"
        f"m = None if {fd_only!r} else mmap.mmap(f.fileno(), 4096)\n"
        f"{'' if fd_only else 'f.close()'}\n"
        f"print('ok', flush=True)\n"
        f"time.sleep(120)\n"
    )
    if namespace_bind:
        script = (
            f'mkdir -p {namespace_bind} && mount --bind /dev/shm {namespace_bind} && exec {sys.executable} -c "$0" "$1"'
        )
        argv = ["unshare", "-m", "--propagation", "private", "sh", "-c", script, code, path]
    else:
        argv = [sys.executable, "-c", code, path]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ok"
    return proc


def make(name: str, uid: int | None = None) -> Path:
    path = SHM / name
    path.write_bytes(b"x" * 4096)
    if uid is not None:
        os.chown(path, uid, uid)
    return path


def end(*procs: subprocess.Popen) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(10)


# ----------------------------------------------------------------------------- held: device and inode


def test_a_file_mapped_through_a_bind_mount_in_another_mount_namespace_is_held(tmp_path):
    path = make(f"psm_{TAG}-bind")
    proc = holder(str(tmp_path / "shm-bind" / path.name), namespace_bind=str(tmp_path / "shm-bind"))
    try:
        maps = Path(f"/proc/{proc.pid}/maps").read_text()
        assert f"/dev/shm/{path.name}" not in maps and str(tmp_path / "shm-bind" / path.name) in maps
        entry = next(e for e in agent_shm.shm_audit()["entries"] if e["name"] == path.name)
        assert entry["held_by"] == [proc.pid] and not entry["removable"]
        done = agent_shm.shm_clean("/dev/shm", [path.name])
        assert done["removed"] == [] and path.exists()
        res = run_cli("shm", "local", "--clean", "--yes")
        assert res.returncode == 0, res.stderr
        assert path.exists() and f"removed {path.name}" not in res.stdout
    finally:
        end(proc)
        path.unlink(missing_ok=True)


@pytest.mark.parametrize("name", [f"psm_{TAG}-new\nline", f"psm_{TAG}-gone (deleted)", f"nccl-{TAG} (deleted)"])
def test_names_that_maps_prints_otherwise_are_held(name):
    path = make(name)
    mapped = holder(str(path))
    try:
        assert "\\012" in Path(f"/proc/{mapped.pid}/maps").read_text() or "\n" not in name
        entry = next(e for e in agent_shm.shm_audit()["entries"] if e["name"] == name)
        assert entry["held_by"] == [mapped.pid] and "held by pid" in entry["why"]
        assert agent_shm.shm_clean("/dev/shm", [name])["removed"] == [] and path.exists()
    finally:
        end(mapped)
        path.unlink(missing_ok=True)


def test_a_file_only_held_open_is_held():
    path = make(f"nccl-{TAG}-fd")
    proc = holder(str(path), fd_only=True)
    try:
        entry = next(e for e in agent_shm.shm_audit()["entries"] if e["name"] == path.name)
        assert entry["held_by"] == [proc.pid]
        assert agent_shm.shm_clean("/dev/shm", [path.name])["removed"] == [] and path.exists()
    finally:
        end(proc)
        path.unlink(missing_ok=True)


@pytest.mark.parametrize("spelled", ["/dev//shm", "/dev/shm/.", "/dev/../dev/shm", "/dev/shm/"])
def test_dev_shm_spelled_otherwise_is_dev_shm_and_its_held_files_are_kept(spelled):
    held = make(f"psm_{TAG}-held")
    loose = make(f"psm_{TAG}-loose")
    proc = holder(str(held))
    try:
        audit = agent_shm.shm_audit(spelled)
        assert audit["folder"] == "/dev/shm" and audit["default"]
        res = run_cli("shm", "local", "--dir", spelled, "--clean", "--yes")  # no --yes-other-dir: it is /dev/shm
        assert res.returncode == 0, res.stderr
        assert held.exists() and not loose.exists()
        assert f"removed {loose.name}" in res.stdout and f"removed {held.name}" not in res.stdout
    finally:
        end(proc)
        held.unlink(missing_ok=True)
        loose.unlink(missing_ok=True)


def test_a_folder_that_resolves_elsewhere_needs_the_other_folder_confirmation(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (real / "nccl-x").write_bytes(b"x")
    link = tmp_path / "looks-like-shm"
    link.symlink_to(real)
    with pytest.raises(agent_protocol.Refused):
        agent_shm.shm_clean(str(link), ["nccl-x"])
    with pytest.raises(agent_protocol.Refused):
        agent_shm.shm_clean("/dev/shm/../../" + str(real).lstrip("/"), ["nccl-x"])
    res = run_cli("shm", "local", "--dir", str(link), "--clean", "--yes")
    assert res.returncode == 2 and "--yes-other-dir" in res.stderr and (real / "nccl-x").exists()


# ----------------------------------------------------------------------------- a clean after a kill: the run's files only


RUN_CODE = r"""
import mmap, os, sys, time
shm, tag = sys.argv[1], sys.argv[2]
held = open(f"{shm}/psm_{tag}-run-held", "w+b"); held.write(b"x" * 4096); held.flush()
m = mmap.mmap(held.fileno(), 4096)
open(f"{shm}/torch_{os.getpid()}_1_{tag}", "wb").write(b"x" * 4096)   # torch names its files with its pid
open(f"{shm}/psm_{tag}-run-made", "wb").write(b"x" * 4096)            # made while the run ran, let go
print("ok", flush=True)
time.sleep(120)
"""

COLLEAGUE_CODE = r"""
import mmap, sys, time
for path in sys.argv[1:]:
    with open(path, "w+b") as f:
        f.write(b"x" * 4096); f.flush()
        m = mmap.mmap(f.fileno(), 4096); m.close()      # created, mapped, unmapped: still its own
print("ok", flush=True)
time.sleep(120)
"""


def test_a_clean_after_a_kill_removes_only_files_tied_to_the_run():
    """A live root process (a colleague's) created psm_… and nccl-… and let them go; an older
    file of the family is there too. Only the run's files go: the one it maps, the one named with
    its pid, and one the monitor saw it hold while it lived. A file made after the run started
    that it never held is left (a creation time proves nothing on a shared machine), said as
    "cannot tell whose it is"; with no run found, nothing is removed."""
    colleague_files = [SHM / f"psm_colleague_queue-{TAG}", SHM / f"nccl-colLive-{TAG}"]
    colleague = subprocess.Popen(
        [sys.executable, "-c", COLLEAGUE_CODE, *map(str, colleague_files)], stdout=subprocess.PIPE, text=True
    )
    assert colleague.stdout.readline().strip() == "ok"
    older = make(f"nccl-{TAG}-older")
    time.sleep(1.2)  # the run starts after these were made (start times are in whole ticks, the boot time in seconds)
    run = subprocess.Popen([sys.executable, "-c", RUN_CODE, str(SHM), TAG], stdout=subprocess.PIPE, text=True)
    ours = [SHM / f"psm_{TAG}-run-held", SHM / f"torch_{run.pid}_1_{TAG}", SHM / f"psm_{TAG}-run-made"]
    try:
        assert run.stdout.readline().strip() == "ok"
        entries = agent_kill.run_plan(pids=[run.pid])["plan"]
        assert [e["pid"] for e in entries] == [run.pid]
        audit = agent_shm.shm_audit()  # before the kill, as plan_relaunch takes it

        found = actions.shm_for_run(
            audit, actions.KillPlan(runmod.Scope(), entries, "launched by this cockpit (ledger): process group 1")
        )
        why = {e["name"]: e["why"] for e in found.remove}
        assert sorted(why) == sorted(p.name for p in ours[:2])
        assert why[ours[0].name] == f"held by the run's pid {run.pid}"
        assert why[ours[1].name] == f"its name carries the run's pid {run.pid}"
        left = {e["name"]: e["why"] for e in found.left}
        for path in colleague_files + [older, ours[2]]:  # made after the run started, never held by it: not its
            assert "cannot tell whose it is" in left[path.name]
        made = next(e for e in audit["entries"] if e["name"] == ours[2].name)
        seen = actions.shm_for_run(
            audit,
            actions.KillPlan(runmod.Scope(), entries, "owns port 30000"),
            {(made["dev"], made["ino"]): time.time()},
        )  # the monitor saw the run hold it
        assert {e["name"]: e["why"] for e in seen.remove}[ours[2].name].startswith("held by the run while it lived")
        lines = "\n".join(actions.describe_shm_for_run(found, "/dev/shm"))
        assert colleague_files[0].name not in lines  # not the run's: counted, never listed
        said = next(line for line in lines.splitlines() if line.startswith("  left ("))
        assert "cannot tell whose it is" in said and "not tied to this run" in said  # its reason said once for all

        # found by its ports or command: the same rules (what it holds or held, what carries its pid)
        other = actions.shm_for_run(audit, actions.KillPlan(runmod.Scope(), entries, "owns port 30000"))
        assert sorted(other.names) == sorted(p.name for p in ours[:2])
        # no run found: nothing removed, everything said
        none = actions.shm_for_run(audit, actions.KillPlan(runmod.Scope(), [], None))
        assert none.remove == [] and {p.name for p in colleague_files + ours} <= {e["name"] for e in none.left}

        run.send_signal(signal.SIGKILL)
        run.wait(10)
        done = agent_shm.shm_clean("/dev/shm", seen.remove)
        assert sorted(done["removed"]) == sorted(p.name for p in ours)
        assert all(p.exists() for p in colleague_files + [older]) and not any(p.exists() for p in ours)
    finally:
        end(run, colleague)
        for p in colleague_files + ours + [older]:
            p.unlink(missing_ok=True)


# ----------------------------------------------------------------------------- the file listed, nothing swapped in


def test_a_file_replaced_after_it_was_listed_is_kept(tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    (shm / "nccl-a").write_bytes(b"x" * 4096)
    shown = [actions.listed(e) for e in agent_shm.shm_audit(str(shm))["entries"]]
    (shm / "nccl-a").unlink()
    (shm / "nccl-a").write_bytes(b"new")  # another file under the name, after the operator saw the list
    done = agent_shm.shm_clean(str(shm), shown, other_dir=True)
    assert done["removed"] == [] and "replaced since" in done["skipped"][0]["why"] and (shm / "nccl-a").exists()


@pytest.mark.parametrize("swap", ["symlink", "file"])
def test_an_entry_swapped_between_the_check_and_the_unlink_is_kept(tmp_path, monkeypatch, swap):
    shm = tmp_path / "shm"
    shm.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (shm / "nccl-b").write_bytes(b"x" * 4096)
    real_audit = agent_shm.shm_audit

    def audit_then_swap(folder, uid=None):
        out = real_audit(folder, uid)
        (shm / "nccl-b").unlink()  # the swap lands after the check
        if swap == "symlink":
            (shm / "nccl-b").symlink_to(victim)
        else:
            (shm / "nccl-b").write_bytes(b"theirs")
        return out

    monkeypatch.setattr(shm_mod, "shm_audit", audit_then_swap)
    done = agent_shm.shm_clean(str(shm), ["nccl-b"], other_dir=True)
    assert done["removed"] == [] and "changed since it was checked" in done["skipped"][0]["why"]
    assert os.path.lexists(shm / "nccl-b") and victim.read_text() == "precious"
    if swap == "symlink":
        assert (shm / "nccl-b").is_symlink()
