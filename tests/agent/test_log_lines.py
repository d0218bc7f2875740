"""A log line is capped in the agent (LOG_LINE_MAX, 64 KiB: the head is kept, the rest is said as
` … [N bytes skipped]`), and a log that never writes a newline holds at most that much in the
agent: real files written by real processes, read by the agent's LogTail and by a real agent."""

import asyncio
import subprocess
import sys
import time

from cockpit.agent import logs as agent_logs
from cockpit.host.session import HostSession, SessionOptions, WatchList
from cockpit.link.target import parse_target

WRITER = r"""
import sys
path = sys.argv[1]
with open(path, "ab", buffering=0) as fh:
    for cmd in sys.stdin:
        cmd = cmd.strip()
        if cmd == "chunk":
            fh.write(b"x" * 65536)
        elif cmd.startswith("line "):
            fh.write(cmd[5:].encode() + b"\n")
        elif cmd == "newline":
            fh.write(b"\n")
        print("ok", flush=True)
"""


class Writer:
    """A real process appending to a real file, one command at a time."""

    def __init__(self, path):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def __call__(self, cmd: str) -> None:
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "ok"

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(10)


def test_a_log_that_never_writes_a_newline_holds_at_most_one_capped_line(tmp_path):
    path = tmp_path / "progress.log"
    path.write_bytes(b"")
    tail = agent_logs.LogTail(str(path))
    assert tail.poll() == ("opened", [])
    write = Writer(path)
    try:
        write("line before")
        assert tail.poll() == (None, ["before"])
        for _ in range(48):  # 3 MiB without a newline, read as it grows
            write("chunk")
            event, lines = tail.poll()
            assert event is None and lines == []
            assert len(tail.partial) <= agent_logs.LOG_LINE_MAX
        assert tail.partial_skipped == 47 * 65536
        write("newline")
        write("line after")
        event, lines = tail.poll()
    finally:
        write.close()
    assert lines == ["x" * 65536 + " \u2026 [%d bytes skipped]" % (47 * 65536), "after"]
    assert tail.partial == b"" and tail.partial_skipped == 0


def test_a_long_line_split_across_polls_and_one_within_a_poll_are_capped_the_same(tmp_path):
    path = tmp_path / "server.log"
    path.write_bytes(b"")
    tail = agent_logs.LogTail(str(path))
    tail.poll()
    with open(path, "ab") as fh:
        fh.write(
            b"a" * 70000 + b"\r\nshort\n" + "é".encode() * 40000 + b"\n"
        )  # 150 KB: three polls; the \r is skipped too
    lines = []
    for _ in range(5):
        lines += tail.poll()[1]
    assert lines[0] == "a" * 65536 + " \u2026 [4465 bytes skipped]"
    assert lines[1] == "short"
    assert lines[2] == "é" * 32768 + " \u2026 [14464 bytes skipped]"
    assert len(lines) == 3


def test_a_real_agent_sends_a_capped_line_and_goes_on(tmp_path, sim_state):
    path = tmp_path / "run.log"
    path.write_bytes(b"")

    async def run():
        session = HostSession(
            parse_target("local"),
            SessionOptions(python=sys.executable, interval=0.3, sim_state=str(sim_state)),
            WatchList(patterns=[], logs=[str(path)]),
        )
        await session.connect()
        write = Writer(path)
        try:
            write("line first")
            for _ in range(3):
                write("chunk")
            write("newline")
            write("line last")
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                log = session.state.logs.get(str(path))
                if log and "last" in [line.text for line in log.lines]:
                    return [line.text for line in log.lines]
                await asyncio.sleep(0.1)
            raise AssertionError(session.state.logs)
        finally:
            write.close()
            await session.close()

    lines = asyncio.run(run())
    assert lines[-3:] == ["first", "x" * 65536 + " \u2026 [131072 bytes skipped]", "last"]
