"""What a reading of the host says about the run: a `Finding` (its lines, the rank it names,
whether it is a stall on its own), and how ranks are written in every line the cockpit shows."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Finding:
    source: str  # "RAS", "metrics", "flight recorder"
    evidence: list[str] = field(default_factory=list)
    odd_rank: int | None = None
    stalled: bool = False  # enough on its own to call the run stalled
    dead: bool = False  # a rank the source considers dead
    since_s: float | None = None  # how long what it saw has held (a stall it calls)
    frozen: bool = False  # requests in flight with nothing done


def rank_ranges(ranks: list[int]) -> str:
    """[0, 1, 2, 4, 5, 6, 7] -> "0-2,4-7"."""
    ranks = sorted(ranks)
    out = []
    start = prev = None
    for r in ranks:
        if start is None:
            start = prev = r
        elif r == prev + 1:
            prev = r
        else:
            out.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = r
    if start is not None:
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ",".join(out)
