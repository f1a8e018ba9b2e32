"""Sparse files: stored as their data extents, restored with their holes.

A file with a hole (its allocated blocks fall short of its size, and the file system
finds a hole before its end) is read extent by extent (``SEEK_DATA``/``SEEK_HOLE``):
holes are never read, hashed or stored. Every hole counts, however small: a file
restored with its holes filled would take more of the disk than it did.
Its tree entry is of kind ``sparse``; the entry's ref names an *extent map*, a blob of
canonical JSON ``{"size": N, "pieces": [[offset, length, digest], ...]}`` whose pieces
(at most ``PIECE`` bytes each, so every piece is an ordinary small blob the pack can
delta and dedupe) cover the file's data in order. A restore truncates the new file to
its size and writes the pieces at their offsets, so every hole is a hole again.

Through an overlay mount (a fork's workspace), changing a file of a lower layer, its
metadata or a hard link to it, makes the kernel copy it up whole, in 1 MiB chunks: a
chunk with any data in it is copied dense, so holes within it fill. A restore there
writes such a file again rather than touching it (``on_overlayfs``, apply.py).
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import struct
from collections.abc import Iterator

from worldline.wire.errors import DataLoss

from ..storage.blob_store import BlobStore

PIECE = 4 << 20
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


def capture(fd: int, size: int, blobs: BlobStore, persist: bool,
            budget=None) -> tuple[str, int]:
    """Store the file open at ``fd`` as pieces and a map; returns the map's digest and the
    bytes of data read. ``budget(n)`` is told of each piece's bytes before it is read
    (and may refuse, raising)."""
    pieces = []
    data_bytes = 0
    for start, length in extents(fd, size):
        for offset in range(start, start + length, PIECE):
            n = min(PIECE, start + length - offset)
            if budget is not None:
                budget(n)
            data = os.pread(fd, n, offset)
            if len(data) < n:
                n = len(data)  # the file shrank while we read: what was there
            pieces.append([offset, n, blobs.put_bytes(data) if persist else blobs.address(data)])
            data_bytes += n
    body = json.dumps({"pieces": pieces, "size": size}, sort_keys=True,
                      separators=(",", ":")).encode()
    return (blobs.put_bytes(body) if persist else blobs.address(body)), data_bytes


def read_map(blobs: BlobStore, digest: str) -> tuple[int, list[tuple[int, int, str]]]:
    try:
        body = json.loads(blobs.read_bytes(digest))
        return int(body["size"]), [(int(o), int(n), str(d)) for o, n, d in body["pieces"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise DataLoss(f"extent map {digest} is malformed: {exc}") from None


def pieces(blobs: BlobStore, digest: str) -> list[str]:
    """The digests an extent map names (for garbage collection and verification)."""
    return [d for _, _, d in read_map(blobs, digest)[1]]


def write(fd: int, blobs: BlobStore, digest: str) -> int:
    """Write the sparse file ``digest`` into the empty file open at ``fd``; returns the
    bytes of data written."""
    size, parts = read_map(blobs, digest)
    os.ftruncate(fd, size)
    written = 0
    for offset, length, piece in parts:
        data = blobs.read_bytes(piece)
        if len(data) != length:
            raise DataLoss(f"extent map {digest}: piece {piece} has {len(data)} bytes,"
                           f" not {length}")
        view = memoryview(data)
        while view:
            n = os.pwrite(fd, view, offset)
            view, offset = view[n:], offset + n
        written += length
    return written
