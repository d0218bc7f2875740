"""The hang bundle: one .tar.gz in the run's folder of the ledger with everything a hang report
needs, gathered in one go through the agent: grouped stacks, NCCL RAS status, flight-recorder
dumps (when armed), `nvidia-smi -q`, the kernel log's Xid lines, the log tail, two metrics scrapes
a few seconds apart, versions, the verdict with its evidence, and a manifest that lists every
member and names what could not be collected, with why.

Assembled on the cockpit side from agent commands that run concurrently (each answered from a
thread on the host); written whole or not at all, readable by the owner only."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import re
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cockpit import __version__
from cockpit.common.errors import CockpitError
from cockpit.common.hosttext import count
from cockpit.common.secrets import mask_line
from cockpit.host.snapshot import gpu_health_doc
from cockpit.monitor.base import Monitor
from cockpit.operate.snapshot import monitor_doc
from cockpit.read import flightrec, metrics, ras
from cockpit.runs.ledger import state_home

LOG_TAIL_LINES = 2000
# what a member of the archive may be called: a fixed word, maybe in one fixed folder, with numbers
_MEMBER = re.compile(r"(?:[a-z-]+/)?[A-Za-z0-9_-]+(?:\.[a-z0-9]+)*")
METRICS_GAP_S = 3.0


@dataclass
class Bundle:
    path: Path
    contents: list[str]
    missing: list[dict[str, Any]]
    run: str
    manifest: dict[str, Any] = field(default_factory=dict)

    def doc(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "run": self.run,
            "contents": self.contents,
            "missing": self.missing,
            "bytes": self.path.stat().st_size,
        }


def bundle_dir(run: str) -> Path:
    path = state_home() / "runs" / re.sub(r"[^A-Za-z0-9._-]", "_", run)
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)
    return path


class _Members:
    def __init__(self) -> None:
        self.files: dict[str, tuple[bytes, str]] = {}
        self.missing: list[dict[str, Any]] = []

    def add(self, name: str, data: bytes | str, what: str) -> None:
        """A member; every text one (all but the flight recorder's pickles) masked line by line,
        as the screen shows host text: a py-spy header's command line, a log tail, a snapshot."""
        if not name.endswith(".pickle"):
            text = data.decode("utf-8", "surrogateescape") if isinstance(data, bytes) else data
            data = "\n".join(mask_line(line) for line in text.split("\n"))
        self.files[name] = (data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data, what)

    def add_json(self, name: str, doc: Any, what: str) -> None:
        self.add(name, json.dumps(doc, indent=2, default=str) + "\n", what)

    def miss(self, item: str, why: str | BaseException | None) -> None:
        why = str(why)
        self.missing.append({"item": item, "why": why if len(why) <= 500 else why[:499] + "\u2026"})


async def _stacks(monitor: Monitor, m: _Members, run: str, read_only: bool) -> None:
    if read_only:
        return m.miss("stacks", "--read-only: attaching py-spy to the ranks is an action")
    try:
        plan = await monitor.plan_dump(verb="bundle", live_only=True)
    except CockpitError as exc:
        return m.miss("stacks", exc)
    if not plan.ranks:
        return m.miss("stacks", "no live process of the run to dump")
    try:
        result = await monitor.dump_stacks(plan, run)
    except CockpitError as exc:
        return m.miss("stacks", exc)
    for f in sorted(result.folder.iterdir()):
        if f.is_file():
            m.add(f"stacks/{f.name}", f.read_bytes(), "grouped stacks" if f.name == "groups.txt" else "py-spy dump")
    for rank, errors in result.failed.items():
        m.miss(f"stacks/rank {rank}", "; ".join(errors))


async def _ras(monitor: Monitor, m: _Members) -> dict[str, Any] | None:
    state = monitor.state
    port = state.ras.port or ras.RAS_PORT
    live = {p.pid for p in state.live_procs()}
    if not any(pt.port == port and pt.listening and pt.pid in live for pt in state.ports):
        m.miss(
            "ras",
            f"no process of the run listens on NCCL's RAS port ({port}): not an NCCL job, NCCL older "
            f"than 2.24, or NCCL_RAS_ENABLE=0",
        )
        return None
    try:
        answer: dict[str, Any] = await monitor.ras()
    except CockpitError as exc:
        m.miss("ras", exc)
        return None
    if answer.get("error") and not answer.get("text"):
        m.miss("ras", answer["error"])
        return None
    ext = "json" if answer.get("format") == "json" else "txt"
    m.add(f"ras-status.{ext}", answer.get("text") or "", f"NCCL RAS VERBOSE STATUS ({answer.get('format')})")
    report = ras.parse(answer)
    m.add_json(
        "ras-parsed.json",
        {**report.doc(), "skews": [s.__dict__ for s in ras.skews(report)]},
        "the RAS answer as the cockpit reads it",
    )
    return answer


def _rank_number(key: Any) -> int:
    """A rank from the host's answer as a member name may use it: a plain non-negative integer
    (`../../x` or `1e9` from a hostile host is refused), so names are built only from numbers
    and fixed words."""
    text = str(key)
    if not re.fullmatch(r"[0-9]{1,6}", text):
        raise ValueError(f"the host named a rank {text[:40]!r}: not a rank number, its dump is left out")
    return int(text)


async def _flight(monitor: Monitor, m: _Members, read_only: bool) -> dict[str, Any] | None:
    try:
        pids, _left = await monitor.flight_ranks(verb="bundle")
    except CockpitError as exc:
        m.miss("flight recorder", exc)
        return None
    if not pids:
        m.miss("flight recorder", "no live process of the run")
        return None
    try:
        answer = await monitor.flight_dump_raw(pids, trigger=not read_only)
    except CockpitError as exc:
        m.miss("flight recorder", exc)
        return None
    if not answer.get("armed"):
        m.miss(
            "flight recorder",
            "; ".join(flightrec.by_reason(answer.get("problems") or ["not armed"]))
            + ": switch the forensics flag set on and relaunch",
        )
        return None
    by_rank = {}
    for rank, d in sorted((answer.get("ranks") or {}).items()):
        raw = d.pop("raw_b64", None)
        try:
            rank = _rank_number(rank)
        except ValueError as exc:
            m.miss("flight recorder", exc)
            continue
        if raw:
            m.add(f"flight-recorder/rank{rank}.pickle", base64.b64decode(raw), "torch flight-recorder dump (pickle)")
        if d.get("error"):
            m.miss(f"flight recorder rank {rank}", d["error"])
        else:
            by_rank[int(rank)] = d
    for why in answer.get("problems") or []:
        m.miss("flight recorder", why)
    result = flightrec.compare(by_rank)
    monitor.state.flight = result
    m.add_json("flight-recorder/comparison.json", result, "last enqueued/started/completed collective per rank")
    return result


def _smi_and_xid(facts: dict[str, Any], m: _Members) -> None:
    smi = facts.get("nvidia_smi") or {}
    if "text" in smi:
        m.add("nvidia-smi-q.txt", smi["text"], "nvidia-smi -q")
    else:
        m.miss("nvidia-smi -q", smi.get("error") or "no answer")
    xid = facts.get("xid") or {}
    if "text" in xid:
        head = (
            f"# Xid lines of the kernel log ({xid.get('source')}: {xid.get('lines_read')} lines read, "
            f"{xid.get('count')} Xid lines)\n"
        )
        m.add("xid.txt", head + xid["text"] + ("\n" if xid["text"] else ""), "NVRM Xid lines of the kernel log")
    else:
        m.miss("xid", xid.get("error") or "no answer")


async def _facts(monitor: Monitor, m: _Members, read_only: bool = False) -> None:
    """The host's facts; the versions only of the run as the kill finds it (another user's
    process that matches the layout's titles is never read from). Under --read-only nothing runs
    on the host but the agent: no nvidia-smi, dmesg or journalctl (the versions are read from
    files)."""
    try:
        pids = [pid for _, pid in (await monitor.plan_dump(verb="bundle", live_only=True)).ranks]
    except CockpitError as exc:
        pids = []
        m.miss("versions of the run's packages", exc)
    items = ["versions"] if read_only else ["nvidia_smi", "xid", "versions"]
    try:
        facts = await monitor.host_facts(items, pids[:4], timeout=150)
    except CockpitError as exc:
        for item in ("nvidia-smi -q", "xid", "versions"):
            m.miss(item, exc)
        return
    if read_only:
        for item in ("nvidia-smi -q", "xid"):
            m.miss(
                item, "--read-only: nothing runs on the host but the agent (nvidia-smi, dmesg, journalctl are programs)"
            )
    else:
        _smi_and_xid(facts, m)
    versions = (facts.get("versions") or {}).get("data") or {}
    ras_v = monitor.state.ras.latest
    if ras_v is not None and ras_v.nccl_version:
        versions["nccl_ras"] = ras_v.nccl_version
    m.add_json("versions.json", versions, "driver, CUDA, NCCL, torch and engine versions")
    if versions.get("run_error") and pids:
        m.miss("versions of the run's packages", versions["run_error"])


async def _metrics(monitor: Monitor, m: _Members) -> None:
    layout = monitor.layout
    path = layout.metrics if layout else None
    ports = layout.ports if layout else []
    if not path or not ports:
        return m.miss(
            "metrics",
            "the layout names no metrics endpoint and port"
            if layout
            else "no layout: which port serves metrics is unknown (--layout)",
        )
    scrapes = []
    for n in (1, 2):
        if n == 2:
            await asyncio.sleep(METRICS_GAP_S)
        try:
            answer = await monitor.metrics_page(ports[0], path)
        except CockpitError as exc:
            return m.miss(f"metrics scrape {n}", exc)
        if answer.get("status") != 200:
            return m.miss(f"metrics scrape {n}", metrics.scrape_of(answer).error)
        m.add(
            f"metrics-{n}.txt",
            f"# {time.strftime('%Y-%m-%dT%H:%M:%S%z')} GET :{ports[0]}{path}\n" + answer["body"],
            f"metrics scrape {n} of 2, {METRICS_GAP_S:.0f} s apart",
        )
        scrapes.append(metrics.scrape_of(answer))
    view = metrics.MetricsView()
    for s in scrapes:
        view.add(s)
    m.add_json("metrics-summary.json", view.header(), "tokens/s between the two scrapes, requests, KV cache use")


def _log_tail(monitor: Monitor, m: _Members) -> None:
    logs = monitor.state.logs
    if not logs:
        return m.miss("log tail", "no log is followed (name one in the layout: log:)")
    for n, (path, log) in enumerate(list(logs.items())[:2]):
        lines = list(log.lines)[-LOG_TAIL_LINES:]
        m.add(
            "log-tail.txt" if n == 0 else "log-tail-2.txt",
            f"# the last {count(len(lines), 'line')} of {path} (of {log.total} read)\n"
            + "\n".join(line.text for line in lines)
            + "\n",
            f"the last lines of {path}",
        )


def _write(folder: Path, members: _Members, manifest: dict[str, Any]) -> tuple[Path, list[str]]:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = folder / f"bundle-{stamp}.tar.gz"
    n = 1
    while path.exists():
        n += 1
        path = folder / f"bundle-{stamp}-{n}.tar.gz"
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    root = path.name.removesuffix(".tar.gz")
    now = time.time()
    names = []
    with os.fdopen(fd, "wb") as fh, tarfile.open(fileobj=fh, mode="w:gz") as tar:
        items = dict(members.files)
        text = json.dumps(manifest, indent=2) + "\n"
        items["manifest.json"] = ("\n".join(mask_line(line) for line in text.split("\n")).encode(), "this list")
        for name, (data, _) in sorted(items.items(), key=lambda kv: (kv[0] != "manifest.json", kv[0])):
            if not _MEMBER.fullmatch(name):
                raise CockpitError(
                    f"bundle: refused a member named {name[:60]!r} (not built from numbers and fixed words)"
                )
            info = tarfile.TarInfo(f"{root}/{name}")
            info.size, info.mtime, info.mode = len(data), now, 0o600
            tar.addfile(info, io.BytesIO(data))
            names.append(info.name)
    os.replace(tmp, path)
    return path, names


async def make_bundle(
    monitor: Monitor, read_only: bool = False, progress: Callable[[str], None] | None = None
) -> Bundle:
    """Collect everything at once (stacks, RAS, flight recorder, host facts, metrics), then the
    verdict as it stands after, and write the archive into the run's folder."""
    run = monitor.run.folder_name(monitor.target.label)
    m = _Members()
    started = time.time()
    if progress:
        progress("collecting stacks, RAS, flight recorder, host facts and metrics")
    results = await asyncio.gather(
        _stacks(monitor, m, run, read_only),
        _ras(monitor, m),
        _flight(monitor, m, read_only),
        _facts(monitor, m, read_only),
        _metrics(monitor, m),
        return_exceptions=True,
    )
    for name, res in zip(("stacks", "ras", "flight recorder", "host facts", "metrics"), results):
        if isinstance(res, BaseException):
            m.miss(name, f"{type(res).__name__}: {res}")
    _log_tail(monitor, m)
    monitor.update()
    verdict = monitor.verdict
    m.add_json(
        "verdict.json",
        {"verdict": verdict.doc(), "phase": {"name": monitor.phase.name, "detail": monitor.phase.detail}},
        "the verdict and its evidence",
    )
    m.add_json("snapshot.json", monitor_doc(monitor, log_lines=200), "the cockpit's JSON snapshot of the host")
    m.add_json(
        "gpu-health.json",
        gpu_health_doc(monitor.state),
        "the GPUs' own word: Xid events with their meaning, lost GPUs, ECC, row remap, NVLink and PCIe replays",
    )
    found = getattr(monitor, "forensics", None)
    if found is not None:
        m.add_json("forensics.json", found.doc(), "the stall's own forensics, gathered when it was declared")
    manifest = {
        "schema": "gpu-cockpit.bundle/1",
        "host": monitor.target.label,
        "hostname": monitor.state.agent.hostname,
        "run": run,
        "layout": monitor.layout.name if monitor.layout else None,
        "cockpit": __version__,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "seconds": round(time.time() - started, 1),
        "verdict": verdict.doc(),
        "members": [{"name": name, "bytes": len(data), "what": what} for name, (data, what) in sorted(m.files.items())],
        "not_collected": m.missing,
    }
    path, names = _write(bundle_dir(run), m, manifest)
    return Bundle(path, names, m.missing, run, manifest)


def describe(b: Bundle) -> list[str]:
    lines = [f"bundle: {b.path} ({b.path.stat().st_size:,} bytes)"]
    lines += [f"  {name}" for name in b.contents]
    for miss in b.missing:
        lines.append(f"  not collected: {miss['item']}: {miss['why']}")
    return lines
