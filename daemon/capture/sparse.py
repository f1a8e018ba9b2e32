"""Sparse files: stored as their data extents, restored with their holes.

A file with a hole (its allocated blocks fall short of its size, and the file system
finds a hole before its end) is read extent by extent (``SEEK_DATA``/``SEEK_HOLE``):
holes are never read, hashed or stored. Every hole counts, however small: a file
restored with its holes filled would take more of the disk than it did.
Such a file is stored as content-defined chunks of its data runs, as a big file is
(chunks.py: kind ``chunked``). Older data roots hold entries of kind ``sparse``, whose
ref names an *extent map*, canonical JSON ``{"size": N, "pieces": [[offset, length,
digest], ...]}`` of 4 MiB pieces; ``chunks.read_map`` reads both. A restore truncates
the new file to its size and writes the pieces at their offsets, so every hole is a
hole again.

Through an overlay mount (a fork's workspace), changing a file of a lower layer, its
metadata or a hard link to it, makes the kernel copy it up whole, in 1 MiB chunks: a
chunk with any data in it is copied dense, so holes within it fill. A restore there
writes such a file again rather than touching it (``on_overlayfs``, apply.py).
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from collections.abc import Iterator

OVERLAYFS_SUPER_MAGIC = 0x794C7630

_libc = ctypes.CDLL(None, use_errno=True)


def on_overlayfs(fd: int) -> bool:
    """Whether the file or folder open at ``fd`` is on an overlay mount (fstatfs(2))."""
    buf = ctypes.create_string_buffer(256)  # struct statfs; f_type is its first field
    if _libc.fstatfs(fd, buf) != 0:
        return False
    return struct.unpack_from("l", buf)[0] == OVERLAYFS_SUPER_MAGIC


def is_sparse(fd: int, st: os.stat_result) -> bool:
    """Whether the file open at ``fd`` (``st`` its stat) has a hole. Its allocation
    falling short of its size says it may (a file with none never does); the file
    system's first hole before the end says it does (a compressing one allocates less
    than the size without any hole). Leaves the file's offset at 0."""
    if st.st_blocks * 512 >= st.st_size:
        return False
    try:
        return os.lseek(fd, 0, os.SEEK_HOLE) < st.st_size
    except OSError:  # no SEEK_HOLE here: the file is read whole
        return False
    finally:
        os.lseek(fd, 0, os.SEEK_SET)


def extents(fd: int, size: int) -> Iterator[tuple[int, int]]:
    """(offset, length) of each run of data, in order; the whole file where the file
    system cannot tell data from holes."""
    offset = 0
    while offset < size:
        try:
            start = os.lseek(fd, offset, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # nothing but a hole up to the end
                return
            if exc.errno == errno.EINVAL:  # no SEEK_DATA here: all of it is data
                yield offset, size - offset
                return
            raise
        end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
        if end > start:
            yield start, end - start
        offset = end
