"""Which link reaches a target: this machine (local, demo), ssh, or the argv primitive of
cockpit/link/exec.py on a carrier (docker:, podman:, slurm:JOB/NODE). Each link's module is
imported only when a target needs it (asyncssh with ssh)."""

from __future__ import annotations

from cockpit.common.errors import CockpitError
from cockpit.link.base import Link
from cockpit.link.local import LocalLink
from cockpit.link.target import EXEC_KINDS, Target


def _ssh(target: Target, opts) -> Link:
    from cockpit.link.ssh import SshLink  # asyncssh is only loaded when a host needs it

    return SshLink(target, ssh_config=opts.ssh_config, known_hosts=opts.known_hosts, accept_new=opts.accept_new)


def carrier_link(target: Target, opts) -> Link:
    """This machine, or the target's `@HOST` over ssh."""
    return _ssh(target.carrier(), opts) if target.remote else LocalLink()


def exec_link(target: Target, opts) -> Link:
    """The link of a docker:, podman: or slurm: target."""
    from cockpit.link.container import ContainerLink
    from cockpit.link.slurm import SlurmNodeLink

    carrier = carrier_link(target, opts)
    where = target.carrier().label if target.remote else "this machine"
    if target.kind in ("docker", "podman"):
        return ContainerLink(carrier, target, where)
    if target.kind == "slurm" and target.node:
        return SlurmNodeLink(carrier, target, where)
    raise CockpitError(
        f"{target.label}: a whole Slurm job is watched node by node (cockpit.monitor.cluster), not one link"
    )


def make_link(target: Target, opts) -> Link:
    """The link for `opts` (the session's options: ssh config, known hosts) to `target`."""
    if target.kind in ("local", "demo"):
        return LocalLink()
    if target.kind in EXEC_KINDS:  # the argv primitive on a carrier
        return exec_link(target, opts)
    return _ssh(target, opts)
