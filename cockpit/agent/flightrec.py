"""torch's flight recorder: pokes each rank's dump pipe and reads dumps as plain containers only."""

import json
import os
import re
import time

from .nofollow import open_nofollow
from .procs import _environ, _proc_stat, _uid, _user
from .shm import _fd_ids

FR_MAX_BYTES = 64 << 20
FR_KEEP_ENTRIES = 400  # per rank, the newest: what a comparison needs
FR_FIELDS = (
    "record_id",
    "pg_id",
    "process_group",
    "collective_seq_id",
    "p2p_seq_id",
    "op_id",
    "profiling_name",
    "state",
    "time_created_ns",
    "time_discovered_started_ns",
    "time_discovered_completed_ns",
    "is_p2p",
    "retired",
    "timeout_ms",
    "input_sizes",
    "duration_ms",
)
FR_BUFFER_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
FR_FILE_VARS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
FR_PIPE_VAR = "TORCH_NCCL_DEBUG_INFO_PIPE_FILE"


def _plain_list(*args):
    return list(args[0]) if args else []


def _tagged(value, *_):
    return value


def fr_unpickler():
    """A pickle reader that builds plain containers only: dicts, lists, tuples, strings, numbers,
    booleans and None. The only globals it accepts are torch's list builders and type tags (mapped
    to plain lists and the identity), so a hostile file cannot run code."""
    import io
    import pickle

    allowed = {
        ("torch.jit._pickle", "build_intlist"): _plain_list,
        ("torch.jit._pickle", "build_doublelist"): _plain_list,
        ("torch.jit._pickle", "build_boollist"): _plain_list,
        ("torch.jit._pickle", "build_list"): _plain_list,
        ("torch.jit._pickle", "restore_type_tag"): _tagged,
    }

    class Plain(pickle.Unpickler):
        def find_class(self, module, name):
            fn = allowed.get((module, name))
            if fn is None:
                raise pickle.UnpicklingError("refused %s.%s: only plain containers are read" % (module[:60], name[:60]))
            return fn

        def persistent_load(self, pid):
            raise pickle.UnpicklingError("refused a persistent id: only plain containers are read")

    return lambda data: Plain(io.BytesIO(data)).load()


def read_fr_dump(data):
    """A flight-recorder dump (torch's pickle, or its JSON) as plain data: raises ValueError."""
    import pickle

    if data[:1] in (b"{", b"["):
        doc = json.loads(data.decode("utf-8", "replace"))
    else:
        try:
            doc = fr_unpickler()(data)
        except (
            pickle.UnpicklingError,
            EOFError,
            ValueError,
            TypeError,
            AttributeError,
            IndexError,
            KeyError,
            MemoryError,
            RecursionError,
            UnicodeDecodeError,
        ) as exc:
            raise ValueError(
                "not a readable flight-recorder dump: %s" % (str(exc)[:160] or type(exc).__name__)
            ) from None
    if not isinstance(doc, dict):
        raise ValueError("not a flight-recorder dump: a %s, not a dict" % type(doc).__name__)
    return doc


def _plainify(value, depth=0):
    """JSON-safe: tuples to lists, keys to strings, bytes to text."""
    if depth > 20:
        return None
    if isinstance(value, dict):
        return {str(k)[:200]: _plainify(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plainify(v, depth + 1) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, float) and value != value:
        return None
    return value


def slim_fr_dump(doc):
    """What the cockpit compares, without stack frames: version, pg_status, pg_config and the
    newest FR_KEEP_ENTRIES entries with their identifying fields."""
    entries = doc.get("entries") if isinstance(doc.get("entries"), list) else []
    keep = [{k: e.get(k) for k in FR_FIELDS if k in e} for e in entries[-FR_KEEP_ENTRIES:] if isinstance(e, dict)]
    return _plainify(
        {
            "version": doc.get("version"),
            "pg_status": doc.get("pg_status"),
            "pg_config": doc.get("pg_config"),
            "comm_lib_version": doc.get("comm_lib_version") or doc.get("nccl_version"),
            "entries": keep,
            "entries_total": len(entries),
        }
    )


def _proc_path(pid, path):
    """A path from a process's environment as seen from here: relative to its working folder."""
    if path.startswith("/"):
        return path
    try:
        return os.path.join(os.readlink("/proc/%d/cwd" % pid), path)
    except OSError:
        return None


def open_regular(path, uids=None, limit=None):
    """A file the agent reads for a run (a log, a dump, package metadata), opened so that its owner
    cannot turn the open against root: no symlink followed in any component (open_nofollow), never
    blocked on a FIFO
    (O_NONBLOCK), then checked on the descriptor: a regular file, owned by one of `uids` (an int
    or a set; None: any), at most `limit` bytes, no second hard link unless it is the agent's
    own user's. Returns the descriptor; OSError says why it was refused."""
    import errno
    import stat

    try:
        fd = open_nofollow(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(exc.strerror) from None
        raise
    try:
        st = os.fstat(fd)
        owners = {uids} if isinstance(uids, int) else uids
        if not stat.S_ISREG(st.st_mode):
            raise OSError("not a regular file: not read")
        if owners is not None and st.st_uid not in owners:
            raise OSError(
                "owned by %s, not by the run's user (%s): not read"
                % (_user(st.st_uid), ", ".join(sorted(_user(u) for u in owners)))
            )
        if st.st_nlink > 1 and st.st_uid != os.geteuid():
            raise OSError("has other hard links: not read")
        if limit is not None and st.st_size > limit:
            raise OSError("%d bytes, more than the %d read" % (st.st_size, limit))
        os.set_blocking(fd, True)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _read_regular(path, limit, uid=None):
    """A regular file's bytes (open_regular's rules), at most `limit`; with `uid` (an int or a
    set), only a file one of them owns."""
    fd = open_regular(path, uid, limit)
    try:
        st = os.fstat(fd)
        chunks, n = [], 0
        while n < limit:
            chunk = os.read(fd, min(1 << 20, limit - n))
            if not chunk:
                break
            chunks.append(chunk)
            n += len(chunk)
        return b"".join(chunks), st.st_mtime
    finally:
        os.close(fd)


def _poke_fifo(path, uid, held, pid):
    """One byte into the FIFO a rank reads: a FIFO itself (lstat: never a symlink, never a
    regular file), owned by the rank's user, and held open by the rank (its (device, inode) among
    the rank's open descriptors: torch's DumpPipe keeps it open for reading). Checked again on the
    descriptor it is written through."""
    import stat

    st = os.lstat(path)
    if not stat.S_ISFIFO(st.st_mode):
        raise OSError("not a FIFO")
    if st.st_uid != uid:
        raise OSError("owned by %s, not by the rank's user (%s): not written" % (_user(st.st_uid), _user(uid)))
    if (st.st_dev, st.st_ino) not in held:
        raise OSError("not held open by the rank (pid %d): not its dump pipe" % pid)
    fd = open_nofollow(path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        now = os.fstat(fd)
        if not stat.S_ISFIFO(now.st_mode) or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            raise OSError("changed since it was checked")
        os.write(fd, b"1")
    finally:
        os.close(fd)


def _environ_and_source(pid, hops=4):
    """environ_of, and the pid whose environment it is (the rank's own, or an ancestor's)."""
    for _ in range(hops + 1):
        env = _environ(pid)
        if env:
            return env, pid
        row = _proc_stat(pid)
        if row is None or row["ppid"] <= 1:
            return {}, None
        pid = row["ppid"]
    return {}, None


def fr_dump(pids, trigger=True, wait_s=15.0, raw=False, limit=FR_MAX_BYTES):
    """Torch's flight recorder on every rank of the run: each rank's environment says whether it
    is armed and where its pipe and dump are; with `trigger`, one byte into every rank's pipe
    (`<stem><rank>.pipe`) asks each to dump; then every dump newer than the trigger (or the
    newest, without it) is read as plain data. Returns per rank its summary or why none."""
    import base64
    import glob

    problems, stems, prefixes = [], {}, {}
    for pid in pids:
        env, source = _environ_and_source(int(pid))
        if not env:
            continue
        uid = _uid(int(pid))
        if uid is None:
            continue
        if _uid(source) != uid:
            problems.append(
                "pid %d: its environment is that of pid %d, of another user (%s): its pipe and dump "
                "paths are not used" % (int(pid), source, _user(_uid(source)))
            )
            continue
        size = next((env[v] for v in FR_BUFFER_VARS if env.get(v)), "")
        if not size.strip().isdigit() or int(size) <= 0:
            problems.append(
                "pid %d: no %s: the flight recorder keeps nothing" % (int(pid), " or ".join(FR_BUFFER_VARS))
            )
            continue
        prefix = next((env[v] for v in FR_FILE_VARS if env.get(v)), None)
        if prefix is None:
            home = env.get("HOME") or "/tmp"
            prefix = os.path.join(
                env.get("XDG_CACHE_HOME") or os.path.join(home, ".cache"), "torch", "comm_lib_trace_rank_"
            )
        prefix = _proc_path(int(pid), prefix)
        if prefix:
            prefixes[prefix] = uid
        stem = env.get(FR_PIPE_VAR)
        if stem and _proc_path(int(pid), stem):
            stems.setdefault(_proc_path(int(pid), stem), []).append((int(pid), uid))
        elif trigger:
            problems.append("pid %d: no %s: a dump can only come from a timeout" % (int(pid), FR_PIPE_VAR))
    started = time.time()
    poked, poke_errors = [], []
    if trigger:
        # only <stem><rank>.pipe, as torch's DumpPipe names it, and only the one the rank holds open
        for stem, owners in stems.items():
            pipe_name = re.compile(re.escape(os.path.basename(stem)) + r"[0-9]+\.pipe")
            paths = [
                p
                for p in sorted(glob.glob(glob.escape(stem) + "[0-9]*.pipe"))[:1024]
                if pipe_name.fullmatch(os.path.basename(p))
            ]
            for pid, uid in owners:
                held = _fd_ids(pid, None) or set()
                mine = []
                for path in paths:
                    if path in poked:
                        continue
                    try:
                        _poke_fifo(path, uid, held, pid)
                        mine.append(path)
                    except OSError as exc:
                        poke_errors.append("%s: %s" % (path, exc.strerror or exc))
                poked.extend(mine)
                if not mine:
                    problems.append(
                        "pid %d: no dump pipe %s<rank>.pipe of its own (a FIFO it holds open, of its "
                        "user) to write to" % (pid, stem)
                    )
    ranks = {}
    deadline = time.monotonic() + (wait_s if poked else 0.0)
    want = len(poked)
    while True:
        found = {}
        for prefix in prefixes:
            for path in glob.glob(glob.escape(prefix) + "*")[:1024]:
                suffix = path[len(prefix) :]
                if not suffix.isdigit():
                    continue
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                if trigger and poked and st.st_mtime < started - 1.0:
                    continue
                found[int(suffix)] = (path, prefixes[prefix])
        if len(found) >= want or time.monotonic() >= deadline:
            break
        time.sleep(0.25)
    time.sleep(0.3 if found and poked else 0.0)  # a dump being written: let it finish
    for rank, (path, uid) in sorted(found.items()):
        entry = {"file": path}
        try:
            data, mtime = _read_regular(path, limit, uid)
            entry.update(bytes=len(data), mtime=mtime)
            entry.update(slim_fr_dump(read_fr_dump(data)))
            if raw:
                entry["raw_b64"] = base64.b64encode(data).decode()
        except (OSError, ValueError) as exc:
            entry["error"] = str(exc)[:200]
        ranks[str(rank)] = entry
    if not prefixes:
        problems.insert(
            0,
            "no rank has the flight recorder armed (TORCH_NCCL_TRACE_BUFFER_SIZE, "
            "TORCH_NCCL_DEBUG_INFO_PIPE_FILE, TORCH_NCCL_DUMP_ON_TIMEOUT=1: the forensics flag set)",
        )
    elif trigger and not poked:
        problems.append(
            "no rank's dump pipe (<stem><rank>.pipe) was found to write to: "
            + ("; ".join(poke_errors) or "none exists yet")
        )
    return {
        "ranks": ranks,
        "poked": poked,
        "problems": problems[:20],
        "armed": bool(prefixes),
        "triggered_at": started if trigger else None,
    }
