"""What travels to the GPU host: the agent's modules as one marshalled table of sources, and the
simulated NVML's source, read as bytes. Nothing is installed or written on the host."""

import marshal
import sys
from functools import lru_cache
from pathlib import Path

from cockpit.agent import protocol  # noqa: F401  (the frame schema's one home)
from cockpit.agent.guard import EXIT_UNTRUSTED, GUARD, guarded  # noqa: F401  (the interpreter's check: its one home)

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
    "exec(marshal.loads(c['memimport']) if 'memimport' in c else compile(a['modules']['memimport'],'"
    + ORIGIN
    + PACKAGE
    + "/memimport.py','exec'),g)\n"
    "sys.exit(g['run'](a['modules'],c,sys.argv[2:]))\n"
)
EXIT_TOO_OLD = 4


def agent_modules() -> list[Path]:
    """The modules that run on the host: every module of this package but the operator's own."""
    return sorted(p for p in _HERE.glob("*.py") if p.name not in OPERATOR_ONLY)


def pack_agent(sources: dict[str, bytes], code: dict[str, bytes] | None = None) -> bytes:
    """The bytes that travel: {"modules": {name: source}, "python": this sys.version or "", "code":
    marshalled {name: marshalled code object} or b""}. Code objects load only in the very Python
    that made them: the host uses them only when its `sys.version` is this one, else it compiles
    the sources."""
    return marshal.dumps(
        {
            "modules": dict(sorted(sources.items())),
            "python": sys.version if code else "",
            "code": marshal.dumps(dict(sorted(code.items()))) if code else b"",
        },
        2,
    )


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
        if (
            data[:4] == MAGIC_NUMBER
            and data[4:8] == bytes(4)
            and data[8:12] == (int(st.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little")
            and data[12:16] == (st.st_size & 0xFFFFFFFF).to_bytes(4, "little")
        ):
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
    user's `bisect.py` there would run as root); without `site` (`-S`): no .pth file and no
    sitecustomize runs in it, the agent adding the site-packages folders itself (start.py). With
    `guard`, through GUARD (guard.py)."""
    src = agent_source(python == sys.executable)
    isolated = ["-I", "-S"] if src[:1] == b"{" else ["-I"]  # a plain agent.py of before (benchmarks) ran with site
    args = [python, *isolated, "-u", "-c", BOOTSTRAP, str(len(src)), "--interval", repr(float(interval))]
    payload = src
    if sim_state:
        sim = sim_nvml_source()
        args += ["--sim-state", sim_state, "--sim-nvml", str(len(sim))]
        payload += sim
    return (guarded(args) if guard else args), payload
