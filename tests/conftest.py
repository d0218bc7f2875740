"""Shared fixtures: a real OpenSSH sshd on loopback with keys made here, a simulated GPU host
state folder, and titled rank processes."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import NoReturn

import pytest

from cockpit.sim import fakenvml

pytest_plugins = ["fixtures_shared"]  # the fixtures more than one test module uses

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {port}")


class Sshd:
    """A real sshd on 127.0.0.1 that accepts only a key generated for the test session; its
    sessions' HOME is a folder of its own."""

    def __init__(self, root: Path):
        self.root = root
        self.port = free_port()
        self.user = (
            os.environ.get("USER") or subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
        )
        for name in ("host_key", "client_key"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(root / name)], check=True)
        (root / "authorized_keys").write_text((root / "client_key.pub").read_text())
        self.home = root / "home"  # its sessions' home (sshd would give the user's own: the seal holds over ssh too)
        self.home.mkdir(mode=0o700)
        host_pub = (root / "host_key.pub").read_text().split()
        self.host_key_line = f"[127.0.0.1]:{self.port} {host_pub[0]} {host_pub[1]}\n"
        self.known_hosts = root / "known_hosts"
        self.known_hosts.write_text(self.host_key_line)
        self.config = root / "sshd_config"
        self.config.write_text(
            textwrap.dedent(f"""\
            Port {self.port}
            ListenAddress 127.0.0.1
            HostKey {root}/host_key
            AuthorizedKeysFile {root}/authorized_keys
            PasswordAuthentication no
            KbdInteractiveAuthentication no
            UsePAM no
            PermitRootLogin prohibit-password
            StrictModes no
            PidFile {root}/sshd.pid
            LogLevel ERROR
            MaxSessions 50
            MaxStartups 100:30:200
            SetEnv HOME={self.home}
            """)
        )
        self.client_config = root / "ssh_config"
        self.client_config.write_text(
            textwrap.dedent(f"""\
            Host cockpit-test
                HostName 127.0.0.1
                Port {self.port}
                User {self.user}
                IdentityFile {root}/client_key
                IdentitiesOnly yes
                UserKnownHostsFile {self.known_hosts}
            """)
        )
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        os.makedirs("/run/sshd", exist_ok=True)
        self.proc = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(self.config)], stderr=open(self.root / "sshd.log", "ab")
        )
        wait_port(self.port)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(5)

    def cli_args(self) -> list[str]:
        return ["--ssh-config", str(self.client_config), "--known-hosts", str(self.known_hosts)]


# ----------------------------------------------------------------------------- what cannot run here
def cannot_run(reason: str) -> NoReturn:
    """A check that cannot run on this machine: skipped on a developer's, failed under CI (which
    installs every tool: scripts/test), so that nothing the suite claims is silently left out."""
    __tracebackhide__ = True  # the skip names the test's line, not this one
    if os.environ.get("CI"):
        pytest.fail(f"cannot run under CI: {reason}", pytrace=False)
    pytest.skip(reason)


def need(*tools: str, package: str) -> str:
    """The first tool's path; one missing cannot run (apt-get install PACKAGE)."""
    __tracebackhide__ = True
    paths = [
        shutil.which(t) or next((d + t for d in ("/usr/sbin/", "/sbin/") if os.path.exists(d + t)), None) for t in tools
    ]
    missing = [t for t, path in zip(tools, paths) if path is None]
    if missing:
        cannot_run(f"{', '.join(missing)} not installed: apt-get install {package} (scripts/test does)")
    return paths[0]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under CI a skip from anywhere (a skipif mark, a library's importorskip) is a failure with its reason."""
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("CI") and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, which must run every test: {reason}"


# ----------------------------------------------------------------------------- the seal
# Nothing a test runs may write into the machine's own state: the host's record of acts
# (~/.local/state/gpu-cockpit/host/acts.jsonl) is read by every cockpit of the host, run logs go to
# ~/.cache, demos to $XDG_RUNTIME_DIR. Each test (and, before any test starts, the session's and
# modules' fixtures) gets a home and XDG folders of its own; the processes it starts inherit them.
SEALED = {
    "HOME": "home",
    "XDG_STATE_HOME": "state",
    "XDG_CACHE_HOME": "cache",
    "XDG_CONFIG_HOME": "config",
    "XDG_DATA_HOME": "data",
    "XDG_RUNTIME_DIR": "run",
}


def seal(mp: pytest.MonkeyPatch, folder: Path) -> Path:
    for key, name in SEALED.items():
        (folder / name).mkdir(mode=0o700, exist_ok=True)
        mp.setenv(key, str(folder / name))
    return folder


@pytest.fixture(scope="session", autouse=True)
def sealed_session(tmp_path_factory):
    """The seal for what starts before any test's own: session and module fixtures (sshd, the engines)."""
    mp = pytest.MonkeyPatch()
    seal(mp, tmp_path_factory.mktemp("sealed-session"))
    yield
    mp.undo()


@pytest.fixture(autouse=True)
def sealed(sealed_session, tmp_path_factory, monkeypatch) -> Path:
    """This test's home and XDG folders (beside its tmp_path, never in it: a test owns that
    folder's listing); environment changes go through monkeypatch, undone after the test."""
    return seal(monkeypatch, tmp_path_factory.mktemp("sealed"))


@pytest.fixture(scope="session")
def sshd(tmp_path_factory):
    need("sshd", package="openssh-server")
    server = Sshd(tmp_path_factory.mktemp("sshd"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def sim_state(tmp_path):
    """A simulated 8-GPU host's NVML state folder."""
    folder = tmp_path / "sim"
    fakenvml.write_host(str(folder), gpus=8, model="rtx-pro-6000", seed=11)
    return folder


RANK_SCRIPT = textwrap.dedent("""\
    import os, sys, time, setproctitle
    from cockpit.sim import fakenvml
    title, gpu, mib, state = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    setproctitle.setproctitle(title)
    if gpu >= 0:
        fakenvml.register(state, os.getpid(), gpu, mib, "busy")
    print("ready", flush=True)
    time.sleep(600)
""")


class Ranks:
    """Real processes titled like SGLang's schedulers, each registered on its simulated GPU."""

    def __init__(self, state: Path):
        self.state = state
        self.procs: list[subprocess.Popen] = []

    def spawn(self, title: str, gpu: int = -1, mib: int = 0) -> subprocess.Popen:
        p = subprocess.Popen(
            [sys.executable, "-c", RANK_SCRIPT, title, str(gpu), str(mib), str(self.state)],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        assert p.stdout.readline().strip() == "ready"
        self.procs.append(p)
        return p

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


@pytest.fixture
def ranks(sim_state):
    r = Ranks(sim_state)
    yield r
    r.stop()


def run_cli(
    *args: str, timeout: float = 60, env: dict | None = None, under: tuple[str, ...] = ()
) -> subprocess.CompletedProcess:
    """The real `cockpit` command in a subprocess, as a user runs it (`under` a wrapper such as
    `unprivileged()`, when given)."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        [*under, sys.executable, "-m", "cockpit", *args], capture_output=True, text=True, timeout=timeout, env=full_env
    )


def unprivileged() -> tuple[str, ...]:
    """A wrapper that runs a command as this user without the privilege to override file
    permissions: for root (as CI runs), setpriv drops CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH
    (so a read-only folder is read-only, as for any user) while root's own files, the venv's
    interpreter among them, stay readable."""
    if os.geteuid() != 0:
        return ()
    caps = "-dac_override,-dac_read_search"
    return (need("setpriv", package="util-linux"), f"--inh-caps={caps}", f"--bounding-set={caps}")


@pytest.fixture
def shared():
    """A folder other users can reach (pytest's tmp_path is root's only), removed after."""
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="gpu-cockpit-test-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


# ----------------------------------------------------------------------------- tiers
# Each test is marked by the heaviest thing it starts (README "Run the tests"): `browser` (headless
# Chromium), `engines` (slurmctld/slurmd, Docker, Podman), `sshd` (a real OpenSSH server), `ui` (a
# Textual app, live or headless), `sim` (real processes: the simulated host, an agent, the CLI),
# else `unit`. A test that took over SLOW_S in the last full run (tests/slow-tests.txt, written by
# `--tier-report=FILE`) is also marked `slow`. `./scripts/test --fast` runs `unit` and `sim`, not `slow`.
TIERS = ("browser", "engines", "sshd", "ui", "sim", "unit")
SLOW_S = 3.0
SLOW_LIST = Path(__file__).with_name("slow-tests.txt")
_STARTS = {
    "browser": lambda fx, src: "chromium" in src or "webdriver" in src,
    "engines": lambda fx, src: bool({"slurm", "container_engine"} & fx) or 'need("prometheus"' in src,
    "sshd": lambda fx, src: "sshd" in fx,
    "ui": lambda fx, src: (
        bool({"snap_compare", "live_app", "demo_env"} & fx)
        or "run_test(" in src
        or "run_headless(" in src
        or "save_text(" in src
        or "save_svg(" in src
    ),
    "sim": lambda fx, src: (
        bool({"sim_state", "started_elsewhere", "shared", "users"} & fx)
        or any(w in src for w in ("run_cli(", "subprocess", "HostMonitor(", "Popen(", "connect(", "start_agent"))
    ),
}


def tier_of(item) -> str:
    import inspect

    if item.path.name == "test_targets.py":  # every test there runs against the real engines' daemons
        return "engines"
    fixtures = set(getattr(item, "fixturenames", ()))
    try:
        src = inspect.getsource(item.function)
    except (OSError, TypeError, AttributeError):
        src = ""
    return next((t for t, starts in _STARTS.items() if starts(fixtures, src)), "unit")


def pytest_configure(config):
    for tier in TIERS:
        config.addinivalue_line("markers", f"{tier}: a test whose heaviest part is {tier} (tests/conftest.py)")
    config.addinivalue_line("markers", f"slow: took over {SLOW_S:.0f} s in the last full run (tests/slow-tests.txt)")


def pytest_collection_modifyitems(config, items):
    slow = set(SLOW_LIST.read_text().splitlines()) if SLOW_LIST.exists() else set()  # an id may hold spaces
    for item in items:
        item.add_marker(getattr(pytest.mark, tier_of(item)))
        if item.nodeid in slow:
            item.add_marker(pytest.mark.slow)


def pytest_addoption(parser):
    parser.addoption(
        "--tier-report",
        metavar="FILE",
        help="write each tier's count and time, and the slowest tests, as markdown (docs/TEST-DURATIONS.md)",
    )


_took: dict[str, float] = {}


def pytest_runtest_logreport(report):
    _took[report.nodeid] = _took.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session, exitstatus):
    path = session.config.getoption("--tier-report", None)
    if not path or not _took:
        return
    tiers = {item.nodeid: tier_of(item) for item in session.items}
    lines = [
        "# Test durations",
        "",
        f"What `{' '.join(['pytest', *session.config.invocation_params.args])}` took, by tier (tests/conftest.py marks "
        "each test by the heaviest thing it starts), on this project's 2-core machine. Written by `--tier-report`.",
        "",
        "| tier | tests | seconds |",
        "|---|---:|---:|",
    ]
    for tier in TIERS:
        ids = [n for n, t in tiers.items() if t == tier and n in _took]
        lines.append(f"| {tier} | {len(ids)} | {sum(_took[n] for n in ids):.0f} |")
    lines.append(f"| all | {len(_took)} | {sum(_took.values()):.0f} |")
    lines += ["", "The slowest 30:", "", "| seconds | tier | test |", "|---:|---|---|"]
    for nodeid, took in sorted(_took.items(), key=lambda kv: -kv[1])[:30]:
        lines.append(f"| {took:.1f} | {tiers.get(nodeid, '?')} | `{nodeid}` |")
    Path(path).write_text("\n".join(lines) + "\n")
    whole = {str(Path(a).resolve()) for a in session.config.args} <= {str(Path(__file__).parent)}
    if whole and not (
        session.config.option.markexpr or session.config.option.keyword
    ):  # a full run: the slow list anew
        SLOW_LIST.write_text("".join(f"{n}\n" for n, took in sorted(_took.items()) if took > SLOW_S))
