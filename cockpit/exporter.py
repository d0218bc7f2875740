"""`cockpit exporter`: the fleet's verdicts where the team already looks, as Prometheus metrics.

One long-lived process holds a FleetMonitor (one HostMonitor per host: the same judging as the
screen and the fleet's rows) and serves the Prometheus text format over HTTP with
prometheus-client. A custom Collector reads the monitors' current state at scrape time: nothing is
copied in the background. The monitors live on the asyncio loop; prometheus-client serves from its
own thread, so a scrape hands the reading to the loop (`call_soon_threadsafe`) and waits for it.

Labels are bounded (docs/exporter.md): `host` is the fleet's name for the host (masked, control
characters made visible, cut at LABEL_MAX characters), `state` one of a fixed set per metric,
`gpu` a GPU index, `rank` a rank number, `xid` an Xid code, `run` a ledger id (or `pgid:N`,
`port:N` for a run started elsewhere). No command line or free text is ever a label. Identifiers
(an Xid code, the odd rank) are labels of info-style series (value 1), never sample values; counts
since a start are counters (`_total`).

`--on-change CMD` runs CMD (split once with shlex, never through a shell) on each verdict change,
the change in GPU_COCKPIT_* environment variables, at most one at a time per host (a change that
comes while it runs is kept, the latest only, and run after it), each run bounded by a timeout,
its output discarded. Nothing here knows Textual."""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime as dt
import functools
import ipaddress
import os
import shlex
import shutil
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from cockpit.common.errors import CockpitError
from cockpit.common.hosttext import visible
from cockpit.common.secrets import mask_line
from cockpit.judge.verdict import REQUESTS_FROZEN, VerdictName
from cockpit.read.logrules import PHASE_ORDER

NS = "gpu_cockpit"
DEFAULT_LISTEN = "127.0.0.1:9841"
LABEL_MAX = 64  # characters of a host name in a label
ENV_MAX = 1000  # characters of one GPU_COCKPIT_* variable
SCRAPE_TIMEOUT_S = 10.0  # a scrape waits this long for the event loop to read the monitors
READ_TIMEOUT_S = 10.0  # a connection that sends no whole request (or stops reading) in this long is closed
MAX_CONNECTIONS = 64  # open at once: far below any fd limit; past it the oldest idle one makes room
XID_CODES = 4  # distinct Xid codes exported per GPU (its latest): a label, so bounded
MAX_HOST_RUNS = 64  # runs (servers judged alone) exported per host, as the agent lists at most
MAX_HOST_GPUS = 512  # GPUs exported per host (a job's many nodes included); the rest counted, not exported
HOOK_TIMEOUT_S = 30.0
RULES = Path(__file__).resolve().parent / "alerts" / "gpu-cockpit-rules.yml"

VERDICTS = tuple(v.value for v in VerdictName)
LINK_STATES = ("up", "connecting", "down", "lost")
STALL_KINDS = ("requests_frozen", "serving_stopped", "launch_stopped", "other")
BASE_PHASES = ("no run", *PHASE_ORDER, "crashed", "exited", "stopped")
STALLED = (VerdictName.STALLED_IDLE, VerdictName.STALLED_SPINNING)
MIB = 1024 * 1024


# ----------------------------------------------------------------------------- label values


@functools.lru_cache(maxsize=4096)
def label(text, limit: int = LABEL_MAX) -> str:
    """Host text as a label value: secrets masked, control characters made visible, at most
    `limit` characters (the last one an ellipsis when cut). prometheus-client escapes the rest
    (backslash, quote, newline) in the exposition."""
    text = visible(mask_line(str(text)))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def link_kind(link_state: str) -> str:
    """The session's link text (`up`, `waiting`, `connecting`, `down, retrying (3)`, `lost,
    retrying (1)`) as one of LINK_STATES."""
    if link_state == "up":
        return "up"
    if link_state.startswith("lost"):
        return "lost"
    if link_state.startswith("down"):
        return "down"
    return "connecting"


def stall_kind(verdict) -> str | None:
    """What the stall's evidence is, as one of STALL_KINDS; None when the run is not stalled."""
    if verdict.name not in STALLED:
        return None
    detail = verdict.detail or ""
    if detail == REQUESTS_FROZEN:
        return "requests_frozen"
    if detail == "serving stopped":
        return "serving_stopped"
    if detail.startswith("launch stopped"):
        return "launch_stopped"
    return "other"


def phases_of(monitor) -> list[str]:
    """The phase states a host's series cover: the engines' phases and the layout's own."""
    layout = getattr(monitor, "layout", None)
    own = [label(rule.phase) for rule in (layout.phases if layout is not None else [])]
    return list(dict.fromkeys([*BASE_PHASES, *own]))


def _iso(ts: float | None) -> str:
    ts = time.time() if ts is None else ts
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).isoformat(timespec="seconds")


# ----------------------------------------------------------------------------- the exporter


class Exporter:
    """The fleet's monitors, read at scrape time; each verdict change noted (for the seconds in
    the current verdict) and handed to the --on-change hook."""

    def __init__(self, fleet, hook: OnChange | None = None):
        self.fleet = fleet
        self.hook = hook
        self._subscribed: dict[str, object] = {}  # host -> the monitor listened to
        self._since: dict[str, tuple[str, float]] = {}  # host -> (verdict, local monotonic time it began)
        self.scrapes = 0
        self.scrape_s = 0.0

    def watch(self) -> None:
        """Listen to every member's monitor (again when a member's monitor is replaced: a demo
        row that found its demo)."""
        for m in self.fleet.members:
            name = m.host.name
            if self._subscribed.get(name) is not m.monitor:
                self._subscribed[name] = m.monitor
                m.monitor.subscribe(lambda event, m=m, mon=m.monitor: self._on_event(m, mon, event))

    def _on_event(self, member, monitor, event) -> None:
        if event.kind == "verdict" and member.monitor is monitor and event.before is not None:
            self.verdict_changed(member, event.before)

    def verdict_changed(self, member, before) -> None:
        """A member's monitor changed its verdict (from `before`): noted, and the hook told."""
        self._since[member.host.name] = (str(member.verdict), time.monotonic())
        if self.hook is not None:
            self.hook.changed(member.host.name, change_env(member, before))

    def verdict_seconds(self, member) -> float:
        """Seconds in the current verdict: a stall's own `since` (back-dated from the host's
        history, on the host's clock: no clock skew), else since this exporter saw it begin."""
        v, s = member.verdict, member.state
        if v.since is not None and s.sample_ts is not None:
            return max(0.0, s.sample_ts - v.since + (s.age_s() or 0.0))
        key = str(v)
        seen = self._since.get(member.host.name)
        if seen is None or seen[0] != key:
            seen = self._since[member.host.name] = (key, time.monotonic())
        return time.monotonic() - seen[1]

    def families(self) -> list:
        """Every metric family, read from the monitors now (on the event loop's thread)."""
        from prometheus_client.core import CounterMetricFamily as C, GaugeMetricFamily as G

        t0 = time.perf_counter()
        self.watch()
        H, HS = ["host"], ["host", "state"]
        verdict = G(f"{NS}_verdict", "The run's verdict: 1 for the current state, 0 for the others", labels=HS)
        phase = G(f"{NS}_phase", "The run's phase: 1 for the current state, 0 for the others", labels=HS)
        link = G(f"{NS}_link", "The link to the host: 1 for the current state (up, connecting, down, lost)", labels=HS)
        seconds = G(
            f"{NS}_verdict_seconds", "Seconds in the current verdict (a stall's from its host-side start)", labels=H
        )
        odd = G(
            f"{NS}_odd_rank_info",
            "1, its rank label the rank the verdict names (the odd one out of a stall, "
            "the crashed one); absent when none",
            labels=["host", "rank"],
        )
        dead = G(f"{NS}_dead_ranks", "Ranks of the run that are gone or zombies", labels=H)
        ranks = G(f"{NS}_ranks", "Ranks of the run seen (alive or not)", labels=H)
        stall = G(
            f"{NS}_stall_evidence",
            "While stalled, what the stall's evidence is: 1 for the current kind "
            "(requests_frozen, serving_stopped, launch_stopped, other)",
            labels=HS,
        )
        tokens = G(
            f"{NS}_tokens_per_second",
            "Generation tokens per second, from the engine's metrics (the rate "
            "the cockpit's header shows; rate() of generation_tokens_total is "
            "Prometheus's own)",
            labels=H,
        )
        generated = C(
            f"{NS}_generation_tokens",
            "Generation tokens the engine counted since its run started, from its metrics (a relaunch starts it again)",
            labels=H,
        )
        running = G(f"{NS}_requests_running", "Requests running, from the engine's metrics", labels=H)
        waiting = G(f"{NS}_requests_waiting", "Requests waiting, from the engine's metrics", labels=H)
        rtt = G(f"{NS}_link_rtt_seconds", "Round-trip time of the link to the agent", labels=H)
        age = G(f"{NS}_sample_age_seconds", "Seconds since the host's last sample arrived", labels=H)
        run = G(
            f"{NS}_run_info",
            "The run on the host (1): its ledger id, else (started elsewhere) pgid:N of its "
            "process group or port:N of its port; and the layout",
            labels=["host", "run", "layout"],
        )
        each = G(
            f"{NS}_server_verdict",
            "Each run on the host, one server's process tree (root:PID), judged on "
            "its own tree: 1 for its current verdict (no layout and several servers: "
            "one per server; else the run followed)",
            labels=["host", "run", "state"],
        )
        each_ranks = G(
            f"{NS}_server_ranks",
            "Ranks of each run on the host (root:PID), its own tree's alone",
            labels=["host", "run"],
        )
        GL = ["host", "gpu", "rank"]
        util = G(f"{NS}_gpu_utilization_ratio", "GPU utilization, 0 to 1", labels=GL)
        used = G(f"{NS}_gpu_memory_used_bytes", "GPU memory used", labels=GL)
        total = G(f"{NS}_gpu_memory_total_bytes", "GPU memory in all", labels=GL)
        power = G(f"{NS}_gpu_power_watts", "GPU power draw", labels=GL)
        temp = G(f"{NS}_gpu_temperature_celsius", "GPU temperature", labels=GL)
        ecc = C(
            f"{NS}_gpu_ecc_uncorrected_errors",
            "Uncorrected ECC errors since the driver loaded (NVML's volatile count) where the GPU has ECC",
            labels=GL,
        )
        lost = G(f"{NS}_gpu_lost", "1 when NVML reports the GPU lost (fallen off the bus), else 0", labels=GL)
        remap = G(
            f"{NS}_gpu_row_remap_pending",
            "1 while a remapped row waits for a GPU reset, where the GPU remaps rows",
            labels=GL,
        )
        xid = G(
            f"{NS}_gpu_xid_info",
            "1 for each Xid code the GPU raised in the last 5 minutes, its code the xid "
            f"label (the latest {XID_CODES} codes; docs/xid.md)",
            labels=[*GL, "xid"],
        )
        xids = G(f"{NS}_gpu_xid_recent_events", "Xid events the GPU raised in the last 5 minutes", labels=GL)
        hw = G(
            f"{NS}_gpu_hw_slowdown",
            "1 while the hardware holds the GPU's clocks down (HW slowdown, thermal, power brake), else 0",
            labels=GL,
        )
        capped = G(
            f"{NS}_gpus_not_exported",
            f"GPUs a host reports past the {MAX_HOST_GPUS} exported per host (absent when none)",
            labels=H,
        )
        for m in self.fleet.members:
            mon, s = m.monitor, m.state
            host = label(m.host.name)
            for st in LINK_STATES:
                link.add_metric([host, st], 1.0 if link_kind(s.link_state) == st else 0.0)
            if s.rtt_ms is not None:
                rtt.add_metric([host], s.rtt_ms / 1000)
            if not s.seq:
                continue  # never sampled: no verdict, no phase to tell (the link says why)
            a = s.age_s()
            if a is not None:
                age.add_metric([host], a)
            v = m.verdict
            for st in VERDICTS:
                verdict.add_metric([host, st], 1.0 if v.name.value == st else 0.0)
            current = label(m.phase.name)
            names = phases_of(mon)
            for st in names if current in names else [*names, current]:
                phase.add_metric([host, st], 1.0 if st == current else 0.0)
            seconds.add_metric([host], self.verdict_seconds(m))
            if v.odd_rank is not None:
                odd.add_metric([host, str(int(v.odd_rank))], 1.0)
            rs = [] if getattr(mon, "several", False) else s.ranks()  # several servers, none followed: no run's ranks
            ranks.add_metric([host], float(len(rs)))
            dead.add_metric([host], float(sum(1 for p in rs if not p.alive or p.status == "Z")))
            kind = stall_kind(v)
            for st in STALL_KINDS:
                stall.add_metric([host, st], 1.0 if kind == st else 0.0)
            head = s.metrics.header() if s.metrics.scrapes else {}
            for fam, key in ((tokens, "tokens_per_s"), (running, "running"), (waiting, "waiting")):
                if head.get(key) is not None:
                    fam.add_metric([host], float(head[key]))
            if head.get("generation_tokens") is not None:
                generated.add_metric([host], float(head["generation_tokens"]))
            runs_doc = getattr(mon, "runs_doc", None)  # one host's monitor: its runs, each its own tree
            for entry in (runs_doc()["runs"] if runs_doc is not None else [])[:MAX_HOST_RUNS]:
                if entry.get("root") is None:
                    continue
                rid = f"root:{int(entry['root'])}"
                name = (entry.get("verdict") or {}).get("name")
                for st in VERDICTS:
                    each.add_metric([host, rid, st], 1.0 if name == st else 0.0)
                each_ranks.add_metric([host, rid], float(len(entry.get("ranks") or [])))
            layout = getattr(mon, "layout", None)
            named = run_name(mon, s)
            if named is not None:
                run.add_metric([host, label(named), label(layout.name if layout else "")], 1.0)
            on_gpu: dict = {}
            for p in rs:
                if p.alive and p.status != "Z":
                    for i in p.gpus:
                        on_gpu.setdefault(i, []).append(p.rank)
            shown = s.gpus.values()
            if len(s.gpus) > MAX_HOST_GPUS:  # a host claiming 20,000 GPUs would be 100,000 series
                shown = list(s.gpus.values())[:MAX_HOST_GPUS]
                capped.add_metric([host], float(len(s.gpus) - MAX_HOST_GPUS))
            for g in shown:
                r = sorted(set(on_gpu.get(g.index, [])))
                on = ",".join(str(x) for x in r[:4]) + (",…" if len(r) > 4 else "")
                labels = [host, label(getattr(g, "label", None) or g.index), on]  # a job's GPU: "node:index"
                if g.util_pct is not None:
                    util.add_metric(labels, g.util_pct / 100)
                if g.mem_used_mib is not None:
                    used.add_metric(labels, float(g.mem_used_mib) * MIB)
                if g.mem_total_mib is not None:
                    total.add_metric(labels, float(g.mem_total_mib) * MIB)
                if g.power_w is not None:
                    power.add_metric(labels, float(g.power_w))
                if g.temp_c is not None:
                    temp.add_metric(labels, float(g.temp_c))
                if g.ecc_uncorrected is not None:
                    ecc.add_metric(labels, float(g.ecc_uncorrected))
                lost.add_metric(labels, 1.0 if g.lost else 0.0)
                hw.add_metric(labels, 1.0 if g.hw_slowdown else 0.0)
                if g.remap_pending is not None:
                    remap.add_metric(labels, 1.0 if g.remap_pending else 0.0)
                recent = s.recent_xid(g.index)
                if recent:
                    xids.add_metric(labels, float(len(recent)))
                    codes = list(dict.fromkeys(e.code for e in reversed(recent)))[:XID_CODES]
                    for code in codes:
                        xid.add_metric([*labels, str(int(code))], 1.0)
        hosts = G(f"{NS}_hosts", "Hosts in the fleet this exporter watches")
        hosts.add_metric([], float(len(self.fleet.members)))
        out = [
            verdict,
            phase,
            link,
            seconds,
            odd,
            dead,
            ranks,
            stall,
            tokens,
            generated,
            running,
            waiting,
            rtt,
            age,
            run,
            each,
            each_ranks,
            util,
            used,
            total,
            power,
            temp,
            ecc,
            lost,
            remap,
            xid,
            xids,
            hw,
            capped,
            hosts,
        ]
        if self.hook is not None:
            hook = C(
                f"{NS}_on_change_runs",
                "--on-change runs by result (ok, failed, timeout, error, "
                "coalesced: a change replaced by a later one while the hook ran)",
                labels=["result"],
            )
            for result in OnChange.RESULTS:
                hook.add_metric([result], float(self.hook.results[result]))
            out.append(hook)
        self.scrapes += 1
        self.scrape_s += time.perf_counter() - t0
        return out


def run_name(monitor, state) -> str | None:
    """The run's name in `run_info`: its ledger id; a run the cockpit did not launch by its
    process group (`pgid:N`, the one most of its live ranks are in), else by the layout's port
    (`port:N`); None when no process of a run is alive."""
    following = getattr(monitor, "following", None) or {}
    if following.get("run_id"):
        return str(following["run_id"])
    live = [p for p in state.ranks() if p.alive and p.status != "Z"] or [
        p for p in state.live_procs() if p.role == "server"
    ]
    groups = Counter(p.pgid for p in live if p.pgid)
    if groups:
        return f"pgid:{groups.most_common(1)[0][0]}"
    layout = getattr(monitor, "layout", None)
    if live and layout is not None and layout.ports:
        return f"port:{layout.ports[0]}"
    return None


def change_env(member, before) -> dict[str, str]:
    """The GPU_COCKPIT_* variables of a verdict change (docs/exporter.md)."""
    mon, v = member.monitor, member.verdict
    s = member.state
    since = v.since
    if since is None:
        since = s.sample_ts if s.sample_ts is not None else time.time()
    following = getattr(mon, "following", None) or {}

    def clip(text) -> str:
        return label(text or "", ENV_MAX).replace("\x00", "")

    return {
        "GPU_COCKPIT_HOST": label(member.host.name),
        "GPU_COCKPIT_TARGET": clip(member.host.target),
        "GPU_COCKPIT_VERDICT": v.name.value,
        "GPU_COCKPIT_PREVIOUS": before.name.value,
        "GPU_COCKPIT_RANK": "" if v.odd_rank is None else str(v.odd_rank),
        "GPU_COCKPIT_PREVIOUS_RANK": "" if before.odd_rank is None else str(before.odd_rank),
        "GPU_COCKPIT_SINCE": _iso(since),
        "GPU_COCKPIT_DETAIL": clip(v.detail),
        "GPU_COCKPIT_PHASE": clip(str(member.phase)),
        "GPU_COCKPIT_EVIDENCE": clip(" | ".join(v.evidence[:4])),
        "GPU_COCKPIT_RUN": clip(following.get("run_id")),
    }


class OnChange:
    """The --on-change hook: an argv run with the change in its environment; one run at a time
    per host, the latest change waiting while one runs (older waiting ones are dropped and
    counted as `coalesced`), each bounded by `timeout_s` (then its process group is killed), its
    output discarded; a failure is one line on stderr."""

    RESULTS = ("ok", "failed", "timeout", "error", "coalesced")

    def __init__(self, argv: list[str], timeout_s: float = HOOK_TIMEOUT_S, err=None):
        self.argv = argv
        self.timeout_s = timeout_s
        self.err = err or sys.stderr
        self.running: dict[str, asyncio.Task] = {}
        self.pending: dict[str, dict] = {}
        self.results: Counter = Counter()

    @classmethod
    def parse(cls, text: str, timeout_s: float = HOOK_TIMEOUT_S) -> OnChange:
        try:
            argv = shlex.split(text)
        except ValueError as exc:
            raise CockpitError(
                f"--on-change: {exc}: quote it as a shell would (it is split once, never run by a shell)"
            ) from None
        if not argv:
            raise CockpitError("--on-change: name a command, e.g. --on-change '/usr/local/bin/page-oncall --team gpu'")
        exe = argv[0]
        found = shutil.which(exe) if os.sep not in exe else (exe if os.access(exe, os.X_OK) else None)
        if not found or os.path.isdir(found):
            raise CockpitError(f"--on-change: {exe!r} is not an executable file (or not on PATH)")
        if not timeout_s > 0 or timeout_s == float("inf"):
            raise CockpitError("--on-change-timeout: more than 0 seconds")
        return cls(argv, timeout_s)

    def changed(self, host: str, env: dict[str, str]) -> None:
        if host in self.running:
            if host in self.pending:
                self.results["coalesced"] += 1
            self.pending[host] = env
            return
        self.running[host] = asyncio.get_running_loop().create_task(self._run(host, env))

    async def _run(self, host: str, env: dict[str, str] | None) -> None:
        try:
            while env is not None:
                await self._once(env)
                env = self.pending.pop(host, None)
        finally:
            self.running.pop(host, None)

    def _say(self, text: str) -> None:
        print(visible(f"cockpit exporter: --on-change: {text}"), file=self.err, flush=True)

    async def _once(self, env: dict[str, str]) -> None:
        what = f"{env['GPU_COCKPIT_HOST']} {env['GPU_COCKPIT_PREVIOUS']} -> {env['GPU_COCKPIT_VERDICT']}"
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.argv,
                env={**os.environ, **env},
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:
            self.results["error"] += 1
            self._say(f"{what}: cannot run {self.argv[0]}: {exc.strerror or exc}")
            return
        try:
            rc = await asyncio.wait_for(proc.wait(), self.timeout_s)
        except asyncio.TimeoutError:
            self._kill(proc)
            await proc.wait()
            self.results["timeout"] += 1
            self._say(f"{what}: still running after {self.timeout_s:g} s: killed")
            return
        except asyncio.CancelledError:
            self._kill(proc)
            raise
        if rc == 0:
            self.results["ok"] += 1
        else:
            self.results["failed"] += 1
            self._say(f"{what}: exit status {rc}")

    @staticmethod
    def _kill(proc) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: the hook and what it started
        except (ProcessLookupError, PermissionError):
            pass

    async def close(self, wait_s: float = 5.0) -> None:
        """Let runs under way finish for up to `wait_s`, then kill them."""
        tasks = list(self.running.values())
        if tasks:
            _done, left = await asyncio.wait(tasks, timeout=wait_s)
            for t in left:
                t.cancel()
            await asyncio.gather(*left, return_exceptions=True)


class LoopCollector:
    """prometheus-client's Collector: builds the families on the event loop that owns the
    monitors, at scrape time (prometheus-client calls `collect` from its server thread)."""

    def __init__(self, exporter: Exporter, loop: asyncio.AbstractEventLoop):
        self.exporter = exporter
        self.loop = loop
        self._loop_thread = threading.get_ident()

    def collect(self):
        if threading.get_ident() == self._loop_thread:
            return self.exporter.families()
        fut: concurrent.futures.Future = concurrent.futures.Future()

        def build() -> None:
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(self.exporter.families())
                except BaseException as exc:  # handed to the scrape, which answers 500
                    fut.set_exception(exc)

        self.loop.call_soon_threadsafe(build)
        try:
            return fut.result(SCRAPE_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise


# ----------------------------------------------------------------------------- the command


def parse_listen(text: str) -> tuple[str, int]:
    """`ADDR:PORT`, `[V6ADDR]:PORT` or `:PORT` (loopback)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise CockpitError(f"--listen {text}: give ADDR:PORT, e.g. --listen 127.0.0.1:9841")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    host = host or "127.0.0.1"
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if host != "localhost":
            raise CockpitError(f"--listen {text}: the address must be an IP address (or localhost)") from None
    return host, int(port)


def is_loopback(host: str) -> bool:
    return host == "localhost" or ipaddress.ip_address(host).is_loopback


def bounded_server(app, host: str, port: int):
    """A thread-per-connection WSGI server (as prometheus-client's) that a local user cannot
    starve: each connection reads and writes under READ_TIMEOUT_S, at most MAX_CONNECTIONS are
    open, and past that the oldest one that has not sent a whole request yet is shut to make
    room (one whose request was read finishes; with none idle the newcomer is closed). 1,020
    half-open connections under `ulimit -n 1024` took every descriptor and thread before."""
    import socket
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    class Handler(WSGIRequestHandler):
        timeout = READ_TIMEOUT_S  # StreamRequestHandler sets it on the connection

        def parse_request(self) -> bool:
            ok = super().parse_request()  # the request line and headers read: no longer idle
            self.server.busy(self.connection)
            return ok

        def log_message(self, format, *args) -> None:
            pass

    class Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True
        request_queue_size = 128  # listen backlog: a burst of connections is accepted, not left to SYN retries
        address_family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]

        def server_activate(self) -> None:
            self._lock = threading.Lock()
            self._conns: dict = {}  # connection -> "idle" | "busy" | "shut"
            self.refused = self.evicted = 0
            super().server_activate()

        def process_request(self, request, client_address) -> None:
            with self._lock:
                if sum(1 for st in self._conns.values() if st != "shut") >= MAX_CONNECTIONS:
                    idle = next((c for c, st in self._conns.items() if st == "idle"), None)
                    if idle is None:
                        self.refused += 1
                        request.close()
                        return
                    self._conns[idle] = "shut"
                    self.evicted += 1
                    try:
                        idle.shutdown(socket.SHUT_RDWR)  # its thread reads the end and leaves
                    except OSError:
                        pass
                self._conns[request] = "idle"
            super().process_request(request, client_address)

        def handle_error(self, request, client_address) -> None:
            if not isinstance(sys.exc_info()[1], OSError):  # a timed-out or dropped client is no error of ours
                super().handle_error(request, client_address)

        def busy(self, request) -> None:
            with self._lock:
                if self._conns.get(request) == "idle":
                    self._conns[request] = "busy"

        def shutdown_request(self, request) -> None:
            with self._lock:
                self._conns.pop(request, None)
            super().shutdown_request(request)

    return make_server(host, port, app, Server, handler_class=Handler)


def start_server(exporter: Exporter, loop, host: str, port: int):
    """The metrics over HTTP on host:port (bounded_server, its own thread), the registry holding
    only the cockpit's collector. Returns (server, thread)."""
    from prometheus_client import CollectorRegistry, make_wsgi_app

    registry = CollectorRegistry(auto_describe=False)
    registry.register(LoopCollector(exporter, loop))
    try:
        server = bounded_server(make_wsgi_app(registry), host, port)
    except OSError as exc:
        raise CockpitError(f"--listen {host}:{port}: cannot listen there: {exc.strerror or exc}") from None
    thread = threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True)
    thread.start()
    return server, thread


async def serve(fleet, host: str, port: int, hook: OnChange | None = None, out=None) -> None:
    """Watch the fleet and serve its metrics until SIGINT/SIGTERM."""
    out = out or sys.stdout
    loop = asyncio.get_running_loop()
    exporter = Exporter(fleet, hook)
    server, _thread = start_server(exporter, loop, host, port)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    fleet.start()
    exporter.watch()
    shown = f"[{host}]" if ":" in host else host
    print(
        f"cockpit exporter: {len(fleet.members)} host(s); metrics on http://{shown}:{port}/metrics"
        + ("" if is_loopback(host) else " (plain HTTP, no authentication: keep it on a trusted network)"),
        file=out,
        flush=True,
    )
    try:
        while not stop.is_set():
            exporter.watch()
            try:
                await asyncio.wait_for(stop.wait(), 1.0)
            except asyncio.TimeoutError:
                pass
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        await asyncio.to_thread(server.shutdown)
        server.server_close()
        if hook is not None:
            await hook.close()
        await fleet.close()


def cmd_exporter(args, fleet) -> int:
    """`cockpit exporter`: the fleet built by the command line, served until SIGINT/SIGTERM."""
    host, port = parse_listen(args.listen)
    hook = OnChange.parse(args.on_change, args.on_change_timeout) if args.on_change else None
    for m in fleet.members:
        m.monitor.forensics_on = False  # the exporter watches: it attaches py-spy to no run
    asyncio.run(serve(fleet, host, port, hook))
    return 0
