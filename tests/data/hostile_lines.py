"""Hostile log lines, 64 KiB each (the agent's line cap), made from every pattern of the log rules
(cockpit/read/logrules.py): for each pattern (each branch of an alternation), a string that walks its
path, then (a) that string without its last character, repeated: as many failing attempts as the line
holds places to start one; (b) the string with every repeat drawn out to its bound (or 4,000 times
when unbounded) and its last character cut: one attempt that scans as far as a repeat lets it. A
pattern that backtracks over what another attempt already scanned costs seconds on one such line (a
quadratic 64 KiB is minutes); a linear one milliseconds. Also the known cases by hand.

`HOSTILE` maps a name ("NAMED_RANK/0/near-miss") to its line; `PATHS` a branch ("NAMED_RANK/0") to its
walk. Used by tests/read/test_logrules.py (every line judged; the word gates checked on every walk) and
tests/bench/explain_rate.py (the slowest line's time)."""

from __future__ import annotations

import re
import re._parser as sre  # the parser of the re module, to walk a pattern's structure

from cockpit.read import logrules

LINE = 64 << 10
UNBOUNDED = 4000
CATEGORY_CHAR = {
    "CATEGORY_DIGIT": "0",
    "CATEGORY_WORD": "a",
    "CATEGORY_SPACE": " ",
    "CATEGORY_NOT_DIGIT": "a",
    "CATEGORY_NOT_WORD": " ",
    "CATEGORY_NOT_SPACE": "a",
    "CATEGORY_LINEBREAK": "\n",
    "CATEGORY_NOT_LINEBREAK": "a",
}


def _in(items) -> str:
    negate = any(str(op) == "NEGATE" for op, _ in items)
    allowed = []
    for op, av in items:
        name = str(op)
        if name == "LITERAL":
            allowed.append(chr(av))
        elif name == "RANGE":
            allowed.append(chr(av[0]))
        elif name == "CATEGORY":
            allowed.append(CATEGORY_CHAR.get(str(av), "a"))
    if not negate:
        return allowed[0] if allowed else "a"
    banned = set()
    for op, av in items:
        if str(op) == "LITERAL":
            banned.add(chr(av))
        elif str(op) == "RANGE":
            banned.update(chr(c) for c in range(av[0], av[1] + 1))
    return next(c for c in "a0 x.-_/:" if c not in banned)


def walk(items, drawn: bool) -> str:
    """A string along the pattern's first path; `drawn`: each repeat taken to its bound."""
    out = []
    for op, av in items:
        name = str(op)
        if name == "LITERAL":
            out.append(chr(av))
        elif name == "NOT_LITERAL":
            out.append("a" if chr(av) != "a" else "b")
        elif name == "IN":
            out.append(_in(av))
        elif name == "ANY":
            out.append("a")
        elif name == "BRANCH":
            out.append(walk(av[1][0], drawn))
        elif name == "SUBPATTERN":
            out.append(walk(av[3], drawn))
        elif name == "ATOMIC_GROUP":
            out.append(walk(av, drawn))
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            lo, hi, body = av
            times = (UNBOUNDED if hi == sre.MAXREPEAT else hi) if drawn else max(lo, 1)
            out.append(walk(body, drawn) * times)
        # AT, ASSERT, ASSERT_NOT, GROUPREF...: nothing to write
    return "".join(out)


def patterns() -> dict[str, re.Pattern]:
    """Every compiled pattern of the rule set, by the name it goes by there."""
    found: dict[str, re.Pattern] = {}

    def visit(name, value, depth=0):
        if isinstance(value, re.Pattern):
            found.setdefault(name, value)
        elif isinstance(value, logrules.FailureRule):
            visit(name, value.pattern, depth)
        elif isinstance(value, (list, tuple)) and depth < 3:
            for i, v in enumerate(value):
                visit(f"{name}[{i}]", v, depth + 1)
        elif isinstance(value, dict) and depth < 3:
            for k, v in value.items():
                visit(f"{name}[{k}]", v, depth + 1)

    for name, value in vars(logrules).items():
        if not name.startswith("__"):
            visit(name, value)
    rules = logrules.LogRules("auto")
    for engine, table in rules._tables.items():
        visit(f"PHASES[{engine}]", table)
    visit("ANY_PHASE", rules._any_phase)
    for cause, rx in logrules.CAUSES:
        visit(f"CAUSES[{cause}]", re.compile(rx))
    return found


def _fill(unit: str) -> str:
    return (unit * (LINE // max(1, len(unit)) + 1))[:LINE] if unit else ""


def hostile() -> tuple[dict[str, str], dict[str, str]]:
    lines, paths = {}, {}
    for name, rx in patterns().items():
        tree = sre.parse(rx.pattern, rx.flags)
        items = list(tree)
        branches = [items]
        if len(items) == 1 and str(items[0][0]) == "BRANCH":
            branches = items[0][1][1]
        for i, branch in enumerate(branches):
            path = walk(branch, drawn=False)
            paths[f"{name}/{i}"] = path
            if len(path) > 1:
                lines[f"{name}/{i}/near-miss"] = _fill(path[:-1])
            drawn = walk(branch, drawn=True)
            if len(drawn) > len(path) + 1:
                lines[f"{name}/{i}/drawn"] = (drawn[:-1] + _fill(drawn[:-1]))[:LINE]
    by_hand = {
        "NAMED_RANK/pg": "[PG " * (LINE // 4),  # each "[PG " starts an attempt that looks for "Rank "
        "ANSI/osc": "\x1b]" * (LINE // 2),  # each OSC start looks for its BEL
        "HTTP/no-space": '"GET /' * (LINE // 6),  # each request start looks for " HTTP/"
        "BRACKET_PREFIX/tags": "[2025-04-21 04:13:43" + " TP1" * (LINE // 4),
        "WRITER_PREFIX/nested": "(VllmWorker TP1 pid=1) " * (LINE // 23),
        "traceback/frames": '  File "' + "a" * (LINE - 9),
        "cut/tail": "x Error executing metho" * (LINE // 23),
        "listed/causes": "(1) The process is killed by SIGKILL " * (LINE // 38),
    }
    lines.update({name: (line + _fill(line[-64:]))[:LINE] for name, line in by_hand.items()})
    return lines, paths


HOSTILE, PATHS = hostile()  # PATHS: each pattern branch's walked string (most match their pattern)
