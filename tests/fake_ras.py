"""A stand-in for NCCL's RAS service, for the agent's RAS client to meet a real socket: it speaks
the protocol of NCCL 2.28's src/ras/client_support.cc (CLIENT PROTOCOL -> SERVER PROTOCOL 2,
SET FORMAT json|text -> OK, VERBOSE STATUS -> the report, then close) and replays answers recorded
on real GPUs (tests/data/nccl-ras/, header stripped).

    python tests/fake_ras.py PORT MODE JSON_FILE TEXT_FILE

MODE: `json` (knows SET FORMAT json), `old` (an NCCL before 2.28: SET FORMAT is an unknown
command, the report is text), `silent` (accepts, reads, never answers). Prints `ready` once it
listens. Shaped like an SGLang run: this process is the launcher and starts one child, retitled
`sglang::scheduler_TP0` with setproctitle (which wipes its /proc/PID/environ, as on real ranks),
that listens and answers."""

import socket
import sys
import threading
import time


def answer_of(path):
    text = open(path).read()
    return text.split("#---\n", 1)[1] if "#---\n" in text else text


def serve(conn, mode, json_answer, text_answer):
    fmt = "text"
    buf = b""
    try:
        while True:
            data = conn.recv(4096)
            if not data:
                return
            if mode == "silent":
                continue
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                cmd = line.decode().strip().lower()
                if cmd.startswith("client protocol "):
                    conn.sendall(b"SERVER PROTOCOL 2\n")
                elif cmd.startswith("set format "):
                    if mode == "old":
                        conn.sendall(b"ERROR: Unknown command " + line.strip() + b"\n")
                    else:
                        fmt = cmd.split()[-1]
                        conn.sendall(b"OK\n")
                elif cmd in ("status", "verbose status"):
                    conn.sendall((json_answer if fmt == "json" else text_answer).encode())
                    conn.shutdown(socket.SHUT_WR)
                    return
                else:
                    conn.sendall(b"ERROR: Unknown command " + line.strip() + b"\n")
    except OSError:
        pass
    finally:
        if mode != "silent":
            conn.close()


def main():
    port, mode, json_file, text_file = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    if sys.argv[-1] != "--child":
        import subprocess

        child = subprocess.Popen([sys.executable, *sys.argv, "--child"])
        child.wait()
        return
    try:
        import setproctitle

        setproctitle.setproctitle("sglang::scheduler_TP0")
    except ImportError:
        pass
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port))
    srv.listen(16)
    print("ready", flush=True)
    held = []
    while True:
        conn, _ = srv.accept()
        held.append(conn)  # a silent server keeps every connection open
        threading.Thread(
            target=serve, args=(conn, mode, answer_of(json_file), answer_of(text_file)), daemon=True
        ).start()
        time.sleep(0)


if __name__ == "__main__":
    main()
