"""Imports the agent's modules from the table the bootstrap read from stdin, in memory: no file, no
folder, no __pycache__ on the host. The bootstrap executes this module itself and calls `run`.
Only what every Python has built in is used here (`importlib.machinery` is part of the import
system already loaded), so the agent's start costs no import of its own."""

import importlib.machinery
import marshal
import sys

PACKAGE = "cockpit_agent"
ORIGIN = "<cockpit-agent>/"


class TableImporter:
    """A meta-path finder and loader over {module: source} and, where the cockpit sent them for
    this very Python, {module: marshalled code}: the package and its modules, nothing else (every
    other import goes to the host's own Python)."""

    def __init__(self, sources, code):
        self.sources = sources
        self.code = code

    def _name(self, fullname):
        if fullname == PACKAGE:
            return ""
        if fullname.startswith(PACKAGE + ".") and fullname[len(PACKAGE) + 1 :] in self.sources:
            return fullname[len(PACKAGE) + 1 :]
        return None

    def find_spec(self, fullname, path=None, target=None):
        name = self._name(fullname)
        if name is None:
            return None
        return importlib.machinery.ModuleSpec(
            fullname, self, origin=ORIGIN + fullname.replace(".", "/") + ".py", is_package=name == ""
        )

    def create_module(self, spec):
        return None  # the default module

    def exec_module(self, module):
        name = self._name(module.__name__)
        if not name:
            return  # the package itself: nothing to run
        code = self.code.get(name)
        if code is not None:
            code = marshal.loads(code)
        else:
            code = compile(self.sources[name], module.__spec__.origin, "exec", dont_inherit=True)
        exec(code, module.__dict__)

    def get_source(self, fullname):
        """For tracebacks: linecache asks the module's loader for its source."""
        name = self._name(fullname)
        return None if not name else self.sources[name].decode("utf-8")


def run(sources, code, argv):
    """Makes the table importable and runs the agent from its first step (start.py); its exit
    status."""
    sys.meta_path.insert(0, TableImporter(sources, code))
    start = __import__(PACKAGE + ".start", fromlist=["start"])
    return start.start(argv)
