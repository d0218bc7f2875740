"""The engines the cockpit knows, one module each, and the one table that names them.

An engine module (`sglang.py`, `vllm.py`, `none.py`) holds an `ENGINE` (`base.Engine`): its name,
process titles, log prefix shape and phase rules, the failures and stalls it owns, /dev/shm prefixes,
metric names and default port. Every other floor asks this table; the agent and the simulated host
keep their own copies (they travel alone), checked equal by tests/architecture/test_engines.py."""

from __future__ import annotations

from cockpit.engines import none, sglang, vllm
from cockpit.engines.base import Engine

ENGINES: dict[str, Engine] = {}


def register(engine: Engine) -> Engine:
    """Add an engine to the table (a module's `ENGINE`); its name must be new."""
    if engine.name in ENGINES or engine.name == "auto":
        raise ValueError(f"engine {engine.name!r} is already known")
    ENGINES[engine.name] = engine
    return engine


def names() -> tuple[str, ...]:
    return tuple(ENGINES)


def get(name: str | None) -> Engine | None:
    return ENGINES.get(name or "")


def logged() -> list[Engine]:
    """The engines that write a log the rules read (those with phases), in table order."""
    return [e for e in ENGINES.values() if e.phases]


def with_prefix(shape: str) -> str | None:
    """The engine whose log lines carry this prefix shape ("bracket", "writer")."""
    return next((e.name for e in ENGINES.values() if e.prefix == shape), None)


DEFAULT = sglang.ENGINE.name  # a layout that names none
for _module in (sglang, vllm, none):
    register(_module.ENGINE)
