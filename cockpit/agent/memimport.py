"""Imports the agent's modules from the zip the bootstrap read from stdin, in memory. zipimport
needs a file, and the agent writes nothing on the host: no file, no folder, no __pycache__.
The bootstrap executes this module's source itself and calls `run`."""

import importlib.abc
import importlib.util
import sys

PACKAGE = "cockpit_agent"
ORIGIN = "<cockpit-agent>/"


class ZipImporter(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """A meta-path finder and loader over an in-memory zipfile.ZipFile: the package and its
    modules, nothing else (every other import goes to the host's own Python)."""

    def __init__(self, zf):
        self.zf = zf
        self.names = set(zf.namelist())

    def _path(self, fullname):
        base = fullname.replace(".", "/")
        for path in (base + "/__init__.py", base + ".py"):
            if path in self.names:
                return path
        return None

    def find_spec(self, fullname, path=None, target=None):
        found = self._path(fullname)
        if found is None:
            return None
        return importlib.util.spec_from_loader(fullname, self, origin=ORIGIN + found,
                                               is_package=found.endswith("/__init__.py"))

    def create_module(self, spec):
        return None  # the default module

    def exec_module(self, module):
        found = self._path(module.__name__)
        exec(compile(self.zf.read(found), ORIGIN + found, "exec"), module.__dict__)

    def get_source(self, fullname):
        """For tracebacks: linecache asks the module's loader for its source."""
        found = self._path(fullname)
        return None if found is None else self.zf.read(found).decode("utf-8")


def run(zf, argv):
    """Makes the zip importable and runs the agent's main; its exit status."""
    sys.meta_path.insert(0, ZipImporter(zf))
    main = importlib.import_module(PACKAGE + ".main")
    return main.main(argv)
