"""One run lifecycle for every live monitor: one host (HostMonitor) and a run spanning nodes
(ClusterMonitor) are made to ACT alike, each test parametrized over both kinds, on real simulated
servers (cockpit/sim/server.py) and real agents:

- stop: the kill plan is carried out (every planned process gone), the verdict `no run` after;
- ended elsewhere: a stop written by another cockpit reads `stopped`, then `no run`, never `crashed`;
- adopt: once the run followed is gone, a new run of the layout started elsewhere is followed;
- forensics: a stall gathers every rank's stacks and names the odd rank.

The cluster here is made of real node HostMonitors over `local` links (the job's nodes on this
machine, each watching its own server of a two-node run); the last test watches a real Slurm job
(tests/engines.py) stopped by `cockpit kill` from another process."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from conftest import free_port
from engines import slurm  # noqa: F401  (the fixture)
from simhost import gone, kill_groups, wait_for

from cockpit.actions import kill
from cockpit.actions.launch import launch
from cockpit.host.session import HostSession, SessionOptions, WatchList
from cockpit.link.slurm import NodePids
from cockpit.link.target import parse_target
from cockpit.monitor.cluster import DEV_STRIDE, ClusterMonitor, Node, node_of
from cockpit.monitor.host import HostMonitor
from cockpit.runs.layoutfile import load_layout
from cockpit.runs.spec import RunSpec
from cockpit.sim import fakenvml

KINDS = ("host", "cluster")
SERVER = [sys.executable, "-m", "cockpit.sim.server", "--sim-speed", "4"]


class LocalCluster(ClusterMonitor):
    """A job's nodes as agents on this machine: node NAME watches the processes of its own server
    (what `scontrol listpids` gives on a real node); everything else is the ClusterMonitor's."""

    def __init__(self, roots: dict[str, int], opts: SessionOptions, layout):
        super().__init__(parse_target("slurm:1"), opts, layout)
        self.roots = roots

    async def _find_nodes(self) -> list[Node]:
        return [Node(i + 1, name, parse_target("local")) for i, name in enumerate(self.roots)]

    async def _node_pids(self, n: Node) -> NodePids:
        return NodePids({self.roots[n.name]: "0"})


class Watched:
    """A run started by hand (one server; a cluster's: one per node, ranks global) and the
    monitors watching it, kept as a screen keeps them."""

    def __init__(self, kind: str, tmp: Path, flags: list[str], spin_s: int):
        self.kind, self.tmp, self.flags = kind, tmp, flags
        self.servers: list[subprocess.Popen] = []
        self.monitors: list = []
        self.tasks: list[asyncio.Task] = []
        self.ports = [free_port() for _ in range(2)]
        first = tmp / "first"  # the run by hand; a launch elsewhere uses another folder (not the watch's pattern)
        first.mkdir()
        (tmp / "dist").mkdir()
        # one host's run is found by its port (another server of this machine's users is not it); a
        # job's run is the job's processes. A new run started elsewhere takes the same port.
        watch = (
            f"watch: ['*cockpit.sim.server*--sim-shm-dir {first}*']\nlog: {tmp}/server-n1.log\n"
            f"ports: [{self.ports[0]}]\n"
            if kind == "host"
            else ""
        )
        self.path = tmp / "conformance.yaml"
        self.path.write_text(
            f"name: conformance\nengine: sglang\ncommand: [-m, cockpit.sim.server]\nlog_dir: {tmp}/runs\n"
            f"base_flags: [--tp-size, '2', --port, '{self.ports[0]}', --sim-speed, '4', --sim-shm-dir, "
            f"'{tmp}/launched']\nstall: {{idle_s: 600, spin_s: {spin_s}}}\n" + watch
        )
        (tmp / "launched").mkdir()
        self.layout = load_layout(str(self.path))
        nodes = ["n1"] if kind == "host" else ["n1", "n2"]
        for i, n in enumerate(nodes):
            fakenvml.write_host(
                str(tmp / f"sim-{n}"), gpus=8 if kind == "host" else 2, model="rtx-pro-6000", seed=i + 1
            )
            spread = [] if kind == "host" else ["--nnodes", "2", "--node-rank", str(i), "--sim-dist-dir", f"{tmp}/dist"]
            self.servers.append(
                subprocess.Popen(
                    SERVER
                    + ["--tp-size", "4", "--port", str(self.ports[i]), "--sim-shm-dir", str(first), *spread, *flags],
                    stdout=open(tmp / f"server-{n}.log", "w"),
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    env={**os.environ, "COCKPIT_SIM_STATE": str(tmp / f"sim-{n}")},
                )
            )
        self.sim = str(tmp / ("sim-n1" if kind == "host" else "sim-%n"))

    def monitor(self):
        """A monitor of this kind on the run, as another screen (another cockpit) opens one."""
        opts = SessionOptions(python=sys.executable, interval=0.25, sim_state=self.sim)
        if self.kind == "host":
            m = HostMonitor(
                parse_target("local"), opts, self.layout, watch=WatchList.for_layout(self.layout), probe_every_s=0.25
            )
        else:
            m = LocalCluster({f"n{i + 1}": s.pid for i, s in enumerate(self.servers)}, opts, self.layout)
        m.forensics_on = False
        return m

    async def open(self, m, seen: list[str] | None = None):
        if seen is not None:
            m.subscribe(lambda e: seen.append(m.verdict.name.value) if e.kind == "verdict" else None)
        self.monitors.append(m)
        await m.open(kept=True)
        for n in getattr(m, "nodes", []):  # each node's probes (a new run looked for) as often as the host's
            n.monitor.probe_every_s = 0.25
        self.tasks.append(asyncio.create_task(m.keep()))
        await wait_for(
            lambda: len([p for p in m.state.ranks() if p.alive]) == 4 and m.phase.name in ("ready", "serving"),
            90,
            f"the {self.kind}'s run up",
            lambda: (m.phase, m.verdict, self.said()),
        )
        return m

    def said(self) -> str:
        return " | ".join(
            (self.tmp / f"server-{n}.log").read_text()[-300:]
            for n in ("n1", "n2")
            if (self.tmp / f"server-{n}.log").exists()
        )

    def pids(self) -> list[int]:
        """The run's processes on this machine: each server and what it started."""
        out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
        return [
            int(line.split()[0]) for line in out.splitlines() if f"{self.tmp}/first" in line and "ps -eo" not in line
        ]

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        kill_groups(s.pid for s in self.servers)
        for m in self.monitors:
            await m.close()


@asynccontextmanager
async def watched(kind: str, tmp_path: Path, monkeypatch, *flags: str, spin_s: int = 600):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")  # py-spy for the agents
    w = Watched(kind, tmp_path, list(flags), spin_s)
    try:
        yield w
    finally:
        await w.close()


def written(records: list[dict]) -> set[str]:
    """The records as their hosts wrote them (a cluster names each after the node it read it on;
    here every node reads this machine's one record)."""
    return {r["id"].split(":")[-1] for r in records}


def node_pid(m, pid: int) -> int:
    """A planned pid as this machine numbers it (a cluster plans on the job's numbers)."""
    return node_of(pid)[1] if isinstance(m, ClusterMonitor) else pid


@pytest.mark.parametrize("kind", KINDS)
async def test_stop_carries_out_the_plan_and_reads_no_run(kind, tmp_path, monkeypatch):
    async with watched(kind, tmp_path, monkeypatch) as w:
        seen: list[str] = []
        m = await w.open(w.monitor(), seen)
        plan = await kill.plan_kill(m.session, m.scope())
        planned = sorted(node_pid(m, e["pid"]) for e in plan.entries)
        assert set(w.pids()) <= set(planned) and len(planned) >= 5, (planned, w.pids())
        report = await m.stop(plan, "conformance test")
        assert report["verified"], report
        assert all(gone(pid) for pid in planned), [pid for pid in planned if not gone(pid)]
        assert w.pids() == []
        assert (m.verdict.name.value, m.phase.name) == ("no run", "no run")
        assert m.following is None
        await m.session.wait_samples(2)  # the dead run's last lines and samples do not bring it back
        assert m.verdict.name.value == "no run" and "crashed" not in seen, seen
        stops = [r for r in m.state.acts_of("stop") if r.get("why") == "conformance test"]
        assert len(written(stops)) == (1 if kind == "host" else 2), stops  # on the record of each host that ran it


@pytest.mark.parametrize("kind", KINDS)
async def test_a_run_stopped_by_another_cockpit_reads_stopped_then_no_run(kind, tmp_path, monkeypatch):
    async with watched(kind, tmp_path, monkeypatch) as w:
        seen: list[str] = []
        watcher = await w.open(w.monitor(), seen)
        other = await w.open(w.monitor())
        plan = await kill.plan_kill(other.session, other.scope())
        report = await other.stop(plan, "stopped in another cockpit")
        assert report["verified"], report
        await wait_for(
            lambda: watcher.verdict.name.value == "no run", 30, "no run on the watcher", lambda: (seen, watcher.verdict)
        )
        assert "crashed" not in seen and "stopped" in seen, seen
        assert seen.index("stopped") < len(seen) - 1 and seen[-1] == "no run", seen
        assert watcher.following is None and w.pids() == []


@pytest.mark.parametrize("kind", KINDS)
async def test_a_new_run_started_elsewhere_is_followed_once_the_last_is_gone(kind, tmp_path, monkeypatch):
    async with watched(kind, tmp_path, monkeypatch) as w:
        m = await w.open(w.monitor())
        kill_groups(s.pid for s in w.servers)  # the run followed ends outside any cockpit
        for s in w.servers:
            s.wait()
        await wait_for(lambda: not any(p.alive for p in m.state.ranks()), 30, "the run's end seen")
        elsewhere = HostSession(
            parse_target("local"),
            SessionOptions(python=sys.executable, interval=0.25, sim_state=str(tmp_path / "sim-n1")),
            WatchList(patterns=[]),
        )
        await elsewhere.connect()
        run = None
        try:
            run = await launch(elsewhere, w.layout, RunSpec())  # another cockpit's launch of the layout
            after: list[str] = []
            m.subscribe(lambda e: after.append(m.verdict.name.value) if e.kind == "verdict" and m.following else None)
            await wait_for(
                lambda: m.following is not None and m.following.get("run_id") == run.run_id,
                60,
                "the new run followed",
                lambda: (m.verdict, list(m.state.notes)),
            )
            await wait_for(
                lambda: m.phase.name in ("ready", "serving") and m.verdict.name.value == "ok",
                90,
                "the new run judged as itself",
                lambda: (m.phase, m.verdict),
            )
            assert "crashed" not in after, after
            pgid = int(run.record["pgid"])
            assert {node_pid(m, p.pgid) for p in m.state.ranks() if p.alive} == {pgid}
        finally:
            kill_groups([int(run.record["pgid"])] if run is not None and run.record else [])
            await elsewhere.close()


@pytest.mark.parametrize("kind", KINDS)
async def test_a_stall_gathers_every_ranks_stack_and_names_the_odd_rank(kind, tmp_path, monkeypatch):
    async with watched(kind, tmp_path, monkeypatch, "--sim-traffic", "2", "--sim-hang-rank", "3", spin_s=4) as w:
        m = w.monitor()
        m.forensics_on = True
        await w.open(m)
        await wait_for(
            lambda: m.forensics is not None and (m.forensics.folder or m.forensics.error),
            120,
            "the stall's forensics",
            lambda: (m.verdict, m.forensics),
        )
        assert m.forensics.error is None and m.forensics.folder, m.forensics
        assert m.verdict.name.value == "stalled-spinning" and m.verdict.odd_rank == 3, m.verdict
        assert Path(m.forensics.folder).is_dir() and m.forensics.finding.odd_rank == 3, m.forensics
        await m.session.wait_samples(2)  # the result, kept on the record of each host holding a rank
        done = [r for r in m.state.acts_of("forensics") if r.get("state") == "done"]
        assert len(written(done)) == (1 if kind == "host" else 2), done
        assert {r["doc"]["folder"] for r in done} == {m.forensics.folder}


async def test_a_slurm_job_stopped_by_another_cockpit_reads_stopped_never_crashed(slurm, tmp_path, monkeypatch):  # noqa: F811
    """A real two-node Slurm job watched by a ClusterMonitor (an agent per node through `srun
    --overlap`), stopped by `cockpit kill slurm:JOB` in another process: the stop is on each
    node's record, the watcher reads the deaths as the operator's. The job ends with its steps
    (taking the watcher's agents with it), so `no run` may not be read before the links drop."""
    from test_targets import LAYOUT, cli, run_procs, start_job

    from cockpit.runs.layoutfile import parse_layout

    for key, value in slurm.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    job = start_job(slurm, tmp_path, "--sim-traffic 2")
    seen: list[str] = []
    monitor = ClusterMonitor(
        parse_target(f"slurm:{job}"),
        SessionOptions(python=sys.executable, interval=0.5, sim_state=f"{tmp_path}/%n"),
        parse_layout(LAYOUT, str(tmp_path / "layout.yaml")),
    )
    monitor.subscribe(lambda e: seen.append(monitor.verdict.name.value) if e.kind == "verdict" else None)
    kept = None
    try:
        await monitor.open(kept=True)
        kept = asyncio.create_task(monitor.keep())
        await wait_for(
            lambda: len([p for p in monitor.state.ranks() if p.alive]) == 4,
            60,
            "both nodes' ranks",
            lambda: (monitor.verdict, [n.status for n in monitor.nodes]),
        )
        res = await asyncio.to_thread(
            cli, slurm, "kill", f"slurm:{job}", "--sim", f"{tmp_path}/%n", "--yes", "--wait", "3"
        )
        assert res.returncode == 0 and "verified" in res.stdout, res.stdout + res.stderr
        await wait_for(
            lambda: monitor.verdict.name.value in ("stopped", "no run"),
            30,
            "the stop read",
            lambda: (seen, monitor.verdict),
        )
        assert "crashed" not in seen, seen
        stops = [r for r in monitor.state.acts_of("stop") if (r.get("why") or "").startswith("cockpit kill")]
        assert len(written(stops)) == 2, stops  # the stop written by each node's agent, on its host's record
        deadline = asyncio.get_running_loop().time() + 20
        while run_procs(str(tmp_path)) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.2)
        assert run_procs(str(tmp_path)) == []
        assert "crashed" not in seen, seen
    finally:
        if kept is not None:
            kept.cancel()
        await monitor.close()
        subprocess.run(["scancel", job], env=slurm.env, capture_output=True)


@pytest.mark.parametrize("kind", KINDS)
async def test_the_clean_after_a_stop_removes_what_the_run_held_on_the_host_that_held_it(kind, tmp_path, monkeypatch):
    """Each rank holds a `nccl-` file in the shm folder (the test's own, named to the audit as
    /dev/shm is). The monitor remembers what the run held while it lived (a cluster: each node's
    HostMonitor, its own run's files); after the stop, nothing holds them, and the clean removes
    exactly those, each by the agent of the host whose run held it (the other nodes, reading the
    same folder here, leave it: not theirs)."""
    async with watched(kind, tmp_path, monkeypatch, "--sim-leak-shm") as w:
        folder = tmp_path / "first"
        monkeypatch.setattr(kill.shm_audit, "__defaults__", (str(folder), None))  # the run's shm folder
        await wait_for(lambda: len(list(folder.glob("nccl-*"))) == 4, 60, "every rank's nccl file", w.said)
        m = await w.open(w.monitor())
        await wait_for(lambda: len(m.shm_held) == 4, 60, "the files the run holds remembered", lambda: m.shm_held)
        held = dict(m.shm_held)
        plan = await kill.plan_kill(m.session, m.scope())
        assert (await m.stop(plan, "conformance test"))["verified"]
        audit = await kill.shm_audit(m.session, str(folder))
        found = kill.shm_for_run(audit, plan, held)
        nccl = sorted(p.name for p in folder.glob("nccl-*"))
        assert sorted(e["name"] for e in found.remove if e["name"].startswith("nccl-")) == nccl, found
        assert all("held by the run while it lived" in e["why"] for e in found.remove if e["name"] in nccl)
        if kind == "cluster":  # each file removed on one node, the one whose rank held it
            assert {e["dev"] // DEV_STRIDE for e in found.remove if e["name"] in nccl} == {1, 2}, found.remove
        done = await kill.shm_clean(m.session, found.remove, str(folder), other_dir=True)
        assert list(folder.glob("nccl-*")) == [], done
        assert len([name for name in done["removed"] if "nccl-" in name]) == 4, done


def test_a_nodes_part_stopped_whole_elsewhere_reads_stopped_then_no_run_never_crashed():
    """Frames fed to the node HostMonitors (the order no live test can force): node n1's part is
    stopped whole by another cockpit and n1's HostMonitor, reading the stop's end on its record,
    forgets it; n2's ranks go down after it, before n2's record says why. The job reads
    `stopped` throughout (never `crashed`), then `no run` once n2's part ended too."""
    import time

    from cockpit.monitor.cluster import NodeMonitor

    m = ClusterMonitor(parse_target("slurm:7"), SessionOptions(), None)
    seen: list[str] = []
    m.subscribe(lambda e: seen.append(m.verdict.name.value) if e.kind == "verdict" else None)
    for k, name in ((1, "n1"), (2, "n2")):
        node = Node(k, name, parse_target(f"slurm:7/{name}"))
        node.monitor = NodeMonitor(node.target, SessionOptions(), None)
        node.monitor.subscribe(lambda e, n=node: m._on_node_event(n, e))
        node.monitor.state.link_state = "up"
        node.monitor.state.apply({"t": "hello", "gpus": [{"index": 0, "mem_total_mib": 80000}]})
        m.nodes.append(node)
    n1, n2 = m.nodes

    def sample(node, **frame):  # a node's sample as its session hands it to its monitor
        node.host.state.apply({"t": "sample", "seq": node.host.state.seq + 1, **frame})
        node.host._on_frame({"t": "sample"})

    def record(act, pids):
        return {
            "id": f"{act}-{pids[0]}",
            "at": time.time(),
            "act": act,
            "why": "cockpit kill",
            "by": "ops@elsewhere",
            "processes": [[pid, None, None] for pid in pids],
        }

    for node, ranks in ((n1, (0, 1)), (n2, (2, 3))):
        sample(
            node,
            procs=[
                {
                    "pid": 10 + r,
                    "ppid": 1,
                    "name": f"sglang::scheduler_TP{r}",
                    "status": "S",
                    "cmdline": [f"sglang::scheduler_TP{r}"],
                    "cpu_pct": 1.0,
                }
                for r in ranks
            ],
        )
    assert len([p for p in m.state.ranks() if p.alive]) == 4
    sample(n1, gone=[10, 11], acts=[record("stop", [10, 11])])
    assert m.verdict.name.value == "stopped", m.verdict
    sample(n1, acts=[record("ended", [10, 11])])
    assert n1.ended and n1.host.verdict.name.value == "no run"
    sample(n2, gone=[12, 13])  # its ranks went down after n1's part, its record not read yet
    assert m.verdict.name.value == "stopped", m.verdict
    sample(n2, acts=[record("stop", [12, 13]), record("ended", [12, 13])])
    assert (m.verdict.name.value, m.phase.name) == ("no run", "no run"), m.verdict
    assert "crashed" not in seen, seen


async def test_a_jobs_cockpit_refuses_a_command_it_does_not_know_in_words():
    """A command the job neither spreads over its nodes nor asks of its first node is an error
    naming it, raised before any node is asked (none is connected here)."""
    from cockpit.common.errors import CockpitError, LinkLost
    from cockpit.monitor.cluster import FIRST_NODE

    m = ClusterMonitor(parse_target("slurm:7"), SessionOptions(), None)
    with pytest.raises(CockpitError, match="no command 'reboot'") as err:
        await m.session.request("reboot")
    assert not isinstance(err.value, LinkLost) and "kill_plan" in str(err.value) and "host_facts" in str(err.value)
    for known in ("kill_plan", "dump", "shm_audit", *sorted(FIRST_NODE)):  # known: on to the nodes, none up here
        with pytest.raises(LinkLost):
            await m.session.request(known)
