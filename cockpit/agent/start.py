"""The agent's first step, before the rest of it is imported: the process table read once, every
process's CPU time kept, so the first sample's CPU window (`main.FIRST_WINDOW_S`) runs while the
agent loads its modules and opens NVML rather than after."""

from .procs import Procs


def start(argv):
    procs = Procs()
    procs.prime()
    from .main import main  # the rest of the agent, loaded inside that window

    return main(argv, procs)
