"""Making a name durable: an fsync of a file makes its bytes and size durable, not the
folder entry that names it (ext4 without a journal, for one, leaves a new name to the
folder's own write-back). Whoever makes a file that an acknowledgement depends on
fsyncs its folder once."""

from __future__ import annotations

import contextlib
import errno
import os

NO_SPACE = (errno.ENOSPC, errno.EDQUOT)  # a full file system, or the owner's quota


def out_of_space(exc: BaseException) -> bool:
    """Whether ``exc`` says a write found no space left (a full disk or a quota)."""
    return isinstance(exc, OSError) and exc.errno in NO_SPACE


def fsync_folder(path: str) -> None:
    """fsync the folder at ``path`` (its entries: names made, renamed or removed)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_file(path: str, text: str | bytes) -> None:
    """``text`` in the file at ``path``, whole or not at all, and durable with its name:
    written aside, fsynced, renamed over ``path``, its folder fsynced. A failure leaves
    no temporary behind."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(text.encode() if isinstance(text, str) else text)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_folder(os.path.dirname(path) or ".")
