"""NCCL RAS: its address from a rank's environment and one bounded conversation, polled from a thread."""

import json
import socket
import threading
import time

from .procs import environ_of

RAS_PORT = 28028
RAS_EVERY_S = 10.0  # at most this often, and only while a watched process listens on the RAS port (a sixth of the stall threshold)
RAS_TIMEOUT_S = 15.0  # a whole conversation; RAS itself waits for unresponsive peers
RAS_MAX_BYTES = 1 << 20


def ras_addr(text):
    """NCCL_RAS_ADDR's `host:port` (or `port`) as (host, port); None when unreadable."""
    host, _, port = (text or "").strip().rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65536:
        return None
    host = host.strip("[]") or "127.0.0.1"
    if host in ("0.0.0.0", "::", "*"):
        host = "127.0.0.1"
    return host, int(port)


class _Conversation:
    """Lines and the rest of one TCP conversation, every read under one deadline and bounded."""

    def __init__(self, sock, deadline, limit):
        self.sock, self.deadline, self.limit = sock, deadline, limit
        self.buf = b""
        self.truncated = False

    def _recv(self):
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout("no answer from RAS in time")
        self.sock.settimeout(left)
        return self.sock.recv(65536)

    def send(self, line):
        self.sock.settimeout(max(0.1, self.deadline - time.monotonic()))
        self.sock.sendall((line + "\n").encode())

    def line(self):
        while b"\n" not in self.buf:
            chunk = self._recv()
            if not chunk:
                break
            self.buf += chunk
            if len(self.buf) > 4096:
                break
        line, _, self.buf = self.buf.partition(b"\n")
        return line.decode("utf-8", "replace").strip()

    def rest(self):
        data = self.buf
        while len(data) < self.limit:
            chunk = self._recv()
            if not chunk:
                return data
            data += chunk
        self.truncated = True
        return data[: self.limit]


def _connect(host, port, timeout):
    """A TCP connection; a numeric address is connected to directly: create_connection's
    getaddrinfo asks the kernel for every interface's addresses first (glibc sorts its answers),
    0.5 ms of each 5 s poll on the H200 host of run 13."""
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, host)
        except (OSError, ValueError):
            continue
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect((host, port))
        except BaseException:
            sock.close()
            raise
        return sock
    return socket.create_connection((host, port), timeout=timeout)


def ras_query(host="127.0.0.1", port=RAS_PORT, fmt="json", verbose=True, timeout=RAS_TIMEOUT_S, limit=RAS_MAX_BYTES):
    """One conversation with NCCL's RAS service, as NCCL's own client has it: CLIENT PROTOCOL 2,
    SET FORMAT json (NCCL >= 2.28; text when the server does not know it), VERBOSE STATUS, then
    the report until the server closes. Never raises: the answer says what went wrong. A JSON
    answer that does not parse is asked again as text (json_error says why)."""
    start = time.monotonic()
    out = {"ts": round(time.time(), 3), "host": host, "port": port, "format": fmt, "text": None}
    try:
        sock = _connect(host, int(port), min(3.0, timeout))
    except OSError as exc:
        out["error"] = "cannot connect to %s:%d: %s" % (host, port, exc.strerror or exc)
        return out
    try:
        conv = _Conversation(sock, start + timeout, limit)
        conv.send("CLIENT PROTOCOL 2")
        hello = conv.line()
        if not hello.upper().startswith("SERVER PROTOCOL"):
            out["error"] = "not NCCL's RAS service: it answered %r" % hello[:80]
            return out
        if fmt == "json":
            conv.send("SET FORMAT json")
            if conv.line().upper() != "OK":
                out["format"] = "text"
        conv.send("VERBOSE STATUS" if verbose else "STATUS")
        data = conv.rest()
        out["text"] = data.decode("utf-8", "replace")
        out["truncated"] = conv.truncated
    except (OSError, socket.timeout) as exc:
        out["error"] = "RAS at %s:%d: %s" % (host, port, str(exc) or "timeout")
        return out
    finally:
        sock.close()
        out["ms"] = round((time.monotonic() - start) * 1000.0, 1)
    if out["format"] == "json":
        try:
            json.loads(out["text"])
        except ValueError as exc:
            again = ras_query(host, port, "text", verbose, max(1.0, timeout - (time.monotonic() - start)), limit)
            again["json_error"] = str(exc)[:200]
            return again
    return out


class RasPoller:
    """Asks NCCL's RAS service for its status from a thread, at most every RAS_EVERY_S, and only
    while a watched process listens on the RAS port (NCCL_RAS_ADDR from a rank's environment, else
    28028): a RAS that hangs never holds up a sample. Remembers a server whose JSON was broken."""

    def __init__(self):
        self.every_s = RAS_EVERY_S
        self.timeout = RAS_TIMEOUT_S
        self.enabled = True
        self.addr = None  # (host, port) forced by the cockpit
        self.env_addr = {}  # pid -> (host, port) or None, read once per process
        self.last = 0.0
        self.thread = None
        self.result = None
        self.text_only = False
        self.lock = threading.Lock()

    def target(self, pids):
        if self.addr:
            return self.addr
        for pid in pids:
            if pid not in self.env_addr:
                self.env_addr[pid] = ras_addr(environ_of(pid).get("NCCL_RAS_ADDR"))
            if self.env_addr[pid]:
                return self.env_addr[pid]
        return ("127.0.0.1", RAS_PORT)

    def poll(self, ports, watched):
        """Starts a query when one is due; returns the last finished answer once. `watched`: the
        watched pids (a dict or set)."""
        for pid in [p for p in self.env_addr if p not in watched]:
            del self.env_addr[pid]
        with self.lock:
            done, self.result = self.result, None
        if not self.enabled:
            return done
        owners = [p.get("pid") for p in ports if p.get("pid") in watched]
        if not self.addr and not owners:
            return done  # no watched process listens anywhere: no RAS to ask, no environment to read
        host, port = self.target(owners)  # only a listener's environment
        listening = any(p["port"] == port and p.get("pid") in watched for p in ports)
        now = time.monotonic()
        if listening and now - self.last >= self.every_s and (self.thread is None or not self.thread.is_alive()):
            self.last = now
            self.thread = threading.Thread(target=self._run, args=(host, port), daemon=True, name="ras")
            self.thread.start()
        return done

    def _run(self, host, port):
        answer = ras_query(host, port, "text" if self.text_only else "json", timeout=self.timeout)
        if answer.get("json_error"):
            self.text_only = True
        with self.lock:
            self.result = answer
