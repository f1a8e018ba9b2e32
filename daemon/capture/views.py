"""Overlay forks: a fork's workspace as an overlay mount over read-only views.

A *view* is a tree materialized once, read-only, under ``<root>/views``. A fork of
checkpoint C mounts overlayfs at the fork's workspace: its lower layers are a
*delta* (what C's tree changes relative to an existing view: the files it adds or
changes, whiteouts for what it deletes) over that view; its upper layer, under
``<root>/forks/<session>``, takes every write the fork makes, so the fork is
independent of its parent and of every other fork. A fork then costs a small delta
and a mount instead of a copy of the whole tree; the first fork in a lineage pays
for building the view once.

Views and deltas are never written after they are built (overlayfs forbids changes
to a mounted lower layer). The mounts are recorded in ``forks/<session>/mount.json``
and mounted again at start (after a reboot, say). Where overlay mounts are not
permitted (not root, no overlayfs), forks copy instead.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import shutil
from dataclasses import replace

from .. import progress
from ..storage.blobs import BlobStore
from ..storage.statcache import StatCache, signature
from .fsmeta import Applier
from .snapshot import Capture, WorkspaceSnapshotter
from .trees import DIR, SYMLINK, WHITEOUT, Entry, Tree, TreeReader, diff, encode, links_of

log = logging.getLogger(__name__)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_char_p]
MAX_DELTA_PATHS = 2000  # a delta past this many paths: build the tree's own view instead


def overlay_permitted() -> bool:
    if os.geteuid() != 0:
        return False
    try:
        with open("/proc/filesystems") as f:
            return any(line.split()[-1] == "overlay" for line in f if line.strip())
    except OSError:
        return False


def _escape(path: str) -> str:
    return path.replace("\\", "\\\\").replace(":", "\\:").replace(",", "\\,")


class Views:
    def __init__(self, root: str, blobs: BlobStore, trees: TreeReader,
                 stat_cache: StatCache) -> None:
        self.views = os.path.join(root, "views")
        self.forks = os.path.join(root, "forks")
        self.blobs = blobs
        self.trees = trees
        self.stat_cache = stat_cache
        self.enabled = overlay_permitted()
        os.makedirs(self.views, mode=0o700, exist_ok=True)
        os.makedirs(self.forks, mode=0o700, exist_ok=True)

    # -- views and deltas ----------------------------------------------------------------
    def _view_path(self, tree: str) -> str:
        return os.path.join(self.views, tree)

    def _built(self) -> list[str]:
        """Trees that have a finished view, newest first."""
        names = [n for n in os.listdir(self.views) if len(n) == 64]
        return sorted(names, key=lambda n: os.stat(self._view_path(n)).st_mtime, reverse=True)

    def _materialize(self, name: str, tree: str, overlay: bool, size: int = 0) -> str:
        """Write ``tree`` into views/<name> (aside, then renamed: a view is whole or absent),
        recording every file's stat so forks over it never rehash an unchanged file."""
        final = os.path.join(self.views, name)
        if os.path.isdir(final):
            return final
        tmp = final + f".building-{os.getpid()}-{os.urandom(4).hex()}"
        os.makedirs(tmp, mode=0o755)
        try:
            snap = WorkspaceSnapshotter(tmp, self.blobs, self.trees, self.stat_cache,
                                        overlay=overlay)
            progress.begin("fork: building a read-only view of the checkpoint", size)
            snap.apply(Capture(encode_empty(self.blobs), 0), tree, private=True)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self.stat_cache.update(final, self._signatures(final, tree), set())
        return final

    def _signatures(self, folder: str, tree: str) -> dict[str, tuple]:
        out = {}
        for path, entry in self.trees.walk(tree):
            if entry.has_content or entry.kind == SYMLINK:
                out[path] = (signature(os.lstat(os.path.join(folder, path))), entry.ref,
                             entry.extra, entry.kind)
        return out

    def _delta_tree(self, base: str, target: str) -> tuple[str, int]:
        """A tree that, laid over ``base`` as an overlay upper layer, shows ``target``;
        with the bytes of the files it holds."""
        b, t = self.trees.read(base), self.trees.read(target)
        out = Tree(own=t.own)  # a folder's owner, mode, xattrs and time: the target's
        for name in b.keys() | t.keys():
            eb, et = b.get(name), t.get(name)
            if eb == et:
                continue
            if et is None:
                out[name] = Entry(WHITEOUT, 0, "")
            elif et.is_folder and eb is not None and eb.is_folder:
                ref, size = self._delta_tree(eb.ref, et.ref)
                out[name] = replace(et, kind=DIR, ref=ref, size=size)
            else:
                out[name] = et
        digest = self.blobs.put_bytes(encode(out))
        self.trees.remember(digest, out)
        return digest, sum(e.size for e in out.values() if e.kind != WHITEOUT)

    def lowers(self, tree: str, size: int = 0) -> list[str]:
        """Lower layers (top first) whose union is ``tree`` (of ``size`` bytes), building
        what is missing."""
        if os.path.isdir(self._view_path(tree)):
            return [self._view_path(tree)]
        # Hard links cannot span two layers: a tree with link groups gets a view of its own.
        bases = [] if links_of(self.trees.read(tree).own) else self._built()[:4]
        for base in bases:
            changes = diff(self.trees, base, tree)
            if len(changes.added) + len(changes.modified) + len(changes.deleted) \
                    <= MAX_DELTA_PATHS:
                delta, delta_size = self._delta_tree(base, tree)
                self.blobs.sync()
                name = f"delta-{base[:20]}-{tree[:20]}"
                return [self._materialize(name, delta, overlay=True, size=delta_size),
                        self._view_path(base)]
        return [self._materialize(tree, tree, overlay=False, size=size)]

    # -- mounts -----------------------------------------------------------------------------
    def mount_fork(self, session_id: str, workspace: str, tree: str, size: int = 0) -> None:
        lowers = self.lowers(tree, size)
        state = os.path.join(self.forks, session_id)
        spec = {"workspace": workspace, "lowers": lowers, "tree": tree,
                "upper": os.path.join(state, "upper"), "work": os.path.join(state, "work")}
        os.makedirs(spec["upper"], mode=0o755, exist_ok=True)
        os.makedirs(spec["work"], mode=0o700, exist_ok=True)
        self._mount(spec)
        own = self.trees.read(tree).own
        if own is not None:  # the fork's folder: the owner, mode and time of the source's
            fd = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            try:
                Applier().apply_fd(fd, own, ".", folder=True)
            finally:
                os.close(fd)
        with open(os.path.join(state, "mount.json"), "w") as f:
            json.dump(spec, f)
        self._seed_stat_cache(workspace, lowers, tree)

    def _mount(self, spec: dict) -> None:
        options = (f"lowerdir={':'.join(_escape(p) for p in spec['lowers'])},"
                   f"upperdir={_escape(spec['upper'])},workdir={_escape(spec['work'])}")
        if _libc.mount(b"overlay", os.fsencode(spec["workspace"]), b"overlay", 0,
                       options.encode()) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"overlay mount at {spec['workspace']}: {os.strerror(err)}")

    def _seed_stat_cache(self, workspace: str, lowers: list[str], tree: str) -> None:
        """Files not yet written by the fork show their lower file's stat through the
        overlay (same inode on one file system), so the lowers' entries hold for them."""
        merged: dict[str, tuple] = {}
        for lower in reversed(lowers):
            merged.update(self.stat_cache.entries(lower))
        wanted = {path: e.ref for path, e in self.trees.walk(tree)
                  if e.has_content or e.kind == SYMLINK}
        self.stat_cache.update(workspace, {p: v for p, v in merged.items()
                                           if wanted.get(p) == v[1]}, set())

    def remount_all(self) -> list[str]:
        """At start: mount again every fork whose mount is gone (a reboot)."""
        report = []
        for sid in os.listdir(self.forks):
            spec_path = os.path.join(self.forks, sid, "mount.json")
            if not os.path.exists(spec_path):
                continue
            with open(spec_path) as f:
                spec = json.load(f)
            if os.path.ismount(spec["workspace"]):
                continue
            try:
                os.makedirs(spec["workspace"], exist_ok=True)
                self._mount(spec)
                report.append(f"mounted fork {sid} at {spec['workspace']} again")
            except OSError as exc:
                report.append(f"cannot mount fork {sid} again: {exc}")
        return report

    def unmount(self, workspace: str) -> None:
        _libc.umount2(os.fsencode(workspace), 2)  # MNT_DETACH


def encode_empty(blobs: BlobStore) -> str:
    return blobs.put_bytes(encode({}))
