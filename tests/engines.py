"""Real engines started by the tests themselves (recipes: docs/targets.md, measured on Debian 12 as
root without systemd): a Slurm cluster of two slurmd "nodes" on loopback with its own munged, a
Docker daemon on its own socket and data folder, and Podman with storage of its own. Each is stopped
by its pids and every trace removed (jobs, containers, storage, the netns mount) even when a test fails. Missing packages skip with the reason,
and fail under CI=true (`scripts/test` installs them: conftest's need)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from conftest import free_port, need


def _stop_pidfile(path: Path, timeout: float = 5.0) -> None:
    try:
        pid = int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _until(fn, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(0.1)
    raise TimeoutError(what)


class Slurm:
    """slurmctld + slurmd n1 + slurmd n2 on 127.0.0.1, munged on a socket of its own."""

    NODES = ("n1", "n2")

    def __init__(self, root: Path):
        self.root = root
        self.conf = root / "slurm.conf"
        self.munge = root / "munge"
        self.own = {"SLURM_CONF": str(self.conf)}

    @property
    def env(self) -> dict[str, str]:
        """The environment as it is now (the running test's sealed home and state), with the engine's own."""
        return {**os.environ, **self.own}

    def start(self) -> None:
        r = self.root
        for d in ("state", "log", "spool"):
            (r / d).mkdir(parents=True, exist_ok=True)
        self.munge.mkdir(mode=0o755, exist_ok=True)
        shutil.chown(self.munge, "munge", "munge")
        ports = [free_port() for _ in range(3)]
        nodes = "\n".join(
            f"NodeName={n} NodeHostname=localhost NodeAddr=127.0.0.1 Port={p} CPUs=1 RealMemory=1000"
            for n, p in zip(self.NODES, ports[1:])
        )
        self.conf.write_text(
            textwrap.dedent(f"""\
            ClusterName=cockpit
            SlurmctldHost=localhost
            SlurmctldPort={ports[0]}
            SlurmUser=root
            AuthType=auth/munge
            AuthInfo=socket={self.munge}/munge.sock
            StateSaveLocation={r}/state
            SlurmdSpoolDir={r}/spool/%n
            SlurmctldPidFile={r}/slurmctld.pid
            SlurmdPidFile={r}/slurmd-%n.pid
            SlurmctldLogFile={r}/log/slurmctld.log
            SlurmdLogFile={r}/log/slurmd-%n.log
            ProctrackType=proctrack/linuxproc
            TaskPlugin=task/none
            JobAcctGatherType=jobacct_gather/none
            AccountingStorageType=accounting_storage/none
            SelectType=select/cons_tres
            SelectTypeParameters=CR_Core
            MpiDefault=none
            MailProg=/bin/true
            ReturnToService=2
            KillWait=5
            """)
            + nodes
            + "\nPartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n"
        )
        subprocess.run(
            [
                "runuser",
                "-u",
                "munge",
                "--",
                "/usr/sbin/munged",
                f"--socket={self.munge}/munge.sock",
                f"--pid-file={self.munge}/munged.pid",
                f"--log-file={self.munge}/munged.log",
                f"--seed-file={self.munge}/seed",
            ],
            check=True,
        )
        subprocess.run(["slurmctld", "-c", "-f", str(self.conf)], check=True, env=self.env)
        for n in self.NODES:
            subprocess.run(["slurmd", "-f", str(self.conf), "-N", n], check=True, env=self.env)
        _until(lambda: self._idle(), 20, f"slurm nodes not idle: {r}/log")

    def _idle(self) -> bool:
        res = subprocess.run(["sinfo", "-h", "-o", "%t %D"], capture_output=True, text=True, env=self.env)
        return res.returncode == 0 and res.stdout.split()[:2] == ["idle", "2"]

    def sbatch(self, script: Path, env: dict, nodes: int = 2) -> str:
        res = subprocess.run(
            ["sbatch", "--parsable", f"-N{nodes}", "-o", str(script) + ".out", str(script)],
            capture_output=True,
            text=True,
            env={**self.env, **env},
            check=True,
        )
        return res.stdout.strip().split(";")[0]

    def job_state(self, job: str) -> str:
        res = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True, env=self.env)
        return res.stdout.strip() or "gone"

    def stop(self) -> None:
        subprocess.run(["scancel", "--full", "--quiet", "-u", "root"], env=self.env, capture_output=True)
        for n in self.NODES:
            _stop_pidfile(self.root / f"slurmd-{n}.pid")
        _stop_pidfile(self.root / "slurmctld.pid")
        _stop_pidfile(self.munge / "munged.pid")


def base_image_tar(root: Path) -> Path:
    """A root folder with nothing but mount points and the usual links: the container runs the
    host's /usr and /etc, bound read-only (no registry is needed)."""
    rootfs = root / "rootfs"
    for d in ("usr", "etc", "proc", "sys", "dev", "tmp", "run", "root", "var/tmp", "srv"):
        (rootfs / d).mkdir(parents=True, exist_ok=True)
    for link in ("bin", "sbin", "lib", "lib64"):
        if not (rootfs / link).is_symlink():
            (rootfs / link).symlink_to(f"usr/{link}")
    with tarfile.open(root / "rootfs.tar", "w") as tar:
        tar.add(rootfs, arcname=".")
    return root / "rootfs.tar"


class Docker:
    """dockerd on a socket and data folder of its own, no bridge or iptables; the tiny image of
    base_image_tar."""

    kind = "docker"

    def __init__(self, root: Path):
        self.root = root
        self.sock = root / "docker.sock"
        self.own = {"DOCKER_HOST": f"unix://{self.sock}"}
        self.proc: subprocess.Popen | None = None

    @property
    def env(self) -> dict[str, str]:
        """The environment as it is now (the running test's sealed home and state), with the engine's own."""
        return {**os.environ, **self.own}

    def start(self) -> None:
        r = self.root
        self.proc = subprocess.Popen(
            [
                "dockerd",
                "--data-root",
                str(r / "data"),
                "--exec-root",
                str(r / "exec"),
                "--pidfile",
                str(r / "dockerd.pid"),
                "-H",
                f"unix://{self.sock}",
                "--iptables=false",
                "--ip6tables=false",
                "--bridge=none",
            ],
            stdout=open(r / "dockerd.log", "wb"),
            stderr=subprocess.STDOUT,
        )
        _until(lambda: self.cli("version", check=False).returncode == 0, 30, f"dockerd did not start: {r}/dockerd.log")
        self.cli("import", str(base_image_tar(r)), "cockpit-base")

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(["docker", *args], capture_output=True, text=True, env=self.env, check=check)

    def stop(self) -> None:
        if self.proc is not None:
            ids = self.cli("ps", "-aq", check=False).stdout.split()
            if ids:
                self.cli("rm", "-f", *ids, check=False)
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for mount in (self.root / "exec" / "netns" / "default", Path("/run/docker/netns/default")):
            if os.path.ismount(mount):  # dockerd leaves its default netns bound here
                subprocess.run(["umount", str(mount)], capture_output=True)


class Podman:
    """Podman without a daemon: its storage (vfs), run folder and configuration of its own, runc
    (crun refuses these machines' hybrid cgroups) and ulimits under the machine's hard limits
    (docs/targets.md); the same tiny image."""

    kind = "podman"

    def __init__(self, root: Path):
        self.root = root
        conf, storage = root / "containers.conf", root / "storage.conf"
        conf.write_text(
            '[containers]\ndefault_ulimits=["nofile=20000:20000","nproc=32768:32768"]\n[engine]\nruntime="runc"\n'
        )
        storage.write_text(f'[storage]\ndriver="vfs"\ngraphroot="{root}/storage"\nrunroot="{root}/run"\n')
        self.own = {"CONTAINERS_CONF": str(conf), "CONTAINERS_STORAGE_CONF": str(storage)}

    @property
    def env(self) -> dict[str, str]:
        """The environment as it is now (the running test's sealed home and state), with the engine's own."""
        return {**os.environ, **self.own}

    def start(self) -> None:
        self.cli("import", str(base_image_tar(self.root)), "cockpit-base")

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(["podman", *args], capture_output=True, text=True, env=self.env, check=check)

    def stop(self) -> None:
        self.cli("rm", "-a", "-f", "-t", "0", check=False)
        self.cli("system", "reset", "-f", check=False)  # its storage, under root, is removed with the folder


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    need("slurmctld", "slurmd", "srun", "munged", package="slurmctld slurmd slurm-client munge")
    root = Path(tempfile.mkdtemp(prefix="cockpit-slurm-"))  # pytest's own folders are closed to munge
    root.chmod(0o755)
    cluster = Slurm(root)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module", params=["docker", "podman"])
def container_engine(request, tmp_path_factory):
    """Each real container engine in turn: Docker's daemon, then Podman."""
    if request.param == "docker":
        need("dockerd", "docker", package="docker.io")
        engine = Docker(Path(tmp_path_factory.mktemp("docker")))
    else:
        need("podman", "conmon", "runc", package="podman conmon runc")
        engine = Podman(Path(tmp_path_factory.mktemp("podman")))
    try:
        engine.start()
        yield engine
    finally:
        engine.stop()
