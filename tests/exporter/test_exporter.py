"""`cockpit exporter`: the shipped alert rules checked and unit-tested by promtool; host text in
labels bounded, masked and escaped; `--on-change` running an argv (never a shell) with the change
in its environment, one at a time per host, bounded by its timeout; and end to end, a real
Prometheus scraping the exporter that watches the demo host stalling, its stall alert firing
(asked through Prometheus's HTTP API), the hook told of the stall."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from conftest import free_port, need, run_cli
from fixtures_shared import FAST_DEMO
from prometheus_client.parser import text_string_to_metric_families
from simhost import wait_for

from cockpit import exporter
from cockpit.host.session import SessionOptions, WatchList
from cockpit.host.state import Gpu
from cockpit.judge.verdict import Verdict, VerdictName
from cockpit.link.target import parse_target
from cockpit.monitor import demo
from cockpit.monitor.fleet import Fleet, FleetHost, FleetMonitor
from cockpit.monitor.host import HostMonitor
from cockpit.runs.layouts import resolve_layout

ROOT = Path(__file__).resolve().parents[2]
RULES_TEST = ROOT / "tests" / "alerts" / "gpu-cockpit-rules.test.yml"
CAPTURE = os.environ.get("COCKPIT_EXPORTER_CAPTURE")  # a folder: keep Prometheus's answers (docs/exporter.md)


# ----------------------------------------------------------------------------- the rules


def test_the_shipped_rules_pass_promtool_check_and_their_unit_tests():
    promtool = need("promtool", package="prometheus")
    check = subprocess.run(
        [promtool, "check", "rules", str(exporter.RULES)], capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0 and "SUCCESS: 9 rules found" in check.stdout, check.stdout + check.stderr
    test = subprocess.run([promtool, "test", "rules", str(RULES_TEST)], capture_output=True, text=True, timeout=60)
    assert test.returncode == 0 and "SUCCESS" in test.stdout, test.stdout + test.stderr
    printed = run_cli("exporter", "--print-rules")
    assert printed.returncode == 0 and printed.stdout == exporter.RULES.read_text()


def test_the_rules_travel_in_the_package():
    assert exporter.RULES.is_file() and exporter.RULES.parent.parent == Path(exporter.__file__).parent


# ----------------------------------------------------------------------------- labels

HOSTILE = 'gpu-"a"\\b\n\x1b[2J\u202e https://ops:hunter2@example.com/x ' + "z" * 200


def fleet_of(*names: str) -> FleetMonitor:
    return FleetMonitor(Fleet(hosts=[FleetHost(target="local", name=n) for n in names]))


def judged(member, verdict: Verdict, gpus: int = 2) -> None:
    """A member as if sampled and judged (no connection: the collector reads the same fields)."""
    s = member.state
    s.seq, s.link_state, s.sample_ts, s.received_at = 3, "up", time.time(), time.monotonic()
    for i in range(gpus):
        s.gpus[i] = Gpu(
            index=i, util_pct=97, mem_used_mib=1024, mem_total_mib=81920, temp_c=61, power_w=310.5, ecc_uncorrected=0
        )
    member.monitor.verdict = verdict


def exposition(exp: exporter.Exporter) -> str:
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(exporter.LoopCollector(exp, None))  # called on this thread: read directly
    return generate_latest(registry).decode()


def test_host_text_in_labels_is_masked_bounded_and_escaped():
    watch = fleet_of(HOSTILE, "gpu-b")
    judged(
        watch.members[0],
        Verdict(
            VerdictName.STALLED_SPINNING,
            ["x"],
            odd_rank=3,
            detail="launch stopped at 'loading weights'",
            since=time.time() - 42,
        ),
    )
    judged(watch.members[1], Verdict(VerdictName.OK, ["tokens moving"]))
    text = exposition(exporter.Exporter(watch))
    assert "hunter2" not in text and "\x1b" not in text and "\u202e" not in text
    assert all(len(line) < 400 for line in text.splitlines())
    want = exporter.label(HOSTILE)
    assert len(want) == exporter.LABEL_MAX and want.endswith("…") and "^[[2J" in want and "\\u202e" in want
    assert "\\n" not in want and "^J" in want  # the newline shown, not kept
    families = {f.name: f for f in text_string_to_metric_families(text)}  # the escaping reads back exactly
    hosts = {s.labels["host"] for s in families["gpu_cockpit_verdict"].samples}
    assert hosts == {want, "gpu-b"}
    for fam in families.values():  # no label is free text: a known set, a GPU index, a rank
        for s in fam.samples:
            assert set(s.labels) <= {"host", "state", "gpu", "rank", "run", "layout", "result", "xid"}, s
            assert all(len(v) <= exporter.LABEL_MAX for v in s.labels.values()), s
    current = {s.labels["host"]: s.labels["state"] for s in families["gpu_cockpit_verdict"].samples if s.value == 1}
    assert current == {want: "stalled-spinning", "gpu-b": "ok"}
    assert len(families["gpu_cockpit_verdict"].samples) == 2 * len(exporter.VERDICTS)
    stall = {s.labels["state"] for s in families["gpu_cockpit_stall_evidence"].samples if s.value == 1}
    assert stall == {"launch_stopped"}
    odd = {s.labels["host"]: (s.labels["rank"], s.value) for s in families["gpu_cockpit_odd_rank_info"].samples}
    assert odd == {want: ("3", 1.0)}
    secs = {s.labels["host"]: s.value for s in families["gpu_cockpit_verdict_seconds"].samples}
    assert 41 <= secs[want] < 60
    util = [s for s in families["gpu_cockpit_gpu_utilization_ratio"].samples if s.labels["host"] == "gpu-b"]
    assert sorted(s.labels["gpu"] for s in util) == ["0", "1"] and all(s.value == 0.97 for s in util)
    promtool = shutil.which("promtool")
    if promtool:  # the exposition as Prometheus's own linter reads it
        lint = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
        assert lint.returncode == 0, lint.stdout + lint.stderr


def test_identifiers_are_labels_of_info_series_and_counts_are_counters():
    """Prometheus's conventions (docs/exporter.md): an Xid code and the odd rank are labels of
    series whose value is 1; the engine's generation tokens and the ECC count are `_total`
    counters (the cockpit's own tokens/s stays beside); a run the cockpit did not launch is named
    by its process group; `promtool check metrics` finds nothing to say."""
    from cockpit.host.state import Proc, XidEvent
    from cockpit.read.metrics import Scrape

    watch = fleet_of("gpu-a", "gpu-b")
    a, b = watch.members
    judged(a, Verdict(VerdictName.STALLED_SPINNING, ["x"], odd_rank=5))
    judged(b, Verdict(VerdictName.OK, ["tokens moving"]))
    s = a.state
    s.gpus[1].ecc_uncorrected = 2
    now = s.sample_ts
    s.xid = [XidEvent(1, now - 900, 31), XidEvent(1, now - 60, 79), XidEvent(1, now - 30, 48), XidEvent(1, now - 5, 79)]
    for n in range(3):  # a run started by hand: ranks in process group 4242, no ledger record
        s.procs[100 + n] = Proc(
            pid=100 + n, ppid=1, cmdline=[f"sglang::scheduler_TP{n}"], status="S", rank=n, pgid=4242
        )
    b.state.metrics.add(Scrape(time.monotonic() - 2, 200, {"generation_tokens": 1000.0, "running": 2.0}))
    b.state.metrics.add(Scrape(time.monotonic(), 200, {"generation_tokens": 1600.0, "running": 2.0}))
    text = exposition(exporter.Exporter(watch))
    families = {f.name: f for f in text_string_to_metric_families(text)}
    xids = {(x.labels["gpu"], x.labels["xid"]): x.value for x in families["gpu_cockpit_gpu_xid_info"].samples}
    assert xids == {("1", "79"): 1.0, ("1", "48"): 1.0}  # the last 5 minutes' codes, each once
    count = {x.labels["gpu"]: x.value for x in families["gpu_cockpit_gpu_xid_recent_events"].samples}
    assert count == {"1": 3.0}
    assert "gpu_cockpit_gpu_xid_recent{" not in text and "gpu_cockpit_odd_rank{" not in text
    assert families["gpu_cockpit_gpu_ecc_uncorrected_errors"].type == "counter"
    ecc = {
        (x.labels["host"], x.labels["gpu"]): x.value
        for x in families["gpu_cockpit_gpu_ecc_uncorrected_errors"].samples
        if x.name.endswith("_total")
    }
    assert ecc[("gpu-a", "1")] == 2.0 and ecc[("gpu-a", "0")] == 0.0
    tokens = families["gpu_cockpit_generation_tokens"]
    assert tokens.type == "counter" and [(x.name, x.value) for x in tokens.samples if x.name.endswith("_total")] == [
        ("gpu_cockpit_generation_tokens_total", 1600.0)
    ]
    rate = families["gpu_cockpit_tokens_per_second"].samples
    assert [x.labels["host"] for x in rate] == ["gpu-b"] and 250 < rate[0].value < 350
    runs = {x.labels["host"]: x.labels["run"] for x in families["gpu_cockpit_run_info"].samples}
    assert runs == {"gpu-a": "pgid:4242"}  # gpu-b has no run: no series, never run=""
    lint = subprocess.run(
        [need("promtool", package="prometheus"), "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert lint.returncode == 0 and not (lint.stdout + lint.stderr).strip(), lint.stdout + lint.stderr


def test_link_states_and_stall_kinds_are_a_fixed_set():
    assert [
        exporter.link_kind(t) for t in ("up", "waiting", "connecting", "down, retrying (3)", "lost, retrying (1)")
    ] == ["up", "connecting", "connecting", "down", "lost"]
    kinds = [
        exporter.stall_kind(Verdict(VerdictName.STALLED_IDLE, [], detail=d))
        for d in ("requests frozen", "serving stopped", "launch stopped at 'kv cache'", None)
    ]
    assert kinds == ["requests_frozen", "serving_stopped", "launch_stopped", "other"]
    assert exporter.stall_kind(Verdict(VerdictName.OK, [])) is None


def test_listen_is_loopback_unless_told_and_mistakes_are_one_line():
    assert exporter.parse_listen("127.0.0.1:9841") == ("127.0.0.1", 9841)
    assert exporter.parse_listen(":9000") == ("127.0.0.1", 9000)
    assert exporter.parse_listen("[::1]:9000") == ("::1", 9000)
    for bad in ("9841", "host.example:99", "127.0.0.1:0", "127.0.0.1:http"):
        with pytest.raises(exporter.CockpitError):
            exporter.parse_listen(bad)
    out = run_cli("exporter", "--hosts", "local", "--listen", "nowhere")
    assert out.returncode == 2 and out.stderr.startswith("cockpit: --listen nowhere: give ADDR:PORT")
    out = run_cli("exporter", "--hosts", "local", "--on-change", "/no/such/hook --flag")
    assert out.returncode == 2 and "'/no/such/hook' is not an executable file" in out.stderr
    assert "Traceback" not in out.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        out = run_cli("exporter", "--hosts", "local", "--listen", f"127.0.0.1:{port}")
    assert out.returncode == 2 and out.stderr.startswith(f"cockpit: --listen 127.0.0.1:{port}: cannot listen there")
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


# ----------------------------------------------------------------------------- --on-change

HOOK = """#!/bin/sh
# writes the change it is told of to "$1" (one file per run), then sleeps "$2" seconds
out="$1.$$"
env | grep '^GPU_COCKPIT_' | sort > "$out.tmp"
printf 'argc=%s\\n' "$#" >> "$out.tmp"
mv "$out.tmp" "$out"
sleep "${2:-0}"
"""


def hook_script(tmp_path: Path) -> Path:
    script = tmp_path / "hook.sh"
    script.write_text(HOOK)
    script.chmod(0o755)
    return script


def runs_written(prefix: Path) -> list[dict]:
    out = []
    for f in sorted(prefix.parent.glob(prefix.name + ".*")):
        if f.suffix == ".tmp":
            continue
        out.append(dict(line.split("=", 1) for line in f.read_text().splitlines() if "=" in line))
    return out


async def test_on_change_runs_the_argv_with_the_change_in_its_environment(tmp_path):
    folder = tmp_path / "a dir; rm -rf ~"  # a space and a semicolon: split once, never a shell
    folder.mkdir()
    prefix = folder / "env"
    hook = exporter.OnChange.parse(f"{hook_script(tmp_path)} '{prefix}' 0")
    watch = fleet_of("gpu-a")
    m = watch.members[0]
    exp = exporter.Exporter(watch, hook)
    exp.watch()
    since = time.time() - 75
    judged(
        m,
        Verdict(
            VerdictName.STALLED_IDLE,
            ["all 8 ranks alive, CPU < 5 %", "log silent for 75 s"],
            odd_rank=5,
            detail="requests frozen",
            since=since,
        ),
    )
    exp.verdict_changed(m, Verdict(VerdictName.OK, []))  # what the monitor's listener hands on
    [env] = await wait_for(lambda: runs_written(prefix), 20, "the hook's run")
    assert env["GPU_COCKPIT_HOST"] == "gpu-a" and env["GPU_COCKPIT_TARGET"] == "local"
    assert env["GPU_COCKPIT_VERDICT"] == "stalled-idle" and env["GPU_COCKPIT_PREVIOUS"] == "ok"
    assert env["GPU_COCKPIT_RANK"] == "5" and env["GPU_COCKPIT_DETAIL"] == "requests frozen"
    assert abs(__import__("datetime").datetime.fromisoformat(env["GPU_COCKPIT_SINCE"]).timestamp() - since) < 1.5
    assert env["GPU_COCKPIT_EVIDENCE"] == "all 8 ranks alive, CPU < 5 % | log silent for 75 s"
    assert env["argc"] == "2"  # the quoted folder stayed one argument
    await wait_for(lambda: not hook.running, 20, "the run to end")
    assert hook.results["ok"] == 1


async def test_on_change_runs_one_at_a_time_per_host_and_is_bounded(tmp_path):
    prefix = tmp_path / "env"
    hook = exporter.OnChange.parse(f"{hook_script(tmp_path)} {prefix} {SLEEP}", timeout_s=1.5)
    hook.err = open(os.devnull, "w")
    watch = fleet_of("gpu-a", "gpu-b")
    exp = exporter.Exporter(watch, hook)
    exp.watch()
    a, b = watch.members
    steps = [VerdictName.WATCHING, VerdictName.OK, VerdictName.SLOW, VerdictName.STALLED_IDLE]
    for before, now in zip(steps, steps[1:]):  # three changes at once on gpu-a
        judged(a, Verdict(now, []))
        exp.verdict_changed(a, Verdict(before, []))
    judged(b, Verdict(VerdictName.CRASHED, [], odd_rank=2))
    exp.verdict_changed(b, Verdict(VerdictName.OK, []))
    assert set(hook.running) == {"gpu-a", "gpu-b"} and list(hook.pending) == ["gpu-a"]
    started = time.monotonic()
    await wait_for(lambda: not hook.running, 30, "every run to end")
    took = time.monotonic() - started
    runs = runs_written(prefix)
    got = sorted((r["GPU_COCKPIT_HOST"], r["GPU_COCKPIT_VERDICT"]) for r in runs)
    # gpu-a: its first change, then only the latest one waiting (the middle one coalesced)
    assert got == [("gpu-a", "ok"), ("gpu-a", "stalled-idle"), ("gpu-b", "crashed")], got
    assert hook.results["timeout"] == 3 and hook.results["coalesced"] == 1
    assert took < 20  # each killed at 1.5 s, not left for its 60 s sleep
    assert not _processes_of(str(prefix)) and not _processes_of(f"sleep\0{SLEEP}\0")  # the sleeps went too


SLEEP = "60.4321"  # seconds: a sleep no other process here has


def _processes_of(text: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if text.encode() in cmd:
            found.append(int(pid))
    return found


# ----------------------------------------------------------------------------- a real Prometheus


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def _fetch(url: str) -> dict | None:
    try:
        return _get(url)
    except (OSError, ValueError):
        return None


async def test_a_real_prometheus_fires_the_stall_alert_of_a_stalling_host(tmp_path, monkeypatch):
    prometheus = need("prometheus", package="prometheus")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    (tmp_path / "run").mkdir()
    path = tmp_path / "fastdemo.yaml"
    path.write_text(FAST_DEMO.format(port=free_port(), logs=tmp_path / "logs"))
    layout = demo.with_free_port(resolve_layout(str(path)))
    state = demo.new_state()  # owned by this process: the exporter's `demo` host attaches to it
    demo.save_layout(state, layout)
    demo.prepare_host(layout, state)
    # a monitor of the demo's own (following no run): it launches the run and stops it at the end
    monitor = HostMonitor(
        parse_target("demo"),
        SessionOptions(python=sys.executable, interval=0.25, sim_state=state),
        layout,
        watch=WatchList(patterns=[]),
        on_connect=_no_run,
    )
    await monitor.session.connect()
    procs: list[subprocess.Popen] = []
    try:
        run = await demo.start_demo(monitor)
        assert run.run_id and run.record.get("pgid"), run
        # the test's copy of the shipped rules: a short for: (the shipped one is minutes)
        rules = tmp_path / "rules.yml"
        rules.write_text(re.sub(r"\bfor: \S+", "for: 3s", exporter.RULES.read_text()))
        eport, pport = free_port(), free_port()
        prefix = tmp_path / "hook-env"
        e_log = open(tmp_path / "exporter.log", "w")
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "cockpit",
                    "exporter",
                    "--hosts",
                    "demo",
                    "--layout",
                    str(path),
                    "--interval",
                    "0.5",
                    "--listen",
                    f"127.0.0.1:{eport}",
                    "--on-change",
                    f"{hook_script(tmp_path)} {prefix}",
                ],
                stdout=e_log,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
            )
        )
        (tmp_path / "prometheus.yml").write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            f"rule_files: [{rules}]\n"
            "scrape_configs:\n"
            "  - job_name: gpu-cockpit\n"
            f"    static_configs: [{{targets: ['127.0.0.1:{eport}']}}]\n"
        )
        p_log = open(tmp_path / "prometheus.log", "w")
        procs.append(
            subprocess.Popen(
                [
                    prometheus,
                    f"--config.file={tmp_path / 'prometheus.yml'}",
                    f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{pport}",
                    "--log.level=warn",
                ],
                stdout=p_log,
                stderr=subprocess.STDOUT,
            )
        )
        api = f"http://127.0.0.1:{pport}/api/v1"

        def firing() -> dict | None:
            doc = _fetch(f"{api}/alerts")
            for alert in (doc or {}).get("data", {}).get("alerts", []):
                if alert["labels"].get("alertname") == "GpuCockpitRunStalled" and alert["state"] == "firing":
                    return doc
            return None

        seen_states: set[str] = set()

        def watch_states() -> dict | None:
            doc = _fetch(f"{api}/query?query=" + urllib.parse.quote('gpu_cockpit_verdict{host="demo"} == 1'))
            for r in (doc or {}).get("data", {}).get("result", []):
                seen_states.add(r["metric"]["state"])
            for p in procs:
                logs = ("exporter.log", "prometheus.log")
                assert p.poll() is None, "\n".join((tmp_path / f).read_text() for f in logs)
            return firing()

        # generous: the demo's launch stalls within a minute on a loaded 2-core machine
        alerts = await wait_for(lambda: watch_states(), 240, "the stall alert to fire")
        stalled = next(a for a in alerts["data"]["alerts"] if a["labels"]["alertname"] == "GpuCockpitRunStalled")
        assert stalled["labels"]["host"] == "demo" and stalled["labels"]["severity"] == "critical"
        # the demo's launched run is followed: the alert is that run's (its tree's root), never the host's twice
        assert re.fullmatch(r"root:\d+", stalled["labels"].get("run", "")), stalled["labels"]
        assert stalled["annotations"]["summary"] == f"demo: the run ({stalled['labels']['run']}) is stalled"
        assert sum(a["labels"]["alertname"] == "GpuCockpitRunStalled" for a in alerts["data"]["alerts"]) == 1
        assert seen_states & {"stalled-idle", "stalled-spinning"}, seen_states
        query = _get(f"{api}/query?query=" + urllib.parse.quote('ALERTS{alertstate="firing"}'))
        assert any(
            r["metric"]["alertname"] == "GpuCockpitRunStalled" and r["metric"]["host"] == "demo"
            for r in query["data"]["result"]
        ), query
        with urllib.request.urlopen(f"http://127.0.0.1:{eport}/metrics", timeout=5) as resp:
            metrics = resp.read().decode()
        assert re.search(r'gpu_cockpit_stall_evidence\{host="demo",state="launch_stopped"\} 1\.0', metrics), metrics
        # the hook was told of the stall, with the change in its environment
        runs = await wait_for(
            lambda: [r for r in runs_written(prefix) if r.get("GPU_COCKPIT_VERDICT", "").startswith("stalled-")],
            30,
            "the hook's run for the stall",
        )
        env = runs[0]
        assert env["GPU_COCKPIT_HOST"] == "demo" and env["GPU_COCKPIT_PREVIOUS"] in exporter.VERDICTS
        assert env["GPU_COCKPIT_DETAIL"] == "launch stopped at 'capturing draft cuda graphs'"
        assert env["GPU_COCKPIT_RUN"] == run.run_id
        if CAPTURE:
            Path(CAPTURE).mkdir(parents=True, exist_ok=True)
            Path(CAPTURE, "alerts.json").write_text(json.dumps(alerts, indent=1))
            Path(CAPTURE, "alerts_query.json").write_text(json.dumps(query, indent=1))
            Path(CAPTURE, "metrics.txt").write_text(metrics)
            Path(CAPTURE, "hook_env.txt").write_text("".join(f"{k}={v}\n" for k, v in sorted(env.items())))
        # the demo ends (its state folder gone, as when its cockpit quits): its row's link is down, not up
        await demo.stop_demo(monitor, state)
        demo.remove_state(state)

        def link_down() -> bool:
            with urllib.request.urlopen(f"http://127.0.0.1:{eport}/metrics", timeout=5) as resp:
                text = resp.read().decode()
            return 'gpu_cockpit_link{host="demo",state="down"} 1.0' in text

        await wait_for(link_down, 60, "the ended demo's link said down")
        # SIGTERM ends the exporter cleanly
        procs[0].send_signal(signal.SIGTERM)
        assert procs[0].wait(30) == 0
        assert "Traceback" not in (tmp_path / "exporter.log").read_text()
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        try:
            await demo.stop_demo(monitor, state)
        finally:
            await monitor.close()
            demo.remove_state(state)


async def _no_run(_monitor) -> None:
    """The test's monitor follows no run until the demo's end names each one it stops."""


async def test_a_tp2_servers_ranks_are_its_own_beside_the_hosts_other_servers(sim_state, tmp_path, monkeypatch):
    """The report behind the host's servers: a TP-2 server named by its layout's port, beside two
    other TP-2 servers of the same command on the host: `gpu_cockpit_ranks` is 2 (its own tree),
    never the host's total, and none of its ranks is dead when a neighbour stops; with no layout
    (each server judged alone, none followed) the host's series count no one run's ranks, and each
    server is a run of its own in the per-run series: its own verdict, its own 2 ranks."""
    import asyncio

    from simhost import end_session
    from test_safety import layout_file, start_by_hand

    from cockpit.runs.layoutfile import load_layout

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    ports = [free_port() for _ in range(3)]
    servers = [
        start_by_hand(sim_state, tmp_path, port, "--base-gpu-id", str(2 * n), "--sim-shm-dir", str(tmp_path))
        for n, port in enumerate(ports)
    ]
    opts = SessionOptions(python=sys.executable, interval=0.25, sim_state=str(sim_state))
    layout = load_layout(str(layout_file(tmp_path, "a", ports[0])))
    monitors = [
        HostMonitor(parse_target("local"), opts, layout, watch=WatchList.for_layout(layout), probe_every_s=0.25),
        HostMonitor(parse_target("local"), opts, probe_every_s=0.25),
    ]
    watch = fleet_of("gpu-a", "gpu-b")
    for member, monitor in zip(watch.members, monitors):
        member.monitor = monitor
    exp = exporter.Exporter(watch)

    def series(name: str) -> dict:
        families = {f.name: f for f in text_string_to_metric_families(exposition(exp))}
        return {s.labels["host"]: s.value for s in families[name].samples}

    kept = []
    try:
        for monitor in monitors:
            await monitor.open(kept=True)
            kept.append(asyncio.create_task(monitor.keep()))
        a, plain = monitors
        await wait_for(
            lambda: a.phase.name in ("ready", "serving") and len(a.state.ranks()) == 2,
            90,
            "the layout's server followed",
            lambda: (a.phase, a.verdict, a.state.ranks()),
        )
        assert plain.several and plain.following is None
        await wait_for(
            lambda: (
                {j.server.root for j in plain.runs_judged() if j.phase.name in ("ready", "serving")}
                >= {servers[0].pid, servers[2].pid}
            ),
            90,
            "each server judged up",
            lambda: [(j.server.root, j.phase, j.verdict) for j in plain.runs_judged()],
        )
        end_session(servers[1])  # a neighbour stops: nothing of it is the run's
        await a.session.wait_samples(8)
        a.update()
        plain.update()
        assert series("gpu_cockpit_ranks") == {"gpu-a": 2.0, "gpu-b": 0.0}
        assert series("gpu_cockpit_dead_ranks") == {"gpu-a": 0.0, "gpu-b": 0.0}
        verdicts = {
            s.labels["host"]: s.labels["state"]
            for f in text_string_to_metric_families(exposition(exp))
            if f.name == "gpu_cockpit_verdict"
            for s in f.samples
            if s.value == 1
        }
        assert verdicts["gpu-a"] not in ("crashed", "stopped", "no run") and verdicts["gpu-b"] == "no run", verdicts
        families = {f.name: f for f in text_string_to_metric_families(exposition(exp))}
        ranks = {(x.labels["host"], x.labels["run"]): x.value for x in families["gpu_cockpit_server_ranks"].samples}
        each = {
            (x.labels["host"], x.labels["run"]): x.labels["state"]
            for x in families["gpu_cockpit_server_verdict"].samples
            if x.value == 1
        }
        own = [f"root:{servers[n].pid}" for n in (0, 2)]
        assert ranks[("gpu-a", own[0])] == 2.0 and [k for k in ranks if k[0] == "gpu-a"] == [("gpu-a", own[0])]
        for rid in own:  # no layout: each server its own run, its own ranks and verdict
            assert ranks[("gpu-b", rid)] == 2.0, ranks
            assert each[("gpu-b", rid)] not in ("crashed", "stopped", "no run"), each
        assert each[("gpu-a", own[0])] == verdicts["gpu-a"], each
    finally:
        for task in kept:
            task.cancel()
        for monitor in monitors:
            await monitor.close()
        for s in servers:
            end_session(s)
