"""The GPUs: a pane per GPU (utilization with its history, memory, power against its limit -- a
stuck collective shows 100 % utilization at idle power --, temperature, SM clock and the ranks on
it), or, on a smaller terminal, a line per GPU (nvitop's compact view), two to a line when the
screen is short."""

from __future__ import annotations

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


class GpuPane(Widget):
    """A pane is drawn line by line (Textual's line API): a sample repaints only the lines whose
    text changed (a watt more on the power line: one line), and a line is turned into a strip only
    when its text or the pane's width changed. On a quiet host most panes stand still from one
    second to the next, and Textual's repaint of a pane costs far more than building its text to
    compare."""

    def __init__(self, index: int, **kw):
        super().__init__(classes="gpu", **kw)  # no id: a rebuild mounts new panes while the old ones are still being removed
        self.index = index
        self.state: HostState | None = None
        self.border_title = f"GPU{index}"
        self._titles: tuple[str, str] | None = None
        self._lines: list[Text] = []  # what the pane shows, a Text per line
        self._built_for: tuple | None = None  # the size and view the lines were built for
        self._strips: dict[int, tuple[Text, int, Strip]] = {}  # line -> (its text, width, its strip)

    def show(self, state: HostState) -> None:
        self.state = state
        gpu = state.gpus.get(self.index)
        if gpu is not None:
            name = (gpu.name or "").replace("NVIDIA ", "").replace(" Blackwell Server Edition", "")
            label = getattr(gpu, "label", None) or f"GPU{self.index}"  # node:index across nodes
            titles = (f"{label} {name}", "LOST" if gpu.lost else " ".join((gpu.hw_slowdown or gpu.throttle_reasons)[:1]))
            if titles != self._titles:  # setting a title repaints the pane, changed or not
                self._titles = titles
                self.border_title = as_text(titles[0])  # the board's name and a node's name: host text
                self.border_subtitle = as_text(titles[1]) if titles[1] else None
        old = self._lines
        self._build()
        width = self.size.width
        if len(old) != len(self._lines) or not width:
            self.refresh()
            return
        changed = [y for y, (a, b) in enumerate(zip(old, self._lines)) if not _same(a, b)]
        if changed:
            self.refresh(*[Region(0, y, width, 1) for y in changed])

    def _build(self) -> None:
        self._lines = self._content().split("\n", allow_blank=True)
        self._built_for = self._view()

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
        """One line, over the pane's own colours (wider than the pane: cut)."""
        return (Strip(line.render(self.app.console)).crop(0, width).extend_cell_length(width)
                .apply_style(self.rich_style))

    def _content(self) -> Text:
        state = self.state
        gpu = state.gpus.get(self.index) if state else None
        width = max(10, self.size.width)
        if gpu is None:
            return Text("waiting for data", style="grey50")
        compact = self.has_class("compact")
        lines = [self._util(gpu, width), self._mem(gpu, width), self._power(gpu, width)]
        word = self._word(state, gpu)
        if not compact:
            hist = state.gpu_history.get(self.index, {}).get("util_pct", [])
            lines.insert(1, word or spark(hist, width, style="green"))  # the GPU's own word before its history
            lines.append(self._misc(gpu))
        elif word is not None:
            lines[2] = word
        lines.extend(self._ranks(gpu, width, 1 if compact else 2))
        return Text("\n").join(lines)

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
    def _word(state: HostState, gpu: Gpu) -> Text | None:
        """What the GPU says is wrong with itself (docs/xid.md): lost, Xids, row remap, ECC,
        the hardware holding its clocks down; None when nothing is."""
        flags = state.gpu_flags(gpu.index)
        return Text(" ".join(["!", *flags]), style="bold red") if flags else None

    def _misc(self, gpu: Gpu) -> Text:
        temp = num(gpu.temp_c, "°C")
        clock = num(gpu.sm_clock_mhz, "MHz")
        ecc = "" if not gpu.ecc_uncorrected else f"  ECC {gpu.ecc_uncorrected}"
        return Text(f"{temp:>5}  SM {clock}") + Text(ecc, style="bold red")

    def _ranks(self, gpu: Gpu, width: int, room: int) -> list[Text]:
        state = self.state
        rows = []
        for pid, mib in gpu.processes:
            proc = state.procs.get(pid) if state else None
            who = f"TP{proc.rank}" if proc and proc.rank is not None else (proc.role if proc and proc.role else "pid")
            rows.append(Text(f"{visible(who):<4} {pid:<7} {gib(mib)}", style="bold" if proc else "grey62"))
        if not rows:
            return [Text("no processes", style="grey42")]
        if len(rows) > room:
            rows = rows[: room - 1] + [Text(f"+{len(gpu.processes) - room + 1} more", style="grey62")]
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
            for n, cell in enumerate(cells[r:r + cols]):
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
        tail = Text(f" {num(gpu.util_pct, '%'):>4} ") + Text(f"{mem:>7}", style="magenta") + \
            Text(f" {power:>{pw}} {temp:>{tw}} ") + Text(who, style="bold" if ranks else "grey42")
        flags = state.gpu_flags(index)
        if flags:
            tail.append(" " + flags[0] + ("+" if len(flags) > 1 else ""), style="bold red")
        head = Text(f"GPU{index}" if width >= 44 else f"{index:<2}", style="bold")
        room = width - len(head) - len(tail) - 1
        return head + Text(" ") + bar(util, max(3, min(room, 30)), level_style(util)) + tail
