"""Root on a shared host, part three: throwaway users made with useradd, their real files and
folders, real processes. A launched server never imports from the folder the cockpit started in,
nor from a workdir another user can change; the interpreter's whole import path (every
site-packages, what a .pth names, sitecustomize) is checked before it runs as root, for the agent
and for the server alike."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import free_port
from fixtures_shared import chown_tree
from test_shared_host_two import cockpit, plant

from cockpit.agent.guard import PROBE, roots
from cockpit.sim import fakenvml

PY = "/usr/bin/python3"

FAST = """\
name: fast
engine: sglang
command: [-m, cockpit.sim.server]
base_flags: [--tp-size, "2", --host, 127.0.0.1, --port, "{port}", --sim-traffic, "2"]
log_dir: {logs}
ports: [{port}]
endpoints: [/health]
stall: {{idle_s: 3, spin_s: 3}}
kill_wait_s: 2
sim: {{gpus: 2, model: rtx-pro-6000, seed: 7, speed: 4}}
"""


@pytest.fixture
def sim_host(tmp_path, monkeypatch):
    """A simulated host's state, a private state folder (the ledger, the host's record) and a
    fast layout; every run the test launched is ended by its process group."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    sim = tmp_path / "sim"
    fakenvml.write_host(str(sim), gpus=2, model="rtx-pro-6000", seed=7)
    layout = tmp_path / "fast.yaml"
    layout.write_text(FAST.format(port=free_port(), logs=tmp_path / "logs"))
    yield sim, layout
    for rec in started(tmp_path):
        try:
            os.killpg(rec["pgid"], signal.SIGKILL)
        except OSError:
            pass


def started(tmp_path: Path) -> list[dict]:
    out = []
    for path in (tmp_path / "state").glob("gpu-cockpit/ledger/*.jsonl"):
        out += [r for r in map(json.loads, path.read_text().splitlines()) if r.get("event") == "started"]
    return out


def test_a_launch_from_another_users_folder_never_imports_from_it_and_their_workdir_is_refused(
    users, shared, sim_host, tmp_path
):  # noqa: F811
    """Another user's folder holds cockpit/__init__.py: `python -m cockpit...` started there runs
    it as root (the control). `cockpit launch` started there runs the server in `/`, the planted
    file never runs; a layout whose workdir is that folder is refused in one line naming
    --trust-python, nothing launched."""
    evil, _ = users
    sim, layout = sim_host
    home = shared / "evil-home"
    (home / "cockpit").mkdir(parents=True)
    mark = shared / "ran"
    plant(home / "cockpit", mark, ("__init__",))
    plant(home, mark, ("sglang",))
    chown_tree(home, evil)
    subprocess.run([sys.executable, "-c", "import cockpit"], cwd=home, capture_output=True)
    assert "__init__ ran as 0" in mark.read_text()  # the attack is real
    mark.unlink()
    res = cockpit(
        "launch",
        "local",
        "--layout",
        str(layout),
        "--sim",
        str(sim),
        "--yes",
        "--timeout",
        "120",
        "--interval",
        "0.25",
        cwd=str(home),
        timeout=240,
    )
    assert res.returncode == 0 and ": ready" in res.stdout, res.stderr[-2000:]
    assert not mark.exists(), mark.read_text()
    run = started(tmp_path)[-1]
    assert os.readlink(f"/proc/{run['pid']}/cwd") == "/"
    os.killpg(run["pgid"], signal.SIGKILL)

    theirs = tmp_path / "theirs.yaml"
    theirs.write_text(layout.read_text().replace("name: fast", "name: theirs") + f"workdir: {home}\n")
    res = cockpit(
        "launch", "local", "--layout", str(theirs), "--sim", str(sim), "--yes", "--timeout", "60", cwd="/", timeout=240
    )
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert f"{home} (mode drwxr-xr-x, owner uid {evil}" in res.stderr and "--trust-python" in res.stderr, res.stderr
    assert "nothing was launched" in res.stderr
    assert not mark.exists(), mark.read_text()
    assert len(started(tmp_path)) == 1


def venv(where: Path) -> Path:
    """A root-owned venv of the system's Python, seeing the system's site-packages."""
    subprocess.run([PY, "-m", "venv", "--without-pip", "--system-site-packages", str(where)], check=True)
    return next((where / "lib").glob("python3*/site-packages"))


def test_what_a_pth_names_sitecustomize_pythonpath_and_an_editable_finder_of_another_user_never_run_as_root(
    users, shared, sim_host, tmp_path
):  # noqa: F811
    """A root-owned venv; in turn: a root-owned .pth (what `pip install -e` of a user's checkout
    writes) naming that user's folder, which holds sitecustomize.py and pynvml.py; a root-owned
    editable finder mapping a package to their folder; their .pth in the venv; PYTHONPATH naming
    their folder (the layout's env). A plain start runs their sitecustomize as root (the
    control). The server's launch through that interpreter is refused in one line naming what
    they can change; the agent, started without `site` (-S), runs none of it and still reads
    the site-packages (its path holds them, never what a .pth names)."""
    evil, _ = users
    sim, layout = sim_host
    site = venv(shared / "venv")
    python = shared / "venv" / "bin" / "python"
    mark = shared / "ran"
    proj = shared / "proj"
    proj.mkdir()
    plant(proj, mark, ("sitecustomize", "usercustomize", "pynvml", "mypkg"))
    chown_tree(proj, evil)
    (site / "_user_proj.pth").write_text(f"{proj}\n")
    subprocess.run([str(python), "-c", "pass"], cwd="/", capture_output=True)
    assert "usercustomize ran as 0" in mark.read_text()  # the attack is real (Debian's own sitecustomize comes first)
    mark.unlink()

    def launch(layout_text: str) -> subprocess.CompletedProcess:
        path = tmp_path / "venv.yaml"
        path.write_text(layout_text)
        return cockpit("launch", "local", "--layout", str(path), "--yes", "--timeout", "30", cwd="/", timeout=240)

    server = f"name: venv\npython: {python}\ncommand: [-m, mypkg]\nlog_dir: {tmp_path / 'logs'}\n"
    finder = site / "__editable___mypkg_0_1_finder.py"
    cases = [
        ("pth", lambda: None, str(proj)),
        (
            "finder",
            lambda: (
                (site / "_user_proj.pth").unlink(),
                finder.write_text(
                    f"MAPPING: dict[str, str] = {{'mypkg': '{proj}/mypkg'}}\nNAMESPACES: dict[str, list[str]] = {{}}\n"
                ),
            ),
            str(proj),
        ),
        (
            "their pth",
            lambda: (
                finder.unlink(),
                (site / "theirs.pth").write_text("import os\n"),
                os.chown(site / "theirs.pth", evil, evil),
            ),
            str(site / "theirs.pth"),
        ),
    ]
    for what, arrange, named in cases:
        arrange()
        res = launch(server)
        assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, (what, res.stderr)
        assert f"{python} is not run as root: {named} (mode" in res.stderr and "--trust-python" in res.stderr, (
            what,
            res.stderr,
        )
        assert not mark.exists(), (what, mark.read_text())
    (site / "theirs.pth").unlink()
    res = launch(server + f"env: {{PYTHONPATH: {proj}}}\n")
    assert res.returncode == 2 and f"{python} is not run as root: {proj} (mode" in res.stderr, res.stderr
    assert not mark.exists(), mark.read_text()
    assert started(tmp_path) == []

    # Debian's scheme of /usr/local: `site` adds PREFIX/local/lib/python3.X/dist-packages, first
    local = shared / "venv" / "local" / "lib" / site.parent.name / "dist-packages"
    local.mkdir(parents=True)
    plant(local, mark, ("pynvml",))
    chown_tree(shared / "venv" / "local", evil)
    subprocess.run([str(python), "-c", "import pynvml"], cwd="/", capture_output=True)
    assert mark.exists() or not Path("/etc/debian_version").exists()  # Debian's Python: the attack is real
    if mark.exists():  # the agent's own start is refused
        mark.unlink()
        res = cockpit("snapshot", "local", "--python", str(python), "--sim", str(sim), "--json", "--wait", "0", cwd="/")
        assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
        assert f"{python} is not run as root: {local} (mode" in res.stderr, res.stderr
        assert not mark.exists(), mark.read_text()
    shutil.rmtree(shared / "venv" / "local")

    (site / "_user_proj.pth").write_text(f"{proj}\n")  # the agent: -S, so no .pth runs and what one names is no path
    ours = shared / "ours"
    (site / "pynvml.py").write_text(
        f"open({str(ours)!r}, 'a').write('site-packages read\\n')\nraise ImportError('not a real NVML')\n"
    )  # root's own: the agent imports it
    res = cockpit("snapshot", "local", "--python", str(python), "--sim", str(sim), "--json", "--wait", "0", cwd="/")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["agent"]["executable"] == str(python)
    assert not mark.exists(), mark.read_text()
    # what the agent's first step (start.py) does under -I -S: the site folders on its path, no .pth
    start = PROBE + "\nsys.path.extend(site_dirs(user=False))\ntry:\n import pynvml\nexcept ImportError:\n pass\n"
    subprocess.run([str(python), "-I", "-S", "-c", start], cwd="/", check=True)
    assert ours.read_text() == "site-packages read\n" and not mark.exists()


def test_the_check_lists_every_site_folder_site_adds_debians_usr_local_included(tmp_path):
    """What the check walks, asked of the system's interpreter itself: the folders `site` would
    add (on Debian /usr/local/lib/python3.X/dist-packages first), each .pth there and what it
    names, the sitecustomize it would import; with -S the site folders alone."""
    probe = subprocess.run(
        [PY, "-I", "-S", "-c", "import site,sys;print(repr(site.getsitepackages()))"],
        capture_output=True,
        text=True,
        check=True,
    )
    sites = eval(probe.stdout)  # noqa: S307  (the repr of a list of str)
    listed = subprocess.run(
        [PY, "-I", "-S", "-", "-m", "x"], input=PROBE, capture_output=True, text=True, cwd=tmp_path, check=True
    )
    got, above = (part.split("\n") for part in listed.stdout.split("\n-\n"))  # what it imports from; the folders above
    for folder in sites:  # one not there yet: where it would be made
        assert folder in (got if os.path.exists(folder) else above), (folder, got, above)
    debian = [s for s in sites if s.startswith("/usr/local/lib/python3") and s.endswith("dist-packages")]
    if os.path.exists("/etc/debian_version") and Path(PY).resolve().parent == Path("/usr/bin"):
        assert debian and debian[0] == sites[0] and debian[0] in got
    for pth in (p for s in sites if os.path.isdir(s) for p in Path(s).glob("*.pth") if not p.name.startswith(".")):
        assert str(pth) in got
    assert str(tmp_path) in got  # the folder it starts in: `-m` imports from it
    isolated = roots(["-I", "-S", "-c", "pass"])
    assert str(tmp_path) not in isolated and not any(p.endswith(".pth") for p in isolated)


# ----------------------------------------------------------------------------- 3: a slow-drip peer


class Drip:
    """A peer on loopback that accepts every connection and answers one byte every 0.1 s, for
    ever: each HTTP read of it succeeds, none ever ends. Counts the connections still open."""

    def __init__(self):
        import socket
        import threading

        self.srv = socket.socket()
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen(64)
        self.port = self.srv.getsockname()[1]
        self.stop = threading.Event()
        self.open = 0
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        import threading

        while not self.stop.is_set():
            try:
                conn, _ = self.srv.accept()
            except OSError:
                return
            threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn):
        with self.lock:
            self.open += 1
        try:
            conn.sendall(b"HTTP/1.0 200 OK\r\n")
            while not self.stop.wait(0.1):
                conn.sendall(b"x")
        except OSError:
            pass  # the reader hung up
        finally:
            conn.close()
            with self.lock:
                self.open -= 1

    def close(self):
        self.stop.set()
        self.srv.close()


def counts(pid: int) -> tuple[int, int]:
    """The process's threads and open file descriptors."""
    threads = int(
        next(
            line.split()[1]
            for line in Path(f"/proc/{pid}/status").read_text().splitlines()
            if line.startswith("Threads:")
        )
    )
    return threads, len(os.listdir(f"/proc/{pid}/fd"))


def test_a_slow_drip_peer_on_a_probed_port_costs_the_agent_nothing_that_grows():
    """A listener that drips a byte every 0.1 s, probed and scraped again and again (each round
    the cockpit gives up waiting before the agent would, as a monitor does, then asks again):
    every request ends at its one deadline whatever the pace, at most one is in flight per port
    (the others answered at once as busy), so the agent's threads and descriptors stay flat
    round after round and the peer's connections are closed."""
    import asyncio

    from cockpit.common.errors import CockpitError
    from cockpit.host.session import HostSession, SessionOptions, WatchList
    from cockpit.link.target import parse_target

    drip = Drip()

    async def main():
        session = HostSession(
            parse_target("local"), SessionOptions(python=sys.executable, interval=0.5), WatchList(patterns=[])
        )
        await session.connect()
        pid = session.state.agent.pid
        seen, busy = [counts(pid)], 0
        try:
            for _ in range(40):
                asks = [session.request("http", port=drip.port, path="/health", timeout=0.3) for _ in range(3)]
                asks += [session.request("metrics", port=drip.port, timeout=0.3) for _ in range(3)]
                for got in await asyncio.gather(*asks, return_exceptions=True):
                    busy += isinstance(got, dict) and bool(got.get("busy"))
                    assert isinstance(got, (dict, CockpitError)), got
                seen.append(counts(pid))
            for _ in range(600):  # the last round's requests end at their deadline (a bound for a stuck test)
                if drip.open == 0:
                    break
                await asyncio.sleep(0.05)
            return seen, busy, counts(pid)
        finally:
            await session.close()

    try:
        seen, busy, last = asyncio.run(main())
    finally:
        drip.close()
    # the first rounds against the last ones: the same one request in flight to the port (a thread
    # and a socket) at most, give or take a busy answer's thread not yet gone when counted
    early = max(t for t, _ in seen[:6]), max(f for _, f in seen[:6])
    late = max(t for t, _ in seen[-20:]), max(f for _, f in seen[-20:])
    assert late[0] <= early[0] + 2 and late[1] <= early[1] + 1, (early, late, seen)
    assert busy > 0  # a second request to the port while one is under way: answered at once
    assert drip.open == 0 and last[1] <= early[1], (last, early)


# ----------------------------------------------------------------------------- 4: the ledger


def test_the_ledger_is_opened_as_the_hosts_record_is(users, shared, tmp_path, monkeypatch):  # noqa: F811
    """A relative XDG_STATE_HOME is ignored (the XDG spec): the ledger goes to ~/.local/state.
    A ledger folder that is a symbolic link to another user's folder, a ledger file that is a
    link, one another user made, a folder another user owns: each refused in one line (what to
    remove), nothing written through it, nothing read from it believed."""
    from cockpit.common.errors import CockpitError
    from cockpit.runs.config import Layout
    from cockpit.runs.ledger import append_ledger, ledger_path, read_ledger

    evil, _ = users
    layout = Layout(path=str(tmp_path / "x.yaml"), name="x")
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_STATE_HOME", "rel/state")
    append_ledger(layout, {"event": "launch", "run_id": "r1"})
    assert ledger_path(layout) == home / ".local/state/gpu-cockpit/ledger/x.jsonl" and ledger_path(layout).exists()
    assert not (tmp_path / "rel").exists() and read_ledger(layout)[0]["run_id"] == "r1"

    state = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    theirs = shared / "theirs"
    theirs.mkdir()
    (theirs / "x.jsonl").write_text('{"event": "started", "run_id": "forged", "pgid": 1, "start": 1}\n')
    chown_tree(theirs, evil)
    (state / "gpu-cockpit").mkdir(parents=True)
    ledger = state / "gpu-cockpit" / "ledger"

    def refused(match: str) -> None:
        before = (theirs / "x.jsonl").read_text()
        for act in (lambda: append_ledger(layout, {"event": "launch", "run_id": "r2"}), lambda: read_ledger(layout)):
            with pytest.raises(CockpitError, match=match) as err:
                act()
            assert "\n" not in str(err.value) and "remove it" in str(err.value)
        assert (theirs / "x.jsonl").read_text() == before

    ledger.symlink_to(theirs)  # the folder a link to theirs
    refused("symbolic link")
    ledger.unlink()
    ledger.mkdir(mode=0o700)
    (ledger / "x.jsonl").symlink_to(theirs / "x.jsonl")  # the file a link
    refused("symbolic link")
    (ledger / "x.jsonl").unlink()
    shutil.copy(theirs / "x.jsonl", ledger / "x.jsonl")
    os.chown(ledger / "x.jsonl", evil, evil)  # a file another user made
    refused("not a plain file of this user")
    os.chown(ledger / "x.jsonl", 0, 0)
    os.chown(ledger, evil, evil)  # a folder another user owns
    refused("not a folder of this user")


# ----------------------------------------------------------------------------- 5: signals and a closed output

SLOW = (
    FAST.replace("speed: 4", "speed: 0.5")
    + """\
flag_sets:
  eagle3: [--speculative-algorithm, EAGLE3, --speculative-num-steps, "3"]
  no_cuda_graph: [--disable-cuda-graph]
enabled: [eagle3, no_cuda_graph]
"""
)


def ledger_records(tmp_path: Path) -> list[dict]:
    out = []
    for path in (tmp_path / "state").glob("gpu-cockpit/ledger/*.jsonl"):
        out += [json.loads(line) for line in path.read_text().splitlines()]
    return out


def gone(pgid: int) -> bool:
    """No process of the group is left but zombies (a leader whose parent, the agent, has ended
    waits for the init process to reap it)."""
    for entry in os.listdir("/proc"):
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()
        except (OSError, ValueError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return False
    return True


@pytest.mark.parametrize(
    "command, how",
    [
        ("launch", signal.SIGINT),
        ("launch", signal.SIGTERM),
        ("launch", signal.SIGHUP),
        ("launch", "closed stdout"),
        ("ablate", signal.SIGTERM),
        ("bisect", "closed stdout"),
    ],
)
def test_a_signal_or_a_closed_output_during_a_workflow_stops_its_run_as_ctrl_c_does(command, how, sim_host, tmp_path):
    """`cockpit launch|ablate|bisect ...` as a real process: once its run is started, SIGINT,
    SIGTERM, SIGHUP (a closed terminal), or its stdout's reader gone (`| head -1`, or `| tail`
    ended by the terminal's Ctrl+C): the run under way is stopped and verified gone, the ledger
    says so, and the command exits 130."""
    sim, layout = sim_host
    layout.write_text(SLOW.format(port=free_port(), logs=tmp_path / "logs"))
    extra = {"launch": [], "ablate": ["--vary", "no_cuda_graph"], "bisect": ["--vary", "eagle3,no_cuda_graph"]}[command]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-I",
            "-m",
            "cockpit",
            command,
            "local",
            "--layout",
            str(layout),
            "--sim",
            str(sim),
            "--yes",
            "--timeout",
            "300",
            "--interval",
            "0.25",
            *extra,
        ],
        cwd="/",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    try:
        for _ in range(1200):  # a bound for a stuck test, not a speed claim
            if started(tmp_path) or proc.poll() is not None:
                break
            import time

            time.sleep(0.1)
        assert started(tmp_path), proc.communicate(timeout=60)
        run = started(tmp_path)[0]
        if how == "closed stdout":
            proc.stdout.close()
        else:
            proc.send_signal(how)
        err = proc.stderr.read().decode()
        assert proc.wait(240) == 130, err[-3000:]
        assert "interrupted (" in err, err[-3000:]
        assert gone(run["pgid"]), err[-3000:]
        mine = [r for r in ledger_records(tmp_path) if r.get("run_id") == run["run_id"]]
        assert any(r.get("event") == "stop" for r in mine) and any(r.get("event") == "ended" for r in mine), mine
        assert len(started(tmp_path)) == 1  # nothing launched after the interrupt
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(60)


# ----------------------------------------------------------------------------- 6: the served page


def test_the_page_cockpit_serve_hands_the_browser_loads_nothing_from_another_host(tmp_path):
    """`cockpit serve` as a real process: the page (with this start's token) names no URL of
    another host, in any attribute, stylesheet rule or import (textual-serve's own template asks
    fonts.googleapis.com for its font); its font comes from the package's static folder, served."""
    import re
    import time
    import urllib.request
    from urllib.parse import urljoin, urlsplit

    from conftest import wait_port

    port = free_port()
    log = tmp_path / "serve.log"
    server = subprocess.Popen(
        [sys.executable, "-m", "cockpit", "serve", "local", "--python", "/bin/false", "--port", str(port)],
        stdout=open(log, "wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        cwd="/",
    )
    try:
        wait_port(port, 60)
        url = None
        for _ in range(600):  # a bound for a stuck test, not a speed claim
            m = re.search(r"Serving gpu-cockpit on (http://127\.0\.0\.1:%d/\?token=[\w-]+)" % port, log.read_text())
            if m:
                url = m.group(1)
                break
            time.sleep(0.05)
        assert url, log.read_text()
        page = urllib.request.urlopen(url, timeout=60).read().decode()
        named = re.findall(r"""\b(?:href|src|action)\s*=\s*["']?([^"'\s>]+)""", page, re.IGNORECASE)
        named += re.findall(r"""url\(\s*["']?([^"')]+)""", page) + re.findall(r"""@import\s+["']([^"']+)""", page)
        named = [urljoin(url, n) for n in named if not n.startswith(("data:", "#"))]
        assert named and all(urlsplit(n).netloc == f"127.0.0.1:{port}" for n in named), named
        assert "googleapis" not in page and "gstatic" not in page
        fonts = [n for n in named if n.endswith(".ttf")]
        assert fonts and all(urllib.request.urlopen(f, timeout=60).status == 200 for f in fonts), fonts
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(20)
