"""py-spy stack dumps of the ranks, and the checks a dump needs, said before it is needed."""

import os
import platform
import subprocess
import threading

from .procs import _HAVE_PROC


def pyspy_check(pyspy=None, beside=()):
    """What a stack dump needs, said before it is needed: py-spy (which one, which version), and
    ptrace rights. Which: `pyspy` when named; else the first py-spy in a folder of `beside` (the
    layout's interpreter's own bin: a venv that has the engine often has py-spy too), else the
    one PATH finds. `looked` says where it was looked for."""
    import shutil

    looked = []
    path = pyspy if pyspy and os.access(pyspy, os.X_OK) and os.path.isfile(pyspy) else None
    if pyspy and not path:
        looked.append(pyspy)
    for folder in [] if path or pyspy else beside:
        cand = os.path.join(folder, "py-spy")
        if os.path.isfile(cand) and os.access(cand, os.X_OK):
            unsafe = _changeable_by_others(cand)
            if unsafe:  # as root, a binary another user can replace is never run
                looked.append(cand + " (not used: " + unsafe + ")")
                continue
            looked.append(cand)
            path = cand
            break
        looked.append(cand)
    if not path and not pyspy:
        looked.append("PATH (" + os.environ.get("PATH", "") + ")")
        path = shutil.which("py-spy")
    version = None
    if path:
        try:
            out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10)
            version = out.stdout.strip().rsplit(" ", 1)[-1] or None
        except (OSError, subprocess.SubprocessError):
            version = None
    cap = False
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("CapEff:"):
                    cap = bool(int(line.split()[1], 16) & (1 << 19))  # CAP_SYS_PTRACE
    except OSError:
        pass
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as fh:
            scope = int(fh.read().strip())
    except (OSError, ValueError):
        scope = None
    root = os.geteuid() == 0
    problems = []
    if not path:
        problems.append("py-spy is not installed on the host")
    if root and not cap:
        problems.append("root without CAP_SYS_PTRACE (in a container: run it with --cap-add SYS_PTRACE)")
    elif not root and scope:
        problems.append("kernel.yama.ptrace_scope=%d: only root may attach (sysctl kernel.yama.ptrace_scope=0)" % scope)
    return {
        "pyspy": path,
        "version": version,
        "root": root,
        "cap_sys_ptrace": cap,
        "ptrace_scope": scope,
        "arch": platform.machine(),
        "problems": problems,
        "looked": looked,
    }


def _changeable_by_others(path):
    """As root: why a user other than root could change this file or its folder (their owner, or
    write rights for group or others), else None. Other users run only what they could run anyway."""
    if os.geteuid() != 0:
        return None
    for where in (path, os.path.dirname(path)):
        try:
            st = os.stat(where)
        except OSError as exc:
            return "%s: %s" % (where, exc.strerror)
        if st.st_uid != 0:
            return "%s is owned by uid %d" % (where, st.st_uid)
        if st.st_mode & 0o022:
            return "%s is writable by others (mode %o)" % (where, st.st_mode & 0o777)
    return None


def pyspy_target(pid):
    """Whether py-spy can be pointed at this pid at all: {"status": "gone"} when no process has it,
    {"status": "Z", "exit_code": ...} for a zombie (it has exited, its parent has not reaped it:
    py-spy fails on one with an unhelpful error), None for a process that runs (or no /proc).
    The exit code is a zombie's wait status read as Python does: -N for a signal, else the code."""
    if not _HAVE_PROC:
        return None
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            data = fh.read()
    except OSError:
        return {"status": "gone", "exit_code": None}
    f = data[data.rfind(b")") + 2 :].split()
    state = f[0].decode() if f else "?"
    if state not in ("Z", "X", "x"):
        return None
    code = None
    if len(f) > 49 and state == "Z":
        try:
            status = int(f[49])  # field 52, exit_code: the wait status (Linux 3.5+, readable with ptrace rights)
        except ValueError:
            status = None
        if status is not None:
            code = -(status & 0x7F) if status & 0x7F else (status >> 8) & 0xFF
    return {"status": "Z" if state == "Z" else "gone", "exit_code": code}


def read_chars(pid):
    """The bytes the process has read so far (/proc/PID/io rchar: files, pipes, sockets), or None."""
    try:
        with open("/proc/%d/io" % pid) as fh:
            for line in fh:
                if line.startswith("rchar:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def pyspy_dump(pids, pyspy=None, deadline_s=20.0, native=True, nonblocking=False):
    """py-spy dumps of every pid at once: --native first, then a plain dump when native
    unwinding fails or runs past the deadline (py-spy 336, 398). A pid that is gone or a zombie
    is answered as dead (with its exit code where the kernel still has it), before py-spy runs on
    it and again when py-spy fails because it died meanwhile. `nonblocking`: the process is not
    paused (Python frames only: py-spy cannot unwind native frames so), and each answer carries
    the bytes it had read (`rchar`), so two such dumps tell a rank reading from one waiting."""
    check = pyspy_check(pyspy)
    exe = check["pyspy"]
    results = {}

    def dead(pid, found, errors):
        results[pid] = {
            "ok": False,
            "dead": True,
            "status": found["status"],
            "exit_code": found["exit_code"],
            "native": False,
            "text": "",
            "errors": errors,
        }

    def one(pid):
        found = pyspy_target(pid)
        if found:
            dead(pid, found, [])
            return
        if not exe:
            results[pid] = {
                "ok": False,
                "dead": False,
                "native": False,
                "text": "",
                "errors": ["py-spy is not installed on the host"],
            }
            return
        tries = [[exe, "dump", "--pid", str(pid), "--native"], [exe, "dump", "--pid", str(pid)]]
        if not native:
            tries = tries[1:]
        if nonblocking:
            tries = [[exe, "dump", "--pid", str(pid), "--nonblocking"]]
        errors = []
        for argv in tries:
            try:
                out = subprocess.run(argv, capture_output=True, text=True, timeout=deadline_s / len(tries))
            except subprocess.TimeoutExpired:
                errors.append("%s timed out" % " ".join(argv[1:]))
                continue
            if out.returncode == 0 and out.stdout.strip():
                results[pid] = {
                    "ok": True,
                    "dead": False,
                    "native": "--native" in argv,
                    "text": out.stdout,
                    "errors": errors,
                    "rchar": read_chars(pid) if nonblocking else None,
                }
                return
            said = (out.stderr or out.stdout).strip()
            errors.append(said.splitlines()[0] if said else "exit %d" % out.returncode)
            found = pyspy_target(pid)
            if found:
                dead(pid, found, errors)  # it died while py-spy read it
                return
        results[pid] = {"ok": False, "dead": False, "native": False, "text": "", "errors": errors}

    threads = [threading.Thread(target=one, args=(int(p),), daemon=True) for p in pids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(deadline_s + 5)
    return {"dumps": {str(k): v for k, v in results.items()}, "check": check}
