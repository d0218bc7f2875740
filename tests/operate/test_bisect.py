"""Bisect: the plan and its ledger records, then `cockpit bisect` on the simulated host with real
processes: one of four flag sets hangs (across a Ctrl+C and a resume), two hang only together, a
seeded flaky hang found with its odds, `B` in the cockpit. The search's odds, pure:
tests/runs/test_bisect_odds.py."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from bisect_oracle import drive, layout_of, layout_text, sim_flaky
from conftest import free_port, run_cli

from cockpit.common.errors import CockpitError
from cockpit.runs.bisect import EXIT, advance, describe_answer, make_plan
from cockpit.runs.layoutfile import parse_layout
from cockpit.runs.ledger import describe_ledger, read_bisects, read_ledger


def test_a_flag_set_off_in_the_failing_configuration_is_a_delta_too():
    """eagle3 hangs only with CUDA graphs on: the good configuration has `graphs` (here: graphs
    off) named in --good."""
    plan = make_plan(layout_of("eagle3"), "h", good=["graphs"])
    assert [d.describe() for d in plan.deltas] == ["graphs off", "eagle3"]
    assert plan.spec([]).enabled == ["graphs"] and plan.spec(plan.names).enabled == ["eagle3"]
    step, _, _ = drive(plan, lambda on: "eagle3" in on and "graphs" not in on)
    assert describe_answer(plan, step.answer) == "graphs off with eagle3"


def test_sets_vary_does_not_name_hold_the_failing_side():
    plan = make_plan(layout_of("graphs, attn"), "h", vary=["eagle3"])
    assert plan.names == ["eagle3"] and plan.held == ["graphs", "attn"]
    assert plan.spec([]).enabled == ["graphs", "attn"] and plan.spec(["eagle3"]).enabled == ["graphs", "eagle3", "attn"]


def test_a_parameter_named_in_vary_is_searched_between_its_values():
    plan = make_plan(layout_of("eagle3"), "h", vary=["eagle3", "mem_fraction_static=0.7"])
    assert plan.spec([]).params == {"mem_fraction_static": "0.7"}
    assert plan.spec(plan.names).params == {"mem_fraction_static": 0.85}
    outcomes, order = {}, []
    while True:
        step = advance(plan, outcomes, len(order))
        if step.status:
            break
        order.append(step.applied)
        high = plan.spec(step.applied).params.get("mem_fraction_static") == 0.85
        outcomes.setdefault(step.applied, []).append("crashed" if high else "ready")
    assert step.answer == ["mem_fraction_static"] and step.probability >= 0.95
    assert describe_answer(plan, step.answer) == "mem_fraction_static=0.85 (good: 0.7)"


@pytest.mark.parametrize(
    "enabled, kw, message",
    [
        ("", {"vary": ["nope"]}, "not a flag set"),
        ("", {"good": ["nope"]}, "no flag set 'nope'"),
        ("attn", {"vary": ["attn"], "good": ["attn"]}, "attn is on in both"),
        ("attn", {"vary": ["attn"], "good": ["eagle3"]}, "--good eagle3: eagle3 is off .* add it to --vary"),
        ("attn", {"confidence": 2}, "a probability from 0.5"),
        ("attn", {"budget": 0}, "at least 1 launch"),
        ("", {}, "nothing to bisect"),
    ],
)
def test_bad_choices_are_one_line_naming_the_fix(enabled, kw, message):
    with pytest.raises(CockpitError, match=message):
        make_plan(layout_of(enabled), "h", **kw)


def test_the_ledger_groups_a_bisects_runs_under_its_line_and_keeps_its_records_apart(tmp_path, monkeypatch):
    from cockpit.runs.ledger import append_ledger

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    layout = layout_of("eagle3")
    for run_id in ("r1", "r2", "r3", "r4"):
        append_ledger(layout, {"event": "launch", "run_id": run_id, "flag_sets": [], "time": 1.0})
        append_ledger(layout, {"event": "outcome", "run_id": run_id, "outcome": "ready", "time": 2.0})
    append_ledger(layout, {"event": "bisect", "bisect_id": "bisect-1", "identity": "x"})
    for run_id in ("r2", "r4"):
        append_ledger(layout, {"event": "bisect-step", "bisect_id": "bisect-1", "run": run_id, "outcome": "ready"})
    append_ledger(
        layout,
        {
            "event": "bisect-result",
            "bisect_id": "bisect-1",
            "status": "found",
            "answer": ["eagle3"],
            "answer_text": "eagle3",
        },
    )
    runs = read_ledger(layout)
    assert [r["run_id"] for r in runs] == ["r1", "r2", "r3", "r4"] and all(r["outcome"] == "ready" for r in runs)
    (group,) = read_bisects(layout)
    assert group["runs"] == ["r2", "r4"] and group["plan"]["identity"] == "x"  # not masked as a secret's name
    lines = describe_ledger(runs, now=3.0, bisects=[group])
    starts = [line.split()[0] for line in lines[1:] if not line.startswith("    ")]
    assert starts == ["r1", "bisect-1:", "r2", "r4", "r3"]
    assert "bisect-1: found eagle3, 2 launches" in lines  # a result written before bisects kept their odds
    append_ledger(
        layout,
        {
            "event": "bisect-result",
            "bisect_id": "bisect-1",
            "status": "found",
            "answer": ["eagle3"],
            "answer_text": "eagle3",
            "probability": 0.9712,
        },
    )
    assert "bisect-1: found eagle3 (97% likely), 2 launches" in describe_ledger(
        runs, now=3.0, bisects=read_bisects(layout)
    )
    assert describe_ledger(runs, now=3.0)[1].startswith("r1")  # without bisects: every run in its place


def test_the_exit_statuses_are_those_the_readme_and_help_say():
    from pathlib import Path

    readme = " ".join((Path(__file__).parents[2] / "README.md").read_text().split())
    said = re.search(r"Exit status of `cockpit bisect`: (.*?)\.", readme).group(1)
    codes = {int(n) for n in re.findall(r"(\d+) [a-z]", said)}
    assert codes == set(EXIT.values()) | {1, 2}
    res = run_cli("bisect", "--help")
    help_text = " ".join(res.stdout.split())
    for code in EXIT.values():
        assert f"{code} " in help_text.split("exit status:")[1]
    assert "4 the good configuration fails too" in help_text and "5 the launch budget spent first" in help_text
    assert "3 no failure reproduced" in help_text and "130 interrupted" in help_text


# ----------------------------------------------------------------------------- on the simulated host


@pytest.fixture
def bisect_host(tmp_path, sim_state):
    port = free_port()
    made = []

    def make(enabled: str, seed: int = 1, prob: float = 0.5):
        path = tmp_path / f"b{len(made)}.yaml"
        path.write_text(layout_text(enabled, tmp_path, port, seed, name=f"b{port}x{len(made)}", prob=prob))
        made.append(path)
        return path, ["local", "--sim", str(sim_state), "--layout", str(path)]

    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    yield make, env, port
    subprocess.run(["pkill", "-9", "-f", f"sim.server.*port {port}"])


def running(port: int) -> str:
    return subprocess.run(["pgrep", "-f", f"sim.server.*port {port}"], capture_output=True, text=True).stdout.strip()


def bisect_cli(target, env, *extra, timeout=400):
    res = run_cli(
        "bisect",
        *target,
        "--settle",
        "1",
        "--timeout",
        "60",
        "--interval",
        "0.25",
        "--yes",
        "--json",
        *extra,
        env=env,
        timeout=timeout,
    )
    doc = json.loads(res.stdout) if res.stdout.strip().startswith("{") else None
    return res, doc


def test_one_of_four_hangs_found_alone_across_ctrl_c_and_a_resume(bisect_host, monkeypatch):
    make, env, port = bisect_host
    path, target = make("graphs, eagle3, allreduce, attn")
    layout = parse_layout(path.read_text(), str(path))
    said = open(path.parent / "bisect-stderr.txt", "w+")  # a file, not a pipe: a full pipe would block its progress
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cockpit",
            "bisect",
            *target,
            "--settle",
            "1",
            "--timeout",
            "60",
            "--interval",
            "0.25",
            "--yes",
            "--json",
        ],
        env=dict(os.environ, **env),
        stdout=subprocess.PIPE,
        stderr=said,
        text=True,
    )
    monkeypatch.setenv("XDG_STATE_HOME", env["XDG_STATE_HOME"])
    try:
        deadline = time.monotonic() + 200
        while not (
            read_bisects(layout) and len(read_bisects(layout)[0]["steps"]) >= 2 and len(read_ledger(layout)) >= 3
        ):
            assert time.monotonic() < deadline and proc.poll() is None, said.read() if proc.poll() else ""
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)  # while the third candidate is under way
        out, _ = proc.communicate(timeout=120)
        said.seek(0)
        assert proc.returncode == EXIT["interrupted"], said.read()[-2000:]
        first = json.loads(out)
        assert first["status"] == "interrupted" and not running(port)  # nothing left running
        assert first["steps"][-1]["outcome"] == "interrupted"
        judged = [s for s in first["steps"] if s["outcome"] != "interrupted"]
        assert judged[0]["candidate"] == "graphs,eagle3,allreduce,attn" and judged[0]["outcome"] == "stalled-idle"
        runs = read_ledger(layout)
        assert all(r.get("stop") or r["outcome"] != "unknown" for r in runs)
    finally:
        said.close()
    res, doc = bisect_cli(target, env)
    assert res.returncode == 0, res.stderr[-2000:]
    assert doc["status"] == "found" and doc["answer"] == ["eagle3"] and doc["answer_text"] == "eagle3"
    assert doc["probability"] >= 0.95 and doc["odds"][0] == ["eagle3", doc["probability"]]
    assert doc["resumed"] == len(first["steps"]) and doc["bisect_id"] == first["bisect_id"]
    # the search goes on from what the ledger holds: the same launches as a search told those outcomes
    plan = make_plan(layout, "local")
    known: dict = {}
    for s in judged:
        known.setdefault(frozenset(s["applied"]), []).append(s["outcome"])
    _, rest, _ = drive(plan, lambda on: "eagle3" in on, known=known, launched=len(first["steps"]))
    assert [frozenset(s["applied"]) for s in doc["steps"][doc["resumed"] :]] == rest
    for s in doc["steps"]:
        assert s["outcome"] in ("stalled-idle", "ready", "interrupted") and s["seconds"] > 0 and s["run"]
        assert ("eagle3" in s["candidate"]) == (s["outcome"] == "stalled-idle") or s["outcome"] == "interrupted"
    assert doc["facts"].get("driver") and all(s["odds"] for s in doc["steps"][doc["resumed"] :])
    assert not running(port)
    table = run_cli("runs", "--layout", str(path), env=env).stdout
    assert f"{doc['bisect_id']}: found eagle3 ({doc['probability']:.0%} likely), {len(doc['steps'])} launches" in table
    # a third call has nothing left to launch: the answer from the ledger, and its plan says so
    res, doc3 = bisect_cli(target, env)
    assert res.returncode == 0 and doc3["answer"] == ["eagle3"] and doc3["launched_now"] == 0
    res = run_cli("bisect", *target, "--yes", env=env, timeout=120)
    assert res.returncode == 0 and "nothing is launched nor stopped" in res.stdout + res.stderr
    assert "killed" not in res.stdout + res.stderr
    # --fresh starts anew; a budget of one launch ends it after the failing configuration
    res, fresh = bisect_cli(target, env, "--fresh", "--budget", "1")
    assert res.returncode == EXIT["budget exhausted"] == 5, res.stderr[-2000:]
    assert fresh["bisect_id"] != doc["bisect_id"] and fresh["resumed"] == 0 and fresh["launches"] == 1
    assert fresh["steps"][0]["outcome"] == "stalled-idle" and fresh["probability"] < 0.95  # the likeliest so far
    assert not running(port)


def test_two_that_hang_only_together_are_found_as_the_pair(bisect_host):
    make, env, port = bisect_host
    path, target = make("graphs, part_a, allreduce, part_b")
    res, doc = bisect_cli(target, env)
    assert res.returncode == 0, res.stderr[-2000:]
    assert doc["answer"] == ["part_a", "part_b"] and doc["answer_text"] == "part_a with part_b"
    assert doc["probability"] >= 0.95 and doc["steps"][0]["candidate"] == "graphs,allreduce,part_a,part_b"
    said = res.stderr.splitlines()
    assert all(a != b for a, b in zip(said, said[1:]))  # the progress: a line per change of state, not per sample
    assert sum("capturing cuda graphs" in line for line in said) <= 3 * len(doc["steps"])
    for s in doc["steps"]:  # a launch hangs exactly when it holds both
        assert (s["outcome"] == "stalled-idle") == ({"part_a", "part_b"} <= set(s["applied"]))
    assert not running(port)
    text = run_cli("runs", "--layout", str(path), env=env).stdout
    assert "found part_a with part_b" in text


def test_a_flaky_hang_is_found_with_its_odds_on_the_simulated_host(bisect_host):
    """One launch in two hangs (the simulated host's seeded draw): the failing configuration's first
    launch passes and ends nothing; the answer comes with its odds, and every launch is the one the
    pure search names for the outcomes the host's draws give (tests/runs/bisect_oracle.py)."""
    make, env, port = bisect_host
    path, target = make("graphs, flaky", seed=11, prob=0.5)
    res, doc = bisect_cli(target, env, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert doc["status"] == "found" and doc["answer"] == ["flaky"] and doc["probability"] >= 0.95
    assert 0 < doc["rate"] < 0.9  # read as flaky
    plan = make_plan(parse_layout(path.read_text(), str(path)), "local")
    step, order, outcomes = drive(plan, sim_flaky(11, 0.5))
    assert [frozenset(s["applied"]) for s in doc["steps"]] == order
    assert [s["outcome"] for s in doc["steps"]][:2] == ["ready", outcomes[frozenset(plan.names)][1]]
    assert round(step.probability, 4) == doc["probability"]
    text = bisect_cli_text(target, env)
    assert f"flaky, {doc['probability']:.0%} likely; a flaky hang: about 1 launch in" in text
    assert not running(port)


def bisect_cli_text(target, env) -> str:
    """The plain report of the bisect the ledger already answers (nothing launched)."""
    res = run_cli(
        "bisect", *target, "--settle", "1", "--timeout", "60", "--interval", "0.25", "--yes", env=env, timeout=120
    )
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout


async def test_b_in_the_cockpit_shows_the_plan_runs_it_and_l_groups_its_runs(sim_state, tmp_path, monkeypatch):
    """B: the sides chosen, the plan (the sets, the most launches), the progress and the odds in
    the header; B again stops it cleanly; B once more resumes it to the answer with its odds, in a
    report; L then shows the bisect's runs under its line."""
    from fixtures_shared import sim_monitor
    from simhost import until

    from cockpit.monitor import demo
    from cockpit.ui.app import CockpitApp, save_text
    from cockpit.ui.screens import BisectScreen, ConfirmScreen, ReportScreen

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    port = free_port()
    layout = layout_of("eagle3", tmp=tmp_path, port=port)
    layout.name = f"ui{port}"

    async def on_connect(monitor):
        monitor.follow(await demo.start_demo(monitor))

    app = CockpitApp(monitor=sim_monitor(sim_state, port, layout, on_connect))
    try:
        async with app.run_test(size=(160, 50)) as pilot:
            await until(pilot, lambda: app.cockpit.verdict.name == "stalled-idle", 60)
            await pilot.press("B")  # the run on screen fails; no run came up yet: both sides to choose
            await until(pilot, lambda: isinstance(app.screen, BisectScreen), 30)
            await until(pilot, lambda: "suspects: eagle3" in save_text(app, None), 10)
            await pilot.press("ctrl+r")
            await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), 30)
            most = make_plan(layout, "local", failing=["eagle3"]).most()
            await until(pilot, lambda: f"at most {most} launches" in save_text(app, None), 10)
            plan = save_text(app, None)
            assert "bisect over 1: eagle3" in plan and "the run: launched by this cockpit" in plan
            await pilot.press("y")
            await until(
                pilot,
                lambda: (
                    f"bisect: launch 1 of at most {most}, eagle3 (odds: eagle3"
                    in " ".join(save_text(app, None).split())
                ),
                30,
            )
            await pilot.press("B")  # while it runs: stop it
            await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), 10)
            await until(pilot, lambda: "Stop the bisection?" in save_text(app, None), 10)
            await pilot.press("y")
            await until(pilot, lambda: isinstance(app.screen, ReportScreen), 60)
            await until(pilot, lambda: ": interrupted" in save_text(app, None), 10)
            await pilot.press("escape")
            await until(pilot, lambda: app.cockpit.busy is None, 30)
            assert not running(port)  # the launch under way is stopped, verified gone
            (group,) = read_bisects(layout)
            assert [s["outcome"] for s in group["steps"]] == ["interrupted"]
            await pilot.press("B")  # the same bisect again (the ledger's failing run; none came up): it resumes
            await until(pilot, lambda: isinstance(app.screen, BisectScreen), 30)
            await pilot.press("ctrl+r")
            await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), 30)
            await until(pilot, lambda: "1 launch already in the ledger" in save_text(app, None), 10)
            await pilot.press("y")
            await until(pilot, lambda: isinstance(app.screen, ReportScreen), 120)
            await until(pilot, lambda: "the smallest failing set: eagle3, " in save_text(app, None), 10)
            report = save_text(app, None)
            assert "stalled-idle" in report and "no flag sets" in report and "ready" in report
            await pilot.press("escape")
            await until(pilot, lambda: app.cockpit.busy is None, 30)
            assert not running(port)  # the last candidate is stopped with the bisect
            await pilot.press("L")
            await until(pilot, lambda: re.search(r"found eagle3 \(\d+% likely\), 3 launches", save_text(app, None)), 10)
            ledger = save_text(app, None).splitlines()
            head = next(i for i, line in enumerate(ledger) if "% likely), 3 launches" in line)
            (group,) = read_bisects(layout)
            assert [s["outcome"] for s in group["steps"]] == ["interrupted", "stalled-idle", "ready"]
            at = [next(i for i, line in enumerate(ledger) if run in line) for run in group["runs"]]
            assert head < at[0] < at[1] < at[2]  # its three runs, under it
            before = next(i for i, line in enumerate(ledger) if read_ledger(layout)[0]["run_id"] in line)
            assert before < head  # the run the bisect stopped first is not one of its own
    finally:
        subprocess.run(["pkill", "-9", "-f", f"sim.server.*port {port}"])


# ----------------------------------------------------------------------------- the report and the resume's plan


def bisect_doc(steps, status="found", answer=("eagle3",), p=0.97):
    text = ", ".join(answer)
    return {
        "bisect_id": "bisect-x",
        "status": status,
        "answer": list(answer),
        "answer_text": text,
        "why": "",
        "probability": p,
        "rate": 1.0,
        "odds": [[text, p]],
        "launches": len(steps),
        "launched_now": len(steps),
        "resumed": 0,
        "set_aside": 0,
        "steps": steps,
    }


def test_the_report_at_80_columns_never_splits_a_value_and_counts_in_words():
    """Rendered as the report dialog renders it at 80x24 (about 74 columns inside): every flag set,
    outcome and time whole on one line; `1 launch`."""
    import io

    from rich.console import Console

    from cockpit.operate.bisect import describe_bisect
    from cockpit.ui.screens import Hanging

    sets = ["graphs", "eagle3", "allreduce", "attn", "part_a", "part_b", "no_custom_all_reduce", "flaky"]
    steps = [
        {
            "run": f"layout-with-a-long-name-20261205-0859{n:02d}-981",
            "candidate": ",".join(sets[: n + 1]),
            "outcome": "stalled-spinning",
            "seconds": 1234.0,
            "odds": [["eagle3", 0.5 + n / 20]],
        }
        for n in range(len(sets))
    ]
    lines = describe_bisect(bisect_doc(steps))
    console = Console(width=74, file=io.StringIO(), color_system=None, record=True)
    console.print(Hanging(lines))
    shown = console.export_text().splitlines()
    for value in sets + ["stalled-spinning", "1234 s", "85%"] + [s["run"] for s in steps]:
        assert any(value in line for line in shown), value
    assert all(len(line) <= 74 for line in shown)
    one = describe_bisect(bisect_doc(steps[:1]))
    assert one[1] == "1 launch" and "1 launches" not in "\n".join(one)


def test_the_resumes_plan_says_nothing_is_launched_nor_killed_when_the_ledger_answers():
    from cockpit.operate.bisect import Prepared
    from cockpit.runs.bisect import split_steps

    plan = make_plan(layout_of("graphs, eagle3"), "h")
    steps = [
        {"applied": ["graphs", "eagle3"], "outcome": "stalled-idle", "facts": {"driver": "550.54"}},
        {"applied": ["graphs"], "outcome": "ready", "facts": {"driver": "550.54"}},
        {"applied": ["eagle3"], "outcome": "stalled-idle", "facts": {"driver": "550.54"}},
        {"applied": [], "outcome": "ready", "facts": {"driver": "550.54"}},
        {"applied": ["graphs"], "outcome": "stalled-idle"},
    ]  # a ledger from before facts were kept
    kept, aside = split_steps(steps, {"driver": "550.54", "torch": "2.8.0"})
    assert kept == steps and aside == []
    from cockpit.runs.bisect import known_outcomes

    ready = Prepared(
        plan,
        {"driver": "550.54"},
        {"bisect_id": "bisect-1", "steps": steps},
        steps[:4],
        [],
        advance(plan, known_outcomes(plan, steps[:4]), 4),
    )
    text = "\n".join(ready.describe())
    assert not ready.launches and "nothing is launched nor stopped" in text and "killed" not in text
    assert "resumes bisect-1: 4 launches already in the ledger" in text
    # after a driver upgrade the same launches are set aside: the bisect starts over, and says why
    kept, aside = split_steps(steps, {"driver": "560.28"})
    assert kept == steps[4:] and aside == steps[:4]
    again = Prepared(
        plan,
        {"driver": "560.28"},
        {"bisect_id": "bisect-1", "steps": steps},
        kept,
        aside,
        advance(plan, known_outcomes(plan, kept), len(kept)),
    )
    said = "\n".join(again.describe())
    assert again.launches and "4 launches of it set aside: made under other host facts (driver 550.54 → 560.28)" in said
