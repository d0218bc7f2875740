"""The one transport primitive under the container and Slurm links: run the agent with an argv on a
target, stdin in, frames out.

An ExecLink wraps every argv it is given in a prefix (`docker exec -i NAME`, `podman exec -i NAME`,
`srun --overlap --jobid J --nodelist N -N1 -n1`) and hands the result to a carrier link that runs
commands where that prefix works: this machine (LocalLink) or the `@HOST` of the target over ssh
(SshLink, which quotes the argv with shlex.join). So `docker:eng@gpu-box` is ssh to gpu-box, then
`docker exec -i eng python3 -u -c BOOTSTRAP N` there; nothing is installed anywhere, and a value is
never shell syntax on any hop. Kubernetes maps onto the same primitive (`kubectl exec -i POD -c C
--`; docs/targets.md)."""

from __future__ import annotations

import asyncio

from cockpit.common.errors import CockpitError
from cockpit.link.base import AgentStream, Link, RunResult

CLOSE_GRACE_S = 2.0  # after stdin closes, the agent ends by itself; then the carrier's process is ended


def first_line(data: bytes | str) -> str:
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


class ExecStream(AgentStream):
    """The carrier's stream of the wrapped command. Closing ends stdin first, so the agent exits by
    itself and the wrapper (docker exec, srun) ends its side: `docker exec`'s client killed outright
    leaves the process running in the container, and srun killed outright leaves its step."""

    def __init__(self, inner: AgentStream):
        self.inner = inner

    async def readline(self) -> bytes:
        return await self.inner.readline()

    def write(self, data: bytes) -> None:
        self.inner.write(data)

    async def wait(self) -> int | None:
        return await self.inner.wait()

    async def stderr_tail(self) -> str:
        return await self.inner.stderr_tail()

    async def aclose(self) -> None:
        stdin = getattr(getattr(self.inner, "proc", None), "stdin", None)
        try:
            if stdin is not None:
                stdin.write_eof()
        except (OSError, RuntimeError, AttributeError, Exception):  # a pipe already gone
            pass
        try:
            await asyncio.wait_for(self.inner.wait(), CLOSE_GRACE_S)
        except (asyncio.TimeoutError, Exception):
            pass
        await self.inner.aclose()


class ExecLink(Link):
    """A link whose every command runs through `wrap(argv)` on a carrier link."""

    name = "exec"
    tool = "?"  # the program the prefix starts with, named when it is missing
    install_hint = ""

    def __init__(self, carrier: Link, label: str, where: str):
        self.carrier = carrier
        self.label = label  # the target as typed, for messages
        self.where = where  # "this machine" or the ssh host
        self.warnings: list[str] = []

    def wrap(self, argv: list[str], env: dict[str, str] | None = None, agent: bool = False) -> list[str]:
        raise NotImplementedError

    async def check(self) -> None:
        """Whatever the target needs before an agent can start (the container runs, the job has
        the node): one line naming the target and the fix otherwise."""

    async def connect(self) -> None:
        await self.carrier.connect()
        self.warnings = list(getattr(self.carrier, "warnings", None) or [])
        try:
            await self.check()
        except BaseException:
            await self.carrier.close()
            raise

    async def tool_run(self, argv: list[str], timeout: float = 30.0, input: bytes | None = None) -> RunResult:
        """The engine's own command (docker inspect, squeue) on the carrier; a missing tool is one
        line that says which and how to get it."""
        try:
            res = await self.carrier.run(argv, input=input, timeout=timeout)
        except FileNotFoundError:
            raise CockpitError(f"{self.label}: {argv[0]} not found on {self.where}: {self.install_hint}") from None
        if res.rc == 127:
            raise CockpitError(f"{self.label}: {argv[0]} not found on {self.where}: {self.install_hint}")
        if res.rc is None:
            raise CockpitError(
                f"{self.label}: `{' '.join(argv[:3])}` did not answer in {timeout:.0f} s on {self.where}"
            )
        return res

    async def start_agent(self, argv, payload=b"", env=None) -> AgentStream:
        return ExecStream(await self.carrier.start_agent(self.wrap(list(argv), env, agent=True), payload))

    async def run(self, argv, input=None, timeout=30.0) -> RunResult:
        return await self.carrier.run(self.wrap(list(argv)), input=input, timeout=timeout)

    async def close(self) -> None:
        await self.carrier.close()

    def describe(self) -> dict:
        """What the snapshot says about the way in (docs/targets.md)."""
        return {"kind": self.name, "via": self.where}
