"""Evidence from sources beyond the processes and GPUs: NCCL's RAS service (cockpit/read/ras.py), the
engine's own metrics (cockpit/read/metrics.py) and torch's flight recorder (cockpit/read/flightrec.py). Each
source turns what it saw into Findings; `merge` folds them into the watchdog's verdict:

- a verdict that already alerts keeps its name and gains the findings' lines; a finding's rank
  becomes the odd rank when the watchdog named none (a disagreement is said, not hidden);
- a verdict of ok/watching/slow becomes a stall when a finding is strong enough on its own
  (a rank behind in RAS with no count moving, tokens frozen while requests run);
- a crash keeps its rank; dead ranks RAS reports are added as evidence.

Pure; the sources read only HostState."""

from __future__ import annotations

from dataclasses import replace

from cockpit.judge.verdict import REQUESTS_FROZEN, Verdict, VerdictName
from cockpit.read import flightrec, metrics, ras
from cockpit.read.findings import Finding

SPIN_GPU_PCT = 90.0


def default_sources():
    """The sources every watchdog consults: (state, now, watchdog) -> [Finding]."""

    def ras_source(state, now, dog, stalled):
        view = getattr(state, "ras", None)
        return ras.findings(view, state.sample_ts, dog.spin_s, stalled) if view is not None else []

    def metrics_source(state, now, dog, stalled):
        view = getattr(state, "metrics", None)
        back = dog.progress.idle_s if dog.progress is not None else 0.0
        return metrics.findings(view, now, min(dog.spin_s, dog.idle_s), back) if view is not None else []

    def flight_source(state, now, dog, stalled):
        fr = getattr(state, "flight", None)
        return flightrec.findings(fr) if fr else []

    return [ras_source, metrics_source, flight_source]


def merge(verdict, found: list[Finding], state):
    """The watchdog's verdict with the sources' findings folded in (see the module's doc)."""
    name = verdict.name
    if not found or name in (VerdictName.NO_RUN, VerdictName.STOPPING, VerdictName.STOPPED):
        return verdict
    lines = [f"{f.source}: {line}" for f in found for line in f.evidence]
    named = [f.odd_rank for f in found if f.odd_rank is not None]
    odd = verdict.odd_rank
    if name in (VerdictName.STALLED_IDLE, VerdictName.STALLED_SPINNING, VerdictName.CRASHED):
        if odd is None and named:
            odd = named[0]
        elif odd is not None and named and named[0] != odd and name != VerdictName.CRASHED:
            lines.append(
                f"{found[0].source if found[0].odd_rank is not None else 'a source'} names rank {named[0]}, "
                f"the watchdog rank {odd}"
            )
        detail = REQUESTS_FROZEN if any(f.frozen for f in found) and name != VerdictName.CRASHED else verdict.detail
        return replace(verdict, evidence=list(verdict.evidence) + lines, odd_rank=odd, detail=detail)
    strong = [f for f in found if f.stalled]
    if not strong:
        return verdict
    alive = [p for p in state.ranks() if p.alive and p.status != "Z"]
    busy = any((state.gpus[i].util_pct or 0) >= SPIN_GPU_PCT for p in alive for i in p.gpus if i in state.gpus)
    stall = VerdictName.STALLED_SPINNING if busy else VerdictName.STALLED_IDLE
    odd = next((f.odd_rank for f in strong if f.odd_rank is not None), named[0] if named else None)
    held = max((f.since_s for f in strong if f.since_s is not None), default=None)
    since = state.sample_ts - held if held is not None and state.sample_ts is not None else None
    detail = REQUESTS_FROZEN if any(f.frozen for f in strong) else None
    return Verdict(
        stall,
        lines + [e for e in verdict.evidence if verdict.name != VerdictName.WATCHING],
        odd,
        detail=detail,
        since=since,
    )
