"""One truth per host: what a launch started and who stopped which processes are records on the
host (cockpit/agent/acts.py), read by every cockpit that looks, whatever process or machine it
runs in: a followed run killed from another terminal reads `stopped`, then `no run`, on a screen
and on the exporter's monitor alike, never `crashed`."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import urllib.request

import pytest
from conftest import free_port, run_cli
from simhost import kill_groups, wait_for

from cockpit.agent import acts as acts_mod
from cockpit.agent.protocol import Refused
from cockpit.host.session import SessionOptions, WatchList
from cockpit.link.target import parse_target
from cockpit.monitor.base import PLAIN_LOOK_S
from cockpit.monitor.host import HostMonitor


def test_a_record_written_by_one_agent_is_read_by_another_and_only_once(tmp_path):
    path = str(tmp_path / "state" / "gpu-cockpit" / "host" / "acts.jsonl")
    writer, reader = acts_mod.Acts(path), acts_mod.Acts(path)
    assert reader.poll() is None  # nothing yet: nothing to say
    writer.note({"act": "launch", "run_id": "r1", "layout": "demo", "pgid": 4242, "start": 100})
    got = reader.poll()
    assert [r["run_id"] for r in got] == ["r1"] and got[0]["boot"] and got[0]["id"]
    assert reader.poll() is None  # unchanged: nothing read again
    writer.note({"act": "stop", "why": "cockpit kill", "processes": [[4242, 100, 1.0]], "pgids": [4242]})
    assert [r["act"] for r in reader.poll()] == ["stop"]
    assert os.stat(path).st_mode & 0o777 == 0o600 and os.stat(os.path.dirname(path)).st_mode & 0o777 == 0o700
    # a fresh reader (a new agent) reads the recent record whole
    assert [r["act"] for r in acts_mod.Acts(path).poll()] == ["launch", "stop"]


def test_launches_ended_since_are_not_hints_and_other_layouts_are_left_out(tmp_path):
    path = str(tmp_path / "acts.jsonl")
    acts = acts_mod.Acts(path)
    acts.note({"act": "launch", "run_id": "a", "layout": "demo", "pgid": 10, "start": 1})
    acts.note({"act": "launch", "run_id": "b", "layout": "other", "pgid": 11, "start": 1})
    acts.note({"act": "launch", "run_id": "c", "layout": "demo", "pgid": 12, "start": 1})
    acts.note({"act": "ended", "pgids": [10], "processes": [[10, 1, 1.0]]})
    assert [r["run_id"] for r in acts.launched("demo")] == ["c"]


def test_a_long_record_starts_again_from_its_tail_and_a_reader_misses_no_record(tmp_path, monkeypatch):
    monkeypatch.setattr(acts_mod, "MAX_BYTES", 4096)
    monkeypatch.setattr(acts_mod, "TAIL_BYTES", 1024)
    path = str(tmp_path / "acts.jsonl")
    writer, reader = acts_mod.Acts(path), acts_mod.Acts(path)
    seen = []
    for n in range(200):
        writer.note({"act": "launch", "run_id": "r%d" % n, "layout": "x", "pgid": n + 1, "start": 1})
        seen += [r["id"] for r in reader.poll() or []]
    assert os.path.getsize(path) <= 4096 + 256
    assert len(set(seen)) == 200  # each read once at least: a start again re-reads the tail it kept (ids tell)
    assert "r199" in open(path).read() and 'r0"' not in open(path).read()


def test_a_planted_symlink_or_a_folder_others_can_write_is_refused(tmp_path):
    folder = tmp_path / "host"
    folder.mkdir(mode=0o700)
    target = tmp_path / "elsewhere"
    target.write_text("")
    (folder / "acts.jsonl").symlink_to(target)
    with pytest.raises(OSError):
        acts_mod.Acts(str(folder / "acts.jsonl")).note({"act": "stop", "processes": []})
    assert target.read_text() == ""
    open_folder = tmp_path / "open"
    open_folder.mkdir()
    open_folder.chmod(0o777)
    with pytest.raises(Refused):
        acts_mod.Acts(str(open_folder / "acts.jsonl")).note({"act": "stop", "processes": []})


def test_records_of_another_boot_and_malformed_lines_are_skipped(tmp_path):
    path = tmp_path / "acts.jsonl"
    good = acts_mod.Acts(str(path)).note({"act": "stop", "processes": []})
    with open(path, "a") as fh:
        fh.write(json.dumps(dict(good, id="old", boot=good["boot"] - 3600)) + "\n")
        fh.write("{not json\n")
        fh.write(json.dumps({"act": "format-disk", "id": "x", "boot": good["boot"], "at": 1}) + "\n")
    assert [r["id"] for r in acts_mod.Acts(str(path)).poll()] == [good["id"]]


SERVER = [sys.executable, "-m", "cockpit.sim.server", "--tp-size", "2", "--sim-speed", "4"]


def by_hand(tmp_path, sim_state, *flags: str, stall: str = ""):
    """The simulated server started by hand (its own session, its output to server.log) and a
    layout naming its port, log and processes: (the server, the layout file, the Layout, port)."""
    from cockpit.runs.layoutfile import load_layout

    port = free_port()
    log = tmp_path / "server.log"
    server = subprocess.Popen(
        SERVER + ["--port", str(port), "--sim-shm-dir", str(tmp_path), *flags],
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, "COCKPIT_SIM_STATE": str(sim_state)},
    )
    layout = tmp_path / "ours.yaml"
    layout.write_text(
        f"engine: sglang\ncommand: [-m, cockpit.sim.server]\nports: [{port}]\nlog: {log}\n"
        f"watch: ['*cockpit.sim.server*--sim-shm-dir {tmp_path}*']\n{stall}"
    )
    return server, layout, load_layout(str(layout)), port


def watching(lay, sim_state) -> HostMonitor:
    """A monitor of the local host as a screen keeps one, sampling every 0.25 s."""
    return HostMonitor(
        parse_target("local"),
        SessionOptions(python=sys.executable, interval=0.25, sim_state=str(sim_state)),
        layout=lay,
        watch=WatchList.for_layout(lay),
        probe_every_s=0.25,
    )


async def test_a_followed_run_killed_from_another_terminal_reads_stopped_then_no_run_everywhere(
    sim_state, tmp_path, monkeypatch
):
    """A server started by hand, followed by two monitors (a screen's and the exporter's: no
    launch, no ledger run), is stopped with `cockpit kill` from another process: both read the
    deaths as the operator's (`stopped`, then `no run`), never `crashed`."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    server, layout, lay, _ = by_hand(tmp_path, sim_state)
    monitors = [watching(lay, sim_state) for _ in range(2)]
    seen: list[list[str]] = [[], [], []]
    kept = []
    eport = free_port()
    exporter = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cockpit",
            "exporter",
            "--hosts",
            "local",
            "--layout",
            str(layout),
            "--sim",
            str(sim_state),
            "--interval",
            "0.5",
            "--listen",
            f"127.0.0.1:{eport}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")},
    )

    def scraped() -> str | None:
        """The exporter's verdict now (each new one noted in seen[2])."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{eport}/metrics", timeout=5) as resp:
                text = resp.read().decode()
        except OSError:
            return None
        now = re.search(r'gpu_cockpit_verdict\{host="local",state="([^"]+)"\} 1\.0', text)
        if now and (not seen[2] or seen[2][-1] != now.group(1)):
            seen[2].append(now.group(1))
        return now.group(1) if now else None

    try:
        for n, m in enumerate(monitors):
            m.subscribe(lambda e, n=n, m=m: seen[n].append(m.verdict.name.value) if e.kind == "verdict" else None)
            await m.open(kept=True)
            kept.append(asyncio.create_task(m.keep()))
        await wait_for(
            lambda: all(m.phase.name in ("ready", "serving") and len(m.state.ranks()) == 2 for m in monitors),
            90,
            "both monitors see the run up",
        )
        await wait_for(lambda: scraped() == "ok", 90, "the exporter reads the run ok")
        killer = asyncio.create_task(
            asyncio.to_thread(
                run_cli,
                "kill",
                "local",
                "--layout",
                str(layout),
                "--yes",
                timeout=120,
                env={"XDG_STATE_HOME": str(tmp_path / "state")},
            )
        )
        while not killer.done():
            await asyncio.to_thread(scraped)
            await asyncio.sleep(0.2)
        res = killer.result()
        assert res.returncode == 0 and "verified" in res.stdout, (res.stdout, res.stderr)
        await wait_for(lambda: all(m.verdict.name.value == "no run" for m in monitors), 30, "no run on both")
        await wait_for(lambda: scraped() == "no run", 30, "no run on the exporter")
        for verdicts in seen[:2]:
            assert "crashed" not in verdicts and "stopped" in verdicts, seen
            assert verdicts.index("stopped") < verdicts.index("no run"), seen
        assert "crashed" not in seen[2] and seen[2][-1] == "no run", seen  # scraped: `stopped` may fall between
        stop = next(r for r in monitors[0].state.acts.values() if r["act"] == "stop")
        assert stop["why"].startswith("cockpit kill") and "@" in stop["by"]
    finally:
        exporter.terminate()
        exporter.wait(30)
        for task in kept:
            task.cancel()
        kill_groups([server.pid])
        for m in monitors:
            await m.close()


async def test_a_strangers_listener_on_a_stalled_runs_port_never_clears_the_stall(sim_state, tmp_path, monkeypatch):
    """The run hung capturing its draft CUDA graphs (port never open); another job binds the
    layout's port. The stall holds on every sample, and the evidence names the stranger."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    server, _, lay, port = by_hand(
        tmp_path, sim_state, "--speculative-algorithm", "EAGLE3", stall="stall: {idle_s: 4, spin_s: 4}\n"
    )
    monitor = watching(lay, sim_state)
    stranger = None
    kept = None
    try:
        await monitor.open(kept=True)
        kept = asyncio.create_task(monitor.keep())
        await wait_for(lambda: monitor.verdict.name.value == "stalled-idle", 90, "the capture hang declared")
        stranger = subprocess.Popen(
            [
                sys.executable,
                "-I",
                "-c",
                f"import socket,time; s=socket.socket(); s.bind(('127.0.0.1',{port})); s.listen(); time.sleep(600)",
            ],
            start_new_session=True,
        )
        await wait_for(
            lambda: any(pt.port == port and pt.listening for pt in monitor.state.ports),
            20,
            "the stranger's listener seen",
        )
        said = []
        for _ in range(16):
            await monitor.session.wait_samples(1)
            said.append(monitor.verdict.name.value)
        assert set(said) == {"stalled-idle"}, said
        assert any(
            f"port {port} held by pid {stranger.pid}" in e and "not the run" in e and monitor.state.ports
            for e in monitor.verdict.evidence
        ), (monitor.verdict.evidence, monitor.state.ports)
    finally:
        if kept is not None:
            kept.cancel()
        kill_groups([server.pid] + ([stranger.pid] if stranger else []))
        await monitor.close()


def test_a_launch_hung_before_its_port_opens_is_found_and_judged_cold_with_the_odd_rank(sim_state, tmp_path):
    """`cockpit launch` of a TP-2 run whose rank 1 stops while capturing CUDA graphs (the other
    waits in its all-reduce; the server listens on a store port of its own, never on the
    layout's): the launch exits 4 (stalled) with the ranks' Python frames. Then a cold look from
    another process, with no ledger at all (a colleague's machine), finds the run from the
    host's record alone, says stalled-idle and names rank 1, from forensics it gathers itself."""
    import shutil

    port = free_port()
    layout = tmp_path / "hang.yaml"
    layout.write_text(f"""name: hang{port}
engine: sglang
command: [-m, cockpit.sim.server]
base_flags: [--tp-size, "2", --port, "{port}", --sim-speed, "4", --sim-store-port, --sim-capture-hang-rank, "1",
             --sim-shm-dir, "{tmp_path}"]
log_dir: {tmp_path}
ports: [{port}]
watch: []
kill_wait_s: 2
stall: {{idle_s: 4, spin_s: 4}}
""")
    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    common = ["local", "--sim", str(sim_state), "--layout", str(layout)]
    try:
        launched = run_cli("launch", *common, "--yes", "--timeout", "60", env=env, timeout=180)
        assert launched.returncode == 4, (launched.stdout, launched.stderr)  # stalled
        assert ": stalled-idle" in launched.stdout
        frames = [line for line in launched.stdout.splitlines() if line.startswith("  stacks:     ")]
        assert any("wait_for_graph_pool" in line for line in frames), launched.stdout  # the frames themselves
        shutil.rmtree(tmp_path / "state" / "gpu-cockpit" / "ledger")  # the launcher's own memory: gone
        shutil.rmtree(tmp_path / "state" / "gpu-cockpit" / "runs", ignore_errors=True)
        cold = run_cli("snapshot", *common, "--json", env=env, timeout=180)
        assert cold.returncode == 0, cold.stderr
        doc = json.loads(cold.stdout)
        assert doc["verdict"]["name"] == "stalled-idle", doc["verdict"]
        assert doc["verdict"]["odd_rank"] == 1, doc["verdict"]
        assert any("rank 1" in e and "wait_for_graph_pool" in e for e in doc["verdict"]["evidence"]), doc["verdict"]
        assert len([p for p in doc["processes"] if p.get("rank") is not None]) == 2
    finally:
        subprocess.run(["pkill", "-9", "-f", f"sim.server.*--port {port}"])


def test_ctrl_c_at_the_kill_prompt_writes_nothing_anywhere(sim_state, tmp_path):
    """A launched run, then `cockpit kill` asked at a terminal and answered with Ctrl+C: the run
    lives, and neither the ledger nor the host's record gained a line."""
    import signal
    import time

    port = free_port()
    layout = tmp_path / "ok.yaml"
    layout.write_text(f"""name: ok{port}
engine: sglang
command: [-m, cockpit.sim.server]
base_flags: [--tp-size, "2", --port, "{port}", --sim-speed, "8", --sim-shm-dir, "{tmp_path}"]
log_dir: {tmp_path}
ports: [{port}]
watch: []
kill_wait_s: 2
""")
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    common = ["local", "--sim", str(sim_state), "--layout", str(layout)]
    try:
        launched = run_cli("launch", *common, "--yes", "--timeout", "60", env=env, timeout=180)
        assert launched.returncode == 0 and ": ready" in launched.stdout, (launched.stdout, launched.stderr)
        state = tmp_path / "state" / "gpu-cockpit"
        ledger = state / "ledger" / f"ok{port}.jsonl"
        acts = state / "host" / "acts.jsonl"
        before = (ledger.read_bytes(), acts.read_bytes())
        master, slave = os.openpty()
        asker = subprocess.Popen(
            [sys.executable, "-m", "cockpit", "kill", *common],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=env,
            start_new_session=True,
        )
        os.close(slave)
        said = b""
        deadline = time.monotonic() + 60
        while b"[y/N]" not in said and time.monotonic() < deadline:
            try:
                said += os.read(master, 4096)
            except OSError:
                break
        assert b"[y/N]" in said, said
        asker.send_signal(signal.SIGINT)  # Ctrl+C at the prompt
        assert asker.wait(30) == 130
        os.close(master)
        after = (ledger.read_bytes(), acts.read_bytes())
        assert after == before, [a[len(b) :] for a, b in zip(after, before)]
        check = run_cli("snapshot", *common, "--json", "--wait", "0", env=env, timeout=120)
        assert json.loads(check.stdout)["verdict"]["name"] != "no run"  # the run lives
    finally:
        subprocess.run(["pkill", "-9", "-f", f"sim.server.*--port {port}"])


def test_one_shm_rule_in_the_same_words_and_a_clean_counts_what_really_went(tmp_path):
    """An entry no process holds is said the same way by `cockpit shm` (removable when asked)
    and by a relaunch's clean (left: not this run's); a clean whose entries the run's own exit
    already removed says they are gone, not kept."""
    from cockpit.actions import kill as actions
    from cockpit.agent import shm as agent_shm
    from cockpit.runs import run as runmod

    name = f"psm_gpu-cockpit-test-{os.getpid()}-orphan"
    (tmp_path / name).write_bytes(b"x" * 4096)
    audit = agent_shm.shm_audit(str(tmp_path))
    entry = next(e for e in audit["entries"] if e["name"] == name)
    assert entry["removable"]
    listed = "\n".join(actions.describe_shm(audit))
    left = actions.shm_for_run(audit, actions.KillPlan(runmod.Scope(), [], None)).left
    words = actions.unclaimed(entry)
    assert words in listed and [e["why"] for e in left if e["name"] == name][0].startswith(words)
    (tmp_path / name).unlink()  # the run's exit removed it first
    done = agent_shm.shm_clean(str(tmp_path), [actions.listed(entry)], other_dir=True)
    assert done["removed"] == [] and done["skipped"][0]["gone"]
    assert actions.summarize_clean(done) == "removed 0 /dev/shm entries, 1 already gone"


async def test_two_cockpits_on_one_stall_gather_its_forensics_once_and_both_name_the_rank(
    sim_state, tmp_path, monkeypatch
):
    """Two screens watch a launch that hangs while capturing CUDA graphs (rank 1 outside the
    collective): one claims the stall's forensics on the host and gathers them, the other waits
    for them (py-spy twice on one rank answers nothing); both name rank 1, and the host's record
    holds one result."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    server, _, lay, _ = by_hand(
        tmp_path, sim_state, "--sim-capture-hang-rank", "1", stall="stall: {idle_s: 4, spin_s: 4}\n"
    )
    monitors = [watching(lay, sim_state) for _ in range(2)]
    kept = []
    try:
        for m in monitors:
            m.forensics_on = True
            await m.open(kept=True)
            kept.append(asyncio.create_task(m.keep()))
        await wait_for(
            lambda: all(m.forensics is not None and m.forensics.folder and m.verdict.odd_rank == 1 for m in monitors),
            120,
            "both read the forensics and name rank 1",
            lambda: [(m.verdict.name.value, m.verdict.evidence[-2:], m.forensics) for m in monitors],
        )
        await monitors[0].session.wait_samples(2)  # the result's record, read back from the host
        done = [r for r in monitors[0].state.acts.values() if r["act"] == "forensics" and r["state"] == "done"]
        assert len(done) == 1, done
        assert all(m.forensics is not None and m.forensics.folder == done[0]["doc"]["folder"] for m in monitors)
    finally:
        for task in kept:
            task.cancel()
        kill_groups([server.pid])
        for m in monitors:
            await m.close()


def test_a_plain_look_answers_in_seconds_whatever_it_finds(sim_state, tmp_path):
    """An idle server of a layout with `engine: none` (its own process listening on the port) is
    `ok`, with that evidence; one sleeping process of a layout's command cannot be decided
    at a glance (its layout's run, found by its command): the look says so, and how to watch
    longer, instead of waiting out a stall window."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-I", "-m", "http.server", "--bind", "127.0.0.1", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=tmp_path,
        start_new_session=True,
    )
    script = tmp_path / f"detok{port}.py"  # the bare layout's command: its run, found by the command rule
    script.write_text("import time\ntime.sleep(600)\n")  # not retitled: its command line stays its command
    sleeper = subprocess.Popen([sys.executable, str(script)], start_new_session=True)
    try:
        import time

        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                import socket

                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        layout = tmp_path / "plain.yaml"
        layout.write_text(
            f"engine: none\ncommand: [-m, http.server]\nports: [{port}]\nwatch: ['*http.server*{port}*']\n"
        )
        res = run_cli("snapshot", "local", "--sim", str(sim_state), "--layout", str(layout), "--json", timeout=120)
        assert res.returncode == 0, res.stderr
        doc = json.loads(res.stdout)
        assert doc["verdict"]["name"] == "ok", doc["verdict"]
        assert f"up: port {port} open, held by the run's pid {server.pid}" in doc["verdict"]["evidence"][0]
        bare = tmp_path / "bare.yaml"
        bare.write_text(f"command: [{script.name}]\nwatch: ['sglang::detokenizer {tmp_path}*']\n")
        res = run_cli("snapshot", "local", "--sim", str(sim_state), "--layout", str(bare), "--json", timeout=120)
        assert res.returncode == 0, res.stderr
        doc = json.loads(res.stdout)
        assert doc["verdict"]["name"] == "watching", doc["verdict"]
        assert any("not decided in this look: watch longer with --wait S" in e for e in doc["verdict"]["evidence"])
        # on the look's own clock: PLAIN_LOOK_S waited out (undecided), not the stall window (120 s); connecting the rest
        assert PLAIN_LOOK_S <= doc["looked_s"] < PLAIN_LOOK_S + 15, doc["looked_s"]
    finally:
        kill_groups([server.pid, sleeper.pid])
