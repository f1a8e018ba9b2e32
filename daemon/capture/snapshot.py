"""Snapshotters: capture a layer's files into trees and blobs, and bring them back.

The contract (terms, guarantees, lifecycle) is ``Snapshotter`` in snapshotter.py.
Implementations: ``WorkspaceSnapshotter`` (a folder: a workspace, a fork's view, or a
Docker container's writable layer with ``overlay``) and ``MemorySnapshotter`` (the
reference: a dict of paths; memory_snapshot.py).

``WorkspaceSnapshotter`` keeps a capture's course (full or incremental, exclusions,
the stat cache's update at commit), the reading of each file, symlink and special
file the scan finds changed, and the storing of trees; tree_scan.py builds the trees
(the full scan's walk, the incremental update); apply.py writes a tree back.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import stat as st_
import sys
from collections.abc import Callable

from worldline.wire.errors import FailedPrecondition

from ..faults import crash_point
from ..storage.blob_store import BlobStore, Overread
from ..storage.streams import CHUNK, file_chunks, within
from . import chunks, exclude, leftovers, sparse, tree_scan
from .descriptors import DIR_FLAGS as _DIR_FLAGS
from .descriptors import READ_FLAGS as _READ_FLAGS
from .descriptors import link_groups
from .fsmeta import at, entry_of, read_xattrs
from .limits import Budget, Limits
from .memory_snapshot import MemoryFile, MemorySnapshotter  # noqa: F401 - importable here
from .snapshotter import Capture, Watcher
from .statcache import Memo, StatCache, is_racy, is_racy_signature
from .tracker import Changes
from .trees import (
    BLOCK,
    CHAR,
    CHUNKED,
    DIR,
    FIFO,
    FILE,
    MAPPED,
    OPAQUE,
    SOCKET,
    SYMLINK,
    WHITEOUT,
    Entry,
    Tree,
    TreeReader,
    encode,
)
from .walk import (
    OPAQUE_XATTR,
    signature,
)

log = logging.getLogger(__name__)

SMALL_FILE = 4 << 20


class _Scan:
    def __init__(self, persist: bool, watcher: Watcher | None, budget: Budget | None,
                 root_fd: int) -> None:
        self.persist = persist
        self.watcher = watcher  # a full scan watches every folder before listing it
        self.budget = budget
        self.root_fd = root_fd
        self.trees: dict[str, Tree | list] = {}  # Capture.trees
        self.warnings: list[str] = []
        self.seen: dict[str, tuple] = {}
        self.deferred: list[bytes] = []  # a full scan's trees, stored together at its end
        self.memos: dict[str, Memo | None] = {}
        self.reused: set[str] = set()
        self.links: dict[str, int] = {}  # path -> inode of every file with other links
        # Files whose stat cannot vouch for their content (closed after writing, mapped
        # shared and writable: mappings.py), and of those the ones the stat cache must
        # not learn (mapped: a write may follow with no trace in their stat).
        self.untrusted: frozenset[str] | set[str] = frozenset()
        self.mapped: frozenset[str] = frozenset()
        self.rescan_caches: Callable[[], tuple[dict, dict]] | None = None
        self.entries = 0  # names in the layer's tree (``TreeReader.count``)
        self.max_entries = budget.limits.max_entries if budget is not None else sys.maxsize
        self.inodes: dict[str, int] = {}  # Capture.inodes (only when not persisted)
        self.excluded: exclude.Exclusions | None = None  # Capture.excluded


def read_small(fd: int, size_hint: int, limit: int | None = None) -> bytes:
    """The whole of a small file, read in a buffer the size its stat gave (plus one
    byte): ``os.read(fd, n)`` allocates ``n`` bytes before it reads, and a 1 MiB
    buffer per file made the allocator map and unmap a fresh heap per capture (a fifth
    of the daemon's CPU under the eight-session load). It reads on until a read gives
    nothing (a short read is not trusted to be the end); a file that grew since its
    stat is read in chunks, and the capture's before/after signature decides whether
    what was read may be trusted. Past ``limit`` bytes, Overread (one byte past it at
    the most): a file an agent's process keeps writing is not read without end."""
    chunks, want, got = [], size_hint + 1, 0
    while chunk := os.read(fd, within(want if want > 0 else CHUNK, got, limit)):
        got += len(chunk)
        if limit is not None and got > limit:
            raise Overread(limit)
        chunks.append(chunk)
        want -= len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class WorkspaceSnapshotter:
    """A layer's folder, read and written only through folder descriptors."""

    def __init__(self, path: str, blobs: BlobStore, trees: TreeReader,
                 stat_cache: StatCache, watcher: Watcher | None = None,
                 overlay: bool = False, limits: Limits | None = None,
                 data_root: str | None = None) -> None:
        self.path = path
        self.blobs = blobs
        self.trees = trees
        self.stat_cache = stat_cache
        self.watcher = watcher  # a change tracker: full scans watch what they read
        # An overlay upper folder: whiteouts (0/0 character devices) and opaque folders
        # (trusted.overlay.opaque=y) are recorded and written back, device nodes too.
        self.overlay = overlay
        self.limits = limits
        self.data_root = data_root
        self.opener: Callable[[], int] | None = None  # opens the root (World: by identity)
        # the session's --exclude patterns (exclude.py); None: no exclusions at all (a
        # container's layer), not even a .worldlineignore
        self.exclude: tuple[str, ...] | None = None

    # -- capture ---------------------------------------------------------------
    def capture(self, persist: bool = True, changes: Changes | None = None,
                base: str | None = None, mapped: frozenset[str] = frozenset()) -> Capture:
        """``mapped``: files mapped shared and writable now (mappings.py), read again
        whatever their stat says, as are the tracker's closed files."""
        full = changes is None or changes.full or base is None
        budget = (self.limits.budget(self.data_root if persist else None)
                  if self.limits is not None else None)
        untrusted = (changes.closed | mapped) if changes is not None else mapped
        trust = changes is None or not changes.distrust  # the stat cache may vouch
        root_fd = self._open_root()
        try:
            excluded, warnings, key = (exclude.read(root_fd, self.exclude, self.blobs.address)
                                       if self.exclude is not None else (None, [], None))
            if self.watcher is not None:
                self.watcher.excluded = excluded
            if not full and self.exclude is not None and exclude.key_in(self.trees,
                                                                        base) != key:
                full = True  # the rules changed: what they exclude or let in is anywhere
            scan = self._capture(root_fd, persist, changes, base, full, budget, untrusted,
                                 mapped, trust, excluded)
            if not full and any(p not in changes.linked for p in scan.links):
                # A new hard link: its other names may be anywhere, only a full scan
                # finds them all.
                full = True
                scan = self._capture(root_fd, persist, None, None, True, budget, untrusted,
                                     mapped, trust, excluded)
        finally:
            os.close(root_fd)
        if budget is not None and persist:  # a look that stores nothing goes on (a
            # restore brings the layer back under the limit); its walk stopped at it
            budget.check_entries(scan.entries, self._layer_name())
        if scan.deferred:
            self.blobs.put_many(scan.deferred)
        return Capture(scan.root, scan.size, scan.trees, warnings + scan.warnings, scan.seen,
                       persist, full, scan.memos, scan.reused, scan.links, frozenset(mapped),
                       scan.entries, scan.inodes, excluded)

    def _capture(self, root_fd: int, persist: bool, changes: Changes | None,
                 base: str | None, full: bool, budget: Budget | None,
                 untrusted: frozenset[str] | set[str], mapped: frozenset[str],
                 trust: bool = True, excluded: exclude.Exclusions | None = None) -> _Scan:
        """``trust`` False: a full scan that trusts no stat (the tracker dropped the
        files closed after writing, any of which a mapping may have written): it lists
        every folder and reads every file. ``excluded``: the paths left out (their
        folders never listed); the folder memos are neither read nor kept then (each
        was made under rules that may differ)."""
        scan = _Scan(persist, self.watcher if full else None, budget, root_fd)
        scan.untrusted, scan.mapped, scan.excluded = untrusted, mapped, excluded
        if full:
            scan.root, scan.size, _, _, scan.entries = tree_scan.scan_tree(
                self, root_fd, "", scan, tree_scan.stat_caches(self, untrusted,
                                                               excluded is None)
                if trust else tree_scan.nothing_cached)
        else:
            scan.root, scan.size, added = tree_scan.update_dir(
                self, root_fd, "", base, tree_scan.trie(changes, mapped), scan,
                self.stat_cache.entries(self.path))
            # the head's count, kept from its capture (or read: a tree restored, say)
            scan.entries = self.trees.count(base) + added
        if persist:
            self.trees.remember_count(scan.root, scan.entries, root=True)
        return scan

    def _layer_name(self) -> str:
        return ("the container's writable layer" if self.overlay
                else f"the workspace {self.path}")

    def commit(self, capture: Capture) -> None:
        if not capture.persisted:
            return
        cache = self.stat_cache.entries(self.path)
        changed = {p: v for p, v in capture.seen.items() if cache.get(p) != v}
        memos = dict(capture.memos)
        if capture.excluded is not None:  # no memo is kept under exclusions
            memos = dict.fromkeys(self.stat_cache.folders(self.path))
        removed: set[str] = {p for p in capture.mapped if p in cache}
        if capture.full:
            # A full scan saw every folder: a file is still there if its folder's memo
            # held, or the scan saw it; a memo is still good if it held or was rewritten.
            reused = capture.reused
            removed = {p for p in cache if p not in capture.seen
                       and p.rpartition("/")[0] not in reused}
            for p in self.stat_cache.folders(self.path):
                if p not in reused and (p not in memos or capture.excluded is not None):
                    memos[p] = None
        try:
            self.stat_cache.update(self.path, changed, removed, memos)
        except Exception as exc:  # a cache: losing an update costs a rehash, never data
            log.warning("stat cache of %s not updated: %s", self.path, exc)

    def _open_root(self) -> int:
        if self.opener is not None:
            return self.opener()
        try:
            return os.open(self.path, _DIR_FLAGS)
        except FileNotFoundError:
            raise FailedPrecondition(f"workspace {self.path} does not exist") from None
        except NotADirectoryError:
            raise FailedPrecondition(f"workspace {self.path} is not a folder") from None
        except OSError:
            if os.path.islink(self.path):
                raise FailedPrecondition(
                    f"workspace {self.path} has been replaced by a symlink") from None
            raise

    def _special(self, dfd: int, name: str, path: str, fields: tuple, rdev, scan: _Scan
                 ) -> Entry | None:
        """A FIFO, device node, whiteout or socket (never opened: opening acts on them)."""
        mode = fields[4]
        if self.overlay and st_.S_ISCHR(mode) and rdev == 0:
            # Invisible in the container, but part of the layer (`docker commit` and
            # `docker diff` read it): its owner, mode and time come back with it.
            return entry_of(WHITEOUT, fields)
        xattrs = read_xattrs(at(dfd, name), path)
        if st_.S_ISFIFO(mode):
            return entry_of(FIFO, fields, xattrs=xattrs)
        if st_.S_ISCHR(mode) or st_.S_ISBLK(mode):
            if not self.overlay:
                scan.warnings.append(f"{path}: a device node in a workspace is recorded,"
                                     " never recreated")
            return entry_of(CHAR if st_.S_ISCHR(mode) else BLOCK, fields, xattrs=xattrs,
                            rdev=int(rdev or 0))
        if st_.S_ISSOCK(mode):
            scan.warnings.append(f"skipped {path}: a socket is recorded, never recreated")
            return entry_of(SOCKET, fields)
        scan.warnings.append(f"skipped {path}: not a kind of file worldline knows")
        return None

    def _folder_kind(self, fd: int) -> str:
        if not self.overlay:
            return DIR
        try:
            return OPAQUE if os.getxattr(fd, OPAQUE_XATTR) == b"y" else DIR
        except OSError:
            return DIR

    def _listed_symlink(self, dfd: int, name: str, path: str, sig: bytes, fields: tuple,
                        scan: _Scan) -> Entry | None:
        """A symlink an update listed, its target read by name: None if the name is no
        longer a symlink (replaced since its stat; its event brings it to the next
        capture): readlink's EINVAL there is no reason to fail the checkpoint."""
        crash_point("capture.before_open", path)  # tests: the name swapped meanwhile
        try:
            target = os.readlink(name, dir_fd=dfd)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            return None
        return self._read_symlink(dfd, name, path, target, sig, fields, scan)

    def _read_symlink(self, dfd: int, name: str, path: str, target: str, sig: bytes,
                      fields: tuple, scan: _Scan) -> Entry:
        entry = entry_of(SYMLINK, fields, target, xattrs=read_xattrs(at(dfd, name), path))
        if not is_racy_signature(sig):
            scan.seen[path] = (sig, target, entry.extra, SYMLINK)
        return entry

    def _read_file(self, dfd: int, name: str, path: str, scan: _Scan, cache,
                   kept: Entry | None = None) -> Entry | None:
        """Read and store a file the stat cache could not vouch for. Its delta base is
        ``kept`` (its entry in the tree being updated) or what the stat cache knew of
        the path (a file written just before the last checkpoint has no stat cache
        entry: its time could not vouch for it). Content equal to ``kept`` is that blob,
        which the head names and so keeps: no put."""
        if kept is not None:
            previous, was = kept.ref, kept.kind
        else:
            known = cache.get(path)
            previous, was = (known[1], known[3]) if known is not None else (None, None)
        crash_point("capture.before_open", path)  # tests: the name swapped meanwhile
        try:
            fd = os.open(name, _READ_FLAGS, dir_fd=dfd)
        except FileNotFoundError:
            return None  # removed since it was listed
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return None  # swapped for a symlink: its event brings it to the next one
            raise
        try:
            before = os.fstat(fd)
            if not st_.S_ISREG(before.st_mode):
                scan.warnings.append(f"skipped {path}: not a file, folder or symlink")
                return None
            holey = sparse.is_sparse(fd, before)
            budget = scan.budget
            if budget is not None:
                budget.check_file(path, before, min(before.st_blocks * 512, before.st_size)
                                  if holey else before.st_size)
            if holey or before.st_size >= chunks.CHUNK_FROM:
                # read as far as its size then: growth is the next capture's
                kind = CHUNKED
                ref, size = chunks.capture(
                    fd, before.st_size, self.blobs, scan.persist, dense=not holey,
                    kept=kept.ref if kept is not None and kept.kind in MAPPED else None,
                    previous=previous if was == CHUNKED else None)
            else:
                kind = FILE
                previous = previous if was == FILE else None
                limit = budget.allowance(before.st_size) if budget is not None else None
                crash_point("capture.file_opened", path)  # tests: the file grows meanwhile
                try:
                    ref, size = self._read_content(fd, before.st_size, scan.persist,
                                                   previous, kept, limit)
                except Overread:
                    raise budget.overread(path, before.st_size) from None
                if size > before.st_size and budget is not None:
                    budget.take(size - before.st_size, path)  # it grew: within allowance
            xattrs = read_xattrs(fd, path)
            after = os.fstat(fd)
        finally:
            os.close(fd)
        entry = entry_of(kind, after, ref, size, xattrs)
        if not scan.persist:
            scan.inodes[path] = after.st_ino  # the file read, not the name listed
        if after.st_nlink > 1:
            scan.links[path] = after.st_ino
        if (signature(before) == signature(after) and not is_racy(after)
                and path not in scan.mapped):
            scan.seen[path] = (signature(after), ref, entry.extra, kind)
        return entry

    def _read_content(self, fd: int, size_hint: int, persist: bool,
                      previous: str | None, kept: Entry | None = None,
                      limit: int | None = None) -> tuple[str, int]:
        """Store the file's content; ``previous`` is the digest its path had last time,
        a base the blob store may store the new version as a difference from; ``kept``,
        an entry the head names (a small file's content equal to its blob is not put).
        More than ``limit`` bytes (the file grew while read): Overread."""
        if size_hint <= SMALL_FILE:
            data = read_small(fd, size_hint, limit)
            if not persist:
                return self.blobs.address(data), len(data)
            if kept is not None and kept.size == len(data) and self.blobs.address(data) == kept.ref:
                return kept.ref, len(data)
            return self.blobs.put_bytes(data, base=previous), len(data)
        if persist:
            return self.blobs.put_fd(fd, limit)
        hasher, size = self.blobs.hasher(), 0
        for chunk in file_chunks(fd, limit):
            hasher.update(chunk)
            size += len(chunk)
        return hasher.hexdigest(), size

    def _store_tree(self, tree: Tree, scan: _Scan, rel: str | None = None) -> str:
        """Store a folder's tree found by a full scan. The layer's root tree (``rel ==
        ""``) carries the root folder's own entry and the layer's hard-link groups."""
        if rel == "":
            tree.own = self._root_entry(scan)
        return self._stored(tree, encode(tree), scan, None)

    def _stored(self, tree: Tree, data: bytes, scan: _Scan, base: str | None) -> str:
        """The digest of a tree encoded as ``data``; ``base``, its previous tree, may
        serve as a delta base. A full scan's trees (no base) are stored together when
        it ends: nearly all are stored already, and one question for many is cheaper
        than one each. A tree equal to its base (a folder looked at again, as those
        holding hard links are, and found unchanged) is the base's blob, which the head
        names and so keeps: no put (a question to the pack; on a fleet, to its index)."""
        if scan.persist and base is None:
            digest = self.blobs.address(data)
            scan.deferred.append(data)
            self.trees.remember(digest, tree, len(data))
        elif scan.persist:
            digest = self.blobs.address(data)
            if digest != base:
                self.blobs.put_bytes(data, base=base)
            self.trees.remember(digest, tree, len(data))
        else:
            digest = self.blobs.address(data)
            scan.trees[digest] = tree
        return digest

    def _root_entry(self, scan: _Scan, known: str = "") -> Entry:
        """The root folder's own entry; its extras name the layer's hard-link groups
        (a blob put unless it is ``known``: the groups the base's root names)."""
        groups = link_groups(scan.links)
        links = ""
        if groups:
            body = json.dumps(groups, separators=(",", ":")).encode()
            links = self.blobs.address(body)
            if scan.persist and links != known:
                self.blobs.put_bytes(body)
            elif not scan.persist:  # readable from the capture, as its trees are
                scan.trees[links] = groups
        st = os.fstat(scan.root_fd)
        return entry_of(DIR, st, xattrs=read_xattrs(scan.root_fd, self._layer_name()),
                        links=links)

    def remove_leftovers(self) -> list[str]:
        """Remove the temporary files a write aside left behind when the daemon died
        between writing and renaming (captures never see them, so a restore would not
        either). Called when an interrupted restore is completed. Returns their paths."""
        root_fd = self._open_root()
        try:
            # never written by a restore: nothing of ours there
            excluded = (exclude.read(root_fd, self.exclude, self.blobs.address)[0]
                        if self.exclude is not None else None)
            return leftovers.remove_below(root_fd, excluded)
        finally:
            os.close(root_fd)

    # -- apply -----------------------------------------------------------------
    def restore_exclusions(self, current: Capture, target_root: str
                           ) -> exclude.Exclusions | exclude.Either | None:
        """What a restore from ``current`` to ``target_root`` leaves exactly as it is:
        what the rules exclude now (those ``current`` obeyed) or the target's own
        (what its capture never saw, it cannot say how to restore)."""
        if self.exclude is None:
            return None
        if exclude.key_in(self.trees, target_root, current.trees) == exclude.key_in(
                self.trees, current.root, current.trees):
            # the same file, so the same rules: a tree made from this capture (a restore
            # of some paths, whose trees and file may not be stored yet) or a target
            # whose .worldlineignore is today's
            return current.excluded
        return exclude.either(current.excluded, exclude.of_tree(
            self.trees, self.blobs, target_root, self.exclude))

    def apply(self, current: Capture, target_root: str, watch_new: bool = False,
              private: bool = False) -> list[str]:
        """Make the layer equal to ``target_root`` (apply.py); returns the warnings.
        With ``watch_new`` (a fork into a fresh folder), every folder is handed to the
        watch hook once its contents are written, so the tracker starts from the target
        tree without a scan and never sees the fork's own writes. ``private``: the layer
        is an empty folder of the daemon's own that nobody else writes and that is
        discarded whole on failure (a view being built): files are made at their names,
        with no temporary to rename."""
        from .apply import TreeWriter
        watch = self.watcher.watch_folder if watch_new and self.watcher is not None else None
        root_fd = self._open_root()
        try:
            return TreeWriter(self.blobs, self.trees, self.overlay, watch, private=private,
                              excluded=self.restore_exclusions(current, target_root)
                              ).write(root_fd, current, target_root)
        finally:
            os.close(root_fd)
