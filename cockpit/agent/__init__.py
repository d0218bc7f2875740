"""What travels to the GPU host: the agent's source and the simulated NVML's, read as bytes."""

from functools import lru_cache
from pathlib import Path

from cockpit.agent import agent as protocol  # noqa: F401  (the frame schema's one home)

_HERE = Path(__file__).resolve().parent

# Reads exactly N bytes of agent source from stdin (unbuffered, so the commands that follow stay
# in the pipe for the agent), checks the Python version and runs the agent from memory.
BOOTSTRAP = (
    "import os,sys\n"
    "if sys.version_info<(3,8):sys.stderr.write('gpu-cockpit: Python %d.%d is too old, need >= 3.8\\n'%sys.version_info[:2]);sys.exit(4)\n"
    "n=int(sys.argv[1]);b=b''\n"
    "while len(b)<n:\n"
    " c=os.read(0,n-len(b))\n"
    " if not c:sys.exit(3)\n"
    " b+=c\n"
    "exec(compile(b,'cockpit-agent','exec'),{'__name__':'__cockpit_agent__'})\n"
)
EXIT_TOO_OLD = 4


@lru_cache(maxsize=None)
def agent_source() -> bytes:
    return (_HERE / "agent.py").read_bytes()


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
