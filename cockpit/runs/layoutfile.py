"""Layout files (and the fleet file's YAML) read into typed objects.

Every error is one line naming file:line and the fix. The YAML is composed into nodes first, so
positions survive, duplicate keys are caught (PyYAML would silently keep the last) and unknown keys
get a "did you mean"."""

from __future__ import annotations

import difflib
import re
from pathlib import Path

import yaml

from cockpit import engines
from cockpit.read.logrules import PhaseRule
from cockpit.runs.config import SIM_MODELS, Layout, LayoutError, Sim, Stall

# key -> (kind, required)
_TOP = {
    "name": ("str", False),
    "engine": ("engine", False),
    "python": ("str", False),
    "trust_python": ("bool", False),
    "command": ("strlist", True),
    "base_flags": ("strlist", False),
    "flag_sets": ("flagsets", False),
    "enabled": ("strlist", False),
    "params": ("params", False),
    "env": ("env", False),
    "workdir": ("str", False),
    "log_dir": ("str", False),
    "log": ("str", False),
    "ports": ("ports", False),
    "endpoints": ("endpoints", False),
    "watch": ("strlist", False),
    "phases": ("phases", False),
    "stall": ("stall", False),
    "kill_wait_s": ("nonneg", False),
    "auto_dump": ("bool", False),
    "sim": ("sim", False),
    "metrics": ("metrics", False),
}
_EXAMPLE = engines.ENGINES[engines.DEFAULT].launchers[0]  # a server module, for the missing-command hint
_STALL = {"idle_s": "nonneg", "spin_s": "nonneg", "slow_factor": "nonneg"}
_SIM = {"gpus": "gpus", "model": "simmodel", "seed": "int", "speed": "nonneg"}


class YamlLoader:
    """Reads composed YAML nodes into values; every failure is one line naming file:line."""

    def __init__(self, path: str):
        self.path = path

    def fail(self, node: yaml.Node | None, msg: str) -> LayoutError:
        line = node.start_mark.line + 1 if node is not None else 1
        return LayoutError(f"{self.path}:{line}: {msg}")

    # -------------------------------------------------------------- scalars

    def scalar(self, node: yaml.Node, what: str):
        if not isinstance(node, yaml.ScalarNode):
            raise self.fail(node, f"{what} must be a single value, not a {self._kind(node)}")
        try:
            return yaml.constructor.SafeConstructor().construct_object(node, deep=True)
        except yaml.constructor.ConstructorError as exc:
            raise self.fail(node, f"{what}: {exc.problem}") from None

    @staticmethod
    def _kind(node: yaml.Node) -> str:
        return {yaml.MappingNode: "mapping", yaml.SequenceNode: "list"}.get(type(node), "value")

    def string(self, node, what):
        value = self.scalar(node, what)
        if isinstance(value, (dict, list)) or value is None:
            raise self.fail(node, f"{what} must be a string")
        return str(value)

    def number(self, node, what, minimum=0.0):
        value = self.scalar(node, what)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(node, f"{what} must be a number, got {node.value!r}")
        if value < minimum:
            raise self.fail(node, f"{what} must be >= {minimum:g}, got {value}")
        return float(value)

    def integer(self, node, what, lo, hi):
        value = self.scalar(node, what)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(node, f"{what} must be a whole number, got {node.value!r}")
        if not lo <= value <= hi:
            raise self.fail(node, f"{what} must be between {lo} and {hi}, got {value}")
        return value

    def boolean(self, node, what):
        value = self.scalar(node, what)
        if not isinstance(value, bool):
            raise self.fail(node, f"{what} must be true or false, got {node.value!r}")
        return value

    # -------------------------------------------------------------- collections

    def seq(self, node, what) -> list:
        if not isinstance(node, yaml.SequenceNode):
            raise self.fail(node, f"{what} must be a list (e.g. [--flag, value]), not a {self._kind(node)}")
        return node.value

    def mapping(self, node, what, known: dict | None = None) -> list[tuple[str, yaml.Node, yaml.Node]]:
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, f"{what} must be a mapping of key: value, not a {self._kind(node)}")
        seen: dict[str, yaml.Node] = {}
        out = []
        for knode, vnode in node.value:
            key = self.string(knode, f"a key in {what}")
            if key in seen:
                raise self.fail(
                    knode,
                    f"duplicate key {key!r} in {what} (first at line {seen[key].start_mark.line + 1}): "
                    f"give each a distinct name",
                )
            seen[key] = knode
            if known is not None and key not in known:
                close = difflib.get_close_matches(key, list(known), n=1)
                hint = f"did you mean {close[0]!r}?" if close else "known keys: " + ", ".join(known)
                raise self.fail(knode, f"unknown key {key!r} in {what}: {hint}")
            out.append((key, knode, vnode))
        return out

    def strlist(self, node, what) -> list[str]:
        return [self.string(n, f"each item of {what}") for n in self.seq(node, what)]

    # -------------------------------------------------------------- the layout

    def value(self, kind: str, node, what):
        if kind == "str":
            return self.string(node, what)
        if kind == "strlist":
            return self.strlist(node, what)
        if kind == "nonneg":
            return self.number(node, what)
        if kind == "int":
            return self.integer(node, what, -(2**31), 2**31)
        if kind == "gpus":
            return self.integer(node, what, 1, 64)
        if kind == "bool":
            return self.boolean(node, what)
        if kind == "engine":
            value = self.string(node, what)
            if value not in engines.ENGINES:
                raise self.fail(node, f"engine must be one of {', '.join(engines.names())}, got {value!r}")
            return value
        if kind == "simmodel":
            value = self.string(node, what)
            if value not in SIM_MODELS:
                raise self.fail(node, f"sim model must be one of {', '.join(SIM_MODELS)}, got {value!r}")
            return value
        if kind == "ports":
            return [self.integer(n, f"each port in {what}", 1, 65535) for n in self.seq(node, what)]
        if kind == "endpoints":
            out = []
            for n in self.seq(node, what):
                ep = self.string(n, f"each endpoint in {what}")
                if not ep.startswith("/"):
                    raise self.fail(n, f"endpoint {ep!r} must be a path starting with / (e.g. /health)")
                out.append(ep)
            return out
        if kind == "metrics":
            value = self.scalar(node, what)
            if value is False or value is None:
                return ""
            if not isinstance(value, str) or not value.startswith("/"):
                raise self.fail(
                    node, f"metrics must be a path starting with / (e.g. /metrics) or false, got {node.value!r}"
                )
            return value
        if kind == "flagsets":
            return {key: self.strlist(v, f"flag set {key!r}") for key, _, v in self.mapping(node, what)}
        if kind == "env":
            out = {}
            for key, knode, v in self.mapping(node, what):
                if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                    raise self.fail(knode, f"{key!r} is not a valid environment variable name")
                out[key] = self.string(v, f"env {key}")
            return out
        if kind == "params":
            out = {}
            for key, _, v in self.mapping(node, what):
                value = self.scalar(v, f"parameter {key}")
                if isinstance(value, (dict, list)):
                    raise self.fail(v, f"parameter {key} must be a single value")
                out[key] = value
            return out
        if kind == "phases":
            out = []
            for item in self.seq(node, what):
                fields = {k: v for k, _, v in self.mapping(item, "a phase", {"pattern": 0, "phase": 0})}
                if "pattern" not in fields or "phase" not in fields:
                    raise self.fail(item, "each phase needs both pattern: (a regex) and phase: (a name)")
                text = self.string(fields["pattern"], "pattern")
                try:
                    rx = re.compile(text)
                except re.error as exc:
                    raise self.fail(fields["pattern"], f"bad regex {text!r}: {exc}") from None
                out.append(PhaseRule(rx, self.string(fields["phase"], "phase")))
            return out
        if kind == "stall":
            return Stall(
                **{k: self.value(_STALL[k], v, f"stall.{k}") for k, _, v in self.mapping(node, "stall", _STALL)}
            )
        if kind == "sim":
            return Sim(**{k: self.value(_SIM[k], v, f"sim.{k}") for k, _, v in self.mapping(node, "sim", _SIM)})
        raise AssertionError(kind)

    def layout(self, root) -> Layout:
        if root is None:
            raise LayoutError(f"{self.path}:1: the layout is empty: it needs at least command: [...]")
        fields = {}
        nodes = {}
        for key, knode, vnode in self.mapping(root, "the layout", _TOP):
            fields[key] = self.value(_TOP[key][0], vnode, key)
            nodes[key] = knode
        for key, (_, required) in _TOP.items():
            if required and key not in fields:
                raise self.fail(root, f"missing {key}: add e.g. `{key}: [-m, {_EXAMPLE}]`")
        if not fields["command"]:
            raise self.fail(nodes["command"], "command is empty: name at least the module or program to run")
        for name in fields.get("enabled", []):
            if name not in fields.get("flag_sets", {}):
                raise self.fail(nodes["enabled"], f"enabled names {name!r}, which is not a flag set in flag_sets")
        fields.setdefault("name", Path(self.path).stem)
        if "metrics" not in fields:
            engine = engines.get(fields.get("engine", engines.DEFAULT))
            fields["metrics"] = engine.metrics_path if engine is not None else ""
        fields["metrics"] = fields["metrics"] or None
        fields.setdefault("flag_sets", {}).setdefault("forensics", [])  # torch's flight recorder armed (flightrec.py)
        return Layout(path=self.path, **fields)


def read_config(path: str | Path, what: str, hint: str) -> str:
    """A YAML file's text, or one line saying why it cannot be had."""
    try:
        return Path(path).read_text()
    except FileNotFoundError:
        raise LayoutError(f"{path}: no such {what} file ({hint})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise LayoutError(f"{path}: cannot read the {what}: {exc}") from None


def compose_yaml(text: str, path: str):
    """The YAML's node tree (positions kept for file:line errors), or one line naming the line."""
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 1
        opened = exc.context_mark.line + 1 if exc.context_mark else line
        what = (exc.context or "").replace("while parsing ", "").replace("while scanning ", "")
        if what in ("a flow sequence", "a flow mapping", "a quoted scalar") and opened < line:
            # a bracket or quote left open: PyYAML notices on a later line; said where it opened
            raise LayoutError(
                f"{path}:{opened}: invalid YAML: {what} opened on this line is not closed "
                f"({exc.problem} on line {line})"
            ) from None
        hint = " (check this line's indentation)" if "block" in (exc.problem or "") else ""
        raise LayoutError(f"{path}:{line}: invalid YAML: {exc.problem or exc.context}{hint}") from None
    except yaml.YAMLError as exc:
        raise LayoutError(f"{path}:1: invalid YAML: {exc}") from None
    except RecursionError:
        raise LayoutError(f"{path}:1: invalid YAML: nested too deeply") from None


def load_layout(path: str | Path) -> Layout:
    return parse_layout(read_config(path, "layout", "see layouts/ for examples"), str(path))


def parse_layout(text: str, path: str = "<layout>") -> Layout:
    root = compose_yaml(text, path)
    try:
        return YamlLoader(path).layout(root)
    except RecursionError:
        raise LayoutError(f"{path}:1: the layout is nested too deeply") from None
