"""A HostMonitor fed the frames its agent sends (a rank gone, its exit code, the host's record of a
stop), in process, and judged as a live one is.

The operator's kill read as theirs (MonitorBase._operators): `stopping` while the kill runs; the
ranks it stopped and those of the run that went down after them are `stopped`; a rank gone before
the kill, or a run already crashed when the operator killed it, stays `crashed`. A plain look's
end (MonitorBase.still_looking), on the monitor's own clock: within PLAIN_LOOK_S whatever it finds,
sooner where the stall windows are shorter, at once when decided."""

from __future__ import annotations

import sys
import time

from cockpit.actions.kill import KillPlan
from cockpit.host.session import SessionOptions
from cockpit.judge.verdict import VerdictName
from cockpit.link.target import parse_target
from cockpit.monitor.base import PLAIN_LOOK_S
from cockpit.monitor.host import HostMonitor
from cockpit.runs.run import Scope

RANKS = 4


class Fed:
    """A HostMonitor whose link is up and whose frames are this test's: four ranks (pid 100 + rank)."""

    def __init__(self, layout=None):
        self.monitor = HostMonitor(parse_target("local"), SessionOptions(python=sys.executable, interval=0.5), layout)
        self.state = self.monitor.state
        self.now, self.t0 = time.time(), time.monotonic()
        self.started = self.now - 500
        self.alive = set(range(RANKS))
        self.seq = 0
        self.state.apply(
            {
                "t": "hello",
                "gpus": [{"index": i, "mem_total_mib": 143771, "power_limit_w": 700.0} for i in range(RANKS)],
            }
        )
        self.state.link_state = "up"
        self.sample()

    def sample(self, gone=(), exit_code=-15, acts=(), busy=True):
        """One sample: the ranks in `gone` have exited (with `exit_code`), the rest compute (or,
        not `busy`, sleep with their GPUs idle); `acts`: the host's records that came with it."""
        self.seq += 1
        self.alive -= set(gone)
        self.state.apply(
            {
                "acts": list(acts),
                "t": "sample",
                "seq": self.seq,
                "ts": self.host_clock(),
                "gone": [100 + r for r in gone],
                "exits": [[100 + r, exit_code] for r in gone],
                "gpus": [
                    {
                        "index": i,
                        "util_pct": 80 if busy else 0,
                        "power_w": 500.0 if busy else 45.0,
                        "mem_used_mib": 9866,
                        "processes": [[100 + i, 9858]] if i in self.alive else [],
                    }
                    for i in range(RANKS)
                ],
                "procs": [
                    {
                        "pid": 100 + r,
                        "ppid": 1,
                        "name": f"sglang::scheduler_TP{r}",
                        "cmdline": [f"sglang::scheduler_TP{r}"],
                        "status": "R" if busy else "S",
                        "cpu_pct": 90.0 if busy else 0.0,
                        "started": self.started,
                    }
                    for r in sorted(self.alive)
                ],
                "ports": [],
            }
        )
        self.monitor.session.samples += 1  # received, as the session's reader counts it: what is watched is sampled
        self.monitor.update()
        return self.monitor.phase.name, self.monitor.verdict

    def host_clock(self) -> float:
        """The host's clock: it runs as this process's does (the order of deaths and stops is kept)."""
        return self.now + time.monotonic() - self.t0

    def stop_record(self, *ranks: int, by: str = "root@other (pid 7)") -> dict:
        """The host's record of a stop, as `cockpit kill` in another terminal writes it (now: before the next sample)."""
        return {
            "act": "stop",
            "id": f"s{self.seq}",
            "at": self.host_clock(),
            "why": "cockpit kill: asked by the operator",
            "by": by,
            "processes": [[100 + r, 0, self.started] for r in ranks],
        }

    def plan(self, *ranks: int) -> KillPlan:
        return KillPlan(
            Scope(pids=[100 + r for r in ranks]),
            [{"pid": 100 + r, "started": self.started, "pgid": 100, "status": "R", "title": "x"} for r in ranks],
        )


def test_a_stop_on_the_hosts_record_reads_as_the_operators_and_the_ranks_that_followed_too():
    fed = Fed()
    assert fed.monitor.verdict.name == VerdictName.OK
    _, verdict = fed.sample(gone=[1], acts=[fed.stop_record(1)])
    assert verdict.name == VerdictName.STOPPED, verdict
    assert (
        verdict.evidence[0].startswith(
            "rank 1 stopped by the operator (cockpit kill: asked by the operator, by root@other (pid 7), "
        )
        and len(verdict.evidence) == 1
    ), verdict.evidence
    phase, verdict = fed.sample(gone=[0, 2, 3], exit_code=1)
    assert verdict.name == VerdictName.STOPPED, verdict
    assert verdict.evidence[1] == "3 more ranks of the run went down after it: 0, 2, 3", verdict.evidence
    assert phase != "crashed"


def test_without_a_stop_the_same_deaths_are_a_crash():
    fed = Fed()
    _, verdict = fed.sample(gone=[1])
    assert verdict.name == VerdictName.CRASHED and verdict.odd_rank == 1, verdict
    assert verdict.evidence[:2] == ["rank 1 died (exit code -15)", "1 of 4 ranks gone: 1"], verdict.evidence


def test_a_rank_gone_before_the_operators_kill_is_still_a_crash():
    fed = Fed()
    fed.sample(gone=[2])  # died on its own, then the operator stopped another
    _, verdict = fed.sample(gone=[1], acts=[fed.stop_record(1)])
    assert verdict.name == VerdictName.CRASHED and "2 of 4 ranks gone: 1, 2" in verdict.evidence, verdict
    assert not any("stopped by the operator" in e for e in verdict.evidence)


def test_this_cockpits_kill_reads_stopping_while_it_runs_then_stopped():
    fed = Fed()
    with fed.monitor.stopping_for("k: the operator", fed.plan(0, 1, 2, 3)):
        _, verdict = fed.sample(gone=[0, 1])
        assert (verdict.name, verdict.evidence) == (VerdictName.STOPPING, ["k: the operator"])
    _, verdict = fed.sample(gone=[2, 3])
    assert verdict.name == VerdictName.STOPPED, verdict
    assert verdict.evidence[0].startswith("rank 0, 1, 2, 3 stopped by the operator (k: the operator, ")


def test_a_run_already_crashed_when_the_operator_killed_it_stays_crashed():
    fed = Fed()
    _, verdict = fed.sample(gone=[3], exit_code=-9)
    assert verdict.name == VerdictName.CRASHED
    with fed.monitor.stopping_for("K: clean up", fed.plan(0, 1, 2)):
        fed.sample(gone=[0, 1, 2])
    _, verdict = fed.sample()
    assert verdict.name == VerdictName.CRASHED and "4 of 4 ranks gone: 0, 1, 2, 3" in verdict.evidence, verdict
    assert not any("stopped by the operator" in e for e in verdict.evidence)


def test_a_plain_look_ends_within_plain_look_s_whatever_it_finds():
    """Undecided (`watching`: one sleeping rank, no log) under the default stall windows (120 s and
    60 s): the look goes on until PLAIN_LOOK_S (15 s) from its start, not a moment longer."""
    fed = Fed()
    fed.sample(busy=False)
    assert fed.monitor.verdict.name == VerdictName.WATCHING and not fed.monitor.decided()
    assert PLAIN_LOOK_S == 15.0 and max(fed.monitor.watchdog.idle_s, fed.monitor.watchdog.spin_s) > PLAIN_LOOK_S
    now = time.monotonic()
    assert fed.monitor.still_looking(now - (PLAIN_LOOK_S - 0.1))
    assert not fed.monitor.still_looking(now - PLAIN_LOOK_S)


def test_a_plain_look_ends_sooner_under_short_stall_windows_and_at_once_when_decided():
    from cockpit.runs.layoutfile import parse_layout

    fed = Fed(
        parse_layout(
            "name: short\nengine: sglang\ncommand: [-m, x]\nwatch: ['sglang::*']\nstall: {idle_s: 4, spin_s: 3}\n",
            "short.yaml",
        )
    )
    fed.sample(busy=False)
    assert fed.monitor.verdict.name == VerdictName.WATCHING
    limit = 4 + 2 * 0.5 + 1.0  # the longer window, and two samples of slack and a second
    now = time.monotonic()
    assert fed.monitor.still_looking(now - (limit - 0.1)) and not fed.monitor.still_looking(now - limit)
    fed.sample(gone=[3])  # a rank gone: crashed, a verdict that stands
    assert fed.monitor.verdict.name == VerdictName.CRASHED and fed.monitor.decided()
    assert not fed.monitor.still_looking(time.monotonic())
