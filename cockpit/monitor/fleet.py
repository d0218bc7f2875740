"""Many hosts at once: the fleet file, one kept session per host, and a row per host.

Every host runs on its own: connections open concurrently behind a limit, each is kept up (or
retried) by its own HostMonitor, so a host that is down or slow never delays another. A row shows
its monitor's verdict, the same one the host's cockpit opened from the fleet shows. Nothing here
knows about Textual."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import yaml

from cockpit.common.errors import CockpitError
from cockpit.host.session import SessionOptions
from cockpit.host.snapshot import snapshot_doc
from cockpit.host.state import HostState
from cockpit.judge.verdict import Phase, Verdict
from cockpit.link.target import agent_python, parse_target
from cockpit.monitor.host import HostMonitor
from cockpit.runs.config import Layout, LayoutError
from cockpit.runs.layoutfile import YamlLoader, compose_yaml, read_config
from cockpit.runs.layouts import resolve_layout

if TYPE_CHECKING:  # imported where a job is watched: a fleet of hosts does without its import
    from cockpit.monitor.cluster import ClusterMonitor

SCHEMA = "gpu-cockpit.fleet/1"
DEFAULT_CONCURRENCY = 16
PING_EVERY_S = 5.0
DEMO_RETRY_S = 5.0  # a `demo` row with no demo running looks for one again this often
FLEET_HISTORY = 120  # samples kept per GPU and host: two minutes at 1 Hz, enough for a host's sparklines
HOT_C = 85  # a GPU this hot is worth a look whatever the run is doing

_HOST_KEYS = {"target": "str", "name": "str", "layout": "str", "python": "str", "sim": "str"}
_TOP_KEYS = {"hosts": None, "defaults": None, "concurrency": None, "interval": None}


@dataclass
class FleetHost:
    target: str
    name: str
    layout: str | None = None
    python: str | None = None
    sim: str | None = None  # the simulated NVML's state folder on that host (demos, tests)


@dataclass
class Fleet:
    hosts: list[FleetHost]
    concurrency: int = DEFAULT_CONCURRENCY
    interval: float = 1.0
    path: str = "<fleet>"


def load_fleet(path: str) -> Fleet:
    return parse_fleet(read_config(path, "fleet", "see docs/fleet.md for its format"), path)


def parse_fleet(text: str, path: str = "<fleet>") -> Fleet:
    """`hosts:` a list of targets or of {target, name, layout, python, sim}; `defaults:` the same
    keys for every host; `concurrency:` connections opened at once; `interval:` seconds."""
    ld = YamlLoader(path)
    root = compose_yaml(text, path)
    if root is None:
        raise LayoutError(f"{path}:1: the fleet file is empty: it needs hosts: [host-a, user@host-b]")
    top = {key: v for key, _, v in ld.mapping(root, "the fleet file", _TOP_KEYS)}
    if "hosts" not in top:
        raise ld.fail(root, "missing hosts: add e.g. `hosts: [gpu-a, root@gpu-b:2222]`")
    defaults = _host_fields(ld, top["defaults"], "defaults") if "defaults" in top else {}
    defaults.pop("target", None)
    fleet = Fleet(hosts=[], path=path)
    if "concurrency" in top:
        fleet.concurrency = ld.integer(top["concurrency"], "concurrency", 1, 1024)
    if "interval" in top:
        fleet.interval = max(0.1, ld.number(top["interval"], "interval"))
    seen: dict[str, int] = {}
    for node in ld.seq(top["hosts"], "hosts"):
        if isinstance(node, yaml.ScalarNode):
            fields = {"target": ld.string(node, "a host")}
        else:
            fields = _host_fields(ld, node, "a host")
            if "target" not in fields:
                raise ld.fail(node, "each host needs target: (an ssh alias, user@host[:port], local or demo)")
        try:
            parse_target(fields["target"])
        except CockpitError as exc:
            raise ld.fail(node, str(exc)) from None
        host = FleetHost(**{**defaults, **fields, "name": fields.get("name") or fields["target"]})
        if host.name in seen:
            raise ld.fail(
                node, f"host {host.name!r} is listed twice (first at line {seen[host.name]}): give it a name:"
            )
        seen[host.name] = node.start_mark.line + 1
        fleet.hosts.append(host)
    if not fleet.hosts:
        raise ld.fail(top["hosts"], "hosts is empty: name at least one host")
    return fleet


def _host_fields(ld: YamlLoader, node: Any, what: str) -> dict[str, Any]:
    return {key: ld.string(v, f"{what}: {key}") for key, _, v in ld.mapping(node, what, _HOST_KEYS)}


def fleet_from_hosts(text: str, layout: str | None = None, python: str | None = None) -> Fleet:
    """`--hosts a,b,c`: the same fleet as a file listing them."""
    names = [h.strip() for h in text.split(",") if h.strip()]
    if not names:
        raise CockpitError("--hosts: name at least one host, e.g. --hosts gpu-a,gpu-b")
    if len(set(names)) != len(names):
        raise CockpitError("--hosts: a host is listed twice")
    for n in names:
        parse_target(n)
    return Fleet(hosts=[FleetHost(target=n, name=n, layout=layout, python=python) for n in names])


# ----------------------------------------------------------------------------- live hosts


@dataclass
class Row:
    """What the fleet table shows of one host."""

    name: str
    link: str
    error: str | None
    rtt_ms: float | None
    age_s: float | None
    gpus: list[tuple[int | None, int | None, int | None]]  # (util %, used MiB, total MiB) per GPU
    phase: str
    verdict: str
    alerts: list[str] = field(default_factory=list)

    @property
    def reachable(self) -> bool:
        return self.link == "up"

    @property
    def util(self) -> float:
        vals = [u for u, _, _ in self.gpus if u is not None]
        return sum(vals) / len(vals) if vals else -1.0

    @property
    def mem_share(self) -> float:
        used = sum(m or 0 for _, m, _ in self.gpus)
        total = sum(t or 0 for _, _, t in self.gpus)
        return used / total if total else -1.0


def alerts_of(s: HostState, verdict: Verdict) -> list[str]:
    """A fleet row's alerts: why the verdict alerts, then what each GPU says of itself (lost, its
    recent Xids, row remap, ECC, the hardware holding its clocks down; docs/xid.md), heat, and
    the absence of GPUs."""
    alerts: list[str] = []
    if verdict.alerting and verdict.evidence:
        alerts.append(verdict.evidence[0])  # the verdict has its own column: here, why
    for g in sorted(s.gpus.values(), key=lambda g: g.index):
        if g.temp_c is not None and g.temp_c >= HOT_C:
            alerts.append(f"GPU{g.index} {g.temp_c}°C")
        flags = s.gpu_flags(g.index) + [r for r in g.throttle_reasons if r == "sw-thermal"]
        if flags:
            alerts.append(f"GPU{g.index} {'/'.join(flags)}")
    if s.seq and not s.gpus:
        alerts.append("no GPUs")
    return alerts


class Member:
    """One host of the fleet: its monitor (kept up or retried on its own) and its layout."""

    def __init__(self, host: FleetHost, opts: SessionOptions):
        self.host = host
        self.layout: Layout | None = resolve_layout(host.layout) if host.layout else None
        self.opts = opts
        target = parse_target(host.target)
        self.demo_error: str | None = None  # `demo` with no demo running: said in the row, asked again
        self.monitor: HostMonitor | ClusterMonitor  # each host's own session: its link's error is the row's
        if target.kind == "slurm" and not target.node:  # a job: one row, all its nodes (cockpit/monitor/cluster.py)
            from cockpit.monitor.cluster import ClusterMonitor

            self.monitor = ClusterMonitor(target, opts, self.layout, history=FLEET_HISTORY)
        elif target.kind == "demo":
            self.monitor = self._demo_monitor()
        else:
            self.monitor = HostMonitor(target, opts, self.layout, history=FLEET_HISTORY, probe_every_s=PING_EVERY_S)
        self.monitor.state.target = host.name
        self.monitor.forensics_on = False  # an overview of many hosts attaches py-spy to none; its drill-in may
        self.task: asyncio.Task[None] | None = None
        self.tried = asyncio.Event()  # set once the first connection has succeeded or failed
        self.up_at = time.monotonic()  # when the first connection came up (or failed): a look is timed from it
        self._alerts: tuple[Verdict, int, float | None, int, list[str]] | None = (
            None  # (the verdict, the sample, the count of GPUs they were read from, alerts)
        )

    def _demo_monitor(self) -> HostMonitor:
        """The running demo, watched as `cockpit snapshot demo` watches it: its simulated GPUs,
        its port and its current run, nothing else on this machine."""
        from cockpit.monitor import demo

        layout = self.layout or resolve_layout("demo")
        try:
            state = demo.need_live_state()
        except CockpitError as exc:
            self.demo_error = str(exc)
            return HostMonitor(parse_target("demo"), self.opts, layout, history=FLEET_HISTORY)
        self.demo_error = None
        layout = demo.layout_of(state, layout)
        watch, follow = demo.follower(layout, state)
        opts = replace(self.opts, sim_state=state)
        return HostMonitor(
            parse_target("demo"),
            opts,
            layout,
            history=FLEET_HISTORY,
            probe_every_s=PING_EVERY_S,
            on_connect=follow,
            watch=watch,
        )

    @property
    def session(self) -> Any:
        return self.monitor.session

    @property
    def state(self) -> HostState:
        return self.monitor.state

    @property
    def phase(self) -> Phase:
        return self.monitor.phase

    @property
    def verdict(self) -> Verdict:
        return self.monitor.verdict

    async def run(self, gate: asyncio.Semaphore) -> None:
        while True:
            while self.demo_error:  # no demo yet: the row says so until one starts
                self.session.link_error = self.demo_error
                self.state.link_state = "down"
                self.tried.set()
                await asyncio.sleep(DEMO_RETRY_S)
                self.monitor = self._demo_monitor()
                self.monitor.state.target = self.host.name
                self.monitor.forensics_on = False
            self.state.link_state = "waiting"
            async with gate:
                self.state.link_state = "connecting"
                try:
                    await self.monitor.open(kept=True)
                except CockpitError as exc:
                    self.session.link_error = str(exc)
                    self.state.link_state = "down"
                except Exception as exc:  # whatever one host does, the others go on
                    self.session.link_error = f"{type(exc).__name__}: {exc}"
                    self.state.link_state = "down"
                finally:
                    self.up_at = time.monotonic()
                    self.tried.set()
            if self.monitor.target.kind != "demo":
                await self.monitor.keep(retry_first=True)
                return
            await self._keep_demo()

    async def _keep_demo(self) -> None:
        """The demo's row is up while the demo lives: once its cockpit quits (its state folder's
        owner gone), the link is down and the row waits for a new demo, as before the first."""
        from cockpit.monitor import demo

        kept = asyncio.create_task(self.monitor.keep(retry_first=True))
        try:
            while not kept.done():
                await asyncio.sleep(DEMO_RETRY_S)
                if self.monitor.session.opts.sim_state not in demo.live_states():
                    break
        finally:
            kept.cancel()
        await self.monitor.close()
        self.demo_error = "the demo ended (its cockpit quit): waiting for a new one (`cockpit demo`)"
        self.monitor = HostMonitor(
            parse_target("demo"), self.opts, self.layout or resolve_layout("demo"), history=FLEET_HISTORY
        )
        self.monitor.state.target = self.host.name
        self.monitor.forensics_on = False

    def row(self) -> Row:
        s = self.state
        alerts = self._alerts_now() + s.agent.warnings[:1]
        link = s.link_state
        return Row(
            name=self.host.name,
            link=link,
            error=self.session.link_error,
            rtt_ms=s.rtt_ms,
            age_s=s.age_s() if s.seq else None,
            gpus=[
                (g.util_pct, g.mem_used_mib, g.mem_total_mib) for g in sorted(s.gpus.values(), key=lambda g: g.index)
            ],
            phase=str(self.phase) if s.seq else "-",
            verdict=str(self.verdict) if s.seq else "-",
            alerts=alerts,
        )

    def _alerts_now(self) -> list[str]:
        """The row's alerts, read again only when the verdict (a new one with each judgement) or
        the sample changed: the table asks twice a second, a host samples once."""
        s, verdict = self.state, self.verdict
        seen = self._alerts
        if seen is None or seen[0] is not verdict or seen[1:4] != (s.seq, s.sample_ts, len(s.gpus)):
            seen = self._alerts = (verdict, s.seq, s.sample_ts, len(s.gpus), alerts_of(s, verdict))
        return list(seen[4])


class FleetMonitor:
    """Starts a HostMonitor per host (at most `concurrency` connecting at once) and keeps them."""

    def __init__(self, fleet: Fleet, base: SessionOptions | None = None):
        self.fleet = fleet
        base = base or SessionOptions()
        self.members: list[Member] = []
        for host in fleet.hosts:
            python = agent_python(parse_target(host.target), host.python or base.python)
            opts = SessionOptions(
                python=python,
                python_named=bool(host.python) or base.python_named,
                interval=fleet.interval or base.interval,
                sim_state=host.sim or base.sim_state,
                ssh_config=base.ssh_config,
                known_hosts=base.known_hosts,
                accept_new=base.accept_new,
                trust_python=base.trust_python,
            )
            self.members.append(Member(host, opts))
        self._gate: asyncio.Semaphore | None = None

    def start(self) -> None:
        self._gate = asyncio.Semaphore(self.fleet.concurrency)
        for m in self.members:
            m.task = asyncio.create_task(m.run(self._gate))

    async def close(self) -> None:
        for m in self.members:
            if m.task is not None:
                m.task.cancel()
        await asyncio.gather(*(m.monitor.close() for m in self.members), return_exceptions=True)

    def rows(self) -> list[Row]:
        return [m.row() for m in self.members]

    async def settle(self, timeout: float, samples: int = 2) -> None:
        """Until every host has sent `samples` samples or failed its first connection, or timeout."""
        deadline = time.monotonic() + timeout

        def settled(m: Member) -> bool:
            if not m.tried.is_set():
                return False
            if m.state.link_state != "up":
                return True
            return m.state.seq >= samples and not m.monitor.still_looking(m.up_at)

        while not all(settled(m) for m in self.members) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    def doc(self) -> dict[str, Any]:
        """The fleet as one JSON document (docs/snapshot-schema.md, fleet part)."""
        hosts = []
        for m, row in zip(self.members, self.rows()):
            up = m.state.seq > 0
            hosts.append(
                {
                    "name": row.name,
                    "target": m.host.target,
                    "reachable": row.reachable,
                    "link": row.link,
                    "error": row.error,
                    "rtt_ms": row.rtt_ms,
                    "phase": row.phase if up else None,
                    "verdict": m.verdict.doc() if up else None,
                    "alerts": row.alerts,
                    "snapshot": snapshot_doc(m.state, log_lines=10, verdict=m.verdict, phase=m.phase) if up else None,
                }
            )
        return {
            "schema": SCHEMA,
            "taken_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "hosts": hosts,
        }


async def take_fleet_snapshot(watch: FleetMonitor, timeout: float = 30.0) -> dict[str, Any]:
    watch.start()
    try:
        await watch.settle(timeout)
        return watch.doc()
    finally:
        await watch.close()
