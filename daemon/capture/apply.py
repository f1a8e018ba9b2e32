"""Writing a tree into a layer: the restore and fork half of a snapshotter.

``TreeWriter.write(root_fd, current, target)`` makes the folder open at ``root_fd``
equal to the tree ``target``, touching only what differs from ``current`` (a fresh
capture of it). Rules, in order of importance:

- Nothing is written through a symlink or outside the folder: every folder is opened
  with ``O_NOFOLLOW`` relative to its parent; every new entry (file, symlink, FIFO,
  device node, whiteout) is made under a random temporary name, given its metadata
  there, and renamed into place.
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
"""

from __future__ import annotations

import errno
import os
import stat as st_

from worldline.client.errors import FailedPrecondition, InvalidArgument, ResourceExhausted

from .. import progress
from ..faults import crash_point
from ..storage.blobs import BlobStore, DestinationFull
from ..storage.durable import out_of_space
from . import sparse
from .fsmeta import Applier
from .snapshot import _DIR_FLAGS, _READ_FLAGS, Capture, _remove, link_groups, open_below
from .tracker import TEMP_PREFIX
from .trees import (
    BLOCK,
    DEVICES,
    FIFO,
    FILES,
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


class TreeWriter:
    def __init__(self, blobs: BlobStore, trees: TreeReader, overlay: bool, watch=None,
                 private: bool = False) -> None:
        self.blobs = blobs
        self.trees = trees
        self.overlay = overlay
        self.private = private  # a new folder of the daemon's own: no temporaries
        self.watch = watch
        self.meta = Applier()
        self.pending: dict = {}
        self.defer: set[str] = set()  # names linked after everything is written
        self.force: set[str] = set()  # files written again (a hard link to break)
        self.force_folders: set[str] = set()  # folders holding those
        self.relink: set[str] = set()  # first names of groups with names to link to them
        self.copy_up = False  # writing through an overlay mount (sparse.on_overlayfs)

    def write(self, root_fd: int, current: Capture, target: str) -> list[str]:
        self.pending = current.trees
        want_root = self.trees.read(target)
        groups = self.trees.link_groups(links_of(want_root.own))
        mine = {p: tuple(g) for g in groups for p in g}
        have = {p: tuple(g) for g in link_groups(current.links) for p in g}
        self.defer = {p for g in groups for p in g[1:]}
        self.relink = {g[0] for g in groups if len(g) > 1 and have.get(g[0]) != tuple(g)}
        self.copy_up = sparse.on_overlayfs(root_fd)
        self.force = {p for p, g in have.items() if mine.get(p) != g}
        for path in self.force:
            parts = path.split("/")
            self.force_folders.update("/".join(parts[:i]) + "/" for i in range(1, len(parts)))
        before = os.fstat(root_fd).st_mode & 0o7777
        try:
            self._sync_dir(root_fd, current.root, target, "")
            touched = self._link(root_fd, groups)
            self._retouch(root_fd, target, touched)
            if self.watch is not None:
                self.watch("", root_fd)
        except BaseException:
            os.fchmod(root_fd, before)
            raise
        if want_root.own is not None:
            self.meta.apply_fd(root_fd, want_root.own, ".", folder=True)
        else:
            os.fchmod(root_fd, before)  # 0.3 trees have no root entry: keep its mode
        return self.meta.warnings

    def _sync_dir(self, dfd: int, cur_digest: str | None, tgt_digest: str,
                  prefix: str) -> None:
        if cur_digest == tgt_digest and prefix not in self.force_folders:
            return
        cur = self.trees.read(cur_digest, self.pending) if cur_digest else {}
        tgt = self.trees.read(tgt_digest)
        os.fchmod(dfd, os.fstat(dfd).st_mode & 0o7777 | 0o700)  # writable while we work
        for name in cur:
            if name not in tgt:
                _remove(dfd, name)
        for name, want in sorted(tgt.items()):
            check_name(name)
            path = prefix + name
            have = cur.get(name)
            if have == want and path not in self.force and (
                    not want.is_folder or path + "/" not in self.force_folders) and (
                    path not in self.relink or not self._fills_holes(want)):
                continue
            if have is not None and (have.is_folder != want.is_folder or (
                    path in self.defer and have.is_folder)):
                _remove(dfd, name)
                have = None
            if path in self.defer and not want.is_folder:
                continue  # linked to its group's first name at the end
            if want.is_folder:
                self._sync_folder(dfd, name, have, want, path)
            elif want.kind in FILES:
                if (have is not None and have.kind == want.kind and have.ref == want.ref
                        and path not in self.force and not self._fills_holes(want)
                        and self._set_meta_in_place(dfd, name, want, path)):
                    continue
                self._write_file(dfd, name, want, path)
            else:
                self._write_special(dfd, name, have, want, path)

    def _sync_folder(self, dfd: int, name: str, have: Entry | None, want: Entry,
                     path: str) -> None:
        if have is None:
            os.mkdir(name, 0o700, dir_fd=dfd)
        try:
            sub = os.open(name, _DIR_FLAGS, dir_fd=dfd)
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR, errno.ENOENT):
                raise
            # Swapped for a symlink or a file (or removed) since the capture: whatever
            # stands there now is not the folder; the folder is made again, empty.
            _remove(dfd, name)
            os.mkdir(name, 0o700, dir_fd=dfd)
            have = None
            try:
                sub = os.open(name, _DIR_FLAGS, dir_fd=dfd)
            except OSError:
                raise FailedPrecondition(f"{path} kept changing while it was restored:"
                                         " try again once the agent is still") from None
        try:
            self._sync_dir(sub, have.ref if have else None, want.ref, path + "/")
            if (have is None and want.kind == OPAQUE) or (
                    have is not None and have.kind != want.kind):
                _set_opaque(sub, want.kind == OPAQUE)
            self.meta.apply_fd(sub, want, path, folder=True)
            if self.watch is not None:
                self.watch(path, sub)
        finally:
            os.close(sub)

    def _fills_holes(self, want: Entry) -> bool:
        """Whether touching this unchanged file in place (its metadata, or links to it)
        could copy it up and fill its holes: a sparse file through an overlay mount."""
        return self.copy_up and want.kind == SPARSE

    def _set_meta_in_place(self, dfd: int, name: str, want: Entry, path: str) -> bool:
        """Give an unchanged file its metadata without rewriting it; False when it must be
        written again instead (it is no longer a plain file, or has other links)."""
        crash_point("restore.meta_in_place", path)
        try:
            fd = os.open(name, _READ_FLAGS, dir_fd=dfd)
        except OSError:
            return False
        try:
            st = os.fstat(fd)
            if not st_.S_ISREG(st.st_mode) or st.st_nlink != 1:
                return False
            self.meta.apply_fd(fd, want, path)
        finally:
            os.close(fd)
        progress.advance(0, files=1)
        return True

    def _write_file(self, dfd: int, name: str, want: Entry, path: str) -> None:
        crash_point("restore.between_files")
        tmp = name if self.private else _temp_name()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=dfd)
        try:
            if want.kind == SPARSE:
                sparse.write(fd, self.blobs, want.ref)
            else:
                self.blobs.copy_to_fd(want.ref, fd)
            self.meta.apply_fd(fd, want, path)
        except BaseException as exc:
            os.close(fd)
            os.unlink(tmp, dir_fd=dfd)
            if isinstance(exc, DestinationFull) or out_of_space(exc):
                raise ResourceExhausted(f"no space left to write {path} ({want.size} bytes)"
                                        " in the folder being written") from None
            raise
        os.close(fd)
        crash_point("restore.before_rename")  # the file written aside, not yet in place
        if tmp != name:
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        progress.advance(want.size if want.kind != SPARSE else 0, files=1)

    def _write_special(self, dfd: int, name: str, have: Entry | None, want: Entry,
                       path: str) -> None:
        tmp = _temp_name()
        if want.kind == WHITEOUT:
            if not self.overlay:
                raise InvalidArgument("a whiteout belongs to a container layer, not here")
            # A 0/0 character device (needs CAP_MKNOD, as the engine has).
            os.mknod(tmp, st_.S_IFCHR | 0o000, os.makedev(0, 0), dir_fd=dfd)
        elif want.kind == SYMLINK:
            os.symlink(want.ref, tmp, dir_fd=dfd)
        elif want.kind == FIFO:
            os.mkfifo(tmp, 0o600, dir_fd=dfd)
        elif want.kind in DEVICES and self.overlay:
            kind = st_.S_IFBLK if want.kind == BLOCK else st_.S_IFCHR
            os.mknod(tmp, kind | 0o600, int(want.extras().get("dev", 0)), dir_fd=dfd)
        else:
            what = "a socket" if want.kind == SOCKET else "a device node outside a container"
            self.meta.warnings.append(f"{path}: {what} is not recreated")
            if have is not None and have.kind != want.kind:
                _remove(dfd, name)  # whatever stands there now was not in the checkpoint
            return
        try:
            self.meta.apply_at(dfd, tmp, want, path)
        except BaseException:
            os.unlink(tmp, dir_fd=dfd)
            raise
        os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        progress.advance(0, files=1)

    def _link(self, root_fd: int, groups: list[list[str]]) -> set[str]:
        """Link every group's other names to its first; returns the folders changed."""
        touched: set[str] = set()
        for leader, *members in groups:
            ldir, lname = _parent(root_fd, leader)
            if ldir is None:
                continue
            try:
                lst = os.stat(lname, dir_fd=ldir, follow_symlinks=False)
                if not st_.S_ISREG(lst.st_mode):
                    continue
                for member in members:
                    mdir, mname = _parent(root_fd, member)
                    if mdir is None:
                        continue
                    try:
                        try:
                            mst = os.stat(mname, dir_fd=mdir, follow_symlinks=False)
                            if (mst.st_dev, mst.st_ino) == (lst.st_dev, lst.st_ino):
                                continue
                        except FileNotFoundError:
                            pass
                        tmp = _temp_name()
                        os.link(lname, tmp, src_dir_fd=ldir, dst_dir_fd=mdir,
                                follow_symlinks=False)
                        os.rename(tmp, mname, src_dir_fd=mdir, dst_dir_fd=mdir)
                        touched.add(member.rpartition("/")[0])
                    finally:
                        os.close(mdir)
            finally:
                os.close(ldir)
        return touched

    def _retouch(self, root_fd: int, target: str, folders: set[str]) -> None:
        """The times of folders that gained a link after their contents were written."""
        for rel in sorted(folders, key=lambda p: -p.count("/")):
            if not rel:
                continue  # the root's own entry is applied last of all
            entry = entry_at(self.trees, target, rel)
            fd = open_below(root_fd, rel)
            if fd is None or entry is None:
                continue
            try:
                self.meta.touch(fd, entry)
            finally:
                os.close(fd)


def _temp_name() -> str:
    return TEMP_PREFIX + os.urandom(8).hex()


def _parent(root_fd: int, path: str) -> tuple[int | None, str]:
    folder, _, name = path.rpartition("/")
    return open_below(root_fd, folder), name


def _set_opaque(fd: int, opaque: bool) -> None:
    if opaque:
        os.setxattr(fd, OPAQUE_XATTR, b"y")
    else:
        try:
            os.removexattr(fd, OPAQUE_XATTR)
        except OSError:
            pass
