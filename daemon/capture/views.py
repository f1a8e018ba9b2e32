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
(written aside, fsynced and renamed before the fork is recorded) and mounted again at
start (after a reboot, say). A record that cannot be read (a damaged disk) never keeps
the daemon from starting: the fork's mount is made again from its session (its
workspace, and the tree it was forked from) over the same upper layer, so nothing the
fork wrote is lost; a fork with no session (one that died before it was recorded) is
left to the start's recovery, which removes it. Where overlay mounts are not
permitted (not root, no overlayfs), forks copy instead.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import replace

from .. import progress
from ..storage.blob_store import BlobStore
from ..storage.durable import fsync_folder, replace_file
from .fsmeta import Applier
from .resolve import identity_of, make_folder, open_folder
from .snapshot import WorkspaceSnapshotter
from .snapshotter import Capture
from .statcache import StatCache, signature
from .trees import DIR, SYMLINK, WHITEOUT, Entry, Tree, TreeReader, diff, encode, links_of

log = logging.getLogger(__name__)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_char_p]
MAX_DELTA_PATHS = 2000  # a delta past this many paths: build the tree's own view instead
SPEC = "mount.json"  # forks/<session>/SPEC: the fork's overlay mount
RELEASED = "released"  # forks/<session>/RELEASED: its session was deleted, not mounted
_TREE = re.compile(r"[0-9a-f]{64}")
_VIEW = re.compile(r"[0-9a-f]{64}|delta-[0-9a-f]{20}-[0-9a-f]{20}")  # a view's name


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
        data = encode(out)
        digest = self.blobs.put_bytes(data)
        self.trees.remember(digest, out, len(data))
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
        state = os.path.join(self.forks, session_id)
        spec = self._spec(session_id, workspace, tree, self.lowers(tree, size))
        os.makedirs(spec["upper"], mode=0o755, exist_ok=True)
        os.makedirs(spec["work"], mode=0o700, exist_ok=True)
        self._mount(spec)
        lowers = spec["lowers"]
        own = self.trees.read(tree).own
        if own is not None:  # the fork's folder: the owner, mode and time of the source's
            fd = open_folder(workspace, os.O_RDONLY)
            try:
                Applier().apply_fd(fd, own, ".", folder=True)
            finally:
                os.close(fd)
        self._write_spec(state, spec)
        self._seed_stat_cache(workspace, lowers, tree)

    def _spec(self, session_id: str, workspace: str, tree: str, lowers: list[str]) -> dict:
        state = os.path.join(self.forks, session_id)
        return {"workspace": workspace, "lowers": lowers, "tree": tree,
                "upper": os.path.join(state, "upper"), "work": os.path.join(state, "work")}

    def _write_spec(self, state: str, spec: dict) -> None:
        """The fork's record, whole or absent, and durable before the fork is recorded:
        written aside, fsynced, renamed; its folder and the forks folder fsynced."""
        replace_file(os.path.join(state, SPEC), json.dumps(spec))
        fsync_folder(self.forks)

    def _as_written(self, session_id: str) -> object:
        """Fork ``session_id``'s record as JSON, unchecked; None if it has none. Raises
        ValueError for one that cannot be read."""
        path = os.path.join(self.forks, session_id, SPEC)
        try:
            with open(path, "rb") as f:
                return json.loads(f.read(1 << 20))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:  # unreadable, not UTF-8, not JSON
            raise ValueError(f"{path} cannot be read: {exc}") from None

    def read_spec(self, session_id: str) -> dict | None:
        """Fork ``session_id``'s mount as recorded; None if it has no record. Raises
        ValueError, saying why, for a record that is not one this daemon writes (a
        damaged disk): its paths are never mounted or unmounted."""
        spec = self._as_written(session_id)
        return None if spec is None else self._checked(session_id, spec)

    def _checked(self, session_id: str, spec: object) -> dict:
        """``spec``, fork ``session_id``'s record as written, if it is one this daemon
        writes; else ValueError, saying why."""
        path = os.path.join(self.forks, session_id, SPEC)
        want = self._spec(session_id, "", "", [])
        if not (isinstance(spec, dict) and set(spec) == set(want)
                and isinstance(spec["workspace"], str) and os.path.isabs(spec["workspace"])
                and isinstance(spec["tree"], str) and _TREE.fullmatch(spec["tree"])
                and isinstance(spec["lowers"], list) and spec["lowers"]
                and all(isinstance(p, str) and os.path.dirname(p) == self.views
                        and _VIEW.fullmatch(os.path.basename(p)) for p in spec["lowers"])
                and spec["upper"] == want["upper"] and spec["work"] == want["work"]):
            raise ValueError(f"{path} is not a fork's mount record")
        return spec

    def used(self) -> set[str] | None:
        """The views the recorded forks mount (their names); None if a record cannot
        be read, when which views a fork needs is unknown."""
        used: set[str] = set()
        for sid in os.listdir(self.forks):
            try:
                spec = self.read_spec(sid)
                if spec is None and os.path.isdir(os.path.join(self.forks, sid, "upper")):
                    raise ValueError(f"fork {sid} has an upper layer and no {SPEC}")
            except ValueError as exc:
                log.warning("forks: %s", exc)
                return None
            if spec is not None:
                used.update(os.path.basename(p) for p in spec["lowers"])
        return used

    def _mount(self, spec: dict) -> None:
        """Mount the fork onto the folder its workspace path names, reached through no
        symlink (the agent may own a folder on the way): ELOOP if one is there."""
        options = (f"lowerdir={':'.join(_escape(p) for p in spec['lowers'])},"
                   f"upperdir={_escape(spec['upper'])},workdir={_escape(spec['work'])}")
        fd = open_folder(spec["workspace"])
        try:
            if _libc.mount(b"overlay", f"/proc/self/fd/{fd}".encode(), b"overlay", 0,
                           options.encode()) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"overlay mount at {spec['workspace']}:"
                                   f" {os.strerror(err)}")
        finally:
            os.close(fd)

    @staticmethod
    def _make_mount_point(workspace: str) -> None:
        """The fork's folder, and those above it, where a reboot left none (a /tmp
        emptied), made through no symlink."""
        fd, _ = make_folder(workspace)
        os.close(fd)

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

    def remount_all(self, origin: Callable[[str], tuple[str, str] | None],
                    remounted: Callable[[str, list[int]], None]) -> list[str]:
        """At start: mount again every fork whose mount is gone (a reboot), onto the
        folder its path names through no symlink (one there: not mounted, and said), and
        tell ``remounted`` the new mount's identity (st_dev, st_ino), which a session
        checks its workspace against. ``origin`` gives a recorded fork's (workspace,
        tree it was forked from), None for a fork that was never recorded: a fork whose
        mount record is damaged or lost (its upper layer is there) is mounted from that,
        over the same upper layer, and recorded anew."""
        report = []
        for sid in os.listdir(self.forks):
            recorded = None
            if os.path.exists(os.path.join(self.forks, sid, RELEASED)):
                continue  # its session was deleted (release)
            try:
                recorded = self._as_written(sid)
                if recorded is None and not os.path.isdir(os.path.join(self.forks, sid,
                                                                       "upper")):
                    continue  # not an overlay fork's
                if recorded is None:
                    raise ValueError(f"fork {sid} has an upper layer and no {SPEC}")
                spec = self._checked(sid, recorded)
            except ValueError as exc:
                other = self._original_of_copy(recorded)
                if other is not None:
                    report.append(
                        f"fork {sid}'s record names the layers of the data root at {other},"
                        " which is there: this data root is a copy of it, and the fork's"
                        f" workspace is that root's; not mounted at {recorded['workspace']}")
                    continue
                spec = self._rebuilt_spec(sid, origin, exc, report)
                if spec is None:
                    continue
            if os.path.ismount(spec["workspace"]):
                continue
            try:
                self._make_mount_point(spec["workspace"])
                self._mount(spec)
                # the mount's root, as sessions see it
                identity = identity_of(open_folder(spec["workspace"]))
            except OSError as exc:
                report.append(f"cannot mount fork {sid} again: {exc}")
                continue
            try:
                remounted(sid, identity)
            except Exception as exc:  # a start is never stopped by one fork
                report.append(f"mounted fork {sid} again, but its new identity could not"
                              f" be recorded (its calls are refused until then): {exc}")
                continue
            report.append(f"mounted fork {sid} at {spec['workspace']} again")
        return report

    def _original_of_copy(self, recorded: object) -> str | None:
        """The data root a fork's record (as written) names the upper layer of, when
        that is another root's folder and it is there: this root is a copy of that one
        (an operator's backup, started), whose fork it is to mount, at a workspace path
        that is that root's. None when the record names this root, or another that is
        gone (this root was moved: the fork is rebuilt here and mounted,
        ``_rebuilt_spec``), or is no record with a workspace and an upper layer."""
        if not isinstance(recorded, dict) or not isinstance(recorded.get("workspace"), str):
            return None
        upper = recorded.get("upper")
        if not isinstance(upper, str) or not os.path.isabs(upper):
            return None
        forks = os.path.dirname(os.path.dirname(upper))
        if (os.path.basename(upper) != "upper" or forks == self.forks
                or os.path.basename(forks) != "forks"):
            return None
        return os.path.dirname(forks) if os.path.isdir(upper) else None

    def _rebuilt_spec(self, sid: str, origin: Callable[[str], tuple[str, str] | None],
                      why: ValueError, report: list[str]) -> dict | None:
        """The mount of fork ``sid`` made again from its session, recorded; None (and
        nothing changed) for a fork with no session, or one that cannot be rebuilt."""
        found = origin(sid)
        if found is None:
            report.append(f"{why}; no session is recorded for it: left to recovery")
            return None
        workspace, tree = found
        if os.path.ismount(workspace):  # a daemon that died, no reboot: the mount serves
            # over lowers no record names; made again at a start that finds it unmounted
            report.append(f"{why}; its mount at {workspace} is left as it is, and gc"
                          " removes no view until a start records it again")
            return None
        try:
            spec = self._spec(sid, workspace, tree, self.lowers(tree))
            self._write_spec(os.path.join(self.forks, sid), spec)
        except Exception as exc:  # a start is never stopped by one fork
            report.append(f"{why}; rebuilding it from its session failed: {exc}")
            return None
        report.append(f"{why}; rebuilt from its session (forked from tree {tree[:12]})")
        return spec

    def release(self, session_id: str, workspace: str) -> None:
        """A deleted fork's: unmount its workspace, and mount it at no later start. What
        it wrote stays in its upper layer (and its lowers are kept, ``used``)."""
        folder = os.path.join(self.forks, session_id)
        if not os.path.isdir(folder):
            return  # a fork that copied (no overlay)
        with open(os.path.join(folder, RELEASED), "w", encoding="utf-8") as f:
            f.write(workspace + "\n")
            f.flush()
            os.fsync(f.fileno())
        fsync_folder(folder)
        if os.path.ismount(workspace):
            self.unmount(workspace)

    def unmount(self, workspace: str) -> None:
        """Detach the mount at ``workspace``, reached through no symlink (one on the way:
        nothing of ours is there, and nothing is detached)."""
        try:
            fd = open_folder(workspace)
        except OSError:
            return
        try:
            _libc.umount2(f"/proc/self/fd/{fd}".encode(), 2)  # MNT_DETACH
        finally:
            os.close(fd)


def encode_empty(blobs: BlobStore) -> str:
    return blobs.put_bytes(encode({}))
