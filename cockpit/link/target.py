"""Targets as the operator types them: `local`, `demo`, an ssh alias, or `user@host[:port]`."""

from __future__ import annotations

import re
from dataclasses import dataclass

from cockpit.errors import CockpitError

_SSH = re.compile(
    r"^(?:(?P<user>[A-Za-z0-9._][A-Za-z0-9._-]*)@)?"
    r"(?P<host>[A-Za-z0-9_](?:[A-Za-z0-9._-]*[A-Za-z0-9_])?|\[[0-9A-Fa-f:.]+\])"
    r"(?::(?P<port>[0-9]+))?$"
)


@dataclass(frozen=True)
class Target:
    kind: str  # "local" | "demo" | "ssh"
    host: str = "localhost"
    user: str | None = None
    port: int | None = None
    text: str = "local"

    @property
    def label(self) -> str:
        return self.text


def parse_target(text: str) -> Target:
    text = (text or "").strip()
    if text in ("local", "localhost-agent"):
        return Target("local", text="local")
    if text == "demo":
        return Target("demo", text="demo")
    m = _SSH.match(text)
    if not m:
        raise CockpitError(
            f"malformed target {text!r}: expected local, demo, an ssh alias or user@host[:port]"
        )
    port = m.group("port")
    if port is not None and not 0 < int(port) < 65536:
        raise CockpitError(f"malformed target {text!r}: port {port} is not in 1-65535")
    host = m.group("host").strip("[]")
    return Target("ssh", host=host, user=m.group("user"), port=int(port) if port else None, text=text)
