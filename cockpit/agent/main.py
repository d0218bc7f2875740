"""The agent's loop: samples on its own clock, answers each command exactly once; `main` takes the
command line the bootstrap hands it.
"""

import json
import os
import platform
import select
import socket
import subprocess
import sys
import threading
import time

from .acts import Acts
from .facts import host_facts
from .flightrec import fr_dump
from .gpus import open_gpus
from .guard import check_python
from .kill import _now_ticks, find_runs, host_servers, kill_run, run_plan
from .logs import LogTail, open_log
from .ports import Ports, listening_ports
from .procs import _HAVE_PROC, _boot_time, _start_ticks, _uid, _user
from .protocol import AGENT_VERSION, ERROR, FATAL, HELLO, LOG, RESULT, SAMPLE, Refused, emit
from .pyspy import pyspy_check, pyspy_dump
from .ras import RAS_TIMEOUT_S, RasPoller, ras_query
from .shm import SHM_DEFAULT, shm_audit, shm_clean
from .web import METRICS_MAX_BYTES, http_body, http_get

FIRST_WINDOW_S = 0.05  # the least time between a CPU reading (the start's, a tick's) and a config's sample
SLOW_EVERY_S = 10.0  # ECC counters and other rarely changing fields


class Agent:
    THREADED = (
        "kill",
        "kill_plan",
        "find_runs",
        "servers",
        "dump",
        "dump_check",
        "shm_audit",
        "shm_clean",
        "http",
        "launch_check",
        "ras",
        "metrics",
        "fr_dump",
        "host_facts",
    )  # may be slow: answered from a thread, so samples keep flowing

    def __init__(self, interval, procs):
        self.interval = interval
        self.procs = procs
        self.warnings = []
        self.gpus = open_gpus(interval, self.warnings)
        xid = getattr(self.gpus, "xid", None)
        if xid is not None and xid.source is None:  # said once: a rank's death will not name its GPU's Xid
            self.warnings.append("no Xid events on this host (%s)" % xid.why)
        self.ports = Ports()
        self.logs = {}
        self.seq = 0
        self.force_scan = False
        self.last_slow = 0.0
        self.sent_gpus, self.sent_procs, self.sent_ports = {}, {}, None
        self.full = True  # the next sample carries every watched row (the first, and after a config)
        self.launched = {}  # pid -> Popen of runs this agent started: their exit codes are known
        self.launched_runs = {}  # pgid -> its leader's start time (clock ticks), for runs started here
        self.leader_seen = {}  # pgid -> clock ticks when its leader was last seen alive (each tick)
        self.sim_state = None  # --sim-state: the simulated host's folder (its servers are those started into it)
        self.ras = RasPoller()
        self.log_owners = {}  # path -> {uid}: the user of the process stdout_of found writing it
        self.acts = Acts()  # the host's record of runs and the operator's acts: read each tick, sent when new

    def hello(self, psutil):
        return {
            "t": HELLO,
            "agent": AGENT_VERSION,
            "python": platform.python_version(),
            "executable": sys.executable,
            "hostname": socket.gethostname(),
            "home": os.path.expanduser("~"),
            "platform": platform.platform(),
            "arch": platform.machine(),
            "pid": os.getpid(),
            "time": time.time(),
            "utc_offset": time.localtime().tm_gmtoff,  # the host's: log lines carry local time without a zone
            "nvml": self.gpus.source,
            "driver": self.gpus.driver,
            "gpus": self.gpus.static(),
            "psutil": getattr(psutil, "__version__", None),
            "gpu_source": self.gpus.kind,  # pynvml | nvml-ctypes | nvidia-smi | none
            "xid_source": getattr(getattr(self.gpus, "xid", None), "source", None),  # nvml | kmsg | None
            "health_ms": getattr(self.gpus, "health_ms", None),  # one slow-clock round of health calls, all GPUs
            "procs_source": "proc" if _HAVE_PROC else "psutil" if psutil else "none",
            "interval": self.interval,
            "caps": [
                "gpus",
                "procs",
                "ports",
                "logs",
                "http",
                "launch",
                "kill",
                "shm",
                "dump",
                "ras",
                "metrics",
                "fr_dump",
                "host_facts",
                "acts",
            ],
            "warnings": self.warnings,
        }

    def tick(self):
        now = time.monotonic()
        slow = now - self.last_slow >= SLOW_EVERY_S
        if slow:
            self.last_slow = now
        gpus = self.gpus.sample(slow)
        rows, gone = self.procs.sample(now, self.force_scan)
        self.force_scan = False
        watched = self.procs.watched
        ports = self.ports.sample(watched, self.procs.cmdlines, generation=self.procs.generation)
        exits = []
        for pid, popen in list(self.launched.items()):
            ticks = _now_ticks()  # read before the check: the leader was alive at this time
            code = popen.poll()
            if code is None and ticks is not None:
                self.leader_seen[pid] = ticks
            if code is not None:
                exits.append([pid, code])
                del self.launched[pid]
        for path, tail in self.logs.items():  # logs first: the sample ends the tick, so it is judged whole
            try:
                event, lines = tail.poll()
            except OSError as exc:
                event, lines = "error: " + str(exc), []
            if event or lines:
                frame = {"t": LOG, "path": path, "lines": lines, "mtime": tail.mtime}
                if event:
                    frame["event"] = event
                emit(frame)
        self.seq += 1
        frame = {
            "t": SAMPLE,
            "seq": self.seq,
            "ts": round(time.time(), 3),
            "gpus": self._delta(self.sent_gpus, gpus, "index"),
            "procs": self._moved(rows),
        }
        gone = [pid for pid in gone if self.sent_procs.pop(pid, None) is not None]
        if gone:
            frame["gone"] = gone
        if self.full:  # every watched process's row is in this one: the other side drops the rest
            frame["full"] = True
            self.full = False
            if self.procs.unread:  # ... but those it could not read (out of descriptors): alive
                frame["unread"] = self.procs.unread
                for pid in self.procs.unread:  # held over there: their rows, or their end, follow
                    self.sent_procs.setdefault(pid, {"pid": pid})
        if ports != self.sent_ports:
            frame["ports"] = self.sent_ports = ports
        if exits:
            frame["exits"] = exits
        acts = self.acts.poll()
        if acts:
            frame["acts"] = acts
        xid = self.gpus.events()
        if xid is not None:
            frame["xid"] = xid  # the recent Xid events, whole, when they changed
        ras = self.ras.poll(ports, watched)
        if ras is not None:
            frame["ras"] = ras
        emit(frame)

    def _moved(self, rows):
        """The fields of each moved process row that changed since it was last sent (its pid
        always; a row new to this connection whole); a row whose sent fields all stand is left
        out. The other side keeps every row it holds until the frame's `gone` names it."""
        sent = self.sent_procs
        out = []
        for row in rows:
            pid = row["pid"]
            last = sent.get(pid)
            sent[pid] = row
            if last is None:
                out.append(row)
                continue
            moved = {f: v for f, v in row.items() if last.get(f) != v}
            if ("cpu_pct" in moved and "cpu_tick" in row) or ("cpu_tick" in last and "cpu_tick" not in row):
                moved["cpu_tick"] = row.get("cpu_tick")  # part of the CPU reading: sent with it, its end said
            if moved:
                moved["pid"] = pid
                out.append(moved)
        return out

    @staticmethod
    def _delta(sent, rows, key):
        """The GPU rows with only the fields that changed since they were last sent (the key
        always): the stream is ordered and a new connection starts a new agent, so the other end
        holds the rest."""
        out = []
        live = set()
        for row in rows:
            k = row[key]
            live.add(k)
            last = sent.get(k)
            if last is None:
                out.append(row)
            elif last is row:  # the sampler reused the row: nothing changed
                out.append({key: k})
            else:
                out.append({f: v for f, v in row.items() if f == key or last.get(f) != v})
            sent[k] = row
        for k in list(sent):
            if k not in live:
                del sent[k]
        return out

    def handle(self, line):
        try:
            cmd = json.loads(line)
            cid = cmd["id"]
            name = cmd["cmd"]
            args = cmd.get("args") or {}
        except (ValueError, KeyError, TypeError):
            emit({"t": ERROR, "msg": "malformed command: " + line[:200]})
            return
        fn = getattr(self, "cmd_" + str(name), None)
        if fn is None:
            emit({"t": RESULT, "id": cid, "ok": False, "error": "unknown command " + repr(name)})
            return
        if name in self.THREADED:
            threading.Thread(target=self._answer, args=(cid, fn, args), daemon=True).start()
        else:
            self._answer(cid, fn, args)

    def _answer(self, cid, fn, args):
        try:
            data = fn(**args)
        except Exception as exc:  # every command is answered, whatever happens
            emit({"t": RESULT, "id": cid, "ok": False, "error": "%s: %s" % (type(exc).__name__, exc)})
            return
        emit({"t": RESULT, "id": cid, "ok": True, "data": data})

    # Each cmd_* answers one command; their keyword arguments are the command's args.

    def cmd_ping(self):
        return {"time": time.time()}

    def cmd_config(self, patterns=None, pgids=None, pids=None, logs=None, ports=None, interval=None):
        self.procs.configure(patterns, pgids, pids)
        if logs is not None:
            for path in list(self.logs):
                if path not in logs:
                    del self.logs[path]
            for path in logs:
                if path not in self.logs:
                    self.logs[path] = LogTail(path, self.log_owners.get(path))
        if ports is not None:
            self.ports.configure(ports)
        if interval is not None:
            self.interval = max(0.1, float(interval))
        self.procs.resend_cmdlines()
        self.sent_gpus, self.sent_procs, self.sent_ports = {}, {}, None  # next sample in full
        self.full = True
        self.force_scan = True
        return {"patterns": self.procs.patterns, "logs": list(self.logs), "interval": self.interval}

    def cmd_launch(self, argv, env=None, cwd=None, log=None, run_id=None, layout=None, ports=(), by=None, check=True):
        """Start a run detached in its own session (it outlives the agent and the link), its
        output appended to `log` (created 0600, never through a symlink); the run's process group
        is watched from now on. It starts in `cwd` (the layout's workdir), else in `/`: never in
        the folder the agent was started from. With `check` (unless --trust-python), its
        interpreter, its whole import path and that folder are checked as the agent's own were
        (guard.py): as root, anything another user can change is refused in one line, nothing
        started. The answer carries the leader's start time, so the run can be
        told from a later process that reuses its pid; the host's record of acts keeps the same,
        so any cockpit finds the run in any phase, its port open or not."""
        if not argv or not all(isinstance(a, str) for a in argv):
            raise ValueError("argv must be a non-empty list of strings")
        cwd = os.path.expanduser(cwd) if cwd else "/"
        log = log or "~/.cache/gpu-cockpit/runs/run.log"
        cache = os.environ.get("XDG_CACHE_HOME", "")
        if log.startswith("~/.cache/") and os.path.isabs(cache):  # the XDG spec: only an absolute path counts
            log = os.path.join(cache, log[len("~/.cache/") :])
        log = os.path.expanduser(log)
        full_env = dict(os.environ)
        full_env.update(env or {})
        if check:
            self.cmd_launch_check(argv, env, cwd)
        elif not os.path.isdir(cwd):
            raise Refused(
                "the workdir %s is not a folder on this host: set workdir: in the layout to one that is" % cwd
            )
        fd = open_log(log)
        try:
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=fd,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env=full_env,
                start_new_session=True,
            )
        finally:
            os.close(fd)
        start = _start_ticks(popen.pid)
        self.launched[popen.pid] = popen
        self.launched_runs[popen.pid] = start
        self.leader_seen[popen.pid] = start
        self.procs.configure(pgids=self.procs.pgids | {popen.pid})
        self.force_scan = True
        run = {
            "pid": popen.pid,
            "pgid": popen.pid,
            "log": log,
            "started": time.time(),
            "start": start,
            "boot": _boot_time(),
            "uid": os.geteuid(),
            "user": _user(os.geteuid()),
        }
        if run_id:
            try:
                self.acts.note(
                    {
                        "act": "launch",
                        "run_id": str(run_id),
                        "layout": layout,
                        "pgid": popen.pid,
                        "pid": popen.pid,
                        "start": start,
                        "uid": run["uid"],
                        "log": log,
                        "ports": [int(p) for p in ports or ()],
                        "by": by,
                    }
                )
            except (OSError, Refused) as exc:
                run["acts_error"] = str(exc)
        return run

    def cmd_launch_check(self, argv, env=None, cwd=None):
        """A launch's check alone (guard.py): its workdir (else `/`), interpreter and import path
        as root; Refused in one line, nothing started."""
        cwd = os.path.expanduser(cwd) if cwd else "/"
        if not os.path.isdir(cwd):
            raise Refused(
                "the workdir %s is not a folder on this host: set workdir: in the layout to one that is" % cwd
            )
        full_env = dict(os.environ)
        full_env.update(env or {})
        refused = check_python(argv, cwd, full_env)
        if refused:
            raise Refused(refused.replace("gpu-cockpit: ", "", 1) + " (nothing was launched)")
        return {"checked": True}

    def cmd_stdout_of(self, pids=()):
        """Where each process's standard output goes, when it is a regular file: the log of a run
        started elsewhere (`nohup ... > run.log 2>&1 &`)."""
        out = {}
        for pid in pids:
            try:
                path = os.readlink("/proc/%d/fd/1" % int(pid))
                uid = _uid(int(pid))
                if os.path.isfile(path) and uid is not None:
                    out[str(pid)] = path
                    self.log_owners[path] = {uid}  # followed only while that user owns it
            except (OSError, ValueError):
                pass
        return out

    def cmd_http(self, port, path="/health", timeout=2.0):
        return http_get(port, path, timeout)

    def _launched(self, launched, layout):
        """The launched runs the cockpit names; a bare process group among them is completed from
        the host's record of acts (its leader's start time makes it trusted). A cockpit that names
        no launched run (a cold look, the exporter, another machine) is given those the record
        holds for its layout: a run any cockpit launched here, found in any phase."""
        known = dict((int(r["pgid"]), r) for r in self.acts.launched(layout)) if layout else {}
        out = []
        for r in launched or ():
            rec = known.get(int(r.get("pgid", -1)))
            out.append(dict(r, **dict((k, v) for k, v in rec.items() if r.get(k) is None)) if rec else r)
        if out:
            return out
        return list(known.values())

    def cmd_find_runs(
        self, launched=(), ports=(), command=(), model=None, patterns=None, default_port=None, layout=None
    ):
        return find_runs(
            self._launched(launched, layout),
            ports,
            command,
            model,
            patterns,
            self.launched_runs,
            default_port=default_port,
            seen=self.leader_seen,
        )

    def cmd_servers(self, patterns=None):
        """Every server on the host, each its own tree (kill.host_servers): the host's runs, and a
        run's neighbours."""
        return host_servers(patterns, sim_state=self.sim_state)

    def cmd_kill_plan(
        self,
        pgids=(),
        sids=(),
        pids=(),
        launched=(),
        ports=(),
        command=(),
        model=None,
        patterns=None,
        default_port=None,
        layout=None,
        starts=None,
    ):
        """The plan to confirm. `pids`: those processes and what they started (one whose start time
        is not its `starts` entry is another process now: left alone). Otherwise the run
        found from the hints (find_runs); bare process groups count as launched runs only when
        this agent launched them (it knows their leaders' start times) or the host's record of
        acts holds their launch."""
        launched = list(launched or []) + [
            {"pgid": int(g)} for g in pgids or () if all(int(r.get("pgid", -1)) != int(g) for r in launched or [])
        ]
        launched = self._launched(launched, layout)
        if pids:
            return run_plan(pids=list(pids), starts=starts)
        return run_plan(
            launched=launched,
            ports=ports,
            command=command,
            model=model,
            patterns=patterns,
            known=self.launched_runs,
            default_port=default_port,
            seen=self.leader_seen,
        )

    def cmd_kill(
        self, plan, wait_s=10.0, sessions=(), ports=(), since=None, why=None, by=None, run_id=None, whole=False, **_old
    ):
        """Carry out the plan, then verify: what is left of it, its GPU memory, its ports. With
        `why`, the host's record of acts says who stops which processes before the first signal
        (every cockpit reads their deaths as the operator's), and a `whole` run verified gone as
        ended."""
        who = {
            "why": str(why),
            "by": by,
            "run_id": run_id,
            "pgids": [int(s) for s in sessions or ()],
            "processes": [[int(e["pid"]), e.get("start"), e.get("started")] for e in plan],
        }
        unrecorded = None
        if why:
            try:
                self.acts.note(dict(who, act="stop"))
            except (OSError, Refused) as exc:  # the stop goes on: other cockpits may read it as a crash
                unrecorded = "the stop is not recorded on the host: %s" % exc
        report = kill_run(plan, wait_s, sessions, since)
        if unrecorded:
            report.setdefault("notes", []).append(unrecorded)
        time.sleep(self.interval + 0.5)  # let the sampler see the GPUs after the exits
        planned = set(e["pid"] for e in plan)
        gpus = [dict(g) for g in list(self.sent_gpus.values())]
        gpu_left = []
        for g in gpus:
            for pid, mib in g.get("processes") or []:
                if pid in planned:
                    gpu_left.append({"gpu": g["index"], "pid": pid, "mib": mib})
        listening = listening_ports()
        report["gpu_memory_left"] = gpu_left
        report["gpus_after"] = [{"index": g["index"], "mem_used_mib": g.get("mem_used_mib")} for g in gpus]
        report["ports_open"] = [p for p in ports if int(p) in listening]
        self.force_scan = True
        if why and whole and not (report["remaining"] or gpu_left or report["ports_open"]):
            try:
                self.acts.note(dict(who, act="ended"))
            except (OSError, Refused) as exc:
                report.setdefault("notes", []).append("the stop is not recorded on the host: %s" % exc)
        return report

    def cmd_note(self, act, **fields):
        """A record of the operator's (a stall's forensics, gathered by one cockpit for all)."""
        if act != "forensics":
            raise Refused("only forensics are noted this way; launches and stops are recorded as they happen")
        return self.acts.note(dict(fields, act=act))

    def cmd_shm_audit(self, folder=SHM_DEFAULT, uid=None):
        return shm_audit(folder, uid)

    def cmd_shm_clean(self, names, folder=SHM_DEFAULT, uid=None, other_dir=False):
        return shm_clean(folder, names, uid, other_dir)

    def cmd_dump_check(self, pyspy=None, beside=()):
        return pyspy_check(pyspy, beside)

    def cmd_dump(self, pids, pyspy=None, deadline_s=20.0, native=True, nonblocking=False):
        return pyspy_dump(pids, pyspy, deadline_s, native, nonblocking)

    def cmd_ras(self, host=None, port=None, fmt="json", verbose=True, timeout=RAS_TIMEOUT_S):
        """One RAS status now (the bundle's), at the polled address unless told otherwise."""
        h, p = self.ras.target(list(self.procs.watched) if self.procs else [])
        return ras_query(host or h, int(port or p), fmt, verbose, float(timeout))

    def cmd_ras_config(self, every_s=None, host=None, port=None, enabled=None, timeout=None):
        if every_s is not None:
            self.ras.every_s = max(0.5, float(every_s))
        if timeout is not None:
            self.ras.timeout = max(0.5, float(timeout))
        if port is not None:
            self.ras.addr = (host or "127.0.0.1", int(port))
        if enabled is not None:
            self.ras.enabled = bool(enabled)
        return {"every_s": self.ras.every_s, "addr": self.ras.addr, "enabled": self.ras.enabled}

    def cmd_metrics(self, port, path="/metrics", want=None, timeout=5.0, limit=METRICS_MAX_BYTES):
        return http_body(port, path, float(timeout), min(int(limit), METRICS_MAX_BYTES), want)

    def cmd_fr_dump(self, pids, trigger=True, wait_s=15.0, raw=False):
        return fr_dump([int(p) for p in pids], bool(trigger), float(wait_s), bool(raw))

    def cmd_host_facts(self, items=("nvidia_smi", "xid", "versions"), pids=()):
        return host_facts(list(items), [int(p) for p in pids], self.gpus.driver, self.gpus.source)

    def run(self):
        buf = b""
        self.ticked_at = self.procs.primed_at or time.monotonic()  # the last CPU reading: the start's, then each tick's
        next_tick = time.monotonic() + 2.0  # the first sample waits for the first config, briefly
        while True:
            wait = max(0.0, next_tick - time.monotonic())
            ready, _, _ = select.select([0], [], [], wait)
            if ready:
                data = os.read(0, 65536)
                if not data:
                    return  # the cockpit went away: so do we
                buf += data
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        self.handle(line.decode("utf-8", "replace"))
                if self.force_scan:  # a config: sampled at once, over a CPU window of FIRST_WINDOW_S at least
                    next_tick = max(time.monotonic(), self.ticked_at + FIRST_WINDOW_S)
            now = time.monotonic()
            if now >= next_tick:
                self.tick()
                self.ticked_at = self.procs.read_at or now
                next_tick += self.interval
                if next_tick < now:
                    next_tick = now + self.interval


def install_sim_nvml(nbytes):
    """Reads the simulated NVML module's source from stdin and installs it as `pynvml`, so the
    simulated host runs exactly the code path of a real one."""
    import types

    src = b""
    while len(src) < nbytes:
        chunk = os.read(0, nbytes - len(src))
        if not chunk:
            raise SystemExit(3)
        src += chunk
    mod = types.ModuleType("pynvml")
    mod.__file__ = "<gpu-cockpit sim nvml>"
    exec(compile(src, "cockpit-sim-nvml", "exec"), mod.__dict__)
    sys.modules["pynvml"] = mod


def main(argv, procs):
    """The agent's life, `procs` primed by start.py: arguments, the hello, the loop."""
    interval = 1.0
    sim_state = None
    args = list(argv)
    while args:
        flag = args.pop(0)
        if flag == "--interval":
            interval = max(0.1, float(args.pop(0)))
        elif flag == "--sim-nvml":
            install_sim_nvml(int(args.pop(0)))
        elif flag == "--sim-state":
            sim_state = os.environ["COCKPIT_SIM_STATE"] = args.pop(0)
    if sys.version_info < (3, 8):  # noqa: UP036 - the host's Python may be older than the agent's floor
        emit(
            {
                "t": FATAL,
                "code": "python-too-old",
                "msg": "Python %s on the host is too old: gpu-cockpit's agent needs Python >= 3.8 "
                "(name another interpreter with --python)" % platform.python_version(),
            }
        )
        return 2
    psutil = None
    if not _HAVE_PROC:  # /proc has everything the agent reads; psutil only stands in where it is missing
        try:
            import psutil
        except ImportError:
            pass
    procs.ps = psutil
    agent = Agent(interval, procs)
    agent.sim_state = sim_state
    if psutil is None and not _HAVE_PROC:
        agent.warnings.append("no /proc and no psutil for %s: processes are not watched" % sys.executable)
    emit(agent.hello(psutil))
    profile = os.environ.get("COCKPIT_AGENT_PROFILE")  # benchmarks: cProfile's stats, written at the end
    if profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    try:
        agent.run()
    except KeyboardInterrupt:
        pass
    finally:
        agent.gpus.close()
        if profile:
            profiler.disable()
            profiler.dump_stats(profile)
    return 0
