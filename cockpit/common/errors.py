"""The one exception a user is meant to read: a single line that names what is wrong and the fix.

The CLI prints it without a traceback and exits with status 2."""

from __future__ import annotations

from collections.abc import Callable


class CockpitError(Exception):
    """A user-facing failure: bad input, an unreachable host, a missing tool on the host."""


class CommandError(CockpitError):
    """The agent answered a command with an error."""


class LinkLost(CockpitError):
    """The connection to the agent ended; a command in flight has an unknown outcome."""


class UnknownHostKey(CockpitError):
    """A host key no known_hosts file lists, where the ssh config leaves it to the operator
    (StrictHostKeyChecking ask, OpenSSH's default): what ssh asks about. A screen asks as ssh
    does (`question`); `record()` is the yes (the key appended to the user's known_hosts by the
    link that met it), returning what ssh then says."""

    def __init__(
        self,
        msg: str,
        label: str,
        entry_name: str,
        key_type: str,
        fingerprint: str,
        path: str,
        accept: Callable[[], str],
    ):
        super().__init__(msg)
        self.label, self.entry_name, self.key_type, self.fingerprint, self.path = (
            label,
            entry_name,
            key_type,
            fingerprint,
            path,
        )
        self._accept = accept

    def question(self) -> tuple[str, list[str]]:
        """ssh's own words: the title, then the lines above its question."""
        return (
            f"The authenticity of host '{self.label} ({self.entry_name})' can't be established.",
            [
                f"{self.key_type} key fingerprint is {self.fingerprint}.",
                f"yes records it in {self.path} (as ssh does) and connects; no quits, nothing recorded.",
                "Compare the fingerprint with the host's own (ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub "
                "there) before you answer yes.",
            ],
        )

    def record(self) -> str:
        return self._accept()


class PythonUnusable(CockpitError):
    """The host's interpreter cannot run the agent: not there, or older than 3.8 (`reason`)."""

    def __init__(self, msg: str, reason: str):
        super().__init__(msg)
        self.reason = reason
