"""Opening a folder by path without following a symlink anywhere on the way.

The agent owns every name in its workspace and, often, folders above it: between two
looks it can swap any of them for a symlink. ``openat2`` (Linux 5.6) resolves a path
under rules the kernel enforces over the whole walk, so what is opened is the folder
the path names, never where a symlink points. A mount is then made onto the opened
folder itself (``/proc/self/fd/N``), not onto a path looked up again (views.py).
"""

from __future__ import annotations

import ctypes
import os

_SYS_OPENAT2 = 437  # the same number on x86_64 and aarch64 (the unified table)
RESOLVE_NO_XDEV, RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS, RESOLVE_BENEATH = 1, 2, 4, 8
_AT_FDCWD = -100


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def openat2(dir_fd: int, path: str, flags: int, resolve: int) -> int:
    """A descriptor of ``path`` (relative to ``dir_fd``) opened with ``flags`` under
    the ``resolve`` rules, or minus the errno."""
    how = _OpenHow(flags | os.O_CLOEXEC, 0, resolve)
    fd = _libc.syscall(ctypes.c_long(_SYS_OPENAT2), ctypes.c_int(dir_fd),
                       ctypes.c_char_p(os.fsencode(path)), ctypes.byref(how),
                       ctypes.c_size_t(ctypes.sizeof(how)))
    return fd if fd >= 0 else -ctypes.get_errno()


def open_folder(path: str, flags: int = os.O_PATH) -> int:
    """The folder at absolute ``path``, reached through no symlink (ELOOP if one is on
    the way) and opened with ``flags``; OSError as ``os.open`` raises them."""
    fd = openat2(_AT_FDCWD, path, flags | os.O_DIRECTORY,
                 RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)
    if fd < 0:
        raise OSError(-fd, f"{path}: {os.strerror(-fd)}")
    return fd


def identity_of(fd: int) -> list[int]:
    """(st_dev, st_ino) of the open descriptor ``fd``, which is closed."""
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    return [st.st_dev, st.st_ino]


def make_folder(path: str, mode: int = 0o755) -> tuple[int, bool]:
    """``os.makedirs(path, exist_ok=True)`` reached through no symlink: each missing
    folder on the way is made in its parent opened so. (An ``O_PATH`` descriptor of
    the folder, whether its last part was made here); OSError ELOOP if a symlink is on
    the way, and nothing is made past it."""
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    made = False
    try:
        for part in filter(None, path.split("/")):
            try:
                os.mkdir(part, mode, dir_fd=fd)
                made = True
            except FileExistsError:
                made = False
            child = openat2(fd, part, os.O_PATH | os.O_DIRECTORY,
                            RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_BENEATH)
            if child < 0:
                raise OSError(-child, f"{path}: {os.strerror(-child)}")
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd, made
