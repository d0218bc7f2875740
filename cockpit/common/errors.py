"""The one exception a user is meant to read: a single line that names what is wrong and the fix.

The CLI prints it without a traceback and exits with status 2."""


class CockpitError(Exception):
    """A user-facing failure: bad input, an unreachable host, a missing tool on the host."""


class CommandError(CockpitError):
    """The agent answered a command with an error."""


class LinkLost(CockpitError):
    """The connection to the agent ended; a command in flight has an unknown outcome."""


class PythonUnusable(CockpitError):
    """The host's interpreter cannot run the agent: not there, or older than 3.8 (`reason`)."""

    def __init__(self, msg: str, reason: str):
        super().__init__(msg)
        self.reason = reason
