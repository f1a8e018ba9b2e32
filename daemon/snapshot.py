"""Snapshotters: capture a world's files into trees and blobs, and bring them back.

Contract of every ``Snapshotter``:

- ``capture(persist=True, changes=None, base=None)`` reads the world and returns a
  ``Capture`` whose ``root`` is the digest of its root tree. With ``persist`` the
  blobs and trees are stored (not yet synced: the caller calls
  ``BlobStore.sync()`` once); without it nothing is written anywhere and the new
  trees travel in ``Capture.trees``. ``changes`` (a change tracker's report) names
  the paths that may differ from the tree ``base``; only those are examined and
  only the trees on their paths rewritten. Without them, or when they say
  ``full``, the whole world is examined, the stat cache sparing the reads of
  unchanged files.
- ``apply(current, target_root)`` makes the world equal to the target tree,
  touching only what differs from ``current`` (a fresh capture). Every file is
  written aside and renamed into place; nothing is ever written through a symlink
  or outside the world.
- ``commit(capture)`` records, after the metadata that references a capture is
  durable, what the capture learnt (the stat cache).

Implementations: ``WorkspaceSnapshotter`` (a directory; workspaces and forks),
``MemorySnapshotter`` (the reference: a dict of paths), and the container
snapshotter (a Docker container's writable layer).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import hashlib
import logging
import operator
import os
import shutil
import stat as st_
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from worldline.client.errors import FailedPrecondition, InvalidArgument

from . import progress
from .blobs import CHUNK, BlobStore, digest_of
from .faults import crash_point
from .statcache import Memo, Signature, StatCache, is_racy, is_racy_signature
from .tracker import TEMP_PREFIX, Changes
from .trees import DIR, FILE, OPAQUE, SYMLINK, WHITEOUT, Entry, TreeReader, check_name, encode
from .walk import OPAQUE_XATTR, SIG, join_path, signature, walk

log = logging.getLogger(__name__)

SMALL_FILE = 4 << 20
MAX_DEPTH = 400  # folders deeper than this are refused, clearly, instead of overflowing
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass
class Capture:
    root: str
    bytes: int
    trees: dict[str, dict[str, Entry]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    seen: dict[str, tuple[Signature, str]] = field(default_factory=dict)
    persisted: bool = True
    full: bool = True  # every file was examined (not just a tracker's changes)
    memos: dict[str, Memo | None] = field(default_factory=dict)  # folder memos (None: drop)
    reused: set[str] = field(default_factory=set)  # folders whose memo held


class Snapshotter(Protocol):
    def capture(self, persist: bool = True, changes: Changes | None = None,
                base: str | None = None) -> Capture: ...

    def apply(self, current: Capture, target_root: str) -> None: ...

    def commit(self, capture: Capture) -> None: ...


class Watcher(Protocol):
    """A change tracker, as the snapshotter sees it."""

    def watch_folder(self, rel: str, fd: int) -> None: ...

    def scanning(self) -> contextlib.AbstractContextManager[
        tuple[int, int, Callable[[list[tuple[str, int]]], None]]]: ...


class _Scan:
    def __init__(self, persist: bool, watcher: Watcher | None = None) -> None:
        self.persist = persist
        self.watcher = watcher  # a full scan watches every folder before listing it
        self.trees: dict[str, dict[str, Entry]] = {}
        self.warnings: list[str] = []
        self.seen: dict[str, tuple[Signature, str]] = {}
        self.deferred: list[bytes] = []  # a full scan's trees, stored together at its end
        self.memos: dict[str, Memo | None] = {}
        self.reused: set[str] = set()


class WorkspaceSnapshotter:
    """A workspace directory, read and written only through folder descriptors."""

    def __init__(self, path: str, blobs: BlobStore, trees: TreeReader,
                 stat_cache: StatCache, watcher: Watcher | None = None,
                 overlay: bool = False) -> None:
        self.path = path
        self.blobs = blobs
        self.trees = trees
        self.stat_cache = stat_cache
        self.watcher = watcher  # a change tracker: full scans watch what they read
        # An overlay upper folder: whiteouts (0/0 character devices) and opaque folders
        # (trusted.overlay.opaque=y) are recorded and written back, not skipped.
        self.overlay = overlay

    # -- capture ---------------------------------------------------------------
    def capture(self, persist: bool = True, changes: Changes | None = None,
                base: str | None = None) -> Capture:
        full = changes is None or changes.full or base is None
        scan = _Scan(persist, self.watcher if full else None)
        root_fd = self._open_root()
        try:
            if full:
                root, size, _ = self._scan_tree(root_fd, "", scan, self._caches())
            else:
                root, size = self._update_dir(root_fd, "", base, _trie(changes), scan,
                                              self.stat_cache.entries(self.path))
        finally:
            os.close(root_fd)
        if scan.deferred:
            self.blobs.put_many(scan.deferred)
        return Capture(root, size, scan.trees, scan.warnings, scan.seen, persist, full,
                       scan.memos, scan.reused)

    def commit(self, capture: Capture) -> None:
        if not capture.persisted:
            return
        cache = self.stat_cache.entries(self.path)
        changed = {p: v for p, v in capture.seen.items() if cache.get(p) != v}
        memos = dict(capture.memos)
        removed: set[str] = set()
        if capture.full:
            # A full scan saw every folder: a file is still there if its folder's memo
            # held, or the scan saw it; a memo is still good if it held or was rewritten.
            reused = capture.reused
            removed = {p for p in cache if p not in capture.seen
                       and p.rpartition("/")[0] not in reused}
            for p in self.stat_cache.folders(self.path):
                if p not in reused and p not in memos:
                    memos[p] = None
        try:
            self.stat_cache.update(self.path, changed, removed, memos)
        except Exception as exc:  # a cache: losing an update costs a rehash, never data
            log.warning("stat cache of %s not updated: %s", self.path, exc)

    def _open_root(self) -> int:
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

    def _caches(self) -> Callable[[], tuple[dict, dict]]:
        """The stat cache's files and folder memos for this world. When they are not in
        memory yet (the first scan after a start), they load in a thread while the walk
        makes its system calls."""
        get = lambda: (self.stat_cache.entries(self.path), self.stat_cache.folders(self.path))
        if self.stat_cache.loaded(self.path):
            return get
        loading = concurrent.futures.Future()

        def load() -> None:
            try:
                loading.set_result(get())
            except BaseException as exc:
                loading.set_exception(exc)
        threading.Thread(target=load, name="stat-cache-load", daemon=True).start()
        return loading.result

    def _scan_tree(self, dfd: int, prefix: str, scan: _Scan,
                   caches: Callable[[], tuple[dict, dict]]) -> tuple[str, int, str]:
        """A full scan of the folder open at ``dfd`` (``prefix`` is its path, "" for the
        root): one walk (walk.py) lists, stats and watches everything, skipping the
        folders whose memo holds; the rest are rebuilt here, children first. Returns
        the folder's tree digest, its size and its kind."""
        depth = prefix.count("/") + 1 if prefix else 0
        root_sig = signature(os.fstat(dfd))
        watching = (scan.watcher.scanning() if scan.watcher is not None
                    else contextlib.nullcontext((-1, 0, None)))
        with watching as (inotify_fd, mask, register):
            try:
                records, reused, root = walk(dfd, inotify_fd, mask, MAX_DEPTH - depth,
                                             self.overlay, caches, root_sig, prefix)
            except RecursionError as exc:
                raise _too_deep(str(exc)) from None
            if register is not None:
                register([(r[0], r[1]) for r in records] + reused)
        scan.reused.update(rel for rel, _ in reused)
        cache = caches()[0]
        built: list[tuple[str, int, str, bool]] = []
        with _FolderOpener(dfd, prefix) as opener:
            for record in records:
                built.append(self._build_folder(record, built, opener, scan, cache))
        if not isinstance(root, int):
            return root[1], root[2], root[3]
        digest, size, kind, clean = built[root]
        if scan.persist:
            scan.memos[prefix] = ((root_sig, digest, size, kind)
                                  if clean and not is_racy_signature(root_sig) else None)
        return digest, size, kind

    def _build_folder(self, record, built: list, opener: "_FolderOpener", scan: _Scan,
                      cache) -> tuple[str, int, str, bool]:
        """One folder of a walk whose memo did not hold: its tree, size, kind, and whether
        a memo may be written for it (everything in it was cached, nothing racy)."""
        rel, _wd, opaque, entries = record
        tree: dict[str, Entry] = {}
        total = 0
        clean = True
        for name, sig, extra in entries:
            if name.startswith(TEMP_PREFIX):
                continue
            path = join_path(rel, name)
            size, _, _, _, mode = SIG.unpack(sig)
            if st_.S_ISDIR(mode):
                if isinstance(extra, int):
                    digest, sub_size, kind, sub_clean = built[extra]
                    memo = (sig, digest, sub_size, kind)
                    if not sub_clean or is_racy_signature(sig):
                        memo, clean = None, False
                    if scan.persist:
                        scan.memos[path] = memo
                else:
                    _, digest, sub_size, kind = extra
                tree[name] = Entry(kind, st_.S_IMODE(mode), digest, sub_size)
                total += sub_size
            elif st_.S_ISLNK(mode):
                tree[name] = Entry(SYMLINK, 0, extra)
            elif st_.S_ISREG(mode):
                entry = _cached_file(path, sig, scan, cache)
                if entry is None:  # changed: open its folder (only now) and read it
                    folder = opener.open(rel)
                    entry = None if folder is None else self._read_file(
                        folder, name, path, scan, cache)
                    clean = clean and path in scan.seen
                if entry is not None:
                    tree[name] = entry
                    total += entry.size
            elif self._is_whiteout(mode, extra):
                tree[name] = Entry(WHITEOUT, 0, "")
                clean = False
            else:
                scan.warnings.append(f"skipped {path}: not a file, folder or symlink")
                clean = False
        return self._store_tree(tree, scan), total, OPAQUE if opaque else DIR, clean

    def _update_dir(self, dfd: int, prefix: str, base: str, node: dict, scan: _Scan,
                    cache) -> tuple[str, int]:
        """Rebuild one folder's tree from ``base``, re-examining only the names in ``node``.
        Its memo, and those of the folders on the way to it, no longer hold."""
        _check_depth(prefix)
        if scan.persist:
            scan.memos[prefix.rstrip("/")] = None
        tree = dict(self.trees.read(base))
        for name, child in node.items():
            if name == _RESCAN or name.startswith(TEMP_PREFIX):
                continue
            path = prefix + name
            old = tree.get(name)
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                mode = st.st_mode
                if st_.S_ISDIR(mode):
                    sub = os.open(name, _DIR_FLAGS, dir_fd=dfd)
                    try:
                        if child.get(_RESCAN) or old is None or not old.is_folder:
                            digest, size, kind = self._scan_tree(
                                sub, path, scan,
                                lambda: (cache, self.stat_cache.folders(self.path)))
                        else:
                            digest, size = self._update_dir(sub, path + "/", old.ref, child,
                                                            scan, cache)
                            kind = self._folder_kind(sub)
                    finally:
                        os.close(sub)
                    tree[name] = Entry(kind, st_.S_IMODE(mode), digest, size)
                elif st_.S_ISLNK(mode):
                    tree[name] = Entry(SYMLINK, 0, os.readlink(name, dir_fd=dfd))
                elif st_.S_ISREG(mode):
                    entry = self._scan_file(dfd, name, path, signature(st), scan, cache)
                    if entry is None:
                        tree.pop(name, None)
                    else:
                        tree[name] = entry
                elif self._is_whiteout(mode, st.st_rdev):
                    tree[name] = Entry(WHITEOUT, 0, "")
                else:
                    scan.warnings.append(f"skipped {path}: not a file, folder or symlink")
                    tree.pop(name, None)
            except (FileNotFoundError, NotADirectoryError):
                tree.pop(name, None)  # gone, or replaced while we looked
        total = sum(map(_SIZE, tree.values()))
        return self._store_tree(tree, scan, base), total

    def _is_whiteout(self, mode: int, rdev) -> bool:
        return self.overlay and st_.S_ISCHR(mode) and rdev == 0

    def _folder_kind(self, fd: int) -> str:
        if not self.overlay:
            return DIR
        try:
            return OPAQUE if os.getxattr(fd, OPAQUE_XATTR) == b"y" else DIR
        except OSError:
            return DIR

    def _scan_file(self, dfd: int, name: str, path: str, sig: Signature, scan: _Scan,
                   cache) -> Entry | None:
        """A file whose signature (taken by the caller) may not be the cached one."""
        return _cached_file(path, sig, scan, cache) or self._read_file(dfd, name, path, scan,
                                                                         cache)

    def _read_file(self, dfd: int, name: str, path: str, scan: _Scan, cache) -> Entry | None:
        """Read and store a file the stat cache could not vouch for."""
        known = cache.get(path)
        try:
            fd = os.open(name, _READ_FLAGS, dir_fd=dfd)
        except FileNotFoundError:
            return None  # removed since it was listed
        try:
            before = os.fstat(fd)
            if not st_.S_ISREG(before.st_mode):
                scan.warnings.append(f"skipped {path}: not a file, folder or symlink")
                return None
            digest, size = self._read_content(fd, before.st_size, scan.persist,
                                              known[1] if known is not None else None)
            after = os.fstat(fd)
        finally:
            os.close(fd)
        if signature(before) == signature(after) and not is_racy(after):
            scan.seen[path] = (signature(after), digest)
        return Entry(FILE, st_.S_IMODE(after.st_mode), digest, size)

    def _read_content(self, fd: int, size_hint: int, persist: bool,
                      previous: str | None) -> tuple[str, int]:
        """Store the file's content; ``previous`` is the digest its path had last time,
        a base the blob store may store the new version as a difference from."""
        if size_hint <= SMALL_FILE:
            chunks = []
            while chunk := os.read(fd, CHUNK):
                chunks.append(chunk)
            data = b"".join(chunks)
            return (self.blobs.put_bytes(data, base=previous) if persist
                    else digest_of(data)), len(data)
        if persist:
            return self.blobs.put_fd(fd)
        hasher, size = hashlib.sha256(), 0
        while chunk := os.read(fd, CHUNK):
            hasher.update(chunk)
            size += len(chunk)
        return hasher.hexdigest(), size

    def _store_tree(self, tree: dict[str, Entry], scan: _Scan, base: str | None = None) -> str:
        """Store a folder's tree; ``base``, its previous tree, may serve as a delta base.
        A full scan's trees (no base) are stored together when it ends: nearly all are
        stored already, and one question for many is cheaper than one each."""
        data = encode(tree)
        if scan.persist and base is None:
            digest = digest_of(data)
            scan.deferred.append(data)
            self.trees.remember(digest, tree)
        elif scan.persist:
            digest = self.blobs.put_bytes(data, base=base)
            self.trees.remember(digest, tree)
        else:
            digest = digest_of(data)
            scan.trees[digest] = tree
        return digest

    def remove_leftovers(self) -> list[str]:
        """Remove the temporary files a write aside left behind when the daemon died
        between writing and renaming (captures never see them, so a restore would not
        either). Called when an interrupted restore is completed. Returns their paths."""
        removed: list[str] = []
        root_fd = self._open_root()
        try:
            self._remove_leftovers(root_fd, "", removed)
        finally:
            os.close(root_fd)
        return removed

    def _remove_leftovers(self, dfd: int, prefix: str, removed: list[str]) -> None:
        _check_depth(prefix)
        for de in list(os.scandir(dfd)):
            if de.name.startswith(TEMP_PREFIX):
                _remove(dfd, de.name)
                removed.append(prefix + de.name)
            elif de.is_dir(follow_symlinks=False):
                sub = os.open(de.name, _DIR_FLAGS, dir_fd=dfd)
                try:
                    self._remove_leftovers(sub, f"{prefix}{de.name}/", removed)
                finally:
                    os.close(sub)

    # -- apply -----------------------------------------------------------------
    def apply(self, current: Capture, target_root: str, watch_new: bool = False) -> None:
        """With ``watch_new`` (a fork into a fresh folder), every folder is handed to the
        watch hook once its contents are written, so the tracker starts from the target
        tree without a scan and never sees the fork's own writes."""
        root_fd = self._open_root()
        mode = os.fstat(root_fd).st_mode & 0o7777
        watch = self.watcher.watch_folder if watch_new and self.watcher is not None else None
        try:
            self._sync_dir(root_fd, current.root, target_root, current.trees, watch, "")
            if watch is not None:
                watch("", root_fd)
        finally:
            os.fchmod(root_fd, mode)  # the workspace folder's own mode is not in the tree
            os.close(root_fd)

    def _sync_dir(self, dfd: int, cur_digest: str | None, tgt_digest: str, pending,
                  watch=None, prefix: str = "") -> None:
        if cur_digest == tgt_digest:
            return
        cur = self.trees.read(cur_digest, pending) if cur_digest else {}
        tgt = self.trees.read(tgt_digest)
        os.fchmod(dfd, os.fstat(dfd).st_mode & 0o7777 | 0o700)  # writable while we work
        for name in cur:
            if name not in tgt:
                _remove(dfd, name)
        for name, want in sorted(tgt.items()):
            check_name(name)
            have = cur.get(name)
            if have == want:
                continue
            if have is not None and have.is_folder != want.is_folder:
                _remove(dfd, name)
                have = None
            if want.is_folder:
                if have is None:
                    os.mkdir(name, 0o700, dir_fd=dfd)
                sub = os.open(name, _DIR_FLAGS, dir_fd=dfd)
                try:
                    self._sync_dir(sub, have.ref if have else None, want.ref, pending, watch,
                                   f"{prefix}{name}/")
                    os.fchmod(sub, want.mode)
                    if (have is None and want.kind == OPAQUE) or (
                            have is not None and have.kind != want.kind):
                        _set_opaque(sub, want.kind == OPAQUE)
                    if watch is not None:
                        watch(prefix + name, sub)
                finally:
                    os.close(sub)
            elif want.kind == FILE:
                if have is not None and have.kind == FILE and have.ref == want.ref:
                    _chmod_file(dfd, name, want.mode)
                else:
                    self._write_file(dfd, name, want)
            elif want.kind == WHITEOUT:
                if not self.overlay:
                    raise InvalidArgument("a whiteout belongs to a container layer, not here")
                _write_whiteout(dfd, name)
            else:
                _write_symlink(dfd, name, want.ref)
                progress.advance(0, files=1)

    def _write_file(self, dfd: int, name: str, entry: Entry) -> None:
        crash_point("restore.between_files")
        tmp = TEMP_PREFIX + os.urandom(8).hex()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=dfd)
        try:
            self.blobs.copy_to_fd(entry.ref, fd)
            os.fchmod(fd, entry.mode)
        except BaseException:
            os.close(fd)
            os.unlink(tmp, dir_fd=dfd)
            raise
        os.close(fd)
        crash_point("restore.before_rename")  # the file written aside, not yet in place
        os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        progress.advance(entry.size, files=1)


def _cached_file(path: str, sig: Signature, scan: _Scan, cache) -> Entry | None:
    """The file's entry from the stat cache if its signature is the cached one."""
    known = cache.get(path)
    if known is None or known[0] != sig:
        return None
    scan.seen[path] = known
    size, _, _, _, mode = SIG.unpack(sig)
    return Entry(FILE, st_.S_IMODE(mode), known[1], size)


class _FolderOpener:
    """Descriptors of folders below a scanned folder, for reading the files a walk found
    changed: opened one component at a time with O_NOFOLLOW (a folder swapped for a
    symlink since the walk is never followed), the last one kept open."""

    def __init__(self, dfd: int, prefix: str) -> None:
        self.dfd = dfd
        self.prefix = prefix
        self.rel: str | None = None
        self.fd: int | None = None

    def open(self, rel: str) -> int | None:
        """The folder at workspace path ``rel``, or None if it is gone or not a folder."""
        if rel == self.rel:
            return self.fd
        self.close()
        below = rel[len(self.prefix):].lstrip("/")
        fd: int | None = os.dup(self.dfd)
        try:
            for part in below.split("/") if below else ():
                sub = os.open(part, _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = sub
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                raise
            fd = None  # gone, or replaced by a file or a symlink since the walk
        self.rel, self.fd = rel, fd
        return fd

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
        self.rel = self.fd = None

    def __enter__(self) -> "_FolderOpener":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_depth(prefix: str) -> None:
    if prefix.count("/") > MAX_DEPTH:
        raise _too_deep(prefix)


def _too_deep(path: str) -> FailedPrecondition:
    return FailedPrecondition(f"{path[:120]}... is more than {MAX_DEPTH} folders deep;"
                              " worldline captures trees up to that depth")


def _remove(dfd: int, name: str) -> None:
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if st_.S_ISDIR(st.st_mode):
        _make_tree_writable(dfd, name)
        shutil.rmtree(name, dir_fd=dfd)
    else:
        os.unlink(name, dir_fd=dfd)


def _make_tree_writable(dfd: int, name: str) -> None:
    """Give the owner rwx on every folder below ``name`` so a non-root daemon can empty it."""
    fd = os.open(name, _DIR_FLAGS, dir_fd=dfd)
    try:
        os.fchmod(fd, os.fstat(fd).st_mode & 0o7777 | 0o700)
        for de in os.scandir(fd):
            if de.is_dir(follow_symlinks=False):
                _make_tree_writable(fd, de.name)
    finally:
        os.close(fd)


def _chmod_file(dfd: int, name: str, mode: int) -> None:
    fd = os.open(name, _READ_FLAGS, dir_fd=dfd)
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def _set_opaque(fd: int, opaque: bool) -> None:
    if opaque:
        os.setxattr(fd, OPAQUE_XATTR, b"y")
    else:
        try:
            os.removexattr(fd, OPAQUE_XATTR)
        except OSError:
            pass


def _write_whiteout(dfd: int, name: str) -> None:
    """An overlay whiteout: a 0/0 character device (needs CAP_MKNOD, as the engine has)."""
    tmp = TEMP_PREFIX + os.urandom(8).hex()
    os.mknod(tmp, st_.S_IFCHR | 0o000, os.makedev(0, 0), dir_fd=dfd)
    os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)


def _write_symlink(dfd: int, name: str, target: str) -> None:
    tmp = TEMP_PREFIX + os.urandom(8).hex()
    os.symlink(target, tmp, dir_fd=dfd)
    os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)


_SIZE = operator.attrgetter("size")
_RESCAN = "\0rescan"  # a key no file name can be (names never hold NUL)


def _trie(changes: Changes) -> dict:
    """Nested dicts of the changed paths; a rescan path's node is marked ``_RESCAN``."""
    root: dict = {}
    for paths, rescan in ((changes.dirty, False), (changes.rescan, True)):
        for path in paths:
            node = root
            for part in path.split("/"):
                node = node.setdefault(part, {})
            if rescan:
                node[_RESCAN] = True
    return root


# -- the reference snapshotter ---------------------------------------------------

@dataclass(frozen=True)
class MemoryFile:
    kind: str  # FILE | SYMLINK | DIR
    mode: int = 0o644
    data: bytes = b""  # content of a FILE, target of a SYMLINK (UTF-8)


class MemorySnapshotter:
    """A world held in a dict {relative path: MemoryFile}; parents are implied folders
    unless listed. The reference implementation of the Snapshotter contract."""

    def __init__(self, blobs: BlobStore, trees: TreeReader,
                 files: dict[str, MemoryFile] | None = None) -> None:
        self.blobs = blobs
        self.trees = trees
        self.files: dict[str, MemoryFile] = dict(files or {})

    def capture(self, persist: bool = True, changes: Changes | None = None,
                base: str | None = None) -> Capture:
        nested: dict = {}
        for path, f in self.files.items():
            parts = path.split("/")
            for part in parts:
                check_name(part)
            node = nested
            for part in parts[:-1]:
                node = node.setdefault(part, ({}, 0o755))[0]
            if f.kind == DIR:
                node.setdefault(parts[-1], ({}, f.mode))
                node[parts[-1]] = (node[parts[-1]][0], f.mode)
            else:
                node[parts[-1]] = f
        scan = _Scan(persist)
        root, size = self._build(nested, scan)
        return Capture(root, size, scan.trees, [], {}, persist)

    def _build(self, nested: dict, scan: _Scan) -> tuple[str, int]:
        tree, total = {}, 0
        for name, node in nested.items():
            if isinstance(node, MemoryFile):
                if node.kind == FILE:
                    d = self.blobs.put_bytes(node.data) if scan.persist else digest_of(node.data)
                    tree[name] = Entry(FILE, node.mode, d, len(node.data))
                    total += len(node.data)
                else:
                    tree[name] = Entry(SYMLINK, 0, node.data.decode("utf-8", "surrogateescape"))
            else:
                digest, size = self._build(node[0], scan)
                tree[name] = Entry(DIR, node[1], digest, size)
                total += size
        data = encode(tree)
        if scan.persist:
            digest = self.blobs.put_bytes(data)
        else:
            digest = digest_of(data)
            scan.trees[digest] = tree
        return digest, total

    def apply(self, current: Capture, target_root: str) -> None:
        files: dict[str, MemoryFile] = {}
        for path, entry in self.trees.walk(target_root):
            if entry.kind == FILE:
                files[path] = MemoryFile(FILE, entry.mode, self.blobs.read_bytes(entry.ref))
            elif entry.kind == SYMLINK:
                files[path] = MemoryFile(SYMLINK, 0, entry.ref.encode("utf-8", "surrogateescape"))
            else:
                files[path] = MemoryFile(DIR, entry.mode)
        self.files = files

    def commit(self, capture: Capture) -> None:
        return None
