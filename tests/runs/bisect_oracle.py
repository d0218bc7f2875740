"""What the bisect's pure tests and its benchmark share: a layout of simulated flag sets, the search
driven against an outcome oracle, a seeded flaky hang, and the search before it weighed flakiness
(Zeller's ddmin, a candidate cleared by one clean launch) as the launch count to compare with."""

from __future__ import annotations

import random

from cockpit.runs.bisect import advance
from cockpit.runs.layoutfile import parse_layout

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
  flaky: [--sim-hang-prob, "{prob}"]
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


def layout_text(enabled="", tmp="/tmp", port=1, seed=1, name="b", prob=0.5) -> str:
    return LAYOUT.format(name=name, port=port, tmp=tmp, enabled=enabled, seed=seed, prob=prob)


def layout_of(enabled="", tmp="/tmp", port=1, seed=1, prob=0.5):
    return parse_layout(layout_text(enabled, tmp, port, seed, prob=prob), "b.yaml")


def drive(plan, fails, known=None, launched=0, limit=1000):
    """Run the search to its end against an oracle `fails(flag_sets) -> bool or outcome`; returns
    (the final step, the candidates launched in order, every outcome)."""
    outcomes = {k: list(v) for k, v in (known or {}).items()}
    order = []
    for _ in range(limit):
        step = advance(plan, outcomes, launched + len(order))
        if step.status:
            return step, order, outcomes
        said = fails(plan.spec(step.applied).enabled)
        outcome = said if isinstance(said, str) else ("stalled-idle" if said else "ready")
        order.append(step.applied)
        outcomes.setdefault(step.applied, []).append(outcome)
    raise AssertionError("the search never ended")


def flaky(culprit: set, p: float, seed: int):
    """An oracle: a launch holding every flag set of `culprit` hangs with probability p, seeded."""
    rng = random.Random(seed)
    return lambda on: culprit <= set(on) and rng.random() < p


def _chunks(items: list, n: int) -> list[list]:
    size, extra = divmod(len(items), n)
    out, at = [], 0
    for k in range(n):
        step = size + (1 if k < extra else 0)
        out.append(items[at : at + step])
        at += step
    return [c for c in out if c]


def ddmin_launches(names: list[str], fails) -> int:
    """The launches the search made before it weighed flakiness (Zeller's ddmin, the failing
    configuration first, a single delta blamed only after the good configuration passed), for a
    deterministic `fails(applied) -> bool`: the count a deterministic hang must not exceed."""
    tried: dict[frozenset, bool] = {}

    def test(applied) -> bool:
        applied = frozenset(applied)
        if applied not in tried:
            tried[applied] = fails(applied)
        return tried[applied]

    if not test(names):
        return len(tried)
    c, n = list(names), 2
    while len(c) >= 2:
        chunks = _chunks(c, n)
        for chunk in chunks:
            if test(chunk):
                c, n = chunk, 2
                break
        else:
            for chunk in chunks if n > 2 else []:
                rest = [x for x in c if x not in chunk]
                if test(rest):
                    c, n = rest, max(n - 1, 2)
                    break
            else:
                if n >= len(c):
                    break
                n = min(len(c), 2 * n)
    if len(c) == 1:
        test([])
    return len(tried)


def sim_flaky(seed: int, p: float, name: str = "flaky"):
    """An oracle that draws as the simulated host does under --sim-hang-prob (cockpit/sim/server.py,
    `flaky_hang`): its n-th launch holding the flag set hangs when Random("SEED/flaky/n") < p."""
    n = [0]

    def fails(on) -> bool:
        if name not in on:
            return False
        n[0] += 1
        return random.Random(f"{seed}/flaky/{n[0]}").random() < p

    return fails
