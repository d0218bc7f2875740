"""What the benchmarks share: percentiles, the process's RSS, printing/saving a result, and an older
agent packed for today's bootstrap."""

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


# today's importer starts the agent at start.py; an agent from before it had only main(argv)
OLD_START = b"from .main import main\n\n\ndef start(argv):\n    return main(argv)\n"


def pack_old_agent(sources: dict[str, bytes]) -> bytes:
    """An older agent's modules ({name: source}) as today's bootstrap runs them: in today's table,
    with today's importer (which reads that table) and, where it had none, a start.py."""
    from cockpit.agent import agent_modules, pack_agent

    sources = dict(sources)
    if b"\nPROTOCOL = 1\n" in sources.get("protocol", b""):
        # its frames carry today's version, so today's session reads them: every process row in
        # each sample, none named gone (a benchmark measures its cost, not its view)
        from cockpit.agent.protocol import PROTOCOL

        sources["protocol"] = sources["protocol"].replace(b"\nPROTOCOL = 1\n", b"\nPROTOCOL = %d\n" % PROTOCOL)
    sources["memimport"] = next(p for p in agent_modules() if p.stem == "memimport").read_bytes()
    sources.setdefault("start", OLD_START)
    return pack_agent(sources)
