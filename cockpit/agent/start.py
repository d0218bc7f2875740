"""The agent's first step, before the rest of it is imported: the process table read once, every
process's CPU time kept, so the first sample's CPU window (`main.FIRST_WINDOW_S`) runs while the
agent loads its modules and opens NVML rather than after."""

import sys

from .guard import site_dirs
from .procs import Procs


def start(argv):
    if sys.flags.no_site:  # started without `site` (-S): its folders, never a .pth (guard.py)
        sys.path.extend(d for d in site_dirs(user=not sys.flags.no_user_site) if d not in sys.path)
    procs = Procs()
    procs.prime()
    from .main import main  # the rest of the agent, loaded inside that window

    return main(argv, procs)
