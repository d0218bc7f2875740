"""A host's monitor from the command line: every command that talks to a host goes through one
(`attached`), so the verdict a script reads is the one the screen shows. The monitors of a job's
nodes, of the demo and of a fleet are imported for their targets only (the demo's tools, the Slurm
link, the fleet file's YAML)."""

from __future__ import annotations

import argparse
from contextlib import asynccontextmanager

from cockpit.common.errors import CockpitError
from cockpit.host.session import SessionOptions
from cockpit.link.target import agent_python, parse_target
from cockpit.monitor.host import HostMonitor
from cockpit.runs.layouts import resolve_layout


def session_options(args: argparse.Namespace, layout=None, target=None, sim_state: str | None = None):
    """The session options of the command line: the one place they are built."""
    named = layout.python if layout else None
    opts = SessionOptions(
        python=args.python or (agent_python(target, named) if target is not None else named or "python3"),
        python_named=bool(args.python or named),
        interval=args.interval or 1.0,
        ssh_config=args.ssh_config,
        known_hosts=args.known_hosts,
        accept_new=args.accept_new,
        sim_state=args.sim or sim_state,
        trust_python=bool(getattr(args, "trust_python", False) or (layout is not None and layout.trust_python)),
    )
    return opts


def build_monitor(args: argparse.Namespace, on_connect=None, layout=None, sim_state: str | None = None):
    """The host's monitor from the command line: target, layout, options. The demo host is
    watched through the runs it launched only (no process patterns: another demo's processes,
    or anything else on this machine, are not shown or judged); a command other than `demo`
    attaches to the running demo and follows its current run."""
    target = parse_target("demo" if args.command == "demo" else getattr(args, "target", None) or "demo")
    if layout is None:
        layout_name = args.layout or ("demo" if target.kind == "demo" else None)
        layout = resolve_layout(layout_name) if layout_name else None
    watch = None
    if target.kind == "slurm" and not target.node:  # every node of the job, as one run
        from cockpit.monitor.cluster import ClusterMonitor

        cluster = ClusterMonitor(target, session_options(args, layout, target), layout)
        cluster.forensics_on = forensics_allowed(args, layout)  # a stall's stacks, as on one host
        return cluster
    if target.kind == "demo":
        from cockpit.monitor import demo

        if sim_state is None and not args.sim:
            sim_state = demo.need_live_state()  # the demo running now: its folder is prepared
            layout = demo.layout_of(sim_state, layout)
        else:
            demo.prepare_host(layout, args.sim or sim_state)
        watch, follow = demo.follower(layout, args.sim or sim_state)
        on_connect = on_connect or follow
    opts = session_options(args, layout, target, sim_state)
    monitor = HostMonitor(target, opts, layout, on_connect=on_connect, watch=watch)
    monitor.forensics_on = forensics_allowed(args, layout)
    return monitor


def forensics_allowed(args: argparse.Namespace, layout) -> bool:
    """A stall's forensics are gathered automatically unless --read-only, --no-forensics or the
    layout's `auto_dump: false` says no."""
    return not (getattr(args, "read_only", False) or getattr(args, "no_forensics", False)) and (
        layout is None or layout.auto_dump
    )


@asynccontextmanager
async def attached(args: argparse.Namespace):
    """Attach to the host, do, close: every one-shot command's lifecycle."""
    monitor = build_monitor(args)
    async with monitor.attached():
        yield monitor


def fleet_monitor(args: argparse.Namespace):
    """The fleet named by a file or --hosts, with the command line's options for every host."""
    from cockpit.monitor.fleet import FleetMonitor, fleet_from_hosts, load_fleet

    path = getattr(args, "fleet_file", None) or getattr(args, "fleet", None)
    if bool(path) == bool(args.hosts):
        raise CockpitError("name the hosts: a fleet file (FLEET.yaml) or --hosts a,b,c, not both")
    fleet = load_fleet(path) if path else fleet_from_hosts(args.hosts, args.layout, args.python)
    if path and (args.layout or args.python):
        for host in fleet.hosts:
            host.layout = host.layout or args.layout
            host.python = host.python or args.python
    if getattr(args, "concurrency", None):
        if args.concurrency < 1:
            raise CockpitError("--concurrency: at least 1")
        fleet.concurrency = args.concurrency
    if args.interval:
        fleet.interval = args.interval
    return FleetMonitor(fleet, session_options(args))
