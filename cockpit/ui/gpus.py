"""The GPUs: a pane per GPU (utilization with its history, memory, power against its limit -- a
stuck collective shows 100 % utilization at idle power --, temperature, SM clock and the ranks on
it), or, on a smaller terminal, a line per GPU (nvitop's compact view), two to a line when the
screen is short."""

from __future__ import annotations

from collections.abc import Callable

from rich.console import Console
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.geometry import Region
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import Static

from cockpit.common.hosttext import as_text, visible
from cockpit.host.state import Gpu, HostState
from cockpit.ui.fmt import bar, gib, level_style, num, spark


def _same(a: Text | None, b: Text) -> bool:
    return a is not None and a.plain == b.plain and a.style == b.style and a.spans == b.spans


_RUNS: dict[tuple, list[tuple[int, int, Style | None]]] = {}  # a line's shape -> its style runs


def _segments(line: Text, console: Console) -> list[Segment]:
    """Rich's `Text.render`, its style runs remembered by the line's shape (length, style, spans):
    a new figure on a power line ("64/600W" for "63/600W") has the shape of the last one, and the
    runs are sliced from its text instead of working out the spans' styles again (most of a changed
    line's cost on a quiet host)."""
    key = (len(line.plain), line.style, tuple(line.spans))
    runs = _RUNS.get(key)
    if runs is None:
        runs, at = [], 0
        for seg in line.render(console):
            runs.append((at, at + len(seg.text), seg.style))
            at += len(seg.text)
        if len(_RUNS) >= 4096:
            _RUNS.clear()
        _RUNS[key] = runs
    plain = line.plain
    return [Segment(plain[a:b], style) for a, b, style in runs]


class GpuPane(Widget):
    """A pane is drawn line by line (Textual's line API): a sample repaints only the lines whose
    text changed (a watt more on the power line: one line), and a line is turned into a strip only
    when its text or the pane's width changed. Each line is rebuilt only when the values it prints
    changed (its key): on an idle board a sample moves the power and temperature lines, and the
    other lines are neither built nor compared."""

    def __init__(self, index: int, **kw):
        super().__init__(
            classes="gpu", **kw
        )  # no id: a rebuild mounts new panes while the old ones are still being removed
        self.index = index
        self.state: HostState | None = None
        self.border_title = f"GPU{index}"
        self._titles: tuple[str, str] | None = None
        self._lines: list[Text] = []  # what the pane shows, a Text per line
        self._keys: list[tuple] = []  # what each line was built from
        self._built_for: tuple | None = None  # the size and view the lines were built for
        self._strips: dict[int, tuple[Text, int, Strip]] = {}  # line -> (its text, width, its strip)

    def show(self, state: HostState) -> None:
        self.state = state
        gpu = state.gpus.get(self.index)
        if gpu is not None:
            name = (gpu.name or "").replace("NVIDIA ", "").replace(" Blackwell Server Edition", "")
            label = getattr(gpu, "label", None) or f"GPU{self.index}"  # node:index across nodes
            titles = (
                f"{label} {name}",
                "LOST" if gpu.lost else " ".join((gpu.hw_slowdown or gpu.throttle_reasons)[:1]),
            )
            if titles != self._titles:  # setting a title repaints the pane, changed or not
                self._titles = titles
                self.border_title = as_text(titles[0])  # the board's name and a node's name: host text
                self.border_subtitle = as_text(titles[1]) if titles[1] else None
        old = self._lines
        changed = self._build()
        width = self.size.width
        if len(old) != len(self._lines) or not width:
            self.refresh()
            return
        changed = [y for y in changed if not _same(old[y], self._lines[y])]
        if changed:
            self.refresh(*[Region(0, y, width, 1) for y in changed])

    def _build(self) -> list[int]:
        """Rebuild the lines whose key changed; returns their numbers."""
        specs = self._specs()
        keys, lines, changed = [], [], []
        old_keys, old_lines = self._keys, self._lines
        for y, (key, make) in enumerate(specs):
            if y < len(old_keys) and old_keys[y] == key:
                lines.append(old_lines[y])
            else:
                lines.append(make())
                changed.append(y)
            keys.append(key)
        self._keys, self._lines = keys, lines
        self._built_for = self._view()
        return changed

    def _view(self) -> tuple:
        """What the lines depend on besides the data: the bars are as wide as the pane, and a
        compact pane shows fewer lines."""
        return self.size, self.has_class("compact")

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        if self._view() != self._built_for:
            self._build()
        if y >= len(self._lines):
            return Strip.blank(width, self.visual_style.rich_style)
        line = self._lines[y]
        cached = self._strips.get(y)
        if cached is not None and cached[1] == width and _same(cached[0], line):
            return cached[2]
        strip = self._strip(line, width)
        self._strips[y] = (line, width, strip)
        return strip

    def _strip(self, line: Text, width: int) -> Strip:
        """One line, over its own style (Text.render leaves a Text's base style to its caller: "no
        processes" is grey, a rank bold) and the pane's colours; wider than the pane: cut."""
        console = self.app.console
        strip = Strip(_segments(line, console))
        if line.style:
            strip = strip.apply_style(console.get_style(line.style))
        return strip.crop(0, width).extend_cell_length(width).apply_style(self.visual_style.rich_style)

    def _specs(self) -> list[tuple[tuple, Callable[[], Text]]]:
        """Each line as (the values it prints, how to build it): a line whose values did not
        change is not built again."""
        state = self.state
        gpu = state.gpus.get(self.index) if state else None
        width = max(10, self.size.width)
        if gpu is None:
            return [(("waiting",), lambda: Text("waiting for data", style="grey50"))]
        compact = self.has_class("compact")
        flags = state.gpu_flags(gpu.index)
        specs = [
            (("util", gpu.util_pct, width), lambda: self._util(gpu, width)),
            (("mem", gpu.mem_used_mib, gpu.mem_total_mib, width), lambda: self._mem(gpu, width)),
            (("pwr", gpu.power_w, gpu.power_limit_w, width), lambda: self._power(gpu, width)),
        ]
        if not compact:
            if flags:
                specs.insert(1, (("word", *flags), lambda: self._word(flags)))  # the GPU's own word before its history
            else:
                hist = state.gpu_history.get(self.index, {}).get("util_pct", [])
                recent = tuple(list(hist)[-width:])
                specs.insert(1, (("spark", recent, width), lambda: spark(recent, width, style="green")))
            specs.append((("misc", gpu.temp_c, gpu.sm_clock_mhz, gpu.ecc_uncorrected), lambda: self._misc(gpu)))
        elif flags:
            specs[2] = (("word", *flags), lambda: self._word(flags))
        room = 1 if compact else 2
        procs = tuple((pid, mib, self._who(state, pid)) for pid, mib in gpu.processes)
        shown = min(len(procs), room) or 1
        specs.extend((("ranks", procs, room, y), lambda y=y: self._ranks(procs, room)[y]) for y in range(shown))
        return specs

    def _util(self, gpu: Gpu, width: int) -> Text:
        frac = None if gpu.util_pct is None else gpu.util_pct / 100
        label = f"{num(gpu.util_pct, '%'):>5}"
        return Text("util ") + bar(frac, width - 11, level_style(frac)) + Text(f" {label}")

    @staticmethod
    def _meter(label: str, used, total, text: str, style: str, width: int) -> Text:
        """A bar of used against total, n/a when either is not reported."""
        frac = used / total if used is not None and total else None
        return Text(f"{label:<5}") + bar(frac, width - 6 - len(text), style) + Text(" " + text)

    def _mem(self, gpu: Gpu, width: int) -> Text:
        text = f"{gib(gpu.mem_used_mib, 0)}/{gib(gpu.mem_total_mib, 0)}"
        return self._meter("mem", gpu.mem_used_mib, gpu.mem_total_mib, text, "magenta", width)

    def _power(self, gpu: Gpu, width: int) -> Text:
        text = f"{num(gpu.power_w)}/{num(gpu.power_limit_w, 'W')}"
        return self._meter("pwr", gpu.power_w, gpu.power_limit_w, text, "cyan", width)

    @staticmethod
    def _word(flags: list[str]) -> Text:
        """What the GPU says is wrong with itself (docs/xid.md): lost, Xids, row remap, ECC,
        the hardware holding its clocks down."""
        return Text(" ".join(["!", *flags]), style="bold red")

    def _misc(self, gpu: Gpu) -> Text:
        temp = num(gpu.temp_c, "°C")
        clock = num(gpu.sm_clock_mhz, "MHz")
        ecc = "" if not gpu.ecc_uncorrected else f"  ECC {gpu.ecc_uncorrected}"
        return Text(f"{temp:>5}  SM {clock}") + Text(ecc, style="bold red")

    @staticmethod
    def _who(state: HostState, pid: int) -> tuple[str, bool]:
        """How a process on the GPU is named (its rank, else its role), and whether it is known."""
        proc = state.procs.get(pid)
        who = f"TP{proc.rank}" if proc and proc.rank is not None else (proc.role if proc and proc.role else "pid")
        return who, proc is not None

    @staticmethod
    def _ranks(procs: tuple, room: int) -> list[Text]:
        rows = [
            Text(f"{visible(who):<4} {pid:<7} {gib(mib)}", style="bold" if known else "grey62")
            for pid, mib, (who, known) in procs
        ]
        if not rows:
            return [Text("no processes", style="grey42")]
        if len(rows) > room:
            rows = rows[: room - 1] + [Text(f"+{len(procs) - room + 1} more", style="grey62")]
        return rows


class GpuList(Static):
    """One line per GPU: utilization (bar and %), memory, power, temperature, the ranks on it.
    `columns` GPUs share a line (2 when the screen is short)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.state: HostState | None = None
        self.columns = 1
        self.border_title = "GPUs"
        self._shown: Text | None = None

    def show(self, state: HostState) -> None:
        """Re-rendered only when its text changed; never a layout (its height is set from the
        count of GPUs, by the screen), and nothing at all while it is not displayed."""
        self.state = state
        if self.display and not _same(self._shown, self._content()):
            self.refresh()

    def lines_needed(self, n: int) -> int:
        return max(1, (n + self.columns - 1) // self.columns)

    def render(self) -> Text:
        self._shown = self._content()
        return self._shown

    def _content(self) -> Text:
        state = self.state
        if state is None or not state.gpus:
            return Text("waiting for data", style="grey50")
        cols = self.columns
        gap = 2
        width = max(30, (self.size.width - gap * (cols - 1)) // cols)
        cells = [self.line(state, i, width) for i in sorted(state.gpus)]
        rows = []
        for r in range(0, len(cells), cols):
            row = Text()
            for n, cell in enumerate(cells[r : r + cols]):
                if n:
                    row.append(" " * gap)
                cell.truncate(width, pad=True)
                row.append_text(cell)
            rows.append(row)
        return Text("\n").join(rows)

    @staticmethod
    def line(state: HostState, index: int, width: int) -> Text:
        gpu = state.gpus[index]
        util = None if gpu.util_pct is None else gpu.util_pct / 100
        mem = f"{gib(gpu.mem_used_mib, 0)}/{gib(gpu.mem_total_mib, 0)}"
        wide = width >= 56
        power = f"{num(gpu.power_w)}/{num(gpu.power_limit_w, 'W')}" if wide else num(gpu.power_w, "W")
        temp = num(gpu.temp_c, "°C" if wide else "°")
        ranks = []
        for pid, _ in gpu.processes:
            proc = state.procs.get(pid)
            ranks.append(f"TP{proc.rank}" if proc and proc.rank is not None else "pid")
        who = ",".join(ranks[:2]) + (f"+{len(ranks) - 2}" if len(ranks) > 2 else "") if ranks else "-"
        pw, tw = (9, 5) if wide else (5, 4)
        tail = (
            Text(f" {num(gpu.util_pct, '%'):>4} ")
            + Text(f"{mem:>7}", style="magenta")
            + Text(f" {power:>{pw}} {temp:>{tw}} ")
            + Text(who, style="bold" if ranks else "grey42")
        )
        flags = state.gpu_flags(index)
        if flags:
            tail.append(" " + flags[0] + ("+" if len(flags) > 1 else ""), style="bold red")
        head = Text(f"GPU{index}" if width >= 44 else f"{index:<2}", style="bold")
        room = width - len(head) - len(tail) - 1
        return head + Text(" ") + bar(util, max(3, min(room, 30)), level_style(util)) + tail
