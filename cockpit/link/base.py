"""What every link offers the session: an agent process with byte streams, and one-off commands.

Nothing here knows about frames; the session speaks the protocol."""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

MAX_FRAME_BYTES = 64 * 1024 * 1024  # one line from the agent; a longer one is skipped and said
READ_CHUNK = 256 * 1024


class FrameTooLong(Exception):
    """A line from the agent over MAX_FRAME_BYTES: skipped whole (up to its newline), never cut into
    pieces that would each fail to decode in silence."""

    def __init__(self, size: int, limit: int = MAX_FRAME_BYTES):
        self.size = size
        super().__init__(
            f"a frame of {size} bytes from the agent is over the {limit // (1024 * 1024)} MiB limit and was skipped"
        )


class LineReader:
    """Whole lines from a byte stream read in chunks, of any length up to `limit`.

    asyncio's readline stops at its stream limit and asyncssh's returns what fits its receive
    window (2 MiB) as if it were a line, so a long frame came out cut. Here a line is returned whole,
    or, past `limit`, dropped up to its newline and reported once as FrameTooLong; memory stays
    bounded by `limit` plus one chunk."""

    def __init__(self, read: Callable[[int], Awaitable[bytes]], limit: int = MAX_FRAME_BYTES):
        self._read = read
        self.limit = limit
        self._buf = bytearray()
        self._start = 0  # lines before this offset were returned already
        self._scanned = 0  # no newline in _buf[_start:_scanned]
        self._skipping = 0  # bytes of an over-long line dropped so far
        self._eof = False

    async def readline(self) -> bytes:
        while True:
            nl = self._buf.find(b"\n", max(self._start, self._scanned))
            if nl >= 0:
                line = bytes(self._buf[self._start : nl + 1])
                self._start = self._scanned = nl + 1
                if self._start > len(self._buf) // 2:
                    del self._buf[: self._start]
                    self._start = self._scanned = 0
                if self._skipping or len(line) > self.limit:
                    size, self._skipping = self._skipping + len(line), 0
                    raise FrameTooLong(size, self.limit)
                return line
            self._scanned = len(self._buf)
            pending = len(self._buf) - self._start
            if pending > self.limit:
                self._skipping += pending
                self._buf.clear()
                self._start = self._scanned = 0
            if self._eof:
                rest = bytes(self._buf[self._start :])
                self._buf.clear()
                self._start = self._scanned = 0
                if self._skipping:
                    size, self._skipping = self._skipping + len(rest), 0
                    raise FrameTooLong(size, self.limit)
                return rest  # b"" once everything was read: the end
            data = await self._read(READ_CHUNK)
            if not data:
                self._eof = True
            else:
                self._buf += data


@dataclass
class RunResult:
    rc: int | None
    stdout: bytes
    stderr: bytes


class AgentStream(abc.ABC):
    """The agent's stdin/stdout/stderr, whatever carries them."""

    @abc.abstractmethod
    async def readline(self) -> bytes:
        """One whole line (b"" at the end); raises FrameTooLong for a line over MAX_FRAME_BYTES,
        after which the next line follows."""

    @abc.abstractmethod
    def write(self, data: bytes) -> None: ...

    @abc.abstractmethod
    async def wait(self) -> int | None: ...

    @abc.abstractmethod
    async def stderr_tail(self) -> str: ...

    @abc.abstractmethod
    async def aclose(self) -> None:
        """End the agent and wait for its process to be gone."""


class Link(abc.ABC):
    """A way to reach a host: starts the agent, runs argv-built commands on other channels."""

    name: str

    @abc.abstractmethod
    async def connect(self) -> None: ...

    @abc.abstractmethod
    async def start_agent(
        self, argv: list[str], payload: bytes = b"", env: dict[str, str] | None = None
    ) -> AgentStream:
        """The agent started with `argv`, `payload` (its modules: agent_argv) written to its stdin first."""

    @abc.abstractmethod
    async def run(self, argv: list[str], input: bytes | None = None, timeout: float = 30.0) -> RunResult: ...

    @abc.abstractmethod
    async def close(self) -> None: ...
