"""The cockpit's header, always on screen: verdict, phase and host first (each line cut at the
width, never wrapped), then the first evidence or what to do, then what lasts (an action under way
or its outcome, a link's trouble, an error). Host text in it is shown through the one rule
(cockpit.hosttext)."""

from __future__ import annotations

import time

from rich.text import Text
from textual.screen import ModalScreen, Screen

from cockpit.common.hosttext import as_text
from cockpit.judge.verdict import REQUESTS_FROZEN, VerdictName
from cockpit.read.metrics import describe as describe_metrics
from cockpit.ui.screens import ReportScreen

VERDICT_STYLE = {
    "ok": "green",
    "crashed": "bold red",
    "stalled-idle": "bold red",
    "stalled-spinning": "bold red",
    "slow": "yellow",
    "stopping": "yellow",
    "stopped": "yellow",
}
FULL = (120, 35)  # below this (columns or rows) the GPUs are a line each, as nvitop's compact view


def hint(screen: Screen) -> str | None:
    """What to do when there is nothing to show."""
    if screen.error:
        return ("e: the whole reason · " if shows(screen, "evidence") else "") + "q quits (exit status 2)"
    if screen.monitor.live and not screen.state.seq:
        return None
    if any(p.alive for p in screen.state.procs.values()):
        return None
    if not screen.monitor.live:
        return "no run in this snapshot"
    if (
        screen.profile is not None
        and screen.profile.command
        and screen.check_action("relaunch", ())
        and shows(screen, "relaunch")
    ):
        earlier = ", L for earlier runs" if shows(screen, "ledger") else ""
        return f"no run: press r to launch {screen.profile.name}'s command (flag sets as toggles){earlier}"
    if screen.profile is not None:
        return f"no run: `cockpit launch {screen.state.target} --layout {screen.profile.name}` starts one"
    return "no run found: give --layout FILE to watch and launch a server (docs/layouts.md)"


def shows(screen: Screen, action: str) -> bool:
    """Whether the footer shows this action's key: a hint names only keys on screen."""
    footer = getattr(screen, "footer", None)
    return footer is None or footer.shows(action)


def header_text(screen: Screen) -> Text:
    """The header's lines, each cut at the width (never wrapped)."""
    s = screen.state
    a = s.agent
    sep = Text("  │  " if screen.size.width >= FULL[0] else " │ ", style="grey50")
    v = screen.verdict
    said = str(v) + (f": {v.detail}" if v.detail == REQUESTS_FROZEN else "")  # a launch's stop shows in its phase
    verdict = (
        Text("unknown: no connection", style="bold red")
        if screen.error
        else as_text(said, VERDICT_STYLE.get(v.name, "default"))
    )
    head = [
        Text("verdict ") + verdict,
        Text("phase ") + as_text(str(screen.phase), "bold cyan"),
        as_text(s.target, "bold") + (as_text(f" ({a.hostname})") if a.hostname not in ("?", s.target) else Text()),
    ]
    link = s.link_state
    style = "green" if link == "up" else "bold red" if link.startswith(("lost", "down", "failed")) else "yellow"
    rtt = f" {s.rtt_ms:.0f}ms" if s.rtt_ms is not None and link == "up" else ""
    head.append(Text("link ") + as_text(link, style) + Text(rtt))
    age = s.age_s()
    if age is not None:
        stale = age > 2.5 * max(1.0, a.interval)
        head.append(Text("age ") + Text(f"{age:.1f}s", style="bold red" if stale else ""))
    elif s.sample_ts:
        head.append(Text("taken " + time.strftime("%H:%M:%S", time.gmtime(s.sample_ts)) + " UTC"))
    head.append(as_text(f"gpu data: {a.nvml or 'none'}"))
    if a.driver:
        head.append(as_text(f"driver {a.driver}"))
    figures = describe_metrics(s.metrics)  # the engine's own: tokens/s, requests, KV cache
    if figures:
        head.append(as_text(figures))
    room = max(20, screen.size.width - 2)
    fields = head[:2]  # the verdict and the phase always; then whole fields, as many as fit
    for field in head[2:]:
        if len(sep.join(fields + [field]).plain) > room:
            break
        fields.append(field)
    lines = [sep.join(fields)]
    if screen.verdict.evidence and screen.verdict.name != VerdictName.OK:
        red = "red" if screen.verdict.alerting else "yellow"
        evidence = screen.verdict.evidence
        # a large screen has room for a second line of evidence; a small one shows the first. What
        # does not fit is a key away: `e` shows every line, and the header says so
        split = 2 if not screen.has_class("compact") and len(evidence) > 2 else len(evidence)
        shown = ["  ·  ".join(evidence[:split])] + (["  ·  ".join(evidence[split:])] if evidence[split:] else [])
        room = max(10, screen.size.width - 4)
        if any(len(line) > room for line in shown) and shows(screen, "evidence"):
            more = f"  e: all {len(evidence)}"
            first = shown[0] if len(shown[0]) <= room - len(more) else shown[0][: room - len(more) - 1] + "…"
            lines.append(Text("▸ ", style=red) + as_text(first, red) + Text(more, style="bold"))
        else:
            lines.append(Text("▸ ", style=red) + as_text(shown[0], red))
        if shown[1:]:
            lines.append(Text("  ") + as_text(shown[1], red))
    elif hint(screen):
        lines.append(as_text("▸ " + hint(screen), "yellow"))
    last = lasting(screen)
    if last is not None:
        room = max(10, screen.size.width - 2)
        if last is screen.actions.outcome and len(last.plain) > room and shows(screen, "report"):
            more = "  v: all"
            last = last[: room - len(more) - 1] + Text("…") + Text(more, style="bold")
        lines.append(last)
    for line in lines:
        line.no_wrap = True
        line.overflow = "ellipsis"
    text = Text("\n").join(lines)
    text.no_wrap = True
    text.overflow = "ellipsis"
    return text


def doing(screen: Screen) -> str:
    """Where the action under way stands: its dialog waiting on the operator, else its progress."""
    try:
        top = screen.app.screen
    except Exception:  # not mounted (a test renders the header alone)
        top = screen
    if isinstance(top, ReportScreen):
        return "showing its report (esc closes it)"
    if isinstance(top, ModalScreen):
        return "waiting for your answer"
    return screen.actions.progress or "under way"


def lasting(screen: Screen) -> Text | None:
    """The one line of what lasts: the action under way, else a broken link's reason, an
    error, the last action's outcome, or the host's first warning."""
    s = screen.state
    if screen.busy:
        return as_text(f"{screen.busy}: {doing(screen)}", "bold yellow")
    if screen.link_error and s.link_state.startswith(("lost", "down")):
        return as_text(f"why: {screen.link_error}", "bold red")
    if screen.error:
        return as_text(f"cannot connect: {screen.error}", "bold red")
    if screen.actions.outcome is not None:
        return screen.actions.outcome
    if s.agent.warnings:
        return as_text(s.agent.warnings[0], "yellow")
    return None
