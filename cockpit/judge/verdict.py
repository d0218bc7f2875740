"""The words of judging, shared by the watchdog, the evidence it merges, the ledger, the screen and
every document: a run's `Phase`, the `VerdictName`s and a `Verdict` with its evidence."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from enum import Enum


@dataclass
class Phase:
    name: str
    detail: str = ""
    line: str = ""

    def __str__(self) -> str:
        return f"{self.name} {self.detail}".strip()


class VerdictName(str, Enum):
    """Every verdict the cockpit gives, the one spelling used by the screen, fleet, ledger and JSON."""

    OK = "ok"
    WATCHING = "watching"  # processes are there, not enough seen yet to judge
    NO_RUN = "no run"
    STALLED_IDLE = "stalled-idle"
    STALLED_SPINNING = "stalled-spinning"
    CRASHED = "crashed"
    SLOW = "slow"
    STOPPING = "stopping"  # the operator's own kill or relaunch is under way: not a crash
    STOPPED = "stopped"  # ranks the operator killed are gone (and those that went down after them): not a crash

    __str__ = str.__str__
    __format__ = str.__format__


ALERTING = (VerdictName.STALLED_IDLE, VerdictName.STALLED_SPINNING, VerdictName.CRASHED, VerdictName.SLOW)
V = VerdictName


@dataclass
class Verdict:
    """A claim with its evidence. `detail` says which kind of stall (requests frozen, or a launch
    that stopped before serving); `since` (host clock) is when a stall began, back-dated from the
    host's own history; `until` (host clock) is when a `watching` look will have decided."""

    name: VerdictName
    evidence: list[str]
    odd_rank: int | None = None
    detail: str | None = None
    since: float | None = None
    until: float | None = None

    def __post_init__(self) -> None:
        self.name = VerdictName(self.name)

    def __str__(self) -> str:
        return self.name if self.odd_rank is None else f"{self.name} (rank {self.odd_rank})"

    @property
    def alerting(self) -> bool:
        return self.name in ALERTING

    def doc(self) -> dict:
        return {
            "name": self.name.value,
            "evidence": list(self.evidence),
            "odd_rank": self.odd_rank,
            "detail": self.detail,
            "since": _iso(self.since),
            "until": _iso(self.until),
        }


def _iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).isoformat(timespec="seconds")


REQUESTS_FROZEN = "requests frozen"
