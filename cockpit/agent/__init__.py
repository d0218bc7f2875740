"""What travels to the GPU host: the agent's modules as one marshalled table of sources, and the
simulated NVML's source, read as bytes. Nothing is installed or written on the host."""

import marshal
import sys
from functools import lru_cache
from pathlib import Path

from cockpit.agent import protocol  # noqa: F401  (the frame schema's one home)

_HERE = Path(__file__).resolve().parent
PACKAGE = "cockpit_agent"  # the agent's package name on the host (this package's __init__ stays here)
OPERATOR_ONLY = ("__init__.py",)  # the bootstrap's home, never sent
ORIGIN = "<cockpit-agent>/"  # the compiled-there modules' file names on the host, in tracebacks

# Reads exactly N bytes from stdin (unbuffered, so the commands that follow stay in the pipe for
# the agent), checks the Python version, then imports the agent from the table in memory
# (memimport.py): the modules' code as compiled here when the host runs this very Python (the
# `local` target), else their sources, compiled there. `marshal` is built into every Python and
# reads the table's format 2 everywhere. A plain source (an agent.py from before the split:
# benchmarks compare against one) is run as it was then.
BOOTSTRAP = (
    "import os,sys\n"
    "if sys.version_info<(3,8):sys.stderr.write('gpu-cockpit: Python %d.%d is too old, need >= 3.8\\n'%sys.version_info[:2]);sys.exit(4)\n"
    "n=int(sys.argv[1]);b=b''\n"
    "while len(b)<n:\n"
    " c=os.read(0,n-len(b))\n"
    " if not c:sys.exit(3)\n"
    " b+=c\n"
    "if b[:1]!=b'{':exec(compile(b,'cockpit-agent','exec'),{'__name__':'__cockpit_agent__'});sys.exit()\n"
    "import marshal\n"
    "a=marshal.loads(b);c=marshal.loads(a['code']) if a['python']==sys.version else {}\n"
    "g={'__name__':'cockpit_agent_boot'}\n"
    "exec(marshal.loads(c['memimport']) if 'memimport' in c else compile(a['modules']['memimport'],'" + ORIGIN + PACKAGE + "/memimport.py','exec'),g)\n"
    "sys.exit(g['run'](a['modules'],c,sys.argv[2:]))\n"
)
EXIT_TOO_OLD = 4
EXIT_UNTRUSTED = 5  # GUARD's refusal

# As root, an interpreter that another user can change runs their code as root. So before a
# Python starts as root, /bin/sh on the host checks what it would run: the interpreter as named,
# each link it follows and the file it ends at, every folder above each, and the prefixes'
# pyvenv.cfg, lib/python3*, their site-packages and .pth files (one find(1) per chain). Anything
# not root's, or writable by another user (group-writable with a group other than root's,
# other-writable unless a sticky folder), and it is refused in one line with EXIT_UNTRUSTED. Not
# root: the interpreter runs as it would anyway. $0 is the interpreter, "$@" its arguments; its tools
# are looked for in the system folders first, the interpreter in PATH as given, and the file checked
# is the one started (by its path: PATH is not searched again).
GUARD = """\
o=$PATH
case $0 in */*) p=$0;; *) p=$(command -v "$0") || exec "$0" "$@";; esac
PATH=/usr/bin:/bin:/usr/sbin:/sbin:$o
u=$(id -u) || u=0
[ "$u" = 0 ] || { PATH=$o; exec "$0" "$@"; }
case $p in /*) ;; *) p=$PWD/$p;; esac
[ -e "$p" ] || { PATH=$o; exec "$0" "$@"; }
b= nf=
f() {
 [ -n "$b" ] && return
 b=$(find "$@" -prune ! -type l \\( ! -user 0 -o -perm -0020 ! -group 0 -o -perm -0002 \\( ! -type d -o ! -perm -1000 \\) \\) -print 2>/dev/null)
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
if [ -n "$nf" ]; then
 echo "gpu-cockpit: $0 is not run as root: there is no find(1) here to check who can change it; install findutils, or trust it with --trust-python (trust_python: true in the layout)" >&2
 exit 5
fi
if [ -n "$b" ]; then
 set -f; set -- $(ls -ldn "$b" 2>/dev/null)
 echo "gpu-cockpit: $0 is not run as root: $b (mode $1, owner uid $3, group $4) can be changed by a user other than root; make it root's alone, or trust it with --trust-python (trust_python: true in the layout)" >&2
 exit 5
fi
PATH=$o
exec "$p" "$@"
"""


def guarded(argv: list[str]) -> list[str]:
    """`argv` (an interpreter and its arguments) started through GUARD."""
    return ["/bin/sh", "-c", GUARD, *argv]


def agent_modules() -> list[Path]:
    """The modules that run on the host: every module of this package but the operator's own."""
    return sorted(p for p in _HERE.glob("*.py") if p.name not in OPERATOR_ONLY)


def pack_agent(sources: dict[str, bytes], code: dict[str, bytes] | None = None) -> bytes:
    """The bytes that travel: {"modules": {name: source}, "python": this sys.version or "", "code":
    marshalled {name: marshalled code object} or b""}. Code objects load only in the very Python
    that made them: the host uses them only when its `sys.version` is this one, else it compiles
    the sources."""
    return marshal.dumps({"modules": dict(sorted(sources.items())), "python": sys.version if code else "",
                          "code": marshal.dumps(dict(sorted(code.items()))) if code else b""}, 2)


def _cached_code(path: Path) -> bytes | None:
    """The module's marshalled code from Python's own cache (`__pycache__`, checked against the
    source's mtime and size as the import system checks it), written there first when missing
    (as an import would, unless bytecode writing is off); None when there is none to be had."""
    from importlib.util import MAGIC_NUMBER, cache_from_source

    cfile = Path(cache_from_source(str(path)))
    for attempt in range(2):
        try:
            st, data = path.stat(), cfile.read_bytes()
        except OSError:
            data = b""
        if (data[:4] == MAGIC_NUMBER and data[4:8] == bytes(4)
                and data[8:12] == (int(st.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little")
                and data[12:16] == (st.st_size & 0xFFFFFFFF).to_bytes(4, "little")):
            return data[16:]
        if attempt or sys.dont_write_bytecode:
            return None
        import py_compile

        py_compile.compile(str(path), str(cfile), doraise=False, quiet=2)
    return None


@lru_cache(maxsize=None)
def agent_source(compiled: bool = False) -> bytes:
    """The agent's modules as they travel (`pack_agent`), with their code from this Python's cache
    when `compiled` (the `local` agent then starts without compiling them); the same source gives
    the same bytes."""
    paths = agent_modules()
    code = {}
    if compiled:
        code = {p.stem: c for p in paths if (c := _cached_code(p)) is not None}
    return pack_agent({p.stem: p.read_bytes() for p in paths}, code)


@lru_cache(maxsize=None)
def sim_nvml_source() -> bytes:
    return (_HERE.parent / "sim" / "fakenvml.py").read_bytes()


def agent_argv(python: str, interval: float, sim_state: str | None, guard: bool = False) -> tuple[list[str], bytes]:
    """The command line that starts the agent and the bytes to write to its stdin first: the
    modules compiled here when `python` is the cockpit's own interpreter. Isolated (`-I`): no
    PYTHON* variable, no user site-packages and no module of the folder it starts in (another
    user's `bisect.py` there would run as root). With `guard`, through GUARD."""
    src = agent_source(python == sys.executable)
    args = [python, "-I", "-u", "-c", BOOTSTRAP, str(len(src)), "--interval", repr(float(interval))]
    payload = src
    if sim_state:
        sim = sim_nvml_source()
        args += ["--sim-state", sim_state, "--sim-nvml", str(len(sim))]
        payload += sim
    return (guarded(args) if guard else args), payload
