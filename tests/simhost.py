"""Test helpers: a simulated server launched through the real agent, watched by a real session."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

from cockpit.host.session import HostSession, SessionOptions, WatchList
from cockpit.link.target import parse_target


async def wait_for(predicate, timeout: float = 30.0, what: str = "condition", context=None):
    """`context`: a function whose answer the failure carries (what the run's log said, say)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}" + (f": {context()}" if context else ""))


class SimRun:
    """One simulated server run on the local host, its processes in their own group."""

    def __init__(self, state: Path, tmp: Path, port: int, args: list[str]):
        self.state, self.tmp, self.port, self.args = state, tmp, port, args
        self.session = HostSession(
            parse_target("local"),
            SessionOptions(python=sys.executable, interval=0.25, sim_state=str(state)),
            WatchList(patterns=[]),
        )  # this run only, not whatever else runs here
        self.run: dict = {}

    async def __aenter__(self):
        await self.session.connect()
        argv = [
            sys.executable,
            "-m",
            "cockpit.sim.server",
            "--tp-size",
            "8",
            "--port",
            str(self.port),
            "--sim-speed",
            "4",
            "--sim-shm-dir",
            str(self.tmp),
            *self.args,
        ]
        self.run = await self.session.request(
            "launch", argv=argv, env={"COCKPIT_SIM_STATE": str(self.state)}, log=str(self.tmp / "run.log")
        )
        self.session.watch_run(self.run["pgid"], self.run["log"])
        while not self.session.watch_current():
            await self.session.wait_samples(1)
        return self

    async def __aexit__(self, *exc):
        try:
            os.killpg(self.run["pgid"], signal.SIGKILL)
        except (ProcessLookupError, KeyError):
            pass
        await self.session.close()

    @property
    def state_(self):
        return self.session.state

    def log_text(self) -> str:
        log = self.session.state.logs.get(self.run["log"])
        return log.text() if log else ""

    def said(self) -> str:
        """The run's log as the session holds it and as the file holds it (the ends of both): what
        a timed-out wait reports."""
        try:
            on_disk = Path(self.run["log"]).read_text(errors="replace")[-600:]
        except (OSError, KeyError) as exc:
            on_disk = str(exc)
        return f"session's log ends {self.log_text()[-600:]!r}; the file ends {on_disk!r}"

    def ranks(self):
        return [p for p in self.session.state.ranks() if p.alive]

    async def http(self, path: str) -> dict:
        return await self.session.request("http", port=self.port, path=path)


def kill_groups(pgids) -> None:
    """SIGKILL each process group a test started (never anything else); one already gone is fine."""
    for pgid in pgids:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def end_session(proc) -> None:
    """SIGKILL the session a test started (its process group) and reap its leader."""
    kill_groups([proc.pid])
    proc.wait(10)


def sleeper():
    """A process of a session of its own, asleep: a pid a test can plan, reuse or kill."""
    import subprocess

    return subprocess.Popen(["sleep", "600"], start_new_session=True)


def gone(pid: int) -> bool:
    """The process has exited (a zombie counts: its parent has not reaped it yet)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


async def until(pilot, predicate, timeout: float = 40.0, step: float = 0.05):
    """Let the app run until the predicate holds (the screen shows something), or fail."""
    for _ in range(int(timeout / step)):
        if predicate():
            return True
        await pilot.pause(step)
    raise AssertionError("timed out")
