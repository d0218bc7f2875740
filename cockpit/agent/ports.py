"""Listening ports: the kernel's sock_diag over netlink, else /proc/net/tcp*; owners from the
watched processes' fds only.
"""

import os
import socket


def _diag_listeners():
    """{port: inode} of listening TCP sockets through netlink sock_diag, asking the kernel for
    LISTEN sockets only: /proc/net/tcp makes it walk every socket on a busy host."""
    import struct

    ports = {}
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, 4)  # NETLINK_SOCK_DIAG
    try:
        sock.settimeout(1.0)
        for seq, family in enumerate((socket.AF_INET, socket.AF_INET6), 1):
            req = struct.pack("=BBBBI48x", family, socket.IPPROTO_TCP, 0, 0, 1 << 10)
            sock.send(struct.pack("=IHHII", 16 + len(req), 20, 0x301, seq, 0) + req)
            done = False
            while not done:
                data = sock.recv(65536)
                off = 0
                while off + 16 <= len(data):
                    length, kind = struct.unpack_from("=IH", data, off)
                    if kind == 3:  # NLMSG_DONE
                        done = True
                        break
                    if kind == 2 or length < 16:  # NLMSG_ERROR
                        raise OSError("sock_diag refused")
                    body = off + 16
                    port = struct.unpack_from(">H", data, body + 4)[0]
                    inode = struct.unpack_from("=I", data, body + 68)[0]
                    ports.setdefault(port, inode)
                    off += (length + 3) & ~3
    finally:
        sock.close()
    return ports


_DIAG_OK = [hasattr(socket, "AF_NETLINK")]


def listening_ports():
    """{port: inode} of listening TCP sockets: sock_diag where it works, else /proc/net/tcp{,6}."""
    if _DIAG_OK[0]:
        try:
            return _diag_listeners()
        except OSError:
            _DIAG_OK[0] = False
    ports = {}
    for port, inode in _proc_net_listeners():
        ports.setdefault(port, inode)
    return ports


def _proc_net_listeners(base="/proc/net"):
    """(port, socket inode) of each listening TCP socket, from /proc/net/tcp and tcp6 (`base`
    /proc/PID/net: that process's network namespace)."""
    for name in (base + "/tcp", base + "/tcp6"):
        try:
            with open(name) as fh:
                next(fh, None)
                for line in fh:
                    parts = line.split()
                    if len(parts) > 9 and parts[3] == "0A":
                        yield int(parts[1].rsplit(":", 1)[1], 16), int(parts[9])
        except OSError:
            continue


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

    def sample(self, watched_pids):
        listening = listening_ports()
        watched = frozenset(watched_pids)
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
            out.append({"port": port, "listening": port in listening, "pid": owners.get(port)})
        return out
