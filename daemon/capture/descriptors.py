"""What capture and apply share of a layer's files: the flags every open of a layer's
folder or file uses, and the hard-link groups found by inode.

A layer is read and written only through folder descriptors opened below its root,
never through a path that a symlink could redirect (snapshot.py reads, apply.py
writes).
"""

from __future__ import annotations

import os

# A folder of a layer: never through a symlink; the descriptor not inherited.
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# A file of a layer, for reading: never through a symlink, and without blocking on a
# FIFO that the agent left there.
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def link_groups(links: dict[str, int]) -> list[list[str]]:
    """Hard-link groups (paths sharing an inode, two or more), each sorted, in order."""
    by_inode: dict[int, list[str]] = {}
    for path, inode in links.items():
        by_inode.setdefault(inode, []).append(path)
    return sorted(sorted(g) for g in by_inode.values() if len(g) > 1)
