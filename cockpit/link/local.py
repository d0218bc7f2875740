"""The agent as a subprocess of the cockpit: the `local` and `demo` targets. A one-shot command
may start it early (`start_early`), before its own imports, so the agent's start and its first
CPU window pass while the cockpit is still loading; the link then takes that process over."""

from __future__ import annotations

import asyncio
import fcntl
import os
import signal

from cockpit.common.errors import PythonUnusable
from cockpit.link.base import AgentStream, LineReader, Link, RunResult

STREAM_LIMIT = 4 * 1024 * 1024  # how much asyncio buffers before it pauses the pipe; lines: LineReader
PIPE_MAX = 1 << 20  # the most an unprivileged process may ask a pipe to hold (fs.pipe-max-size's default)

_early: dict[tuple, asyncio.subprocess.Process] = {}  # (argv, payload) -> an agent started before it was asked for


class LocalStream(AgentStream):
    def __init__(self, proc: asyncio.subprocess.Process):
        self.proc = proc
        self.lines = LineReader(proc.stdout.read)

    async def readline(self) -> bytes:
        return await self.lines.readline()

    def write(self, data: bytes) -> None:
        if self.proc.stdin and not self.proc.stdin.is_closing():
            self.proc.stdin.write(data)

    async def wait(self) -> int | None:
        return await self.proc.wait()

    async def stderr_tail(self) -> str:
        try:
            data = await asyncio.wait_for(self.proc.stderr.read(65536), 2)
        except (asyncio.TimeoutError, ValueError):
            return ""
        return data.decode("utf-8", "replace").strip()

    async def aclose(self) -> None:
        """Stdin closed first (an agent behind a --python wrapper that does not exec sees its end
        and leaves), then the agent's whole process group killed (it was started in a session
        of its own: the wrapper and the agent under it, never the runs it launched, which have
        their own). Only while the group's leader is unreaped, so its pid names no other group."""
        if self.proc.stdin and not self.proc.stdin.is_closing():
            self.proc.stdin.close()
        if self.proc.returncode is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                try:
                    self.proc.kill()
                except ProcessLookupError:
                    pass
        await self.proc.wait()


async def _spawn(argv: list[str], payload: bytes, env: dict[str, str] | None = None) -> asyncio.subprocess.Process:
    """The agent's process, in a session of its own, its payload written. The stdin pipe is made
    to hold the whole payload where the kernel allows, so the agent reads it at once even while
    this process is busy (importing, in a one-shot command) and not serving the event loop."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=full_env,
            limit=STREAM_LIMIT,
            start_new_session=True,
        )
    except FileNotFoundError:
        raise PythonUnusable(
            f"{argv[0]} not found on this machine: install Python >= 3.8 or name the interpreter with --python",
            "not found") from None
    if len(payload) > 65536:
        pipe = proc.stdin.transport.get_extra_info("pipe")
        try:
            fcntl.fcntl(pipe.fileno(), fcntl.F_SETPIPE_SZ, min(PIPE_MAX, len(payload) + 65536))
        except (OSError, AttributeError, ValueError):
            pass  # the default size: the rest of the payload goes as the agent reads
    proc.stdin.write(payload)
    return proc


async def start_early(argv: list[str], payload: bytes) -> None:
    """Start the agent that `LocalLink.start_agent(argv, payload)` will ask for, now. One that is
    never asked for ends by itself when this process does (its stdin closes)."""
    _early[(tuple(argv), payload)] = await _spawn(argv, payload)


class LocalLink(Link):
    name = "local"

    async def connect(self) -> None:
        return None

    async def start_agent(self, argv, payload=b"", env=None) -> AgentStream:
        proc = None if env else _early.pop((tuple(argv), payload), None)
        if proc is None:
            proc = await _spawn(argv, payload, env)
        return LocalStream(proc)

    async def run(self, argv, input=None, timeout=30.0) -> RunResult:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE if input is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(input), timeout)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            return RunResult(None, b"", b"timed out")
        return RunResult(proc.returncode, out, err)

    async def close(self) -> None:
        return None
