"""How ``WorkspaceSnapshotter`` (snapshot.py) builds a layer's trees: the full scan
(one walk of the layer, walk.py, with the folders whose memo held given back whole and
the rest rebuilt here, children first) and the incremental update (a head's trees
rewritten along the paths the tracker says may have changed).

Each file is read by the snapshotter itself (``_read_file``, ``_read_symlink``,
``_special``), which these functions call with the snapshotter they are given; a file
or symlink whose signature the stat cache holds is taken from it (``cached_file``)
without being opened.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import os
import stat as st_
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from worldline.wire.errors import FailedPrecondition

from .descriptors import DIR_FLAGS as _DIR_FLAGS
from .fsmeta import read_xattrs
from .statcache import is_racy_signature
from .tracker import TEMP_PREFIX, Changes
from .trees import DIR, OPAQUE, SOCKET, SYMLINK, Entry, Tree, TreeReader, links_of, make_extra
from .walk import MAX_DEPTH, SIG, TooManyEntries, join_path, signature, walk, walk_python

if TYPE_CHECKING:
    from .snapshot import WorkspaceSnapshotter, _Scan


def stat_caches(snap: WorkspaceSnapshotter,
                untrusted: frozenset[str] | set[str] = frozenset(),
                memos: bool = True) -> Callable[[], tuple[dict, dict]]:
    """The stat cache's files and folder memos for this world; no memo of a folder
    holding an ``untrusted`` file (so the walk lists that folder, and the file is
    read: ``cached_file``), none at all without ``memos``. When they are not in
    memory yet (the first scan after a start), they load in a thread while the walk
    makes its system calls."""
    def get() -> tuple[dict, dict]:
        return (snap.stat_cache.entries(snap.path),
                _without_parents(snap.stat_cache.folders(snap.path), untrusted)
                if memos else {})
    if snap.stat_cache.loaded(snap.path):
        return get
    loading = concurrent.futures.Future()

    def load() -> None:
        try:
            loading.set_result(get())
        except BaseException as exc:
            loading.set_exception(exc)
    threading.Thread(target=load, name="stat-cache-load", daemon=True).start()
    return loading.result


def rescan_caches(snap: WorkspaceSnapshotter, scan: _Scan) -> Callable[[], tuple[dict, dict]]:
    """The caches for a folder an incremental capture scans whole (one that
    appeared), made once a capture: a tree of new folders is many rescans."""
    if scan.rescan_caches is None:
        pair = stat_caches(snap, scan.untrusted, scan.excluded is None)()  # loaded: the
        # capture read the files
        scan.rescan_caches = lambda: pair
    return scan.rescan_caches


def scan_tree(snap: WorkspaceSnapshotter, dfd: int, prefix: str, scan: _Scan,
              caches: Callable[[], tuple[dict, dict]]
              ) -> tuple[str, int, str, str, int]:
    """A full scan of the folder open at ``dfd`` (``prefix`` is its path, "" for the
    root): one walk (walk.py) lists, stats and watches everything, skipping the
    folders whose memo holds; the rest are rebuilt here, children first. Returns
    the folder's tree digest, its size, its kind, its extras (xattrs) and the names
    in its tree and below it (each folder's count is kept: ``TreeReader.count``). A
    walk past ``--max-entries`` stops there: RESOURCE_EXHAUSTED."""
    depth = prefix.count("/") + 1 if prefix else 0
    root_sig = signature(os.fstat(dfd))
    watching = (scan.watcher.scanning() if scan.watcher is not None
                else contextlib.nullcontext((-1, 0, None)))
    with watching as (inotify_fd, mask, register):
        try:
            # Exclusions: the Python twin, which asks before it keeps or enters
            # a name (an excluded folder is never opened)
            records, reused, root, listed = (walk(
                dfd, inotify_fd, mask, MAX_DEPTH - depth, snap.overlay, caches,
                root_sig, prefix, scan.max_entries) if scan.excluded is None else
                walk_python(dfd, inotify_fd, mask, MAX_DEPTH - depth, snap.overlay,
                            caches, root_sig, prefix, scan.max_entries,
                            skip=scan.excluded))
        except RecursionError as exc:
            raise too_deep(str(exc)) from None
        except TooManyEntries:
            raise scan.budget.too_many_entries(snap._layer_name()) from None
        if register is not None:
            register([(r[0], r[1]) for r in records] + [r[:2] for r in reused])
    names = {rel: below for rel, _, below in reused}  # of the folders whose memo held
    scan.reused.update(names)
    cache = caches()[0]
    built: list[tuple[str, int, str, bool, str, int]] = []
    with FolderOpener(dfd, prefix) as opener:
        for record in records:
            built.append(build_folder(snap, record, built, names, opener, scan, cache))
    if not isinstance(root, int):
        if scan.persist:
            snap.trees.remember_count(root[1], names[prefix])
        return root[1], root[2], root[3], root[4], names[prefix]
    digest, size, kind, clean, extra, below = built[root]
    if scan.persist:
        scan.memos[prefix] = ((root_sig, digest, size, kind, extra)
                              if clean and not is_racy_signature(root_sig) else None)
    return digest, size, kind, extra, below


def build_folder(snap: WorkspaceSnapshotter, record, built: list, names: dict[str, int],
                 opener: FolderOpener, scan: _Scan, cache
                 ) -> tuple[str, int, str, bool, str, int]:
    """One folder of a walk whose memo did not hold: its tree, size, kind, whether a
    memo may be written for it (everything in it was cached, nothing racy), its own
    extras (the folder's xattrs, for its parent's entry), and the names in its tree
    and below it (``names``: the walk's count for each folder whose memo held)."""
    rel, _wd, opaque, entries = record
    folder = opener.open(rel)
    if folder is None:  # gone since the walk listed it: the tracker saw that
        return snap._store_tree(Tree(), scan, rel=rel), 0, DIR, False, "", 0
    tree = Tree()
    total = 0
    below = 0  # names in the folders below
    clean = True
    for name, sig, extra in entries:
        if name.startswith(TEMP_PREFIX):
            continue
        path = join_path(rel, name)
        fields = SIG.unpack(sig)
        mode = fields[4]
        if not scan.persist:
            scan.inodes[path] = fields[3]
        if st_.S_ISDIR(mode):
            if isinstance(extra, int):
                digest, sub_size, kind, sub_clean, sub_extra, sub_names = built[extra]
                memo = (sig, digest, sub_size, kind, sub_extra)
                if not sub_clean or is_racy_signature(sig):
                    memo, clean = None, False
                if scan.persist:
                    scan.memos[path] = memo
            else:
                _, digest, sub_size, kind, sub_extra = extra
                sub_names = names[path]
                if scan.persist:
                    snap.trees.remember_count(digest, sub_names)
            below += sub_names
            entry = Entry(kind, st_.S_IMODE(mode), digest, sub_size, fields[5],
                          fields[6], fields[1], sub_extra)
        elif st_.S_ISREG(mode) or st_.S_ISLNK(mode):
            entry = cached_file(path, sig, fields, scan, cache)
            if entry is None:  # changed, or never seen: read it
                entry = (snap._read_file(folder, name, path, scan, cache)
                         if st_.S_ISREG(mode) else
                         snap._read_symlink(folder, name, path, extra, sig, fields, scan))
                clean = clean and path in scan.seen
        else:
            entry = snap._special(folder, name, path, fields, extra, scan)
            clean = False
        if entry is not None:
            tree[name] = entry
            total += entry.size if entry.kind != SOCKET else 0
    own_extra = make_extra(read_xattrs(folder, rel)) if rel else ""
    digest, names_here = snap._store_tree(tree, scan, rel=rel), len(tree) + below
    if scan.persist:
        snap.trees.remember_count(digest, names_here)
    return digest, total, OPAQUE if opaque else DIR, clean, own_extra, names_here


def update_dir(snap: WorkspaceSnapshotter, dfd: int, prefix: str, base: str, node: dict,
               scan: _Scan, cache) -> tuple[str, int, int]:
    """Rebuild one folder's tree from ``base``, re-examining only the names in ``node``.
    Its memo, and those of the folders on the way to it, no longer hold. Returns its
    digest, its size, and how many names below it were added (fewer than none:
    removed)."""
    check_depth(prefix)
    if scan.persist:
        scan.memos[prefix.rstrip("/")] = None
    was = snap.trees.read(base)
    tree = Tree(was)
    added = 0
    for name, child in node.items():
        if name == _RESCAN or name.startswith(TEMP_PREFIX):
            continue
        path = prefix + name
        old = tree.get(name)
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            mode = st.st_mode
            if scan.excluded is not None and scan.excluded(path, st_.S_ISDIR(mode)):
                tree.pop(name, None)  # not in the base either: the same rules
                added -= _names(snap.trees, old)
                continue
            if not scan.persist:
                scan.inodes[path] = st.st_ino
            if st_.S_ISDIR(mode):
                sub = os.open(name, _DIR_FLAGS, dir_fd=dfd)
                try:
                    st = os.fstat(sub)  # the folder opened, not the name stat'ed
                    if not scan.persist:
                        scan.inodes[path] = st.st_ino
                    if child.get(_RESCAN) or old is None or not old.is_folder:
                        digest, size, kind, extra, below = scan_tree(
                            snap, sub, path, scan, rescan_caches(snap, scan))
                        change = 1 + below - _names(snap.trees, old)
                    else:
                        digest, size, change = update_dir(
                            snap, sub, path + "/", old.ref, child, scan, cache)
                        kind = snap._folder_kind(sub)
                        extra = make_extra(read_xattrs(sub, path))
                finally:
                    os.close(sub)
                tree[name] = Entry(kind, st_.S_IMODE(st.st_mode), digest, size,
                                   st.st_uid, st.st_gid, st.st_mtime_ns, extra)
                added += change
                continue
            sig = signature(st)
            fields = SIG.unpack(sig)
            if st_.S_ISREG(mode) or st_.S_ISLNK(mode):
                entry = cached_file(path, sig, fields, scan, cache)
                if entry is None:
                    entry = (snap._read_file(dfd, name, path, scan, cache,
                                             old if old is not None
                                             and old.has_content else None)
                             if st_.S_ISREG(mode) else snap._listed_symlink(
                                 dfd, name, path, sig, fields, scan))
            else:
                entry = snap._special(dfd, name, path, fields, st.st_rdev, scan)
            if entry is None:
                tree.pop(name, None)
            else:
                tree[name] = entry
            added += (entry is not None) - _names(snap.trees, old)
        except (FileNotFoundError, NotADirectoryError):
            tree.pop(name, None)  # gone, or replaced while we looked
            added -= _names(snap.trees, old)
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            tree.pop(name, None)  # a folder swapped for a symlink while we looked
            added -= _names(snap.trees, old)
    if prefix == "":
        own = getattr(was, "own", None)
        tree.own = snap._root_entry(scan, links_of(own))
    data, total, rows = snap.trees.encode_update(tree, base, node)
    digest = snap._stored(tree, data, scan, base)
    if rows is not None and scan.persist:
        snap.trees.keep_rows(digest, rows, len(data))
    return digest, total, added


def _names(trees: TreeReader, entry: Entry | None) -> int:
    """The names an entry of a tree stands for: itself and, a folder, all below it."""
    if entry is None:
        return 0
    return 1 + trees.count(entry.ref) if entry.is_folder else 1


def cached_file(path: str, sig: bytes, fields: tuple, scan: _Scan, cache) -> Entry | None:
    """The entry of a file or symlink from the stat cache, if its signature is cached
    and its stat may vouch for it."""
    if path in scan.untrusted:
        return None
    known = cache.get(path)
    if known is None or known[0] != sig or len(known) != 4:
        return None
    scan.seen[path] = known
    _, ref, extra, kind = known
    size, mtime, _, ino, mode, uid, gid, nlink, _ = fields
    if nlink > 1 and kind != SYMLINK:
        scan.links[path] = ino
    if kind == SYMLINK:
        return Entry(SYMLINK, 0, ref, 0, uid, gid, mtime, extra)
    return Entry(kind, st_.S_IMODE(mode), ref, size, uid, gid, mtime, extra)


class FolderOpener:
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
        self.rel, self.fd = rel, open_below(self.dfd, below)
        return self.fd

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
        self.rel = self.fd = None

    def __enter__(self) -> "FolderOpener":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_below(dfd: int, below: str) -> int | None:
    """A new descriptor of the folder ``below`` (a relative path, "" for ``dfd`` itself),
    opened one component at a time with O_NOFOLLOW; None if it is gone or not a folder
    (a symlink included)."""
    fd = os.dup(dfd)
    try:
        for part in below.split("/") if below else ():
            sub = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = sub
    except OSError as exc:
        os.close(fd)
        if exc.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            raise
        return None
    return fd


def check_depth(prefix: str) -> None:
    if prefix.count("/") > MAX_DEPTH:
        raise too_deep(prefix)


def too_deep(path: str) -> FailedPrecondition:
    return FailedPrecondition(f"{path[:120]}... is more than {MAX_DEPTH} folders deep;"
                              " worldline captures trees up to that depth")


_RESCAN = "\0rescan"  # a key no file name can be (names never hold NUL)


def nothing_cached() -> tuple[dict, dict]:
    """The caches of a scan that trusts no stat: no file, no folder memo."""
    return {}, {}


def _without_parents(folders: dict, untrusted: frozenset[str] | set[str]) -> dict:
    """The folder memos less those of the folders holding an ``untrusted`` file: a copy
    only when there is one to leave out."""
    parents = {p.rpartition("/")[0] for p in untrusted}
    if not any(p in folders for p in parents):
        return folders
    return {rel: memo for rel, memo in folders.items() if rel not in parents}


def trie(changes: Changes, mapped: frozenset[str] = frozenset()) -> dict:
    """Nested dicts of the changed paths (and of every file with other hard links: a
    write through one name gives no event for the others; and of every file mapped
    shared and writable: no event at all); a rescan path's node is marked
    ``_RESCAN``."""
    root: dict = {}
    for paths, rescan in ((changes.dirty, False), (changes.linked, False),
                          (mapped, False), (changes.rescan, True)):
        for path in paths:
            node = root
            for part in path.split("/"):
                node = node.setdefault(part, {})
            if rescan:
                node[_RESCAN] = True
    return root
