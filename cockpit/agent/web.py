"""HTTP on the host's loopback: the health probe and a bounded metrics page.
"""

import re
import socket
import time


def http_get(port, path, timeout=2.0, host="127.0.0.1"):
    """One HTTP GET on the host's loopback: the probe the operator ran with curl."""
    start = time.monotonic()
    try:
        sock = socket.create_connection((host, int(port)), timeout=timeout)
    except OSError as exc:
        return {"port": port, "path": path, "status": None, "error": exc.strerror or str(exc)}
    try:
        sock.settimeout(timeout)
        req = "GET %s HTTP/1.0\r\nHost: %s:%d\r\nUser-Agent: gpu-cockpit\r\n\r\n" % (path, host, int(port))
        sock.sendall(req.encode())
        data = b""
        while len(data) < 65536:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    except OSError as exc:
        return {"port": port, "path": path, "status": None, "error": str(exc) or "timeout"}
    finally:
        sock.close()
    ms = round((time.monotonic() - start) * 1000.0, 1)
    head, _, body = data.partition(b"\r\n\r\n")
    m = re.match(rb"HTTP/\d\.\d (\d{3})", head)
    return {
        "port": port,
        "path": path,
        "status": int(m.group(1)) if m else None,
        "ms": ms,
        "body": body[:4096].decode("utf-8", "replace"),
    }


METRICS_MAX_BYTES = 8 << 20


def http_body(port, path, timeout=5.0, limit=METRICS_MAX_BYTES, want=None, host="127.0.0.1"):
    """An HTTP GET whose body may be large (a metrics page): bounded at `limit`; with `want`, only
    the lines of those metric names (and their # TYPE/# HELP) travel back."""
    start = time.monotonic()
    try:
        sock = socket.create_connection((host, int(port)), timeout=timeout)
    except OSError as exc:
        return {"port": port, "path": path, "status": None, "error": exc.strerror or str(exc)}
    data, truncated = bytearray(), False
    try:
        sock.settimeout(timeout)
        sock.sendall(("GET %s HTTP/1.0\r\nHost: %s:%d\r\nUser-Agent: gpu-cockpit\r\nAccept: text/plain\r\n\r\n"
                      % (path, host, int(port))).encode())
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk  # a bytearray grows in place: linear in the page, never a copy per chunk
            if len(data) > limit:
                del data[limit:]
                truncated = True
                break
            if time.monotonic() - start > timeout:
                raise socket.timeout("timed out")
    except OSError as exc:
        return {"port": port, "path": path, "status": None, "error": str(exc) or "timeout"}
    finally:
        sock.close()
    data = bytes(data)
    head, _, body = data.partition(b"\r\n\r\n")
    m = re.match(rb"HTTP/\d(?:\.\d)? (\d{3})", head)
    text = body.decode("utf-8", "replace")
    if want:
        names = tuple(want)
        text = "\n".join(line for line in text.splitlines()
                         if line.startswith(names) or (line.startswith("# ") and any(n in line for n in names)))
    return {"port": port, "path": path, "status": int(m.group(1)) if m else None,
            "ms": round((time.monotonic() - start) * 1000.0, 1), "body": text, "truncated": truncated}
