"""Paths opened with no symbolic link followed in any component: a user who owns a folder above a
log (or plants a link there) cannot point root's open at another file. openat2 with
RESOLVE_NO_SYMLINKS where the kernel has it (Linux >= 5.6, through ctypes), else a walk from `/`
(or the working folder for a relative path), one folder at a time with O_NOFOLLOW|O_DIRECTORY.
The first symbolic link met is named in the refusal."""

import errno
import os

RESOLVE_NO_SYMLINKS = 0x04
_OPENAT2 = {"x86_64": 437, "aarch64": 437}  # the syscall's number; elsewhere the walk
_AT_FDCWD = -100
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_state = {"openat2": None}  # the ctypes call once made, or False where the kernel lacks it


def _openat2():
    call = _state["openat2"]
    if call is None:
        call = False
        number = _OPENAT2.get(os.uname().machine)
        if number is not None:
            try:
                import ctypes

                class OpenHow(ctypes.Structure):
                    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]

                libc = ctypes.CDLL(None, use_errno=True)
                libc.syscall.restype = ctypes.c_long

                tmpfile = getattr(os, "O_TMPFILE", 0)  # it includes O_DIRECTORY's bit

                def call(path, flags, mode):
                    creates = flags & os.O_CREAT or (tmpfile and flags & tmpfile == tmpfile)
                    how = OpenHow(flags, mode if creates else 0, RESOLVE_NO_SYMLINKS)  # EINVAL with a mode else
                    fd = libc.syscall(
                        ctypes.c_long(number),
                        ctypes.c_int(_AT_FDCWD),
                        ctypes.c_char_p(path),
                        ctypes.byref(how),
                        ctypes.c_size_t(ctypes.sizeof(how)),
                    )
                    if fd < 0:
                        return -ctypes.get_errno()
                    return fd
            except (OSError, AttributeError, ImportError):
                call = False
        _state["openat2"] = call
    return call


def _refusal(shown, last):
    return OSError(
        errno.ELOOP,
        "is a symbolic link: not followed" if last else "its folder %s is a symbolic link: not followed" % shown,
    )


def _is_link(name, dfd):
    import stat

    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _walk(path, flags, mode, make_dirs):
    """The open, one component at a time from `/` (or "."), each folder opened O_NOFOLLOW; with
    `make_dirs`, a missing folder is made 0700 on the way."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if not parts:
        return os.open(path, flags | os.O_NOFOLLOW, mode)
    root = "/" if path.startswith("/") else "."
    dfd = os.open(root, _DIR)
    shown = root.rstrip("/")
    try:
        for name in parts[:-1]:
            shown += "/" + name
            try:
                nfd = os.open(name, _DIR, dir_fd=dfd)
            except FileNotFoundError:
                if not make_dirs:
                    raise
                try:
                    os.mkdir(name, 0o700, dir_fd=dfd)
                except FileExistsError:
                    pass
                nfd = os.open(name, _DIR, dir_fd=dfd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link(name, dfd):
                    raise _refusal(shown, False) from None
                raise
            os.close(dfd)
            dfd = nfd
        try:
            return os.open(parts[-1], flags | os.O_NOFOLLOW, mode, dir_fd=dfd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link(parts[-1], dfd):
                raise _refusal(path, True) from None
            raise
    finally:
        os.close(dfd)


def open_nofollow(path, flags, mode=0o666, make_dirs=False):
    """os.open(path, flags, mode) with no symbolic link in any component (O_NOFOLLOW for the last
    one too), close-on-exec. OSError(ELOOP) names the link met: "is a symbolic link: not
    followed" for the file itself, "its folder F is a symbolic link: not followed" above it.
    With `make_dirs`, missing folders are made 0700 by the walk (never through a link)."""
    flags |= os.O_CLOEXEC
    call = None if make_dirs else _openat2()
    if call:
        fd = call(os.fsencode(path), flags | os.O_NOFOLLOW, mode)
        if fd >= 0:
            return fd
        if -fd not in (errno.ENOSYS, errno.E2BIG, errno.EPERM, errno.ELOOP, errno.ENOTDIR, errno.EXDEV):
            raise OSError(-fd, os.strerror(-fd), path)
        if -fd == errno.ENOSYS:
            _state["openat2"] = False  # an older kernel (or a seccomp filter): the walk from now on
    return _walk(path, flags, mode, make_dirs)  # also the one that names the link met
