"""The data root's reserve: room kept aside so that a daemon can start on a full disk.

Every start opens SQLite files whose write-ahead log and shared-memory index are made
anew (a clean stop removes them), and writes a little; on a file system with no room
left that fails ("disk I/O error"), and a daemon that cannot start cannot be asked to
free space either (`worldline gc` goes through it). So the data root holds a file of
``SIZE`` allocated bytes, ``reserve``, made at a start when there is room for it twice
over. A start that finds less than ``SIZE`` free removes it first, and says so: the
daemon then starts with that room, reads and restores answer, `gc` can free space, and
checkpoints stop at ``--min-free-bytes`` as ever (which counts the reserve as free:
``room``). Once there is room for it twice over again (the operator freed space), the
daemon's housekeeping makes it again while serving (``renew``), as the next start
would.
"""

from __future__ import annotations

import errno
import logging
import os

log = logging.getLogger(__name__)

NAME = "reserve"
SIZE = 16 << 20


def free_bytes(path: str) -> int:
    """Free bytes of the file system holding ``path``, for an unprivileged writer."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def room(root: str) -> int:
    """The data root's free bytes with its reserve counted as free: it is held for the
    daemon, so ``--min-free-bytes`` means what it says whether or not one is kept."""
    return free_bytes(root) + _held(os.path.join(root, NAME))


def settle(root: str) -> str | None:
    """At start, before anything is opened: free the reserve if the file system is full,
    else make it if there is room; a line for the log when it was freed, else None."""
    path = os.path.join(root, NAME)
    free = free_bytes(root)
    if free < SIZE:
        held = _held(path)
        if not held:
            return None
        os.unlink(path)
        return (f"the data root's file system had {free} bytes free: its reserve of"
                f" {held} bytes was freed so the daemon could start; free space there"
                " (`worldline gc`, or outside worldline) and the daemon keeps a reserve"
                " again")
    _keep(root)
    return None


def renew(root: str) -> bool:
    """While serving: make the reserve again if it is missing and the file system has
    room for it twice over (a start on a full disk freed it, and space was freed
    since). True if it was made."""
    if not _keep(root):
        return False
    log.warning("the data root's reserve of %d bytes is kept again", SIZE)
    return True


_CANNOT: set[str] = set()  # data roots whose file system cannot allocate a reserve


def _keep(root: str) -> bool:
    """Make the reserve if it is missing and there is room for it twice over; True if
    it was made. A file system that cannot allocate one is asked once per process."""
    path = os.path.join(root, NAME)
    if root in _CANNOT or _held(path) >= SIZE or free_bytes(root) < 2 * SIZE:
        return False
    refused = _make(path)
    if refused in (errno.EOPNOTSUPP, errno.EINVAL):
        _CANNOT.add(root)
    return refused == 0


def _held(path: str) -> int:
    """The bytes the reserve at ``path`` holds allocated (0: none)."""
    try:
        return os.stat(path).st_blocks * 512
    except FileNotFoundError:
        return 0


def _make(path: str) -> int:
    """Allocate the reserve at ``path``: 0, or the errno with which the file system
    refused (and a warning): no room after all (ENOSPC), or no allocation of a file's
    blocks at all."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        os.posix_fallocate(fd, 0, SIZE)
        os.fsync(fd)
    except OSError as exc:
        os.close(fd)
        os.unlink(path)
        if exc.errno not in (errno.ENOSPC, errno.EOPNOTSUPP, errno.EINVAL):
            raise
        log.warning("no reserve kept in the data root: %s", exc.strerror)
        return exc.errno
    os.close(fd)
    return 0
