"""/dev/shm audit and clean: who holds each entry (maps and fds), and each removal re-checked
relative to the folder's fd.
"""

import os
import re
import time

from .nofollow import open_nofollow
from .procs import _proc_stat, _protected, _user, _when
from .protocol import Refused

SHM_DEFAULT = "/dev/shm"
# What inference runs leave in /dev/shm (docs/layouts.md names the source of each). Only entries
# with one of these prefixes are ever removed by a clean.
SHM_FAMILIES = (
    ("nccl-", "NCCL"),
    ("torch_", "PyTorch"),
    ("__KMP_REGISTERED_LIB_", "OpenMP runtime (PyTorch)"),
    ("psm_", "Python shared memory"),
    ("sem.mp-", "Python multiprocessing"),
    ("sem.loky-", "joblib/loky"),
    ("sgl_shm_", "SGLang"),
    ("multi_tokenizer_args_", "SGLang"),
    ("vllm_", "vLLM"),
    ("vader_segment.", "Open MPI"),
    ("sm_segment.", "Open MPI"),
    ("psm2_", "MPI (PSM2)"),
    ("psm3_", "MPI (PSM3)"),
    ("ucx_", "MPI (UCX)"),
)
# Names that carry their creator's pid.
SHM_CREATOR = [
    re.compile(r"^sgl_shm_[A-Za-z_]*?_(\d+)_"),
    re.compile(r"^multi_tokenizer_args_(\d+)"),
    re.compile(r"^torch_(\d+)_"),
    re.compile(r"^__KMP_REGISTERED_LIB_(\d+)"),
]


def _maps_ids(pid, dev):
    """(dev, inode) of every file a process maps that lives on `dev`, read from /proc/PID/maps's
    device (major:minor, hex) and inode columns: what the kernel mapped, whatever the path it
    prints (another mount namespace, a bind mount, a name with a newline or ending in
    " (deleted)")."""
    out = set()
    try:
        with open("/proc/%d/maps" % pid, "rb") as fh:
            for line in fh:
                parts = line.split(None, 5)
                if len(parts) < 5 or parts[4] == b"0":
                    continue
                major, _, minor = parts[3].partition(b":")
                try:
                    key = (os.makedev(int(major, 16), int(minor, 16)), int(parts[4]))
                except ValueError:
                    continue
                if dev is None or key[0] == dev:
                    out.add(key)
    except PermissionError:
        return None  # not ours to read (no ptrace rights): what it maps is unknown
    except OSError:
        pass
    return out


def _fd_ids(pid, dev):
    """(dev, inode) of every file a process holds open on `dev`: each /proc/PID/fd/N stat()ed,
    which reaches the open file itself (any mount namespace, renamed or unlinked)."""
    out = set()
    fd_dir = "/proc/%d/fd" % pid
    try:
        fds = os.listdir(fd_dir)
    except PermissionError:
        return None  # what it holds open is unknown
    except OSError:
        return out
    for fd in fds:
        try:
            if not os.readlink(fd_dir + "/" + fd).startswith("/"):
                continue  # socket:[…], pipe:[…], anon_inode:…: not a file of a folder
            st = os.stat(fd_dir + "/" + fd)
        except PermissionError:
            return None
        except OSError:
            continue
        if dev is None or st.st_dev == dev:
            out.add((st.st_dev, st.st_ino))
    return out


def _holders(folder):
    """{(dev, inode): [pids]} of the files on the shm folder's file system that a live process
    maps or holds open. Compared with os.lstat of each entry, never by path: a path in
    /proc/PID/maps is the one the process's own mount namespace sees, escapes a newline as
    `\\012` and may carry " (deleted)". Also the pids whose holdings cannot be read."""
    dev = os.stat(folder).st_dev
    held, blind = {}, []
    own = _protected()  # the agent and the login chain that started it (init, sshd) are no run
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        maps, fds = _maps_ids(pid, dev), _fd_ids(pid, dev)
        if (maps is None or fds is None) and pid not in own and not _kernel_thread(pid):
            blind.append(pid)  # its holdings cannot be read: it may hold any file here
        for key in (maps or set()) | (fds or set()):
            held.setdefault(key, set()).add(pid)
    return {k: sorted(v) for k, v in held.items()}, blind


def _kernel_thread(pid):
    """A kernel thread (PF_KTHREAD in /proc/PID/stat's flags): it maps no file of a folder."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            fields = fh.read().rpartition(b")")[2].split()
        return bool(int(fields[6]) & 0x00200000)
    except (OSError, ValueError, IndexError):
        return False


_LIBC = None


def _born(path, st, dir_fd=None):
    """When the file was created: its birth time (statx, where the file system keeps one: tmpfs
    does), else its status-change time, which is never earlier. (nanoseconds since the epoch,
    "birth" | "ctime"). With the inode it tells one file from another that got its inode number
    after it was removed (tmpfs and ext4 hand a freed number out again at once)."""
    global _LIBC
    try:
        import ctypes

        if _LIBC is None:
            _LIBC = ctypes.CDLL(None, use_errno=True)
        buf = ctypes.create_string_buffer(256)
        fn = _LIBC.statx
        fd = -100 if dir_fd is None else dir_fd  # AT_FDCWD
        if fn(fd, os.fsencode(path), 0x100 | 0x800, 0x800, buf) == 0:  # AT_SYMLINK_NOFOLLOW, STATX_BTIME
            mask = int.from_bytes(buf.raw[0:4], "little")
            ino = int.from_bytes(buf.raw[32:40], "little")
            if mask & 0x800 and ino == st.st_ino:
                sec = int.from_bytes(buf.raw[80:88], "little", signed=True)
                nsec = int.from_bytes(buf.raw[88:92], "little")
                return sec * 1000000000 + nsec, "birth"
    except (OSError, AttributeError, ValueError):
        pass
    return st.st_ctime_ns, "ctime"


def shm_family(name):
    for prefix, family in SHM_FAMILIES:
        if name.startswith(prefix):
            return family
    return None


def _shm_folder(folder):
    """The folder as the kernel resolves it (`/dev//shm`, `/dev/shm/.`, `/dev/../dev/shm` are
    /dev/shm) and whether it is the host's /dev/shm."""
    real = os.path.realpath(folder)
    return real, real == os.path.realpath(SHM_DEFAULT)


def _shm_folder_ok(folder, other_dir):
    real, default = _shm_folder(folder)
    if not default and not other_dir:
        raise Refused(
            "%s is not /dev/shm: a clean touches another folder only when the operator names it and "
            "confirms (cockpit shm --dir %s --clean --yes-other-dir)" % (folder, folder)
        )
    return real


def _kind(mode):
    import stat as st_mod

    return (
        "symlink"
        if st_mod.S_ISLNK(mode)
        else "dir"
        if st_mod.S_ISDIR(mode)
        else "file"
        if st_mod.S_ISREG(mode)
        else "special file"
    )


def shm_audit(folder=SHM_DEFAULT, uid=None):
    """Every entry of the folder, each with whether `cockpit shm --clean` may remove it and, if
    not, why: only a regular file with an inference run's name, owned by the run's user, mapped
    or held open by no live process (compared by device and inode), whose creator (when its name
    carries one) is dead. Where some process's maps or descriptors cannot be read (no ptrace
    rights: a non-root agent beside other users), nobody can say the file is unheld: kept. Each entry carries its device, inode and birth time, so that a clean
    removes exactly the file listed, and a clean after a kill only files tied to the run."""
    asked = folder
    folder, default = _shm_folder(folder)
    run_uid = os.geteuid() if uid is None else int(uid)
    now = time.time()
    holders, blind = _holders(folder)
    entries = []
    dfd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        for name in sorted(os.listdir(dfd)):
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except OSError:
                continue
            kind = _kind(st.st_mode)
            family = shm_family(name)
            creator = None
            for rx in SHM_CREATOR:
                m = rx.match(name)
                if m:
                    creator = int(m.group(1))
            born_ns, born_how = _born(name, st, dfd)
            born = born_ns / 1e9
            alive, creator_started = None, None
            if creator is not None:
                row = _proc_stat(creator)
                creator_started = row["started"] if row is not None else None
                # a creator pid alive but started after the file was made is a reused pid
                alive = row is not None and row["status"] != "Z" and row["started"] <= born + 2
            held = holders.get((st.st_dev, st.st_ino), [])
            if kind != "file":
                why = "a %s, not a file" % kind
            elif family is None:
                why = "not an inference run's name (%s…)" % ", ".join(p for p, _ in SHM_FAMILIES[:8])
            elif st.st_uid != run_uid:
                why = "owned by %s (uid %d), not the run's user (%s)" % (_user(st.st_uid), st.st_uid, _user(run_uid))
            elif held:
                why = "held by pid " + ",".join(map(str, held))
            elif blind:
                why = (
                    "cannot tell who holds it: what %d processes map or hold open cannot be read here (pid %s%s, "
                    "not %s's; run as root to see them)"
                    % (len(blind), ",".join(map(str, blind[:5])), "…" if len(blind) > 5 else "", _user(os.geteuid()))
                )
            elif alive:
                why = "its creator pid %d is alive" % creator
            else:
                why = None
            entries.append(
                {
                    "name": name,
                    "kind": kind,
                    "family": family,
                    "bytes": st.st_blocks * 512 if kind == "file" else 0,
                    "size": st.st_size,
                    "age_s": round(now - st.st_mtime, 1),
                    "owner": _user(st.st_uid),
                    "uid": st.st_uid,
                    "dev": st.st_dev,
                    "ino": st.st_ino,
                    "born": born,
                    "born_ns": born_ns,
                    "born_how": born_how,
                    "held_by": held,
                    "creator": creator,
                    "creator_alive": alive,
                    "creator_started": creator_started,
                    "removable": why is None,
                    "why": why,
                }
            )
    finally:
        os.close(dfd)
    vfs = os.statvfs(folder)
    return {
        "folder": folder,
        "asked": asked,
        "default": default,
        "entries": entries,
        "free_bytes": vfs.f_bavail * vfs.f_frsize,
        "total_bytes": vfs.f_blocks * vfs.f_frsize,
        "uid": run_uid,
        "user": _user(run_uid),
        "prefixes": [p for p, _ in SHM_FAMILIES],
        "checked_at": now,
        "unreadable_pids": blind[:50],
        "unreadable": len(blind),
    }


def shm_clean(folder, names, uid=None, other_dir=False):
    """Removes only the named entries that the audit, taken again now, finds removable. Each name
    may carry the file it was when it was listed ({"name", "dev", "ino", "born_ns"}): another
    file under that name since is kept. Just before each unlink (relative to the folder's
    descriptor: no path followed, no symlink, nothing outside the folder) the entry is lstat()ed
    once more and must still be that regular file of that owner. Only /dev/shm (after resolving
    the path) unless `other_dir` says the operator confirmed another folder."""
    import stat as st_mod

    folder = _shm_folder_ok(folder, other_dir)
    audit = {e["name"]: e for e in shm_audit(folder, uid)["entries"]}
    removed, skipped, freed = [], [], 0
    dfd = open_nofollow(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for item in names:
            want = None
            if isinstance(item, dict):
                name = str(item.get("name"))
                if item.get("ino") is not None:
                    want = tuple(None if item.get(k) is None else int(item[k]) for k in ("dev", "ino", "born_ns"))
            else:
                name = item
            entry = audit.get(name)
            if "/" in name or name in (".", ".."):
                skipped.append({"name": name, "why": "not an entry of " + folder})
            elif entry is None:
                skipped.append({"name": name, "why": "gone since it was listed", "gone": True})
            elif not entry["removable"]:
                skipped.append({"name": name, "why": entry["why"]})
            elif want is not None and (
                want[1] != entry["ino"]
                or want[0] not in (None, entry["dev"])
                or want[2] not in (None, entry["born_ns"])
            ):
                skipped.append(
                    {
                        "name": name,
                        "why": "another file than the one listed (inode %d, made %s; now "
                        "inode %d, made %s): replaced since"
                        % (want[1], _when((want[2] or 0) / 1e9), entry["ino"], _when(entry["born"])),
                    }
                )
            else:
                try:
                    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                    if (
                        not st_mod.S_ISREG(st.st_mode)
                        or st.st_ino != entry["ino"]
                        or st.st_dev != entry["dev"]
                        or st.st_uid != entry["uid"]
                        or _born(name, st, dfd)[0] != entry["born_ns"]
                    ):
                        skipped.append(
                            {
                                "name": name,
                                "why": "changed since it was checked (now a %s, inode %d)"
                                % (_kind(st.st_mode), st.st_ino),
                            }
                        )
                        continue
                    os.unlink(name, dir_fd=dfd)
                    removed.append(name)
                    freed += entry["bytes"]
                except OSError as exc:
                    skipped.append({"name": name, "why": exc.strerror or str(exc)})
    finally:
        os.close(dfd)
    return {"removed": removed, "skipped": skipped, "freed_bytes": freed}
