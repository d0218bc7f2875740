"""asyncssh, imported without its slowest step when that step cannot find anything.

On import, asyncssh looks for liboqs (post-quantum key exchange) with ctypes.util.find_library,
which on Linux runs `ldconfig -p` and maybe gcc and ld as subprocesses: ~25 ms of a ~140 ms import,
paid by every `cockpit` that connects over SSH. Where liboqs cannot be loaded anyway (not in the
loader's cache, not in LD_LIBRARY_PATH, not in the default folders: dlopen would not find it) that
search is answered "not found" at once; anywhere else (another OS, liboqs present, or no way to
tell) asyncssh searches as it always does. What asyncssh offers is the same either way.

cryptography deprecates algorithms that asyncssh still names (DSA since cryptography 51): its
CryptographyDeprecationWarning, raised from asyncssh's modules, would land on the operator's stderr
above every one-line error. It says nothing an operator can act on, so it is kept off.
"""

from __future__ import annotations

import ctypes.util
import os
import sys
import warnings

from cryptography.utils import CryptographyDeprecationWarning

_OQS = ("oqs", "liboqs")
_DEFAULT_DIRS = ("/lib", "/usr/lib", "/lib64", "/usr/lib64")


def liboqs_may_exist() -> bool:
    if not sys.platform.startswith("linux"):
        return True
    try:
        with open("/etc/ld.so.cache", "rb") as fh:
            if b"liboqs" in fh.read():
                return True
    except OSError:
        return True  # no cache to read: ask ctypes, as asyncssh does
    for folder in [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d] + list(_DEFAULT_DIRS):
        try:
            if any(name.startswith("liboqs") for name in os.listdir(folder)):
                return True
        except OSError:
            continue
    return False


def _import():
    if "asyncssh" in sys.modules or liboqs_may_exist():
        import asyncssh

        return asyncssh
    real = ctypes.util.find_library

    def find_library(name):
        return None if name in _OQS else real(name)

    ctypes.util.find_library = find_library
    try:
        import asyncssh
    finally:
        ctypes.util.find_library = real
    return asyncssh


warnings.filterwarnings("ignore", category=CryptographyDeprecationWarning, module=r"asyncssh(\.|$)")
asyncssh = _import()

__all__ = ["asyncssh", "liboqs_may_exist"]
