"""Writing a tree into a layer: the restore and fork half of a snapshotter.

``TreeWriter.write(root_fd, current, target)`` makes the folder open at ``root_fd``
equal to the tree ``target``, touching only what differs from ``current`` (a fresh
capture of it). Rules, in order of importance:

- Every write acts on what was verified (issue 57): every entry touched is reached
  through a descriptor (or, for a removal or a rename over it, a name never followed)
  whose type, owner and inode are those the plan captured (``Capture.inodes``; for
  an entry the plan took from the head's tree unexamined, its mode and time), or is
  one this write made where nobody else reaches: a new folder, symlink, FIFO, device
  node, whiteout or hard link is made in a staging folder of root's (0700, one per
  file system, at the top of the layer), given its owner there, and renamed into
  place; a new file is made with O_EXCL and given everything through its descriptor,
  and only renamed by name. Anything else found is the layer changing under the write:
  left alone, and said in the warnings. Nothing is written through a symlink or
  outside the folder: every folder is opened with ``O_NOFOLLOW`` relative to its
  parent.
- Metadata is applied by ``fsmeta.Applier`` (owner, mode, xattrs, time), a folder's
  after its contents, so the deepest come first and every folder time holds.
- A file whose content is unchanged keeps its inode and only gets its metadata, unless
  it has other hard links (changing it in place would change them too: it is written
  again instead).
- Hard links are linked, not copied: the layer root's own entry names the groups; the
  first name of each group is written, the others linked to it once everything is
  written, and the folders that gained a link get their times again.
- Through an overlay mount (a fork's workspace), a sparse file that would get new
  metadata or links is written again: changing it in place would make the kernel copy
  it up and fill its holes (sparse.py).
- Sockets are never recreated; device nodes only in container layers. Each is a
  warning in the result.
- Excluded paths (``excluded``: by the rules in force now or the target's own,
  exclude.py) are left exactly as they are: the target's entries there are not
  written, what is there is not removed, and a folder the target has no more is kept,
  emptied of all else, if it holds one (said in the warnings).
"""

from __future__ import annotations

import errno
import os
import shutil
import stat as st_

from worldline.wire.errors import FailedPrecondition, InvalidArgument, ResourceExhausted

from .. import progress
from ..faults import crash_point
from ..storage.blob_store import BlobStore, DestinationFull
from ..storage.durable import out_of_space
from . import chunks, sparse
from .descriptors import DIR_FLAGS as _DIR_FLAGS
from .descriptors import READ_FLAGS as _READ_FLAGS
from .descriptors import link_groups
from .fsmeta import Applier
from .snapshotter import Capture
from .tracker import TEMP_PREFIX
from .trees import (
    BLOCK,
    CHAR,
    CHUNKED,
    DEVICES,
    DIR,
    FIFO,
    FILE,
    FILES,
    MAPPED,
    OPAQUE,
    SOCKET,
    SPARSE,
    SYMLINK,
    WHITEOUT,
    Entry,
    TreeReader,
    check_name,
    entry_at,
    links_of,
)
from .walk import OPAQUE_XATTR

# The file type each kind of entry is on disk (what a descriptor's stat must show)
_TYPES = {FILE: st_.S_IFREG, SPARSE: st_.S_IFREG, CHUNKED: st_.S_IFREG, DIR: st_.S_IFDIR,
          OPAQUE: st_.S_IFDIR, SYMLINK: st_.S_IFLNK, FIFO: st_.S_IFIFO, CHAR: st_.S_IFCHR,
          WHITEOUT: st_.S_IFCHR, BLOCK: st_.S_IFBLK, SOCKET: st_.S_IFSOCK}
CHANGED = "changed while it was restored (it is not what the restore's plan saw): left as it is"


class TreeWriter:
    def __init__(self, blobs: BlobStore, trees: TreeReader, overlay: bool, watch=None,
                 private: bool = False, excluded=None) -> None:
        self.blobs = blobs
        self.trees = trees
        self.overlay = overlay
        self.private = private  # a new folder of the daemon's own: no temporaries
        self.watch = watch
        self.excluded = excluded  # (path, is_dir) -> whether it is left as it is
        self.meta = Applier()
        self.pending: dict = {}
        self.current: Capture | None = None
        self.defer: set[str] = set()  # names linked after everything is written
        self.force: set[str] = set()  # files written again (a hard link to break)
        self.force_folders: set[str] = set()  # folders holding those
        self.relink: set[str] = set()  # first names of groups with names to link to them
        self.copy_up = False  # writing through an overlay mount (sparse.on_overlayfs)
        self.folders: dict[str, tuple[int, int]] = {}  # folders opened and checked, or made
        self.written: dict[str, int] = {}  # files written (or given metadata): their inode
        self.tops: dict[int, int] = {}  # by st_dev: the first folder written on it
        self.stages: dict[int, tuple[int, str, int, int]] = {}  # by st_dev: staging folders

    def write(self, root_fd: int, current: Capture, target: str) -> list[str]:
        self.pending = current.trees
        self.current = current
        want_root = self.trees.read(target)
        groups = self.trees.link_groups(links_of(want_root.own))
        if self.excluded is not None:  # no name is linked at an excluded path
            groups = [g for g in ([p for p in g if not self._excluded(p, False)]
                                  for g in groups) if len(g) > 1]
        mine = {p: tuple(g) for g in groups for p in g}
        have = {p: tuple(g) for g in link_groups(current.links) for p in g}
        self.defer = {p for g in groups for p in g[1:]}
        self.relink = {g[0] for g in groups if len(g) > 1 and have.get(g[0]) != tuple(g)}
        self.copy_up = sparse.on_overlayfs(root_fd)
        self.force = {p for p, g in have.items() if mine.get(p) != g}
        for path in self.force:
            parts = path.split("/")
            self.force_folders.update("/".join(parts[:i]) + "/" for i in range(1, len(parts)))
        root = os.fstat(root_fd)
        before = root.st_mode & 0o7777
        self.folders[""] = (root.st_dev, root.st_ino)
        try:
            self._sync_dir(root_fd, current.root, target, "")
            touched = self._link(root_fd, groups)
            self._retouch(root_fd, target, touched)
            self._unstage()
            if self.watch is not None:
                self.watch("", root_fd)
        except BaseException:
            try:
                self._unstage()
            except OSError:
                pass
            os.fchmod(root_fd, before)
            raise
        finally:
            for fd in self.tops.values():
                os.close(fd)
            self.tops.clear()
        if want_root.own is not None:
            self.meta.apply_fd(root_fd, want_root.own, ".", folder=True)
        else:
            os.fchmod(root_fd, before)  # 0.3 trees have no root entry: keep its mode
        return self.meta.warnings

    # -- what was verified ---------------------------------------------------------
    def _same(self, st: os.stat_result, have: Entry, path: str) -> bool:
        """Whether ``st`` (of a descriptor, or of a name never followed) is the entry the
        plan captured at ``path``: its type and owner, and its inode when the plan knows
        it (else its mode and, not a folder, its modification time)."""
        if st_.S_IFMT(st.st_mode) != _TYPES.get(have.kind):
            return False
        if have.has_meta and (st.st_uid, st.st_gid) != (have.uid, have.gid):
            return False
        # (The stat cache's inode is no help: a restore sets a file's time back to one
        # the cache knew for the inode it replaced.)
        ino = self.current.inodes.get(path) if self.current is not None else None
        if ino is not None:
            return st.st_ino == ino
        if have.kind != SYMLINK and st_.S_IMODE(st.st_mode) != have.mode:
            return False
        return have.is_folder or st.st_mtime_ns == have.mtime

    def _excluded(self, path: str, is_dir: bool) -> bool:
        return self.excluded is not None and self.excluded(path, is_dir)

    def _changed(self, path: str) -> None:
        """The layer changed under the write at ``path``: it is left alone, and said
        (World.restore's audit event names these paths)."""
        self.meta.warnings.append(f"{path}: {CHANGED}")

    def _had(self, path: str) -> Entry | None:
        """The plan's entry at ``path`` (the layer as it was captured)."""
        return entry_at(self.trees, self.current.root, path, self.pending)

    def _open_folder(self, root_fd: int, rel: str) -> int | None:
        """The folder ``rel`` reached one component at a time through no symlink, each
        checked against the folder this write made or checked there (or the plan's);
        None if one is not (said) or gone."""
        fd = os.dup(root_fd)
        path = ""
        for part in rel.split("/") if rel else ():
            path = f"{path}/{part}" if path else part
            try:
                sub = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                os.close(fd)
                if exc.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                    raise
                self._changed(path)
                return None
            os.close(fd)
            fd = sub
            st = os.fstat(fd)
            known = self.folders.get(path)
            if known is not None:
                ok = (st.st_dev, st.st_ino) == known
            else:
                had = self._had(path)
                ok = had is not None and had.is_folder and self._same(st, had, path)
            if not ok:
                os.close(fd)
                self._changed(path)
                return None
        return fd

    # -- staging: where new entries are made, out of the agent's reach ---------------
    def _stage(self, dfd: int) -> int:
        """The staging folder for entries made to go into the folder ``dfd``: one per
        file system, root's own, 0700, made in the first folder written on it, so that
        nobody else reaches what is made there until it is renamed into place."""
        dev = os.fstat(dfd).st_dev
        if dev in self.stages:
            return self.stages[dev][2]
        top = self.tops.get(dev, dfd)
        name = TEMP_PREFIX + "stage-" + os.urandom(8).hex()
        os.mkdir(name, 0o700, dir_fd=top)
        fd = os.open(name, _DIR_FLAGS, dir_fd=top)
        st = os.fstat(fd)
        if (st.st_uid != os.geteuid() or st_.S_IMODE(st.st_mode) & 0o077
                or os.listdir(fd)):
            os.close(fd)
            raise FailedPrecondition("the folder kept changing while it was restored: try"
                                     " again once the agent is still")
        self.stages[dev] = (os.dup(top), name, fd, st.st_ino)
        return fd

    def _unstage(self) -> None:
        while self.stages:
            _, (parent, name, fd, ino) = self.stages.popitem()
            try:
                for leftover in os.listdir(fd):
                    _drop(fd, leftover)  # what a failed write made and never placed
                st = os.stat(name, dir_fd=parent, follow_symlinks=False)
                if st.st_ino == ino:
                    os.rmdir(name, dir_fd=parent)
            except FileNotFoundError:
                pass
            finally:
                os.close(fd)
                os.close(parent)

    def _place(self, stage: int, tmp: str, dfd: int, name: str, have: Entry | None,
               path: str, staged: bool = True) -> bool:
        """Rename what was made in the staging folder into place, over what the plan
        saw there (``have``; None: nothing): anything else there now is left alone, and
        what was made dropped."""
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None and (have is None or not self._same(st, have, path)):
            self._changed(path)
            _drop(stage, tmp, staged)
            return False
        try:
            os.rename(tmp, name, src_dir_fd=stage, dst_dir_fd=dfd)
        except OSError as exc:
            if exc.errno not in (errno.EISDIR, errno.ENOTDIR, errno.ENOTEMPTY, errno.EEXIST):
                raise
            self._changed(path)  # swapped for a folder, or a folder for a file, since
            _drop(stage, tmp, staged)
            return False
        return True

    # -- the tree ------------------------------------------------------------------
    def _sync_dir(self, dfd: int, cur_digest: str | None, tgt_digest: str,
                  prefix: str) -> None:
        if cur_digest == tgt_digest and prefix not in self.force_folders:
            return
        cur = self.trees.read(cur_digest, self.pending) if cur_digest else {}
        tgt = self.trees.read(tgt_digest)
        st = os.fstat(dfd)
        if st.st_dev not in self.tops:
            self.tops[st.st_dev] = os.dup(dfd)
        os.fchmod(dfd, st.st_mode & 0o7777 | 0o700)  # writable while we work
        for name in cur:
            if name not in tgt and not self._excluded(prefix + name, cur[name].is_folder):
                self._discard(dfd, name, cur[name], prefix + name)
        for name, want in sorted(tgt.items()):
            check_name(name)
            path = prefix + name
            if self._excluded(path, want.is_folder):
                continue  # captured under other rules: what is there now stays
            have = cur.get(name)
            if have == want and path not in self.force and (
                    not want.is_folder or path + "/" not in self.force_folders) and (
                    path not in self.relink or not self._fills_holes(want)):
                continue
            if have is not None and (have.is_folder != want.is_folder or (
                    path in self.defer and have.is_folder)):
                if not self._discard(dfd, name, have, path):
                    continue
                have = None
            if path in self.defer and not want.is_folder:
                continue  # linked to its group's first name at the end
            if want.is_folder:
                self._sync_folder(dfd, name, have, want, path)
            elif want.kind in FILES:
                if (have is not None and have.kind == want.kind and have.ref == want.ref
                        and path not in self.force and not self._fills_holes(want)
                        and self._set_meta_in_place(dfd, name, have, want, path)):
                    continue
                self._write_file(dfd, name, have, want, path)
            else:
                self._write_special(dfd, name, have, want, path)

    def _sync_folder(self, dfd: int, name: str, have: Entry | None, want: Entry,
                     path: str) -> None:
        if have is None:
            sub = self._new_folder(dfd, name, path)
            if sub is None:
                return
        else:
            crash_point("restore.before_folder", path)
            try:
                sub = os.open(name, _DIR_FLAGS, dir_fd=dfd)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR, errno.ENOENT):
                    raise
                self._changed(path)  # swapped for a symlink or a file, or removed
                return
            if not self._same(os.fstat(sub), have, path):
                os.close(sub)
                self._changed(path)
                return
        try:
            st = os.fstat(sub)
            self.folders[path] = (st.st_dev, st.st_ino)
            self._sync_dir(sub, have.ref if have else None, want.ref, path + "/")
            if (have is None and want.kind == OPAQUE) or (
                    have is not None and have.kind != want.kind):
                _set_opaque(sub, want.kind == OPAQUE)
            self.meta.apply_fd(sub, want, path, folder=True)
            if self.watch is not None:
                self.watch(path, sub)
        finally:
            os.close(sub)

    def _new_folder(self, dfd: int, name: str, path: str) -> int | None:
        """A new folder at ``name``, made in the staging folder and renamed into place
        (its descriptor; None if something else stands there now)."""
        if self.private:
            os.mkdir(name, 0o700, dir_fd=dfd)
            return os.open(name, _DIR_FLAGS, dir_fd=dfd)
        stage = self._stage(dfd)
        tmp = _temp_name()
        os.mkdir(tmp, 0o700, dir_fd=stage)
        sub = os.open(tmp, _DIR_FLAGS, dir_fd=stage)
        crash_point("restore.folder_made", path)
        if not self._place(stage, tmp, dfd, name, None, path):
            os.close(sub)
            return None
        return sub

    def _discard(self, dfd: int, name: str, have: Entry, path: str) -> bool:
        """Remove what the plan saw at ``name`` (``have``), a folder with everything in
        it; whatever is not what the plan saw is left alone, and said. Whether it is
        gone."""
        crash_point("restore.before_remove", path)
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            return True
        if not self._same(st, have, path):
            self._changed(path)
            return False
        try:
            if not st_.S_ISDIR(st.st_mode):
                os.unlink(name, dir_fd=dfd)  # a name, never the inode's content
                return True
            sub = os.open(name, _DIR_FLAGS, dir_fd=dfd)
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR, errno.EISDIR):
                raise
            self._changed(path)
            return False
        try:
            if not self._same(os.fstat(sub), have, path):
                self._changed(path)
                return False
            emptied = self._empty(sub, have.ref, path + "/")
        finally:
            os.close(sub)
        if not emptied:
            return False
        try:
            os.rmdir(name, dir_fd=dfd)
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.ENOENT):
                raise
            self._changed(path)
            return False
        return True

    def _empty(self, fd: int, digest: str, prefix: str) -> bool:
        """Remove everything the plan saw in the folder open at ``fd`` (its tree
        ``digest``); whether it is empty now."""
        tree = self.trees.read(digest, self.pending)
        os.fchmod(fd, os.fstat(fd).st_mode & 0o7777 | 0o700)  # a daemon not root
        emptied = True
        for name in os.listdir(fd):
            have = tree.get(name)
            if self.excluded is not None and self._excluded(
                    prefix + name, have.is_folder if have is not None
                    else _is_folder(fd, name)):
                self.meta.warnings.append(f"{prefix.rstrip('/')}: kept, it holds the"
                                          f" excluded {prefix + name}")
                emptied = False
            elif have is None:
                self._changed(prefix + name)
                emptied = False
            elif not self._discard(fd, name, have, prefix + name):
                emptied = False
        return emptied

    def _fills_holes(self, want: Entry) -> bool:
        """Whether touching this unchanged file in place (its metadata, or links to it)
        could copy it up and fill its holes: a sparse file through an overlay mount."""
        return self.copy_up and want.kind in MAPPED

    def _set_meta_in_place(self, dfd: int, name: str, have: Entry, want: Entry,
                           path: str) -> bool:
        """Give an unchanged file its metadata without rewriting it, through a
        descriptor of the very file the plan saw there; False when it must be written
        again instead (it is gone, no longer a plain file, or has other links). Another
        file there now is left alone (True)."""
        crash_point("restore.meta_in_place", path)
        try:
            fd = os.open(name, _READ_FLAGS, dir_fd=dfd)
        except OSError:
            return False
        try:
            st = os.fstat(fd)
            if not self._same(st, have, path):
                self._changed(path)
                return True
            if not st_.S_ISREG(st.st_mode) or st.st_nlink != 1:
                return False
            self.meta.apply_fd(fd, want, path)
            self.written[path] = st.st_ino
        finally:
            os.close(fd)
        progress.advance(0, files=1)
        return True

    def _write_file(self, dfd: int, name: str, have: Entry | None, want: Entry,
                    path: str) -> None:
        crash_point("restore.between_files")
        # Made with O_EXCL, written and given its metadata through its own descriptor:
        # only its rename into place goes by name (a name swapped meanwhile moves what
        # the agent put there, which it could move itself; no inode is written).
        where, tmp = dfd, name if self.private else _temp_name()
        # (read too: chunks copied from the file on disk are read back and checked)
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=where)
        try:
            if want.kind in MAPPED:
                source = self._source(dfd, name, have, path)
                try:
                    chunks.write(fd, self.blobs, want.ref, source,
                                 have.ref if source is not None else None)
                finally:
                    if source is not None:
                        os.close(source)
            else:
                self.blobs.copy_to_fd(want.ref, fd)
            self.meta.apply_fd(fd, want, path)
            ino = os.fstat(fd).st_ino
        except BaseException as exc:
            os.close(fd)
            os.unlink(tmp, dir_fd=where)
            if isinstance(exc, DestinationFull) or out_of_space(exc):
                raise ResourceExhausted(f"no space left to write {path} ({want.size} bytes)"
                                        " in the folder being written") from None
            raise
        os.close(fd)
        crash_point("restore.before_rename", path)  # written aside, not yet in place
        if self.private or self._place(where, tmp, dfd, name, have, path, staged=False):
            self.written[path] = ino
        progress.advance(want.size if want.kind not in MAPPED else 0, files=1)

    def _source(self, dfd: int, name: str, have: Entry | None, path: str) -> int | None:
        """A descriptor of the file the plan saw at ``name`` when it is stored by chunks
        (``have``) and is still that file, to copy the chunks it shares with the file
        written in its place (chunks.write checks each one copied); else None."""
        if have is None or have.kind not in MAPPED:
            return None
        try:
            fd = os.open(name, _READ_FLAGS, dir_fd=dfd)
        except OSError:
            return None
        st = os.fstat(fd)
        if not st_.S_ISREG(st.st_mode) or not self._same(st, have, path):
            os.close(fd)
            return None
        crash_point("restore.chunk_source", path)  # tests: the file changed in place now
        return fd

    def _write_special(self, dfd: int, name: str, have: Entry | None, want: Entry,
                       path: str) -> None:
        where, tmp = (dfd, _temp_name()) if self.private else (None, _temp_name())
        if want.kind not in (WHITEOUT, SYMLINK, FIFO) and not (
                want.kind in DEVICES and self.overlay):
            what = "a socket" if want.kind == SOCKET else "a device node outside a container"
            self.meta.warnings.append(f"{path}: {what} is not recreated")
            if have is not None and have.kind != want.kind:
                self._discard(dfd, name, have, path)  # not what the checkpoint has there
            return
        if want.kind == WHITEOUT and not self.overlay:
            raise InvalidArgument("a whiteout belongs to a container layer, not here")
        if where is None:
            where = self._stage(dfd)
        if want.kind == WHITEOUT:
            # A 0/0 character device (needs CAP_MKNOD, as the engine has).
            os.mknod(tmp, st_.S_IFCHR | 0o000, os.makedev(0, 0), dir_fd=where)
        elif want.kind == SYMLINK:
            os.symlink(want.ref, tmp, dir_fd=where)
        elif want.kind == FIFO:
            os.mkfifo(tmp, 0o600, dir_fd=where)
        else:
            kind = st_.S_IFBLK if want.kind == BLOCK else st_.S_IFCHR
            os.mknod(tmp, kind | 0o600, int(want.extras().get("dev", 0)), dir_fd=where)
        try:
            # by name only where nobody else reaches: the staging folder
            self.meta.apply_at(where, tmp, want, path)
        except BaseException:
            os.unlink(tmp, dir_fd=where)
            raise
        crash_point("restore.special_made", path)
        if self.private:
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        else:
            self._place(where, tmp, dfd, name, have, path)
        progress.advance(0, files=1)

    def _link(self, root_fd: int, groups: list[list[str]]) -> set[str]:
        """Link every group's other names to its first; returns the folders changed.
        The first name is opened (O_PATH) and checked to be the file written or kept
        there; each link is made to that descriptor, in the staging folder, then
        renamed into place."""
        touched: set[str] = set()
        for leader, *members in groups:
            crash_point("restore.before_link", leader)
            lfolder, _, lname = leader.rpartition("/")
            ldir = self._open_folder(root_fd, lfolder)
            if ldir is None:
                continue
            try:
                lfd = os.open(lname, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=ldir)
            except FileNotFoundError:
                continue
            finally:
                os.close(ldir)
            try:
                lst = os.fstat(lfd)
                if not self._is_leader(lst, leader):
                    self._changed(leader)
                    continue
                for member in members:
                    touched |= self._link_member(root_fd, lfd, lst, member)
            finally:
                os.close(lfd)
        return touched

    def _is_leader(self, lst: os.stat_result, leader: str) -> bool:
        if not st_.S_ISREG(lst.st_mode):
            return False
        if leader in self.written:
            return lst.st_ino == self.written[leader]
        had = self._had(leader)
        return had is not None and self._same(lst, had, leader)

    def _link_member(self, root_fd: int, lfd: int, lst: os.stat_result,
                     member: str) -> set[str]:
        mfolder, _, mname = member.rpartition("/")
        mdir = self._open_folder(root_fd, mfolder)
        if mdir is None:
            return set()
        try:
            try:
                mst = os.stat(mname, dir_fd=mdir, follow_symlinks=False)
                if (mst.st_dev, mst.st_ino) == (lst.st_dev, lst.st_ino):
                    return set()
            except FileNotFoundError:
                pass
            stage = self._stage(mdir)
            tmp = _temp_name()
            os.link(f"/proc/self/fd/{lfd}", tmp, dst_dir_fd=stage, follow_symlinks=True)
            had = self._had(member)
            if self._place(stage, tmp, mdir, mname,
                           None if had is None or had.is_folder else had, member):
                return {mfolder}
            return set()
        finally:
            os.close(mdir)

    def _retouch(self, root_fd: int, target: str, folders: set[str]) -> None:
        """The times of folders that gained a link after their contents were written."""
        for rel in sorted(folders, key=lambda p: -p.count("/")):
            if not rel:
                continue  # the root's own entry is applied last of all
            entry = entry_at(self.trees, target, rel)
            crash_point("restore.before_retouch", rel)
            fd = self._open_folder(root_fd, rel) if entry is not None else None
            if fd is None:
                continue
            try:
                self.meta.touch(fd, entry)
            finally:
                os.close(fd)


def _is_folder(dfd: int, name: str) -> bool:
    try:
        return st_.S_ISDIR(os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode)
    except FileNotFoundError:
        return False


def _temp_name() -> str:
    return TEMP_PREFIX + os.urandom(8).hex()


def _drop(where: int, name: str, staged: bool = True) -> None:
    """Remove what this write made at ``name``: anything in its staging folder (nobody
    else reaches it); elsewhere (a file written aside in the layer) only a non-folder."""
    try:
        if staged and st_.S_ISDIR(os.stat(name, dir_fd=where, follow_symlinks=False).st_mode):
            shutil.rmtree(name, dir_fd=where)
        else:
            os.unlink(name, dir_fd=where)
    except (FileNotFoundError, IsADirectoryError):
        pass


def _set_opaque(fd: int, opaque: bool) -> None:
    if opaque:
        os.setxattr(fd, OPAQUE_XATTR, b"y")
    else:
        try:
            os.removexattr(fd, OPAQUE_XATTR)
        except OSError:
            pass
