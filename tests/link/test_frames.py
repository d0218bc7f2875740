"""Frames of any size arrive whole, through the real local link and the real sshd: a line over the
reader's old windows (asyncssh's 2 MiB receive window, asyncio's stream limit) is no longer cut
into pieces that fail to decode in silence; a line over MAX_FRAME_BYTES is skipped whole and said
in one line, and the next frame arrives."""

import asyncio
import random
import sys

import pytest

from cockpit.host.session import HostSession, SessionOptions
from cockpit.link.base import MAX_FRAME_BYTES, FrameTooLong, LineReader
from cockpit.link.local import LocalLink
from cockpit.link.ssh import SshLink
from cockpit.link.target import parse_target


def test_line_reader_returns_whole_lines_whatever_the_chunks_and_skips_only_the_over_long_one():
    rng = random.Random(7)
    lines = [b"x" * rng.choice([0, 1, 5, 999, 1000, 3000]) + b"\n" for _ in range(300)]
    data = b"".join(lines) + b"tail-without-newline"

    async def run():
        pos = 0

        async def read(n):
            nonlocal pos
            k = min(n, rng.randint(1, 4000))
            out = data[pos : pos + k]
            pos += k
            return out

        reader = LineReader(read, limit=2000)
        got = []
        while True:
            try:
                line = await reader.readline()
            except FrameTooLong as exc:
                got.append(exc.size)
                continue
            if not line:
                return got
            got.append(line)

    expect = [len(line) if len(line) > 2000 else line for line in lines] + [b"tail-without-newline"]
    assert asyncio.run(run()) == expect


SCRIPT = r"""
import sys
out = sys.stdout.buffer
out.write(b'{"big":"' + b"a" * (5 * 1024 * 1024) + b'"}\n')
out.write(b"b" * (9 * 1024 * 1024) + b"\n")
out.write(b"after\n")
out.flush()
"""


async def _through(link, limit=8 * 1024 * 1024):
    await link.connect()
    stream = await link.start_agent([sys.executable, "-c", SCRIPT])
    stream.lines.limit = limit  # the default is 64 MiB; 8 here keeps the test light
    try:
        first = await asyncio.wait_for(stream.readline(), 60)
        with pytest.raises(FrameTooLong) as too_long:
            await asyncio.wait_for(stream.readline(), 60)
        after = await asyncio.wait_for(stream.readline(), 60)
        end = await asyncio.wait_for(stream.readline(), 60)
    finally:
        await stream.aclose()
        await link.close()
    assert len(first) == 5 * 1024 * 1024 + 11 and first.endswith(b'"}\n')
    assert too_long.value.size == 9 * 1024 * 1024 + 1 and "over the 8 MiB limit" in str(too_long.value)
    assert after == b"after\n" and end == b""


def test_a_5_mib_line_arrives_whole_and_an_over_long_one_is_said_through_the_local_link():
    asyncio.run(_through(LocalLink()))


def test_a_5_mib_line_arrives_whole_and_an_over_long_one_is_said_through_the_real_sshd(sshd):
    asyncio.run(
        _through(
            SshLink(parse_target("cockpit-test"), ssh_config=str(sshd.client_config), known_hosts=str(sshd.known_hosts))
        )
    )


def test_max_frame_is_64_mib():
    assert MAX_FRAME_BYTES == 64 * 1024 * 1024


@pytest.mark.parametrize("where", ["local", "ssh"])
def test_a_real_agents_3_mib_answer_arrives_whole(where, sshd, tmp_path, sim_state):
    """The agent's shm audit of a folder with 8,000 long-named entries is one frame of about 3 MiB:
    over asyncssh's 2 MiB window, it used to be cut in two and dropped (the command timed out)."""
    folder = tmp_path / "shm"
    folder.mkdir()
    for i in range(8000):
        (folder / (f"{i:05d}-" + "n" * 200)).touch()
    if where == "ssh":
        target = parse_target("cockpit-test")
        opts = SessionOptions(
            python=sys.executable,
            ssh_config=str(sshd.client_config),
            known_hosts=str(sshd.known_hosts),
            sim_state=str(sim_state),
        )
    else:
        target, opts = parse_target("local"), SessionOptions(python=sys.executable, sim_state=str(sim_state))

    async def run():
        session = HostSession(target, opts)
        await session.connect()
        try:
            audit = await session.request("shm_audit", timeout=60, folder=str(folder))
            await session.wait_samples(1)  # and the link goes on
            return audit, session.errors
        finally:
            await session.close()

    audit, errors = asyncio.run(run())
    assert len(audit["entries"]) == 8000 and audit["entries"][-1]["name"].startswith("07999-")
    assert errors == []
