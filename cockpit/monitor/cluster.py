"""A run that spans nodes, watched as one run: `slurm:JOBID`.

A ClusterMonitor holds one HostMonitor per node of the job (each with its own agent, started in the
job by `srun --overlap`, watching only that node's processes of the job) and presents what they see
as one HostState:

- processes keyed by (node, pid), written as one number, `node_number * STRIDE + pid` (node numbers
  from 1, in the job's node order), each carrying `node`, `node_pid` and its Slurm `step`;
- GPUs keyed `node_number * GPU_STRIDE + index`, labelled `node:index`;
- each node's log under `node:path`, the first node's first;
- ranks global: a rank title that is already global (SGLang's `scheduler_TP5` on the second node)
  is kept; ranks that repeat across nodes (local numbering) are offset by the node's rank, from
  `--node-rank`/`--node_rank` on its launcher's command line, else the node's place in the job.

One Watchdog (the same rules as a single host: diagnose.py) judges the merged state; the odd rank
is named with its node. The screen, `snapshot --json`, `kill` and `dump` read this monitor as they
read a HostMonitor: ClusterSession answers the agent commands by sending each node its share
(pids split by node) and merging the answers, so a kill is one plan listing every node's
processes, carried out by each node's agent and verified on each."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import time
from collections.abc import Callable
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass

from cockpit.common.errors import CockpitError, LinkLost
from cockpit.host.session import SessionOptions, WatchList
from cockpit.host.state import HISTORY_LEN, XID_KEPT, AgentInfo, HostState, PortState
from cockpit.judge.verdict import Phase, Verdict, VerdictName
from cockpit.link.connect import carrier_link
from cockpit.link.slurm import NodePids, SlurmNodeLink, find_job
from cockpit.link.target import Target
from cockpit.monitor.base import MonitorBase, MonitorEvent, rules_for, watchdog_for
from cockpit.monitor.host import HostMonitor
from cockpit.runs.config import Layout
from cockpit.runs.run import Run

STRIDE = 10_000_000  # above Linux's largest pid_max (2**22)
GPU_STRIDE = 1000
REFRESH_PIDS_S = 10.0  # a step started later in the job (a relaunch) is found this often
NODE_RANK_FLAGS = ("--node-rank", "--node_rank")


def node_of(key: int) -> tuple[int, int]:
    """(node number, the node's own pid) of a merged pid."""
    return divmod(key, STRIDE)


@dataclass(eq=False)
class NodeVerdict(Verdict):
    """The verdict of a run spanning nodes: the odd rank comes with its node."""

    odd_node: str | None = None

    def __str__(self) -> str:
        if self.odd_rank is None:
            return str(self.name)
        where = f" on node {self.odd_node}" if self.odd_node else ""
        return f"{self.name} (rank {self.odd_rank}{where})"

    def doc(self) -> dict:
        return {**super().doc(), "odd_node": self.odd_node}


class Node:
    def __init__(self, number: int, name: str, target: Target):
        self.number = number
        self.name = name
        self.target = target
        self.monitor: HostMonitor | None = None
        self.pids = NodePids()
        self.error: str | None = None  # why its agent could not start

    @property
    def status(self) -> str:
        if self.error:
            return f"no agent: {self.error}"
        if self.monitor is None:
            return "starting"
        s = self.monitor.session
        if s.state.link_state == "up":
            return "up"
        return f"{s.state.link_state}" + (f": {s.lost_reason or s.link_error}" if (s.lost_reason or s.link_error) else "")


def _flag(argv: list[str], names: tuple[str, ...]) -> int | None:
    for i, a in enumerate(argv):
        name, eq, value = a.partition("=")
        if name in names:
            value = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
            if value.isdigit():
                return int(value)
    return None


class ClusterState(HostState):
    """The nodes' states as one (see the module's doc); rebuilt on each node's sample."""

    def __init__(self, target: str, history: int = HISTORY_LEN, rules=None):
        super().__init__(target, history, rules)
        self.node_names: dict[int, str] = {}
        self.gpu_labels: dict[int, str] = {}
        self.rebuilt = asyncio.Event()  # set (and replaced) by each rebuild: what waits for samples wakes on

    def rebuild(self, nodes: list[Node]) -> None:
        procs, gpus, ports, logs, cpu_hist, gpu_hist = {}, {}, [], {}, {}, {}
        xid: list = []
        warnings: list[str] = []
        live = [n for n in nodes if n.monitor is not None and n.monitor.state.seq]
        for n in nodes:
            if n.status != "up":
                warnings.append(f"node {n.name}: {n.status}")
        self.node_names = {n.number: n.name for n in nodes}
        for n in live:
            st, k = n.monitor.state, n.number
            base = k * STRIDE
            steps = dict(n.pids.steps)
            for pid, p in sorted(st.procs.items()):
                q = copy.copy(p)
                q.pid, q.ppid = base + pid, base + p.ppid if p.ppid else 0
                q.pgid = base + p.pgid if p.pgid else p.pgid
                q.sid = base + p.sid if p.sid else p.sid
                q.gpus = [k * GPU_STRIDE + i for i in p.gpus]
                q.last_gpus = [k * GPU_STRIDE + i for i in p.last_gpus]
                q.node, q.node_pid = n.name, pid
                q.step = steps.get(pid) or steps.get(p.ppid)
                if q.step is not None:
                    steps.setdefault(pid, q.step)
                procs[q.pid] = q
                if pid in st.proc_cpu_history:
                    cpu_hist[q.pid] = st.proc_cpu_history[pid]
            for i, g in sorted(st.gpus.items()):
                h = copy.copy(g)
                h.index = k * GPU_STRIDE + i
                h.processes = [(base + pid, mib) for pid, mib in g.processes]
                h.label = f"{n.name}:{i}"
                gpus[h.index] = h
                self.gpu_labels[h.index] = h.label
                if i in st.gpu_history:
                    gpu_hist[h.index] = st.gpu_history[i]
            xid += [dataclasses.replace(e, gpu=None if e.gpu is None else k * GPU_STRIDE + e.gpu) for e in st.xid]
            ports += [PortState(pt.port, pt.listening, base + pt.pid if pt.pid else None) for pt in st.ports]
            for path, log in st.logs.items():
                if path in n.monitor.session.watch.logs:  # the one it follows now (not one it followed first)
                    logs[f"{n.name}:{path}"] = log
            while st.notes:
                self.notes.append(f"node {n.name}: {st.notes.popleft()}")
            warnings += [f"node {n.name}: {w}" for w in st.agent.warnings]
        self._global_ranks(procs, live)
        self.procs, self.gpus, self.ports, self.logs = procs, gpus, ports, logs
        self.xid = sorted(xid, key=lambda e: e.ts)[-XID_KEPT:]  # each node's Xids, on the job's GPU numbers
        self.proc_cpu_history, self.gpu_history = cpu_hist, gpu_hist
        if live:
            first = live[0].monitor.state
            self.agent = copy.copy(first.agent)
            self.agent.hostname = ",".join(n.name for n in nodes)
            self.agent.warnings = warnings
            self.seq += 1
            self.sample_ts = max(n.monitor.state.sample_ts or 0.0 for n in live)
            self.received_at = max(n.monitor.state.received_at or 0.0 for n in live)
            self.generation = sum(n.monitor.state.generation for n in live)
        else:
            self.agent = AgentInfo(hostname=",".join(n.name for n in nodes), warnings=warnings)
        up = [n for n in nodes if n.status == "up"]
        self.link_state = "up" if up else ("lost" if any(n.monitor and n.monitor.session.ever_up for n in nodes)
                                           else "connecting")
        done, self.rebuilt = self.rebuilt, asyncio.Event()
        done.set()

    @staticmethod
    def _global_ranks(procs: dict, live: list[Node]) -> None:
        """Ranks numbered per node (each node's 0..k-1) become global: node rank * ranks per node
        + local rank. Titles already global (no rank repeats across nodes) are kept."""
        by_node: dict[str, list] = {}
        for p in procs.values():
            if p.rank is not None:
                by_node.setdefault(p.node, []).append(p)
        seen: dict[int, str] = {}
        repeats = False
        for name, ranks in by_node.items():
            for r in {p.rank for p in ranks}:
                repeats |= r in seen and seen[r] != name
                seen[r] = name
        for p in procs.values():
            p.local_rank = p.rank
        if not repeats:
            return
        per_node = max(len({p.rank for p in ranks}) for ranks in by_node.values())
        order = {n.name: i for i, n in enumerate(live)}
        for name, ranks in by_node.items():
            node_rank = next((r for p in procs.values() if p.node == name and p.role == "server" and p.cmdline
                              for r in [_flag(p.cmdline, NODE_RANK_FLAGS)] if r is not None), order.get(name, 0))
            for p in ranks:
                p.rank = node_rank * per_node + p.local_rank


class ClusterSession:
    """What the screen, the actions and the CLI use of a HostSession, over every node: commands
    are split by node (merged pids back to each node's own) and the answers merged."""

    def __init__(self, cluster: ClusterMonitor):
        self.cluster = cluster
        self.watch = WatchList(patterns=[])
        self.errors: list[str] = []
        self.link = None
        self.ever_up = False
        self._error: str | None = None

    # what the screen reads
    @property
    def target(self) -> Target:
        return self.cluster.target

    @property
    def opts(self) -> SessionOptions:
        return self.cluster.opts

    @property
    def state(self) -> ClusterState:
        return self.cluster.state

    @property
    def trust_warnings(self) -> list[str]:
        return []

    @property
    def link_error(self) -> str | None:
        down = [f"{n.name}: {n.status}" for n in self.cluster.nodes if n.status != "up"]
        if down and len(down) == len(self.cluster.nodes):
            return "; ".join(down)
        return None if self.cluster.nodes else self._error

    @link_error.setter
    def link_error(self, value: str | None) -> None:  # the fleet's row: why the job could not be opened
        self._error = value

    @property
    def lost_reason(self) -> str | None:
        return self.link_error

    @property
    def reconnects(self) -> int:
        return sum(n.monitor.session.reconnects for n in self.cluster.nodes if n.monitor)

    def _up(self) -> list[Node]:
        return [n for n in self.cluster.nodes if n.monitor is not None and n.status == "up"]

    def _split(self, pids) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for key in pids or []:
            k, pid = node_of(int(key))
            out.setdefault(k, []).append(pid)
        return out

    def _batch(self, k: int) -> set[int]:
        """The node's batch-script processes: never in a kill (the script ends the job itself)."""
        node = self.cluster.by_number(k)
        return {p.node_pid for p in self.state.procs.values()
                if getattr(p, "node", None) == node.name and getattr(p, "step", None) == "batch"}

    async def request(self, cmd: str, timeout: float = 30.0, **args) -> dict:
        nodes = self._up()
        if not nodes:
            raise LinkLost("no node of the job is connected")
        if cmd == "kill_plan":
            return await self._kill_plan(args, timeout)
        if cmd == "kill":
            return await self._kill(args, timeout)
        if cmd == "dump":
            return await self._dump(args, timeout)
        return await nodes[0].monitor.session.request(cmd, timeout=timeout, **args)

    async def _kill_plan(self, args: dict, timeout: float) -> dict:
        """The run of a Slurm job is the job's processes on each node (`scontrol listpids`, which
        each node's agent watches), less the batch script: each node's agent plans those pids (and
        what they started, as their user). Explicit pids (`k`, `--pid`) plan just those."""
        asked = self._split(args.get("pids")) if args.get("pids") else None
        plan = []
        for n in self._up():
            k, base, batch = n.number, n.number * STRIDE, self._batch(n.number)
            if asked is not None:
                pids = [p for p in asked.get(k, []) if p not in batch]
            else:
                pids = sorted(p.node_pid for p in self.state.procs.values()
                              if getattr(p, "node", None) == n.name and p.alive and p.node_pid not in batch)
            if not pids:
                continue
            data = await n.monitor.session.request("kill_plan", timeout=timeout, pids=pids)
            for e in data["plan"]:
                if e["pid"] in batch:
                    continue
                plan.append({**e, "pid": base + e["pid"], "ppid": base + e["ppid"], "pgid": base + e["pgid"],
                             "sid": base + e["sid"], "title": f"[{n.name}] {e['title']}"})
        return {"plan": plan, "rule": None if asked is not None else f"the processes of Slurm job {self.cluster.target.text}"}

    async def _kill(self, args: dict, timeout: float) -> dict:
        by_node: dict[int, list[dict]] = {}
        for e in args["plan"]:
            k, pid = node_of(e["pid"])
            base = k * STRIDE
            by_node.setdefault(k, []).append({**e, "pid": pid, **{key: e[key] - base for key in ("ppid", "pgid", "sid")
                                                                   if isinstance(e.get(key), int)}})
        pgids, sids = self._split(args.get("pgids")), self._split(args.get("sids"))

        async def one(k: int, plan: list[dict]) -> tuple[Node, dict]:
            n = self.cluster.by_number(k)
            base = k * STRIDE
            batch_groups = {p.pgid - base for p in self.state.procs.values()
                            if getattr(p, "node", None) == n.name and p.node_pid in self._batch(k) and p.pgid}
            try:
                rep = await n.monitor.session.request(
                    "kill", timeout=timeout, plan=plan, wait_s=args.get("wait_s", 10.0), ports=args.get("ports", []),
                    pgids=[g for g in pgids.get(k, []) if g not in batch_groups],
                    sids=[s for s in sids.get(k, []) if s not in batch_groups], pids=[e["pid"] for e in plan])
                note = f"node {n.name}: checked by its agent"
            except LinkLost:
                rep = await self.cluster.verify_gone(n, plan)
                note = rep.pop("note")
            out = {key: [base + p for p in rep.get(key, [])] for key in ("term", "killed", "vanished", "remaining")}
            out["gpu_memory_left"] = [{**g, "gpu": f"{n.name}:{g['gpu']}", "pid": f"{n.name}:{g['pid']}"}
                                      for g in rep.get("gpu_memory_left", [])]
            out["ports_open"] = [f"{n.name}:{p}" for p in rep.get("ports_open", [])]
            out["gpus_after"] = [{**g, "index": f"{n.name}:{g['index']}"} for g in rep.get("gpus_after", [])]
            out["note"] = note + ("" if not out["remaining"] else f": {len(out['remaining'])} left")
            return n, out

        results = await asyncio.gather(*(one(k, plan) for k, plan in sorted(by_node.items())))
        report = {"term": [], "killed": [], "vanished": [], "remaining": [], "gpu_memory_left": [], "ports_open": [],
                  "gpus_after": [], "notes": [], "nodes": {}}
        for n, rep in results:
            for key in ("term", "killed", "vanished", "remaining", "gpu_memory_left", "ports_open", "gpus_after"):
                report[key] += rep[key]
            report["notes"].append(rep["note"])
            report["nodes"][n.name] = {"remaining": [node_of(p)[1] for p in rep["remaining"]], "note": rep["note"]}
        return report

    async def _dump(self, args: dict, timeout: float) -> dict:
        out: dict = {"dumps": {}, "check": None}
        for k, pids in sorted(self._split(args.get("pids")).items()):
            n = self.cluster.by_number(k)
            data = await n.monitor.session.request("dump", timeout=timeout, **{**args, "pids": pids})
            out["check"] = out["check"] or data.get("check")
            for pid, d in (data.get("dumps") or {}).items():
                out["dumps"][str(k * STRIDE + int(pid))] = d
        return out

    def watch_current(self) -> bool:
        return all(n.monitor.session.watch_current() for n in self._up())

    @property
    def watch_changing(self) -> bool:
        return any(n.monitor.session.watch_changing for n in self._up())

    def watch_run(self, pgid: int | None, log: str | None) -> None:
        """A run spanning nodes is its job's processes on each node: no one process group."""
        raise CockpitError(f"{self.target.label}: a run spanning nodes is followed by its job, not a process group")

    async def wait_samples(self, n: int = 1, timeout: float = 30.0) -> None:
        start = self.state.seq
        deadline = time.monotonic() + timeout
        while self.state.seq < start + n * max(1, len(self._up())):
            if not self._up():
                raise LinkLost(f"no node of {self.target.label} is connected")
            left = deadline - time.monotonic()
            if left <= 0:
                raise CockpitError(f"no sample from {self.target.label} in {timeout:.0f} s")
            try:  # woken by each node's sample; a node lost wakes nothing, so the nodes are looked at each second
                await asyncio.wait_for(self.state.rebuilt.wait(), min(left, 1.0))
            except asyncio.TimeoutError:
                pass

    async def ping(self) -> float:
        return 0.0

    async def follow_log(self, path: str) -> None:
        node, _, own = path.partition(":")
        for n in self._up():
            if n.name == node:
                await n.monitor.session.follow_log(own)


class ClusterMonitor(MonitorBase):
    """The HostMonitor of a run spanning nodes (see the module's doc)."""

    def __init__(self, target: Target, opts: SessionOptions | None = None, layout: Layout | None = None,
                 history: int = HISTORY_LEN, refresh_pids_s: float = REFRESH_PIDS_S):
        self.target = target
        self.opts = opts or SessionOptions()
        self.layout = layout
        self.rules = rules_for(layout)
        self.history = history
        self.state = ClusterState(target.label, history=history, rules=self.rules)
        self.session = ClusterSession(self)
        self.watchdog = watchdog_for(layout)
        self.phase = Phase("no run")
        self.verdict: Verdict = NodeVerdict(VerdictName.WATCHING, [])
        self.probes: dict = {}
        self.run = Run(layout)
        self.stopping: str | None = None
        self.nodes: list[Node] = []
        self.job = None
        self.refresh_pids_s = refresh_pids_s
        self._listeners: list[Callable[[MonitorEvent], None]] = []
        self._jobs_link: SlurmNodeLink | None = None
        self.shm_held: dict[tuple, float] = {}  # a run spanning nodes: its nodes' files are not remembered

    def by_number(self, k: int) -> Node:
        return self.nodes[k - 1]

    def _on_node_event(self, node: Node, event: MonitorEvent) -> None:
        if event.kind == "sample":
            self.state.rebuild(self.nodes)
            self.update()
            self._emit(MonitorEvent("sample"))
        elif event.kind == "log" and event.path:
            self._emit(MonitorEvent("log", path=f"{node.name}:{event.path}", lines=event.lines))

    # ------------------------------------------------------------------ judging

    def update(self, now: float | None = None) -> None:
        state = self.state
        if not state.seq or state.link_state != "up" or not self._judgeable():
            return
        before = self.verdict
        phase, v = self.watchdog.update(state, now if now is not None else time.monotonic())
        odd_node = None
        evidence = list(v.evidence)
        if v.odd_rank is not None:
            holders = [p for p in state.procs.values() if p.rank == v.odd_rank]
            if holders:
                p = holders[0]
                odd_node = getattr(p, "node", None)
                evidence.insert(0, f"rank {v.odd_rank} is on node {odd_node} (pid {p.node_pid} there"
                                   + (f", Slurm step {self.job.id}.{p.step}" if getattr(p, "step", None) and self.job
                                      else "") + ")")
        down = [f"node {n.name}: {n.status}" for n in self.nodes if n.status != "up"]
        evidence = down + evidence
        self.phase, self.verdict = phase, NodeVerdict(v.name, evidence, v.odd_rank, v.detail, v.since, v.until,
                                                      odd_node=odd_node)
        if self.stopping:
            self.verdict = NodeVerdict(VerdictName.STOPPING, [self.stopping])
        if self.verdict.name != before.name or self.verdict.odd_rank != before.odd_rank:
            self._emit(MonitorEvent("verdict", before=before))

    def new_run(self, started: float | None = None, resumed: bool = False) -> None:
        """As on one host (HostMonitor.new_run): the last run's dead ranks, on every node, and its
        log lines are history; the state is rebuilt from the nodes' on their next sample."""
        for n in self.nodes:
            if n.monitor is not None:
                n.monitor.state.forget_dead()
        self._judge_afresh(started, resumed)
        self.verdict = NodeVerdict(VerdictName.WATCHING, [])

    def run_ended(self) -> None:
        """The operator's kill of the whole job's run, verified on every node: no run until one
        starts, also while a node's agent still sends samples before the job's end takes it down."""
        before = self.verdict
        self.follow(None)
        self.watchdog.end()
        self.phase, self.verdict = Phase("no run"), NodeVerdict(VerdictName.NO_RUN, [])
        self._emit(MonitorEvent("verdict", before=before))

    @contextmanager
    def stopping_for(self, why: str, plan=None):
        self.stopping = why
        try:
            yield
        finally:
            self.stopping = None

    def replayed(self) -> tuple[Phase, Verdict]:
        return self.phase, self.verdict

    # ------------------------------------------------------------------ lifecycle

    async def open(self, kept: bool = False) -> None:
        """Find the job's nodes, then start an agent on each (concurrently); a node whose agent
        cannot start is shown as such, and only all of them failing is an error. `kept` as in
        HostMonitor.open."""
        self._jobs_link = SlurmNodeLink(carrier_link(self.target, self.opts), self.target,
                                        self.target.carrier().label if self.target.remote else "this machine")
        await self._jobs_link.carrier.connect()
        self.job = await find_job(self._jobs_link, self.target.name)
        self.nodes = [Node(i + 1, name, self.target.on_node(name)) for i, name in enumerate(self.job.nodes)]
        results = await asyncio.gather(*(self._open_node(n, kept) for n in self.nodes), return_exceptions=True)
        for n, res in zip(self.nodes, results):
            if isinstance(res, BaseException):
                if not isinstance(res, CockpitError):
                    raise res
                n.error, n.monitor = str(res), None
        if all(n.error for n in self.nodes):
            raise CockpitError(f"{self.target.label}: no agent started on any node: {self.nodes[0].error}")
        self.session.ever_up = True
        self.state.rebuild(self.nodes)

    async def _open_node(self, n: Node, kept: bool) -> None:
        probe = SlurmNodeLink(self._jobs_link.carrier, n.target, self._jobs_link.where)
        n.pids = await probe.job_pids()
        watch = WatchList(patterns=[], pids=n.pids.pids, logs=[self.layout.log] if self.layout and self.layout.log
                          else [], ports=list(self.layout.ports) if self.layout else [])
        opts = self.opts
        if opts.sim_state and "%n" in opts.sim_state:  # each node its own simulated GPUs (tests, demos)
            opts = dataclasses.replace(opts, sim_state=opts.sim_state.replace("%n", n.name))
        monitor = HostMonitor(n.target, opts, None, history=self.history, watch=watch)
        monitor.subscribe(lambda ev, n=n: self._on_node_event(n, ev))
        n.monitor = monitor
        try:
            await monitor.open(kept=kept)
            if not (self.layout and self.layout.log):
                await self._find_log(n)
        except BaseException:
            await monitor.close()
            raise

    async def _find_log(self, n: Node) -> None:
        """The node's server's output file: a server of a job step, not the batch script's srun
        (whose output is the job's, shared by every node)."""
        st = n.monitor.state
        servers = sorted(p.pid for p in st.procs.values() if p.alive and p.role == "server"
                         and n.pids.steps.get(p.pid) != "batch" and n.pids.steps.get(p.ppid) != "batch")
        if not servers:
            return
        found = await n.monitor.session.request("stdout_of", pids=servers[:16])
        path = next((found[str(pid)] for pid in servers if str(pid) in found), None)
        if path:
            await n.monitor.session.follow_log(path)

    async def refresh_pids(self) -> None:
        """Steps started in the job since (a relaunch): each node's agent is told the new pids."""
        for n in self.nodes:
            if n.monitor is None or n.status != "up":
                continue
            try:
                probe = SlurmNodeLink(self._jobs_link.carrier, n.target, self._jobs_link.where)
                found = await probe.job_pids()
            except CockpitError:
                continue
            if set(found.pids) - set(n.pids.pids):
                n.pids = found
                n.monitor.session.watch.pids = found.pids
                await n.monitor.session.request("config", **n.monitor.session.watch.args())

    async def verify_gone(self, n: Node, plan: list[dict]) -> dict:
        """A node's agent went down during the kill (the job ended as its steps died): Slurm ends
        every process of an ended job on every node, so the job's state is the check."""
        pids = [e["pid"] for e in plan]
        try:
            job = await find_job(self._jobs_link, self.target.name)
            state = job.state
        except CockpitError as exc:
            state = "ended" if "no such job" in str(exc) or "not RUNNING" in str(exc) else None
        if state == "RUNNING" or state is None:
            return {"remaining": pids, "note": f"node {n.name}: its agent's link dropped and job {self.target.name} "
                                               f"still runs: not verified"}
        return {"term": pids, "remaining": [], "note": f"node {n.name}: job {self.target.name} ended with its steps, "
                                                       f"Slurm ended what was left of it"}

    async def keep(self, retry_first: bool = False) -> None:
        attempt = 0
        while retry_first and not self.nodes:  # the job was not found or not running yet: retried
            attempt += 1
            self.state.link_state = f"down, retrying ({attempt})"
            await asyncio.sleep(min(30.0, 2.0 ** (attempt - 1)))
            try:
                await self.open(kept=True)
            except CockpitError as exc:
                self.session.link_error = str(exc)
                await self.close()
                self.nodes = []
        tasks = [n.monitor.keep(retry_first=retry_first) for n in self.nodes if n.monitor is not None]

        async def refresh():
            while True:
                await asyncio.sleep(self.refresh_pids_s)
                await self.refresh_pids()

        await asyncio.gather(*tasks, refresh())

    async def close(self) -> None:
        await asyncio.gather(*(n.monitor.close() for n in self.nodes if n.monitor is not None),
                             return_exceptions=True)
        if self._jobs_link is not None:
            await self._jobs_link.carrier.close()

    @asynccontextmanager
    async def attached(self, samples: int = 1):
        await self.open()
        try:
            await self.session.wait_samples(samples)
            await self.wait_current()
            yield self
        finally:
            await self.close()

    async def watch_for(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            await asyncio.sleep(min(0.1, max(0.0, deadline - time.monotonic())))

    def doc_extra(self) -> dict:
        """What `snapshot --json` adds for a run spanning nodes (docs/targets.md)."""
        nodes = []
        for n in self.nodes:
            procs = [p for p in self.state.procs.values() if getattr(p, "node", None) == n.name]
            nodes.append({"name": n.name, "status": n.status, "pids": n.pids.pids,
                          "ranks": sorted(p.rank for p in procs if p.rank is not None and p.alive),
                          "gpus": sorted(label for label in self.state.gpu_labels.values()
                                         if label.startswith(n.name + ":"))})
        return {"job": None if self.job is None else {"id": self.job.id, "state": self.job.state,
                                                      "nodes": self.job.nodes, "batch_host": self.job.batch_host},
                "nodes": nodes}
