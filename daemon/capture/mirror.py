"""The merged view of a container's layer, watched beside its upper folder.

overlayfs changes a file in the upper folder through the upper name its inode met
first. After ``ln a b; rm a`` in a container, while the overlay's inode is cached (it
is whenever anything has read the file), a change to ``b`` reaches the upper folder
through ``a``'s dentry: inotify reports it in ``a``'s folder under ``a``'s name, or
nowhere if that folder is gone. The same change, made through the container's view,
is reported there under the name the container used. So a container's tracker also
watches, in the merged view, every folder it watches in the upper one, and each of
those events marks its path dirty (the upper folder's events still say what appeared,
moved or went).

The merged view exists only while the container runs, and each start mounts a new
one (``docker restart`` keeps it): the tracker watches it again at the first barrier
that finds it mounted (``WorkspaceTracker._keep_mirror`` says why nothing done
through it before then can be missed).

Folders of the view are opened with ``openat2`` beneath its root, never through a
symlink or into another mount: the agent owns every name in it.
"""

from __future__ import annotations

import errno
import os

from .resolve import (
    RESOLVE_BENEATH,
    RESOLVE_NO_MAGICLINKS,
    RESOLVE_NO_SYMLINKS,
    RESOLVE_NO_XDEV,
    openat2,
)
from .sparse import on_overlayfs

_GONE = {errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EXDEV, errno.EAGAIN}
_BENEATH = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV


def open_beneath(dir_fd: int, rel: str) -> int:
    """An ``O_PATH`` descriptor of folder ``rel`` below ``dir_fd``, or minus the errno."""
    return openat2(dir_fd, rel or ".", os.O_PATH | os.O_DIRECTORY, _BENEATH)


def remember(wds: dict[str, int], paths: dict[int, str],
             watches: list[tuple[str, int]]) -> None:
    """Each watch ``wd`` is folder ``rel``, in both maps (a tracker's and its mirror's):
    a watch that another folder at the same path had before is forgotten."""
    for rel, wd in watches:
        old = wds.get(rel)
        if old is not None and old != wd and paths.get(old) == rel:
            del paths[old]
        wds[rel] = wd
        paths[wd] = rel


class MergedMirror:
    """The watches on one container's merged view: ``wd -> folder`` and back. Its
    tracker guards it with its own lock; watches are added with the monitor's held."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.live = False  # watched, on the mount now there
        self.broken = ""  # a watch that could not be added for want of room: why
        self.paths: dict[int, str] = {}
        self.wds: dict[str, int] = {}

    def open_mounted(self) -> int | None:
        """A descriptor of the view's root while it is mounted, else None."""
        try:
            fd = os.open(self.root, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        if on_overlayfs(fd):
            return fd
        os.close(fd)
        return None

    def watch(self, add, root_fd: int, rels: list[str]) -> list[tuple[str, int]]:
        """Watch folder ``rel`` of the view for each of ``rels`` that is a folder there
        (``add(path) -> wd or -errno``); returns the new ``(rel, wd)``. A folder gone
        or swapped for a symlink is left: the upper folder's events say so."""
        added = []
        for rel in rels:
            fd = open_beneath(root_fd, rel)
            if fd < 0:
                if -fd not in _GONE:
                    self.broken = f"{self.root}/{rel}: {os.strerror(-fd)}"
                continue
            try:
                wd = add(f"/proc/self/fd/{fd}")
            finally:
                os.close(fd)
            if wd >= 0:
                added.append((rel, wd))
            elif -wd not in _GONE:
                self.broken = f"{self.root}/{rel}: {os.strerror(-wd)}"
        return added

    def known(self, watches: list[tuple[str, int]]) -> None:
        remember(self.wds, self.paths, watches)

    def forget(self, wd: int) -> None:
        rel = self.paths.pop(wd, None)
        if rel is not None and self.wds.get(rel) == wd:
            del self.wds[rel]
        if rel == "":
            self.live = False  # the view's root: only an unmount ends its watch

    def below(self, rel: str) -> list[int]:
        """Forget and return the watches of ``rel`` and every folder below it."""
        prefix = rel + "/"
        doomed = [wd for wd, p in self.paths.items() if p == rel or p.startswith(prefix)]
        for wd in doomed:
            self.forget(wd)
        return doomed

    def clear(self) -> list[int]:
        doomed = list(self.paths)
        self.paths, self.wds, self.live = {}, {}, False
        return doomed
