"""Root on a shared host, part two: throwaway users made with useradd, their real files and
folders, real processes, sockets and file limits. Nothing another user leaves in a folder the
cockpit starts from, nor an interpreter another user can change, runs as root; a hostile reader
of the host's text stays linear and bounded; a lost link always comes back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import cannot_run
from fixtures_shared import chown_tree

PY = "/usr/bin/python3"
PLANTED = ("bisect", "json", "random", "selectors", "subprocess", "threading", "struct", "signal", "marshal", "site")


def plant(folder: Path, mark: Path, names=PLANTED) -> None:
    """Modules named like the standard library's that write `mark` when imported."""
    for name in names:
        (folder / f"{name}.py").write_text(
            f"import os\nopen({str(mark)!r}, 'a').write('{name} ran as %d\\n' % os.getuid())\n"
        )


def cockpit(*args: str, cwd: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """The cockpit as an installed entry point runs it: isolated itself, started in `cwd`."""
    return subprocess.run(
        [sys.executable, "-I", "-m", "cockpit", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


# ----------------------------------------------------------------------------- 1: isolated Pythons


def test_modules_planted_in_the_folder_the_agent_starts_from_never_run(users, shared):  # noqa: F811
    """Another user's folder holds bisect.py, json.py, subprocess.py ...: a plain `python -c`
    started there imports them (the control); the local agent started there, with the cockpit's
    own interpreter and with the system's, imports none of them and answers."""
    evil, _ = users
    home = shared / "evil-home"
    home.mkdir()
    mark = shared / "ran"
    plant(home, mark)
    chown_tree(home, evil)
    control = subprocess.run([PY, "-c", "import bisect"], cwd=home, capture_output=True)
    assert control.returncode == 0 and "bisect ran as 0" in mark.read_text()  # the attack is real
    mark.unlink()
    for python in (None, PY):
        res = cockpit(
            "snapshot", "local", "--json", "--wait", "0", *(["--python", python] if python else []), cwd=str(home)
        )
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout)["agent"]["executable"] == (python or sys.executable)
        assert not mark.exists(), mark.read_text()


def test_a_cockpit_package_planted_where_serve_starts_never_runs_as_its_browser_sessions(users, shared):  # noqa: F811
    """`cockpit serve` started from another user's folder holding cockpit/__main__.py: the
    command each browser session runs (through a shell, as textual-serve runs it) is the
    installed cockpit, isolated and started in `/`; its files are named by absolute paths."""
    from cockpit.cli import build_parser
    from cockpit.serve import served_shell

    evil, _ = users
    home = shared / "evil-home"
    (home / "cockpit").mkdir(parents=True)
    mark = shared / "ran"
    plant(home / "cockpit", mark, ("__init__", "__main__"))
    plant(home, mark)
    chown_tree(home, evil)
    control = subprocess.run([sys.executable, "-m", "cockpit", "--version"], cwd=home, capture_output=True)
    assert "__main__ ran as 0" in mark.read_text(), control  # the attack is real
    mark.unlink()
    layout = home / "mine.yaml"
    here = os.getcwd()
    os.chdir(home)
    try:
        args = build_parser().parse_args(["serve", "local", "--layout", "mine.yaml", "--known-hosts", "kh"])
        shell = served_shell(args)
    finally:
        os.chdir(here)
    assert shell.startswith("cd / && exec ") and f"--layout {layout}" in shell and f"--known-hosts {home}/kh" in shell
    res = subprocess.run(
        ["/bin/sh", "-c", shell], cwd=home, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL
    )
    assert "Traceback" not in res.stderr and res.returncode == 2, res.stderr  # our cockpit's one-line refusal
    assert not mark.exists(), mark.read_text()


# ----------------------------------------------------------------------------- 2: untrusted interpreters


def _wrapper(path: Path, mark: Path) -> Path:
    """An interpreter that another user could have swapped: it leaves a mark, then runs Python."""
    path.write_text(f'#!/bin/sh\necho ran >> {mark}\nexec {PY} "$@"\n')
    path.chmod(0o755)
    return path


def test_as_root_an_interpreter_another_user_can_change_is_refused_unless_trusted(users, shared, tmp_path):  # noqa: F811
    """As root: an interpreter in another user's folder, one in a root folder anyone may write,
    one whose venv's pyvenv.cfg another user owns, and a root-owned one whose site-packages holds
    another user's .pth are each refused in one line naming what another user can change (even
    read-only, and never replaced by another interpreter); --trust-python or the layout's
    trust_python runs it. A root-owned interpreter in root-owned folders runs."""
    if os.geteuid() != 0:
        cannot_run("the check is root's")
    evil, _ = users
    mark = shared / "ran"
    theirs = shared / "theirs" / "bin"
    theirs.mkdir(parents=True)
    chown_tree(shared / "theirs", evil)
    open_dir = shared / "open" / "bin"
    open_dir.mkdir(parents=True)
    (shared / "open").chmod(0o777)
    venv = shared / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    os.chown(venv / "pyvenv.cfg", evil, evil)
    pth = shared / "pth"
    site = pth / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (site / "evil.pth").write_text("import os\n")
    os.chown(site / "evil.pth", evil, evil)
    (pth / "bin").mkdir()
    cases = {
        _wrapper(theirs / "python", mark): str(theirs / "python"),
        _wrapper(open_dir / "python", mark): str(shared / "open"),
        _wrapper(venv / "bin" / "python", mark): str(venv / "pyvenv.cfg"),
        _wrapper(pth / "bin" / "python", mark): str(site / "evil.pth"),
    }
    os.chown(theirs / "python", evil, evil)
    for python, named in cases.items():
        res = cockpit("snapshot", "local", "--python", str(python), "--read-only", "--json", "--wait", "0", cwd="/")
        assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
        assert f"{python} is not run as root: {named} (mode" in res.stderr and "--trust-python" in res.stderr
        assert not mark.exists(), (python, mark.read_text())
    python = open_dir / "python"
    res = cockpit("snapshot", "local", "--python", str(python), "--trust-python", "--json", "--wait", "0", cwd="/")
    assert res.returncode == 0 and mark.read_text() == "ran\n", res.stderr
    mark.unlink()
    layout = tmp_path / "trusted.yaml"
    layout.write_text(f"command: [-m, sglang.launch_server]\npython: {venv / 'bin' / 'python'}\ntrust_python: true\n")
    res = cockpit("snapshot", "local", "--layout", str(layout), "--json", "--wait", "0", cwd="/")
    assert res.returncode == 0 and mark.read_text() == "ran\n", res.stderr
    mark.unlink()
    (shared / "open").chmod(0o755)  # root's alone now: it runs unasked, once asked what it imports from (-I -S)
    res = cockpit("snapshot", "local", "--python", str(python), "--json", "--wait", "0", cwd="/")
    assert res.returncode == 0 and mark.read_text() == "ran\nran\n", res.stderr


def test_over_ssh_as_root_the_check_runs_on_the_host(users, shared, sshd):  # noqa: F811
    """The same check where the agent starts: over ssh, as root there, an interpreter in a
    folder another user owns is refused by the host's own /bin/sh before it runs, in one line."""
    if sshd.user != "root":
        cannot_run("the check is root's")
    evil, _ = users
    mark = shared / "ran"
    theirs = shared / "theirs"
    theirs.mkdir()
    python = _wrapper(theirs / "python3", mark)
    chown_tree(theirs, evil)
    res = cockpit(
        "snapshot", "cockpit-test", "--python", str(python), "--json", "--wait", "0", *sshd.cli_args(), cwd="/"
    )
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert f"cockpit-test: {python} is not run as root: {python} (mode -rwxr-xr-x, owner uid {evil}" in res.stderr
    assert not mark.exists()


# ----------------------------------------------------------------------------- 4b: a reconnect out of fds

OUT_OF_FDS = """
import asyncio, os, resource, signal, sys
from cockpit.host.session import HostSession
from cockpit.link.target import parse_target

async def until(check, what):
    for _ in range(1200):  # a bound for a stuck test, not a speed claim
        if check():
            return
        await asyncio.sleep(0.05)
    raise SystemExit("never: " + what)

async def main():
    s = HostSession(parse_target("local"))
    await s.connect()
    kept = asyncio.create_task(s.keep())
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    held = []
    try:
        while True:
            held.append(os.open("/dev/null", os.O_RDONLY))
    except OSError:
        pass
    os.killpg(s.stream.proc.pid, signal.SIGKILL)  # the agent gone: keep() reconnects, with no fd to spare
    await until(lambda: "retrying (3)" in s.state.link_state, "a third attempt")
    print("ERROR", s.link_error, "STATE", s.state.link_state, flush=True)
    for fd in held:
        os.close(fd)
    await until(lambda: s.state.link_state == "up", "up again")
    await s.wait_samples(1)
    print("UP", s.reconnects, kept.done(), flush=True)
    kept.cancel()
    await s.close()

asyncio.run(main())
"""


def test_a_reconnect_that_runs_out_of_file_descriptors_is_tried_again_and_says_why(tmp_path):
    """A real fd limit: the agent's link drops while every descriptor is taken, so starting the
    next agent fails with EMFILE. The reconnection is tried again with backoff, says why, and
    once descriptors are free the link is up again and samples."""
    script = tmp_path / "out_of_fds.py"
    script.write_text(OUT_OF_FDS)
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    error = res.stdout.split("ERROR ", 1)[1].splitlines()[0]
    assert "Too many open files (EMFILE), retrying" in error and "lost, retrying (3)" in error, res.stdout
    assert "UP 1 False" in res.stdout


# ----------------------------------------------------------------------------- 3: a hostile metrics page


def hostile_line(size: int) -> str:
    """One metrics line of `size` characters, nearly all of it short labels."""
    labels = "".join(f'l{i}="x",' for i in range(size // 8))
    labels = labels[: labels.rfind(",", 0, size - 40) + 1]
    return "sglang:num_running_reqs{" + labels + 'z="y"} 3\n'


def test_a_local_user_serving_a_hostile_metrics_page_is_read_in_one_bounded_pass():
    """A local user listening on the layout's port serves a 6 MiB line of labels then 30,000
    series, over a real socket: the agent's bounded fetch and the parser read it (one pass, no
    copy per label), keep the line's first 32 labels and the value, and say which bounds left
    the rest out: the agent's 8 MiB cut and the series cap, in the scrape and in the snapshot's
    `metrics.notes`."""
    import socket
    import threading

    from cockpit.agent import web
    from cockpit.read import metrics

    big = hostile_line(6 << 20)
    series = "".join(f'sglang:other{{i="{i}"}} {i}\n' for i in range(30_000))
    body = (big + series).encode()
    page = b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n" + body + b"x" * (3 << 20)
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()

    def answer():
        conn, _ = srv.accept()
        conn.recv(4096)
        try:
            conn.sendall(page)
        except OSError:
            pass  # the reader stopped at its bound
        conn.close()

    t = threading.Thread(target=answer, daemon=True)
    t.start()
    answer_doc = web.http_body(srv.getsockname()[1], "/metrics", timeout=60)
    t.join(60)
    srv.close()
    assert (
        answer_doc["status"] == 200 and answer_doc["truncated"] and (8 << 20) - 100 < len(answer_doc["body"]) < 8 << 20
    )
    scrape = metrics.scrape_of(answer_doc)
    assert scrape.values["running"] == 3.0, scrape
    assert any("agent sent its first 8 MiB" in n for n in scrape.notes), scrape.notes
    assert any("more than 20,000 series" in n for n in scrape.notes), scrape.notes
    samples, bad = metrics.parse(big)
    assert len(samples[0].labels) == metrics.MAX_LABELS and samples[0].value == 3.0 and bad == 0
    view = metrics.MetricsView()
    view.add(scrape)
    assert view.doc()["notes"] == scrape.notes
    notes: list[str] = []
    metrics.parse(big + big, notes)  # 12 MiB given straight to the parser: its own bound says so
    assert notes == ["the metrics page is over 8 MiB: only its first 8 MiB were read"]


# ----------------------------------------------------------------------------- 5: a forged Xid


def test_an_xid_forged_by_a_user_in_the_kernel_log_is_not_the_gpus_word():
    """Crafted /dev/kmsg records: the driver's own (kernel facility, its prefix first) is an
    Xid; the same text written by a user (LOG_USER, as the kernel marks every write to
    /dev/kmsg), or found in the middle of a kernel message, is not."""
    from cockpit.agent import xid

    line = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=init, GPU has fallen off the bus."
    assert xid.kmsg_xid(f"4,1047,8123450000,-;{line}\n SUBSYSTEM=pci") == (8123.45, ("0000:3b:00", 79, 1))
    for forged in (
        f"12,1048,8123460000,-;{line}",  # <12>: LOG_USER, warning: what a user's write carries
        f"14,1049,8123470000,-;{line}",
        f"30,1050,8123480000,-;{line}",  # LOG_DAEMON
        f"x,1051,8123490000,-;{line}",
        f'6,1052,8123500000,-;audit: comm="{line}"',  # the kernel echoing a user's text
        f"6,1053,8123510000,-;usb 1-1: Product: {line}",
    ):
        assert xid.kmsg_xid(forged) is None, forged
    assert xid.parse_xid(f"[  966.503025] {line}") == ("0000:3b:00", 79, 1)
    assert xid.parse_xid(f"Nov 22 18:29:55 gpu7 kernel: [  966.503025] {line}") == ("0000:3b:00", 79, 1)
    assert xid.parse_xid(f"Nov 22 18:29:55 gpu7 sudo: {line}") is None
    assert xid.parse_xid(f"hello {line}") is None


# ----------------------------------------------------------------------------- 7: a URL's password


def test_a_url_password_holding_slashes_and_ats_is_masked_whole_in_linear_time():
    """`user:` then anything up to the URL's last `@` is the password: masked whole, in values,
    argv and log lines; a URL with no credentials is left alone; a megabyte of `://a:` runs
    through (each URL's end and last `@` found once)."""
    from cockpit.common import secrets

    for url, want in (
        ("postgres://app:pa/ss@w@rd@db:5432/x", "postgres://app:***@db:5432/x"),
        ("s3://AKIA:se/cr@et@bucket/key?token=abc", "s3://AKIA:***@bucket/key?token=***"),
        ("redis://:p/w@cache:6379", "redis://:***@cache:6379"),
        ("https://tok@en@github.com/org", "https://***@github.com/org"),
        ("https://host/users/alice@example.com", "https://host/users/alice@example.com"),
        ("http://127.0.0.1:30000/health", "http://127.0.0.1:30000/health"),
    ):
        assert secrets.mask_url(url) == want, url
        assert secrets.mask_line(f"connecting to {url} now") == f"connecting to {want} now"
        assert secrets.mask_argv(["--db", url]) == ["--db", want]
    assert "pa/ss" not in secrets.mask_env({"DATABASE": "postgres://app:pa/ss@w@rd@db/x"})["DATABASE"]
    hostile = "x://a:" * 80_000 + "@h " + "y://" * 80_000 + "b@c"  # within MAX_TEXT
    masked = secrets.mask_url(hostile)
    assert masked.startswith("x://a:***@h ") and masked.endswith(" y://y:***@c")


# ----------------------------------------------------------------------------- 4a: the exporter starved

MANY_GPUS = """\
import json, subprocess, sys
# a host whose agent claims 20,000 GPUs in its first sample
p = subprocess.Popen([{real!r}] + sys.argv[1:], stdout=subprocess.PIPE)
claimed = False
for line in p.stdout:
    if not claimed and b'"t":"sample"' in line.replace(b" ", b""):
        f = json.loads(line)
        f["gpus"] = (f.get("gpus") or []) + [{{"index": 100 + i, "util_pct": 1.0, "mem_used_mib": 1}}
                                             for i in range(20000)]
        line = (json.dumps(f) + "\\n").encode()
        claimed = True
    sys.stdout.buffer.write(line)
    sys.stdout.buffer.flush()
"""


def _scrape(port: int) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=120) as r:
        assert r.status == 200
        return r.read().decode()


def test_half_open_connections_under_a_low_fd_limit_never_starve_a_scrape_and_a_hosts_gpus_are_capped(tmp_path):
    """The exporter under `ulimit -n 1024`: 1,020 connections opened and left silent (a local
    user's), then a scrape: answered (the oldest idle connections shut to make room, each
    connection read under a timeout). A host whose agent claims 20,000 GPUs: 512 exported,
    the rest counted in gpu_cockpit_gpus_not_exported, not 100,000 series."""
    import resource
    import socket
    import time

    from conftest import free_port

    wrapper = tmp_path / "python"
    wrapper.write_text(f"#!{sys.executable}\n" + MANY_GPUS.format(real=sys.executable))
    wrapper.chmod(0o755)
    port = free_port()

    def low_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))

    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cockpit",
            "exporter",
            "--hosts",
            "local",
            "--python",
            str(wrapper),
            "--listen",
            f"127.0.0.1:{port}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=low_limit,
        text=True,
    )
    held: list[socket.socket] = []
    try:
        assert "metrics on" in proc.stdout.readline()
        body = ""
        for _ in range(600):  # until the host's first sample is in (a bound, not a speed claim)
            body = _scrape(port)
            if 'gpu_cockpit_gpus_not_exported{host="local"}' in body:
                break
            time.sleep(0.2)
        series = [line for line in body.splitlines() if line.startswith("gpu_cockpit_gpu_utilization_ratio{")]
        assert 0 < len(series) <= 512 and 'gpu_cockpit_gpus_not_exported{host="local"}' in body, body[-2000:]
        assert len(body.splitlines()) < 20_000
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        assert soft >= 2000, "this test needs 2,000 descriptors of its own"
        for _ in range(1020):
            held.append(socket.create_connection(("127.0.0.1", port), timeout=60))
        assert "gpu_cockpit_hosts 1.0" in _scrape(port)
        assert proc.poll() is None
    finally:
        for c in held:
            c.close()
        proc.terminate()
        proc.wait(60)


# ----------------------------------------------------------------------------- 8: links above a path


def test_a_symlinked_folder_above_a_log_is_refused_by_every_open(users, shared):  # noqa: F811
    """Another user's folder holds `logs`, a symbolic link to a root-only folder: the log tail,
    the run's log opened for appending, a dump read and the shm clean's folder are each refused
    naming the linked folder, nothing under the root-only folder is read, made or written; the
    same opens through the real folder work (owner checks as before). Through the kernel's
    openat2 and through the walk both."""
    from cockpit.agent import flightrec, logs, nofollow, shm
    from cockpit.agent.protocol import Refused

    evil, _ = users
    secret = shared / "root-only"
    secret.mkdir(mode=0o700)
    (secret / "run.log").write_text("root's secret line\n")
    (secret / "dump").write_bytes(b"secret")
    theirs = shared / "theirs"
    theirs.mkdir()
    (theirs / "logs").symlink_to(secret)
    chown_tree(theirs, evil)
    linked = theirs / "logs"
    kinds = [None, False] if nofollow._openat2() else [False]
    try:
        for kind in kinds:
            if kind is False:
                nofollow._state["openat2"] = False  # the walk, as on a kernel before 5.6
            tail = logs.LogTail(str(linked / "run.log"), owners={0})
            event, lines = tail.poll()
            assert tail.state == f"refused: {linked}/run.log its folder {linked} is a symbolic link: not followed"
            assert lines == []
            with pytest.raises(Refused) as err:
                logs.open_log(str(linked / "new" / "run.log"))
            assert f"its folder {linked} is a symbolic link" in str(err.value) and "\n" not in str(err.value)
            assert not (secret / "new").exists()
            with pytest.raises(OSError) as err2:
                flightrec.open_regular(str(linked / "dump"), {0})
            assert f"its folder {linked} is a symbolic link: not followed" in str(err2.value)
            with pytest.raises(OSError) as err3:
                nofollow.open_nofollow(str(linked), os.O_RDONLY | os.O_DIRECTORY)  # the shm clean's folder open
            assert "is a symbolic link: not followed" in str(err3.value)
            tail = logs.LogTail(str(secret / "run.log"), owners={0})
            assert tail.poll()[1] == ["root's secret line"]
            fd = logs.open_log(str(secret / "made" / "run.log"))
            os.close(fd)
            assert oct((secret / "made").stat().st_mode & 0o777) == "0o700"
            os.close(flightrec.open_regular(str(secret / "dump"), {0}))
            assert shm.shm_clean(str(secret), [], other_dir=True)["removed"] == []
            nofollow._state["openat2"] = None
    finally:
        nofollow._state["openat2"] = None


# ----------------------------------------------------------------------------- 6: a frame of many values

SHORT_STRINGS = """\
import json, subprocess, sys
# a host whose agent sends, once, a 60 MiB sample of short strings (a gigabyte once decoded)
p = subprocess.Popen([{real!r}] + sys.argv[1:], stdout=subprocess.PIPE)
sent = False
for line in p.stdout:
    if not sent and b'"t":"sample"' in line.replace(b" ", b""):
        sent = True
        v = json.loads(line)["v"]
        sys.stdout.buffer.write(b'{{"v":' + json.dumps(v).encode() + b',"t":"sample","notes":['
                                + b'"ab",' * (12 << 20) + b'"ab"]}}\\n')
    sys.stdout.buffer.write(line)
    sys.stdout.buffer.flush()
"""

MEASURED = """\
import resource, subprocess, sys
res = subprocess.run(sys.argv[1:], capture_output=True, text=True)
sys.stdout.write(res.stdout)
sys.stderr.write(res.stderr)
print("MAXRSS_KIB", resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)
sys.exit(res.returncode)
"""


def test_a_frame_of_millions_of_short_strings_is_skipped_said_and_the_link_kept(tmp_path):
    """A host sends one 60 MiB frame of short strings (decoded: over a gigabyte of str objects):
    counted before decoding, skipped, said in the snapshot (`frames too costly to decode`, a
    note), the link kept (the next samples read), and the cockpit's peak memory stays far below
    what decoding it would take."""
    wrapper = tmp_path / "python"
    wrapper.write_text(f"#!{sys.executable}\n" + SHORT_STRINGS.format(real=sys.executable))
    wrapper.chmod(0o755)
    measured = tmp_path / "measured.py"
    measured.write_text(MEASURED)
    res = subprocess.run(
        [
            sys.executable,
            str(measured),
            sys.executable,
            "-m",
            "cockpit",
            "snapshot",
            "local",
            "--python",
            str(wrapper),
            "--json",
            "--wait",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    doc = json.loads(res.stdout)
    peak_mib = int(res.stderr.rsplit("MAXRSS_KIB", 1)[1].split()[0]) / 1024
    assert peak_mib < 600, peak_mib  # decoding it: 1,013 MiB
    assert doc["agent"]["dropped_fields"].get("frames too costly to decode") == 1, doc["agent"]["dropped_fields"]
    assert doc["agent"]["python"] and doc["gpus"] is not None  # the hello and the samples after it were read
