"""Host keys checked as OpenSSH checks them, against the real sshd: the known_hosts files the ssh
config names (user and global), hashed entries, @revoked, StrictHostKeyChecking, UserKnownHostsFile
none, ProxyJump hops, and --accept-new recording into the file the config names."""

import asyncio
import subprocess
import sys

import asyncssh
import pytest
from conftest import run_cli

from cockpit.common.errors import CockpitError
from cockpit.host.session import HostSession, SessionOptions
from cockpit.link.ssh import SshLink
from cockpit.link.target import parse_target


def config(sshd, path, *extra: str, alias: str = "kh") -> str:
    lines = [
        f"Host {alias}",
        "    HostName 127.0.0.1",
        f"    Port {sshd.port}",
        f"    User {sshd.user}",
        f"    IdentityFile {sshd.root}/client_key",
        "    IdentitiesOnly yes",
    ]
    lines += [f"    {x}" for x in extra]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def connect(cfg: str, host: str = "kh", accept_new: bool = False) -> list[str]:
    """Connects, runs one command over the connection, returns the link's warnings."""

    async def go():
        link = SshLink(parse_target(host), ssh_config=cfg, accept_new=accept_new)
        try:
            await link.connect()
            res = await link.run(["echo", "through"])
            assert res.stdout.strip() == b"through"
            return list(link.warnings)
        finally:
            await link.close()

    return asyncio.run(go())


def refused(cfg: str, expect: str, host: str = "kh", accept_new: bool = False) -> str:
    with pytest.raises(CockpitError) as err:
        connect(cfg, host, accept_new)
    msg = str(err.value)
    assert expect in msg and "\n" not in msg, msg
    return msg


@pytest.fixture
def keys(sshd, tmp_path):
    """The real server's key, and another key the server does not have."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], check=True)
    real = asyncssh.read_public_key(str(sshd.root / "host_key.pub"))
    other = asyncssh.read_public_key(str(tmp_path / "other.pub"))
    line = lambda key, host=f"[127.0.0.1]:{sshd.port}": (
        f"{host} {' '.join(key.export_public_key('openssh').decode().split()[:2])}\n"
    )
    return real, other, line


@pytest.mark.parametrize("accept_new", [False, True])
def test_a_changed_key_in_the_config_named_user_file_is_refused_with_both_fingerprints_and_the_line(
    sshd, tmp_path, keys, accept_new
):
    real, other, line = keys
    known = tmp_path / "config_named_known_hosts"
    known.write_text("# comment\n" + line(other))
    cfg = config(sshd, tmp_path / "cfg", f"UserKnownHostsFile {known}", "GlobalKnownHostsFile /dev/null")
    msg = refused(cfg, "HOST KEY CHANGED", accept_new=accept_new)
    assert real.get_fingerprint() in msg and other.get_fingerprint() in msg
    assert f"{known}:2" in msg and f"ssh-keygen -f {known} -R '[127.0.0.1]:{sshd.port}'" in msg
    assert known.read_text() == "# comment\n" + line(other)  # --accept-new never touches a changed key


@pytest.mark.parametrize("accept_new", [False, True])
def test_a_changed_key_in_the_global_file_is_refused(sshd, tmp_path, keys, accept_new):
    real, other, line = keys
    glob = tmp_path / "ssh_known_hosts"
    glob.write_text(line(other))
    cfg = config(
        sshd, tmp_path / "cfg", f"UserKnownHostsFile {tmp_path / 'missing_user_file'}", f"GlobalKnownHostsFile {glob}"
    )
    msg = refused(cfg, "HOST KEY CHANGED", accept_new=accept_new)
    assert f"{glob}:1" in msg and real.get_fingerprint() in msg and other.get_fingerprint() in msg
    assert not (tmp_path / "missing_user_file").exists()


@pytest.mark.parametrize("accept_new", [False, True])
def test_hashed_entries_are_matched_changed_and_known(sshd, tmp_path, keys, accept_new):
    real, other, line = keys
    known = tmp_path / "hashed"
    known.write_text(line(real, "unrelated.example") + line(other))
    subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(known)], check=True, capture_output=True)
    assert "127.0.0.1" not in known.read_text() and known.read_text().startswith("|1|")
    cfg = config(sshd, tmp_path / "cfg", f"UserKnownHostsFile {known}", "GlobalKnownHostsFile /dev/null")
    msg = refused(cfg, "HOST KEY CHANGED", accept_new=accept_new)
    assert f"{known}:2" in msg
    known.write_text(line(real))
    subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(known)], check=True, capture_output=True)
    assert connect(cfg) == []


@pytest.mark.parametrize("accept_new", [False, True])
def test_a_revoked_key_is_refused_even_when_also_listed_as_known(sshd, tmp_path, keys, accept_new):
    real, other, line = keys
    known = tmp_path / "known"
    known.write_text(line(real) + "@revoked " + line(real, "*"))
    cfg = config(sshd, tmp_path / "cfg", f"UserKnownHostsFile {known}", "GlobalKnownHostsFile /dev/null")
    msg = refused(cfg, "REVOKED", accept_new=accept_new)
    assert f"{known}:2" in msg and real.get_fingerprint() in msg


def test_accept_new_records_the_key_in_the_file_the_config_names(sshd, tmp_path, keys):
    real, other, line = keys
    named = tmp_path / "dir" / "named_known_hosts"
    cfg = config(
        sshd, tmp_path / "cfg", f"UserKnownHostsFile {named} {tmp_path / 'second'}", "GlobalKnownHostsFile /dev/null"
    )
    msg = refused(cfg, "unknown host key")
    assert real.get_fingerprint() in msg and f"record it in {named}" in msg and not named.exists()
    assert connect(cfg, accept_new=True) == []
    assert named.read_text() == line(real) and (named.stat().st_mode & 0o777) == 0o600
    assert not (tmp_path / "second").exists()
    assert connect(cfg) == []  # known now, without the flag


def test_strict_host_key_checking_accept_new_in_the_config_records_and_yes_refuses(sshd, tmp_path, keys):
    real, other, line = keys
    named = tmp_path / "named"
    refused(
        config(
            sshd,
            tmp_path / "cfg1",
            f"UserKnownHostsFile {named}",
            "StrictHostKeyChecking yes",
            "GlobalKnownHostsFile /dev/null",
        ),
        "unknown host key",
    )
    cfg = config(
        sshd,
        tmp_path / "cfg2",
        f"UserKnownHostsFile {named}",
        "StrictHostKeyChecking accept-new",
        "GlobalKnownHostsFile /dev/null",
    )
    assert connect(cfg) == []
    assert named.read_text() == line(real)
    named.write_text(line(other))  # accept-new in the config still refuses a changed key
    refused(cfg, "HOST KEY CHANGED")


def test_user_known_hosts_file_none_is_refused_unless_strict_checking_is_off(sshd, tmp_path, sim_state):
    msg = refused(config(sshd, tmp_path / "cfg1", "UserKnownHostsFile none"), "UserKnownHostsFile none")
    assert "refused" in msg and "StrictHostKeyChecking no" in msg
    refused(
        config(sshd, tmp_path / "cfg2", "UserKnownHostsFile none", "StrictHostKeyChecking accept-new"),
        "UserKnownHostsFile none",
        accept_new=True,
    )
    off = config(sshd, tmp_path / "cfg3", "UserKnownHostsFile none", "StrictHostKeyChecking no")
    assert connect(off) == [
        "host keys are NOT checked for kh: its ssh config says UserKnownHostsFile none and StrictHostKeyChecking no"
    ]

    async def session_says_so():
        session = HostSession(
            parse_target("kh"), SessionOptions(python=sys.executable, ssh_config=off, sim_state=str(sim_state))
        )
        try:
            await session.connect()
            return list(session.state.agent.warnings), session.trust_warnings
        finally:
            await session.close()

    warnings, trust = asyncio.run(session_says_so())
    assert warnings[0].startswith("host keys are NOT checked for kh") and trust == warnings[:1]


def test_proxy_jump_hops_are_each_checked_and_named(sshd, tmp_path, keys):
    real, other, line = keys
    known = tmp_path / "known"
    cfg = tmp_path / "cfg"
    config(sshd, tmp_path / "jump", "HostKeyAlias jumpbox", alias="jump-test")
    config(
        sshd,
        tmp_path / "target",
        "ProxyJump jump-test",
        f"UserKnownHostsFile {known}",
        "GlobalKnownHostsFile /dev/null",
        alias="behind",
    )
    # the jump host's own section also names the file: every hop reads the same config
    cfg.write_text(
        (tmp_path / "jump")
        .read_text()
        .replace(
            "HostKeyAlias jumpbox",
            f"HostKeyAlias jumpbox\n    UserKnownHostsFile {known}\n    GlobalKnownHostsFile /dev/null",
        )
        + (tmp_path / "target").read_text()
    )
    known.write_text(line(other, "jumpbox") + line(real))  # the target is known; the hop's key changed
    msg = refused(str(cfg), "HOST KEY CHANGED", host="behind")
    assert "ProxyJump hop jump-test" in msg and "(jumpbox)" in msg and f"{known}:1" in msg
    known.write_text(line(real))
    msg = refused(str(cfg), "unknown host key", host="behind")
    assert "ProxyJump hop jump-test" in msg
    known.write_text(line(real, "jumpbox") + line(real))
    assert connect(str(cfg), host="behind") == []


def test_the_cli_refuses_a_changed_key_named_by_the_config_alone(sshd, tmp_path, keys):
    """No --known-hosts: the file comes from the config's UserKnownHostsFile, as OpenSSH reads it."""
    real, other, line = keys
    known = tmp_path / "named"
    known.write_text(line(other))
    cfg = config(sshd, tmp_path / "cfg", f"UserKnownHostsFile {known}", "GlobalKnownHostsFile /dev/null")
    res = run_cli("snapshot", "kh", "--json", "--wait", "0", "--accept-new", "--ssh-config", cfg)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "HOST KEY CHANGED" in res.stderr and f"{known}:1" in res.stderr and len(res.stderr.splitlines()) == 1


def test_asyncssh_is_imported_without_a_liboqs_search_that_could_find_nothing():
    """The quick import answers asyncssh's liboqs lookup itself only where ctypes would find none:
    the same algorithms are offered, and find_library is left as it was."""
    import ctypes.util
    import subprocess
    import sys

    from cockpit.link import sshlib

    assert sshlib.liboqs_may_exist() or ctypes.util.find_library("oqs") is None
    assert ctypes.util.find_library.__module__ == "ctypes.util"
    code = (
        "import cockpit.link.ssh, asyncssh.crypto.pq as pq, ctypes.util; "
        "print(pq.sntrup_available, pq.mlkem_available, ctypes.util.find_library.__module__)"
    )
    quick = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    plain = subprocess.run(
        [sys.executable, "-c", "import asyncssh; " + code], capture_output=True, text=True, check=True
    ).stdout
    assert quick == plain and quick.split()[2] == "ctypes.util"


@pytest.mark.unit
def test_cryptographys_deprecations_raised_from_asyncssh_stay_off_the_operators_stderr():
    """cryptography 51 deprecates DSA, which asyncssh names at import: eleven lines of warnings above every
    one-line error. Those raised from asyncssh's modules are kept off; any other module's still show."""
    code = (
        "import warnings, cockpit.link.ssh\n"
        "from cryptography.utils import CryptographyDeprecationWarning as W\n"
        "for mod in ('asyncssh.crypto.misc', 'asyncssh', 'elsewhere'):\n"
        "    warnings.warn_explicit('DSA is deprecated', W, mod.replace('.', '/') + '.py', 32, module=mod)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert [line.split(":")[0] for line in res.stderr.splitlines() if "DSA" in line] == ["elsewhere.py"]
