"""Log files followed from their end in whole lines, and the run's log opened safely for appending."""

import os

from .flightrec import open_regular
from .nofollow import open_nofollow
from .procs import _user
from .protocol import Refused

LOG_INITIAL_BYTES = 32 * 1024
LOG_MAX_BYTES_PER_FRAME = 64 * 1024
LOG_LINE_MAX = 64 * 1024  # a longer log line keeps its head and says how much of it was skipped


class LogTail:
    """Follows one file through rotation (new inode) and truncation (size below our offset);
    waits for a file that does not exist yet. Reads at most LOG_MAX_BYTES_PER_FRAME per poll.
    A line keeps at most LOG_LINE_MAX bytes, the rest is counted and said (" … [N bytes
    skipped]"), so a log that never writes a newline holds at most that much here."""

    def __init__(self, path, owners=None):
        self.path = path
        # who may own the file: the user of the process writing it when that is known (its
        # stdout), else root and the agent's own user; anyone else's file is refused, not read
        self.owners = set(owners) if owners is not None else {0, os.geteuid()}
        self.fh = None
        self.inode = self.dev = None
        self.pos = 0
        self.partial = b""  # the line being read, at most LOG_LINE_MAX bytes
        self.partial_skipped = 0  # bytes of that line beyond LOG_LINE_MAX, dropped
        self.state = None
        self.mtime = None  # when the file was last written (host clock): how long the run has been silent
        # opened when the watch is asked for, so its recent tail is the one at that moment, whenever
        # the first poll comes; a file missing or refused now is retried (and said) by poll
        self._open(initial=True)

    def _feed(self, data):
        """Whole lines out of `data` after what came before; the unfinished one is kept, bounded."""
        out = []
        start = 0
        while True:
            nl = data.find(b"\n", start)
            piece = data[start:] if nl < 0 else data[start:nl]
            room = max(0, LOG_LINE_MAX - len(self.partial))
            if len(piece) > room:
                self.partial_skipped += len(piece) - room
                piece = piece[:room]
            self.partial += piece
            if nl < 0:
                return out
            out.append(self._finish())
            start = nl + 1

    def _finish(self):
        text = self.partial.decode("utf-8", "replace").rstrip("\r")
        if self.partial_skipped:
            text += " \u2026 [%d bytes skipped]" % self.partial_skipped
        self.partial, self.partial_skipped = b"", 0
        return text

    def _open(self, initial):
        """Opens the file as open_regular allows; returns why it was refused, or None."""
        try:
            fd = open_regular(self.path, self.owners)
        except OSError as exc:
            return "%s %s" % (self.path, exc.strerror or exc)
        fh = os.fdopen(fd, "rb")
        st = os.fstat(fh.fileno())
        self.fh, self.inode, self.dev = fh, st.st_ino, st.st_dev
        self.pos = max(0, st.st_size - LOG_INITIAL_BYTES) if initial else 0
        fh.seek(self.pos)
        self.partial, self.partial_skipped = b"", 0
        if self.pos:
            fh.readline()  # skip the cut line
            self.pos = fh.tell()
        return None

    def poll(self):
        """Returns (event or None, [lines]). The path is looked at with lstat and every open (the
        first, after a rotation, after it was missing) is checked again: a log swapped for a
        symlink, a FIFO or another user's file is said once as `refused: why` and never read."""
        event = None
        try:
            st = os.lstat(self.path)
        except OSError:
            if self.state != "missing":
                self.state = "missing"
                return "missing", self._drain()
            return None, []
        self.mtime = st.st_mtime
        lines = []
        if self.fh is not None and (st.st_ino, st.st_dev) != (self.inode, self.dev):
            lines = self._drain()
            if self.fh is not None:
                self.fh.close()
                self.fh = None
            event = "rotated"
        if self.fh is None:
            was = self.state
            why = self._open(initial=self.inode is None)
            if why:
                self.state = "refused: " + why
                return (None if was == self.state else self.state), lines
            event = event or ("opened" if was is None else "created")
            st = os.fstat(self.fh.fileno())
        elif st.st_size < self.pos:
            self.fh.seek(0)
            self.pos = 0
            self.partial, self.partial_skipped = b"", 0
            event = "truncated"
        if event is None and self.state is None:
            event = "opened"  # opened when the watch was asked for
        self.state = "open"
        behind = st.st_size - self.pos
        if behind > 4 * LOG_MAX_BYTES_PER_FRAME:
            # A flood: a tail shows the newest lines; say how much was skipped rather than lag.
            self.fh.seek(st.st_size - LOG_MAX_BYTES_PER_FRAME)
            self.fh.readline()
            self.pos = self.fh.tell()
            self.partial, self.partial_skipped = b"", 0
            event = "skipped %d bytes" % (self.pos - (st.st_size - behind))
        data = self.fh.read(LOG_MAX_BYTES_PER_FRAME)
        self.pos += len(data)
        if data:
            lines.extend(self._feed(data))
        return event, lines

    def _drain(self):
        if self.fh is None:
            return []
        lines = self._feed(self.fh.read(LOG_MAX_BYTES_PER_FRAME))
        if self.partial or self.partial_skipped:
            lines.append(self._finish())
        if self.state == "missing":
            self.fh.close()
            self.fh = None
        return [line for line in lines if line]


def open_log(path):
    """The run's log for appending: created 0600 (its missing folders 0700), never through a
    symlink in any component (open_nofollow: one planted in a shared log folder, or a folder
    above it that is a link, is refused), never another user's file, never a hard link."""
    import errno
    import stat as st_mod

    try:
        fd = open_nofollow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600, make_dirs=True)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Refused(
                "the log %s: %s: refused (one may have been planted there); remove it or set another "
                "log_dir in the layout" % (path, exc.strerror)
            ) from None
        raise Refused("cannot open the log %s: %s" % (path, exc.strerror or exc)) from None
    st = os.fstat(fd)
    problem = None
    if not st_mod.S_ISREG(st.st_mode):
        problem = "is not a regular file"
    elif st.st_uid != os.geteuid():
        problem = "belongs to %s, not to %s" % (_user(st.st_uid), _user(os.geteuid()))
    elif st.st_nlink > 1:
        problem = "has other hard links"
    if problem:
        os.close(fd)
        raise Refused("the log %s %s: refused; remove it or set another log_dir in the layout" % (path, problem))
    if st_mod.S_IMODE(st.st_mode) & 0o077:
        os.fchmod(fd, 0o600)
    return fd
