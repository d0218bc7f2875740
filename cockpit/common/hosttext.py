"""The one rule for text that comes from a host (process titles, log lines, shm names, py-spy
frames, owner names, anything the agent read there): it is data, shown as text.

`visible(text)` makes every control character visible instead of letting the terminal act on it,
in caret notation as `cat -v` writes it:

- C0 controls and DEL: `\\x1b` -> `^[`, `\\r` -> `^M`, `\\x07` -> `^G`, `\\x00` -> `^@`, `\\x7f` -> `^?`;
  `\\n` too (`^J`) unless `newlines=True` (multi-line text such as a stack dump keeps its lines);
- a tab becomes spaces to the next multiple of 8 columns (`tabs=None` keeps it as `^I`);
- C1 controls (U+0080..U+009F, e.g. the 8-bit CSI U+009B), Unicode line/paragraph separators and
  bidirectional overrides (a "Trojan source" line reads in another order) -> `\\u009b`, `\\u202e`;
- bytes that were not UTF-8 (decoded with surrogateescape: lone surrogates U+DC80..U+DCFF) ->
  `\\xff`, the byte itself; any other lone surrogate -> `\\udXXX`. The result always encodes to
  UTF-8, so printing it never raises.

So `\\x1b]52;c;...\\x07` (OSC 52: write the operator's clipboard) prints as `^[]52;c;...^G` and
`\\x1b[2J` as `^[[2J`: nothing reaches the terminal as a command.

Markup is never let through: `escape_markup(text)` is `visible` then Rich's markup escape, for a
string that goes inside Rich/Textual markup; `as_text(text)` is a rich.text.Text (no markup parsed
at all), which is what a widget should render. Nothing here imports Textual; Rich only when those
two are called.
"""

from __future__ import annotations

import re

_C0 = {c: "^" + chr(c + 64) for c in range(32)}
_C0[0x7F] = "^?"
_UNICODE_CONTROLS = {0x2028, 0x2029, 0x200E, 0x200F, 0x061C} | set(range(0x202A, 0x202F)) | set(range(0x2066, 0x206A))
# One pass finds every character that needs a visible form.
_NEEDS = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _show(ch: str, newlines: bool) -> str:
    c = ord(ch)
    if c == 0x0A and newlines:
        return "\n"
    if c in _C0:
        return _C0[c]
    if 0xDC80 <= c <= 0xDCFF:  # a byte that was not UTF-8, carried by surrogateescape
        return f"\\x{c - 0xDC00:02x}"
    if 0x80 <= c <= 0x9F:
        return f"\\u{c:04x}"
    return f"\\u{c:04x}"  # other lone surrogates, bidi controls, line/paragraph separators


def visible(text: str | bytes | None, newlines: bool = False, tabs: int | None = 8) -> str:
    """Host text made safe to print: every control character shown (see the module doc), no
    escape sequence left for a terminal to act on. Bytes are decoded as UTF-8 with surrogateescape
    (what is not UTF-8 shows as \\xNN)."""
    if text is None:
        return ""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", "surrogateescape")
    elif not isinstance(text, str):
        text = str(text)
    if tabs is not None and "\t" in text:
        if newlines:
            text = "\n".join(_expand(line, tabs) for line in text.split("\n"))
        else:
            text = _expand(text, tabs)
    if not _NEEDS.search(text):
        return text
    return _NEEDS.sub(lambda m: _show(m.group(), newlines), text)


def _expand(line: str, tabs: int) -> str:
    """Tabs to spaces, counting columns as they will be shown (a control's caret form is 2 wide)."""
    out: list[str] = []
    col = 0
    for part in re.split("(\t)", line):
        if part == "\t":
            pad = tabs - col % tabs
            out.append(" " * pad)
            col += pad
        else:
            out.append(part)
            col += len(visible(part, tabs=None)) if _NEEDS.search(part) else len(part)
    return "".join(out)


def escape_markup(text: str | bytes | None, newlines: bool = False) -> str:
    """`visible(text)` escaped for Rich/Textual markup: safe inside f"[red]{...}[/]"."""
    from rich.markup import escape

    return escape(visible(text, newlines=newlines))


def as_text(text: str | bytes | None, style: str = "", newlines: bool = False):
    """A rich.text.Text of `visible(text)`: rendered as it is, markup never parsed."""
    from rich.text import Text

    return Text(visible(text, newlines=newlines), style=style)


def count(n: int, noun: str, plural: str | None = None) -> str:
    """A count with its noun agreeing: `1 process`, `2 processes`, `0 entries`. The one helper
    every message that counts goes through (pass the plural when it is not noun + s)."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def these(n: int, noun: str, plural: str | None = None) -> str:
    """`this process` for one, `these 2 processes` for more (a question about what is listed)."""
    return f"this {noun}" if n == 1 else f"these {count(n, noun, plural)}"
