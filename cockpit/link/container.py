"""`docker:NAME` and `podman:NAME`: the agent runs inside the container with the container's own
Python, through `exec -i` (the primitive of cockpit/link/exec.py).

Inside, the agent sees the container's pid namespace: every pid it reports is the container's.
NVML inside a container reports the pids of the host's namespace (the driver knows only those), so
without help no GPU process matches a process of the tree. When the engine runs on this machine
the cockpit can read the host's /proc: each process of the container's namespace is found by its
/proc/PID/ns/pid, and its `NSpid:` line gives both numbers. Then, on every sample:

- GPU processes reported with host pids are rewritten to the container's pids (the GPU panes and
  the ranks' GPU memory line up);
- each process carries its host pid (`namespace.host_pids` in the snapshot; said on screen).

With the engine on another host (`@HOST`, over ssh) the host's /proc is not read: pids are the
container's, GPU processes reported with host pids stay unmatched, and the screen says so."""

from __future__ import annotations

import asyncio
import json
import os
import time

from cockpit.common.errors import CockpitError
from cockpit.link.base import AgentStream
from cockpit.link.exec import ExecLink, ExecStream, first_line

MAP_EVERY_S = 2.0
STOP_WAIT_S = 10.0  # for the engine to mark a container whose main process ended as stopped


def namespace_pids(init_pid: int, proc: str = "/proc") -> dict[int, int]:
    """{container pid: host pid} of every process in the pid namespace of host pid `init_pid`."""
    try:
        ns = os.readlink(f"{proc}/{init_pid}/ns/pid")
    except OSError:
        return {}
    out: dict[int, int] = {}
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        try:
            if os.readlink(f"{proc}/{name}/ns/pid") != ns:
                continue
            with open(f"{proc}/{name}/status") as fh:
                for line in fh:
                    if line.startswith("NSpid:"):
                        ids = [int(v) for v in line.split()[1:]]
                        out[ids[-1]] = ids[0]
                        break
        except (OSError, ValueError, IndexError):
            continue
    return out


def translate_sample(frame: dict, to_host: dict[int, int]) -> None:
    """A sample frame from inside the container, in place: GPU processes NVML reported with host
    pids get the container's pid; each process gets `host_pid`."""
    to_ctr = {h: c for c, h in to_host.items()}
    for g in frame.get("gpus") or []:
        procs = g.get("processes")
        if procs:
            g["processes"] = [[to_ctr.get(int(p[0]), int(p[0])), *p[1:]] for p in procs]
    for p in frame.get("procs") or []:
        host = to_host.get(p.get("pid"))
        if host is not None:
            p["host_pid"] = host


class ContainerStream(ExecStream):
    def __init__(self, inner: AgentStream, link: ContainerLink):
        super().__init__(inner)
        self.link = link

    async def readline(self) -> bytes:
        line = await self.inner.readline()
        if not line.startswith(b"{") or (b'"t":"sample"' not in line and b'"t":"hello"' not in line):
            return line
        try:
            frame = json.loads(line)
        except ValueError:
            return line
        if not isinstance(frame, dict):
            return line
        if frame.get("t") == "hello":
            frame["warnings"] = list(self.link.notes()) + list(frame.get("warnings") or [])
        elif frame.get("t") == "sample" and self.link.mapped:
            translate_sample(frame, self.link.host_pids())
        return (json.dumps(frame, separators=(",", ":")) + "\n").encode()


class ContainerLink(ExecLink):
    install_hint = "install it (docker.io, or podman with runc) or reach the engine's host with NAME@HOST"

    def __init__(self, carrier, target, where: str):
        super().__init__(carrier, target.label, where)
        self.engine = target.kind
        self.name = target.kind
        self.tool = target.kind
        self.container = target.name
        self.remote = target.remote
        self.init_pid: int | None = None
        self._map: dict[int, int] = {}
        self._map_at = 0.0

    def wrap(self, argv, env=None, agent=False):
        envs = [a for k, v in sorted((env or {}).items()) for a in ("-e", f"{k}={v}")]
        return [self.engine, "exec", "-i", *envs, self.container, *argv]

    async def check(self) -> None:
        res = await self.tool_run(
            [
                self.engine,
                "inspect",
                "--type",
                "container",
                "--format",
                "{{.State.Status}} {{.State.Pid}}",
                self.container,
            ]
        )
        if res.rc != 0:
            err = first_line(res.stderr)
            if "no such" in err.lower():
                raise CockpitError(
                    f"{self.label}: no container named {self.container} on {self.where} "
                    f"(`{self.engine} ps` lists the running ones)"
                )
            raise CockpitError(
                f"{self.label}: cannot ask the {self.engine} engine on {self.where}: {err or 'no message'} "
                f"(is the daemon running? {'DOCKER_HOST' if self.engine == 'docker' else 'CONTAINER_HOST'} "
                f"names another)"
            )
        status, _, pid = res.stdout.decode().strip().partition(" ")
        if status != "running":
            raise CockpitError(
                f"{self.label}: container {self.container} is {status}, not running "
                f"(`{self.engine} start {self.container}`)"
            )
        self.init_pid = int(pid) if pid.isdigit() and int(pid) > 0 else None

    @property
    def mapped(self) -> bool:
        """Host pids can be read: the engine runs here and its init process is visible."""
        return not self.remote and self.init_pid is not None and os.path.exists(f"/proc/{self.init_pid}/ns/pid")

    def host_pids(self) -> dict[int, int]:
        now = time.monotonic()
        if now - self._map_at >= MAP_EVERY_S:
            self._map, self._map_at = namespace_pids(self.init_pid), now
        return self._map

    def notes(self) -> list[str]:
        if self.mapped:
            return [
                f"inside {self.engine} container {self.container}: pids are the container's; host pids mapped "
                f"through /proc NSpid (init is host pid {self.init_pid}); NVML's host pids shown as the container's"
            ]
        return [
            f"inside {self.engine} container {self.container} on {self.where}: pids are the container's; host "
            f"pids are not mapped (the engine is reached over ssh), so GPU processes NVML reports with host "
            f"pids stay unmatched"
        ]

    async def start_agent(self, argv, payload=b"", env=None) -> AgentStream:
        return ContainerStream(await self.carrier.start_agent(self.wrap(list(argv), env, agent=True), payload), self)

    def describe(self) -> dict:
        return {
            "kind": self.engine,
            "container": self.container,
            "via": self.where,
            "pids": "container",
            "host_pids_mapped": self.mapped,
            "host_pids": {str(c): h for c, h in sorted(self.host_pids().items())} if self.mapped else {},
        }

    async def verify_gone(self, entries: list[dict]) -> dict:
        """The agent went down with the container during a kill (its main process ended): the
        engine says whether the container stopped, and a stopped container has no process left."""
        deadline = time.monotonic() + STOP_WAIT_S
        while True:  # the agent's end is seen here before the engine has marked the container stopped
            res = await self.tool_run(
                [
                    self.engine,
                    "inspect",
                    "--type",
                    "container",
                    "--format",
                    "{{.State.Status}} {{.State.ExitCode}}",
                    self.container,
                ]
            )
            status, _, code = res.stdout.decode().strip().partition(" ") if res.rc == 0 else ("removed", "", "")
            stopped = status in ("exited", "dead", "removed", "stopped")
            if stopped or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        pids = [e["pid"] for e in entries]
        return {
            "term": pids,
            "killed": [],
            "vanished": [],
            "remaining": [] if stopped else pids,
            "gpu_memory_left": [],
            "ports_open": [],
            "notes": [
                f"container {self.container} {status}"
                + (f" (exit code {code})" if code else "")
                + (
                    ": it went down with its main process, so nothing of it is left"
                    if stopped
                    else ": the agent's link dropped and the container still runs"
                )
            ],
        }
