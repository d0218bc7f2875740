"""What travels to the GPU host: the agent's modules as one in-memory zip, and the simulated NVML's
source, read as bytes. Nothing is installed or written on the host."""

import io
import zipfile
from functools import lru_cache
from pathlib import Path

from cockpit.agent import protocol  # noqa: F401  (the frame schema's one home)

_HERE = Path(__file__).resolve().parent
PACKAGE = "cockpit_agent"  # the agent's package name on the host (this package's __init__ stays here)
OPERATOR_ONLY = ("__init__.py",)  # the bootstrap's home, never sent

# Reads exactly N bytes from stdin (unbuffered, so the commands that follow stay in the pipe for
# the agent), checks the Python version, then imports the agent from the zip in memory
# (memimport.py). A plain source (an agent.py from before the split: benchmarks compare against
# one) is run as it was then.
BOOTSTRAP = (
    "import os,sys\n"
    "if sys.version_info<(3,8):sys.stderr.write('gpu-cockpit: Python %d.%d is too old, need >= 3.8\\n'%sys.version_info[:2]);sys.exit(4)\n"
    "n=int(sys.argv[1]);b=b''\n"
    "while len(b)<n:\n"
    " c=os.read(0,n-len(b))\n"
    " if not c:sys.exit(3)\n"
    " b+=c\n"
    "if b[:2]!=b'PK':exec(compile(b,'cockpit-agent','exec'),{'__name__':'__cockpit_agent__'});sys.exit()\n"
    "import io,zipfile\n"
    "z=zipfile.ZipFile(io.BytesIO(b));g={'__name__':'cockpit_agent_boot'}\n"
    "exec(compile(z.read('cockpit_agent/memimport.py'),'cockpit_agent/memimport.py','exec'),g)\n"
    "sys.exit(g['run'](z,sys.argv[2:]))\n"
)
EXIT_TOO_OLD = 4


def agent_modules() -> list[Path]:
    """The modules that run on the host: every module of this package but the operator's own."""
    return sorted(p for p in _HERE.glob("*.py") if p.name not in OPERATOR_ONLY)


@lru_cache(maxsize=None)
def agent_source() -> bytes:
    """The agent as one zip, built in memory: stored (no zlib needed on the host), with fixed
    timestamps so the same source gives the same bytes."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr(zipfile.ZipInfo(PACKAGE + "/__init__.py", (1980, 1, 1, 0, 0, 0)),
                    b'"""gpu-cockpit host agent, imported from memory."""\n')
        for path in agent_modules():
            zf.writestr(zipfile.ZipInfo(PACKAGE + "/" + path.name, (1980, 1, 1, 0, 0, 0)), path.read_bytes())
    return buf.getvalue()


@lru_cache(maxsize=None)
def sim_nvml_source() -> bytes:
    return (_HERE.parent / "sim" / "fakenvml.py").read_bytes()


def agent_argv(python: str, interval: float, sim_state: str | None) -> tuple[list[str], bytes]:
    """The command line that starts the agent and the bytes to write to its stdin first."""
    src = agent_source()
    args = [python, "-u", "-c", BOOTSTRAP, str(len(src)), "--interval", repr(float(interval))]
    payload = src
    if sim_state:
        sim = sim_nvml_source()
        args += ["--sim-state", sim_state, "--sim-nvml", str(len(sim))]
        payload += sim
    return args, payload
