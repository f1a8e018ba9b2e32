"""The temporaries a write aside left in a layer when the daemon died between writing
and renaming, found and removed (``WorkspaceSnapshotter.remove_leftovers``, when an
interrupted restore is completed): only a file, or a staging folder of the daemon's
own, under a temporary's name; never anything an exclusion keeps, nor a folder of
anyone else's given such a name.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat as st_

from . import exclude
from .descriptors import DIR_FLAGS as _DIR_FLAGS
from .tracker import TEMP_PREFIX
from .tree_scan import too_deep
from .walk import MAX_DEPTH, folders_below, join_path


def remove_below(root_fd: int, excluded: exclude.Exclusions | None) -> list[str]:
    """Remove every leftover temporary below the folder open at ``root_fd`` but what
    ``excluded`` keeps (its folders never entered); returns their paths."""
    removed: list[str] = []
    skip = (lambda rel: excluded(rel, True)) if excluded is not None else None
    try:
        for fd, rel, entries in folders_below(root_fd, MAX_DEPTH, skip=skip):
            for de in entries:
                path = join_path(rel, de.name)
                if de.name.startswith(TEMP_PREFIX) and _ours_to_remove(fd, de.name) and (
                        excluded is None or not excluded(
                            path, de.is_dir(follow_symlinks=False))):
                    _remove(fd, de.name)
                    removed.append(path)
    except RecursionError as exc:
        raise too_deep(str(exc)) from None
    return removed


def _remove(dfd: int, name: str) -> None:
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if st_.S_ISDIR(st.st_mode):
        try:
            _make_tree_writable(dfd, name)
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            os.unlink(name, dir_fd=dfd)  # swapped for a symlink or file since the stat
            return
        shutil.rmtree(name, dir_fd=dfd)
    else:
        os.unlink(name, dir_fd=dfd)


def _ours_to_remove(dfd: int, name: str) -> bool:
    """Whether a temporary name is a write's leftover to remove: a file, or a staging
    folder (the daemon's own, 0700: the agent can neither make one nor move one of
    another folder's in); never a folder of anyone else's given a temporary's name."""
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return not st_.S_ISDIR(st.st_mode) or (
        st.st_uid == os.geteuid() and not st_.S_IMODE(st.st_mode) & 0o077)


def _make_tree_writable(dfd: int, name: str) -> None:
    """Give the owner rwx on every folder below ``name`` so a non-root daemon can empty it."""
    def writable(fd: int, _rel: str) -> None:
        os.fchmod(fd, os.fstat(fd).st_mode & 0o7777 | 0o700)

    sub = os.open(name, _DIR_FLAGS, dir_fd=dfd)
    try:
        for _ in folders_below(sub, MAX_DEPTH, writable):
            pass
    except RecursionError as exc:
        raise too_deep(join_path(name, str(exc))) from None
    finally:
        os.close(sub)
