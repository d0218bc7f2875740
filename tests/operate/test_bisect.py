"""Bisect: the pure ddmin search (cockpit/runs/bisect.py) against oracles, then `cockpit bisect` on
the simulated host with real processes: one of four flag sets hangs (across a Ctrl+C and a resume),
two hang only together, a flaky hang found with --repeat."""

import itertools
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from cockpit.common.errors import CockpitError
from cockpit.runs.bisect import EXIT, advance, ddmin, describe_answer, judge, make_plan
from cockpit.runs.layoutfile import parse_layout
from cockpit.runs.ledger import describe_ledger, read_bisects, read_ledger
from conftest import free_port, run_cli

LAYOUT = """\
name: {name}
engine: sglang
command: [-m, cockpit.sim.server]
base_flags: [--tp-size, "2", --port, "{port}", --sim-traffic, "2"]
flag_sets:
  graphs: [--cuda-graph-max-bs, "80"]
  eagle3: [--speculative-algorithm, EAGLE3, --speculative-draft-model-path, /d]
  allreduce: [--disable-custom-all-reduce]
  attn: [--attention-backend, fa3]
  part_a: [--sim-hang-part, a]
  part_b: [--sim-hang-part, b]
  flaky: [--sim-hang-prob, "0.5"]
enabled: [{enabled}]
params:
  mem_fraction_static: 0.85
log_dir: {tmp}/runs
ports: [{port}]
watch: []
stall: {{idle_s: 3, spin_s: 3}}
kill_wait_s: 1
sim: {{speed: 8, seed: {seed}}}
"""


def layout_of(enabled="", tmp="/tmp", port=1, seed=1):
    return parse_layout(LAYOUT.format(name="b", port=port, tmp=tmp, enabled=enabled, seed=seed), "b.yaml")


def drive(plan, fails, known=None, launched=0):
    """Run the search to its end against an oracle `fails(flag_sets) -> bool or outcome`; returns
    (the final step, the candidates launched in order, every outcome)."""
    outcomes = {k: list(v) for k, v in (known or {}).items()}
    order = []
    for _ in range(1000):
        step = advance(plan, outcomes, launched + len(order))
        if step.status:
            return step, order, outcomes
        said = fails(plan.spec(step.applied).enabled)
        outcome = said if isinstance(said, str) else ("stalled-idle" if said else "ready")
        order.append(step.applied)
        outcomes.setdefault(step.applied, []).append(outcome)
    raise AssertionError("the search never ended")


# ----------------------------------------------------------------------------- the search, pure


def test_one_of_four_is_found_alone_in_few_launches():
    plan = make_plan(layout_of("graphs, eagle3, allreduce, attn"), "h")
    assert plan.names == ["graphs", "eagle3", "allreduce", "attn"]
    step, order, _ = drive(plan, lambda on: "eagle3" in on)
    assert (step.status, step.answer) == ("found", ["eagle3"])
    assert describe_answer(plan, step.answer) == "eagle3"
    assert order[0] == frozenset(plan.names)  # the failing configuration first
    assert order[-1] == frozenset()  # a single delta is blamed only once the good configuration passes
    assert len(order) <= plan.max_launches() and len(order) < 2 ** 4


def test_a_pair_is_found_as_the_pair_and_each_alone_passes():
    plan = make_plan(layout_of("graphs, eagle3, allreduce, attn"), "h")
    step, order, outcomes = drive(plan, lambda on: {"allreduce", "attn"} <= set(on))
    assert (step.status, step.answer) == ("found", ["allreduce", "attn"])
    assert describe_answer(plan, step.answer) == "allreduce with attn"
    assert judge(outcomes[frozenset({"allreduce"})], 1) is False and judge(outcomes[frozenset({"attn"})], 1) is False


def test_every_single_and_pair_culprit_among_six_is_found_1_minimal():
    names = ["graphs", "eagle3", "allreduce", "attn", "part_a", "part_b"]
    plan = make_plan(layout_of(", ".join(names)), "h")
    for size in (1, 2):
        for culprit in itertools.combinations(names, size):
            step, order, _ = drive(plan, lambda on: set(culprit) <= set(on))
            assert (step.status, set(step.answer)) == ("found", set(culprit))
            assert len(order) <= plan.max_launches()
            assert len(set(order)) == len(order)  # a judged candidate is never launched again


def test_a_flag_set_off_in_the_failing_configuration_is_a_delta_too():
    """eagle3 hangs only with CUDA graphs on: the good configuration has `graphs` (here: graphs
    off) named in --good."""
    plan = make_plan(layout_of("eagle3"), "h", good=["graphs"])
    assert [d.describe() for d in plan.deltas] == ["graphs off", "eagle3"]
    assert plan.spec([]).enabled == ["graphs"] and plan.spec(plan.names).enabled == ["eagle3"]
    step, _, _ = drive(plan, lambda on: "eagle3" in on and "graphs" not in on)
    assert describe_answer(plan, step.answer) == "graphs off with eagle3"


def test_the_readme_walk_through_on_the_demo_layout():
    """`cockpit bisect demo --good no_cuda_graph`: the simulated EAGLE-3 deadlock is in the draft
    CUDA graph's capture (cockpit/sim/server.py skips it with --disable-cuda-graph), so the answer
    is the pair, in 3 launches; `B` on the demo (EAGLE-3 on) plans at most 2."""
    from cockpit.runs.layouts import resolve_layout

    demo = resolve_layout("demo")
    plan = make_plan(demo, "demo", good=["no_cuda_graph"])
    step, order, _ = drive(plan, lambda on: "eagle3" in on and "no_cuda_graph" not in on)
    assert describe_answer(plan, step.answer) == "eagle3 with no_cuda_graph off" and len(order) == 3
    assert plan.describe()[0] == "bisect over 2: eagle3, no_cuda_graph off"
    ui = make_plan(demo, "demo", failing=demo.enabled)
    assert ui.describe()[0] == "bisect over 1: eagle3" and "at most 2 launches" in ui.describe()[-1]


def test_sets_vary_does_not_name_hold_the_failing_side():
    plan = make_plan(layout_of("graphs, attn"), "h", vary=["eagle3"])
    assert plan.names == ["eagle3"] and plan.held == ["graphs", "attn"]
    assert plan.spec([]).enabled == ["graphs", "attn"] and plan.spec(["eagle3"]).enabled == ["graphs", "eagle3", "attn"]


def test_a_parameter_named_in_vary_is_searched_between_its_values():
    plan = make_plan(layout_of("eagle3"), "h", vary=["eagle3", "mem_fraction_static=0.7"])
    assert plan.spec([]).params == {"mem_fraction_static": "0.7"}
    assert plan.spec(plan.names).params == {"mem_fraction_static": 0.85}
    high = lambda on, params: params.get("mem_fraction_static") == 0.85  # noqa: E731
    outcomes, order = {}, []
    while True:
        step = advance(plan, outcomes, len(order))
        if step.status:
            break
        spec = plan.spec(step.applied)
        order.append(step.applied)
        outcomes.setdefault(step.applied, []).append("crashed" if high(spec.enabled, spec.params) else "ready")
    assert step.answer == ["mem_fraction_static"]
    assert describe_answer(plan, step.answer) == "mem_fraction_static=0.85 (good: 0.7)"


def test_a_pass_needs_repeat_clean_launches_and_a_failure_is_final():
    assert judge(["ready", "ready"], 3) is None
    assert judge(["ready", "ready", "ready"], 3) is False
    assert judge(["ready", "stalled-spinning"], 3) is True
    assert judge(["interrupted"], 1) is None and judge(["timeout"], 1) is True


def test_a_flaky_hang_is_found_with_repeat():
    """A hang that shows one launch in two: with --repeat 5 a candidate holding it is cleared
    only when five launches in a row stay clean (1 in 32), and is never launched after its
    first failure."""
    plan = make_plan(layout_of("graphs, flaky, allreduce"), "h", repeat=5)
    found = 0
    for seed in range(40):
        rng = random.Random(seed)
        step, order, outcomes = drive(plan, lambda on: "flaky" in on and rng.random() < 0.5)
        found += step.answer == ["flaky"]
        for applied, said in outcomes.items():
            assert said.count("stalled-idle") <= 1 and (said[-1] == "stalled-idle" or said.count("ready") == 5)
    assert found >= 30  # the odds of clearing it wrongly are small; each draw's outcome is checked above
    once = make_plan(layout_of("graphs, flaky, allreduce"), "h", repeat=1)
    misses = sum(drive(once, lambda on: "flaky" in on and rng.random() < 0.5)[0].answer != ["flaky"]
                 for rng in (random.Random(s) for s in range(40)))
    assert misses > 40 - found  # without repeat the flaky hang is missed more often


def test_not_reproduced_good_fails_and_the_budget_end_the_search():
    plan = make_plan(layout_of("graphs, eagle3"), "h", repeat=2)
    step, order, _ = drive(plan, lambda on: False)
    assert step.status == "not reproduced" and len(order) == 2 and EXIT[step.status] == 3
    step, order, _ = drive(plan, lambda on: True)
    assert step.status == "good fails" and order[-1] == frozenset() and EXIT[step.status] == 4
    small = make_plan(layout_of("graphs, eagle3, allreduce, attn"), "h", budget=3)
    step, order, _ = drive(small, lambda on: "eagle3" in on)
    assert step.status == "budget exhausted" and len(order) == 3 and EXIT[step.status] == 5
    assert step.answer == ["graphs", "eagle3"]  # the smallest failing candidate known when it stopped


def test_resuming_replays_what_is_known_and_launches_only_the_rest():
    plan = make_plan(layout_of("graphs, eagle3, allreduce, attn"), "h")
    fails = lambda on: "attn" in on  # noqa: E731
    _, whole, outcomes = drive(plan, fails)
    for cut in range(len(whole)):
        known = {k: v for k, v in outcomes.items() if k in whole[:cut]}
        step, rest, _ = drive(plan, fails, known=known, launched=cut)
        assert step.answer == ["attn"] and rest == whole[cut:]
    # a larger budget goes on where a smaller one stopped: the same bisect (its identity ignores it)
    assert make_plan(layout_of("graphs, eagle3"), "h", budget=2, repeat=3).identity() == \
        make_plan(layout_of("graphs, eagle3"), "h").identity() != make_plan(layout_of("graphs, eagle3"), "other").identity()
    edited = layout_of("graphs, eagle3")
    edited.flag_sets["eagle3"] = ["--speculative-algorithm", "EAGLE"]
    assert make_plan(edited, "h").identity() != make_plan(layout_of("graphs, eagle3"), "h").identity()
    assert make_plan(layout_of("graphs, eagle3"), "h", good=["attn"], vary=["graphs", "eagle3", "attn"]).identity() \
        != make_plan(layout_of("graphs, eagle3"), "h").identity()


def test_ddmin_is_zellers_on_a_plain_list():
    search = ddmin([1, 2, 3, 4, 5, 6, 7, 8])
    culprit = {3, 7}
    applied = next(search)
    tried = []
    try:
        while True:
            tried.append(applied)
            applied = search.send(culprit <= applied)
    except StopIteration as done:
        assert sorted(done.value) == [3, 7]
    assert len(tried) <= 8 * 8 + 3 * 8


@pytest.mark.parametrize("enabled, kw, message", [
    ("", {"vary": ["nope"]}, "not a flag set"),
    ("", {"good": ["nope"]}, "no flag set 'nope'"),
    ("attn", {"vary": ["attn"], "good": ["attn"]}, "attn is on in both"),
    ("attn", {"vary": ["attn"], "good": ["eagle3"]}, "--good eagle3: eagle3 is off .* add it to --vary"),
    ("attn", {"repeat": 0}, "at least 1 clean launch"),
    ("attn", {"budget": 0}, "at least 1 launch"),
    ("", {}, "nothing to bisect"),
])
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
    append_ledger(layout, {"event": "bisect-result", "bisect_id": "bisect-1", "status": "found", "answer": ["eagle3"],
                           "answer_text": "eagle3"})
    runs = read_ledger(layout)
    assert [r["run_id"] for r in runs] == ["r1", "r2", "r3", "r4"] and all(r["outcome"] == "ready" for r in runs)
    (group,) = read_bisects(layout)
    assert group["runs"] == ["r2", "r4"] and group["plan"]["identity"] == "x"  # not masked as a secret's name
    lines = describe_ledger(runs, now=3.0, bisects=[group])
    starts = [line.split()[0] for line in lines[1:] if not line.startswith("    ")]
    assert starts == ["r1", "bisect-1:", "r2", "r4", "r3"]
    assert "bisect-1: found eagle3, 2 launches" in lines
    assert describe_ledger(runs, now=3.0)[1].startswith("r1")  # without bisects: every run in its place


def test_the_exit_statuses_are_those_the_readme_and_help_say():
    import re
    from pathlib import Path

    readme = " ".join((Path(__file__).parents[2] / "README.md").read_text().split())
    said = re.search(r"Exit status of `cockpit bisect`: (.*?)\.", readme).group(1)
    codes = {int(n) for n in re.findall(r"(\d+) [a-z]", said)}
    assert codes == set(EXIT.values()) | {1, 2}
    res = run_cli("bisect", "--help")
    help_text = " ".join(res.stdout.split())
    for status, code in EXIT.items():
        assert f"{code} " in help_text.split("exit status:")[1]
    assert "4 the good configuration fails too" in help_text and "5 the launch budget spent first" in help_text
    assert "3 no failure reproduced" in help_text and "130 interrupted" in help_text


# ----------------------------------------------------------------------------- on the simulated host


@pytest.fixture
def bisect_host(tmp_path, sim_state):
    port = free_port()
    made = []

    def make(enabled: str, seed: int = 1):
        path = tmp_path / f"b{len(made)}.yaml"
        path.write_text(LAYOUT.format(name=f"b{port}x{len(made)}", port=port, tmp=tmp_path, enabled=enabled,
                                      seed=seed))
        made.append(path)
        return path, ["local", "--sim", str(sim_state), "--layout", str(path)]

    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    yield make, env, port
    subprocess.run(["pkill", "-9", "-f", f"sim.server.*port {port}"])


def running(port: int) -> str:
    return subprocess.run(["pgrep", "-f", f"sim.server.*port {port}"], capture_output=True, text=True).stdout.strip()


def bisect_cli(target, env, *extra, timeout=400):
    res = run_cli("bisect", *target, "--settle", "1", "--timeout", "60", "--interval", "0.25", "--yes", "--json", *extra, env=env,
                  timeout=timeout)
    doc = json.loads(res.stdout) if res.stdout.strip().startswith("{") else None
    return res, doc


def test_one_of_four_hangs_found_alone_across_ctrl_c_and_a_resume(bisect_host, monkeypatch):
    make, env, port = bisect_host
    path, target = make("graphs, eagle3, allreduce, attn")
    layout = parse_layout(path.read_text(), str(path))
    proc = subprocess.Popen([sys.executable, "-m", "cockpit", "bisect", *target, "--settle", "1", "--timeout", "60",
                             "--interval", "0.25", "--yes", "--json"], env=dict(os.environ, **env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    monkeypatch.setenv("XDG_STATE_HOME", env["XDG_STATE_HOME"])
    deadline = time.monotonic() + 200
    while not (read_bisects(layout) and len(read_bisects(layout)[0]["steps"]) >= 2 and len(read_ledger(layout)) >= 3):
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read() if proc.poll() else ""
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)  # while the third candidate is under way
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == EXIT["interrupted"], err[-2000:]
    first = json.loads(out)
    assert first["status"] == "interrupted" and not running(port)  # nothing left running
    assert first["steps"][-1]["outcome"] == "interrupted"
    judged = [s for s in first["steps"] if s["outcome"] != "interrupted"]
    assert judged[0]["candidate"] == "graphs,eagle3,allreduce,attn" and judged[0]["outcome"] == "stalled-idle"
    runs = read_ledger(layout)
    assert all(r.get("stop") or r["outcome"] != "unknown" for r in runs)
    res, doc = bisect_cli(target, env)
    assert res.returncode == 0, res.stderr[-2000:]
    assert doc["status"] == "found" and doc["answer"] == ["eagle3"] and doc["answer_text"] == "eagle3"
    assert doc["resumed"] == len(first["steps"]) and doc["bisect_id"] == first["bisect_id"]
    again = [s["candidate"] for s in doc["steps"][doc["resumed"]:]]
    assert not set(again) & {s["candidate"] for s in judged}  # what was judged is not launched again
    for s in doc["steps"]:
        assert s["outcome"] in ("stalled-idle", "ready", "interrupted") and s["seconds"] > 0 and s["run"]
        assert ("eagle3" in s["candidate"]) == (s["outcome"] == "stalled-idle") or s["outcome"] == "interrupted"
    assert doc["steps"][-1]["candidate"] == "no flag sets" and doc["steps"][-1]["outcome"] == "ready"
    assert not running(port)
    table = run_cli("runs", "--layout", str(path), env=env).stdout
    assert f"{doc['bisect_id']}: found eagle3, {len(doc['steps'])} launches" in table
    # a third call has nothing left to launch: the answer from the ledger
    res, doc3 = bisect_cli(target, env)
    assert res.returncode == 0 and doc3["answer"] == ["eagle3"] and doc3["launched_now"] == 0
    # --fresh starts anew; a budget of one launch ends it after the failing configuration
    res, fresh = bisect_cli(target, env, "--fresh", "--budget", "1")
    assert res.returncode == EXIT["budget exhausted"] == 5, res.stderr[-2000:]
    assert fresh["bisect_id"] != doc["bisect_id"] and fresh["resumed"] == 0 and fresh["launches"] == 1
    assert fresh["steps"][0]["outcome"] == "stalled-idle" and fresh["answer"] == ["graphs", "eagle3", "allreduce", "attn"]
    assert not running(port)


def test_two_that_hang_only_together_are_found_as_the_pair(bisect_host):
    make, env, port = bisect_host
    path, target = make("graphs, part_a, allreduce, part_b")
    res, doc = bisect_cli(target, env)
    assert res.returncode == 0, res.stderr[-2000:]
    assert doc["answer"] == ["part_a", "part_b"] and doc["answer_text"] == "part_a with part_b"
    by = {s["candidate"]: s["outcome"] for s in doc["steps"]}
    assert by["graphs,allreduce,part_a,part_b"] == "stalled-idle"
    assert by["part_a"] == by["part_b"] == "ready"  # each alone passes
    assert not running(port)
    text = run_cli("runs", "--layout", str(path), env=env).stdout
    assert "found part_a with part_b" in text


def test_a_flaky_hang_is_found_with_repeat_on_the_simulated_host(bisect_host):
    """One launch in two hangs: a clean launch of a candidate holding it does not clear it, the
    first hang does (and it is not launched again)."""
    make, env, port = bisect_host
    # the simulated host's draws for seed 28 (its n-th flaky launch, cockpit/sim/server.py): clean,
    # hang, clean, hang: each candidate holding the hang comes up clean before it hangs
    path, target = make("graphs, flaky", seed=28)
    res, doc = bisect_cli(target, env, "--repeat", "2", timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert doc["answer"] == ["flaky"] and doc["status"] == "found"
    outcomes = {c: [s["outcome"] for s in doc["steps"] if s["candidate"] == c] for c in ("graphs,flaky", "flaky")}
    assert outcomes == {"graphs,flaky": ["ready", "stalled-idle"], "flaky": ["ready", "stalled-idle"]}
    assert [s["outcome"] for s in doc["steps"] if s["candidate"] == "graphs"] == ["ready"] * 2
    assert [s["outcome"] for s in doc["steps"] if s["candidate"] == "no flag sets"] == ["ready"] * 2
    assert not running(port)


async def test_b_in_the_cockpit_shows_the_plan_runs_it_and_l_groups_its_runs(sim_state, tmp_path, monkeypatch):
    """B: the plan (the sets, the most launches), the progress in the header; B again stops it
    cleanly; B once more resumes it to the answer, in a report; L then shows the bisect's runs
    under its line."""
    from cockpit.monitor import demo
    from cockpit.ui.app import CockpitApp, save_text
    from cockpit.ui.screens import ConfirmScreen, ReportScreen
    from simhost import until
    from fixtures_shared import sim_monitor

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    port = free_port()
    layout = layout_of("eagle3", tmp=tmp_path, port=port)
    layout.name = f"ui{port}"

    async def on_connect(monitor):
        monitor.follow(await demo.start_demo(monitor.session, layout, str(sim_state)))

    app = CockpitApp(monitor=sim_monitor(sim_state, port, layout, on_connect))
    try:
        async with app.run_test(size=(160, 50)) as pilot:
            await until(pilot, lambda: app.cockpit.verdict.name == "stalled-idle", 60)
            await pilot.press("B")
            await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), 30)
            await until(pilot, lambda: "at most 2 launches" in save_text(app, None), 10)
            plan = save_text(app, None)
            assert "bisect over 1: eagle3" in plan and "the run: launched by this cockpit" in plan
            await pilot.press("y")
            await until(pilot, lambda: "bisect: launch 1 of at most 2, eagle3" in save_text(app, None), 30)
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
            await pilot.press("B")  # the same bisect again: it resumes
            await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), 30)
            await until(pilot, lambda: "1 launch already in the ledger" in save_text(app, None), 10)
            await pilot.press("y")
            await until(pilot, lambda: isinstance(app.screen, ReportScreen), 120)
            await until(pilot, lambda: "the smallest failing set: eagle3" in save_text(app, None), 10)
            report = save_text(app, None)
            assert "stalled-idle" in report and "no flag sets" in report and "ready" in report
            await pilot.press("escape")
            await until(pilot, lambda: app.cockpit.busy is None, 30)
            assert not running(port)  # the last candidate is stopped with the bisect
            await pilot.press("L")
            await until(pilot, lambda: "found eagle3, 3 launches" in save_text(app, None), 10)
            ledger = save_text(app, None).splitlines()
            head = next(i for i, line in enumerate(ledger) if "found eagle3, 3 launches" in line)
            (group,) = read_bisects(layout)
            assert [s["outcome"] for s in group["steps"]] == ["interrupted", "stalled-idle", "ready"]
            at = [next(i for i, line in enumerate(ledger) if run in line) for run in group["runs"]]
            assert head < at[0] < at[1] < at[2]  # its three runs, under it
            before = next(i for i, line in enumerate(ledger) if read_ledger(layout)[0]["run_id"] in line)
            assert before < head  # the run the bisect stopped first is not one of its own
    finally:
        subprocess.run(["pkill", "-9", "-f", f"sim.server.*port {port}"])
