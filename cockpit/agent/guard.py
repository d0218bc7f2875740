"""As root, an interpreter that another user can change runs their code as root: the check made
before a Python starts as root (the agent's own, and the server a launch starts), in one place.

`/bin/sh` on the host checks the interpreter as named, each link it follows and the file it ends
at, every folder above each, and the prefixes' pyvenv.cfg, lib/python3*, their site-packages and
.pth files; then it asks that interpreter, isolated and without `site` (`-I -S`: nothing of its
import path runs yet), to list everything it would import from before the first line of ours
(`PROBE`): the folder it starts in (unless isolated), PYTHONPATH (unless -E/-I), every
site-packages of every scheme `site` adds (Debian's /usr/local/.../dist-packages included, a
venv's, the user's), each .pth file there and every path one names (a setuptools editable
finder's mapped folders too), and every sitecustomize/usercustomize on that path; with `-S` (the
agent) the site folders only, which the agent adds itself without running any .pth
(`site_dirs`). Each of those and every folder above it is checked by one find(1). Anything not
root's, or writable by another user (group-writable with a group other than root's,
other-writable unless a sticky folder), and it is refused in one line with EXIT_UNTRUSTED. Not
root: the interpreter runs as it would anyway. A program not named python* or pypy* (nor linked
to one) is not asked for its import path: its file, links and folders alone are checked. $0 is the
interpreter, "$@" its arguments; its tools are looked for in the system folders first, the
interpreter in PATH as given, and the file checked is the one started (by its path: PATH is not
searched again). A server's check (CHECK) also holds its workdir to the same rule, whatever runs.

Standard library only, Python 3.8 syntax: this module travels with the agent, which checks a
server's interpreter the same way before a launch (`CHECK`)."""

import subprocess

EXIT_UNTRUSTED = 5  # the check's refusal
TRUST = "make it root's alone, or trust it with --trust-python (trust_python: true in the layout)"

# Run as `python -I -S - ARGS` (ARGS: the interpreter's arguments as they will be given): prints
# every path that interpreter imports from before our first line, and every folder above each,
# one a line. Python 3.4 syntax, so an old interpreter is still told "too old" by the bootstrap.
PROBE = r'''
import os, sys


def options(argv):
    """The interpreter's one-letter options, and the folder a script's run puts first on sys.path
    ('' for the folder it starts in: -c, -m, stdin; None when there is none to run)."""
    flags = set()
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "-" or not a.startswith("-"):
            return flags, "" if a == "-" else os.path.dirname(os.path.realpath(a))
        if a == "--":
            return flags, os.path.dirname(os.path.realpath(argv[i + 1])) if i + 1 < len(argv) else ""
        if a.startswith("--"):
            i += 2 if a == "--check-hash-based-pycs" else 1
            continue
        for j, ch in enumerate(a[1:]):
            if ch in "cm":
                return flags, ""
            flags.add(ch)
            if ch in "WX":
                i += 0 if a[j + 2:] else 1
                break
        i += 1
    return flags, None


def venv():
    """(the venv's prefix, whether it sees the system's site-packages) or (None, True)."""
    exe = os.path.dirname(os.path.abspath(sys.executable))
    for cfg in (os.path.join(exe, "pyvenv.cfg"), os.path.join(os.path.dirname(exe), "pyvenv.cfg")):
        try:
            with open(cfg) as f:
                text = f.read()
        except OSError:
            continue
        system = False
        for line in text.splitlines():
            key, eq, value = line.partition("=")
            if eq and key.strip().lower() == "include-system-site-packages":
                system = value.strip().lower() == "true"
        return os.path.dirname(exe), system
    return None, True


def site_dirs(user=True):
    """The site-packages folders `site` adds, in its order, Debian's /usr/local ones included:
    the venv's (and the system's when it sees them), then the user's unless `user` is off."""
    import site
    prefix, system = venv()
    if prefix:  # as site.venv() sets it (Debian's getsitepackages asks sys.prefix whether in a venv)
        sys.prefix = sys.exec_prefix = prefix
    prefixes = ([prefix] if prefix else []) + ([sys.base_prefix, sys.base_exec_prefix] if system else [])
    dirs = site.getsitepackages(list(dict.fromkeys(prefixes)))
    if user and system:
        dirs.append(site.getusersitepackages())
    return [d for d in dict.fromkeys(dirs)]


def finder_paths(path):
    """The folders a setuptools editable finder (__editable___*_finder.py) maps packages to."""
    import ast
    try:
        with open(path, "rb") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return [path]
    out = []
    for node in tree.body:
        targets = getattr(node, "targets", None) or [getattr(node, "target", None)]
        if any(getattr(t, "id", None) in ("MAPPING", "NAMESPACES") for t in targets) and node.value is not None:
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                return [path]
            for v in (value.values() if isinstance(value, dict) else []):
                out += v if isinstance(v, list) else [v]
    return [str(p) for p in out]


def roots(argv):
    """Every path the interpreter started with `argv` imports from before its first line."""
    flags, first = options(argv)
    isolated = "I" in flags
    env = not (isolated or "E" in flags)
    found = [os.getcwd()] if not isolated else []  # the folder it starts in: the server's workdir
    if first is not None and not (isolated or "P" in flags or (env and os.environ.get("PYTHONSAFEPATH"))):
        found.append(first or os.getcwd())
    if env and os.environ.get("PYTHONPATH"):
        found += [p or os.getcwd() for p in os.environ["PYTHONPATH"].split(os.pathsep)]
    found += [p for p in sys.path if p]
    user = not (isolated or "s" in flags or (env and os.environ.get("PYTHONNOUSERSITE")))
    sites = site_dirs(user)
    found += sites
    if "S" not in flags:
        for d in sites:
            try:
                names = sorted(os.listdir(d))
            except OSError:
                continue
            for name in names:
                path = os.path.join(d, name)
                if name.startswith("__editable__") and name.endswith("_finder.py"):
                    found += [path] + finder_paths(path)
                if not name.endswith(".pth") or name.startswith("."):
                    continue
                found.append(path)
                try:
                    with open(path, encoding="utf-8", errors="replace") as f:
                        lines = f.read().splitlines()
                except OSError:
                    continue
                for line in lines:
                    if line.startswith("#") or not line.strip() or line.startswith(("import ", "import\t")):
                        continue  # code: its .pth is checked; what it imports comes from the folders checked
                    found.append(os.path.join(d, line.rstrip()))
        for d in list(found):
            try:
                names = os.listdir(d) if os.path.isdir(d) else []
            except OSError:
                names = []
            found += [os.path.join(d, n) for n in names if n.startswith(("sitecustomize", "usercustomize"))]
    return found


def said(paths, above=False):
    """Each path and where its links lead (`above`: and every folder above each), once, none
    holding a newline (the folder that holds such a name is said instead) and, without `above`,
    none missing (the nearest folder there, where it would be made, instead)."""
    out = []
    for path in paths:
        path = os.path.abspath(path)
        for p in (path, os.path.realpath(path)):
            while "\n" in p or not (above or os.path.lexists(p) or p == os.path.dirname(p)):
                p = os.path.dirname(p)  # a path not there yet: whoever may make it
            while True:
                out.append(p)
                up = os.path.dirname(p)
                if not above or up == p:
                    break
                p = up
    return list(dict.fromkeys(out))


if __name__ == "__main__":  # what it imports from (writable by no other user, even sticky), "-", the folders above
    found = roots(sys.argv[1:])
    sys.stdout.write("".join(p + "\n" for p in said(found) + ["-"] + said(found, above=True)))
'''
assert "\nPROBE\n" not in PROBE

_probe = {"__name__": "cockpit_probe"}
exec(compile(PROBE, "<cockpit-probe>", "exec"), _probe)
site_dirs = _probe["site_dirs"]
roots = _probe["roots"]

# $m is `exec` (GUARD: the interpreter runs once checked) or `:` (CHECK: the check alone).
_BODY = (
    """\
o=$PATH
case $0 in */*) p=$0;; *) p=$(command -v "$0") || { $m "$0" "$@"; exit 0; };; esac
PATH=/usr/bin:/bin:/usr/sbin:/sbin:$o
u=$(id -u) || u=0
[ "$u" = 0 ] || { PATH=$o; $m "$0" "$@"; exit 0; }
case $p in /*) ;; *) p=$PWD/$p;; esac
[ -e "$p" ] || { PATH=$o; $m "$0" "$@"; exit 0; }
b= nf= k=
f() {
 [ -n "$b" ] && return
 if [ -n "$k" ]; then
  b=$(find "$@" -prune ! -type l \\( ! -user 0 -o -perm -0020 ! -group 0 -o -perm -0002 \\) -print 2>/dev/null)
 else
  b=$(find "$@" -prune ! -type l \\( ! -user 0 -o -perm -0020 ! -group 0 -o -perm -0002 \\( ! -type d -o ! -perm -1000 \\) \\) -print 2>/dev/null)
 fi
 [ $? = 127 ] && { b=$1; nf=1; }
 b=${b%%
*}
}
c() {
 d=$1; set --
 while :; do set -- "$@" "$d"; case $d in /) break;; */*) d=${d%/*}; d=${d:-/};; *) break;; esac; done
 f "$@"
}
h=$p; n=0
while c "$h"; [ -L "$h" ] && [ $n -lt 16 ]; do
 t=$(readlink "$h"); case $t in /*) ;; *) t=${h%/*}/$t;; esac; h=$t; n=$((n+1))
done
r=$(readlink -f "$p" 2>/dev/null) && c "$r"
e() {
 set --
 for v in "${p%/*/*}" "${r%/*/*}"; do
  for x in "$v/pyvenv.cfg" "$v/lib" "$v"/lib/python3* "$v"/lib/python3*/*-packages "$v"/lib/python3*/*-packages/*.pth; do
   [ -e "$x" ] && set -- "$@" "$x"
  done
 done
 [ $# = 0 ] || f "$@"
}
e
g() {
 l=$(PATH=$o "$p" -I -S - "$@" 2>/dev/null <<'PROBE'
"""
    + PROBE
    + """
PROBE
) || { pe=$?; return; }
 IFS='
'
 set -f; set -- ${l%%
-
*}; k=1; [ $# = 0 ] || f "$@"
 set -- ${l#*
-
}; set +f; k=; [ $# = 0 ] || f "$@"
 unset IFS
}
pe=
[ "$m" = : ] && { c "$PWD"; k=1; f "$PWD"; k=; }  # a server's workdir, whatever runs in it
case ${p##*/}/${r##*/} in python*|*/python*|pypy*|*/pypy*) [ -n "$b" ] || g "$@";; esac
if [ -n "$nf" ]; then
 echo "gpu-cockpit: $0 is not run as root: there is no find(1) here to check who can change it; install findutils, or trust it with --trust-python (trust_python: true in the layout)" >&2
 exit 5
fi
if [ -n "$pe" ]; then
 echo "gpu-cockpit: $0 is not run as root: it could not list the folders it imports from (exit $pe with -I -S); """
    + TRUST
    + """" >&2
 exit 5
fi
if [ -n "$b" ]; then
 set -f; set -- $(ls -ldn "$b" 2>/dev/null)
 echo "gpu-cockpit: $0 is not run as root: $b (mode $1, owner uid $3, group $4) can be changed by a user other than root; """
    + TRUST
    + """" >&2
 exit 5
fi
PATH=$o
"""
)
GUARD = "m=exec\n" + _BODY + 'exec "$p" "$@"\n'
CHECK = "m=:\n" + _BODY + "exit 0\n"


def guarded(argv):
    """`argv` (an interpreter and its arguments) started through GUARD."""
    return ["/bin/sh", "-c", GUARD] + list(argv)


def check_python(argv, cwd, env):
    """None when the interpreter `argv` starts (in `cwd`, with `env`) may run as this user (not
    root, or nothing of its import path another user can change), else the one line that says
    what another user can change and the way out."""
    res = subprocess.run(
        ["/bin/sh", "-c", CHECK] + list(argv),
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        timeout=60,
    )
    if res.returncode == 0:
        return None
    lines = res.stderr.decode("utf-8", "replace").strip().splitlines()
    return lines[-1] if lines else "gpu-cockpit: %s was not checked (exit %d)" % (argv[0], res.returncode)
