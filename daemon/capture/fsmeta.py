"""File metadata: what a capture reads of each entry besides its content, and how a
restore gives it back.

Everything here works on descriptors the caller opened with ``O_NOFOLLOW`` (or on a
single name inside such a folder, never following it), so no path an agent controls is
ever resolved through a symlink.

Applying an entry's metadata goes in the one order that cannot lose any of it:
owner (``fchown`` clears setuid, setgid and file capabilities), then mode, then xattrs
(ACLs are the ``system.posix_acl_*`` xattrs; setting the access ACL sets the mode's
group bits, as it did when it was captured), then the modification time (nothing after
it may touch the entry). When the owner cannot be set (the daemon is not root, or the
id is not mapped in this namespace) the setuid and setgid bits of a non-folder are
dropped: a restore never makes a privileged file on anyone's behalf.
"""

from __future__ import annotations

import errno
import os
import stat as st_

from worldline.wire.errors import ResourceExhausted

from .limits import human
from .trees import Entry, make_extra

# The overlay's own markers are recorded as entry kinds (whiteout, opaque), never as
# xattrs: copying them would corrupt the engine's view of a layer.
_PRIVATE_PREFIXES = ("trusted.overlay.", "user.overlay.")
PRIVILEGE_BITS = st_.S_ISUID | st_.S_ISGID
# The most bytes of extended attributes (names and values) one entry may carry. The
# kernel bounds a value (64 KiB) and the list of names (64 KiB), not their number: on
# XFS or btrfs one file may carry hundreds of megabytes, which a capture would hold in
# memory and write into its folder's tree, once per version of the folder.
MAX_XATTR_BYTES = 64 << 10


def _keep(name: str) -> bool:
    return not name.startswith(_PRIVATE_PREFIXES)


def xattr_names(target: int | str) -> list[str]:
    """The names of an entry's xattrs (an open descriptor, or a ``/proc/self/fd/N/name``
    path, whose last component is not followed) but the overlay's markers."""
    try:
        names = os.listxattr(target, follow_symlinks=isinstance(target, int))
    except OSError as exc:
        if exc.errno in (errno.ENOTSUP, errno.ENOENT, errno.EPERM, errno.EACCES):
            return []
        raise
    return [name for name in names if _keep(name)]


def xattr_value(target: int | str, name: str) -> bytes | None:
    """One xattr's value (None: gone meanwhile)."""
    try:
        return os.getxattr(target, name, follow_symlinks=isinstance(target, int))
    except OSError as exc:
        if exc.errno not in (errno.ENODATA, errno.ENOTSUP):
            raise
        return None


def read_xattrs(target: int | str, path: str = "") -> dict[str, bytes]:
    """Every xattr of an entry (as ``xattr_names``), for a capture: past
    ``MAX_XATTR_BYTES`` RESOURCE_EXHAUSTED names ``path``, having read no more than that
    (and one value)."""
    out, total = {}, 0
    for name in xattr_names(target):
        value = xattr_value(target, name)
        if value is None:
            continue
        total += len(name.encode()) + len(value)
        if total > MAX_XATTR_BYTES:
            raise ResourceExhausted(
                f"{path or 'the layer root'} carries more than {human(MAX_XATTR_BYTES)}"
                " of extended attributes (names and values), past the most one entry may"
                " carry: remove some")
        out[name] = value
    return out


def at(dfd: int, name: str) -> str:
    """A path naming ``name`` inside the open folder ``dfd``, for the calls that take no
    ``dir_fd`` (xattrs of symlinks and special files): the folder is reached through its
    descriptor and the last component is never followed."""
    return f"/proc/self/fd/{dfd}/{name}"


def entry_of(kind: str, st: os.stat_result | tuple, ref: str = "", size: int = 0,
             xattrs: dict[str, bytes] | None = None, rdev: int | None = None,
             links: str = "") -> Entry:
    """The entry of a stat result (or of a signature's unpacked fields: size, mtime_ns,
    ctime_ns, ino, mode, uid, gid, nlink, blocks)."""
    if isinstance(st, os.stat_result):
        mtime, mode, uid, gid = st.st_mtime_ns, st.st_mode, st.st_uid, st.st_gid
    else:
        _, mtime, _, _, mode, uid, gid, _, _ = st
    return Entry(kind, st_.S_IMODE(mode) if kind != "symlink" else 0, ref, size, uid, gid,
                 mtime, make_extra(xattrs, rdev, links))


class Applier:
    """Gives entries their metadata; collects the warnings a restore reports."""

    def __init__(self) -> None:
        self.warnings: list[str] = []

    def apply_fd(self, fd: int, entry: Entry, path: str, folder: bool = False) -> None:
        """Owner, mode, xattrs and time of the entry open at ``fd`` (a file or folder)."""
        if not entry.has_meta:  # the oldest tree format: the mode alone, never a privilege
            mode = entry.mode if folder else self._unprivileged(entry.mode, path,
                                                                 "it has no recorded owner")
            os.fchmod(fd, mode)
            return
        owned = self._chown(lambda: os.fchown(fd, entry.uid, entry.gid), entry, path)
        mode = entry.mode if owned or folder else self._unprivileged(
            entry.mode, path, f"its owner {entry.uid}:{entry.gid} could not be set")
        os.fchmod(fd, mode)
        self._set_xattrs(fd, entry.xattrs(), path, follow=True)
        os.utime(fd, ns=(entry.mtime, entry.mtime))

    def apply_at(self, dfd: int, name: str, entry: Entry, path: str) -> None:
        """The same for a symlink, FIFO or device node ``name`` inside folder ``dfd``,
        never following it and never opening it (opening a device can act on it)."""
        if not entry.has_meta:
            return
        owned = self._chown(lambda: os.chown(name, entry.uid, entry.gid, dir_fd=dfd,
                                             follow_symlinks=False), entry, path)
        if entry.kind != "symlink":
            mode = entry.mode if owned else self._unprivileged(
                entry.mode, path, f"its owner {entry.uid}:{entry.gid} could not be set")
            os.chmod(name, mode, dir_fd=dfd, follow_symlinks=False)
        self._set_xattrs(at(dfd, name), entry.xattrs(), path, follow=False)
        os.utime(name, ns=(entry.mtime, entry.mtime), dir_fd=dfd, follow_symlinks=False)

    def touch(self, fd: int, entry: Entry) -> None:
        """Only the modification time again (a folder whose contents were just written)."""
        if entry.has_meta:
            os.utime(fd, ns=(entry.mtime, entry.mtime))

    # -- internals -----------------------------------------------------------------
    def _chown(self, chown, entry: Entry, path: str) -> bool:
        try:
            chown()
            return True
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.EINVAL):
                raise
            self.warnings.append(f"{path}: owner {entry.uid}:{entry.gid} not restored"
                                 f" ({os.strerror(exc.errno)})")
            return False

    def _unprivileged(self, mode: int, path: str, why: str) -> int:
        if mode & PRIVILEGE_BITS:
            self.warnings.append(f"{path}: setuid/setgid bits dropped because {why}")
        return mode & ~PRIVILEGE_BITS

    def _set_xattrs(self, target, want: dict[str, bytes], path: str, follow: bool) -> None:
        # One value at a time: what an entry carries now is the agent's, unbounded
        have = set(xattr_names(target))
        for name in have - want.keys():
            try:
                os.removexattr(target, name, follow_symlinks=follow)
            except OSError as exc:
                if exc.errno not in (errno.ENODATA, errno.ENOTSUP, errno.EPERM):
                    raise
        for name, value in sorted(want.items()):
            if name in have and xattr_value(target, name) == value:
                continue
            try:
                os.setxattr(target, name, value, follow_symlinks=follow)
            except OSError as exc:
                if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EACCES, errno.EINVAL):
                    raise
                self.warnings.append(f"{path}: xattr {name} not restored"
                                     f" ({os.strerror(exc.errno)})")
