"""The acting path of docs/ARCHITECTURE.md: "find the run's ranks, then dump them" is written
once (cockpit/actions/dumps.py: plan_dump, dump_ranks), reached above the monitor only through its
verbs (`monitor.plan_dump`, `monitor.dump_stacks`)."""

import re
from pathlib import Path

from cockpit.monitor.base import Monitor

ROOT = Path(__file__).resolve().parents[2]
ABOVE = ("ui", "cli", "operate")  # the floors above the monitor
FINDING = re.compile(r"\b(member_plan|of_run|dump_targets|dump_ranks|rank_pids)\s*\(")


def _uses(folders, pattern) -> list[str]:
    out = []
    for folder in folders:
        for path in sorted((ROOT / "cockpit" / folder).rglob("*.py")):
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if pattern.search(line):
                    out.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    return out


def test_nothing_above_the_monitor_finds_or_dumps_ranks_itself():
    assert _uses(ABOVE, FINDING) == []


def test_the_ranks_of_a_dump_are_found_in_one_place():
    finders = [
        u
        for u in _uses(("actions", "monitor"), re.compile(r"\bdump_targets\s*\(|\bof_run\s*\("))
        if not u.startswith("cockpit/actions/kill.py")
    ]
    assert [u.split(":")[0] for u in finders] == ["cockpit/actions/dumps.py"] * len(finders) and finders, finders
    plans = _uses(("actions", "monitor"), re.compile(r"\bplan_dump\s*\("))
    assert {u.split(":")[0] for u in plans} >= {"cockpit/actions/dumps.py", "cockpit/monitor/base.py"}, plans


def test_nothing_above_the_monitor_takes_a_session():
    """cockpit/ui/, cockpit/cli/ and cockpit/operate/ take no session: each act is a monitor's verb,
    the header reads the monitor's LinkView, and the Monitor protocol has no session to take."""
    assert "session" not in dir(Monitor)
    uses = [
        u for u in _uses(ABOVE, re.compile(r"\.session\b")) if not u.split(": ", 1)[1].startswith(("from ", "import "))
    ]
    assert uses == []
