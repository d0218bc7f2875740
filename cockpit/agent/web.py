"""HTTP on the host's loopback: the health probe and a bounded metrics page. A peer on the port
may be anyone's: every request has one overall deadline (connect, send and every read together,
whatever pace the peer drips its bytes at) and at most one is in flight per port (a second is
answered at once as busy), so a slow peer costs a bounded number of threads and sockets.
"""

import re
import socket
import threading
import time

MAX_TIMEOUT_S = 30.0
METRICS_MAX_BYTES = 8 << 20
_lock = threading.Lock()
_in_flight = set()  # ports with a request under way


def _fetch(port, path, timeout, limit, accept=""):
    """(the response's bytes up to `limit`, cut short, ms) or {"error": ...}: one GET under one
    deadline, the only one in flight to `port`."""
    port = int(port)
    timeout = min(max(float(timeout), 0.01), MAX_TIMEOUT_S)
    with _lock:
        if port in _in_flight:
            return {
                "port": port,
                "path": path,
                "status": None,
                "busy": True,
                "error": "an earlier request to this port is still under way",
            }
        _in_flight.add(port)
    start = time.monotonic()
    deadline = start + timeout
    data, truncated = bytearray(), False
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        try:
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            sock.sendall(
                (
                    "GET %s HTTP/1.0\r\nHost: 127.0.0.1:%d\r\nUser-Agent: gpu-cockpit\r\n%s\r\n" % (path, port, accept)
                ).encode()
            )
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise socket.timeout("no whole answer in %.0f s" % timeout)
                sock.settimeout(left)
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk  # a bytearray grows in place: linear in the page, never a copy per chunk
                if len(data) > limit:
                    del data[limit:]
                    truncated = True
                    break
        finally:
            sock.close()
    except OSError as exc:
        return {
            "port": port,
            "path": path,
            "status": None,
            "error": getattr(exc, "strerror", None) or str(exc) or "timeout",
        }
    finally:
        with _lock:
            _in_flight.discard(port)
    return bytes(data), truncated, round((time.monotonic() - start) * 1000.0, 1)


def _status(head):
    m = re.match(rb"HTTP/\d(?:\.\d)? (\d{3})", head)
    return int(m.group(1)) if m else None


def http_get(port, path, timeout=2.0):
    """One HTTP GET on the host's loopback: the probe the operator ran with curl."""
    got = _fetch(port, path, timeout, 65536)
    if isinstance(got, dict):
        return got
    data, _, ms = got
    head, _, body = data.partition(b"\r\n\r\n")
    return {
        "port": int(port),
        "path": path,
        "status": _status(head),
        "ms": ms,
        "body": body[:4096].decode("utf-8", "replace"),
    }


def http_body(port, path, timeout=5.0, limit=METRICS_MAX_BYTES, want=None):
    """An HTTP GET whose body may be large (a metrics page): bounded at `limit`; with `want`, only
    the lines of those metric names (and their # TYPE/# HELP) travel back."""
    got = _fetch(port, path, timeout, limit, "Accept: text/plain\r\n")
    if isinstance(got, dict):
        return got
    data, truncated, ms = got
    head, _, body = data.partition(b"\r\n\r\n")
    text = body.decode("utf-8", "replace")
    if want:
        names = tuple(want)
        text = "\n".join(
            line
            for line in text.splitlines()
            if line.startswith(names) or (line.startswith("# ") and any(n in line for n in names))
        )
    return {"port": int(port), "path": path, "status": _status(head), "ms": ms, "body": text, "truncated": truncated}
