"""What every link offers the session: an agent process with byte streams, and one-off commands.

Nothing here knows about frames; the session speaks the protocol."""

from __future__ import annotations

import abc
from dataclasses import dataclass


@dataclass
class RunResult:
    rc: int | None
    stdout: bytes
    stderr: bytes


class AgentStream(abc.ABC):
    """The agent's stdin/stdout/stderr, whatever carries them."""

    @abc.abstractmethod
    async def readline(self) -> bytes: ...

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
    async def start_agent(self, argv: list[str], env: dict[str, str] | None = None) -> AgentStream: ...

    @abc.abstractmethod
    async def run(self, argv: list[str], input: bytes | None = None, timeout: float = 30.0) -> RunResult: ...

    @abc.abstractmethod
    async def close(self) -> None: ...
