"""An agent started on this machine before the event loop exists: a one-shot `snapshot local`
starts it first thing, so the agent's start and its first CPU window pass while the cockpit
imports asyncio and the rest. The local link takes it over (`LocalLink.start_agent`) when asked
for that very agent; one never asked for ends by itself when this process does (its stdin
closes). No asyncio here: that import is what this runs ahead of."""

from __future__ import annotations

import fcntl
import subprocess

PIPE_MAX = 1 << 20  # the most an unprivileged process may ask a pipe to hold (fs.pipe-max-size's default)

_started: dict[tuple, subprocess.Popen] = {}  # (argv, payload) -> the agent started for it


def fit_pipe(fd: int, size: int) -> None:
    """Make the pipe hold `size` bytes where the kernel allows, so a payload written whole does
    not wait for the agent to read it (the default 64 KiB would)."""
    if size > 65536:
        try:
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, min(PIPE_MAX, size + 65536))
        except OSError:
            pass  # the default size: the rest goes as the agent reads


def start(argv: list[str], payload: bytes) -> None:
    """Start the agent `argv` in a session of its own and write its payload; a missing
    interpreter is left for the link to say when it starts the agent itself."""
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            bufsize=0,
        )
    except OSError:
        return
    fit_pipe(proc.stdin.fileno(), len(payload))
    try:
        proc.stdin.write(payload)
    except OSError:  # it ended at once: the link starts its own and says why
        proc.kill()
        proc.wait()
        return
    _started[(tuple(argv), payload)] = proc


def take(argv: list[str], payload: bytes) -> subprocess.Popen | None:
    """The agent started for exactly this argv and payload, handed over once."""
    return _started.pop((tuple(argv), payload), None)
