"""The ssh link, over asyncssh: one connection per host, the agent on one channel, commands on
others. Honours ~/.ssh/config (HostName, User, Port, IdentityFile, ProxyJump), the ssh agent and
known_hosts the way OpenSSH does; no password is ever asked for or stored."""

from __future__ import annotations

import asyncio
import os
import shlex
import socket

from cockpit.common.errors import CockpitError
from cockpit.link import hostkeys
from cockpit.link.base import AgentStream, LineReader, Link, RunResult
from cockpit.link.sshlib import asyncssh
from cockpit.link.target import Target

KEEPALIVE_S = 10
CONNECT_TIMEOUT_S = 10
MAX_JUMPS = 8


def _parse_hop(hop: str) -> tuple[str | None, str, int | None]:
    """A ProxyJump hop, `[user@]host[:port]`, split as asyncssh splits it."""
    user, _, host = hop.strip().rpartition("@")
    port = None
    if host.startswith("[") and "]" in host:  # [v6]:port
        inner, _, rest = host[1:].partition("]")
        host, port = inner, (int(rest[1:]) if rest.startswith(":") and rest[1:].isdigit() else None)
    elif host.count(":") == 1:
        host, _, p = host.partition(":")
        port = int(p) if p.isdigit() else None
    return user or None, host, port


def _via(label: str, where: str) -> str:
    return "" if label == where else f" ({label})"


def remote_command(argv: list[str], env: dict[str, str] | None = None) -> str:
    """Every remote command is an argument list quoted here: a value is never shell syntax."""
    prefix = ["env"] + [f"{k}={v}" for k, v in sorted((env or {}).items())] if env else []
    return shlex.join(prefix + list(argv))


class SshStream(AgentStream):
    def __init__(self, proc: asyncssh.SSHClientProcess):
        self.proc = proc
        self.lines = LineReader(self._read)
        self._stderr = b""  # what wait() collected: asyncssh's wait reads the rest of stderr itself

    async def _read(self, n: int) -> bytes:
        try:
            return await self.proc.stdout.read(n)
        except (asyncssh.Error, ConnectionError, OSError):
            return b""

    async def readline(self) -> bytes:
        return await self.lines.readline()

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
        if isinstance(done.stderr, bytes):
            self._stderr += done.stderr[-65536:]
        return done.exit_status

    async def stderr_tail(self) -> str:
        data = self._stderr
        if not data:
            try:
                data = await asyncio.wait_for(self.proc.stderr.read(65536), 2)
            except (asyncio.TimeoutError, asyncssh.Error, ConnectionError, OSError):
                return ""
        return data.decode("utf-8", "replace").strip() if isinstance(data, bytes) else str(data).strip()

    async def aclose(self) -> None:
        """The remote stdin closed first: an agent behind a --python wrapper that does not exec
        sees its end and leaves, then the channel."""
        try:
            self.proc.stdin.write_eof()
        except (asyncssh.Error, BrokenPipeError, OSError):
            pass
        try:
            self.proc.close()
            await asyncio.wait_for(self.proc.wait_closed(), 2)
        except (asyncio.TimeoutError, asyncssh.Error, OSError):
            pass


class SshLink(Link):
    name = "ssh"

    def __init__(
        self, target: Target, ssh_config: str | None = None, known_hosts: str | None = None, accept_new: bool = False
    ):
        self.target = target
        self.ssh_config = ssh_config
        self.known_hosts = known_hosts
        self.accept_new = accept_new
        self.conn: asyncssh.SSHClientConnection | None = None
        self._hops: list[asyncssh.SSHClientConnection] = []
        self.warnings: list[str] = []  # e.g. host keys not checked: the session shows them

    @property
    def where(self) -> str:
        t = self.target
        return f"{t.host}:{t.port}" if t.port else t.host

    def _options(self, port: int | None, user: str | None, **extra) -> dict:
        opts: dict = dict(
            keepalive_interval=KEEPALIVE_S,
            keepalive_count_max=3,
            connect_timeout=CONNECT_TIMEOUT_S,
        )
        if port:
            opts["port"] = port
        if user:
            opts["username"] = user
        if self.ssh_config:
            opts["config"] = [self.ssh_config]
        opts.update(extra)
        return opts

    async def connect(self) -> None:
        for flag, path in (("--ssh-config", self.ssh_config), ("--known-hosts", self.known_hosts)):
            if path and not os.path.isfile(path):
                raise CockpitError(
                    f"{flag} {path}: no such file (give an existing file, or leave the flag out to use ~/.ssh)"
                )
        self.warnings = []
        t = self.target
        try:
            self.conn = await self._open(t.host, t.port, t.user, None, self.where, depth=0)
        except BaseException:
            await self._close_hops()
            raise

    async def _open(
        self, host: str, port: int | None, user: str | None, tunnel, label: str, depth: int
    ) -> asyncssh.SSHClientConnection:
        """One connection, its host key checked by the config's rules; a ProxyJump in the config is
        followed here hop by hop (asyncssh would open the hops with checks of its own), each hop's
        key checked the same way and named in any refusal."""
        policy = hostkeys.resolve(host, port, user, self.ssh_config, self.known_hosts)
        if policy.proxy_jump and tunnel is None:
            if depth >= MAX_JUMPS:
                raise CockpitError(
                    f"{label}: ProxyJump goes more than {MAX_JUMPS} hops deep (a loop in the ssh config?)"
                )
            for hop in policy.proxy_jump.split(","):
                hop_user, hop_host, hop_port = _parse_hop(hop)
                tunnel = await self._open(
                    hop_host, hop_port, hop_user, tunnel, f"ProxyJump hop {hop} (to {label})", depth + 1
                )
                self._hops.append(tunnel)
        if policy.unchecked and policy.strict != "no":
            raise hostkeys.unchecked_refusal(policy, label)
        check = hostkeys.HostKeyCheck(policy, label, accept_new=self.accept_new)
        if policy.unchecked:
            self.warnings.append(hostkeys.unchecked_warning(label))
        where = label
        try:
            conn = await asyncssh.connect(host, **self._options(port, user, tunnel=tunnel, **check.options()))
        except asyncssh.HostKeyNotVerifiable as exc:
            raise check.refusal(exc) from None
        except asyncssh.PermissionDenied:
            who = user or policy.user or "your user"
            raise CockpitError(
                f"authentication refused by {where} for {who}: load your key into ssh-agent "
                f"(ssh-add) or set IdentityFile for this host in ~/.ssh/config"
            ) from None
        except socket.gaierror:
            raise CockpitError(
                f"cannot resolve {host!r}{_via(label, self.where)}: not an alias in ~/.ssh/config nor a known host "
                f"name (check the spelling or add a Host entry)"
            ) from None
        except (asyncio.TimeoutError, TimeoutError):
            raise CockpitError(f"cannot reach {where}: connection timed out (is the host up?)") from None
        except ConnectionRefusedError:
            raise CockpitError(f"cannot reach {where}: connection refused (is sshd running on that port?)") from None
        except OSError as exc:
            what = f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else "")
            raise CockpitError(f"cannot reach {where}: {what}") from None
        except asyncssh.ChannelOpenError as exc:
            raise CockpitError(f"cannot reach {where}: the jump host refused to forward ({exc.reason})") from None
        except asyncssh.Error as exc:
            raise CockpitError(f"ssh to {where} failed: {exc.reason}") from None
        except ValueError as exc:  # asyncssh's own config parser
            raise CockpitError(f"ssh config: {exc}") from None
        return conn

    async def _close_hops(self) -> None:
        while self._hops:
            hop = self._hops.pop()
            hop.close()
            try:
                await asyncio.wait_for(hop.wait_closed(), 2)
            except (asyncio.TimeoutError, asyncssh.Error, OSError):
                pass

    async def start_agent(self, argv, payload=b"", env=None) -> AgentStream:
        assert self.conn is not None
        try:
            proc = await self.conn.create_process(remote_command(argv, env), encoding=None)
        except (asyncssh.Error, OSError) as exc:
            raise CockpitError(f"cannot start the agent on {self.where}: {exc}") from None
        stream = SshStream(proc)
        stream.write(payload)
        return stream

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
        await self._close_hops()
