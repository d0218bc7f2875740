"""The ssh link, over asyncssh: one connection per host, the agent on one channel, commands on
others. Honours ~/.ssh/config (HostName, User, Port, IdentityFile, ProxyJump), the ssh agent and
known_hosts the way OpenSSH does; no password is ever asked for or stored."""

from __future__ import annotations

import asyncio
import os
import shlex
import socket
from pathlib import Path

import asyncssh

from cockpit.errors import CockpitError
from cockpit.link.base import AgentStream, Link, RunResult
from cockpit.link.target import Target

KEEPALIVE_S = 10
CONNECT_TIMEOUT_S = 10


def remote_command(argv: list[str], env: dict[str, str] | None = None) -> str:
    """Every remote command is an argument list quoted here: a value is never shell syntax."""
    prefix = ["env"] + [f"{k}={v}" for k, v in sorted((env or {}).items())] if env else []
    return shlex.join(prefix + list(argv))


class SshStream(AgentStream):
    def __init__(self, proc: asyncssh.SSHClientProcess):
        self.proc = proc

    async def readline(self) -> bytes:
        try:
            return await self.proc.stdout.readline()
        except (asyncssh.Error, ConnectionError, OSError):
            return b""

    def write(self, data: bytes) -> None:
        try:
            self.proc.stdin.write(data)
        except (asyncssh.Error, BrokenPipeError, OSError):
            pass

    async def wait(self) -> int | None:
        try:
            done = await self.proc.wait()
        except (asyncssh.Error, ConnectionError, OSError):
            return None
        return done.exit_status

    async def stderr_tail(self) -> str:
        try:
            data = await asyncio.wait_for(self.proc.stderr.read(65536), 2)
        except (asyncio.TimeoutError, asyncssh.Error, ConnectionError, OSError):
            return ""
        return data.decode("utf-8", "replace").strip() if isinstance(data, bytes) else str(data).strip()

    async def aclose(self) -> None:
        try:
            self.proc.close()
            await asyncio.wait_for(self.proc.wait_closed(), 2)
        except (asyncio.TimeoutError, asyncssh.Error, OSError):
            pass


class SshLink(Link):
    name = "ssh"

    def __init__(self, target: Target, ssh_config: str | None = None, known_hosts: str | None = None,
                 accept_new: bool = False):
        self.target = target
        self.ssh_config = ssh_config
        self.known_hosts = known_hosts
        self.accept_new = accept_new
        self.conn: asyncssh.SSHClientConnection | None = None

    @property
    def where(self) -> str:
        t = self.target
        return f"{t.host}:{t.port}" if t.port else t.host

    def _options(self, **extra) -> dict:
        t = self.target
        opts: dict = dict(
            keepalive_interval=KEEPALIVE_S,
            keepalive_count_max=3,
            connect_timeout=CONNECT_TIMEOUT_S,
        )
        if t.port:
            opts["port"] = t.port
        if t.user:
            opts["username"] = t.user
        if self.ssh_config:
            opts["config"] = [self.ssh_config]
        if self.known_hosts:
            opts["known_hosts"] = self.known_hosts
        opts.update(extra)
        return opts

    def _resolved(self) -> tuple[str, int]:
        """Host name and port after ~/.ssh/config: what known_hosts entries are keyed by."""
        opts = {k: v for k, v in self._options().items() if k in ("port", "config")}
        resolved = asyncssh.SSHClientConnectionOptions(host=self.target.host, **opts)
        return resolved.host, resolved.port

    def _known_hosts_path(self) -> Path:
        return Path(self.known_hosts or os.path.expanduser("~/.ssh/known_hosts"))

    async def connect(self) -> None:
        for flag, path in (("--ssh-config", self.ssh_config), ("--known-hosts", self.known_hosts)):
            if path and not os.path.isfile(path):
                raise CockpitError(f"{flag} {path}: no such file (give an existing file, or leave the flag out "
                                   f"to use ~/.ssh)")
        try:
            self.conn = await asyncssh.connect(self.target.host, **self._options())
        except asyncssh.HostKeyNotVerifiable:
            await self._unknown_host()
        except asyncssh.PermissionDenied:
            user = self.target.user or "your user"
            raise CockpitError(
                f"authentication refused by {self.where} for {user}: load your key into ssh-agent "
                f"(ssh-add) or set IdentityFile for this host in ~/.ssh/config"
            ) from None
        except socket.gaierror:
            raise CockpitError(
                f"cannot resolve {self.target.host!r}: not an alias in ~/.ssh/config nor a known host "
                f"name (check the spelling or add a Host entry)"
            ) from None
        except (asyncio.TimeoutError, TimeoutError):
            raise CockpitError(f"cannot reach {self.where}: connection timed out (is the host up?)") from None
        except ConnectionRefusedError:
            raise CockpitError(f"cannot reach {self.where}: connection refused (is sshd running on that port?)") from None
        except OSError as exc:
            what = f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else "")
            raise CockpitError(f"cannot reach {self.where}: {what}") from None
        except asyncssh.Error as exc:
            raise CockpitError(f"ssh to {self.where} failed: {exc.reason}") from None

    async def _unknown_host(self) -> None:
        """An unverifiable host key: refuse a changed one loudly, trust a new one only when asked."""
        try:
            opts = {k: v for k, v in self._options().items() if k in ("port", "config")}
            key = await asyncssh.get_server_host_key(self.target.host, **opts)
        except (OSError, asyncssh.Error) as exc:
            raise CockpitError(f"cannot verify the host key of {self.where}: {exc}") from None
        fingerprint = f"{key.get_algorithm()} {key.get_fingerprint()}" if key else "no key"
        host, port = self._resolved()
        path = self._known_hosts_path()
        host_entry = f"[{host}]:{port}" if port != 22 else host
        if path.exists():
            known = asyncssh.read_known_hosts(str(path)).match(host, "", port)
            if known[0]:  # trusted keys exist for this host, and the offered one is not among them
                raise CockpitError(
                    f"HOST KEY CHANGED for {self.where} (now {fingerprint}): refusing to connect; if the "
                    f"host was reinstalled, remove the old key with ssh-keygen -R '{host_entry}'"
                )
        if not self.accept_new:
            raise CockpitError(
                f"unknown host key for {self.where} ({fingerprint}): check it, then run again with "
                f"--accept-new to trust it"
            )
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        alg, blob = key.export_public_key("openssh").decode().split()[:2]
        with open(path, "a") as fh:
            fh.write(f"{host_entry} {alg} {blob}\n")
        os.chmod(path, 0o600)
        await self.connect()

    async def start_agent(self, argv, env=None) -> AgentStream:
        assert self.conn is not None
        try:
            proc = await self.conn.create_process(remote_command(argv, env), encoding=None)
        except (asyncssh.Error, OSError) as exc:
            raise CockpitError(f"cannot start the agent on {self.where}: {exc}") from None
        return SshStream(proc)

    async def run(self, argv, input=None, timeout=30.0) -> RunResult:
        assert self.conn is not None
        try:
            done = await asyncio.wait_for(
                self.conn.run(remote_command(argv), input=input, encoding=None, check=False), timeout
            )
        except asyncio.TimeoutError:
            return RunResult(None, b"", b"timed out")
        return RunResult(done.exit_status, done.stdout or b"", done.stderr or b"")

    async def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            try:
                await asyncio.wait_for(self.conn.wait_closed(), 2)
            except (asyncio.TimeoutError, asyncssh.Error, OSError):
                pass
            self.conn = None
