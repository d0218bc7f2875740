"""What the kill, the dump and the flight-recorder read refuse to act on (actions/kill.py), through
a real agent on this host: two runs of one layout are named, never merged, and nothing is
signalled; no run found says why (another user's processes are never the run) and how to name one.
Real processes, each titled by this test alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from conftest import cannot_run, free_port
from simhost import gone

from cockpit.actions import kill as actions
from cockpit.common.errors import CockpitError
from cockpit.host.session import HostSession, SessionOptions, WatchList
from cockpit.link.target import parse_target
from cockpit.runs.layoutfile import parse_layout
from cockpit.runs.run import Run, Scope

NOBODY = 65534


def as_nobody():
    os.setgid(NOBODY)
    os.setgroups([])
    os.setuid(NOBODY)


@pytest.fixture
def program():
    """A server program's name of this test's own, and a way to start processes running it."""
    name = f"gck-srv-{os.getpid()}-{free_port()}"
    started: list[subprocess.Popen] = []

    def start(user: int | None = None) -> subprocess.Popen:
        p = subprocess.Popen(
            ["bash", "-c", f"exec -a {name} sleep 600"],
            start_new_session=True,
            cwd="/",
            preexec_fn=as_nobody if user == NOBODY else None,
        )
        started.append(p)
        return p

    yield name, start
    for p in started:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait(10)


@pytest.fixture
async def session():
    s = HostSession(parse_target("local"), SessionOptions(python=sys.executable, interval=0.5), WatchList(patterns=[]))
    await s.connect()
    yield s
    await s.close()


def layout_of(name: str) -> Run:
    return Run(parse_layout(f"name: refusals\nengine: sglang\ncommand: [{name}]\n", "refusals.yaml"))


async def test_two_runs_of_one_layout_are_named_never_merged_and_nothing_is_signalled(program, session):
    name, start = program
    a, b = start(), start()
    scope = Scope(command=[name])
    with pytest.raises(actions.AmbiguousRun) as err:
        await actions.plan_kill(session, scope)
    assert str(err.value) == (
        "2 runs found on local, not merged: choose one: `cockpit kill local --pid ROOT` (in the "
        "cockpit: select its root process and press k)"
    )
    lines = err.value.lines  # each run named on a line of its own
    assert (
        len(lines) == 2
        and lines[0].startswith(f"[1] pid {min(a.pid, b.pid)} (")
        and lines[1].startswith(f"[2] pid {max(a.pid, b.pid)} (")
    ), lines
    assert sorted(c["root"] for c in err.value.candidates) == sorted([a.pid, b.pid])
    plan = await actions.plan_kill(session, scope, allow_ambiguous=True)  # the screen lists them to choose from
    assert plan.entries == [] and len(plan.candidates) == 2
    for verb in ("dump", "flightrec"):
        with pytest.raises(actions.AmbiguousRun) as err:
            await actions.member_plan(session, layout_of(name), verb=verb)
        assert str(err.value) == f"2 runs found on local, not merged: choose one: `cockpit {verb} local --pid ROOT`"
        assert [line.split(" (")[0] for line in err.value.lines] == [
            f"[1] pid {min(a.pid, b.pid)}",
            f"[2] pid {max(a.pid, b.pid)}",
        ]
    assert not gone(a.pid) and not gone(b.pid)
    chosen = await actions.member_plan(session, layout_of(name), root=a.pid)  # --pid ROOT chooses
    assert [e["pid"] for e in chosen.entries] == [a.pid]


async def test_no_run_found_says_why_and_how_to_name_one(program, session):
    name, _ = program
    with pytest.raises(CockpitError) as err:
        await actions.member_plan(session, layout_of(name), verb="dump")
    assert str(err.value) == (
        f"dump: no run found on local, and processes that are not the run's are never touched (no "
        f"process runs {name}); name one with `cockpit dump local --pid ROOT`"
    )


async def test_another_users_run_is_left_alone_and_named(program, session):
    """The layout's command run by another user: not the run (never, unless named with --pid): the
    refusal names it, its user and why; it is not signalled."""
    if os.geteuid() != 0:
        cannot_run("starting another user's process needs root")
    name, start = program
    theirs = start(user=NOBODY)
    with pytest.raises(CockpitError) as err:
        await actions.member_plan(session, layout_of(name), verb="flightrec")
    said = str(err.value)
    assert said.startswith("flightrec: no run found on local, and processes that are not the run's are never touched (")
    assert (
        f"pid {theirs.pid} (nobody) left alone: runs as nobody, not as root: another user's processes are never in "
        "a run (name it with --pid to act on it anyway)" in said
    ), said
    assert said.endswith("; name one with `cockpit flightrec local --pid ROOT`")
    assert not gone(theirs.pid)
