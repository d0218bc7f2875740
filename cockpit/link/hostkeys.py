"""Host keys checked as OpenSSH checks them, with asyncssh's own parsers.

What the ssh config says decides which files are read and what happens to a key not in them:
`UserKnownHostsFile` (default ~/.ssh/known_hosts, ~/.ssh/known_hosts2), `GlobalKnownHostsFile`
(default /etc/ssh/ssh_known_hosts, /etc/ssh/ssh_known_hosts2), `StrictHostKeyChecking` and
`HostKeyAlias`. Entries are matched by asyncssh (hashed names, patterns, `[host]:port`,
`@revoked`, `@cert-authority`); this module keeps each entry's file and line so that a refusal
says which line to remove.

- a key that differs from the known one(s) is always refused, with both fingerprints and file:line;
- a revoked key is always refused;
- an unknown key is refused unless `--accept-new` or `StrictHostKeyChecking accept-new|no`: then it
  is recorded in the first user file the config names (as OpenSSH records it);
- `UserKnownHostsFile none` is refused unless the config also says `StrictHostKeyChecking no`:
  then nothing is checked and `warning` says so (the session shows it).
"""

from __future__ import annotations

import getpass
import os
from dataclasses import dataclass, field
from pathlib import Path

from cockpit.common.errors import CockpitError, UnknownHostKey
from cockpit.link.sshlib import asyncssh

SSHClientConfig = asyncssh.config.SSHClientConfig
SSHConfig = asyncssh.config.SSHConfig

DEFAULT_USER_FILES = ["~/.ssh/known_hosts", "~/.ssh/known_hosts2"]
DEFAULT_GLOBAL_FILES = ["/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2"]
SYSTEM_CONFIG = "/etc/ssh/ssh_config"
_HOSTKEY_OPTIONS = ("StrictHostKeyChecking", "UserKnownHostsFile", "GlobalKnownHostsFile")


class _Config(SSHClientConfig):
    """asyncssh's ssh_config parser (Host, Match, Include, first value wins, %-tokens), taught the
    one keyword it skips that host key checking needs, and to expand tokens in known_hosts paths."""

    _handlers = dict(SSHClientConfig._handlers)
    _handlers["stricthostkeychecking"] = ("StrictHostKeyChecking", SSHConfig._set_string)
    _percent_expand = set(SSHClientConfig._percent_expand) | {"UserKnownHostsFile", "GlobalKnownHostsFile"}


def _load(paths: list[str], host: str, port: int | None, user: str | None) -> _Config:
    try:
        local_user = getpass.getuser()
    except KeyError:
        local_user = str(os.getuid())
    try:
        return _Config.load(
            None, paths, False, False, False, local_user, user if user else (), host, port if port else ()
        )
    except (asyncssh.config.ConfigParseError, OSError) as exc:
        raise CockpitError(f"ssh config: {exc}") from None


def config_paths(ssh_config: str | None) -> list[str]:
    """The files asyncssh connects with: --ssh-config alone (as `ssh -F`), else ~/.ssh/config."""
    if ssh_config:
        return [ssh_config]
    default = os.path.expanduser("~/.ssh/config")
    return [default] if os.access(default, os.R_OK) else []


@dataclass
class Policy:
    """What the config says about one host's key."""

    host: str  # as typed (an alias, or a name)
    hostname: str  # after HostName
    port: int
    user: str | None
    proxy_jump: str | None
    user_files: list[str]  # [] when the config says `UserKnownHostsFile none`
    global_files: list[str]
    strict: str  # yes | ask | accept-new | no
    files_named: bool  # the user files came from the config or --known-hosts, not the defaults

    @property
    def unchecked(self) -> bool:
        return not self.user_files

    @property
    def accepts_new(self) -> bool:
        return self.strict in ("accept-new", "no")


def resolve(
    host: str,
    port: int | None = None,
    user: str | None = None,
    ssh_config: str | None = None,
    known_hosts: str | None = None,
) -> Policy:
    """The host-key policy for `host` from the ssh config (and, without --ssh-config, the system's
    /etc/ssh/ssh_config for the host-key keywords, as OpenSSH reads it after the user's)."""
    paths = config_paths(ssh_config)
    cfg = _load(paths, host, port, user)
    values = {k: cfg.get(k) for k in _HOSTKEY_OPTIONS}
    if not ssh_config and os.access(SYSTEM_CONFIG, os.R_OK) and any(v is None for v in values.values()):
        system = _load([SYSTEM_CONFIG], host, port, user)
        for k, v in values.items():
            if v is None:
                values[k] = system.get(k)
    strict = str(values["StrictHostKeyChecking"] or "ask").lower()
    strict = {"true": "yes", "false": "no", "off": "no"}.get(strict, strict)
    if strict not in ("yes", "ask", "accept-new", "no"):
        raise CockpitError(f"ssh config: StrictHostKeyChecking {strict!r} is not yes, ask, accept-new or no")
    named = values["UserKnownHostsFile"]
    if known_hosts:
        user_files, files_named = [known_hosts], True
    elif named is None:
        user_files, files_named = list(DEFAULT_USER_FILES), False
    else:
        user_files, files_named = list(named), True
    glob = values["GlobalKnownHostsFile"]
    global_files = list(DEFAULT_GLOBAL_FILES) if glob is None else list(glob)
    jump = cfg.get("ProxyJump")
    return Policy(
        host=host,
        hostname=str(cfg.get("Hostname") or host),
        port=int(cfg.get("Port") or port or 22),
        user=user or cfg.get("User"),
        proxy_jump=str(jump) if jump else None,
        user_files=[os.path.expanduser(p) for p in user_files],
        global_files=[os.path.expanduser(p) for p in global_files],
        strict=strict,
        files_named=files_named,
    )


@dataclass
class Entry:
    path: str
    line: int
    text: str
    known: asyncssh.SSHKnownHosts  # this one line, matched by asyncssh


_parsed: dict[str, tuple[str, list[Entry]]] = {}  # path -> (its text, entries): a fleet parses each file once


def read_entries(paths: list[str]) -> list[Entry]:
    """Every usable line of the files that exist; a line asyncssh cannot parse is skipped (OpenSSH
    skips it too), a missing file is no entries."""
    out = []
    for path in paths:
        try:
            text = Path(path).read_text(errors="replace")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            continue
        except OSError as exc:
            raise CockpitError(f"cannot read known_hosts file {path}: {exc.strerror or exc}") from None
        cached = _parsed.get(path)
        if cached and cached[0] == text:  # the same text: its keys were parsed already
            out += cached[1]
            continue
        entries = []
        for n, line in enumerate(text.splitlines(), 1):
            stripped = line.strip()
            if not stripped or stripped.startswith("#"):
                continue
            try:
                known = asyncssh.import_known_hosts(stripped)
            except (ValueError, asyncssh.Error):
                continue
            entries.append(Entry(path, n, stripped, known))
        _parsed[path] = (text, entries)
        out += entries
    return out


@dataclass
class Found:
    trusted: list[tuple[Entry, asyncssh.SSHKey]] = field(default_factory=list)
    ca: list[tuple[Entry, asyncssh.SSHKey]] = field(default_factory=list)
    revoked: list[tuple[Entry, asyncssh.SSHKey]] = field(default_factory=list)
    port: int | None = None  # the form the entries matched: [host]:port, or the bare host (None)


def lookup(entries: list[Entry], host: str, addr: str, port: int | None) -> Found:
    """asyncssh's SSHKnownHosts.match over all files, keeping where each key came from: entries
    for `[host]:port` first, and only when none trusts a key, those for the bare host."""

    def collect(p):
        found = Found(port=p)
        for e in entries:
            keys, cas, revoked = e.known._match(host, addr, p)[:3]  # the one-line matcher of match()
            found.trusted += [(e, k) for k in keys]
            found.ca += [(e, k) for k in cas]
            found.revoked += [(e, k) for k in revoked]
        return found

    found = collect(port)
    if port and not (found.trusted or found.ca):
        found = collect(None)
    return found


def fingerprint(key) -> str:
    return f"{key.get_algorithm()} {key.get_fingerprint()}"


_KEY_TYPES = {
    "ssh-ed25519": "ED25519",
    "ssh-rsa": "RSA",
    "ssh-dss": "DSA",
    "sk-ssh-ed25519@openssh.com": "ED25519-SK",
    "sk-ecdsa-sha2-nistp256@openssh.com": "ECDSA-SK",
    "ssh-ed448": "ED448",
}


def key_type(key) -> str:
    """The key's type as OpenSSH names it to a person (`ED25519 key fingerprint is ...`)."""
    alg = key.get_algorithm()
    return _KEY_TYPES.get(alg, "ECDSA" if alg.startswith("ecdsa-") else alg)


def append_key(path: str, entry_name: str, key, label: str) -> str:
    """Append `entry_name`'s key to a known_hosts file as OpenSSH records one (the folder 0700 and
    a new file 0600); returns the file:line written."""
    alg, blob = key.export_public_key("openssh").decode().split()[:2]
    try:
        os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
        new = not os.path.exists(path)
        with open(path, "a") as fh:
            fh.write(f"{entry_name} {alg} {blob}\n")
        if new:
            os.chmod(path, 0o600)
        lines = sum(1 for _ in open(path)) if os.path.isfile(path) else 0
    except OSError as exc:
        raise CockpitError(f"cannot record the host key of {label} in {path}: {exc.strerror or exc}") from None
    _parsed.pop(path, None)
    return f"{path}:{lines}"


def host_entry(host: str, port: int | None) -> str:
    return f"[{host}]:{port}" if port and port != 22 else host


class HostKeyCheck:
    """One connection's check: asyncssh gets `known_hosts` (the keys that match, so it prefers
    their algorithms and refuses revoked ones) and `client_factory` (asked about any other key);
    `refusal()` turns asyncssh's HostKeyNotVerifiable into the line the operator reads."""

    def __init__(self, policy: Policy, label: str, accept_new: bool = False):
        self.policy = policy
        self.label = label
        self.accept_new = accept_new or policy.accepts_new
        self.entries = read_entries(policy.user_files + policy.global_files)
        self.asked: tuple[str, str, int | None] | None = None
        self.found = Found()
        self.offered = None
        self.recorded: str | None = None  # file:line a new key was written to

    # what asyncssh calls
    def known_hosts(self, host: str, addr: str, port: int | None):
        # By name only (HostKeyAlias, else HostName), as OpenSSH looks keys up with CheckHostIP no,
        # its default: asyncssh would also trust any key listed for the peer's address.
        self.asked = (host, "", port)
        self.found = lookup(self.entries, host, "", port)
        return ([k for _, k in self.found.trusted], [k for _, k in self.found.ca], [k for _, k in self.found.revoked])

    def client_factory(self):
        check = self

        class Client(asyncssh.SSHClient):
            def validate_host_public_key(self, host, addr, port, key):
                check.offered = key
                if check.found.trusted or not check.accept_new:
                    return False
                check.record(key)
                return True

            def validate_host_ca_key(self, host, addr, port, key):
                return False

        return Client

    def options(self) -> dict:
        if self.policy.unchecked:
            return {"known_hosts": None}
        return {"known_hosts": self.known_hosts, "client_factory": self.client_factory()}

    # what the operator is told
    @property
    def entry_name(self) -> str:
        host, _, port = self.asked or (self.policy.hostname, "", self.policy.port)
        return host_entry(host, port)

    def record(self, key) -> None:
        """Append the key to the first user file, as OpenSSH's accept-new does."""
        self.recorded = append_key(self.policy.user_files[0], self.entry_name, key, self.label)

    def refusal(self, exc: asyncssh.HostKeyNotVerifiable) -> CockpitError:
        where, name = self.label, self.entry_name
        if self.asked and (self.found.trusted or self.found.revoked):
            name = host_entry(self.asked[0], self.found.port)  # as the lines that matched name it
        if self.found.revoked and "revoked" in str(exc.reason).lower():
            lines = ", ".join(f"{e.path}:{e.line} ({fingerprint(k)})" for e, k in self.found.revoked)
            return CockpitError(
                f"REVOKED host key for {where} ({name}): the key it offers is marked @revoked "
                f"at {lines}; refusing to connect"
            )
        if self.offered is not None and self.found.trusted:
            old = "; ".join(f"{fingerprint(k)} at {e.path}:{e.line}" for e, k in self.found.trusted)
            first = self.found.trusted[0][0]
            return CockpitError(
                f"HOST KEY CHANGED for {where} ({name}): REMOTE HOST IDENTIFICATION HAS CHANGED, it now offers "
                f"{fingerprint(self.offered)}, known as {old}; refusing to connect (even with --accept-new). "
                f"If the host was reinstalled, remove line {first.line} of {first.path} "
                f"(ssh-keygen -f {first.path} -R '{name}') and connect again"
            )
        if self.offered is not None:
            files = ", ".join(self.policy.user_files + [p for p in self.policy.global_files if os.path.exists(p)])
            message = (
                f"unknown host key for {where} ({key_type(self.offered)} key {self.offered.get_fingerprint()}): "
                f"not in {files}; check it, then run again with --accept-new to record it in "
                f"{self.policy.user_files[0]}"
            )
            if self.policy.strict == "yes":  # the config forbids asking: refused, as ssh refuses
                return CockpitError(message + " (the ssh config says StrictHostKeyChecking yes: or add it by hand)")
            key, path, kind = self.offered, self.policy.user_files[0], key_type(self.offered)

            def accept() -> str:
                at = append_key(path, name, key, where)
                return f"Permanently added '{name}' ({kind}) to the list of known hosts ({at})."

            return UnknownHostKey(message, where, name, kind, key.get_fingerprint(), path, accept)
        return CockpitError(f"cannot verify the host key of {where}: {exc.reason}")


def unchecked_refusal(policy: Policy, label: str) -> CockpitError:
    return CockpitError(
        f"{label}: the ssh config says UserKnownHostsFile none, which turns host key checking off: refused. "
        f"Name a known_hosts file (or pass --known-hosts FILE); to connect unchecked on purpose, the config "
        f"must also say StrictHostKeyChecking no"
    )


def unchecked_warning(label: str) -> str:
    return (
        f"host keys are NOT checked for {label}: its ssh config says UserKnownHostsFile none and "
        f"StrictHostKeyChecking no"
    )
