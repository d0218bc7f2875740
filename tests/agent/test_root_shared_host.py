"""Root on a shared host (issue 25): never run, open or believe what another user controls.
Throwaway users made with useradd, their real processes and files: the agent reads the run's
package versions from metadata files and runs nothing of theirs; a log its owner swaps for a
symlink, a FIFO or someone else's file is refused and said, never read nor blocked on."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

from fixtures_shared import as_user, chown_tree

from cockpit.agent import agent_source, facts as agent_facts, logs as agent_logs, main as agent_main, shm as agent_shm

PY = "/usr/bin/python3"  # the system python: this test's venv is root's, another user cannot run it


def end(*procs: subprocess.Popen) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(10)


# ----------------------------------------------------------------------------- 1: versions


def test_versions_are_read_from_metadata_files_and_nothing_of_another_users_runs(users, shared):
    """A process of another user mapping a file in its own site-packages, which holds a csv.py
    (importlib.metadata imports csv) and a sitecustomize.py: asked for the run's versions, the
    agent runs neither (no mark file), and reads torch's version from its METADATA; a METADATA
    that is a symlink to a root-only file, or a third user's file, is refused and named."""
    evil, other = users
    site = shared / "venv" / "lib" / "python3.99" / "site-packages"
    site.mkdir(parents=True)
    mark = shared / "ran-as-root"
    payload = f"import os\nopen({str(mark)!r}, 'w').write(str(os.getuid()))\n"
    for name in ("csv.py", "sitecustomize.py", "json.py"):
        (site / name).write_text(payload)
    (site / "torch-9.9.9.dist-info").mkdir()
    (site / "torch-9.9.9.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: torch\nVersion: 9.9.9\n\nVersion: 0 (the body is not read)\n"
    )
    secret = shared / "root-only"
    secret.write_text("Version: root-secret\n")
    secret.chmod(0o600)
    (site / "vllm-1.0.dist-info").mkdir()
    (site / "vllm-1.0.dist-info" / "METADATA").symlink_to(secret)
    (site / "sglang-1.0.dist-info").mkdir()
    (site / "sglang-1.0.dist-info" / "METADATA").write_text("Version: other-users\n")
    (site / "blob.so").write_bytes(b"\0" * 4096)
    chown_tree(shared / "venv", evil)
    os.chown(site / "sglang-1.0.dist-info" / "METADATA", other, other)
    os.chmod(shared, 0o777)
    code = (
        "import mmap, sys, time\nf = open(sys.argv[1], 'rb')\nm = mmap.mmap(f.fileno(), 4096, prot=mmap.PROT_READ)\n"
        "print('ok', flush=True)\ntime.sleep(120)\n"
    )
    proc = subprocess.Popen(
        [PY, "-S", "-c", code, str(site / "blob.so")],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=as_user(evil),
        cwd="/",
    )
    try:
        assert proc.stdout.readline().strip() == "ok"
        facts = agent_facts.host_facts(["versions"], [proc.pid])
        assert not mark.exists(), f"another user's file ran as uid {mark.read_text()}"
        run = facts["versions"]["data"]["run"]
        assert run["torch"] == "9.9.9" and run["python"] == "3.99" and run["read_from"] == "package metadata"
        assert run["vllm"] is None and run["sglang"] is None
        refused = " ".join(facts["versions"]["data"]["run_refused"])
        assert "vllm-1.0.dist-info: is a symbolic link" in refused and "sglang-1.0.dist-info: owned by" in refused
        assert "root-secret" not in str(facts) and "other-users" not in str(facts)
    finally:
        end(proc)


# ----------------------------------------------------------------------------- 2: logs


def _poll(tail: agent_logs.LogTail):
    """tail.poll() in a thread: a poll that blocks (in open() on a FIFO) fails the test, not hangs it."""
    out = []
    t = threading.Thread(target=lambda: out.append(tail.poll()), daemon=True)
    t.start()
    t.join(60)
    assert out, "the log's poll blocked"
    return out[0]


def test_a_log_its_owner_swaps_for_a_symlink_a_fifo_or_anothers_file_is_refused_never_read(users, shared, tmp_path):
    """A process of another user writes its stdout to a file it owns: stdout_of finds it and it is
    followed. The owner then swaps it for a symlink to a root-only file, a FIFO, a third user's
    file: each is refused, said once as `refused: why`, its content never read and the poll never
    blocked; the owner's own file back in place is followed again (checked on every reopen)."""
    owner, other = users
    os.chown(shared, owner, owner)
    log = shared / "run.log"
    proc = subprocess.Popen(
        ["sh", "-c", f"exec >>{log} 2>&1; echo line-one; exec sleep 120"], preexec_fn=as_user(owner), cwd="/"
    )
    secret = tmp_path / "root-only.txt"
    secret.write_text("ROOT SECRET\n")
    secret.chmod(0o600)
    try:
        for _ in range(200):
            if log.exists() and log.read_text():
                break
            threading.Event().wait(0.05)
        probe = agent_main.Agent.__new__(agent_main.Agent)
        probe.log_owners = {}
        found = probe.cmd_stdout_of([proc.pid])
        assert found == {str(proc.pid): str(log)} and probe.log_owners[str(log)] == {owner}
        tail = agent_logs.LogTail(str(log), probe.log_owners[str(log)])
        event, lines = _poll(tail)
        assert event == "opened" and lines == ["line-one"]

        said = []
        for swap, why in (("symlink", "is a symbolic link"), ("fifo", "not a regular file"), ("other", "owned by")):
            log.unlink()
            if swap == "symlink":
                log.symlink_to(secret)
            elif swap == "fifo":
                os.mkfifo(log, 0o666)
            else:
                log.write_text("ANOTHER USER'S\n")
            os.lchown(log, other if swap == "other" else owner, owner)
            event, lines = _poll(tail)
            assert event.startswith("refused: ") and why in event, event
            assert not any("SECRET" in x or "ANOTHER" in x for x in lines), lines
            said.append(event)
            event, lines = _poll(tail)  # said once, still not read
            assert event is None and lines == []
        log.unlink()
        log.write_text("line-two\n")
        os.chown(log, owner, owner)
        event, lines = _poll(tail)
        assert event == "created" and lines == ["line-two"]

        root_default = agent_logs.LogTail(str(log))  # a layout's log: root's or the agent's user's only
        event, lines = _poll(root_default)
        assert event.startswith("refused: ") and "owned by" in event and lines == []
    finally:
        end(proc)


# ----------------------------------------------------------------------------- 6: bundle member names

HOSTILE_HOST = """\
import json, subprocess, sys
# a host whose agent answers are rewritten on the way out: the flight recorder's rank keys
p = subprocess.Popen([{real!r}] + sys.argv[1:], stdout=subprocess.PIPE)
for line in p.stdout:
    try:
        f = json.loads(line)
        ranks = (f.get("data") or {{}}).get("ranks")
        if isinstance(ranks, dict) and ranks:
            d = next(iter(ranks.values()))
            f["data"]["ranks"] = {{"../../../../../tmp/{tag}": d, "0/../../x": d, "1e9": d, "0": d}}
            line = (json.dumps(f) + "\\n").encode()
    except ValueError:
        pass
    sys.stdout.buffer.write(line)
    sys.stdout.buffer.flush()
"""


def test_a_hostile_hosts_rank_keys_never_name_archive_members(tmp_path, monkeypatch):
    """The agent's answer passes through a host that renames the flight recorder's ranks to
    `../../…`, `0/../../x` and `1e9`: the bundle keeps rank 0's dump only, says each other key as
    not collected, and every member of the archive stays inside its folder."""
    import asyncio
    import sys
    import tarfile

    from test_flightrec_dump_safety import start_rank, stop

    from cockpit.host.session import SessionOptions, WatchList
    from cockpit.link.target import parse_target
    from cockpit.monitor.host import HostMonitor
    from cockpit.operate import bundle

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("FAKE_FR_TITLE_SUFFIX", f"_gck{os.getpid()}")  # this test's rank only, whatever else runs here
    tag = f"gck-escape-{os.getpid()}"
    wrapper = tmp_path / "python"
    wrapper.write_text(f"#!{sys.executable}\n" + HOSTILE_HOST.format(real=sys.executable, tag=tag))
    wrapper.chmod(0o755)
    rank = start_rank(0, tmp_path)

    async def go():
        monitor = HostMonitor(
            parse_target("local"),
            SessionOptions(python=str(wrapper), interval=0.25),
            None,
            watch=WatchList(patterns=[f"sglang::*_gck{os.getpid()}"]),
        )
        session = monitor.session
        await session.connect()
        try:
            await session.wait_samples(3)
            m = bundle._Members()
            await bundle._flight(monitor, m, read_only=False)
            return m
        finally:
            await session.close()

    try:
        m = asyncio.run(go())
    finally:
        stop(rank)
    assert "flight-recorder/rank0.pickle" in m.files
    assert not any(".." in name or "1e9" in name or tag in name for name in m.files), sorted(m.files)
    said = " ".join(x["why"] for x in m.missing)
    assert "'../../../../../tmp/" in said and "'0/../../x'" in said and "'1e9'" in said
    path, names = bundle._write(tmp_path, m, {"members": []})
    with tarfile.open(path) as tar:
        members = tar.getnames()
    assert members == names and all(
        n.startswith(path.name.removesuffix(".tar.gz") + "/") and ".." not in n for n in members
    )
    assert not Path("/tmp", tag + ".pickle").exists()


# ----------------------------------------------------------------------------- 1 and 4: the bundle, for real

SECRETS = [
    "sk-live0123456789abcdefXYZ",
    "hf_abcdefghijklmnopqrstuvwx",
    "s3cretPassw0rd",
    "tok-7788-plain",
    "hunter2hunter2",
    "ghp_abcdefghijklmnopqrstuvwxyz0123",
    "Zm9vOmJhcg-bearer-token",
]
SECRET_LOG = [
    "[2026-01-01 00:00:00] server_args=ServerArgs(model_path='/models/llama', tokenizer_path='/models/llama', "
    f"api_key='{SECRETS[0]}', hf_token='{SECRETS[1]}', num_key_value_heads=8, port=30000, tp_size=2)",
    f"INFO 01-01 00:00:01 [api_server.py:1] non-default args: {{'model': '/models/llama', 'api_key': ['{SECRETS[0]}'], "
    f"'hf_token': '{SECRETS[1]}', 'tokenizer': '/models/llama', \"token\": \"{SECRETS[3]}\"}}",
    f"[2026-01-01 00:00:02] connecting to postgres://alice:{SECRETS[2]}@db.internal:5432/runs and "
    f"https://{SECRETS[5]}@github.com/x.git",
    f"[2026-01-01 00:00:03] HF_TOKEN={SECRETS[1]} password: {SECRETS[4]} --api-key {SECRETS[0]}",
    f"[2026-01-01 00:00:04] GET /v1/models headers={{'Authorization': 'Bearer {SECRETS[6]}'}}",
    "[2026-01-01 00:00:05] The server is fired up and ready to roll!",
]


def test_the_bundle_runs_nothing_of_another_users_lookalike_and_stores_no_secret(users, shared, tmp_path):
    """`cockpit bundle local --layout L --read-only` as root, with our run (its log full of the
    engines' secret shapes) and another user's process titled like the layout's server that maps
    a file in a folder holding a csv.py: nothing of that user runs (no mark file), the versions
    are not read from that user's process, and no secret is in the archive nor the snapshot."""
    import json
    import tarfile

    from conftest import run_cli

    evil = users[0]
    site = shared / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    mark = shared / "ran-as-root"
    (site / "csv.py").write_text(f"import os\nopen({str(mark)!r}, 'w').write(str(os.getuid()))\n")
    (site / "torch-6.6.6.dist-info").mkdir()
    (site / "torch-6.6.6.dist-info" / "METADATA").write_text("Name: torch\nVersion: 6.6.6\n")
    (site / "blob.so").write_bytes(b"\0" * 4096)
    chown_tree(shared / "lib", evil)
    os.chmod(shared, 0o777)
    log = tmp_path / "server.log"
    log.write_text("\n".join(SECRET_LOG) + "\n")
    code = (
        "import mmap, sys, time\nf = open(sys.argv[1], 'rb')\nm = mmap.mmap(f.fileno(), 4096, prot=mmap.PROT_READ)\n"
        "print('ok', flush=True)\ntime.sleep(120)\n"
    )
    lookalike = subprocess.Popen(
        [
            "bash",
            "-c",
            'exec -a "python3 -m sglang.launch_server" "$0" -S -c "$1" "$2"',
            PY,
            code,
            str(site / "blob.so"),
        ],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=as_user(evil),
        cwd="/",
    )
    ours = subprocess.Popen(
        ["bash", "-c", f'exec -a "python3 -m sglang.launch_server --api-key {SECRETS[0]}" sleep 120'],
        start_new_session=True,
    )
    layout = tmp_path / "l.yaml"
    layout.write_text(f"name: sec\nengine: sglang\ncommand: [-m, sglang.launch_server]\nlog: {log}\n")
    env = {"XDG_STATE_HOME": str(tmp_path / "state"), "XDG_RUNTIME_DIR": str(tmp_path / "rt")}
    try:
        assert lookalike.stdout.readline().strip() == "ok"
        snap = run_cli("snapshot", "local", "--layout", str(layout), "--json", "--wait", "0", env=env, timeout=120)
        assert snap.returncode == 0, snap.stderr
        assert "ready to roll" in snap.stdout
        for secret in SECRETS:
            assert secret not in snap.stdout, secret
        res = run_cli("bundle", "local", "--layout", str(layout), "--read-only", "--json", env=env, timeout=240)
        assert res.returncode == 0, res.stderr
        assert not mark.exists(), f"another user's csv.py ran as uid {mark.read_text()}"
        path = json.loads(res.stdout[res.stdout.index("{") :])["path"]
        with tarfile.open(path) as tar:
            texts = {
                m.name: tar.extractfile(m).read().decode("utf-8", "replace") for m in tar.getmembers() if m.isfile()
            }
        everything = "\n".join(texts.values())
        assert "ready to roll" in everything
        for secret in SECRETS:
            assert secret not in everything, (secret, [n for n, t in texts.items() if secret in t])
        versions = json.loads(next(t for n, t in texts.items() if n.endswith("/versions.json")))
        assert "6.6.6" not in json.dumps(versions) and str(shared) not in json.dumps(versions)
        missing = {x["item"]: x["why"] for x in json.loads(res.stdout[res.stdout.index("{") :])["missing"]}
        assert missing["nvidia-smi -q"].startswith("--read-only: nothing runs on the host but the agent")
    finally:
        end(lookalike)
        ours.kill()
        ours.wait(10)


# ----------------------------------------------------------------------------- 7: shm holders unreadable


def test_a_non_root_agent_that_cannot_read_the_holders_never_calls_a_file_unheld(users, shared):
    """The agent runs as a throwaway user (the system python, the agent's table of modules written
    where that user can read it, imported from memory as on a host); another throwaway user maps that user's `psm_…` file. The agent cannot read
    the other's /proc/PID/maps: the file is "cannot tell who holds it", not removable, and a clean
    keeps it. Once the holder is gone the same entry is still kept (root's processes stay unread)."""
    import json

    agent_user, holder_user = users
    folder = shared / "shm"
    folder.mkdir()
    victim = folder / "psm_gck_victim"
    victim.write_bytes(b"x" * 4096)
    victim.chmod(0o666)
    chown_tree(folder, agent_user)
    os.chmod(shared, 0o755)
    (shared / "agent.bin").write_bytes(agent_source())  # the bytes that travel to a host
    os.chmod(shared / "agent.bin", 0o644)
    code = (
        "import mmap, sys, time\nf = open(sys.argv[1], 'r+b')\nm = mmap.mmap(f.fileno(), 4096)\nf.close()\n"
        "print('ok', flush=True)\ntime.sleep(120)\n"
    )
    holder = subprocess.Popen(
        [PY, "-S", "-c", code, str(victim)], stdout=subprocess.PIPE, text=True, preexec_fn=as_user(holder_user), cwd="/"
    )
    run = (
        "import json, marshal, sys\na = marshal.loads(open(sys.argv[1], 'rb').read())\ng = {}\n"
        "exec(compile(a['modules']['memimport'], 'memimport.py', 'exec'), g)\n"
        "sys.meta_path.insert(0, g['TableImporter'](a['modules'], {}))\nfrom cockpit_agent import shm as agent_shm\n"
        "audit = agent_shm.shm_audit(sys.argv[2])\nclean = agent_shm.shm_clean(sys.argv[2], ['psm_gck_victim'], other_dir=True)\n"
        "print(json.dumps({'audit': audit, 'clean': clean}))\n"
    )
    try:
        assert holder.stdout.readline().strip() == "ok"
        out = subprocess.run(
            [PY, "-S", "-c", run, str(shared / "agent.bin"), str(folder)],
            capture_output=True,
            text=True,
            preexec_fn=as_user(agent_user),
            cwd="/",
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        doc = json.loads(out.stdout)
        entry = next(e for e in doc["audit"]["entries"] if e["name"] == victim.name)
        assert not entry["removable"] and entry["why"].startswith("cannot tell who holds it"), entry
        assert holder.pid in doc["audit"]["unreadable_pids"] or doc["audit"]["unreadable"] > 50
        assert doc["clean"]["removed"] == [] and victim.exists()
        assert doc["clean"]["skipped"][0]["why"].startswith("cannot tell who holds it")
    finally:
        end(holder)
    as_root = agent_shm.shm_audit(str(folder))  # root reads every process: unheld and ours is removable as before
    assert as_root["unreadable"] == 0


# ----------------------------------------------------------------------------- 8: serve


def test_serve_takes_only_loopback_hosts_and_never_logs_its_token(tmp_path):
    """A real `cockpit serve`: Host `127.evil.example` (a DNS-rebound name that starts like a
    loopback address) is refused, `localhost`, `127.0.0.1` and `[::1]`-style literals are served;
    the access log of those requests never carries the token (only the URL printed at start)."""
    import asyncio

    import aiohttp
    from test_browser import start_serve

    from cockpit.serve import is_loopback

    assert not any(is_loopback(h) for h in ("127.evil.example", "127.0.0.1.nip.io", "localhost.evil", "0.0.0.0", ""))
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.9.9.9", "localhost", "LOCALHOST.", "::1", "[::1]"))
    server, url = start_serve(tmp_path, "local", "--python", "/bin/false")
    base, token = url.split("/?token=")
    port = base.rsplit(":", 1)[1]

    async def probe():
        out = {}
        async with aiohttp.ClientSession() as http:
            for host in ("127.evil.example", "127.0.0.1.evil.example", "localhost", "127.0.0.1"):
                async with http.get(f"{base}/?token={token}", headers={"Host": f"{host}:{port}"}) as r:
                    out[host] = r.status
        return out

    try:
        got = asyncio.run(probe())
        time.sleep(0.5)  # let the server write its access log lines (what is checked is their content)
    finally:
        os.killpg(server.pid, 15)
        server.wait(10)
    assert got == {"127.evil.example": 403, "127.0.0.1.evil.example": 403, "localhost": 200, "127.0.0.1": 200}, got
    log = (tmp_path / "serve.log").read_text()
    assert log.count(token) == 1 and "Serving gpu-cockpit on" in log, log  # the URL printed at start, nothing else
    assert "GET /" in log  # requests are logged, without the token


# ----------------------------------------------------------------------------- 9: the link and its frames


def test_a_python_wrapper_that_does_not_exec_never_hangs_a_snapshot(tmp_path):
    """`--python` names a shell script that runs python as a child (no exec) and waits: the
    snapshot ends (the agent's stdin is closed and its process group killed), and the agent
    under the wrapper is gone after it."""
    import sys

    from conftest import run_cli

    pidfile = tmp_path / "agent.pid"
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\nexec 3<&0\n"{sys.executable}" "$@" <&3 3<&- &\necho $! > {pidfile}\nwait $!\n')
    wrapper.chmod(0o755)
    res = run_cli("snapshot", "local", "--python", str(wrapper), "--json", "--wait", "0", timeout=120)
    assert res.returncode == 0, res.stderr
    pid = int(pidfile.read_text())
    for _ in range(200):  # the killed agent reaped by whoever inherited it
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except FileNotFoundError:
            break
        if state == "Z":
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"the agent {pid} under the wrapper still runs")


HOSTILE_FRAMES = """\
import json, subprocess, sys
# a host whose agent frames are damaged on the way out: non-finite numbers, fields of the wrong
# type, and one frame of empty objects that would cost gigabytes to decode
p = subprocess.Popen([{real!r}] + sys.argv[1:], stdout=subprocess.PIPE)
bombed = False
for line in p.stdout:
    try:
        f = json.loads(line)
    except ValueError:
        f = None
    if isinstance(f, dict) and f.get("t") == "sample":
        f["gpus"] = [{{"index": 0, "util_pct": float("nan"), "power_w": float("inf"), "temp_c": "hot",
                      "mem_used_mib": 100}}, {{"index": "1"}}]
        procs = f.get("procs") or []
        if procs:
            procs[0]["threads"] = "many"
            procs[0]["cpu_pct"] = float("-inf")
        procs.append({{"pid": "x"}})
        f["procs"] = procs
        f["exits"] = [["a", 1]]
        f["gone"] = f.get("gone", []) + ["x", None, 1.5, -1, 2 ** 70]
        line = (json.dumps(f) + "\\n").encode()
        if not bombed:
            bombed = True
            sys.stdout.buffer.write(b'{{"v": ' + json.dumps(f["v"]).encode() + b', "t": "sample", "procs": ['
                                    + b"{{}}," * (1 << 21) + b'{{}}]}}\\n')
    if isinstance(f, dict) and f.get("t") == "log":
        f["mtime"] = "yesterday"
        line = (json.dumps(f) + "\\n").encode()
    sys.stdout.buffer.write(line)
    sys.stdout.buffer.flush()
"""


def test_a_host_sending_nan_wrong_types_and_a_costly_frame_keeps_its_link_and_json_valid(tmp_path):
    """Through a host that damages the agent's frames: `snapshot --json` exits 0 with strictly
    valid JSON (NaN and infinities are null), the wrongly typed fields are dropped and counted in
    the snapshot (`dropped_fields`, and a warning), the GPU's good fields are kept, and the frame
    of two million empty objects is skipped and said, not decoded."""
    import json
    import sys

    from conftest import run_cli

    wrapper = tmp_path / "python"
    wrapper.write_text(f"#!{sys.executable}\n" + HOSTILE_FRAMES.format(real=sys.executable))
    wrapper.chmod(0o755)
    log = tmp_path / "run.log"
    log.write_text("[2026-01-01 00:00:00] Load weight begin.\n")
    layout = tmp_path / "l.yaml"
    layout.write_text(f"name: frames\nengine: sglang\ncommand: [-m, sglang.launch_server]\nlog: {log}\n")
    res = run_cli(
        "snapshot", "local", "--python", str(wrapper), "--layout", str(layout), "--json", "--wait", "0", timeout=120
    )
    assert res.returncode == 0, res.stderr

    def refuse(name):
        raise ValueError(f"{name} in --json")

    doc = json.loads(res.stdout, parse_constant=refuse)
    dropped = doc["agent"]["dropped_fields"]
    assert dropped.get("gpus.temp_c") and dropped.get("gpus.index") and dropped.get("procs.pid"), dropped
    assert dropped.get("exits") and dropped.get("log.mtime") and dropped.get("frames too costly to decode") == 1
    assert any("of the wrong type, dropped" in w for w in doc["agent"]["warnings"])
    gpu = next(g for g in doc["gpus"] if g["index"] == 0)
    assert gpu["util_pct"] is None and gpu["power_w"] is None and gpu["mem_used_mib"] == 100
    assert "Load weight begin." in res.stdout


def test_a_newline_inside_a_target_name_is_refused_in_one_line():
    """`$` matches before a trailing newline: `docker:web\\n@HOST` and `slurm:12\\n/n1` passed the
    name checks as `web\\n` and `12\\n`. Anchored with \\Z they are refused, in one line, by the
    real command."""
    from conftest import run_cli

    for target in ("docker:web\n@localhost", "podman:web\n@localhost", "slurm:12\n/n1", "slurm:12/n1\n@localhost"):
        res = run_cli("snapshot", target, "--json", timeout=60)
        assert res.returncode == 2 and "malformed target" in res.stderr, (target, res.stderr)
        assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr
    from cockpit.agent.kill import _INTERPRETER, _SUBCOMMAND

    assert not _INTERPRETER.match("python3\n") and not _SUBCOMMAND.match("serve\n")
