"""Fixtures and helpers more than one test module uses, loaded for every test by tests/conftest.py
(`pytest_plugins`): a test module never imports another's. The fast demo (its layout and a private
runtime and state folder), the live cockpit on the simulated host, two throwaway users."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import cannot_run, free_port
from simhost import kill_groups

from cockpit.cli import build_parser
from cockpit.host.session import SessionOptions, WatchList
from cockpit.link.target import parse_target
from cockpit.monitor import demo
from cockpit.monitor.host import HostMonitor
from cockpit.runs.layoutfile import parse_layout
from cockpit.runs.layouts import resolve_layout
from cockpit.ui.app import CockpitApp

# ----------------------------------------------------------------------------- the fast demo

FAST_DEMO = """\
name: fastdemo
engine: sglang
command: [-m, cockpit.sim.server]
base_flags: [--tp-size, "8", --host, 127.0.0.1, --port, "{port}", --sim-traffic, "2"]
flag_sets:
  eagle3: [--speculative-algorithm, EAGLE3, --speculative-num-steps, "3", --speculative-eagle-topk, "1"]
  no_cuda_graph: [--disable-cuda-graph]
enabled: [eagle3]
params:
  mem_fraction_static: 0.85
log_dir: {logs}
ports: [{port}]
endpoints: [/health]
stall: {{idle_s: 3, spin_s: 3}}
kill_wait_s: 2
sim: {{gpus: 8, model: rtx-pro-6000, seed: 7, speed: 4}}
"""


@pytest.fixture
def demo_env(tmp_path, monkeypatch):
    """A private runtime folder (the demos' folders) and state folder (the ledger)."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    (tmp_path / "run").mkdir()
    path = tmp_path / "fastdemo.yaml"
    path.write_text(FAST_DEMO.format(port=free_port(), logs=tmp_path / "logs"))
    args = build_parser().parse_args(["demo", "--layout", str(path), "--interval", "0.25"])
    made = []
    yield args, resolve_layout(str(path)), made
    for pgid in made:  # whatever the test left, by its own process groups only
        try:
            os.killpg(pgid, 9)
        except OSError:
            pass


# ----------------------------------------------------------------------------- the live cockpit


def layout_for(port: int, log_dir: Path):
    return parse_layout(
        f"""
name: uitest
engine: sglang
command: [-m, cockpit.sim.server]
base_flags: [--tp-size, "8", --port, "{port}", --sim-speed, "4", --sim-traffic, "2"]
log_dir: {log_dir}
ports: [{port}]
endpoints: [/health, /v1/models]
""",
        "uitest.yaml",
    )


def sim_monitor(sim_state, port, layout, on_connect) -> HostMonitor:
    """A fast-ticking monitor of the simulated host that watches only the run it launches."""
    return HostMonitor(
        parse_target("local"),
        SessionOptions(python=sys.executable, interval=0.25, sim_state=str(sim_state)),
        layout,
        on_connect=on_connect,
        watch=WatchList(patterns=[], ports=[port]),
    )


@pytest.fixture
async def live_app(sim_state, tmp_path):
    port = free_port()
    layout = layout_for(port, tmp_path)
    runs = []

    async def on_connect(monitor):
        run = await demo.start_demo(monitor)
        runs.append(run.record)
        monitor.follow(run)  # the run it launched is the one it follows, as `cockpit demo` does

    app = CockpitApp(monitor=sim_monitor(sim_state, port, layout, on_connect))
    yield app, port
    kill_groups(run["pgid"] for run in runs)


# ----------------------------------------------------------------------------- other users


@pytest.fixture(scope="module")
def users():
    """Two throwaway users, removed at the end."""
    if os.geteuid() != 0 or not shutil.which("useradd"):
        cannot_run("needs root and useradd")
    names = [f"gck{os.getpid() % 100000}{c}" for c in "ab"]
    for name in names:
        subprocess.run(["useradd", "-M", "-s", "/usr/sbin/nologin", name], check=True, capture_output=True)
    try:
        yield [pwd.getpwnam(n).pw_uid for n in names]
    finally:
        for name in names:
            subprocess.run(["userdel", "-f", name], capture_output=True)


def as_user(uid: int):
    def become():
        os.setgid(uid)
        os.setgroups([])
        os.setuid(uid)

    return become


def chown_tree(path: Path, uid: int) -> None:
    for root, dirs, files in os.walk(path):
        for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
            os.lchown(name, uid, uid)


def help_plain(width: int = 100) -> str:
    """The cockpit's help as plain text at `width`: what its help screen shows, without colours."""
    import io

    from rich.console import Console

    from cockpit.ui.commands import COCKPIT, RANK_TABLE
    from cockpit.ui.screens import help_renderable

    console = Console(width=width, file=io.StringIO(), color_system=None, record=True)
    console.print(help_renderable(COCKPIT + RANK_TABLE))
    return console.export_text()
