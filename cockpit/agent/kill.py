"""Finding a run and killing it: the plan the operator confirms, carried out exactly (each pid's
start time and user re-checked before each signal, through a pidfd), then verified.
"""

import fnmatch
import os
import re
import signal
import time

from .ports import _proc_net_listeners, port_value, socket_inodes, socket_table
from .procs import (
    _CLK_TCK,
    DEFAULT_PATTERNS,
    _boot_time,
    _environ,
    _proc_stat,
    _protected,
    _read_cmdline,
    _read_proc,
    _start_ticks,
    _uid,
    _user,
    _when,
    pidfd,
)

_SIGNALS = {"TERM": 15, "KILL": 9}


TITLE_MAX = 2000  # characters of a command line in a plan: a bound on the frame, said when reached


def _shown(text):
    """A command line as a plan shows it: whole up to TITLE_MAX, else cut with how much is left
    out (never silently)."""
    return text if len(text) <= TITLE_MAX else "%s… (+%d characters)" % (text[:TITLE_MAX], len(text) - TITLE_MAX)


def _matches(patterns, name, text):
    for pat in patterns or ():
        if fnmatch.fnmatchcase(name, pat) or fnmatch.fnmatchcase(text, pat):
            return True
    return False


class _Table:
    """One read of the process table, for one decision: every process with its uid, its children,
    its command line read on demand. Walks are iterative (a chain 1,000 deep is fine)."""

    def __init__(self):
        self.rows = {}
        self.children = {}
        self._argv = {}
        for name in os.listdir("/proc"):
            if name.isdigit():
                row = _proc_stat(int(name))
                if row is not None:
                    row["uid"] = _uid(row["pid"])
                    self.rows[row["pid"]] = row
        for pid, row in self.rows.items():
            self.children.setdefault(row["ppid"], []).append(pid)

    def argv(self, pid):
        if pid not in self._argv:
            self._argv[pid] = _read_cmdline(pid)
        return self._argv[pid]

    def text(self, pid):
        return " ".join(self.argv(pid)) or self.rows[pid]["name"]

    def tree(self, roots, uid, protected):
        """The roots and their descendants that run as `uid` (a process of another user is not
        in the run, nor is what it started)."""
        found = set()
        stack = list(roots)
        while stack:
            pid = stack.pop()
            row = self.rows.get(pid)
            if pid in found or row is None or pid in protected or row["uid"] != uid:
                continue
            found.add(pid)
            stack.extend(self.children.get(pid, ()))
        return found

    def entry(self, pid):
        r = self.rows[pid]
        return {
            "pid": pid,
            "start": r["_start"],
            "started": r["started"],
            "uid": r["uid"],
            "user": _user(r["uid"]),
            "ppid": r["ppid"],
            "pgid": r["pgid"],
            "sid": r["sid"],
            "status": r["status"],
            "name": r["name"],
            "title": _shown(self.text(pid)),
        }

    def climb(self, pid, member, protected, memo=None):
        """From a process of the run up to the highest ancestor that is of the run too (same user,
        and `member` says so): a wrapper shell and its other children are not swept in. `memo`
        (pid -> root) makes climbing from every process of a 1,000-deep chain linear."""
        memo = {} if memo is None else memo
        path = []
        seen = set()
        uid = self.rows[pid]["uid"]
        root = pid
        while root not in seen:
            if root in memo:
                root = memo[root]
                break
            seen.add(root)
            path.append(root)
            parent = self.rows.get(self.rows[root]["ppid"])
            if parent is None or parent["pid"] in protected or parent["uid"] != uid or not member(parent["pid"]):
                break
            root = parent["pid"]
        for p in path:
            memo[p] = root
        return root


def _listening_inodes(ports):
    """{port: set of socket inodes} of listening TCP sockets on these ports (IPv4 and IPv6)."""
    want = set(int(p) for p in ports)
    out = {}
    for port, inode in _proc_net_listeners():
        if port in want:
            out.setdefault(port, set()).add(inode)
    return out


def _port_owners(table, ports):
    """{pid: [ports]} of the processes holding the listening sockets of these ports."""
    inodes = {}
    for port, found in _listening_inodes(ports).items():
        for inode in found:
            inodes[inode] = port
    owners = {}
    if not inodes:
        return owners
    for pid in table.rows:
        for inode in socket_inodes(pid) & set(inodes):
            owners.setdefault(pid, set()).add(inodes[inode])
    return {pid: sorted(p) for pid, p in owners.items()}


# Programs that run another program named in their arguments (a module, a script, a string):
# their command line's first words are the interpreter, its options and what it runs.
_INTERPRETER = re.compile(r"^(python|pypy|perl|ruby|node|bash|sh|dash|zsh|ksh)[0-9.]*(-dbg)?\Z")
_VALUE_OPTS = ("-X", "-W", "-o")  # options whose value is the next word (python -X, -W; shells' -o)
_SUBCOMMAND = re.compile(r"^[A-Za-z][A-Za-z0-9_.:-]*\Z")


def _words(argv):
    """The command line as words: one retitled string (setproctitle) is split at its spaces."""
    argv = list(argv or ())
    if len(argv) == 1 and " " in argv[0]:
        return argv[0].split()
    return argv


def _head(argv):
    """The program a process runs, as its command line's first words: the executable; for an
    interpreter (python, a shell ...), the interpreter, its options and the module (`-m X`) or
    script it runs. `bash -c '…'` and `python -c '…'` run a string: their head ends at `-c` (the
    string's words are what it starts, not what it is). `tmux new … python -m X`, `timeout 60
    python -m X`, `srun python -m X`: the head is tmux, timeout, srun."""
    argv = _words(argv)
    if not argv:
        return []
    if not _INTERPRETER.match(argv[0].rsplit("/", 1)[-1]):
        return argv[:1]
    i = 1
    while i < len(argv):
        a = argv[i]
        if a == "--":
            return argv[: i + 2]
        if a.startswith("-") and not a.startswith("--") and len(a) > 1:
            if a[:2] in ("-X", "-W") and len(a) > 2:  # -Xdev, -Werror: the value attached
                i += 1
                continue
            if a[-1] == "m":  # -m MODULE (or -um MODULE)
                return argv[: i + 2]
            if "c" in a[1:]:  # -c STRING (or bash -lc STRING)
                return argv[: i + 1]
            i += 2 if a in _VALUE_OPTS else 1
            continue
        if a.startswith("--"):
            i += 1
            continue
        return argv[: i + 1]  # the script
    return argv


def _program_text(argv):
    """The head and the subcommands after it (`vllm serve`: plain words, at most two): what a
    title pattern is matched against to say a process IS a server, not one that mentions it."""
    words = _words(argv)
    head = _head(words)
    more = []
    for w in words[len(head) : len(head) + 2]:
        if not _SUBCOMMAND.match(w):
            break
        more.append(w)
    return " ".join(head + more)


def _is_titled(patterns, name, argv):
    """The process is one of the patterns' servers: its name (its title) or its program (`_head`)
    matches; a command line that only carries a server's command among other arguments (a tmux
    server, `bash -c "… & …"`) does not."""
    text = _program_text(argv)
    for pat in patterns or ():
        if fnmatch.fnmatchcase(name, pat) or (text and fnmatch.fnmatchcase(text, pat)):
            return True
    return False


def command_matches(argv, command, model=None, ports=(), default_port=None):
    """The process runs the layout's command: the command (by base name, in order, contiguous)
    starts within the process's program (`_head`: the executable, or an interpreter's module or
    script), so a process that only mentions it among its arguments (`tmux new … python -m X`,
    `timeout 60 python -m X`) is not it. Its model path is there too; and its port, `--port` or,
    without one, the engine's default (`default_port`: SGLang 30000, vLLM 8000), is one of the
    layout's `ports` when the layout names some."""
    if not command or not argv:
        return False
    words = _words(argv)
    names = [a.rsplit("/", 1)[-1] for a in words]
    want = [c.rsplit("/", 1)[-1] for c in command]
    n = len(want)
    head = len(_head(words))
    if not any(names[i : i + n] == want for i in range(min(head, len(names) - n + 1))):
        return False
    if model and model not in words and not any(a.endswith("=" + model) for a in words):
        return False
    port = port_value(words)
    if port is None:
        port = default_port
    if ports and port is not None and int(port) not in set(int(p) for p in ports):
        return False
    return True


def _netns(pid):
    try:
        return os.stat("/proc/%d/ns/net" % pid).st_ino
    except OSError:
        return None


def _listens(pid):
    """The TCP ports this process listens on, in its own network namespace."""
    mine = socket_inodes(pid)
    if not mine:
        return set()
    return set(port for port, inode in _proc_net_listeners("/proc/%d/net" % pid) if inode in mine)


def _now_ticks():
    """Clock ticks since boot now: comparable with a process's start time."""
    try:
        with open("/proc/uptime") as fh:
            return int(float(fh.read().split()[0]) * _CLK_TCK)
    except (OSError, ValueError, IndexError):
        return None


LAUNCH_MARKER = "GPU_COCKPIT_RUN"  # set by the cockpit in the environment of every run it launches


def _has_marker(pid, run_id):
    """The process carries the launch marker of this run (GPU_COCKPIT_RUN=<run id>) in its own
    environment (setproctitle wipes a retitled rank's: then it does not)."""
    return bool(run_id) and _environ(pid).get(LAUNCH_MARKER) == str(run_id)


def _candidate(table, root, rule, protected, extra=()):
    row = table.rows[root]
    uid = row["uid"]
    members = table.tree([root] + list(extra), uid, protected)
    return {
        "rule": rule,
        "root": root,
        "root_start": row["_start"],
        "uid": uid,
        "user": _user(uid),
        "started": row["started"],
        "title": _shown(table.text(root)),
        "sessions": [],
        "members": [table.entry(p) for p in sorted(members)],
    }


def _launched_run(table, rec, known, patterns, command, protected, notes, seen=None):
    """The run this cockpit launched, from its record: process group P whose leader started at S.
    The leader alive with another start time is a reused pid: not the run. The leader alive and
    the recorded one: it and the members of its group and session started since S. The leader
    gone: the pid P may have been reused (a new process given pid P can call setsid() once every
    process of the old session is gone), so the processes now in group/session P are the run only
    if one of them provably belongs to it: it started while the leader was last seen alive (the
    agent's own watch, or `seen_ticks` in the record: a process born then into session P was born
    into the run's session, and while it lives pid P cannot be reused), or it carries the run's
    launch marker (GPU_COCKPIT_RUN=<run id>). Then: the survivors of its session that carry the
    run's titles, command or marker, and its user."""
    try:
        pgid = int(rec["pgid"])
    except (KeyError, TypeError, ValueError):
        return None
    start = rec.get("start")
    if start is None and known:
        start = known.get(pgid)
    if start is None:
        notes.append(
            "process group %d: its leader's start time was not recorded, so it is not trusted as the run" % pgid
        )
        return None
    boot = rec.get("boot")
    if boot is not None and abs(float(boot) - _boot_time()) > 2:
        notes.append("process group %d was recorded before the host rebooted: not the run" % pgid)
        return None
    start = int(start)
    leader = table.rows.get(pgid)
    if leader is not None and leader["_start"] != start:
        notes.append(
            "pid %d is now another process (started %s): the run recorded as process group %d has ended"
            % (pgid, _when(leader["started"]), pgid)
        )
        return None
    if leader is not None:
        uid = leader["uid"]
        extra = [
            p
            for p, r in table.rows.items()
            if (r["pgid"] == pgid or r["sid"] == pgid) and r["uid"] == uid and r["_start"] >= start
        ]
        cand = _candidate(
            table,
            pgid,
            "launched by this cockpit (ledger): process group %d, leader started %s" % (pgid, _when(leader["started"])),
            protected,
            extra,
        )
        cand["sessions"] = [pgid]
        cand["leader_seen_ticks"] = _now_ticks()
        return cand
    uid = rec.get("uid")
    run_id = rec.get("run_id")
    members = [
        p
        for p, r in table.rows.items()
        if (r["pgid"] == pgid or r["sid"] == pgid)
        and p not in protected
        and r["status"] != "Z"
        and (uid is None or r["uid"] == int(uid))
    ]
    if not members:
        return None
    marks = [int(t) for t in (rec.get("seen_ticks"), (seen or {}).get(pgid)) if t is not None]
    last_seen = max(marks) if marks else None
    proof = [
        p
        for p in members
        if table.rows[p]["_start"] >= start
        and ((last_seen is not None and table.rows[p]["_start"] <= last_seen) or _has_marker(p, run_id))
    ]
    if not proof:
        notes.append(
            "process group %d: its leader is gone and none of the %d processes now in it was started while "
            "the run's leader was seen alive or carries the run's launch marker (%s): pid %d may have been "
            "reused, so they are not the run (name one with --pid to act on it anyway)"
            % (pgid, len(members), LAUNCH_MARKER, pgid)
        )
        return None
    pats = list(DEFAULT_PATTERNS) + list(patterns or [])
    survivors = [
        p
        for p in members
        if table.rows[p]["_start"] >= start
        and (
            p in proof
            or _is_titled(pats, table.rows[p]["name"], table.argv(p))
            or command_matches(table.argv(p), command)
        )
    ]
    tops = [p for p in survivors if table.rows[p]["ppid"] not in survivors]
    root = min(tops)
    cand = _candidate(
        table,
        root,
        "launched by this cockpit (ledger): process group %d, its leader gone, %d "
        "processes of it left" % (pgid, len(survivors)),
        protected,
        survivors,
    )
    cand["uid"] = table.rows[root]["uid"]
    cand["sessions"] = [pgid]
    return cand


def _group(table, found, member, rule_of, protected):
    """Candidate runs from processes found by one rule: each climbs to its run's root; a root
    inside another's tree is part of that run. Distinct roots are distinct runs, never merged."""
    memo = {}
    roots = sorted(
        set(table.climb(p, member, protected, memo) for p in found if p in table.rows and p not in protected)
    )
    trees = {r: table.tree([r], table.rows[r]["uid"], protected) for r in roots}
    inside = set()
    for r in roots:
        inside |= trees[r] - {r}
    keep = [r for r in roots if r not in inside]
    return [_candidate(table, r, rule_of(r, trees[r]), protected) for r in keep]


def _off_port(table, cand, ports, notes):
    """Why a run found by its command is not on the layout's ports (None: nothing says so): it
    runs in another network namespace (its port N is not this host's port N), or it listens on
    TCP ports none of which is the layout's while its command line names no port."""
    root = cand["root"]
    mine = _netns(os.getpid())
    theirs = _netns(root)
    want = set(int(p) for p in ports)
    if mine is not None and theirs is not None and mine != theirs:
        return (
            "pid %d (%s) runs the layout's command in another network namespace: its port is not this "
            "host's port %s" % (root, cand["user"], ", ".join(map(str, sorted(want))))
        )
    if port_value(_words(table.argv(root))) is None:
        held = set()
        for e in cand["members"]:
            held |= _listens(e["pid"])
        if held and not held & want:
            return "pid %d (%s) runs the layout's command but listens on port %s, not on %s" % (
                root,
                cand["user"],
                ", ".join(map(str, sorted(held))),
                ", ".join(map(str, sorted(want))),
            )
    return None


def find_runs(
    launched=(), ports=(), command=(), model=None, patterns=None, known=None, table=None, default_port=None, seen=None
):
    """The run, in this order: the one this cockpit launched (process group and its leader's start
    time, both checked; its leader gone, a survivor proven to be of it); else the tree of the
    process that owns the layout's ports; else of the processes whose program is the layout's
    command, with its model, on its port (`--port`, else the engine's `default_port`), in this
    host's network namespace. Without any hint (no launched run, no ports, no command: no layout):
    processes whose title or program matches the patterns. Title patterns never find a run
    host-wide when a layout says what the run is. A run's root is climbed to only through parents
    that are themselves the server (never a shell, a multiplexer or a wrapper that mentions it).
    Processes of another user than the agent's are never a run: they are listed under `foreign`.
    More than one run found: all are returned, never merged."""
    table = table or _Table()
    protected = _protected()
    me = os.geteuid()
    notes, foreign = [], []
    ports = [int(p) for p in ports or ()]
    command = list(command or ())
    pats = list(DEFAULT_PATTERNS if patterns is None else patterns)

    def finish(runs, how):
        mine = []
        for c in runs:
            if c["uid"] != me:
                foreign.append(
                    {
                        "root": c["root"],
                        "uid": c["uid"],
                        "user": c["user"],
                        "title": c["title"],
                        "rule": c["rule"],
                        "why": "runs as %s, not as %s: another user's processes are "
                        "never in a run (name it with --pid to act on it anyway)" % (c["user"], _user(me)),
                    }
                )
            else:
                mine.append(c)
        return {"runs": mine, "rule": how, "notes": notes, "foreign": foreign}

    runs = [
        c
        for c in (_launched_run(table, rec, known, pats, command, protected, notes, seen) for rec in launched or ())
        if c is not None
    ]
    if runs:
        return finish(runs, "ledger")

    def serves(pid):
        return command_matches(table.argv(pid), command, model, ports, default_port)

    if ports:
        owners = _port_owners(table, ports)
        if owners:

            def member(pid):
                return pid in owners or serves(pid)

            def rule(root, tree):
                held = sorted(set(p for pid in tree if pid in owners for p in owners[pid]))
                return "owns port %s" % ", ".join(map(str, held))

            return finish(_group(table, list(owners), member, rule, protected), "ports")
        notes.append("no process listens on port %s" % ", ".join(map(str, ports)))
    if command:
        found = [p for p in table.rows if p not in protected and serves(p)]
        if found:
            what = " ".join(command) + (" with " + model if model else "")
            runs = _group(table, found, serves, lambda r, t: "command matches: " + what, protected)
            if ports:
                kept = []
                for c in runs:
                    why = _off_port(table, c, ports, notes)
                    if why is None:
                        kept.append(c)
                    else:
                        notes.append(why + ": not the run")
                runs = kept
            if runs or not ports:
                return finish(runs, "command")
        else:
            notes.append(
                "no process runs %s%s"
                % (" ".join(command), " on port %s" % ", ".join(map(str, ports)) if ports else "")
            )
    if launched or ports or command:
        return finish([], "none")  # told what the run is: titles never find one host-wide
    found = [p for p, r in table.rows.items() if p not in protected and _is_titled(pats, r["name"], table.argv(p))]

    def member(pid):
        return _is_titled(pats, table.rows[pid]["name"], table.argv(pid))

    def rule(root, tree):
        r = table.rows[root]
        text = _program_text(table.argv(root))
        pat = next((p for p in pats if fnmatch.fnmatchcase(r["name"], p) or fnmatch.fnmatchcase(text, p)), "?")
        return "title matches %s (no layout: name one with --layout to find the run by its ports and command)" % pat

    return finish(_group(table, found, member, rule, protected), "titles")


_RANK_TITLE = re.compile(r"^(sglang::|VLLM::|VllmWorker)")  # an engine's rank, never a server's root
SERVERS_MAX = 64  # server trees listed at most: a bound on the frame, said when reached
MEMBERS_MAX = 256  # processes of one tree listed at most


def _flag_text(argv, names):
    """The value of the first of these flags (`--model-path X` or `--model-path=X`); None."""
    for i, a in enumerate(argv):
        name, eq, value = a.partition("=")
        if name in names:
            return value if eq else (argv[i + 1] if i + 1 < len(argv) else None)
    return None


def host_servers(patterns=None, table=None, sim_state=None):
    """Every server on the host, any user's, each its own tree (the title rule of find_runs: a
    process whose title or program is a server's, climbed to its root through parents that are
    servers too, never through a shell or a multiplexer): its root, user, start, command line,
    model and TP size as its command line names them, its processes, and the TCP ports they
    listen on. A listener whose process's descriptors cannot be read (another user's, for an
    agent not run as root) is told by the socket's uid in the kernel's table: a port of that
    user's, given to its one tree of that user. What the operator sees as the host's runs and a
    run's neighbours; nothing of it is judged here. `sim_state`: the agent watches a simulated
    host (that folder), whose servers are those started into it (COCKPIT_SIM_STATE in their
    environment); this machine's other servers are none of its."""
    table = table or _Table()
    protected = _protected()
    pats = list(patterns) if patterns else list(DEFAULT_PATTERNS)
    found = [p for p, r in table.rows.items() if p not in protected and _is_titled(pats, r["name"], table.argv(p))]
    if sim_state:
        found = [p for p in found if _environ(p).get("COCKPIT_SIM_STATE") == sim_state]

    def member(pid):
        return _is_titled(pats, table.rows[pid]["name"], table.argv(pid))

    runs = _group(table, found, member, lambda r, t: "title", protected)
    # a rank's title (`VLLM::Worker_TP0`) with a parent of its user that is no server by title (a
    # server whose program the patterns do not name): the parent spawned the ranks, it is the root
    parents = {}
    for c in runs:
        row = table.rows[c["root"]]
        parent = table.rows.get(row["ppid"])
        if (
            _RANK_TITLE.match(row["name"])
            and parent is not None
            and parent["pid"] > 1
            and parent["pid"] not in protected
            and parent["uid"] == row["uid"]
        ):
            parents.setdefault(parent["pid"], []).append(c["root"])
    if parents:
        lifted = set(p for kids in parents.values() for p in kids)
        runs = [c for c in runs if c["root"] not in lifted] + [
            _candidate(table, p, "title", protected) for p in sorted(parents)
        ]
        inside = set()
        for c in runs:
            inside |= set(e["pid"] for e in c["members"]) - {c["root"]}
        runs = sorted((c for c in runs if c["root"] not in inside), key=lambda c: c["root"])
    listening = socket_table()
    by_inode = dict((inode, (port, uid)) for port, (inode, uid) in listening.items())
    out, held = [], set()
    for c in runs[:SERVERS_MAX]:
        pids = [e["pid"] for e in c["members"]]
        ports = set()
        for pid in pids:
            for inode in socket_inodes(pid):
                if inode in by_inode:
                    ports.add(by_inode[inode][0])
        held |= ports
        argv = _words(table.argv(c["root"]))
        tp = _flag_text(argv, ("--tp-size", "--tp", "--tensor-parallel-size", "-tp"))
        model = _flag_text(argv, ("--model-path", "--model"))
        if model is None and "serve" in argv[:4]:
            after = argv[argv.index("serve") + 1 :]
            model = after[0] if after and not after[0].startswith("-") else None
        out.append(
            {
                "root": c["root"],
                "root_start": c["root_start"],
                "uid": c["uid"],
                "user": c["user"],
                "started": c["started"],
                "title": c["title"],
                "ports": sorted(ports),
                "port_named": port_value(argv),
                "model": model,
                "tp_size": int(tp) if tp and tp.isdigit() else None,
                "members": [
                    {"pid": e["pid"], "name": e["name"], "title": e["title"][:200], "status": e["status"]}
                    for e in c["members"][:MEMBERS_MAX]
                ],
            }
        )
    for s in out:  # descriptors not readable: the socket's uid names its user, the port its command line
        if not s["ports"] and s["port_named"] is not None and s["port_named"] not in held:
            got = listening.get(s["port_named"])
            if got is not None and got[1] == s["uid"]:
                s["ports"] = [s["port_named"]]
                s["ports_by"] = "socket uid"
    return {"servers": out, "more": max(0, len(runs) - SERVERS_MAX)}


def _summary(c):
    out = {k: c[k] for k in ("rule", "root", "root_start", "uid", "user", "started", "title")}
    out["processes"] = len(c["members"])
    return out


def run_plan(
    pids=(),
    launched=(),
    ports=(),
    command=(),
    model=None,
    patterns=None,
    known=None,
    default_port=None,
    seen=None,
    starts=None,
):
    """What a kill will signal, for the operator to confirm: every pid with its start time, user
    and command, and the rule that found the run. Two runs found: no plan, both listed.
    `planned_at` (clock ticks since boot, read before the process table): a process of the run
    started since then was not in the plan, and the kill says so."""
    planned_at = _now_ticks()
    table = _Table()
    if pids:
        protected = _protected()
        entries, rules = [], []
        for pid in pids:
            pid = int(pid)
            if pid in protected:
                rules.append("pid %d is the agent, one of its ancestors or init: never signalled" % pid)
                continue
            row = table.rows.get(pid)
            if row is None:
                continue
            seen_start = (starts or {}).get(str(pid))
            if seen_start is not None and row["_start"] != int(seen_start):
                rules.append(
                    "pid %d is another process than the one followed (it started at tick %s, that one at %s: "
                    "its pid was reused): left alone" % (pid, row["_start"], seen_start)
                )
                continue
            for p in sorted(table.tree([pid], row["uid"], protected)):
                if all(e["pid"] != p for e in entries):
                    entries.append(table.entry(p))
            rules.append("pid %d (%s) and what it started" % (pid, _user(row["uid"])))
        return {
            "plan": entries,
            "rule": "; ".join(rules) or "no such process",
            "candidates": [],
            "notes": [],
            "foreign": [],
            "sessions": [],
            "root": int(pids[0]) if len(pids) == 1 else None,
            "planned_at": planned_at,
        }
    found = find_runs(launched, ports, command, model, patterns, known, table, default_port, seen)
    runs = found["runs"]
    out = {
        "plan": [],
        "rule": None,
        "candidates": [_summary(c) for c in runs],
        "notes": found["notes"],
        "foreign": found["foreign"],
        "sessions": [],
        "root": None,
        "planned_at": planned_at,
    }
    if len(runs) == 1:
        run = runs[0]
        out.update(
            plan=run["members"],
            rule=run["rule"],
            sessions=run["sessions"],
            root=run["root"],
            uid=run["uid"],
            user=run["user"],
        )
    return out


def kill_plan(pgids=(), sids=(), pids=()):
    """The plan for processes named by pid (and what they started), as a list. Process groups
    alone are not trusted (a pid may have been reused): see run_plan's `launched`."""
    return run_plan(pids=list(pids))["plan"] if pids else []


def _still(entry, protected):
    """None while the pid is still the planned process (same start time, same user, not exited),
    else why not: 'gone', 'exited', or a reason to skip it."""
    pid = entry["pid"]
    if pid in protected or pid <= 1:
        return "the agent, one of its ancestors or init: never signalled"
    row = _proc_stat(pid)
    if row is None:
        return "gone"
    if row["_start"] != entry["start"]:
        return "pid reused: now a process started %s, not the planned one (started %s): not signalled" % (
            _when(row["started"]),
            _when(entry.get("started")),
        )
    if entry.get("uid") is not None:
        uid = _uid(pid)
        if uid is not None and uid != entry["uid"]:
            return "now runs as %s, not %s as planned: not signalled" % (_user(uid), _user(entry["uid"]))
    if row["status"] == "Z":
        return "exited"
    return None


def _os_send(fd, pid, sig):
    if fd is not None and hasattr(signal, "pidfd_send_signal"):
        signal.pidfd_send_signal(fd, sig)
    else:
        os.kill(pid, sig)


def _signal_all(entries, sig, protected):
    """Signals each planned process only if it is still that process when the signal goes: a
    pidfd is opened on the pid first, then its start time and user are checked, then the signal
    goes through that pidfd, so a pid that dies and is reused in between gets nothing. All are
    checked first and signalled in one quick pass (a launcher that ends its own workers on
    SIGTERM does not race the rest of the pass). Returns (signalled pids, [(entry, why not)])."""
    sent, missed, ready = [], [], []
    for entry in entries:
        fd = pidfd(entry["pid"])
        why = _still(entry, protected)
        if why is not None:
            if fd is not None:
                os.close(fd)
            missed.append((entry, why))
        elif fd is None:  # no pidfd here (Python < 3.9, Linux < 5.3): checked, then signalled at once
            try:
                os.kill(entry["pid"], sig)
                sent.append(entry["pid"])
            except ProcessLookupError:
                missed.append((entry, "gone"))
            except OSError as exc:
                missed.append((entry, exc.strerror or str(exc)))
        else:
            ready.append((entry, fd))
    for entry, fd in ready:
        try:
            _os_send(fd, entry["pid"], sig)
            sent.append(entry["pid"])
        except ProcessLookupError:
            missed.append((entry, "gone"))
        except OSError as exc:
            missed.append((entry, exc.strerror or str(exc)))
        finally:
            os.close(fd)
    return sent, missed


def _children(pid):
    """The pids of a process's children now (empty where the kernel does not say)."""
    out = []
    try:
        for tid in os.listdir("/proc/%d/task" % pid):
            data = _read_proc("/proc/%d/task/%s/children" % (pid, tid))
            out += [int(x) for x in (data or b"").split()]
    except (OSError, ValueError):
        pass
    return out


def _led_groups(plan):
    """(process groups, sessions) led by a planned process: a process born into one of them since
    the plan was started by the run (the pid of a group's or a session's leader is not reused while
    any process is still in it)."""
    pgids, sids = set(), set()
    for e in plan:
        pgid, sid = e.get("pgid"), e.get("sid")
        if pgid is None or sid is None:
            row = _proc_stat(e["pid"])
            if row is not None and row["_start"] == e["start"]:
                pgid, sid = row["pgid"], row["sid"]
        if pgid == e["pid"]:
            pgids.add(pgid)
        if sid == e["pid"]:
            sids.add(sid)
    return pgids, sids


def _newcomers(plan, sessions, protected, since=None, groups=((), ()), seen_children=()):
    """Processes of the run that the plan does not name: children of planned processes (still the
    planned ones, or seen as their children during the kill), and processes started since the plan
    (`since`, clock ticks) in the launched run's session or in a process group or session that a
    planned process leads: a child a planned process spawned while it was being killed (its SIGTERM
    handler) and that was reparented when its parent exited is still found."""
    planned = {e["pid"]: e for e in plan}
    table = _Table()
    live = set(p for p, e in planned.items() if p in table.rows and table.rows[p]["_start"] == e["start"])
    uids = set(e.get("uid") for e in plan)
    out = {}
    stack = [k for p in live for k in table.children.get(p, ())]
    stack += [pid for pid, start in seen_children if pid in table.rows and table.rows[pid]["_start"] == start]
    seen = set()
    while stack:
        pid = stack.pop()
        if pid in seen or pid in protected:
            continue
        seen.add(pid)
        row = table.rows.get(pid)
        if row is None:
            continue
        if pid not in planned and row["uid"] in uids and row["status"] != "Z":
            out[pid] = table.entry(pid)
        stack.extend(table.children.get(pid, ()))
    pgids, sids = groups
    for pid, row in table.rows.items():
        if pid in planned or pid in protected or row["uid"] not in uids or row["status"] == "Z":
            continue
        if row["sid"] in sessions or (
            since is not None and row["_start"] >= since and (row["pgid"] in pgids or row["sid"] in sids)
        ):
            out[pid] = table.entry(pid)
            for kid in table.tree([pid], row["uid"], protected):
                if kid not in planned and table.rows[kid]["status"] != "Z":
                    out[kid] = table.entry(kid)
    return out


def kill_run(plan, wait_s=10.0, sessions=(), since=None, **_old):
    """Carries out exactly the plan: SIGTERM to each planned process that is still the planned one
    (its start time and user checked before the signal), a wait, then SIGKILL to those still there,
    checked again. A pid that no longer matches is skipped and reported. Processes that appeared
    since the plan (`since`: the plan's `planned_at`; else this call's start) are reported, not
    signalled (they were not confirmed), and count as remaining: children of planned processes,
    members of the launched run's session, and processes born into a group or session a planned
    process leads (a child spawned by a SIGTERM handler, reparented when its parent exits). Never
    signals the agent, its ancestors or init."""
    protected = _protected()
    sessions = set(int(s) for s in sessions or ())
    if since is None:
        since = _now_ticks()
    groups = _led_groups(plan)
    term, killed, vanished, skipped = [], [], [], []
    newcomers = _newcomers(plan, sessions, protected, since, groups)
    kids = {}  # (pid, start) of children of planned processes seen during the kill

    def watch_children(entries):
        planned = set(e["pid"] for e in plan)
        for e in entries:
            for kid in _children(e["pid"]):
                if kid not in planned and kid not in kids:
                    start = _start_ticks(kid)
                    if start is not None:
                        kids[kid] = start

    def note(missed, gone_list):
        for entry, why in missed:
            if why in ("gone", "exited"):
                if gone_list is not None:
                    gone_list.append(entry["pid"])
            elif all(s["pid"] != entry["pid"] for s in skipped):
                skipped.append({"pid": entry["pid"], "why": why, "title": entry.get("title", "")})

    term, missed = _signal_all(plan, _SIGNALS["TERM"], protected)
    note(missed, vanished)
    deadline = time.monotonic() + max(0.0, float(wait_s))
    pending = [e for e in plan if e["pid"] in term]
    while time.monotonic() < deadline:
        watch_children(pending)
        still = []
        for e in pending:
            why = _still(e, protected)
            if why is None:
                still.append(e)
            else:
                note([(e, why)], None)
        pending = still
        if not pending:
            break
        time.sleep(0.1)
    watch_children(pending)
    killed, missed = _signal_all(pending, _SIGNALS["KILL"], protected)
    note(missed, None)
    time.sleep(0.3)
    newcomers.update(_newcomers(plan, sessions, protected, since, groups, sorted(kids.items())))
    remaining = [e["pid"] for e in plan if _still(e, protected) is None]
    late = []
    for pid, e in sorted(newcomers.items()):
        if _still(e, protected) is None:
            late.append(
                {
                    "pid": pid,
                    "title": e["title"],
                    "user": e["user"],
                    "started": e["started"],
                    "why": "appeared after the plan: not signalled",
                }
            )
            remaining.append(pid)
    return {
        "term": term,
        "killed": killed,
        "vanished": vanished,
        "skipped": skipped,
        "newcomers": late,
        "remaining": remaining,
    }
