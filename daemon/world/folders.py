"""A layer's root folder, reached through no symlink and checked by identity.

An agent may own the folders above its workspace and swap one for a symlink at any
moment: every capture, restore and fork opens a layer's root only if it is still the
folder (st_dev, st_ino) its session recorded, and a folder the daemon made and must
remove again is removed only if it is still the one it made.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import stat
import time

from worldline.wire.errors import FailedPrecondition, NotFound

from ..capture.layers import WORKSPACE, Layer
from ..capture.resolve import identity_of, open_folder
from ..owners import Agent

log = logging.getLogger(__name__)


def open_layer_root(kind: str, path: str, identity: list | None) -> int:
    """A descriptor of a layer's root folder, refused (FAILED_PRECONDITION, nothing read
    or written) when the path no longer leads to the folder whose identity
    (st_dev, st_ino) was recorded: moved, deleted, or a parent swapped for a symlink."""
    what = _what(kind)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise FailedPrecondition(f"{what} {path} does not exist") from None
    except NotADirectoryError:
        raise FailedPrecondition(f"{what} {path} is not a folder") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise FailedPrecondition(f"{what} {path} has been replaced by a symlink") from None
        raise
    if identity is not None:
        st = os.fstat(fd)
        if [st.st_dev, st.st_ino] != list(identity):
            os.close(fd)
            raise FailedPrecondition(
                f"{what} {path} is no longer the folder this session was created on (it was"
                " moved or replaced, or a folder above it was swapped for a symlink):"
                " nothing was read or written")
    return fd


def folder_identity(kind: str, path: str) -> list[int]:
    """(st_dev, st_ino) of a layer's root folder, reached through no symlink: the
    identity its session checks it against (``open_layer_root``). A symlink on the way
    is FAILED_PRECONDITION."""
    try:
        return identity_of(open_folder(path))
    except FileNotFoundError:
        raise NotFound(f"{_what(kind)} {path} does not exist") from None
    except OSError as exc:
        raise symlink_refused(kind, path, exc) from None


def existing_identity(path: str) -> list[int] | None:
    """(st_dev, st_ino) of the folder at ``path`` reached through no symlink; None if
    there is none (or it cannot be reached so)."""
    try:
        return identity_of(open_folder(path))
    except OSError:
        return None


def root_identity(layer: Layer) -> list[int]:
    """The identity a layer's root is checked against: a workspace's through no symlink
    (the agent may own folders above it); a container layer's as the engine names it
    (its folders are the engine's, and its data root may be reached through a symlink
    of the operator's)."""
    if layer.kind == WORKSPACE:
        return folder_identity(WORKSPACE, layer.path)
    st = os.lstat(layer.path)
    return [st.st_dev, st.st_ino]


def shows_another(want: list[int] | None, seen: list[int] | None) -> bool:
    """Whether a container's bind of the workspace (``seen``: bind_identity_of) shows
    another folder than the one recorded for the session (``want``); not when either
    is unknown (nothing recorded yet, or no bind, or not running)."""
    return want is not None and seen is not None and seen != want


def symlink_refused(kind: str, path: str, exc: OSError) -> Exception:
    """What an OSError met reaching a layer's folder through no symlink means: a symlink
    (or a file) on the way is FAILED_PRECONDITION; anything else is itself."""
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return FailedPrecondition(f"{_what(kind)} {path}: a folder on the way is a symlink"
                                  " (swapped for one?); nothing was read or written")
    return exc


def remove_folder(path: str, identity: list[int] | None = None) -> None:
    """Remove the folder ``path`` (one a failed fork or take-over made), from its parent
    reached through no symlink (one there now: nothing is removed). ``identity``: the
    (st_dev, st_ino) it was made with; another folder there now (swapped in by an agent
    that writes the parent) is left alone, and what is removed is emptied through the
    descriptor checked."""
    try:
        parent = open_folder(os.path.dirname(path))
    except OSError:
        return
    name = os.path.basename(path)
    try:
        if identity is None:
            shutil.rmtree(name, ignore_errors=True, dir_fd=parent)
            return
        try:
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                         dir_fd=parent)
        except OSError:
            return
        try:
            if identity_of(os.dup(fd)) != list(identity):
                log.warning("%s is no longer the folder made there: left as it is", path)
                return
            for child in os.listdir(fd):  # (rmtree opens what it is given: a FIFO
                with contextlib.suppress(OSError):  # would block it)
                    if stat.S_ISDIR(os.stat(child, dir_fd=fd, follow_symlinks=False).st_mode):
                        shutil.rmtree(child, ignore_errors=True, dir_fd=fd)
                    else:
                        os.unlink(child, dir_fd=fd)
        finally:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.rmdir(name, dir_fd=parent)
    finally:
        os.close(parent)


def contains(outer: str, inner: str) -> bool:
    """Whether the path ``inner`` is ``outer`` or lies inside it."""
    return inner == outer or inner.startswith(outer.rstrip(os.sep) + os.sep)


def not_available(path: str, agent: Agent) -> str:
    """What an allowed user is told of a folder that is another's (a session's it cannot
    see, the daemon's data): that it is not available, naming nothing of anyone else."""
    return f"workspace {path} is not available to an allowed user ({agent})"


def clock(seconds: float) -> str:
    """A lease's end as UTC time, for messages."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def _what(kind: str) -> str:
    return "workspace" if kind == WORKSPACE else "container layer"
