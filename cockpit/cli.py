"""The `cockpit` command.

    cockpit [TARGET]                 open the cockpit on a host (local, demo, alias, user@host[:port])
    cockpit demo                     the simulated 8-GPU host, started on first use
    cockpit snapshot TARGET --json   one document of the host's state, for scripts

Every user-facing failure is one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import sys

from cockpit import __version__
from cockpit.errors import CockpitError
from cockpit.secrets import mask_argv

SUBCOMMANDS = ("open", "demo", "snapshot", "fleet", "serve", "kill", "shm", "dump", "launch", "ablate", "runs")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--layout", metavar="FILE", help="a layout (launch profile): a .yaml path or a shipped name")
    p.add_argument("--python", metavar="PATH", help="the interpreter on the host that runs the agent (default python3)")
    p.add_argument("--interval", type=float, default=None, metavar="S", help="sampling interval in seconds (default 1)")
    p.add_argument("--ssh-config", metavar="FILE", help="an ssh config file to read instead of ~/.ssh/config")
    p.add_argument("--known-hosts", metavar="FILE", help="a known_hosts file to use instead of ~/.ssh/known_hosts")
    p.add_argument("--accept-new", action="store_true", help="trust an unknown host key and record it (never a changed one)")
    p.add_argument("--sim", metavar="DIR", help="use the simulated NVML on the host, with its state in DIR there")
    p.add_argument("--read-only", action="store_true", help="watch only: every action (kill, shm clean, dump) is off")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cockpit", description="A terminal cockpit for multi-GPU inference hosts.")
    parser.add_argument("--version", action="version", version=f"gpu-cockpit {__version__}")
    sub = parser.add_subparsers(dest="command")

    p = sub.add_parser("open", help="open the cockpit on a host (the default command)")
    p.add_argument("target", nargs="?", default="local")
    _common(p)

    p = sub.add_parser("demo", help="open the cockpit on the simulated 8-GPU host")
    p.add_argument("--no-server", action="store_true", help="do not start the simulated server")
    _common(p)

    p = sub.add_parser("snapshot", help="render the host's state once, without a terminal, and exit")
    p.add_argument("target", nargs="?", help="the host; omit it with --replay")
    _common(p)
    p.add_argument("--json", action="store_true", help="print the JSON document (docs/snapshot-schema.md)")
    p.add_argument("--svg", metavar="FILE", help="save the cockpit screen as SVG")
    p.add_argument("--text", metavar="FILE", nargs="?", const="-", help="the screen as text (to FILE, or stdout)")
    p.add_argument("--size", default="160x50", metavar="COLSxROWS", help="screen size for --svg/--text (default 160x50)")
    p.add_argument("--wait", type=float, default=0.0, metavar="S", help="seconds to watch before taking it")
    p.add_argument("--replay", metavar="FILE.json", help="render a saved --json document instead of a live host")
    p.add_argument("--fleet", metavar="FLEET.yaml", help="every host of a fleet file, as one JSON document")
    p.add_argument("--hosts", metavar="A,B,C", help="a fleet of these hosts, as one JSON document")
    p.add_argument("--timeout", type=float, default=30.0, metavar="S",
                   help="with --fleet/--hosts: give up on hosts not answering after S seconds (default 30)")

    p = sub.add_parser("serve", help="serve the cockpit to a browser (textual-serve), on 127.0.0.1 by default")
    p.add_argument("target", nargs="?", default="demo", help="the host to open (default: the demo host)")
    p.add_argument("--fleet", metavar="FLEET.yaml", help="serve the fleet view of these hosts instead")
    p.add_argument("--hosts", metavar="A,B,C", help="serve the fleet view of these hosts instead")
    p.add_argument("--port", type=int, default=8080, help="the port to serve on (default 8080)")
    p.add_argument("--bind", default="127.0.0.1", metavar="ADDR", help="the address to serve on (default 127.0.0.1)")
    p.add_argument("--allow-remote", action="store_true",
                   help="allow an address other than loopback: there is no authentication, reach it with ssh -L instead")
    _common(p)

    p = sub.add_parser("fleet", help="one row per host of a fleet; enter opens a host's cockpit")
    p.add_argument("fleet_file", nargs="?", metavar="FLEET.yaml", help="the fleet file (docs/fleet.md)")
    p.add_argument("--hosts", metavar="A,B,C", help="these hosts instead of a fleet file")
    p.add_argument("--concurrency", type=int, default=None, metavar="N", help="connections opened at once (default 16)")
    _common(p)
    p = sub.add_parser("kill", help="kill the run (or one process), then verify it is gone")
    p.add_argument("target")
    _common(p)
    p.add_argument("--pid", type=int, help="kill this process (and what it started, as its user) instead of the run "
                                           "found; how to choose when two runs are found")
    p.add_argument("--wait", type=float, default=None, metavar="S", help="seconds between SIGTERM and SIGKILL (default 10)")
    p.add_argument("--yes", action="store_true", help="do not ask: the plan is printed and carried out")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("shm", help="audit the host's /dev/shm; --clean removes what is safe to remove")
    p.add_argument("target")
    _common(p)
    p.add_argument("--dir", default="/dev/shm",
                   help="the shm folder (default /dev/shm); cleaning another folder needs --yes-other-dir or a yes asked")
    p.add_argument("--clean", action="store_true",
                   help="remove files named like an inference run's (nccl-, torch_, psm_, sgl_shm_, vllm_, MPI…), "
                        "owned by the run's user, held by no process, whose creator is dead; the rest is kept, with why")
    p.add_argument("--yes", action="store_true")
    p.add_argument("--yes-other-dir", action="store_true", help="confirm cleaning a --dir other than /dev/shm")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("launch", help="(re)launch the layout's server with flag sets toggled, and watch it")
    p.add_argument("target")
    _common(p)
    p.add_argument("--on", action="append", default=[], metavar="SET", help="turn a flag set on (repeatable)")
    p.add_argument("--off", action="append", default=[], metavar="SET", help="turn a flag set off (repeatable)")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="a parameter's value")
    p.add_argument("--no-clean-shm", action="store_true", help="leave /dev/shm alone between runs")
    p.add_argument("--timeout", type=float, default=900, metavar="S", help="give up watching after S seconds")
    p.add_argument("--settle", type=float, default=0, metavar="S", help="keep watching S seconds after ready")
    p.add_argument("--yes", action="store_true")

    p = sub.add_parser("ablate", help="each on/off combination of flag sets in turn, then a table of outcomes")
    p.add_argument("target")
    _common(p)
    p.add_argument("--vary", required=True, metavar="SET,SET", help="flag sets to switch on and off")
    p.add_argument("--timeout", type=float, default=900, metavar="S", help="per combination")
    p.add_argument("--yes", action="store_true")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("runs", help="the ledger: every launch of a layout and what became of it")
    p.add_argument("--layout", required=True, metavar="FILE")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("dump", help="py-spy stack dumps of every rank, grouped")
    p.add_argument("target")
    _common(p)
    p.add_argument("--upload-pyspy", action="store_true", help="send this install's py-spy when the host has none")
    p.add_argument("--json", action="store_true")
    return parser


def _confirm(lines: list[str], question: str, yes: bool) -> bool:
    print("\n".join(lines))
    if yes:
        return True
    if not sys.stdin.isatty():
        raise CockpitError(f"{question}: no terminal to ask on; pass --yes to confirm")
    return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")


async def _attached(args: argparse.Namespace):
    """A connected session that watches the run (the demo's recorded run on the demo host)."""
    from cockpit.session import HostSession
    from cockpit.sim import demo

    target, opts, watch, layout = _session_parts(args)
    session = HostSession(target, opts, watch)
    if target.kind == "demo":
        demo.prepare_host(layout, opts.sim_state)
    await session.connect()
    if target.kind == "demo":
        running = demo.running_demo(opts.sim_state)
        if running:
            await demo.attach_demo(session, running)
    else:
        from cockpit.runs import resume

        await resume(session, layout)
    await session.wait_samples(2)
    return session, layout


def _writable(args: argparse.Namespace) -> None:
    if getattr(args, "read_only", False):
        raise CockpitError(f"{args.command}: refused, --read-only disables every action")


def cmd_kill(args: argparse.Namespace) -> int:
    from cockpit import actions

    _writable(args)
    async def go() -> dict | None:
        session, layout = await _attached(args)
        try:
            scope = actions.process_scope(args.pid) if args.pid else actions.run_scope(session)
            plan = await actions.plan_kill(session, scope)
            if not plan.entries:
                why = "; ".join(plan.notes + [f"pid {f['root']} left alone: {f['why']}" for f in plan.foreign])
                raise CockpitError(f"nothing to kill on {session.target.label}: no process of the run is alive"
                                   + (f" ({why})" if why else "")
                                   if not args.pid else f"no process {args.pid} on {session.target.label}")
            if not _confirm(plan.describe(), f"kill these {len(plan.entries)} processes?", args.yes):
                return None
            wait = args.wait if args.wait is not None else (layout.kill_wait_s if layout else actions.DEFAULT_KILL_WAIT_S)
            report = await actions.kill(session, plan, wait, layout.ports if layout else [])
            if session.target.kind == "demo":
                from cockpit.sim import demo
                demo.forget_demo(session.opts.sim_state)
            return report
        finally:
            await session.close()

    report = asyncio.run(go())
    if report is None:
        print("nothing was signalled")
        return 1
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        print()
    else:
        print("\n".join(actions.describe_kill(report)))
    return 0 if report["verified"] else 3


def cmd_shm(args: argparse.Namespace) -> int:
    from cockpit import actions

    if args.clean:
        _writable(args)
    other_dir = os.path.normpath(args.dir) != actions.SHM_DEFAULT
    if args.clean and other_dir and not args.yes_other_dir and not sys.stdin.isatty():
        raise CockpitError(f"--dir {args.dir} is not /dev/shm: pass --yes-other-dir to clean it (--yes alone does not)")
    async def go():
        session, _ = await _attached(args)
        try:
            audit = await actions.shm_audit(session, args.dir)
            if not args.clean:
                return audit, None
            names = [e["name"] for e in audit["entries"] if e["removable"]]
            if not args.json:
                print("\n".join(actions.describe_shm(audit)))
            if not names:
                return audit, {"removed": [], "skipped": [], "freed_bytes": 0}
            if not _confirm([f"  {actions.printable(n)}" for n in names], f"remove these {len(names)} entries of {args.dir}?",
                            args.yes):
                return audit, None
            if other_dir and not args.yes_other_dir and not _confirm(
                    [], f"{args.dir} is not /dev/shm: clean it anyway (--yes does not answer this; --yes-other-dir does)?",
                    False):
                return audit, None
            return audit, await actions.shm_clean(session, names, args.dir, other_dir=other_dir)
        finally:
            await session.close()

    audit, cleaned = asyncio.run(go())
    if args.json:
        json.dump({"audit": audit, "clean": cleaned}, sys.stdout, indent=2)
        print()
    elif cleaned is None:
        if not args.clean:
            print("\n".join(actions.describe_shm(audit)))
    else:
        print("\n".join(actions.describe_clean(cleaned)))
    return 0


def cmd_dump(args: argparse.Namespace) -> int:
    from cockpit import actions, stacks

    _writable(args)
    async def go():
        session, layout = await _attached(args)
        try:
            ranks = actions.rank_pids(session.state)
            if not ranks:
                raise CockpitError(f"no rank to dump on {session.target.label}: no watched process is alive")
            run = layout.name if layout else session.target.label
            return await stacks.dump_ranks(session, ranks, run, upload=args.upload_pyspy)
        finally:
            await session.close()

    result = asyncio.run(go())
    if args.json:
        json.dump({"folder": str(result.folder), "failed": result.failed,
                   "groups": [{"ranks": g.ranks, "odd": g.odd, "frames": list(g.frames), "diff": g.diff}
                              for g in result.groups]}, sys.stdout, indent=2)
        print()
    else:
        print("\n".join(stacks.describe_groups(result.groups)))
        for rank, errors in result.failed.items():
            print(f"rank {rank}: no dump ({'; '.join(errors)})")
        print(f"raw dumps: {result.folder}")
    return 0


def _spec(args: argparse.Namespace, layout):
    from cockpit.runs import default_spec

    spec = default_spec(layout)
    for name in args.on + args.off:
        if name not in layout.flag_sets:
            raise CockpitError(f"{layout.path}: no flag set {name!r} (flag sets: {', '.join(layout.flag_sets) or 'none'})")
    spec.enabled = [n for n in layout.flag_sets if (n in spec.enabled or n in args.on) and n not in args.off]
    for item in args.set:
        name, sep, value = item.partition("=")
        if not sep or name not in layout.params:
            raise CockpitError(f"--set {item!r}: expected NAME=VALUE with NAME one of {', '.join(layout.params) or 'no parameters'}")
        spec.params[name] = value
    return spec


def _progress(phase, verdict) -> None:
    print(f"  {phase or ''}  {verdict}", file=sys.stderr, flush=True)


def cmd_launch(args: argparse.Namespace) -> int:
    from cockpit import runs

    _writable(args)
    if not args.layout and args.target != "demo":
        raise CockpitError("launch needs --layout: the launch profile to run")

    async def go():
        session, layout = await _attached(args)
        try:
            spec = _spec(args, layout)
            argv = runs.build_argv(layout, spec, runs.launch_python(layout, session)) + runs.sim_flags(layout, session)
            plan, names, lines = await runs.plan_relaunch(session, layout, clean_shm=not args.no_clean_shm)
            if not _confirm(lines + ["then launched:", "  " + shlex.join(mask_argv(argv))], "launch?", args.yes):
                return None
            return await runs.run_variant(session, layout, spec, args.timeout, clean_shm=not args.no_clean_shm,
                                          progress=_progress, settle=args.settle, plan=plan, shm_names=names)
        finally:
            await session.close()

    row = asyncio.run(go())
    if row is None:
        return 1
    print(f"{row['run_id']}: {row['outcome']}")
    for line in row["evidence"]:
        print(f"  {line}")
    print(f"log: {row['log']}")
    return 0


def cmd_ablate(args: argparse.Namespace) -> int:
    from cockpit import runs

    _writable(args)
    vary = [v for v in args.vary.split(",") if v]

    async def go():
        session, layout = await _attached(args)
        try:
            specs = runs.combinations(layout, vary)
            plan, names, lines = await runs.plan_relaunch(session, layout)
            if not _confirm(lines + [f"  {','.join(s.enabled) or '(no flag sets)'}" for s in specs],
                            f"run these {len(specs)} launches one after another (each kills the one before)?", args.yes):
                return None
            return await runs.ablate(session, layout, vary, args.timeout, progress=_progress, first_plan=plan,
                                     first_shm=names)
        finally:
            await session.close()

    rows = asyncio.run(go())
    if rows is None:
        return 1
    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        print()
    else:
        print("\n".join(runs.describe_ablation(rows, vary)))
    return 0


def cmd_runs(args: argparse.Namespace) -> int:
    from cockpit import runs
    from cockpit.layouts import resolve_layout

    rows = runs.read_ledger(resolve_layout(args.layout))
    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        print()
    else:
        print("\n".join(runs.describe_ledger(rows)))
    return 0


def _session_parts(args: argparse.Namespace):
    """Target, options, watch list and layout from the command line."""
    from cockpit.layouts import resolve_layout
    from cockpit.link.target import parse_target
    from cockpit.session import SessionOptions, Watch, default_sim_state

    target = parse_target(getattr(args, "target", "demo") if args.command != "demo" else "demo")
    layout_name = args.layout or ("demo" if target.kind == "demo" else None)
    layout = resolve_layout(layout_name) if layout_name else None
    opts = SessionOptions(
        python=args.python or (layout.python if layout else "python3"),
        interval=args.interval or 1.0,
        ssh_config=args.ssh_config,
        known_hosts=args.known_hosts,
        accept_new=args.accept_new,
        sim_state=args.sim or (default_sim_state() if target.kind == "demo" else None),
    )
    if target.kind in ("local", "demo") and not (args.python or (layout and layout.python != "python3")):
        opts.python = sys.executable  # this machine: the cockpit's own interpreter has psutil
    return target, opts, Watch.for_layout(layout), layout


def _size(text: str) -> tuple[int, int]:
    try:
        cols, rows = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise CockpitError(f"--size {text!r}: expected COLSxROWS, e.g. 160x50") from None
    if not (40 <= cols <= 1000 and 10 <= rows <= 500):
        raise CockpitError(f"--size {text!r}: between 40x10 and 1000x500")
    return cols, rows


def _replay_doc(path: str) -> dict:
    try:
        doc = json.loads(open(path).read())
    except OSError as exc:
        raise CockpitError(f"{path}: cannot read: {exc.strerror}") from None
    except ValueError as exc:
        raise CockpitError(f"{path}:{getattr(exc, 'lineno', 1)}: not a JSON snapshot ({exc.msg}): make one with snapshot --json") from None
    if not isinstance(doc, dict) or not str(doc.get("schema", "")).startswith("gpu-cockpit.snapshot/"):
        raise CockpitError(f"{path}:1: not a gpu-cockpit snapshot (no schema field): make one with snapshot --json")
    return doc


def cmd_snapshot(args: argparse.Namespace) -> int:
    from cockpit.session import HostSession
    from cockpit.snapshot import snapshot_doc, state_from_doc, take_snapshot

    if not (args.json or args.svg or args.text):
        raise CockpitError("say what to make: --json, --svg FILE or --text")
    if args.fleet or args.hosts:
        from cockpit.fleet import take_fleet_snapshot

        if not args.json or args.svg or args.text or args.target:
            raise CockpitError("a fleet snapshot is --json only, with no target: snapshot --fleet FLEET.yaml --json")
        json.dump(asyncio.run(take_fleet_snapshot(_fleet_watch(args), args.timeout)), sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    if args.replay is None and not args.target:
        raise CockpitError("name a target (local, demo, an ssh alias, user@host[:port]) or --replay FILE.json")
    if args.svg or args.text:
        from cockpit.layouts import resolve_layout
        from cockpit.ui.app import CockpitApp
        from cockpit.ui.headless import render

        size = _size(args.size)
        if args.replay:
            doc = _replay_doc(args.replay)
            layout = resolve_layout(args.layout) if args.layout else None
            app = CockpitApp(state=state_from_doc(doc), layout=layout)
        else:
            target, opts, watch, layout = _session_parts(args)
            app = CockpitApp(session=HostSession(target, opts, watch), layout=layout)
        text = asyncio.run(render(app, size, args.wait, args.svg, args.text))
        if app.error:
            raise CockpitError(app.error)
        if args.text == "-":
            sys.stdout.write(text)
        if args.json:
            json.dump(snapshot_doc(app.state), sys.stdout, indent=2)
        return 0
    if args.replay:
        doc = _replay_doc(args.replay)
    else:
        target, opts, watch, _ = _session_parts(args)
        doc = asyncio.run(take_snapshot(HostSession(target, opts, watch), wait=args.wait))
    json.dump(doc, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def _fleet_watch(args: argparse.Namespace):
    """The fleet named by a file or --hosts, with the command line's options for every host."""
    from cockpit.fleet import FleetWatch, fleet_from_hosts, load_fleet
    from cockpit.session import SessionOptions

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
    base = SessionOptions(python=args.python or "python3", ssh_config=args.ssh_config, known_hosts=args.known_hosts,
                          accept_new=args.accept_new, sim_state=args.sim)
    return FleetWatch(fleet, base)


def cmd_fleet(args: argparse.Namespace) -> int:
    from cockpit.ui.fleet import FleetApp

    FleetApp(_fleet_watch(args), read_only=args.read_only).run()
    return 0


LOOPBACK = ("localhost", "::1")


def served_command(args: argparse.Namespace) -> list[str]:
    """The cockpit command line that each browser session runs, from `serve`'s own arguments."""
    argv = [sys.executable, "-m", "cockpit"]
    if args.fleet or args.hosts:
        argv += ["fleet", args.fleet] if args.fleet else ["fleet", "--hosts", args.hosts]
    elif args.target == "demo":
        argv += ["demo"]
    else:
        argv += ["open", args.target]
    for flag in ("layout", "python", "interval", "ssh_config", "known_hosts", "sim"):
        value = getattr(args, flag)
        if value is not None:
            argv += ["--" + flag.replace("_", "-"), str(value)]
    for flag in ("accept_new", "read_only"):
        if getattr(args, flag):
            argv.append("--" + flag.replace("_", "-"))
    return argv


def cmd_serve(args: argparse.Namespace) -> int:
    import shlex

    if not 1 <= args.port <= 65535:
        raise CockpitError(f"--port {args.port}: between 1 and 65535")
    loopback = args.bind in LOOPBACK or args.bind.startswith("127.")
    if not loopback and not args.allow_remote:
        raise CockpitError(f"--bind {args.bind}: the served cockpit has no authentication and its keys kill runs; "
                           f"keep 127.0.0.1 and reach it with `ssh -L {args.port}:127.0.0.1:{args.port} HOST`, "
                           f"or add --allow-remote")
    try:
        from textual_serve.server import Server
    except ImportError:
        raise CockpitError("serve needs textual-serve: pip install 'gpu-cockpit[serve]'") from None
    if not loopback:
        print(f"cockpit: WARNING: serving on {args.bind}:{args.port} with NO authentication: anyone who reaches "
              f"it can kill and relaunch runs", file=sys.stderr)
    Server(shlex.join(served_command(args)), host=args.bind, port=args.port, title="gpu-cockpit").serve()
    return 0


def cmd_open(args: argparse.Namespace) -> int:
    from cockpit.session import HostSession
    from cockpit.ui.app import CockpitApp

    from cockpit.runs import resume

    target, opts, watch, layout = _session_parts(args)

    async def on_connect(session: HostSession) -> None:
        run = await resume(session, layout)
        if run is not None:
            session.state.agent.warnings.insert(0, f"following {run['run_id']} (launched earlier, still running)")

    app = CockpitApp(session=HostSession(target, opts, watch), layout=layout, read_only=args.read_only,
                     on_connect=on_connect)
    app.run()
    if app.error:
        raise CockpitError(app.error)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from cockpit.session import HostSession
    from cockpit.sim import demo
    from cockpit.ui.app import CockpitApp

    target, opts, watch, layout = _session_parts(args)
    demo.prepare_host(layout, opts.sim_state)
    running = demo.running_demo(opts.sim_state)
    replace = False
    if running and not args.no_server:
        if sys.stdin.isatty():
            answer = input(f"a demo run is already going (pid {running['pid']}, log {running.get('log')}). "
                           f"Replace it? [y/N] ")
            replace = answer.strip().lower() in ("y", "yes")
        if replace:
            demo.stop_demo(opts.sim_state)
    started: list[dict] = []

    async def on_connect(session: HostSession) -> None:
        if args.no_server:
            return
        if running and not replace:
            await demo.attach_demo(session, running)
        else:
            started.append(await demo.start_demo(session, layout, opts.sim_state))

    app = CockpitApp(session=HostSession(target, opts, watch), layout=layout, on_connect=on_connect,
                     read_only=args.read_only)
    try:
        app.run()
    finally:
        if started:
            demo.stop_demo(opts.sim_state)
    if app.error:
        raise CockpitError(app.error)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0] not in SUBCOMMANDS and not argv[0].startswith("-")):
        argv = ["open"] + argv
    elif argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version"):
        argv = ["open"] + argv
    args = build_parser().parse_args(argv)
    handlers = {"snapshot": cmd_snapshot, "open": cmd_open, "demo": cmd_demo, "kill": cmd_kill, "shm": cmd_shm,
                "dump": cmd_dump, "launch": cmd_launch, "ablate": cmd_ablate, "runs": cmd_runs,
                "fleet": cmd_fleet, "serve": cmd_serve}
    try:
        handler = handlers.get(args.command)
        if handler is None:
            raise CockpitError(f"{args.command}: not available yet")
        return handler(args)
    except CockpitError as exc:
        print(f"cockpit: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a bug: still one line, with the way to the details
        if os.environ.get("COCKPIT_DEBUG"):
            raise
        print(f"cockpit: internal error: {type(exc).__name__}: {exc} (rerun with COCKPIT_DEBUG=1 for the traceback)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
