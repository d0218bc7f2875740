"""What the benchmarks share: percentiles, the process's RSS, and printing/saving a result."""

from __future__ import annotations

import json
import os
from pathlib import Path


def pct(xs, q):
    return round(sorted(xs)[min(len(xs) - 1, int(q * len(xs)))], 2) if xs else None


def rss_mib() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def report(result: dict, json_path: str | None) -> None:
    """Print the result, save it where asked, and leave at once (no slow interpreter teardown
    with a Textual app and its tasks still around)."""
    print(json.dumps(result, indent=1))
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=1))
    os._exit(0)
