"""A recorded moment watched as a live host is: a snapshot document (`snapshot --replay`, a test's
fixture) behind the same Monitor protocol, so the screen and every command read it one way. It
has no link: nothing is sampled, judged again or acted on; its phase and verdict are the ones the
document was written with."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

from cockpit.actions.dumps import DumpPlan, PyspyMissing
from cockpit.actions.kill import SHM_DEFAULT, KillPlan
from cockpit.common.errors import CockpitError
from cockpit.host.state import HostState
from cockpit.judge.diagnose import phase_of
from cockpit.judge.verdict import Phase, Verdict, VerdictName
from cockpit.link.target import parse_target
from cockpit.monitor.base import MonitorBase, MonitorEvent, watchdog_for
from cockpit.runs.config import Layout
from cockpit.runs.run import Run, Scope
from cockpit.runs.spec import RunSpec


class ReplayMonitor(MonitorBase):
    live = False

    def __init__(self, state: HostState | None = None, layout: Layout | None = None):
        self.state = state or HostState()
        self.layout = layout
        self.session = None
        self.target = parse_target("local")
        self.run = Run(layout)
        self.watchdog = watchdog_for(None)
        self.probes: dict[tuple[int, str], dict[str, Any]] = {}
        self.shm_held: dict[tuple[int, int], float] = {}
        self.stopping: str | None = None
        self._listeners: list[Callable[[MonitorEvent], None]] = []
        self.phase, self.verdict = self.replayed()
        self.looked_s = 0.0

    def replayed(self) -> tuple[Phase, Verdict]:
        """Phase and verdict as the document was written."""
        v = self.state.verdict
        return phase_of(self.state), Verdict(**v) if v else Verdict(VerdictName.WATCHING, [])

    def update(self, now: float | None = None) -> None:
        """Nothing new arrives: the recorded verdict stands."""

    def decided(self) -> bool:
        return True

    async def open(self, kept: bool = False) -> None:
        """No link to open."""

    async def keep(self, retry_first: bool = False) -> None:
        """No link to keep."""

    async def close(self) -> None:
        """No link to close."""

    @asynccontextmanager
    async def attached(self, samples: int = 1) -> AsyncIterator[ReplayMonitor]:
        yield self

    async def watch_for(self, seconds: float) -> None:
        """A recorded moment does not move."""

    async def stop(self, plan: KillPlan, why: str, wait: float | None = None, whole_run: bool = True) -> dict[str, Any]:
        raise CockpitError("a replayed snapshot has no host to act on: attach to the host itself")

    async def plan_dump(
        self, root: int | None = None, verb: str = "dump", live_only: bool = False, run: Run | None = None
    ) -> DumpPlan:
        raise CockpitError("a replayed snapshot has no ranks to dump: attach to the host itself")

    async def plan_stop(self, scope: Scope | None = None, allow_ambiguous: bool = False) -> KillPlan:
        raise CockpitError("a replayed snapshot has no host to act on: attach to the host itself")

    async def shm_audit(self, folder: str = SHM_DEFAULT, uid: int | None = None) -> dict[str, Any]:
        raise CockpitError("a replayed snapshot has no /dev/shm to read: attach to the host itself")

    async def shm_clean(
        self, entries: list[Any], folder: str = SHM_DEFAULT, uid: int | None = None, other_dir: bool = False
    ) -> dict[str, Any]:
        raise CockpitError("a replayed snapshot has no /dev/shm to clean: attach to the host itself")

    async def _request(self, cmd: str, timeout: float, **args: Any) -> dict[str, Any]:
        """Every verb that is one question to the host (its facts, NCCL RAS, a metrics page, the
        flight recorder's raw dumps, and any added later) is refused here, in words."""
        raise CockpitError(f"a replayed snapshot has no host to ask ({cmd}): attach to the host itself")

    async def run_versions(self) -> dict[str, Any]:
        raise CockpitError("a replayed snapshot has no run to ask for its versions: attach to the host itself")

    async def pyspy_check(
        self, upload: bool = False, say: Callable[[str], None] | None = None
    ) -> tuple[str | None, dict[str, Any]]:
        raise CockpitError("a replayed snapshot has no host to run py-spy on: attach to the host itself")

    def pyspy_missing(self, check: dict[str, Any]) -> PyspyMissing:
        raise CockpitError("a replayed snapshot has no host to run py-spy on: attach to the host itself")

    async def flight_record(
        self, trigger: bool = True, root: int | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        raise CockpitError(
            "a replayed snapshot has no ranks to ask for their flight recorder: attach to the host itself"
        )

    async def wait_samples(self, n: int = 1, timeout: float = 30.0) -> None:
        raise CockpitError("a replayed snapshot takes no new samples: attach to the host itself")

    async def flight_ranks(self, verb: str = "flightrec") -> tuple[list[int], list[str]]:
        raise CockpitError(
            "a replayed snapshot has no ranks to ask for their flight recorder: attach to the host itself"
        )

    def launch_python(self) -> str:
        raise CockpitError("a replayed snapshot has no host to launch on: attach to the host itself")

    def sim_flags(self) -> list[str]:
        raise CockpitError("a replayed snapshot has no host to launch on: attach to the host itself")

    async def check_launch(self, spec: RunSpec) -> None:
        raise CockpitError("a replayed snapshot has no host to launch on: attach to the host itself")

    async def launch(self, spec: RunSpec) -> Run:
        raise CockpitError("a replayed snapshot has no host to launch on: attach to the host itself")

    @contextmanager
    def stopping_for(self, why: str, plan: KillPlan | None = None) -> Iterator[None]:
        yield

    def follow(self, run: Run | None, resumed: bool = False) -> None:
        """A recorded moment has nothing to watch: the run is only named."""
        self.run = run if run is not None else Run(self.layout)

    def new_run(self, started: float | None = None, resumed: bool = False) -> None:
        """A recorded moment has one run."""

    def run_ended(self) -> None:
        """A recorded moment has one run."""
