"""Listening ports: the kernel's sock_diag over netlink, else /proc/net/tcp*; owners from the
watched processes' fds, and where no descriptor can be read, the socket's uid in the kernel's table.
"""

import os
import socket
import struct
import threading
import time

from .procs import _proc_stat, _user

TCPDIAG_GETSOCK = 18  # the old inet_diag request: the kernel dumps IPv4 and IPv6 in one walk
SOCK_DIAG_BY_FAMILY = 20
TCPF_LISTEN = 1 << 10
_HEADER = struct.Struct("=IHHII")
_MSG = struct.Struct("=IH")


class Refused(OSError):
    """The kernel answered a sock_diag request with an error."""


def _dump(sock, kind, req, seq, ports, uids=None):
    """One sock_diag dump of listening TCP sockets into `ports` ({port: inode}), and (`uids`)
    each socket's uid as the kernel keeps it ({inode: uid})."""
    sock.send(_HEADER.pack(16 + len(req), kind, 0x301, seq, 0) + req)  # NLM_F_REQUEST | NLM_F_DUMP
    while True:
        data = sock.recv(65536)
        off = 0
        while off + 16 <= len(data):
            length, msg = _MSG.unpack_from(data, off)
            if msg == 3:  # NLMSG_DONE
                return
            if msg == 2 or length < 16:  # NLMSG_ERROR
                raise Refused("sock_diag refused")
            body = off + 16
            inode = struct.unpack_from("=I", data, body + 68)[0]
            ports.setdefault((data[body + 4] << 8) | data[body + 5], inode)
            if uids is not None:
                uids[inode] = struct.unpack_from("=I", data, body + 64)[0]
            off += (length + 3) & ~3


class _Diag:
    """Listening TCP sockets through netlink sock_diag, asking for LISTEN sockets only
    (/proc/net/tcp makes the kernel walk every socket on a busy host). Each dump walks the
    kernel's whole listening hash (one send took ~150 us on the H200 host of run 8), so both
    families come from one TCPDIAG_GETSOCK dump where the kernel has it, else one dump per
    family; the sampler's socket stays open between samples."""

    def __init__(self):
        self.ok = hasattr(socket, "AF_NETLINK")
        self.compat = True
        self.sock = None
        self.seq = 0
        self.lock = threading.Lock()

    def listeners(self, uids=None):
        if not self.lock.acquire(False):  # another thread is asking (a kill's check): its own socket
            sock = self._open()
            try:
                return self._ask(sock, uids)
            finally:
                sock.close()
        try:
            for _ in range(2):
                sock = self.sock or self._open()
                self.sock = None
                try:
                    ports = self._ask(sock, uids)
                except OSError as exc:
                    sock.close()  # a dump broken off may leave replies behind: never read them as ours
                    if not (self.compat and isinstance(exc, Refused)):
                        raise
                    self.compat = False  # a kernel without the old request: one dump per family
                    continue
                self.sock = sock
                return ports
        finally:
            self.lock.release()

    @staticmethod
    def _open():
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, 4)  # NETLINK_SOCK_DIAG
        sock.settimeout(1.0)
        return sock

    def _ask(self, sock, uids=None):
        ports = {}
        if self.compat:
            self.seq += 1
            _dump(sock, TCPDIAG_GETSOCK, struct.pack("=BBBB48xII", 0, 0, 0, 0, TCPF_LISTEN, 0), self.seq, ports, uids)
            return ports
        for family in (socket.AF_INET, socket.AF_INET6):
            self.seq += 1
            _dump(
                sock,
                SOCK_DIAG_BY_FAMILY,
                struct.pack("=BBBBI48x", family, socket.IPPROTO_TCP, 0, 0, TCPF_LISTEN),
                self.seq,
                ports,
                uids,
            )
        return ports


_DIAG = _Diag()


def listening_ports():
    """{port: inode} of listening TCP sockets: sock_diag where it works, else /proc/net/tcp{,6}."""
    if _DIAG.ok:
        try:
            return _DIAG.listeners()
        except OSError:
            _DIAG.ok = False
    ports = {}
    for port, inode in _proc_net_listeners():
        ports.setdefault(port, inode)
    return ports


def socket_table():
    """{port: (inode, uid)} of listening TCP sockets, the uid as the kernel's socket table keeps
    it (the user that opened the socket): who holds a port whose process's descriptors cannot
    be read (another user's, for an agent not run as root)."""
    if _DIAG.ok:
        uids = {}
        try:
            ports = _DIAG.listeners(uids)
            return dict((port, (inode, uids.get(inode))) for port, inode in ports.items())
        except OSError:
            _DIAG.ok = False
    out = {}
    for port, inode, uid in _proc_net_rows():
        out.setdefault(port, (inode, uid))
    return out


LISTENERS_EVERY_S = 5.0  # the listeners are read this often while nothing is awaited and the watch stands


def _proc_net_rows(base="/proc/net"):
    """(port, socket inode, uid) of each listening TCP socket, from /proc/net/tcp and tcp6
    (`base` /proc/PID/net: that process's network namespace)."""
    for name in (base + "/tcp", base + "/tcp6"):
        try:
            with open(name) as fh:
                next(fh, None)
                for line in fh:
                    parts = line.split()
                    if len(parts) > 9 and parts[3] == "0A":
                        yield int(parts[1].rsplit(":", 1)[1], 16), int(parts[9]), int(parts[7])
        except (OSError, ValueError):
            continue


def _proc_net_listeners(base="/proc/net"):
    """(port, socket inode) of each listening TCP socket (`_proc_net_rows`)."""
    for port, inode, _uid in _proc_net_rows(base):
        yield port, inode


def _sid(pid):
    row = _proc_stat(pid)
    return None if row is None else row["sid"]


def _uid_of(pid):
    try:
        return os.stat("/proc/%d" % pid).st_uid
    except OSError:
        return None


def _holder(inode):
    """(pid, uid, session) of a process holding socket `inode` open; (None, None, None) when none
    can be read."""
    want = "socket:[%d]" % inode
    try:
        pids = [d for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return None, None, None
    for pid in pids:
        fd_dir = "/proc/%s/fd" % pid
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(fd_dir + "/" + fd) != want:
                    continue
                uid = os.stat("/proc/" + pid).st_uid
            except OSError:
                continue
            return int(pid), uid, _sid(int(pid))
    return None, None, None


def port_value(argv):
    """The port a command line names with `--port N` or `--port=N` (SGLang's, vLLM's); None."""
    for i, a in enumerate(argv or ()):
        value = None
        if a == "--port" and i + 1 < len(argv):
            value = argv[i + 1]
        elif a.startswith("--port="):
            value = a[7:]
        if value is not None:
            try:
                return int(value)
            except ValueError:
                return None
    return None


def socket_inodes(pid):
    inodes = set()
    try:
        fd_dir = "/proc/%d/fd" % pid
        for fd in os.listdir(fd_dir):
            try:
                link = os.readlink(fd_dir + "/" + fd)
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(int(link[8:-1]))
    except OSError:
        pass
    return inodes


class Ports:
    """Configured ports (open or not) and every port a watched process listens on.

    Owners are found by reading the watched processes' fds, which is the costly part, so it is
    done only when a listening socket appears that was not seen before or the watched set changes."""

    def __init__(self):
        self.configured = []
        self.owner = {}  # inode -> pid
        self.foreign = set()  # listening inodes no watched process held when last looked
        self._watched = frozenset()
        self._listening = None  # {port: inode} as last read
        self._read_at = 0.0
        self._named = ()  # ports the watched processes' command lines name (`--port N`)
        self._generation = None
        self._sampled, self._rows = None, None  # the reading the last rows came from, and them
        self.holders = {}  # inode -> (pid, uid, sid) of a configured port's listener no watched process holds

    def configure(self, ports):
        self.configured = [int(p) for p in ports]
        self._sampled = None  # the rows change with them

    def listening(self, watched, now=None):
        """{port: inode}, read again each tick while a port is awaited (configured, or named by a
        watched process's `--port`, and not listening: a server coming up, a port taken by someone
        else) or when the watched processes changed (one that started may listen, one that exited
        closed its sockets), else every LISTENERS_EVERY_S:
        in the dump the kernel walks its whole listening hash (~250 µs on an H200 host), and on a
        serving host TCP connections come and go every second, so no cheaper count tells that a
        listener opened. A port that an old process opens later is seen up to that much later."""
        now = time.monotonic() if now is None else now
        last = self._listening
        if (
            last is None
            or watched != self._watched
            or now - self._read_at >= LISTENERS_EVERY_S
            or any(port not in last for port in self.configured)
            or any(port not in last for port in self._named)
        ):
            self._listening, self._read_at = listening_ports(), now
        return self._listening

    def sample(self, watched_pids, cmdlines=None, now=None, generation=None):
        """Rows of the configured ports and those the watched processes listen on; `cmdlines`
        ({pid: argv}) say which ports the run means to open; `generation`, when given, moves
        whenever the watched pids change (the same one: the same pids, not looked at again)."""
        if generation is None or generation != self._generation:
            self._generation = generation
            watched = frozenset(watched_pids)
        else:
            watched = self._watched
        if watched != self._watched:
            named = (port_value((cmdlines or {}).get(pid)) for pid in watched)
            self._named = tuple(set(p for p in named if p is not None))
        listening = self.listening(watched, now)
        if listening is self._sampled and watched is self._watched:
            return self._rows  # the same reading, the same processes: the same rows
        inodes = set(listening.values())
        fresh = inodes - set(self.owner) - self.foreign
        if fresh or watched != self._watched:
            # a listener nobody was known to hold, or an owner gone (another process may share
            # its socket): every watched process's sockets; only newcomers in the watched set:
            # their sockets (a 200-process tree where one worker restarts reads one fd table)
            full = fresh or any(pid not in watched for pid in self.owner.values())
            look = watched if full else watched - self._watched
            if full:
                self.owner = {}
            self._watched = watched
            for pid in look:
                for inode in socket_inodes(pid) & inodes:
                    self.owner[inode] = pid
            self.foreign = inodes - set(self.owner)
        owners = {port: self.owner[inode] for port, inode in listening.items() if inode in self.owner}
        out = []
        for port in sorted(set(self.configured) | set(owners)):
            row = {"port": port, "listening": port in listening, "pid": owners.get(port)}
            if port in listening and port not in owners:
                row.update(self._stranger(listening[port], watched))
            out.append(row)
        self._sampled, self._rows = listening, out
        return out

    def _stranger(self, inode, watched):
        """Who holds a configured port that no watched process holds (looked for once per socket:
        one walk of the process table's descriptors), and whether it is of the run all the same
        (a process of a watched process's session, as the server that spawned the ranks is):
        another user's or another job's listener is never the run's port opening."""
        if inode not in self.holders:
            self.holders = dict((i, h) for i, h in self.holders.items() if i in self.foreign)
            self.holders[inode] = _holder(inode)
        pid, uid, sid = self.holders[inode]
        if pid is None:  # no descriptor of it readable (another user's, for an agent not run as root)
            uid = next((u for i, u in socket_table().values() if i == inode), None)
            if uid is None:
                return {}
            uids = set(_uid_of(w) for w in watched) - {None}
            return {"holder_uid": uid, "holder_user": _user(uid), "theirs": None if uid in uids else False}
        sessions = set(_sid(w) for w in watched) - {None}
        return {
            "holder": pid,
            "holder_uid": uid,
            "holder_user": None if uid is None else _user(uid),
            "theirs": sid in sessions,
        }
