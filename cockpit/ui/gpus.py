"""A pane per GPU: utilization with its history, memory, power against its limit (a stuck
collective shows 100 % utilization at idle power), temperature, SM clock and the ranks on it."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from cockpit.model import Gpu, HostState
from cockpit.ui.fmt import bar, gib, level_style, num, spark


class GpuPane(Static):
    def __init__(self, index: int, **kw):
        super().__init__(id=f"gpu{index}", classes="gpu", **kw)
        self.index = index
        self.state: HostState | None = None
        self.border_title = f"GPU{index}"

    def show(self, state: HostState) -> None:
        self.state = state
        gpu = state.gpus.get(self.index)
        if gpu is not None:
            name = (gpu.name or "").replace("NVIDIA ", "").replace(" Blackwell Server Edition", "")
            self.border_title = f"{getattr(gpu, 'label', None) or f'GPU{self.index}'} {name}"  # node:index across nodes
            self.border_subtitle = " ".join(gpu.throttle_reasons[:1]) or None
        self.refresh()

    def render(self) -> Text:
        state = self.state
        gpu = state.gpus.get(self.index) if state else None
        width = max(10, self.size.width)
        if gpu is None:
            return Text("waiting for data", style="grey50")
        compact = self.has_class("compact")
        lines = [self._util(gpu, width), self._mem(gpu, width), self._power(gpu, width)]
        if not compact:
            hist = state.gpu_history.get(self.index, {}).get("util_pct", [])
            lines.insert(1, spark(hist, width, style="green"))
            lines.append(self._misc(gpu))
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
            rows.append(Text(f"{who:<4} {pid:<7} {gib(mib)}", style="bold" if proc else "grey62"))
        if not rows:
            return [Text("no processes", style="grey42")]
        if len(rows) > room:
            rows = rows[: room - 1] + [Text(f"+{len(gpu.processes) - room + 1} more", style="grey62")]
        return rows

