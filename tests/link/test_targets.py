"""Where servers live: inside containers (`docker:NAME`, the agent through `exec -i`) and as Slurm jobs
spanning nodes (`slurm:JOBID`, an agent per node through `srun --overlap`). Against the real
engines, started here (tests/engines.py): two slurmd "nodes" on loopback running a simulated run of
four ranks, two per node, one hung; a Docker container running the simulated server."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from conftest import free_port, run_cli
from engines import container_engine, slurm  # noqa: F401  (fixtures)
from simhost import kill_groups

from cockpit.common.errors import CockpitError
from cockpit.link.container import translate_sample
from cockpit.link.slurm import parse_listpids, parse_scontrol_job
from cockpit.link.target import parse_target
from cockpit.sim import fakenvml

REPO = Path(__file__).resolve().parents[2]
LAYOUT = """\
name: two-nodes
engine: sglang
command: [-m, cockpit.sim.server]
stall: {idle_s: 600, spin_s: 6}
"""


# ----------------------------------------------------------------------------- plain parts


def test_targets_of_containers_and_jobs_parse():
    t = parse_target("docker:vllm-1")
    assert (t.kind, t.name, t.remote, t.carrier().kind) == ("docker", "vllm-1", False, "local")
    t = parse_target("podman:sgl@root@gpu-box:2222")
    assert (t.kind, t.name, t.remote) == ("podman", "sgl", True)
    assert (t.carrier().kind, t.carrier().host, t.carrier().user, t.carrier().port) == ("ssh", "gpu-box", "root", 2222)
    t = parse_target("slurm:1234@login")
    assert (t.kind, t.name, t.node, t.carrier().host) == ("slurm", "1234", None, "login")
    assert t.on_node("gpu7").label == "slurm:1234/gpu7@login"
    assert parse_target("slurm:1234/gpu7").node == "gpu7"
    for bad, said in (
        ("slurm:abc", "a Slurm job id is a number"),
        ("docker:", "container's name"),
        ("docker:a b", "container's name"),
        ("slurm:12@", "malformed target"),
    ):
        with pytest.raises(CockpitError, match=said):
            parse_target(bad)


def test_nvml_host_pids_become_the_containers_and_each_process_gets_its_host_pid():
    frame = {
        "t": "sample",
        "gpus": [{"index": 0, "processes": [[40123, 900], [7, 5]]}],
        "procs": [{"pid": 8}, {"pid": 9}],
    }
    translate_sample(frame, {8: 40123, 9: 40124})
    assert frame["gpus"][0]["processes"] == [[8, 900], [7, 5]]  # 7: already the container's, left as is
    assert [p.get("host_pid") for p in frame["procs"]] == [40123, 40124]


def test_listpids_leaves_out_the_cockpits_own_steps_and_extern():
    text = "PID      JOBID    STEPID   LOCALID GLOBALID\n849 1 1 0 0\n818 1 batch 0 0\n900 1 extern 0 0\n950 1 4 0 0\n"
    got = parse_listpids(text, {"4"})
    assert got.steps == {849: "1", 818: "batch"}
    assert parse_scontrol_job("JobId=5 JobState=RUNNING NodeList=n[1-2] BatchHost=n1")["NodeList"] == "n[1-2]"


# ----------------------------------------------------------------------------- Slurm

JOB = """\
#!/bin/bash
# a run spanning two nodes: node rank i on node n(i+1), each node with simulated GPUs of its own
for i in 0 1; do
  n=n$((i+1))
  srun -N1 -n1 --nodelist $n --overlap --export=ALL,COCKPIT_SIM_STATE=$W/$n \\
    bash -c "exec $PY -u -m cockpit.sim.server --tp-size 4 --nnodes 2 --node-rank $i --port $((PORT+i)) \\
      --sim-speed 8 $EXTRA --sim-dist-dir $W/dist --sim-shm-dir $W > $W/server-$n.log 2>&1" &
done
wait
"""


def run_procs(marker: str) -> list[str]:
    """This machine's processes whose command line holds marker (the run's own folder)."""
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if marker in line and "ps -eo" not in line]


def start_job(slurm, tmp_path: Path, extra: str) -> str:  # noqa: F811
    for n in ("n1", "n2"):
        fakenvml.write_host(str(tmp_path / n), gpus=2, model="rtx-pro-6000", seed=int(n[1]))
    (tmp_path / "dist").mkdir()
    script = tmp_path / "job.sh"
    script.write_text(JOB)
    env = {"W": str(tmp_path), "PY": sys.executable, "PORT": str(free_port()), "EXTRA": extra, "PYTHONPATH": str(REPO)}
    job = slurm.sbatch(script, env)
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        logs = [tmp_path / f"server-{n}.log" for n in ("n1", "n2")]
        if all(p.exists() and "fired up" in p.read_text() for p in logs):
            return job
        time.sleep(0.2)
    raise AssertionError(
        f"the job's servers did not come up: {slurm.job_state(job)} "
        f"{[p.read_text()[-300:] for p in logs if p.exists()]}"
    )


def cli(slurm, *args, timeout=90):  # noqa: F811
    return run_cli(*args, "--python", sys.executable, timeout=timeout, env={**slurm.env, "PYTHONPATH": str(REPO)})


def neighbour_on_n1(tmp_path: Path, name: str) -> subprocess.Popen:
    """A single-node server of the same command started by hand on node n1's GPUs beside the job (as
    a colleague's is), its own process group and port."""
    folder = tmp_path / name
    folder.mkdir()
    log = folder / "server.log"
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cockpit.sim.server",
            "--tp-size",
            "2",
            "--port",
            str(free_port()),
            "--sim-speed",
            "8",
            "--sim-shm-dir",
            str(folder),
        ],
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, "COCKPIT_SIM_STATE": str(tmp_path / "n1"), "PYTHONPATH": str(REPO)},
    )
    deadline = time.monotonic() + 40
    while "fired up" not in log.read_text():
        assert time.monotonic() < deadline and p.poll() is None, log.read_text()[-300:]
        time.sleep(0.2)
    return p


def test_a_job_on_two_nodes_is_one_run_its_hung_rank_named_with_its_node_and_killed_on_both(slurm, tmp_path):  # noqa: F811
    """Beside it on n1, a single-node server of the same command (issue 44): never one of the job's
    processes, its end never the job's crash, and the job's kill leaves it serving."""
    t_start = time.monotonic()
    job = start_job(slurm, tmp_path, "--sim-traffic 2 --sim-hang-rank 3")
    print(f"servers up in {time.monotonic() - t_start:.1f} s")
    neighbour = neighbour_on_n1(tmp_path, "nb1")
    theirs = {neighbour.pid, *(c.pid for c in psutil.Process(neighbour.pid).children(recursive=True))}
    try:
        layout = tmp_path / "layout.yaml"
        layout.write_text(LAYOUT)
        t0 = time.monotonic()
        res = cli(
            slurm,
            "snapshot",
            f"slurm:{job}",
            "--sim",
            f"{tmp_path}/%n",
            "--layout",
            str(layout),
            "--json",
            "--wait",
            "8",
        )
        took = time.monotonic() - t0
        assert res.returncode == 0, res.stderr
        doc = json.loads(res.stdout)
        assert doc["job"]["nodes"] == ["n1", "n2"] and [n["status"] for n in doc["nodes"]] == ["up", "up"]
        assert [n["ranks"] for n in doc["nodes"]] == [[0, 1], [2, 3]]  # both nodes' ranks, global numbers
        assert {p["node"] for p in doc["processes"]} == {"n1", "n2"}
        assert sorted(g["label"] for g in doc["gpus"]) == ["n1:0", "n1:1", "n2:0", "n2:1"]
        ranks = {p["rank"]: p for p in doc["processes"] if p["rank"] is not None}
        assert ranks[3]["node"] == "n2" and ranks[3]["step"] is not None
        v = doc["verdict"]
        assert v["name"] == "stalled-spinning", (v, took)
        assert (v["odd_rank"], v["odd_node"]) == (3, "n2"), v
        assert v["evidence"][0].startswith("rank 3 is on node n2 (pid ")
        # ready until the first request of the sim's traffic, serving after: either is the job up
        assert doc["phase"]["name"] in ("ready", "serving") and doc["log"]["path"].startswith("n1:")
        assert not theirs & {p["pid"] for p in doc["processes"]}, "the neighbour's processes read as the job's"
        assert len(theirs) >= 3 and neighbour.poll() is None  # its server and its ranks, serving

        ended = threading.Timer(3, os.killpg, (neighbour.pid, signal.SIGKILL))  # the neighbour ends mid-look
        ended.start()
        res = cli(
            slurm,
            "snapshot",
            f"slurm:{job}",
            "--sim",
            f"{tmp_path}/%n",
            "--layout",
            str(layout),
            "--json",
            "--wait",
            "8",
        )
        ended.join()
        assert neighbour.wait(10) == -signal.SIGKILL
        v = json.loads(res.stdout)["verdict"]
        assert (v["name"], v["odd_rank"]) == ("stalled-spinning", 3), v  # never crashed: not one of its ranks
        neighbour = neighbour_on_n1(tmp_path, "nb2")

        print(f"snapshot in {took:.1f} s")
        t_kill = time.monotonic()
        res = cli(slurm, "kill", f"slurm:{job}", "--sim", f"{tmp_path}/%n", "--yes", "--wait", "3")
        assert res.returncode == 0, res.stdout + res.stderr
        assert "[n1]" in res.stdout and "[n2]" in res.stdout  # one plan listing both nodes' processes
        assert "verified" in res.stdout and "node n1:" in res.stdout and "node n2:" in res.stdout
        deadline = time.monotonic() + 15
        while (run_procs(str(tmp_path)) or slurm.job_state(job) != "gone") and time.monotonic() < deadline:
            time.sleep(0.2)
        print(f"kill and the job's end in {time.monotonic() - t_kill:.1f} s")
        assert [line for line in run_procs(str(tmp_path)) if str(tmp_path / "nb2") not in line] == [], (
            "something of the run is left on a node"
        )
        assert slurm.job_state(job) == "gone"  # the batch script ended the job once its steps were gone
        assert neighbour.poll() is None, "the job's kill touched the server beside it"
    finally:
        subprocess.run(["scancel", job], env=slurm.env, capture_output=True)
        kill_groups([neighbour.pid])


async def test_d_L_and_K_on_a_two_node_job_screen(slurm, tmp_path, monkeypatch):  # noqa: F811
    """The screen of a `slurm:JOB` run (a ClusterMonitor, the Monitor protocol like one host's):
    `d` dumps every rank on both nodes, `L` shows the layout's runs, `K` asks with both nodes'
    processes, stops them through the one stop workflow and reads `no run`, nothing left."""
    from simhost import until

    from cockpit.host.session import SessionOptions
    from cockpit.monitor.cluster import ClusterMonitor
    from cockpit.runs.layoutfile import parse_layout
    from cockpit.ui.app import CockpitApp, save_text
    from cockpit.ui.screens import ConfirmScreen, ReportScreen

    for key, value in slurm.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")  # py-spy on the nodes
    job = start_job(slurm, tmp_path, "--sim-traffic 2")
    try:
        path = tmp_path / "layout.yaml"
        path.write_text(LAYOUT)
        layout = parse_layout(LAYOUT, str(path))
        monitor = ClusterMonitor(
            parse_target(f"slurm:{job}"),
            SessionOptions(python=sys.executable, interval=0.5, sim_state=f"{tmp_path}/%n"),
            layout,
        )
        app = CockpitApp(monitor=monitor)
        async with app.run_test(size=(160, 50)) as pilot:
            await until(pilot, lambda: len([p for p in app.state.ranks() if p.alive]) == 4, 60)
            await until(pilot, lambda: app.cockpit.check_action("dump", ()), 20)
            await pilot.press("d")
            await until(pilot, lambda: isinstance(app.screen, ReportScreen) or app.cockpit.busy is None, 90)
            assert isinstance(app.screen, ReportScreen), (app.cockpit.actions.outcome, save_text(app, None))
            await until(pilot, lambda: "stacks of 4 ranks" in save_text(app, None), 10)  # drawn on the next refresh
            report = "\n".join(map(str, app.screen.lines))  # the whole report, not only what the screen shows
            assert dumped_ranks(report) == {0, 1, 2, 3}, report  # grouped by stack: which group a rank is in varies
            await pilot.press("escape")
            await until(pilot, lambda: not isinstance(app.screen, ReportScreen), 10)
            await until(pilot, lambda: app.cockpit.busy is None, 30)
            await pilot.press("L")
            await until(pilot, lambda: isinstance(app.screen, ReportScreen), 10)
            await until(pilot, lambda: "runs of two-nodes" in save_text(app, None), 10)
            await pilot.press("escape")
            await until(pilot, lambda: not isinstance(app.screen, ReportScreen), 10)
            await pilot.press("K")
            await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), 60)
            await until(pilot, lambda: "[n2]" in save_text(app, None), 10)
            plan = save_text(app, None)
            assert "[n1]" in plan and "[n2]" in plan, plan  # one plan listing both nodes' processes
            await pilot.press("y")
            await until(pilot, lambda: monitor.verdict.name.value == "no run", 90)
            assert run_procs(str(tmp_path)) == [], "something of the run is left on a node"
    finally:
        subprocess.run(["scancel", job], env=slurm.env, capture_output=True)


def dumped_ranks(report: str) -> set[int]:
    """The ranks a stacks report names in its group lines (`ranks 0-1,3 (3), ...`, `rank 2 (1), ...`)."""
    found: set[int] = set()
    for spec in re.findall(r"\branks? ([\d,-]+) \(\d+\),", report):
        for part in spec.split(","):
            low, _, high = part.partition("-")
            found.update(range(int(low), int(high or low) + 1))
    return found


def test_slurm_errors_are_one_line_naming_the_job_and_the_fix(slurm):  # noqa: F811
    res = cli(slurm, "snapshot", "slurm:99999", "--json")
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "slurm:99999: no such job" in res.stderr and "squeue" in res.stderr
    res = run_cli("snapshot", "slurm:5", "--json", env={"PATH": "/nonexistent", "PYTHONPATH": str(REPO)})
    assert res.returncode == 2 and "squeue not found on this machine" in res.stderr, res.stderr


# ----------------------------------------------------------------------------- Docker and Podman


def site_packages() -> str:
    """psutil and setproctitle for the container's python3 (the host's /usr, bound in): this test
    run's own site-packages, bound read-only, so the host's system Python is left as it is."""
    import psutil
    import setproctitle

    site = Path(psutil.__file__).parent.parent
    assert Path(setproctitle.__file__).is_relative_to(site)
    return str(site)


def test_a_server_inside_a_container_is_watched_through_exec_and_killed(container_engine, tmp_path):  # noqa: F811
    """The same server and the same commands under Docker and under Podman."""
    engine, kind = container_engine, container_engine.kind
    site = site_packages()
    sim = tmp_path / "sim"
    fakenvml.write_host(str(sim), gpus=2, model="rtx-pro-6000", seed=5)
    port, name = free_port(), f"eng-{os.getpid()}"
    server = (
        f"python3 -u -m cockpit.sim.server --tp-size 2 --port {port} --sim-speed 4 --sim-shm-dir /tmp "
        f"> /tmp/server.log 2>&1"
    )
    engine.cli(
        "run",
        "-d",
        "--name",
        name,
        "--network",
        "host",
        "-v",
        "/usr:/usr:ro",
        "-v",
        "/etc:/etc:ro",
        "-v",
        f"{REPO}:/srv/cockpit:ro",
        "-v",
        f"{site}:/srv/site:ro",
        "-v",
        f"{sim}:{sim}",
        "-e",
        "PYTHONPATH=/srv/cockpit:/srv/site",
        "-e",
        f"COCKPIT_SIM_STATE={sim}",
        "cockpit-base",
        "/bin/sh",
        "-c",
        server,
    )
    env = {**engine.env, "PYTHONPATH": str(REPO)}
    try:
        deadline = time.monotonic() + 30
        while "fired up" not in engine.cli("exec", name, "cat", "/tmp/server.log", check=False).stdout:
            assert time.monotonic() < deadline, engine.cli("logs", name, check=False).stderr
            time.sleep(0.2)
        res = run_cli("snapshot", f"{kind}:{name}", "--sim", str(sim), "--json", env=env)
        assert res.returncode == 0, res.stderr
        doc = json.loads(res.stdout)
        assert doc["agent"]["executable"] == "/usr/bin/python3"  # the container's own Python
        ranks = {p["rank"]: p for p in doc["processes"] if p["rank"] is not None}
        assert sorted(ranks) == [0, 1] and all(p["gpus"] for p in ranks.values())
        assert doc["phase"]["name"] == "serving" and doc["log"]["path"] == "/tmp/server.log"
        assert doc["link"]["kind"] == kind and doc["link"]["host_pids_mapped"]
        host = doc["link"]["host_pids"][str(ranks[0]["pid"])]  # the container's pid, and the host's
        assert Path(f"/proc/{host}/cmdline").read_bytes().startswith(b"sglang::scheduler_TP0")
        assert any("pids are the container's" in w for w in doc["agent"]["warnings"])

        res = run_cli("kill", f"{kind}:{name}", "--sim", str(sim), "--yes", "--wait", "3", env=env)
        assert res.returncode == 0, res.stdout + res.stderr
        assert "verified" in res.stdout
        # the agent went down with the container: the engine is asked what is left (actions/kill.py, verify_gone)
        # Podman says `stopped` until conmon's cleanup has run, then `exited`, as below
        assert re.search(
            rf"container {name} (exited|stopped) \(exit code 0\): it went down with its main process, so "
            rf"nothing of it is left",
            res.stdout,
        ), res.stdout
        assert not Path(f"/proc/{host}").exists()
        deadline = time.monotonic() + 20  # Podman says `stopped` until conmon's cleanup has run, then `exited`
        while (state := engine.cli("inspect", "--format", "{{.State.Status}}", name).stdout.strip()) != "exited":
            assert state in ("stopped", "stopping") and time.monotonic() < deadline, state
            time.sleep(0.2)

        res = run_cli("snapshot", f"{kind}:{name}", "--json", env=env)
        assert res.returncode == 2 and f"container {name} is exited, not running (`{kind} start {name}`)" in res.stderr
        res = run_cli("snapshot", f"{kind}:no-such-box", "--json", env=env)
        assert res.returncode == 2 and "no container named no-such-box" in res.stderr, res.stderr
    finally:
        engine.cli("rm", "-f", name, check=False)
