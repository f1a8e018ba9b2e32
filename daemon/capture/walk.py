"""One pass over a folder tree, for full scans: list, stat, watch, and skip what is known.

``walk(root_fd, inotify_fd, mask, max_depth, overlay, caches, root_sig, prefix,
max_entries)`` returns ``(records, reused, root, listed)``:

- Every folder is opened with ``O_NOFOLLOW`` relative to its parent's descriptor and,
  when ``inotify_fd >= 0``, watched through ``/proc/self/fd`` *before* it is listed, so
  a change made after its listing is an event. Entries are stat'ed without following
  symlinks; one that vanishes while it is read is left out; any other failure raises
  ``OSError``; a folder more than ``max_depth`` below the root raises
  ``RecursionError`` naming it.
- ``listed`` counts every name listed, in the folders whose memo holds too: the
  folder tree's entries. Past ``max_entries`` the walk stops and raises
  ``TooManyEntries((relpath, listed))``, having held no more than about that many
  names in memory (a layer the agent filled with millions of names must not take the
  daemon's memory with it).
- ``caches()`` returns ``(files, folders)``: the stat cache (path -> (signature, ref,
  extra, kind), for files and symlinks) and the folder memos (path -> (signature, tree
  digest, size, kind, extra)). The C walk calls it after its system calls, so the stat
  cache may load meanwhile. A folder's memo *holds* when the folder's own signature is
  the memo's (so no entry was added, removed, renamed or re-permissioned in it), every
  file and symlink in it matches the stat cache (a change of owner, mode or xattrs
  moves an entry's ctime), no file in it has another hard link (a write through a name
  elsewhere changes it without an event here), every folder in it holds, and it holds
  nothing but files, folders and symlinks. A folder that holds
  gives no record: it is listed in ``reused`` as ``(relpath, wd, names)``, ``names``
  counting every name in it and below it, and its parent's entry carries the memo.
- A record is ``(relpath, wd, opaque, entries)``, children before their parent. An
  entry is ``(name, signature, extra)``: extra is the child's record index (int) or
  memo (tuple) for a folder, the target for a symlink, ``st_rdev`` for a device, None
  otherwise. ``root`` is the root's index or memo. ``wd`` is the watch descriptor,
  minus the errno when the watch could not be added, 0 when not watching.
- Paths are relative to the workspace: the root's is ``prefix`` ("" for the workspace
  itself, "a/b" when a subtree is scanned).

Two implementations keep this contract: ``_walk`` (C, daemon/capture/_walk.c, built with the
package) and ``walk_python`` below; tests/test_walk.py holds them to the same output.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat as st_
import struct
import sys
from collections.abc import Callable, Iterator
from typing import Any

from .descriptors import DIR_FLAGS as _DIR_FLAGS

# size, mtime_ns, ctime_ns, inode, mode, uid, gid, nlink, blocks: 56 bytes
SIG = struct.Struct("=qqqQIIIIq")
OPAQUE_XATTR = "trusted.overlay.opaque"
MAX_DEPTH = 400  # folders deeper than this are refused, clearly, instead of overflowing

_libc = ctypes.CDLL(None, use_errno=True)
_libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]

Record = tuple[str, int, bool, list[tuple[str, bytes, Any]]]


def signature(st: os.stat_result) -> bytes:
    return SIG.pack(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_mode,
                    st.st_uid, st.st_gid, st.st_nlink, st.st_blocks)


def join_path(rel: str, name: str) -> str:
    """A workspace path: ``name`` inside the folder at ``rel`` ("" is the root)."""
    return f"{rel}/{name}" if rel else name


def folders_below(dfd: int, max_depth: int,
                  before_listing: Callable[[int, str], None] | None = None,
                  skip: Callable[[str], bool] | None = None
                  ) -> Iterator[tuple[int, str, list[os.DirEntry]]]:
    """The folder open at ``dfd`` ("" first) and every folder below it, depth first, as
    (descriptor, relative path, its entries), for the small walks beside full scans
    (removing a tree, clearing leftovers, watching a folder that appeared).

    Each folder is opened relative to its parent with ``O_NOFOLLOW``; one that vanished
    or was swapped for a file or symlink since its parent was listed is skipped.
    ``before_listing(fd, rel)`` runs before a folder is listed; a folder for whose
    path ``skip`` says True is not entered (exclusions). No recursion, and one
    descriptor held per level (never one per folder waiting its turn: a folder with
    thousands of subfolders would exhaust them); a folder more than ``max_depth`` below
    ``dfd`` raises ``RecursionError`` naming it. The descriptors are the walk's own."""
    frames: list[tuple[int, str, Iterator[str]]] = []
    fd: int | None = os.dup(dfd)
    rel = ""
    try:
        while fd is not None:
            if before_listing is not None:
                before_listing(fd, rel)
            entries = list(os.scandir(fd))
            yield fd, rel, entries
            frames.append((fd, rel, iter([
                e.name for e in entries if e.is_dir(follow_symlinks=False)
                and (skip is None or not skip(join_path(rel, e.name)))])))
            fd = None
            while frames and fd is None:
                parent, parent_rel, names = frames[-1]
                name = next(names, None)
                if name is None:
                    frames.pop()
                    os.close(parent)
                    continue
                rel = join_path(parent_rel, name)
                if len(frames) > max_depth:
                    raise RecursionError(rel)
                try:
                    fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
                except OSError as exc:
                    if exc.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                        raise
    finally:
        if fd is not None:  # opened, not yet a frame
            os.close(fd)
        for frame_fd, _, _ in frames:
            os.close(frame_fd)


def walk_python(root_fd: int, inotify_fd: int, mask: int, max_depth: int, overlay: bool,
                caches: Callable[[], tuple[dict, dict]], root_sig: bytes, prefix: str = "",
                max_entries: int = sys.maxsize,
                skip: Callable[[str, bool], bool] | None = None
                ) -> tuple[list[Record], list[tuple[str, int, int]], Any, int]:
    """``skip(relpath, is_folder)``, the Python walk's own (exclusions, exclude.py):
    whether to leave a name out, as if it were not there (a folder is not entered, its
    names are not counted)."""
    if max_entries < 0:
        raise ValueError("max_entries must not be negative")
    files, folders = caches()
    records: list[Record] = []
    reused: list[tuple[str, int, int]] = []
    listed = 0

    def visit(dfd: int, rel: str, sig: bytes, depth: int) -> tuple[Any, int]:
        """The folder's record index or memo, and the names in it and below it."""
        if depth > max_depth:
            raise RecursionError(rel)
        wd = 0
        if inotify_fd >= 0:
            wd = _libc.inotify_add_watch(inotify_fd, f"/proc/self/fd/{dfd}".encode(), mask)
            if wd < 0:
                wd = -ctypes.get_errno()
        opaque = False
        if overlay:
            try:
                opaque = os.getxattr(dfd, OPAQUE_XATTR) == b"y"
            except OSError:
                pass
        nonlocal listed
        listing = []
        with os.scandir(dfd) as it:
            for de in it:
                if listed >= max_entries:
                    raise TooManyEntries(rel, listed)
                try:
                    st = de.stat(follow_symlinks=False)
                    target = (os.readlink(de.name, dir_fd=dfd)
                              if st_.S_ISLNK(st.st_mode) else None)
                except FileNotFoundError:
                    continue  # removed while we looked
                if skip is not None and skip(join_path(rel, de.name),
                                             st_.S_ISDIR(st.st_mode)):
                    continue
                listing.append((de.name, st, target))
                listed += 1
        memo = folders.get(rel)
        reusable = memo is not None and len(memo) == 5 and memo[0] == sig
        entries = []
        below = len(listing)
        for name, st, target in listing:
            entry_sig = signature(st)
            extra: Any = None
            if st_.S_ISDIR(st.st_mode):
                try:
                    sub = os.open(name, _DIR_FLAGS, dir_fd=dfd)
                except (FileNotFoundError, NotADirectoryError):
                    reusable = False  # removed, or swapped for a file, while we looked
                    continue
                except OSError as exc:
                    if exc.errno != errno.ELOOP:
                        raise
                    reusable = False  # swapped for a symlink while we looked
                    continue
                try:
                    extra, names = visit(sub, join_path(rel, name), entry_sig, depth + 1)
                finally:
                    os.close(sub)
                below += names
                if not isinstance(extra, tuple):
                    reusable = False
            elif st_.S_ISREG(st.st_mode) or target is not None:
                if st_.S_ISREG(st.st_mode) and st.st_nlink > 1:
                    reusable = False  # may change through a name outside this folder
                if reusable:
                    known = files.get(join_path(rel, name))
                    reusable = known is not None and known[0] == entry_sig
                extra = target
            else:
                reusable = False
                if st_.S_ISCHR(st.st_mode) or st_.S_ISBLK(st.st_mode):
                    extra = st.st_rdev
            entries.append((name, entry_sig, extra))
        if reusable:
            reused.append((rel, wd, below))
            return memo, below
        records.append((rel, wd, opaque, entries))
        return len(records) - 1, below

    root, _ = visit(root_fd, prefix, root_sig, 0)
    return records, reused, root, listed


try:
    from ._walk import TooManyEntries
    from ._walk import walk as walk_native
except ImportError:  # built without a C compiler: the same walk, slower
    walk_native = None

    class TooManyEntries(Exception):  # type: ignore[no-redef]
        """The walk listed more names than max_entries; args: (relpath, listed)."""

walk = walk_native or walk_python
IMPLEMENTATION = "native" if walk_native is not None else "python"
