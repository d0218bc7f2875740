"""Small text renderers shared by the panes: bars, sparklines and units. A value a GPU does not
report is shown as n/a, never as 0."""

from __future__ import annotations

from rich.text import Text

from cockpit.common.hosttext import visible

NA = "n/a"
SPARKS = "▁▂▃▄▅▆▇█"


def bar(frac: float | None, width: int, style: str) -> Text:
    width = max(1, width)
    if frac is None:
        return Text("·" * width, style="grey35")
    frac = min(1.0, max(0.0, frac))
    full = round(frac * width)
    return Text("█" * full, style=style) + Text("░" * (width - full), style="grey30")


def spark(values, width: int, top: float = 100.0, style: str = "green") -> Text:
    vals = [v for v in list(values)[-width:]]
    out = Text()
    for v in vals:
        if v is None:
            out.append(" ")
        else:
            out.append(SPARKS[min(len(SPARKS) - 1, int(max(0.0, v) / top * (len(SPARKS) - 1) + 0.5))], style=style)
    return Text(" " * (width - len(vals))) + out


def gib(mib: float | None, digits: int = 1) -> str:
    return NA if mib is None else f"{mib / 1024:.{digits}f}G"


def mib(value: float | None) -> str:
    """Process memory: MiB below a GiB, GiB above."""
    if value is None:
        return NA
    return f"{value:.0f}M" if value < 1024 else f"{value / 1024:.1f}G"


def num(value, unit: str = "", fmt: str = "{:.0f}") -> str:
    return NA if value is None else fmt.format(value) + unit


def level_style(frac: float | None) -> str:
    if frac is None:
        return "grey50"
    if frac >= 0.9:
        return "red"
    if frac >= 0.6:
        return "yellow"
    return "green"


def say(widget, message: str, **kw) -> None:
    """A notification that may carry host text (a verdict's evidence, a note, an error): shown as
    it is, control characters visible, never parsed as markup."""
    widget.notify(visible(message), markup=False, **kw)
