"""Making a name durable: an fsync of a file makes its bytes and size durable, not the
folder entry that names it (ext4 without a journal, for one, leaves a new name to the
folder's own write-back). Whoever makes a file that an acknowledgement depends on
fsyncs its folder once."""

from __future__ import annotations

import os


def fsync_folder(path: str) -> None:
    """fsync the folder at ``path`` (its entries: names made, renamed or removed)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
