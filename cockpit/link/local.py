"""The agent as a subprocess of the cockpit: the `local` and `demo` targets. An agent started
before the event loop (cockpit/link/early.py) is taken over with the loop's pipes around it."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess

from cockpit.common.errors import PythonUnusable
from cockpit.link import early
from cockpit.link.base import AgentStream, LineReader, Link, RunResult

STREAM_LIMIT = 4 * 1024 * 1024  # how much asyncio buffers before it pauses the pipe; lines: LineReader


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
            "not found",
        ) from None
    try:
        early.fit_pipe(proc.stdin.transport.get_extra_info("pipe").fileno(), len(payload))
    except (ValueError, AttributeError):  # it ended already (a wrapper that failed): its status says why
        pass
    proc.stdin.write(payload)
    return proc


class _Adopted:
    """An agent that early.py started (a Popen), read and written through the event loop's pipes:
    what LocalStream uses of an asyncio subprocess."""

    def __init__(self, popen: subprocess.Popen, stdout, stderr, stdin):
        self.popen, self.pid = popen, popen.pid
        self.stdout, self.stderr, self.stdin = stdout, stderr, stdin

    @classmethod
    async def around(cls, popen: subprocess.Popen) -> _Adopted:
        loop = asyncio.get_running_loop()
        readers = []
        for pipe in (popen.stdout, popen.stderr):
            reader = asyncio.StreamReader(limit=STREAM_LIMIT)
            await loop.connect_read_pipe(lambda r=reader: asyncio.StreamReaderProtocol(r), pipe)
            readers.append(reader)
        stdin, _ = await loop.connect_write_pipe(asyncio.Protocol, popen.stdin)  # write, is_closing, close
        return cls(popen, readers[0], readers[1], stdin)

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def kill(self) -> None:
        self.popen.kill()

    async def wait(self) -> int:
        """Its exit status, reaped by a thread (the event loop's child watcher knows only the
        processes it started)."""
        return await asyncio.to_thread(self.popen.wait)


class LocalLink(Link):
    name = "local"

    async def connect(self) -> None:
        return None

    async def start_agent(self, argv, payload=b"", env=None) -> AgentStream:
        started = None if env else early.take(argv, payload)
        return LocalStream(await _Adopted.around(started) if started else await _spawn(argv, payload, env))

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
