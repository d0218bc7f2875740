"""The agent's samplers, each against real files, sockets and processes."""

import http.server
import os
import socket
import threading

import pytest
from conftest import cannot_run

from cockpit.agent import (
    facts as agent_facts,
    gpus as agent_gpus,
    kill,
    kill as agent_kill,
    logs as agent_logs,
    ports as agent_ports,
    procs as agent_procs,
    procs as procs_mod,
    web as agent_web,
)
from cockpit.sim import fakenvml


def test_log_tail_follows_growth_rotation_truncation_and_waits_for_missing(tmp_path):
    path = tmp_path / "server.log"
    tail = agent_logs.LogTail(str(path))
    assert tail.poll() == ("missing", [])
    assert tail.poll() == (None, [])
    path.write_text("one\ntwo\npart")
    assert tail.poll() == ("created", ["one", "two"])
    with open(path, "a") as fh:
        fh.write("ial\nthree\n")
    assert tail.poll() == (None, ["partial", "three"])
    os.rename(path, tmp_path / "server.log.1")
    path.write_text("fresh\n")
    assert tail.poll() == ("rotated", ["fresh"])
    path.write_text("")
    event, lines = tail.poll()
    assert event == "truncated" and lines == []
    with open(path, "a") as fh:
        fh.write("after\n")
    assert tail.poll() == (None, ["after"])


def test_log_tail_starts_near_the_end_and_reads_bounded_bytes(tmp_path):
    path = tmp_path / "big.log"
    line = "x" * 99 + "\n"
    path.write_text(line * 10_000)  # 1 MB
    tail = agent_logs.LogTail(str(path))
    event, lines = tail.poll()
    assert event == "opened"
    assert 0 < len(lines) <= agent_logs.LOG_INITIAL_BYTES // 100 + 1
    assert all(line == "x" * 99 for line in lines)
    with open(path, "a") as fh:
        fh.write(line * 2000)  # 200 KB at once: read in bounded slices
    _, first = tail.poll()
    assert len(first) * 100 <= agent_logs.LOG_MAX_BYTES_PER_FRAME
    total = len(first)
    while True:
        _, more = tail.poll()
        if not more:
            break
        total += len(more)
    assert total == 2000


def test_listening_ports_finds_a_real_listener_and_its_owner():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]
    try:
        listening = agent_ports.listening_ports()
        assert port in listening
        ports = agent_ports.Ports()
        ports.configured = [port, 1]
        rows = {r["port"]: r for r in ports.sample([os.getpid()])}
        assert rows[port] == {"port": port, "listening": True, "pid": os.getpid()}
        assert rows[1]["listening"] is False
    finally:
        srv.close()


def test_listeners_one_dump_for_both_families_equals_one_per_family_and_sees_each_change():
    """The kept netlink socket answers each sample afresh: a listener opened or closed between two
    asks shows in the next; the one old-style dump finds what the two per-family dumps find."""
    if not agent_ports._DIAG.ok:
        cannot_run("no netlink sock_diag here")
    v4 = socket.socket()
    v4.bind(("127.0.0.1", 0))
    v4.listen()
    v6 = None
    if socket.has_ipv6:
        try:
            v6 = socket.socket(socket.AF_INET6)
            v6.bind(("::1", 0))
            v6.listen()
        except OSError:
            v6 = None
    try:
        diag = agent_ports._Diag()
        both = diag.listeners()
        assert diag.compat and diag.sock is not None  # one dump, and the socket kept for the next
        kept = diag.sock
        per_family = agent_ports._Diag()
        per_family.compat = False
        ours = [v4.getsockname()[1]] + ([v6.getsockname()[1]] if v6 else [])
        assert all(p in both for p in ours)
        assert {p: both[p] for p in ours} == {p: per_family.listeners()[p] for p in ours}
        late = socket.socket()
        late.bind(("127.0.0.1", 0))
        late.listen()
        v4.close()
        try:
            again = diag.listeners()
            assert diag.sock is kept
            assert ours[0] not in again and late.getsockname()[1] in again
        finally:
            late.close()
    finally:
        v4.close()
        if v6 is not None:
            v6.close()


def test_a_kernel_refusing_the_old_request_gets_one_dump_per_family_and_a_timeout_changes_nothing(monkeypatch):
    if not agent_ports._DIAG.ok:
        cannot_run("no netlink sock_diag here")
    real = agent_ports._dump
    kinds = []

    def refusing(sock, kind, req, seq, ports, uids=None):
        kinds.append(kind)
        if kind == agent_ports.TCPDIAG_GETSOCK:
            raise agent_ports.Refused("sock_diag refused")
        return real(sock, kind, req, seq, ports, uids)

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    try:
        monkeypatch.setattr(agent_ports, "_dump", refusing)
        diag = agent_ports._Diag()
        assert srv.getsockname()[1] in diag.listeners()
        assert not diag.compat and kinds == [
            agent_ports.TCPDIAG_GETSOCK,
            agent_ports.SOCK_DIAG_BY_FAMILY,
            agent_ports.SOCK_DIAG_BY_FAMILY,
        ]

        def timing_out(*_a):
            raise TimeoutError("timed out")

        monkeypatch.setattr(agent_ports, "_dump", timing_out)
        diag = agent_ports._Diag()
        with pytest.raises(OSError):
            diag.listeners()
        assert diag.compat and diag.sock is None  # a slow answer is no refusal; the socket is not reused
    finally:
        srv.close()


def test_http_get_reports_status_and_latency_of_a_real_server():
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(503 if self.path == "/health" else 200)
            self.end_headers()
            self.wfile.write(b'{"ok": 1}')

        def log_message(self, *a):
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        port = srv.server_address[1]
        health = agent_web.http_get(port, "/health")
        assert health["status"] == 503 and health["ms"] >= 0
        models = agent_web.http_get(port, "/v1/models")
        assert models["status"] == 200 and models["body"] == '{"ok": 1}'
    finally:
        srv.shutdown()
    closed = agent_web.http_get(port, "/health", timeout=0.5)
    assert closed["status"] is None and closed["error"]


def test_nvml_sampler_reports_not_supported_fields_as_absent_and_stops_asking(sim_state, monkeypatch):
    monkeypatch.setenv("COCKPIT_SIM_STATE", str(sim_state))
    calls = []

    def no_power(handle):
        calls.append(handle)
        raise fakenvml.NVMLError_NotSupported("Not Supported")

    monkeypatch.setattr(fakenvml, "nvmlDeviceGetPowerUsage", no_power)
    gpus = agent_gpus.NvmlGpus(fakenvml)
    assert gpus.source == "sim" and len(gpus.static()) == 8
    first = gpus.sample(slow=True)
    second = gpus.sample(slow=False)
    assert all(g["power_w"] is None for g in first + second)
    assert all(g["mem_total_mib"] == 97887 and g["util_pct"] == 0 for g in second)
    assert len(calls) == 8  # asked once per GPU, then remembered as unsupported


def test_a_gpus_process_list_is_asked_again_only_when_something_moved(sim_state, monkeypatch):
    """NVML's process list is the costliest call of a sample: asked when the GPU's memory use
    moved or one of its processes ended, and at least every GPU_PROCS_EVERY_S, not every tick."""
    import subprocess
    import sys

    monkeypatch.setenv("COCKPIT_SIM_STATE", str(sim_state))
    asked = []
    real = fakenvml.nvmlDeviceGetComputeRunningProcesses
    monkeypatch.setattr(fakenvml, "nvmlDeviceGetComputeRunningProcesses", lambda h: (asked.append(h), real(h))[1])
    clock = [1000.0]
    monkeypatch.setattr(agent_gpus.time, "monotonic", lambda: clock[0])
    a = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    b = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        fakenvml.register(str(sim_state), a.pid, 0, 1000, "busy")
        gpus = agent_gpus.NvmlGpus(fakenvml)
        assert gpus.sample(slow=False)[0]["processes"] == [[a.pid, 1000]] and len(asked) == 8
        clock[0] += 1
        assert gpus.sample(slow=False)[0]["processes"] == [[a.pid, 1000]] and len(asked) == 8  # nothing moved
        fakenvml.register(str(sim_state), b.pid, 0, 2000, "busy")  # a newcomer: the memory use moved
        clock[0] += 1
        assert gpus.sample(slow=False)[0]["processes"] == [[a.pid, 1000], [b.pid, 2000]] and asked[8:] == [0]
        a.kill()
        a.wait()
        fakenvml.register(str(sim_state), b.pid, 0, 3000, "busy")  # the same total: a's end is what tells
        os.unlink(os.path.join(sim_state, "procs", "%d.json" % a.pid))
        clock[0] += 1
        assert gpus.sample(slow=False)[0]["processes"] == [[b.pid, 3000]] and asked[9:] == [0]
        clock[0] += agent_gpus.GPU_PROCS_EVERY_S
        gpus.sample(slow=False)
        assert len(asked) == 10 + 8  # and every GPU at least every GPU_PROCS_EVERY_S
    finally:
        for p in (a, b):
            p.kill()
            p.wait()


def test_process_sampler_watches_titled_trees_and_their_children(ranks, sim_state):
    psutil = pytest.importorskip("psutil")
    p = ranks.spawn("sglang::scheduler_TP5", gpu=5, mib=1000)
    procs = agent_procs.Procs(psutil)
    procs.configure(patterns=["sglang::*"])
    import time

    rows, gone = procs.sample(time.monotonic())
    row = next(r for r in rows if r["pid"] == p.pid)
    assert row["name"].startswith("sglang::") and row["cmdline"] == ["sglang::scheduler_TP5"]
    assert row["status"] in "RS" and row["threads"] >= 1 and row["rss_mib"] > 1 and gone == []
    procs.sample(time.monotonic())
    assert "cmdline" not in procs.rows[p.pid]  # sent once per connection
    assert os.getpid() not in {r["pid"] for r in rows}


FAKE_SMI = r'''#!/usr/bin/env python3
"""A stand-in nvidia-smi (its CSV only, from a simulated 2-GPU state) for hosts without GPUs."""
import sys, time
args = " ".join(sys.argv[1:])
open(sys.argv[0] + ".calls", "a").write(args + "\n")
rows = lambda: (["0, GPU-aaaa, NVIDIA H200, 87, 9866, 143771, 54, 614.20, 700.00, 1950, 0x0000000000000004",
                 "1, GPU-bbbb, NVIDIA H200, [N/A], 9866, 143771, 59, [Not Supported], 700.00, 1950, 0x0000000000000000"]
                if "query-gpu=index,uuid" in args else ["GPU-aaaa, 654, 9858", "GPU-bbbb, 655, 9858"])
if "driver_version" in args:
    print("580.159.04, 0, GPU-aaaa, NVIDIA H200, 143771, 700.00")
    print("580.159.04, 1, GPU-bbbb, NVIDIA H200, 143771, 700.00")
    sys.exit(0)
while True:
    for r in rows():
        print(r, flush=True)
    if "-lms" not in args:
        break
    time.sleep(int(args.split("-lms")[1].split()[0]) / 1000)
'''


def test_without_pynvml_one_long_lived_nvidia_smi_per_query(tmp_path, monkeypatch):
    smi = tmp_path / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setitem(__import__("sys").modules, "pynvml", None)  # import pynvml fails
    warnings = []
    gpus = agent_gpus.open_gpus(0.1, warnings)
    try:
        assert gpus.source == "nvidia-smi" and gpus.driver == "580.159.04"
        assert any("trying nvidia-smi" in w for w in warnings)  # no pynvml, or (here) no driver's library
        import time

        deadline = time.monotonic() + 30  # the streams' first rows, however loaded the machine
        while len(rows := gpus.sample(False)) < 2 or not rows[0].get("processes"):
            assert time.monotonic() < deadline, rows
            time.sleep(0.1)
        g0, g1 = rows
        assert (g0["util_pct"], g0["mem_used_mib"], g0["power_w"], g0["throttle"]) == (87, 9866, 614.2, 4)
        assert g1["util_pct"] is None and g1["power_w"] is None  # [N/A] and [Not Supported] are absent, not 0
        assert g0["processes"] == [[654, 9858]]
        calls = (tmp_path / "nvidia-smi.calls").read_text().splitlines()
        assert len(calls) == 3 and sum("-lms" in c for c in calls) == 2  # static query once, two streams
    finally:
        gpus.close()


def test_kill_run_survives_a_rank_that_exits_between_two_reads(monkeypatch):
    """A rank reaped between the start-time check and the status read once crashed `kill`
    with a TypeError; the process ends here exactly in that gap."""
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    plan = agent_kill.kill_plan(pids=[child.pid])
    assert [e["pid"] for e in plan] == [child.pid]
    real = agent_procs._proc_stat
    reads = []

    def stat_then_die(pid):
        row = real(pid)
        if pid == child.pid:
            reads.append(row)
            if len(reads) == 3:  # after SIGTERM: the lingering check's read
                child.wait(5)
                row = real(pid)
        return row

    for owner in (kill, procs_mod):  # the kill's own reads and those of the helpers it calls
        monkeypatch.setattr(owner, "_proc_stat", stat_then_die)
    report = agent_kill.kill_run(plan, wait_s=2.0, pids=[child.pid])
    assert report["term"] == [child.pid]
    assert report["remaining"] == []
    assert child.returncode == -15


def test_the_runs_own_package_folders_are_found_behind_a_virtualenvs_symlink():
    """/proc/PID/exe names the base interpreter of a virtualenv; the run's packages (torch on a GPU
    host, psutil here) live in the venv's site-packages, which the files it mapped name."""
    import subprocess
    import sys
    import sysconfig
    import time

    proc = subprocess.Popen(
        [sys.executable, "-c", "import psutil, time; print('up', flush=True); time.sleep(30)"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "up"
        time.sleep(0.1)
        assert sysconfig.get_paths()["purelib"] in agent_facts._site_dirs(proc.pid)
    finally:
        proc.kill()
        proc.wait()


def test_a_new_child_of_a_watched_process_is_adopted_on_the_next_tick(sim_state):
    """Between full scans only pids born since the last look are examined (/proc/loadavg names the
    newest): a child started by a watched process is watched at the next tick, and a tick where
    nothing was born reads no process's children. An idle process's row is reused whole."""
    psutil = pytest.importorskip("psutil")
    import subprocess
    import sys
    import time

    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess,sys,time\nsys.stdin.readline()\n"
            "subprocess.Popen(['sleep','60'])\nprint('started',flush=True)\ntime.sleep(60)",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    procs = agent_procs.Procs(psutil)
    try:
        procs.configure(patterns=[], pids=[parent.pid])
        procs.sample(time.monotonic())
        assert set(procs.watched) == {parent.pid}
        parent.stdin.write("go\n")
        parent.stdin.flush()
        assert parent.stdout.readline().strip() == "started"
        time.sleep(0.1)
        rows, _ = procs.sample(time.monotonic())  # not a full scan: the last one was just now
        kids = [r for r in rows if r["ppid"] == parent.pid]
        assert len(kids) == 1 and kids[0]["cmdline"] == ["sleep", "60"]
        kid = kids[0]["pid"]
        procs.sample(time.monotonic())
        first = procs.rows[kid]
        rows, _ = procs.sample(time.monotonic())
        assert kid not in {r["pid"] for r in rows}  # sleep's stat never moved: no row, the last one stands
        assert procs.rows[kid] is first and first["cpu_pct"] == 0.0
    finally:
        for p in psutil.Process(parent.pid).children():
            p.kill()
        parent.kill()
        parent.wait()
    rows, gone = procs.sample(time.monotonic())
    assert parent.pid in gone and parent.pid not in procs.rows and parent.pid not in procs._fds  # its stat closed
    procs.close()
    assert not procs._fds


def test_the_full_scan_waits_while_no_process_is_born(monkeypatch):
    """The 5 s scan of the whole process table is skipped while /proc/loadavg's newest pid stands
    still (nothing new can match), but never for longer than SCAN_QUIET_MAX_S."""
    psutil = pytest.importorskip("psutil")
    import time

    if not agent_procs._HAVE_PROC:
        cannot_run("needs /proc")
    newest = [1000]
    monkeypatch.setattr(procs_mod, "_last_pid", lambda: newest[0])
    monkeypatch.setattr(procs_mod, "SCAN_EVERY_S", 0.0)
    procs = agent_procs.Procs(psutil)
    procs.configure(patterns=["gpu-cockpit-test-matches-nothing"])
    scans = []
    real = procs.scan
    monkeypatch.setattr(procs, "scan", lambda **kw: (scans.append(1), real(**kw))[1])
    procs.sample(time.monotonic())
    assert len(scans) == 1
    procs.sample(time.monotonic())
    procs.sample(time.monotonic())
    assert len(scans) == 1  # nothing born: no scan
    newest[0] += 1
    procs.sample(time.monotonic())
    assert len(scans) == 2  # a birth: the scan runs
    procs.sample(time.monotonic() + agent_procs.SCAN_QUIET_MAX_S + 1)
    assert len(scans) == 3  # and never waits longer than SCAN_QUIET_MAX_S
    procs.close()


def test_a_scan_reads_afresh_only_new_young_and_maybe_reused_pids(monkeypatch):
    """The 5 s scan keeps a settled process's row from the last scan; it reads the stat of a pid
    the kernel's cursor passed since (it may be a new process), of a young process (it may still
    retitle itself), and of every process every REREAD_EVERY_S (a late retitle is found then)."""
    psutil = pytest.importorskip("psutil")
    import subprocess
    import sys

    if not agent_procs._HAVE_PROC:
        cannot_run("needs /proc")
    code = (
        "import sys\nsys.stdin.readline()\nopen('/proc/self/comm', 'w').write('sglang::late')\n"
        "print('retitled', flush=True)\nsys.stdin.readline()"
    )
    old = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    reads: list[int] = []
    real_read = agent_procs._read_proc

    def counting(path):
        if path.endswith("/stat"):
            reads.append(int(path.split("/")[2]))
        return real_read(path)

    cursor = [old.pid - 1]
    monkeypatch.setattr(procs_mod, "_read_proc", counting)
    monkeypatch.setattr(procs_mod, "_last_pid", lambda: cursor[0])
    monkeypatch.setattr(procs_mod, "SETTLE_S", 0.0)  # every process here counts as settled
    procs = agent_procs.Procs(psutil)
    try:
        procs.configure(patterns=["sglang::*"])
        procs.scan()
        assert old.pid in reads and 1 in reads and old.pid not in procs.watched  # the first scan reads all

        reads.clear()
        cursor[0] = old.pid  # the cursor passed old's pid: it may be a process born since
        procs.scan()
        assert old.pid in reads and 1 not in reads

        old.stdin.write("go\n")
        old.stdin.flush()
        assert old.stdout.readline().strip() == "retitled"
        reads.clear()
        procs.scan()  # settled, not passed by the cursor: its row is kept, the retitle not seen yet
        assert old.pid not in reads and old.pid not in procs.watched

        procs._reread_at -= agent_procs.REREAD_EVERY_S
        procs.scan()
        assert old.pid in reads and 1 in reads and old.pid in procs.watched

        monkeypatch.setattr(procs_mod, "SETTLE_S", 3600.0)  # now every process counts as young
        reads.clear()
        procs.scan()
        assert old.pid in reads and os.getpid() not in reads
    finally:
        procs.close()
        old.kill()
        old.wait()


def test_a_quick_scan_walks_no_row_while_the_table_stands_and_sees_each_change(monkeypatch):
    """The 5 s scan after a birth (a thread, as a busy job makes every second) lists /proc and,
    when the same processes stand with the same start, parent, group and title (young ones and
    pids the cursor passed read afresh), keeps the tree without walking every row; a process born
    that is no root, or one that died (the ticks drop it), changes nothing more. A new process
    matching a pattern, a young process's retitle or a new pattern: the whole scan."""
    psutil = pytest.importorskip("psutil")
    import subprocess
    import sys
    import time

    if not agent_procs._HAVE_PROC:
        cannot_run("needs /proc")
    code = (
        "import sys\nsys.stdin.readline()\nopen('/proc/self/comm', 'w').write('sglang::late')\n"
        "print('retitled', flush=True)\nsys.stdin.readline()"
    )
    young = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    born = other = child = None
    ours = {1, os.getpid(), young.pid}  # the table the scans see: other processes come and go on a shared machine
    real_listdir = os.listdir
    monkeypatch.setattr(
        os,
        "listdir",
        lambda path=".": [n for n in real_listdir(path) if path != "/proc" or not n.isdigit() or int(n) in ours],
    )
    walks = []
    procs = agent_procs.Procs(psutil)
    real_table = procs._table
    monkeypatch.setattr(procs, "_table", lambda *a: (walks.append(1), real_table(*a))[1])
    cursor = [agent_procs._last_pid()]
    monkeypatch.setattr(procs_mod, "_last_pid", lambda: cursor[0])
    try:
        procs.configure(patterns=["sglang::*"])
        procs.sample(time.monotonic(), force_scan=True)
        assert walks == [1] and young.pid not in procs.watched
        for _ in range(2):
            cursor[0] += 1  # a thread was born somewhere: the scan is due, the table stands
            procs.scan(quick=True)
        assert walks == [1]

        young.stdin.write("go\n")
        young.stdin.flush()
        assert young.stdout.readline().strip() == "retitled"
        cursor[0] += 1
        procs.scan(quick=True)  # young: read afresh, its new title seen now
        assert walks == [1, 1] and young.pid in procs.watched

        born = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import subprocess,sys\nopen('/proc/self/comm', 'w').write('sglang::born')\n"
                "print('up', flush=True)\nsys.stdin.readline()\n"
                "print(subprocess.Popen(['sleep', '60']).pid, flush=True)\nsys.stdin.readline()",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert born.stdout.readline().strip() == "up"
        ours.add(born.pid)
        cursor[0] = max(cursor[0] + 1, born.pid)
        procs.scan(quick=True)
        assert len(walks) == 3 and born.pid in procs.watched

        procs.scan(quick=True)
        assert len(walks) == 3
        born.stdin.write("fork\n")
        born.stdin.flush()
        child = int(born.stdout.readline())
        ours.add(child)
        cursor[0] = max(cursor[0] + 1, child)  # the scan moves the ticks' cursor past the child:
        procs.scan(quick=True)  # so a watched process's new child is a walk, not left to the ticks
        assert len(walks) == 4 and child in procs.watched
        young.kill()
        young.wait()
        procs.scan(quick=True)
        assert len(walks) == 4  # a death: no walk
        _, gone = procs.sample(time.monotonic())
        assert gone == [young.pid] and set(procs.watched) == {born.pid, child}  # the tick's work
        other = subprocess.Popen(["sleep", "60"])
        ours.add(other.pid)
        cursor[0] = max(cursor[0] + 1, other.pid)
        procs.scan(quick=True)
        assert len(walks) == 4 and other.pid not in procs.watched  # born, no root: read, no walk
        assert procs._rows[other.pid][3] == "sleep"
        procs.configure(patterns=["nothing-matches-this"])
        procs.scan(quick=True)
        assert len(walks) == 5 and not procs.watched
    finally:
        procs.close()
        young.kill()
        young.wait()
        for p in (born, other):
            if p is not None:
                p.kill()
                p.wait()
        if child is not None:
            os.kill(child, 9)
