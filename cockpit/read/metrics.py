"""The engine's own Prometheus metrics, scraped through the agent from the layout's metrics
endpoint: tokens/s, requests running and waiting, KV cache use for the header, and the stall that
/health hides: requests running while the generation-token counter does not move (vllm 41725,
sglang 35822).

The parser reads the Prometheus text exposition format (0.0.4) carefully and boundedly: label
values with escapes, NaN and ±Inf, optional timestamps, comments; a line it cannot read is
skipped and counted, never guessed. Text from the host is data: names and labels are bounded and
never rendered as markup."""

from __future__ import annotations

import math
import re
import time
from collections import deque
from dataclasses import dataclass, field

from cockpit import engines
from cockpit.read.findings import Finding

METRICS_SENT = 8 << 20  # the agent sends at most this much of a page (cockpit/agent/web.py)
MAX_BODY = METRICS_SENT  # characters of a page read
MAX_LINES = 200_000
MAX_SERIES = 20_000  # samples kept of one page: far more than an engine exports
MAX_LABELS = 32
MAX_LABEL_LEN = 256
HISTORY = 120
BACKOFF_S = 60.0  # a 404 (metrics not enabled) is asked again only after this long

FAMILY_NAMES = ("generation_tokens", "prompt_tokens", "running", "waiting", "kv_usage")


def families() -> dict[str, tuple[str, ...]]:
    """family -> the names the engines give it, in the engines' table order (cockpit/engines/)."""
    return {
        family: tuple(n for e in engines.ENGINES.values() for n in e.metrics.get(family, ())) for family in FAMILY_NAMES
    }


def wanted() -> list[str]:
    """Every metric name the agent is asked to send back."""
    return sorted({n for names in families().values() for n in names})


_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|\})')
_CLOSE = re.compile(r"\s*\}")
_UNESCAPE = re.compile(r'\\[\\"n]')
_ESC = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


@dataclass
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def _value(text: str) -> float | None:
    t = text.strip()
    if t in ("+Inf", "Inf"):
        return math.inf
    if t == "-Inf":
        return -math.inf
    if t == "NaN":
        return math.nan
    try:
        return float(t)
    except ValueError:
        return None


def parse(text: str, notes: list[str] | None = None) -> tuple[list[Sample], int]:
    """(samples, lines skipped) of a Prometheus text exposition, in one pass that never copies the
    rest of a line per label (a hostile page of one 8 MiB line of labels stays linear). Bounded:
    the first MAX_BODY characters, MAX_LINES lines and MAX_SERIES samples are read; what a bound
    left out is said in `notes`, never dropped in silence."""
    out: list[Sample] = []
    bad = 0
    said = notes if notes is not None else []
    if len(text) > MAX_BODY:
        text = text[: text.rfind("\n", 0, MAX_BODY) + 1]
        said.append(f"the metrics page is over {MAX_BODY >> 20} MiB: only its first {MAX_BODY >> 20} MiB were read")
    lines = text.splitlines()
    if len(lines) > MAX_LINES:
        said.append(f"the metrics page has {len(lines):,} lines: only the first {MAX_LINES:,} were read")
        del lines[MAX_LINES:]
    for line in lines:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if len(out) >= MAX_SERIES:
            said.append(
                f"the metrics page has more than {MAX_SERIES:,} series: only the first {MAX_SERIES:,} were read"
            )
            break
        m = _NAME.match(line)
        if not m:
            bad += 1
            continue
        name, pos = m.group(0), m.end()
        labels: dict[str, str] | None = {}
        if line.startswith("{", pos):
            closed = _CLOSE.match(line, pos + 1)
            pos = closed.end() if closed else pos + 1
            while not closed:
                lm = _LABEL.match(line, pos)
                if not lm:
                    labels = None
                    break
                if len(labels) < MAX_LABELS:
                    value = lm.group(2)
                    if "\\" in value:
                        value = _UNESCAPE.sub(lambda e: _ESC[e.group(0)], value)
                    labels[lm.group(1)[:MAX_LABEL_LEN]] = value[:MAX_LABEL_LEN]
                pos = lm.end()
                if lm.group(3) == "}":
                    break
                closed = _CLOSE.match(line, pos)  # a trailing comma before the brace
                if closed:
                    pos = closed.end()
            if labels is None:
                bad += 1
                continue
        rest = line[pos:]
        parts = rest.split()
        if not parts or not rest[0].isspace():
            bad += 1
            continue
        value = _value(parts[0])
        if value is None or len(parts) > 2:
            bad += 1
            continue
        out.append(Sample(name[:MAX_LABEL_LEN], labels, value))
    return out, bad


def family_value(samples: list[Sample], names: tuple[str, ...]) -> float | None:
    """One number for a family: the first of its names present; series of several TP ranks keep
    the lowest rank's (SGLang may export per rank), the rest (DP ranks, engines) are summed."""
    for name in names:
        series = [s for s in samples if s.name == name and not math.isnan(s.value)]
        if not series:
            continue
        ranks = [s.labels.get("tp_rank") for s in series if "tp_rank" in s.labels]
        if ranks:
            low = min(ranks, key=lambda r: (not r.isdigit(), int(r) if r.isdigit() else 0, r))
            series = [s for s in series if s.labels.get("tp_rank", low) == low]
        return sum(s.value for s in series)
    return None


@dataclass
class Scrape:
    at: float  # local monotonic time
    status: int | None
    values: dict[str, float | None] = field(default_factory=dict)
    error: str | None = None
    skipped: int = 0
    notes: list[str] = field(default_factory=list)  # what the page's bounds left out


def scrape_of(answer: dict, at: float | None = None) -> Scrape:
    """The agent's `metrics` answer as a Scrape."""
    at = time.monotonic() if at is None else at
    status = answer.get("status") if isinstance(answer.get("status"), int) else None
    if answer.get("error") or status is None:
        return Scrape(at, status, error=str(answer.get("error") or "no HTTP answer")[:200])
    if status != 200:
        hints = "; ".join(e.metrics_hint for e in engines.ENGINES.values() if e.metrics_hint)
        why = f"not found: metrics are off ({hints})" if status == 404 else f"HTTP {status}"
        return Scrape(at, status, error=why)
    notes = (
        [f"the metrics page was over {METRICS_SENT >> 20} MiB: the agent sent its first {METRICS_SENT >> 20} MiB"]
        if answer.get("truncated")
        else []
    )
    samples, bad = parse(str(answer.get("body") or ""), notes)
    return Scrape(
        at, status, {k: family_value(samples, names) for k, names in families().items()}, skipped=bad, notes=notes
    )


class MetricsView:
    """The scrapes of one host's metrics endpoint, and what they add up to."""

    def __init__(self, history: int = HISTORY):
        self.scrapes: deque[Scrape] = deque(maxlen=history)
        self.endpoint: str | None = None  # "port/path"
        self.health: dict | None = None  # the last /health probe's answer (status, ms)
        self.frozen_since: float | None = None  # tokens unchanged while requests run, since then
        self.retry_at = 0.0

    def add(self, scrape: Scrape) -> None:
        last = self.last_good()
        self.scrapes.append(scrape)
        if scrape.status == 404:
            self.retry_at = scrape.at + BACKOFF_S
        gen, running = scrape.values.get("generation_tokens"), scrape.values.get("running")
        if scrape.error or gen is None:
            return
        before = last.values.get("generation_tokens") if last else None
        if running and running > 0 and before is not None and gen == before:
            if self.frozen_since is None:
                self.frozen_since = last.at
        else:
            self.frozen_since = None

    def due(self, now: float) -> bool:
        return now >= self.retry_at

    def last_good(self) -> Scrape | None:
        return next((s for s in reversed(self.scrapes) if not s.error), None)

    def tokens_per_s(self) -> float | None:
        good = [s for s in self.scrapes if not s.error][-2:]
        if len(good) < 2:
            return None
        a, b = good
        ga, gb = a.values.get("generation_tokens"), b.values.get("generation_tokens")
        if ga is None or gb is None or gb < ga or b.at <= a.at:
            return None
        return (gb - ga) / (b.at - a.at)

    def frozen_for(self, now: float) -> float:
        return 0.0 if self.frozen_since is None else max(0.0, now - self.frozen_since)

    def header(self) -> dict:
        """The figures the header shows: tokens/s, running, waiting, KV cache use (0..1)."""
        s = self.last_good()
        if s is None:
            last = self.scrapes[-1] if self.scrapes else None
            return {"error": last.error if last else None}
        kv = s.values.get("kv_usage")
        return {
            "tokens_per_s": self.tokens_per_s(),
            "running": s.values.get("running"),
            "waiting": s.values.get("waiting"),
            "kv_usage": kv,
            "generation_tokens": s.values.get("generation_tokens"),
        }

    def doc(self, now: float | None = None) -> dict | None:
        if not self.scrapes:
            return None
        now = time.monotonic() if now is None else now
        last = self.scrapes[-1]
        return {
            "endpoint": self.endpoint,
            **self.header(),
            "error": last.error,
            "notes": list(last.notes),
            "frozen_s": round(self.frozen_for(now), 1) if self.frozen_since is not None else None,
            "health": self.health.get("status") if self.health else None,
        }


def describe(view: MetricsView) -> str:
    """The header's figures in one short line, or '' without metrics."""
    h = view.header()
    if "error" in h and len(h) == 1:
        return ""
    parts = []
    if h.get("tokens_per_s") is not None:
        parts.append(f"{h['tokens_per_s']:.0f} tok/s")
    if h.get("running") is not None:
        parts.append(f"run {h['running']:.0f}")
    if h.get("waiting") is not None:
        parts.append(f"wait {h['waiting']:.0f}")
    if h.get("kv_usage") is not None:
        parts.append(f"KV {100 * h['kv_usage']:.0f}%")
    return " ".join(parts)


def findings(view: MetricsView, now: float, stall_s: float, back_s: float = 0.0) -> list[Finding]:
    """Tokens frozen while requests run, for at least `stall_s`: a stall the engine itself shows.
    `back_s`: how long the run's own history (its log) shows no work; tokens seen frozen now
    have been frozen that long, so a first look need not wait out the window again."""
    if view.frozen_since is None:
        return []
    held = max(view.frozen_for(now), back_s)
    if held < stall_s:
        return []
    s = view.last_good()
    running = s.values.get("running") if s else None
    gen = s.values.get("generation_tokens") if s else None
    lines = [
        f"{running:.0f} request{'s' if running != 1 else ''} running, generation tokens frozen at "
        f"{gen:,.0f} for {held:.0f} s"
    ]
    health = view.health or {}
    if health.get("status") == 200:
        lines.append(
            "the port still answers /health (200) while its tokens are frozen: health alone does not prove progress"
        )
    return [Finding("metrics", lines, stalled=True, since_s=held, frozen=True)]
