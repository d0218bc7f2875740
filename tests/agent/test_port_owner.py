"""Who holds the layout's port when the agent cannot read the holder's descriptors (an agent not
run as root, another user's listener): the socket's uid in the kernel's table says it, and a port
held by anyone other than the run is never the run's port opening. A real listener of root's, a
real agent module run as nobody."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

from cockpit.host.state import HostState

ROOT = str(Path(__file__).resolve().parents[2])
NOBODY = 65534
PY = "/usr/bin/python3"  # the system python: this venv is root's, nobody cannot run it


def test_a_listener_whose_descriptors_cannot_be_read_is_told_by_its_sockets_uid():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        code = (
            f"import json, sys; sys.path.insert(0, {ROOT!r}); from cockpit.agent.ports import Ports; "
            f"p = Ports(); p.configure([{port}]); print(json.dumps(p.sample([])))"
        )
        res = subprocess.run(
            [PY, "-I", "-c", code],
            user=NOBODY,
            group=NOBODY,
            extra_groups=[],
            capture_output=True,
            text=True,
            cwd="/",
            timeout=60,
        )
    assert res.returncode == 0, res.stderr
    row = next(r for r in json.loads(res.stdout) if r["port"] == port)
    assert row["listening"] and row.get("holder") is None, row  # nobody reads none of root's descriptors
    assert row["holder_uid"] == 0 and row["holder_user"] == "root" and row["theirs"] is False, row
    state = HostState("t")
    state.apply({"t": "sample", "seq": 1, "ts": 1.0, "ports": [row]})
    (pt,) = state.ports
    assert pt.stranger, "another user's socket on the port is never the run's port opening"
    assert pt.held_by() == f"port {port} held by a socket of root (its process not readable), not the run"
