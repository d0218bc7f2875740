"""The host's own record of its runs and of the operator's acts on them: what a launch started (run
id, process group, its leader's start time), who stopped which processes, from where and when, a
stop verified whole, a stall's forensics. Every cockpit's agent on this host, as this user, appends
to and reads the same file, so a cold look, the exporter, a second screen and a colleague's laptop
know what the cockpit that acted knows. It lives in the user's own gpu-cockpit state folder, the
only place the agent writes; each record is one line, appended whole.
"""

import binascii
import json
import os
import stat as st_mod
import time

from .nofollow import open_nofollow
from .procs import _boot_time
from .protocol import Refused

ACTS = ("launch", "stop", "ended", "forensics")
MAX_BYTES = 1 << 20  # past this the file starts again from its recent tail
TAIL_BYTES = 256 * 1024  # what a new agent reads: the recent acts
LINE_MAX = 64 * 1024  # a record longer than this is refused (written) or skipped (read)
SENT_MAX = 500  # the most records one frame carries


def acts_path():
    """$XDG_STATE_HOME/gpu-cockpit/host/acts.jsonl (an absolute XDG_STATE_HOME only, as the spec
    says), else ~/.local/state/gpu-cockpit/host/acts.jsonl."""
    base = os.environ.get("XDG_STATE_HOME", "")
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "gpu-cockpit", "host", "acts.jsonl")


def own_folder(folder):
    """Refused unless the folder is a real folder of this user that nobody else can write (a
    record read from it is believed by every cockpit; the operator's ledger is held the same way)."""
    st = os.lstat(folder)
    if not st_mod.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise Refused(
            "the cockpit's state folder %s is not a folder of this user that only it can write: "
            "refused; remove it (it is made again)" % folder
        )


def open_own(path, flags, make_dirs=False):
    """The record's file, no symbolic link followed in any component (folders made 0700 where
    missing), refused unless it is a plain file of this user."""
    fd = open_nofollow(path, flags, 0o600, make_dirs)
    st = os.fstat(fd)
    if not st_mod.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_nlink > 1:
        os.close(fd)
        raise Refused("%s is not a plain file of this user: refused; remove it (it is made again)" % path)
    return fd, st


class Acts:
    """Appends records and reads those appended since (by any agent of this user on this host)."""

    def __init__(self, path=None):
        self.path = path or acts_path()
        self.seen = None  # (inode, size, mtime) at the last read
        self.offset = 0
        self.inode = None

    def note(self, rec):
        """Append one record (`act` one of ACTS), stamped with its time, this boot and an id;
        returns it as written."""
        if rec.get("act") not in ACTS:
            raise ValueError("unknown act %r" % (rec.get("act"),))
        rec = dict(rec, at=round(time.time(), 3), boot=_boot_time(), id=binascii.hexlify(os.urandom(6)).decode())
        line = (json.dumps(rec, separators=(",", ":"), default=str) + "\n").encode()
        if len(line) > LINE_MAX:
            raise Refused("a record of %d bytes is longer than %d: not written" % (len(line), LINE_MAX))
        self._start_again_if_long()
        fd, _ = open_own(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, make_dirs=True)
        try:
            own_folder(os.path.dirname(self.path))
        except Refused:
            os.close(fd)
            raise
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
        return rec

    def _start_again_if_long(self):
        """Past MAX_BYTES the file is replaced by its recent tail (a new inode: readers read it
        again; records keep their ids, so none is taken twice)."""
        try:
            if os.lstat(self.path).st_size <= MAX_BYTES:
                return
            fd, st = open_own(self.path, os.O_RDONLY)
        except OSError:
            return
        try:
            tail = _tail(fd, st.st_size)
        finally:
            os.close(fd)
        tmp = "%s.%d.tmp" % (self.path, os.getpid())
        fd, _ = open_own(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            os.write(fd, tail)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)

    def poll(self):
        """The records appended since the last call (the first call: the recent ones), or None
        when the file did not change. Records of an earlier boot are history: left out."""
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        key = (st.st_ino, st.st_size, st.st_mtime_ns)
        if key == self.seen:
            return None
        self.seen = key
        try:
            fd, st = open_own(self.path, os.O_RDONLY)
        except (OSError, Refused):
            return None
        try:
            if st.st_ino != self.inode or st.st_size < self.offset:
                self.inode = st.st_ino
                data = _tail(fd, st.st_size)
            else:
                os.lseek(fd, self.offset, os.SEEK_SET)
                data = os.read(fd, max(0, st.st_size - self.offset))
            end = data.rfind(b"\n") + 1  # a line still being written is read whole next time
            self.offset = os.lseek(fd, 0, os.SEEK_CUR) - (len(data) - end)
        finally:
            os.close(fd)
        boot = _boot_time()
        out = []
        for raw in data[:end].split(b"\n"):
            if not raw or len(raw) > LINE_MAX:
                continue
            try:
                rec = json.loads(raw.decode("utf-8", "replace"))
            except ValueError:
                continue
            if (
                isinstance(rec, dict)
                and rec.get("act") in ACTS
                and isinstance(rec.get("id"), str)
                and isinstance(rec.get("boot"), (int, float))
                and abs(rec["boot"] - boot) <= 2
            ):
                out.append(rec)
        return out[-SENT_MAX:] or None

    def launched(self, layout=None):
        """The launch records of this boot not followed by a verified end of the same process
        group (newest first), for `layout` (a name) when given: hints for find_runs, whose
        checks (the leader's start time, the marker) still decide."""
        reader = Acts(self.path)
        recs = reader.poll() or []
        ended = set()
        out = []
        for rec in reversed(recs):
            if rec["act"] == "ended":
                ended.update(int(g) for g in rec.get("pgids") or [] if isinstance(g, int))
            elif (
                rec["act"] == "launch"
                and isinstance(rec.get("pgid"), int)
                and rec["pgid"] not in ended
                and rec.get("start") is not None
                and (layout is None or rec.get("layout") == layout)
            ):
                out.append({k: rec[k] for k in ("pgid", "start", "boot", "uid", "run_id") if rec.get(k) is not None})
        return out


def _tail(fd, size):
    """The last TAIL_BYTES of the file, from a line's start."""
    start = max(0, size - TAIL_BYTES)
    os.lseek(fd, start, os.SEEK_SET)
    data = b""
    while len(data) < size - start:
        chunk = os.read(fd, size - start - len(data))
        if not chunk:
            break
        data += chunk
    if start:
        nl = data.find(b"\n")
        data = data[nl + 1 :] if nl >= 0 else b""
    return data
