"""`cockpit demo` moves to a free port when its own (30000) is taken on this machine (README), its
`--port` and the watched port together; on a free port it stays."""

from __future__ import annotations

import socket
from dataclasses import replace

from conftest import free_port

from cockpit.monitor import demo
from cockpit.runs.layouts import resolve_layout


def port_flag(layout) -> int:
    flags = layout.base_flags
    return int(flags[flags.index("--port") + 1])


def test_the_demo_moves_to_a_free_port_when_30000_is_taken():
    layout = resolve_layout("demo")
    assert layout.ports[0] == port_flag(layout) == 30000
    holder = socket.socket()
    try:
        try:
            holder.bind(("127.0.0.1", 30000))
            holder.listen()
        except OSError:
            pass  # taken already, by something else of this machine: the same case
        moved = demo.with_free_port(layout)
        port = moved.ports[0]
        assert port != 30000 and port_flag(moved) == port and moved.ports[1:] == layout.ports[1:]
        assert [f for f in moved.base_flags if f != str(port)] == [f for f in layout.base_flags if f != "30000"]
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", port))  # free: nothing holds it
    finally:
        holder.close()


def test_on_a_free_port_the_demo_stays():
    layout = resolve_layout("demo")
    port = free_port()
    flags = [str(port) if f == "30000" else f for f in layout.base_flags]
    mine = replace(layout, base_flags=flags, ports=[port])
    assert demo.with_free_port(mine) is mine
