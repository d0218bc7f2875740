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
processes, carried out by each node's agent and verified on each.

A run's life is the node HostMonitors' (one rule, one home): each follows the layout's run on its
node (resumed, or a new run started elsewhere adopted: the cluster follows what a node adopted,
judged afresh), reads the stops in its host's record (`stopped`, then `no run` once every node's
part ended), remembers the /dev/shm files its run held (a clean acts on the node that held them);
a stall on the merged state gathers every rank's stacks as one host's does (HostMonitor's stall
forensics, read over the nodes' records and ranks merged)."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from contextlib import ExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any

from cockpit.actions.kill import KillPlan
from cockpit.common.errors import CockpitError, LinkLost
from cockpit.host.session import SessionOptions, WatchList
from cockpit.host.state import HISTORY_LEN, XID_KEPT, AgentInfo, HostState, PortState, Proc
from cockpit.judge.verdict import Phase, Verdict, VerdictName
from cockpit.link.connect import carrier_link
from cockpit.link.slurm import Job, NodePids, SlurmNodeLink, find_job
from cockpit.link.target import Target
from cockpit.monitor.base import MonitorBase, MonitorEvent, OperatorKill, rules_for, watchdog_for
from cockpit.monitor.host import HostMonitor
from cockpit.read.logrules import LogRules
from cockpit.runs.config import Layout
from cockpit.runs.run import Run

STRIDE = 10_000_000  # above Linux's largest pid_max (2**22)
GPU_STRIDE = 1000
DEV_STRIDE = 1 << 48  # a node's /dev/shm device number on the job's numbers: node * DEV_STRIDE + dev
REFRESH_PIDS_S = 10.0  # a step started later in the job (a relaunch) is found this often
NODE_RANK_FLAGS = ("--node-rank", "--node_rank")
# agent commands a job answers from its first node: one host's facts (py-spy there, the host's
# errors and metrics) and a launch, which starts on the node the operator's cockpit reaches first
FIRST_NODE = frozenset(
    {"dump_check", "host_facts", "ras", "metrics", "find_runs", "launch_check", "launch", "stdout_of"}
)


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

    def doc(self) -> dict[str, Any]:
        return {**super().doc(), "odd_node": self.odd_node}


class NodeMonitor(HostMonitor):
    """One node's part of the job's run: a HostMonitor (its rules, its run's life on the node);
    the run's history in the ledger is the job's verdict, never a part's."""

    def _emit(self, event: MonitorEvent) -> None:
        for fn in list(self._listeners):
            fn(event)


class Node:
    def __init__(self, number: int, name: str, target: Target):
        self.number = number
        self.name = name
        self.target = target
        self.monitor: NodeMonitor | None = None
        self.pids = NodePids()
        self.error: str | None = None  # why its agent could not start
        self.ended = False  # its part of the run ended by a stop its host records (its monitor's run_ended)

    @property
    def host(self) -> NodeMonitor:
        """Its HostMonitor, once its agent started (the nodes a cluster acts through)."""
        if self.monitor is None:
            raise LinkLost(f"node {self.name}: no agent")
        return self.monitor

    @property
    def status(self) -> str:
        if self.error:
            return f"no agent: {self.error}"
        if self.monitor is None:
            return "starting"
        s = self.monitor.session
        if s.state.link_state == "up":
            return "up"
        return f"{s.state.link_state}" + (
            f": {s.lost_reason or s.link_error}" if (s.lost_reason or s.link_error) else ""
        )


def _flag(argv: list[str], names: tuple[str, ...]) -> int | None:
    for i, a in enumerate(argv):
        name, eq, value = a.partition("=")
        if name in names:
            value = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
            if value.isdigit():
                return int(value)
    return None


def _merged_act(rec: dict[str, Any], n: Node) -> dict[str, Any]:
    """A node's host record with its pids on the job's numbers (the merged state's), its id
    named with the node."""
    base = n.number * STRIDE
    out = dict(rec, id=f"{n.name}:{rec['id']}", node=n.name)
    if isinstance(rec.get("processes"), list):
        out["processes"] = [
            [base + item[0], *item[1:]] if isinstance(item, list) and item and isinstance(item[0], int) else item
            for item in rec["processes"]
        ]
    if isinstance(rec.get("pgids"), list):
        out["pgids"] = [base + g if isinstance(g, int) else g for g in rec["pgids"]]
    for key in ("pgid", "pid"):
        if isinstance(rec.get(key), int):
            out[key] = base + rec[key]
    return out


class ClusterState(HostState):
    """The nodes' states as one (see the module's doc); rebuilt on each node's sample."""

    def __init__(self, target: str, history: int = HISTORY_LEN, rules: LogRules | None = None):
        super().__init__(target, history, rules)
        self.node_names: dict[int, str] = {}
        self.gpu_labels: dict[int, str] = {}
        self.rebuilt = asyncio.Event()  # set (and replaced) by each rebuild: what waits for samples wakes on

    def rebuild(self, nodes: list[Node]) -> None:
        procs, gpus, ports, logs, cpu_hist, gpu_hist = {}, {}, [], {}, {}, {}
        xid: list[Any] = []
        acts: dict[str, dict[str, Any]] = {}
        warnings: list[str] = []
        live = [n for n in nodes if n.monitor is not None and n.monitor.state.seq]
        for n in nodes:
            if n.status != "up":
                warnings.append(f"node {n.name}: {n.status}")
        self.node_names = {n.number: n.name for n in nodes}
        for n in live:
            st, k = n.host.state, n.number
            base = k * STRIDE
            steps = dict(n.pids.steps)
            for pid, p in sorted(st.procs.items()):
                q = copy.copy(p)
                q.pid, q.ppid = base + pid, base + p.ppid if p.ppid else 0
                q.pgid = base + p.pgid if p.pgid else p.pgid
                q.sid = base + p.sid if p.sid else p.sid
                q.gpus = [k * GPU_STRIDE + i for i in p.gpus]
                q.last_gpus = [k * GPU_STRIDE + i for i in p.last_gpus]
                step = steps.get(pid) or steps.get(p.ppid)
                for field, value in (("node", n.name), ("node_pid", pid), ("step", step)):
                    setattr(q, field, value)  # what a job's process adds to a host's (docs/targets.md)
                if step is not None:
                    steps.setdefault(pid, step)
                procs[q.pid] = q
                if pid in st.proc_cpu_history:
                    cpu_hist[q.pid] = st.proc_cpu_history[pid]
            for i, g in sorted(st.gpus.items()):
                h = copy.copy(g)
                h.index = k * GPU_STRIDE + i
                h.processes = [(base + pid, mib) for pid, mib in g.processes]
                label = f"{n.name}:{i}"
                setattr(h, "label", label)  # noqa: B010 - a node's GPU carries its label beside the Gpu fields
                gpus[h.index] = h
                self.gpu_labels[h.index] = label
                if i in st.gpu_history:
                    gpu_hist[h.index] = st.gpu_history[i]
            xid += [dataclasses.replace(e, gpu=None if e.gpu is None else k * GPU_STRIDE + e.gpu) for e in st.xid]
            ports += [PortState(pt.port, pt.listening, base + pt.pid if pt.pid else None) for pt in st.ports]
            for path, log in st.logs.items():
                if path in n.host.session.watch.logs:  # the one it follows now (not one it followed first)
                    logs[f"{n.name}:{path}"] = log
            for rec in st.acts.values():
                acts[f"{n.name}:{rec['id']}"] = _merged_act(rec, n)
            while st.notes:
                self.notes.append(f"node {n.name}: {st.notes.popleft()}")
            warnings += [f"node {n.name}: {w}" for w in st.agent.warnings]
        self._global_ranks(procs, live)
        self.procs, self.gpus, self.ports, self.logs = procs, gpus, ports, logs
        self.xid = sorted(xid, key=lambda e: e.ts)[-XID_KEPT:]  # each node's Xids, on the job's GPU numbers
        self.proc_cpu_history, self.gpu_history = cpu_hist, gpu_hist
        self.acts = dict(sorted(acts.items(), key=lambda kv: kv[1].get("at") or 0.0))
        if live:
            first = live[0].host.state
            self.agent = copy.copy(first.agent)
            self.agent.hostname = ",".join(n.name for n in nodes)
            self.agent.warnings = warnings
            self.seq += 1
            self.sample_ts = max(n.host.state.sample_ts or 0.0 for n in live)
            self.received_at = max(n.host.state.received_at or 0.0 for n in live)
            self.generation = sum(n.host.state.generation for n in live)
        else:
            self.agent = AgentInfo(hostname=",".join(n.name for n in nodes), warnings=warnings)
        up = [n for n in nodes if n.status == "up"]
        self.link_state = (
            "up" if up else ("lost" if any(n.monitor and n.monitor.session.ever_up for n in nodes) else "connecting")
        )
        done, self.rebuilt = self.rebuilt, asyncio.Event()
        done.set()

    @staticmethod
    def _global_ranks(procs: dict[int, Proc], live: list[Node]) -> None:
        """Ranks numbered per node (each node's 0..k-1) become global: node rank * ranks per node
        + local rank. Titles already global (no rank repeats across nodes) are kept."""
        by_node: dict[str, list[Proc]] = {}
        for p in procs.values():
            if p.rank is not None:
                by_node.setdefault(getattr(p, "node", ""), []).append(p)
        seen: dict[int, str] = {}
        repeats = False
        for name, ranks in by_node.items():
            for r in {p.rank for p in ranks if p.rank is not None}:
                repeats |= r in seen and seen[r] != name
                seen[r] = name
        for p in procs.values():
            setattr(p, "local_rank", p.rank)  # noqa: B010 - the node's own rank, kept beside the job's
        if not repeats:
            return
        per_node = max(len({p.rank for p in ranks}) for ranks in by_node.values())
        order = {n.name: i for i, n in enumerate(live)}
        for name, ranks in by_node.items():
            node_rank = next(
                (
                    r
                    for p in procs.values()
                    if getattr(p, "node", None) == name and p.role == "server" and p.cmdline
                    for r in [_flag(p.cmdline, NODE_RANK_FLAGS)]
                    if r is not None
                ),
                order.get(name, 0),
            )
            for p in ranks:
                p.rank = node_rank * per_node + getattr(p, "local_rank")  # noqa: B009


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

    def _split(self, pids: Iterable[Any] | None) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for key in pids or []:
            k, pid = node_of(int(key))
            out.setdefault(k, []).append(pid)
        return out

    def _batch(self, k: int) -> set[int]:
        """The node's batch-script processes: never in a kill (the script ends the job itself)."""
        node = self.cluster.by_number(k)
        return {
            q
            for p in self.state.procs.values()
            if getattr(p, "node", None) == node.name and getattr(p, "step", None) == "batch"
            for q in [getattr(p, "node_pid", None)]
            if isinstance(q, int)
        }

    async def request(self, cmd: str, timeout: float = 30.0, **args: Any) -> dict[str, Any]:
        """A command of the job: spread over its nodes (FANNED) or asked of its first node
        (FIRST_NODE); any other is an error naming it, never sent anywhere."""
        fanned = self._fanned.get(cmd)
        if fanned is None and cmd not in FIRST_NODE:
            raise CockpitError(
                f"a Slurm job's cockpit has no command {cmd!r}: it spreads "
                f"{', '.join(sorted(self._fanned))} over the nodes and asks "
                f"{', '.join(sorted(FIRST_NODE))} of the first"
            )
        nodes = self._up()
        if not nodes:
            raise LinkLost("no node of the job is connected")
        if fanned is not None:
            return await fanned(args, timeout)
        return await nodes[0].host.session.request(cmd, timeout=timeout, **args)

    @property
    def _fanned(self) -> dict[str, Callable[[dict[str, Any], float], Awaitable[dict[str, Any]]]]:
        return {
            "kill_plan": self._kill_plan,
            "kill": self._kill,
            "dump": self._dump,
            "fr_dump": self._fr_dump,
            "note": self._note,
            "shm_audit": self._shm_audit,
            "shm_clean": self._shm_clean,
        }

    async def _kill_plan(self, args: dict[str, Any], timeout: float) -> dict[str, Any]:
        """The run of a Slurm job is the job's processes on each node (`scontrol listpids`, which
        each node's agent watches), less the batch script: each node's agent plans those pids (and
        what they started, as their user). Explicit pids (`k`, `--pid`) plan just those."""
        asked = self._split(args.get("pids")) if args.get("pids") else None
        plan, sessions = [], []
        for n in self._up():
            k, base, batch = n.number, n.number * STRIDE, self._batch(n.number)
            if asked is not None:
                pids = [p for p in asked.get(k, []) if p not in batch]
            else:
                pids = sorted(
                    q
                    for p in self.state.procs.values()
                    if getattr(p, "node", None) == n.name and p.alive
                    for q in [getattr(p, "node_pid", None)]
                    if isinstance(q, int) and q not in batch
                )
            if not pids:
                continue
            data = await n.host.session.request("kill_plan", timeout=timeout, pids=pids)
            batch_sids = {
                p.sid - base
                for p in self.state.procs.values()
                if getattr(p, "node", None) == n.name and getattr(p, "node_pid", None) in batch and p.sid
            }
            sessions += [base + s for s in data.get("sessions") or [] if s not in batch_sids]
            for e in data["plan"]:
                if e["pid"] in batch:
                    continue
                plan.append(
                    {
                        **e,
                        "pid": base + e["pid"],
                        "ppid": base + e["ppid"],
                        "pgid": base + e["pgid"],
                        "sid": base + e["sid"],
                        "title": f"[{n.name}] {e['title']}",
                    }
                )
        return {
            "plan": plan,
            "sessions": sessions,
            "rule": None if asked is not None else f"the processes of Slurm job {self.cluster.target.text}",
        }

    async def _kill(self, args: dict[str, Any], timeout: float) -> dict[str, Any]:
        by_node: dict[int, list[dict[str, Any]]] = {}
        for e in args["plan"]:
            k, pid = node_of(e["pid"])
            base = k * STRIDE
            by_node.setdefault(k, []).append(
                {
                    **e,
                    "pid": pid,
                    **{key: e[key] - base for key in ("ppid", "pgid", "sid") if isinstance(e.get(key), int)},
                }
            )
        pgids, sids = self._split(args.get("pgids")), self._split(args.get("sids"))
        sessions = self._split(args.get("sessions"))
        who = {
            key: args[key] for key in ("why", "by", "run_id", "whole") if key in args
        }  # each node's record of the stop

        async def one(k: int, plan: list[dict[str, Any]]) -> tuple[Node, dict[str, Any]]:
            n = self.cluster.by_number(k)
            base = k * STRIDE
            batch_groups = {
                p.pgid - base
                for p in self.state.procs.values()
                if getattr(p, "node", None) == n.name and getattr(p, "node_pid", None) in self._batch(k) and p.pgid
            }
            try:
                rep = await n.host.session.request(
                    "kill",
                    timeout=timeout,
                    plan=plan,
                    wait_s=args.get("wait_s", 10.0),
                    ports=args.get("ports", []),
                    pgids=[g for g in pgids.get(k, []) if g not in batch_groups],
                    sids=[s for s in sids.get(k, []) if s not in batch_groups],
                    pids=[e["pid"] for e in plan],
                    sessions=[s for s in sessions.get(k, []) if s not in batch_groups],
                    **who,
                )
                note = f"node {n.name}: checked by its agent"
            except LinkLost:
                rep = await self.cluster.verify_gone(n, plan)
                note = rep.pop("note")
            out: dict[str, Any] = {
                key: [base + p for p in rep.get(key, [])] for key in ("term", "killed", "vanished", "remaining")
            }
            out["gpu_memory_left"] = [
                {**g, "gpu": f"{n.name}:{g['gpu']}", "pid": f"{n.name}:{g['pid']}"}
                for g in rep.get("gpu_memory_left", [])
            ]
            out["ports_open"] = [f"{n.name}:{p}" for p in rep.get("ports_open", [])]
            out["gpus_after"] = [{**g, "index": f"{n.name}:{g['index']}"} for g in rep.get("gpus_after", [])]
            out["note"] = note + ("" if not out["remaining"] else f": {len(out['remaining'])} left")
            return n, out

        results = await asyncio.gather(*(one(k, plan) for k, plan in sorted(by_node.items())))
        report: dict[str, Any] = {
            "term": [],
            "killed": [],
            "vanished": [],
            "remaining": [],
            "gpu_memory_left": [],
            "ports_open": [],
            "gpus_after": [],
            "notes": [],
            "nodes": {},
        }
        for n, rep in results:
            for key in ("term", "killed", "vanished", "remaining", "gpu_memory_left", "ports_open", "gpus_after"):
                report[key] += rep[key]
            report["notes"].append(rep["note"])
            report["nodes"][n.name] = {"remaining": [node_of(p)[1] for p in rep["remaining"]], "note": rep["note"]}
        return report

    async def _dump(self, args: dict[str, Any], timeout: float) -> dict[str, Any]:
        out: dict[str, Any] = {"dumps": {}, "check": None}
        for k, pids in sorted(self._split(args.get("pids")).items()):
            n = self.cluster.by_number(k)
            data = await n.host.session.request("dump", timeout=timeout, **{**args, "pids": pids})
            out["check"] = out["check"] or data.get("check")
            for pid, d in (data.get("dumps") or {}).items():
                out["dumps"][str(k * STRIDE + int(pid))] = d
        return out

    async def _fr_dump(self, args: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Each node's ranks asked for their flight-recorder dumps there; the dumps (by rank) as one."""
        out: dict[str, Any] = {"ranks": {}, "poked": [], "problems": [], "armed": False, "triggered_at": None}
        for k, pids in sorted(self._split(args.get("pids")).items()):
            n = self.cluster.by_number(k)
            data = await n.host.session.request("fr_dump", timeout=timeout, **{**args, "pids": pids})
            out["ranks"].update(data.get("ranks") or {})
            out["poked"] += list(data.get("poked") or [])
            out["problems"] += [f"node {n.name}: {p}" for p in data.get("problems") or []]
            out["armed"] = out["armed"] or bool(data.get("armed"))
            out["triggered_at"] = out["triggered_at"] or data.get("triggered_at")
        return out

    async def _note(self, args: dict[str, Any], timeout: float) -> dict[str, Any]:
        """A record of the operator's (a stall's forensics) kept on each node holding a process it
        names, with that node's own pids; the first node's record answers, named as the merged
        state names it."""
        by_node: dict[int, list[Any]] = {}
        for item in args.get("processes") or []:
            k, pid = node_of(int(item[0]))
            by_node.setdefault(k, []).append([pid, *item[1:]])
        answer = None
        for k, items in sorted(by_node.items()):
            n = self.cluster.by_number(k)
            if n.monitor is None or n.status != "up":
                continue
            rec = await n.host.session.request("note", timeout=timeout, **{**args, "processes": items})
            answer = answer or _merged_act(rec, n)
        if answer is None:
            raise LinkLost("no node holding the run's processes is connected")
        return answer

    async def _shm_audit(self, args: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Each node's /dev/shm as one audit: an entry names its node, its file is its device on
        the job's numbers (two nodes' tmpfs share device numbers) and inode, the pids that hold it
        are the job's."""
        out: dict[str, Any] | None = None
        for n in self._up():
            base = n.number * STRIDE
            audit = await n.host.session.request("shm_audit", timeout=timeout, **args)
            entries = [
                {
                    **e,
                    "node": n.name,
                    "dev": n.number * DEV_STRIDE + e["dev"] if isinstance(e.get("dev"), int) else e.get("dev"),
                    "held_by": [base + p for p in e.get("held_by") or []],
                    "creator": base + e["creator"] if isinstance(e.get("creator"), int) else e.get("creator"),
                }
                for e in audit.get("entries") or []
            ]
            if out is None:
                out = {**audit, "entries": entries, "nodes": {}}
            else:
                out["entries"] += entries
            out["nodes"][n.name] = {k: audit.get(k) for k in ("free_bytes", "total_bytes", "unreadable")}
        return out or {}

    async def _shm_clean(self, args: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Each entry removed by the agent of the node that listed it (its device on the job's
        numbers), checked again there; a bare name is the first node's."""
        by_node: dict[int, list[Any]] = {}
        first = self._up()[0].number
        for item in args.get("names") or []:
            k = first
            if isinstance(item, dict) and isinstance(item.get("dev"), int) and item["dev"] >= DEV_STRIDE:
                k, dev = divmod(item["dev"], DEV_STRIDE)
                item = {**item, "dev": dev}
            by_node.setdefault(k, []).append(item)
        out: dict[str, Any] = {"removed": [], "skipped": [], "freed_bytes": 0}
        for n in self._up():
            if n.number not in by_node:
                continue
            done = await n.host.session.request("shm_clean", timeout=timeout, **{**args, "names": by_node[n.number]})
            out["removed"] += [f"{n.name}:{name}" for name in done.get("removed") or []]
            out["skipped"] += [{**s, "name": f"{n.name}:{s.get('name')}"} for s in done.get("skipped") or []]
            out["freed_bytes"] += done.get("freed_bytes") or 0
        return out

    def watch_current(self) -> bool:
        return all(n.host.session.watch_current() for n in self._up())

    @property
    def watch_changing(self) -> bool:
        return any(n.host.session.watch_changing for n in self._up())

    def watch_run(self, pgid: int | None, log: str | None, pids: list[int] | None = None) -> None:
        """A run spanning nodes is its job's processes on each node, or the run a node follows
        (its HostMonitor moved that node's watch when it followed it): no one process group."""
        if any(
            n.host.following is not None
            and (
                (pgid is not None and n.host.following.get("pgid") == pgid)
                or (pids and n.host.following.get("root") in pids)
            )
            for n in self.cluster._parts()
        ):
            return
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
                await n.host.session.follow_log(own)


class ClusterMonitor(MonitorBase):
    """The HostMonitor of a run spanning nodes (see the module's doc)."""

    state: ClusterState

    def __init__(
        self,
        target: Target,
        opts: SessionOptions | None = None,
        layout: Layout | None = None,
        history: int = HISTORY_LEN,
        refresh_pids_s: float = REFRESH_PIDS_S,
    ):
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
        self.probes: dict[tuple[int, str], dict[str, Any]] = {}
        self.run = Run(layout)
        self.stopping: str | None = None
        self.nodes: list[Node] = []
        self.job: Job | None = None
        self.refresh_pids_s = refresh_pids_s
        self._listeners: list[Callable[[MonitorEvent], None]] = []
        self._jobs_link: SlurmNodeLink | None = None
        # a stall's forensics, as on one host (the layout's auto_dump; off under --read-only)
        self.forensics_on = bool(layout.auto_dump) if layout is not None else False
        self._forensics_task: asyncio.Task[None] | None = None
        self._forensics_for: tuple[object, ...] | None = None

    def by_number(self, k: int) -> Node:
        return self.nodes[k - 1]

    def _parts(self) -> list[Node]:
        return [n for n in self.nodes if n.monitor is not None]

    @property
    def shm_held(self) -> dict[tuple[int, int], float]:
        """The /dev/shm files each node's run held (its HostMonitor remembers them), keyed as the
        merged audit names them: (the device on the job's numbers, inode)."""
        return {
            (n.number * DEV_STRIDE + dev, ino): seen
            for n in self._parts()
            for (dev, ino), seen in n.host.shm_held.items()
        }

    def kills(self) -> dict[int, OperatorKill]:
        """The operator's kills each node's HostMonitor knows (this cockpit's, and the stops its
        host's record holds), on the job's pids."""
        return {
            n.number * STRIDE + pid: dataclasses.replace(k, pid=n.number * STRIDE + pid)
            for n in self._parts()
            for pid, k in n.host.operator_kills.items()
        }

    def _on_node_event(self, node: Node, event: MonitorEvent) -> None:
        if event.kind == "sample":
            self.state.rebuild(self.nodes)
            self._follow_nodes()
            self.update()
            self._emit(MonitorEvent("sample"))
        elif event.kind == "log" and event.path:
            self._emit(MonitorEvent("log", path=f"{node.name}:{event.path}", lines=event.lines))
        elif (
            event.kind == "verdict"
            and node.host.verdict.name == VerdictName.NO_RUN
            and event.before is not None
            and event.before.name != VerdictName.NO_RUN
        ):
            node.ended = True  # its part of the run ended by a stop its host records (HostMonitor._ended_elsewhere)

    def _follow_nodes(self, resumed: bool = False) -> None:
        """A node followed a run the cluster does not (adopted after the last one was gone, or
        `resumed` at the look's start): the cluster follows it, judged afresh."""
        for n in self._parts():
            run = n.host.run
            if n.host.following is None or (self.following is not None and self.run.run_id == run.run_id):
                continue
            self.follow(run, resumed)
            self.state.notes.append(f"node {n.name} follows {run.run_id or 'a new run'}: the job's run from now on")
            return

    def _leader_clock(self, rec: Mapping[str, Any]) -> float:
        """The run's start as the node that follows it sees its leader."""
        for n in self._parts():
            own = n.host.following
            if own is not None and own.get("pgid") == rec.get("pgid") and own.get("run_id") == rec.get("run_id"):
                return n.host._leader_clock(rec)
        return super()._leader_clock(rec)

    # ------------------------------------------------------------------ judging

    # The rules of one host, in their one home (HostMonitor), read on the merged state: the
    # operator's kills (`stopping`, `stopped`) and a stall's forensics, gathered once for all.

    def update(self, now: float | None = None) -> None:
        state = self.state
        if not state.seq or state.link_state != "up" or not self._judgeable():
            return
        before = self.verdict
        self.watchdog.looks = self.forensics_on and self._looks_off is None  # a stack look over every node's ranks
        phase, v = self.watchdog.update(state, now if now is not None else time.monotonic())
        if v.name == VerdictName.CRASHED:
            for n in self._parts():
                n.host._stops_elsewhere()  # each node reads the stops its host records
        phase, v = self._operators(phase, v)  # the operator's kills read as theirs, on the merged state
        ended = [n.name for n in self._parts() if n.ended]
        if v.name == VerdictName.CRASHED and ended:  # a node's part ended by a recorded stop: its ranks are forgotten
            # there, so the ranks going down after it (or the lines saying so) are that stop's, not a crash
            phase = Phase("stopped", line=phase.line) if phase.name == "crashed" else phase
            v = Verdict(
                VerdictName.STOPPED,
                [f"the run's part on node {', '.join(ended)} was stopped whole by the operator (its host's record)"]
                + v.evidence[:2],
            )
        if self._ended_elsewhere():
            self.run_ended()  # every node's part stopped whole by another cockpit, verified gone: no run
            return
        odd_node = None
        evidence = list(v.evidence)
        if v.odd_rank is not None:
            holders = [p for p in state.procs.values() if p.rank == v.odd_rank]
            if holders:
                p = holders[0]
                odd_node, there, step = (getattr(p, key, None) for key in ("node", "node_pid", "step"))
                evidence.insert(
                    0,
                    f"rank {v.odd_rank} is on node {odd_node} (pid {there} there"
                    + (f", Slurm step {self.job.id}.{step}" if step and self.job else "")
                    + ")",
                )
        down = [f"node {n.name}: {n.status}" for n in self.nodes if n.status != "up"]
        evidence = down + evidence
        self.phase, self.verdict = (
            phase,
            NodeVerdict(v.name, evidence, v.odd_rank, v.detail, v.since, v.until, odd_node=odd_node),
        )
        self._stall_forensics()  # gathered once for all, on the merged state
        self._stack_look()
        if self.verdict.name != before.name or self.verdict.odd_rank != before.odd_rank:
            self._emit(MonitorEvent("verdict", before=before))

    def _ended_elsewhere(self) -> bool:
        """Every node's part of the run ended by a stop its host records, verified gone (each
        node's HostMonitor reads its own record: HostMonitor._ended_elsewhere), no rank alive."""
        if self.stopping or self.verdict.name == VerdictName.NO_RUN:
            return False
        if any(p.alive and p.status != "Z" for p in self.state.ranks()):
            return False
        parts = [n for n in self._parts() if n.ended or n.host.state.ranks()]
        return bool(parts) and all(n.ended or n.host._ended_elsewhere() for n in parts)

    def new_run(self, started: float | None = None, resumed: bool = False) -> None:
        """As on one host (HostMonitor.new_run), on every node: the last run's dead ranks, kills,
        stall and log lines are history; the state is rebuilt from the nodes' on their next sample."""
        for n in self._parts():
            n.ended = False
            n.host.new_run()
        self._judge_afresh(started, resumed)
        self.verdict = NodeVerdict(VerdictName.WATCHING, [])
        self.forensics, self._forensics_for = None, None
        self._looks_off = None

    def run_ended(self) -> None:
        """The operator's kill of the whole job's run, verified on every node: no run until one
        starts, also while a node's agent still sends samples before the job's end takes it down."""
        before = self.verdict
        for n in self._parts():
            n.host.follow(None)  # each node's part ended with the job's run
        self.follow(None)
        self.watchdog.end()
        self.phase, self.verdict = Phase("no run"), NodeVerdict(VerdictName.NO_RUN, [])
        self._emit(MonitorEvent("verdict", before=before))

    @contextmanager
    def stopping_for(self, why: str, plan: KillPlan | None = None) -> Iterator[None]:
        """The operator's own kill: each node's HostMonitor takes its share of `plan` (its deaths
        read as the operator's there, as on one host), the job's ranks read `stopping` meanwhile."""
        with ExitStack() as stack:
            for n in self._parts():
                share = None
                if plan is not None:
                    share = dataclasses.replace(
                        plan,
                        entries=[
                            dict(e, pid=node_of(int(e["pid"]))[1])
                            for e in plan.entries
                            if node_of(int(e["pid"]))[0] == n.number
                        ],
                    )
                stack.enter_context(n.host.stopping_for(why, share))
            before, self.stopping = self.stopping, why
            try:
                yield
            finally:
                self.stopping = before

    async def look_for_new_run(self) -> Run | None:
        """Each node looks for a new run of the layout once its part of the last one is gone
        (HostMonitor.look_for_new_run, which its probes also run); the cluster follows what one
        adopted. Returns the run followed then, if new."""
        before = self.run
        for n in self._parts():
            await n.host.look_for_new_run()
        self._follow_nodes()
        return self.run if self.run is not before and self.following is not None else None

    def replayed(self) -> tuple[Phase, Verdict]:
        return self.phase, self.verdict

    # ------------------------------------------------------------------ lifecycle

    async def open(self, kept: bool = False) -> None:
        """Find the job's nodes, then start an agent on each (concurrently); a node whose agent
        cannot start is shown as such, and only all of them failing is an error. `kept` as in
        HostMonitor.open. A node that follows a run of the layout (resumed) makes it the job's."""
        self.opened_at = time.monotonic()
        self.nodes = await self._find_nodes()
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
        self._follow_nodes(resumed=True)

    async def _find_nodes(self) -> list[Node]:
        """The job's nodes, in the job's order (Slurm's word, through the carrier's link)."""
        self._jobs_link = SlurmNodeLink(
            carrier_link(self.target, self.opts),
            self.target,
            self.target.carrier().label if self.target.remote else "this machine",
        )
        await self._jobs_link.carrier.connect()
        self.job = job = await find_job(self._jobs_link, self.target.name or "")
        return [Node(i + 1, name, self.target.on_node(name)) for i, name in enumerate(job.nodes)]

    async def _node_pids(self, n: Node) -> NodePids:
        """The job's processes on the node (`scontrol listpids`), its steps named."""
        link = self._jobs()
        return await SlurmNodeLink(link.carrier, n.target, link.where).job_pids()

    def _jobs(self) -> SlurmNodeLink:
        """The link Slurm is asked through (the carrier's), once the job was found."""
        if self._jobs_link is None:
            raise LinkLost(f"{self.target.label}: not connected")
        return self._jobs_link

    async def _open_node(self, n: Node, kept: bool) -> None:
        n.pids = await self._node_pids(n)
        watch = WatchList(
            patterns=[],
            pids=n.pids.pids,
            logs=[self.layout.log] if self.layout and self.layout.log else [],
            ports=list(self.layout.ports) if self.layout else [],
        )
        opts = self.opts
        if opts.sim_state and "%n" in opts.sim_state:  # each node its own simulated GPUs (tests, demos)
            opts = dataclasses.replace(opts, sim_state=opts.sim_state.replace("%n", n.name))
        monitor = NodeMonitor(n.target, opts, self.layout, history=self.history, watch=watch)
        monitor.forensics_on = False  # the stall is the job's, its forensics gathered over every node's ranks at once
        monitor.subscribe(functools.partial(self._on_node_event, n))
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
        st = n.host.state
        servers = sorted(
            p.pid
            for p in st.procs.values()
            if p.alive
            and p.role == "server"
            and n.pids.steps.get(p.pid) != "batch"
            and n.pids.steps.get(p.ppid) != "batch"
        )
        if not servers:
            return
        found = await n.host.session.request("stdout_of", pids=servers[:16])
        path = next((found[str(pid)] for pid in servers if str(pid) in found), None)
        if path:
            await n.host.session.follow_log(path)

    async def refresh_pids(self) -> None:
        """Steps started in the job since (a relaunch): each node's agent is told the new pids."""
        for n in self.nodes:
            if n.monitor is None or n.status != "up":
                continue
            try:
                found = await self._node_pids(n)
            except CockpitError:
                continue
            if set(found.pids) - set(n.pids.pids):
                n.pids = found
                n.monitor.session.watch.pids = found.pids
                await n.monitor.session.request("config", **n.monitor.session.watch.args())

    async def verify_gone(self, n: Node, plan: list[dict[str, Any]]) -> dict[str, Any]:
        """A node's agent went down during the kill (the job ended as its steps died): Slurm ends
        every process of an ended job on every node, so the job's state is the check."""
        pids = [e["pid"] for e in plan]
        try:
            job = await find_job(self._jobs(), self.target.name or "")
            state: str | None = job.state
        except CockpitError as exc:
            state = "ended" if "no such job" in str(exc) or "not RUNNING" in str(exc) else None
        if state == "RUNNING" or state is None:
            return {
                "remaining": pids,
                "note": f"node {n.name}: its agent's link dropped and job {self.target.name} still runs: not verified",
            }
        return {
            "term": pids,
            "remaining": [],
            "note": f"node {n.name}: job {self.target.name} ended with its steps, Slurm ended what was left of it",
        }

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

        async def refresh() -> None:
            while True:
                await asyncio.sleep(self.refresh_pids_s)
                await self.refresh_pids()

        await asyncio.gather(*tasks, refresh())

    async def close(self) -> None:
        for task in (self._forensics_task, self._look_task):
            if task is not None and not task.done():
                task.cancel()
        await asyncio.gather(*(n.monitor.close() for n in self.nodes if n.monitor is not None), return_exceptions=True)
        if self._jobs_link is not None:
            await self._jobs_link.carrier.close()

    @asynccontextmanager
    async def attached(self, samples: int = 1) -> AsyncIterator[ClusterMonitor]:
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

    def doc_extra(self) -> dict[str, Any]:
        """What `snapshot --json` adds for a run spanning nodes (docs/targets.md)."""
        nodes = []
        for n in self.nodes:
            procs = [p for p in self.state.procs.values() if getattr(p, "node", None) == n.name]
            nodes.append(
                {
                    "name": n.name,
                    "status": n.status,
                    "pids": n.pids.pids,
                    "ranks": sorted(p.rank for p in procs if p.rank is not None and p.alive),
                    "gpus": sorted(label for label in self.state.gpu_labels.values() if label.startswith(n.name + ":")),
                }
            )
        return {
            "job": None
            if self.job is None
            else {
                "id": self.job.id,
                "state": self.job.state,
                "nodes": self.job.nodes,
                "batch_host": self.job.batch_host,
            },
            "nodes": nodes,
        }
