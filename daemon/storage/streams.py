"""A blob's bytes through file descriptors: read in chunks within a limit, written
whole, and a full disk told apart from other errors (blobs.py, snapshot.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator

from worldline.wire.errors import ResourceExhausted

from .blob_store import DestinationFull, Overread
from .durable import out_of_space

CHUNK = 1 << 20


def disk_full(exc: OSError, kind: type[ResourceExhausted] = ResourceExhausted) -> Exception:
    """The error to raise for an OSError: a full disk becomes ResourceExhausted (for the
    store's own files) or DestinationFull (for the file a blob is copied to)."""
    if out_of_space(exc):
        where = "where the blob is copied to" if kind is DestinationFull else "for blobs"
        return kind(f"no space left {where}: {exc.strerror}")
    return exc


def file_chunks(fd: int, limit: int | None = None) -> Iterator[bytes]:
    """The file open at ``fd`` from its start, in chunks (pread: its offset is
    untouched); past ``limit`` bytes, Overread, one byte past it at the most."""
    offset = 0
    while chunk := os.pread(fd, within(CHUNK, offset, limit), offset):
        offset += len(chunk)
        if limit is not None and offset > limit:
            raise Overread(limit)
        yield chunk


def within(n: int, got: int, limit: int | None) -> int:
    """A read of ``n`` bytes cut to one past ``limit`` (``got`` read so far): enough to
    tell a file that holds more than ``limit`` bytes."""
    return n if limit is None else min(n, limit + 1 - got)


def write_all(fd: int, data: bytes) -> None:
    """os.write until every byte is written (a write may take fewer)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def discard(fd: int, tmp: str) -> None:
    try:
        os.close(fd)
    except OSError:
        pass
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
