"""Targets as the operator types them: `local`, `demo`, an ssh alias, `user@host[:port]`, and the
places servers live behind another program: `docker:NAME`, `podman:NAME` (a container, the agent
run by `exec -i`), `slurm:JOBID` (every node of a job, an agent per node through `srun --overlap`)
and `slurm:JOBID/NODE` (one node of it). Each of those takes `@HOST` (an ssh alias or
user@host[:port]) to reach the engine or the Slurm login host over ssh."""

from __future__ import annotations

import os
import re
import shutil
import sys
from dataclasses import dataclass

from cockpit.common.errors import CockpitError

_SSH = re.compile(
    r"^(?:(?P<user>[A-Za-z0-9._][A-Za-z0-9._-]*)@)?"
    r"(?P<host>[A-Za-z0-9_](?:[A-Za-z0-9._-]*[A-Za-z0-9_])?|\[[0-9A-Fa-f:.]+\])"
    r"(?::(?P<port>[0-9]+))?\Z"
)
_CONTAINER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,254}\Z")
_JOB = re.compile(r"^[0-9]+(?:_[0-9]+)?\Z")
_NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,254}\Z")
EXEC_KINDS = ("docker", "podman", "slurm")


@dataclass(frozen=True)
class Target:
    kind: str  # "local" | "demo" | "ssh" | "docker" | "podman" | "slurm"
    host: str = "localhost"  # ssh: the host; docker/podman/slurm: the ssh host of `@HOST` (remote)
    user: str | None = None
    port: int | None = None
    text: str = "local"
    name: str | None = None  # the container's name, or the Slurm job id
    node: str | None = None  # slurm: one node of the job
    remote: bool = False  # docker/podman/slurm reached over ssh (`@HOST`)

    @property
    def label(self) -> str:
        return self.text

    def carrier(self) -> Target:
        """Where the engine's own command (docker, podman, srun) runs: this machine, or the
        `@HOST` over ssh."""
        if not self.remote:
            return Target("local", text="local")
        return Target("ssh", host=self.host, user=self.user, port=self.port, text=self.text.split("@", 1)[1])

    def on_node(self, node: str) -> Target:
        """slurm: the target of one node of this job."""
        at = f"@{self.text.split('@', 1)[1]}" if self.remote else ""
        return Target(
            "slurm", self.host, self.user, self.port, f"slurm:{self.name}/{node}{at}", self.name, node, self.remote
        )


def _ssh(text: str, whole: str) -> tuple[str, str | None, int | None]:
    m = _SSH.match(text)
    if not m:
        raise CockpitError(
            f"malformed target {whole!r}: expected local, demo, an ssh alias, user@host[:port], "
            f"docker:NAME[@HOST], podman:NAME[@HOST] or slurm:JOBID[/NODE][@HOST]"
        )
    port = m.group("port")
    if port is not None and not 0 < int(port) < 65536:
        raise CockpitError(f"malformed target {whole!r}: port {port} is not in 1-65535")
    return m.group("host").strip("[]"), m.group("user"), int(port) if port else None


def _engine(kind: str, rest: str, text: str) -> Target:
    what, at, where = rest.partition("@")
    host, user, port = _ssh(where, text) if at else ("localhost", None, None)
    node = None
    if kind == "slurm":
        what, slash, node = what.partition("/")
        if not _JOB.match(what):
            raise CockpitError(
                f"malformed target {text!r}: a Slurm job id is a number (slurm:1234, slurm:1234/NODE, "
                f"slurm:1234@login-host); squeue lists yours"
            )
        if slash and not _NODE.match(node):
            raise CockpitError(f"malformed target {text!r}: {node!r} is not a node name (slurm:1234/node17)")
        node = node or None
    elif not _CONTAINER.match(what):
        raise CockpitError(
            f"malformed target {text!r}: expected {kind}:NAME or {kind}:NAME@HOST with the "
            f"container's name or id ({kind} ps lists them)"
        )
    return Target(kind, host=host, user=user, port=port, text=text, name=what, node=node, remote=bool(at))


def parse_target(text: str) -> Target:
    text = (text or "").strip()
    if text in ("local", "localhost-agent"):
        return Target("local", text="local")
    if text == "demo":
        return Target("demo", text="demo")
    kind, colon, rest = text.partition(":")
    if colon and kind in EXEC_KINDS:
        return _engine(kind, rest, text)
    host, user, port = _ssh(text, text)
    return Target("ssh", host=host, user=user, port=port, text=text)


def agent_python(target: Target, named: str | None) -> str:
    """The interpreter the agent runs with: the one named, else python3 on a host and, on this
    machine, the cockpit's own (certainly there, and the agent then starts from
    its compiled modules: cockpit/agent/__init__.py)."""
    if named and named != "python3":
        return named
    return sys.executable if target.kind in ("local", "demo") else "python3"


def python_checked(target: Target, python: str, trusted: bool = False) -> bool:
    """Whether `python` is checked on the host before it runs (cockpit/agent/__init__.py's GUARD:
    as root, nothing another user can change): everywhere but with --trust-python (trust_python:
    in the layout), and on this machine only as root and for another interpreter than the
    cockpit's own (already running as root here)."""
    if trusted:
        return False
    if target.kind in ("local", "demo"):  # one not found here is said as such when it is started
        return os.geteuid() == 0 and python != sys.executable and shutil.which(python) is not None
    return True
