"""Change tracking: which workspace paths may have changed since the last capture.

One inotify instance and one reader thread serve every tracked workspace (the
per-user instance limit is small, and one queue orders every event). A
``WorkspaceTracker`` turns events into *dirty* paths (re-examine this path) and
*rescan* paths (a folder that appeared: examine everything below it).

Correctness rules, in order of importance:

- Extra dirty paths are always safe; a missed one never is. Whenever the tracker
  cannot vouch for its picture (queue overflow, a watch it could not add, the
  watch limit, a start with no history), it asks for a *full* scan instead, which
  compares every file's stat against the stat cache.
- ``prepare()`` is a barrier: the calling thread reads and dispatches the inotify
  queue itself until the read would block (the reader thread drains the queue
  between requests; one of them reads at a time, so a batch the reader took is
  dispatched before the barrier reads on). The kernel queues a write's event before
  the write returns (fsnotify runs in the writer's system call), so every write that
  finished before the request is then in the dirty set. Watchman needs a sync cookie
  for this because its queries cannot read the queue; a cookie here cost a file
  created and removed per checkpoint for nothing more.
- Folders are watched through ``/proc/self/fd`` of a descriptor opened with
  ``O_NOFOLLOW``, so a symlink is never watched through.
- A container's layer is also watched in the container's merged view (mirror.py):
  overlayfs reports a change to a file that had another name under that name.
- A file closed after being open for writing (``IN_CLOSE_WRITE``) is *closed*: the
  capture reads it again whatever its stat says. Its descriptor may have mapped it
  shared (mappings.py): writes through a mapping give no event, and once a page is
  writable they leave the file's time as it was, so its stat can match the stat
  cache's while its content does not. The file's last close, the end of its last
  mapping, is reported.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import select
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..observe import TRACKER_FALLBACKS
from .mirror import MergedMirror, remember
from .walk import MAX_DEPTH, folders_below

log = logging.getLogger(__name__)

READER_DELAY = 0.005  # seconds the reader thread waits after waking (see _run)
EVENT_BUFFER = 1 << 18  # bytes of events per read (an event is at most 272 bytes)
TEMP_PREFIX = ".worldline-tmp-"
# Paths changed since the last capture that the tracker keeps, at most: past them it asks
# for a full scan, as for a queue overflow, and keeps none (an agent that makes millions
# of files between two checkpoints must not take the daemon's memory; the full scan is
# bounded by --max-entries, and reads no more than the changes would have)
MAX_CHANGES = 1 << 17

IN_MODIFY, IN_ATTRIB, IN_CLOSE_WRITE = 0x2, 0x4, 0x8
IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE = 0x40, 0x80, 0x100, 0x200
IN_DELETE_SELF, IN_MOVE_SELF = 0x400, 0x800
IN_UNMOUNT, IN_Q_OVERFLOW, IN_IGNORED = 0x2000, 0x4000, 0x8000
IN_ONLYDIR, IN_ISDIR = 0x01000000, 0x40000000
IN_NONBLOCK, IN_CLOEXEC = 0o4000, 0o2000000
WATCH_MASK = (IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE
              | IN_DELETE | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR)
_EVENT = struct.Struct("iIII")

_libc = ctypes.CDLL(None, use_errno=True)
_libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
_libc.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]


class WatchLimit(Exception):
    """A watch could not be added (the kernel's limit, or the tracker's own cap)."""


@dataclass
class Changes:
    """What a capture must examine: everything (``full``), or these paths."""

    full: bool
    dirty: set[str] = field(default_factory=set)
    rescan: set[str] = field(default_factory=set)
    # Files with other hard links at the last capture: re-examined every time, since a
    # write through another name gives no event for theirs.
    linked: set[str] = field(default_factory=set)
    # Files closed after being open for writing: read again whatever their stat says.
    closed: set[str] = field(default_factory=set)
    # More of those than MAX_CHANGES: the next capture, a full scan, trusts no stat.
    distrust: bool = False


class WorkspaceTracker:
    def __init__(self, monitor: "ChangeMonitor", path: str, max_watches: int) -> None:
        self.monitor = monitor
        self.path = path
        self.max_watches = max_watches
        self._lock = threading.Lock()
        self._full = True  # no history yet: the first capture scans everything
        self.base: str | None = None  # the tree the changes are relative to (set by the World)
        self._dirty: set[str] = set()
        self._rescan: set[str] = set()
        self._closed: set[str] = set()
        self._distrust = False  # closes dropped (_spill_locked): trust no stat next time
        self._paths: dict[int, str] = {}  # wd -> relative folder path ("" is the root)
        self._wds: dict[str, int] = {}  # relative folder path -> wd (the latest watched there)
        self._degraded = False  # past the watch limit: every capture scans
        self.fallbacks = 0
        self.linked: set[str] = set()  # files with other hard links (set by the World)
        self.mirror: MergedMirror | None = None  # a container's merged view (mirror.py)
        # the exclusions the last capture obeyed (exclude.py; set by the snapshotter): an
        # excluded folder that appears is not watched (npm install's node_modules)
        self.excluded: Callable[[str, bool], bool] | None = None

    def mirror_at(self, merged: str) -> None:
        """Also watch the merged view at ``merged`` (a container's layer)."""
        if self.mirror is not None and self.mirror.root == merged:
            return
        with self.monitor.holding_events():
            old, self.mirror = self.mirror, MergedMirror(merged)
        if old is not None:
            self._drop(old.clear())
            self.invalidate("the container's view moved")

    # -- called by the capture -----------------------------------------------------
    def watch_folder(self, rel: str, fd: int) -> None:
        """Watch one folder (opened with O_NOFOLLOW): one that appeared, or one a fork
        wrote. Full scans watch through ``scanning`` instead."""
        if self._degraded:
            return
        if len(self._paths) >= self.max_watches:
            self._degrade(f"the tracker's cap of {self.max_watches} watches")
            return
        wd = self.monitor.add_watch(f"/proc/self/fd/{fd}", self, rel)
        if wd < 0:
            self._degrade(os.strerror(-wd))

    @property
    def full_scan_next(self) -> bool:
        with self._lock:
            return self._full

    @contextlib.contextmanager
    def scanning(self):
        """Held by a full scan while its walk (walk.py) watches every folder: yields the
        inotify descriptor, the event mask and ``register([(relative folder, wd)])``.
        Events wait until the scan has registered its watches: one for a watch nobody
        knows would be dropped, and the change it reports missed."""
        if self._degraded:
            yield -1, 0, None
            return
        problems: list[str] = []

        def register(watches: list[tuple[str, int]]) -> None:
            problems.extend(os.strerror(-wd) for _, wd in watches if wd < 0)
            self._known_many([(rel, wd) for rel, wd in watches if wd > 0])

        with self.monitor.holding_events():
            yield self.monitor.fd, WATCH_MASK, register
        if problems:
            self._degrade(problems[0])
        elif len(self._paths) > self.max_watches:
            self._degrade(f"the tracker's cap of {self.max_watches} watches")

    def _known_many(self, watches: list[tuple[str, int]]) -> None:
        """Each watch ``wd`` is folder ``rel`` (called with the monitor's lock held)."""
        self.monitor._owners.update((wd, self) for _, wd in watches)
        with self._lock:
            if not self._wds:  # nothing watched yet (a start): no older watch to forget
                self._wds.update(watches)
                self._paths.update((wd, rel) for rel, wd in watches)
            else:
                remember(self._wds, self._paths, watches)
        if self.mirror is not None and self.mirror.live:
            self._mirror_many([rel for rel, _ in watches])

    def _mirror_many(self, rels: list[str]) -> None:
        """Watch ``rels`` in the merged view too (the monitor's lock held)."""
        mirror = self.mirror
        root = mirror.open_mounted()
        if root is None:
            return  # unmounted: its root's IN_IGNORED is on its way
        try:
            added = mirror.watch(self.monitor.add_raw, root, rels)
        finally:
            os.close(root)
        self.monitor._owners.update((wd, self) for _, wd in added)
        with self._lock:
            mirror.known(added)

    def prepare(self) -> Changes:
        """Barrier, then take the changes seen so far (callers hold the workspace lock)."""
        self._barrier()
        self._keep_mirror()
        with self._lock:
            changes = Changes(self._full, self._dirty, self._rescan, set(self.linked),
                              self._closed, self._distrust)
            self._full, self._dirty, self._rescan = self._degraded, set(), set()
            self._closed, self._distrust = set(), False
        # A full scan re-adds every folder's watch as it goes: the kernel hands back the
        # same watch for a folder already watched, so nothing is removed (removing
        # thousands of watches floods the queue with IN_IGNORED events and overflows it).
        return changes

    def peek(self) -> Changes:
        """As ``prepare`` but the changes stay for the next capture."""
        self._barrier()
        self._keep_mirror()
        with self._lock:
            return Changes(self._full, set(self._dirty), set(self._rescan), set(self.linked),
                           set(self._closed), self._distrust)

    def give_back(self, changes: Changes) -> None:
        """A capture that was not committed returns what it took."""
        with self._lock:
            self._full = self._full or changes.full
            self._dirty |= changes.dirty
            self._rescan |= changes.rescan
            self._closed |= changes.closed
            self._distrust = self._distrust or changes.distrust
            spilled = self._spill_locked()
        if spilled:
            self.invalidate(spilled)

    def invalidate(self, reason: str) -> None:
        with self._lock:
            self._full = True
        self.fallbacks += 1
        TRACKER_FALLBACKS.inc()
        log.info("tracker %s: full scan next (%s)", self.path, reason)

    # -- called by the reader thread ---------------------------------------------------
    def on_event(self, wd: int, mask: int, name: str) -> None:
        if mask & IN_IGNORED:
            with self._lock:
                if self._paths.pop(wd, None) is None and self.mirror is not None:
                    self.mirror.forget(wd)
            return
        with self._lock:
            folder = self._paths.get(wd)
            seen = self.mirror.paths.get(wd) if folder is None and self.mirror else None
        if seen is not None:
            self._on_mirror_event(seen, mask, name)
            return
        if folder is None:
            return
        if mask & (IN_DELETE_SELF | IN_MOVE_SELF) and folder == "":
            self.invalidate("the workspace folder itself was moved or deleted")
            return
        if not name:
            if mask & IN_ATTRIB and folder:  # a folder's own mode
                with self._lock:
                    self._dirty.add(folder)
            return
        if name.startswith(TEMP_PREFIX):
            return  # the daemon's own temporaries
        path = f"{folder}/{name}" if folder else name
        appeared_folder = bool(mask & IN_ISDIR and mask & (IN_CREATE | IN_MOVED_TO))
        with self._lock:
            self._note_locked(path, mask, appeared_folder)
            spilled = self._spill_locked()
        if spilled:
            self.invalidate(spilled)
        if mask & IN_ISDIR and mask & IN_MOVED_FROM:
            self._unwatch_below(path)
        if appeared_folder:
            self._watch_new_folder(path)

    def _on_mirror_event(self, folder: str, mask: int, name: str) -> None:
        """An event of the merged view: its path is dirty. What appeared, moved or went
        is the upper folder's to say (its events rescan and watch)."""
        if mask & IN_UNMOUNT:
            with self._lock:
                self.mirror.live = False
            return
        if name.startswith(TEMP_PREFIX) or not (name or mask & IN_ATTRIB and folder):
            return
        path = f"{folder}/{name}" if folder and name else folder or name
        with self._lock:
            self._note_locked(path, mask, False)
            spilled = self._spill_locked()
        if spilled:
            self.invalidate(spilled)

    def _note_locked(self, path: str, mask: int, appeared_folder: bool) -> None:
        """Keep what the next capture must look at. A full scan comes: it looks at every
        path, so only the closed files are kept (it trusts the stat cache, whose stat a
        write through a mapping leaves as it was)."""
        if not self._full:
            (self._rescan if appeared_folder else self._dirty).add(path)
        if mask & IN_CLOSE_WRITE and not appeared_folder:
            self._closed.add(path)

    def _spill_locked(self) -> str | None:
        """Past ``MAX_CHANGES`` paths kept (an agent making millions of files between two
        checkpoints must not take the daemon's memory): drop the changed paths, and a
        full scan comes instead, which finds them by itself; the reason, or None. Past
        ``MAX_CHANGES`` closed files as well: drop them too, and the next capture trusts
        no stat (``distrust``): it reads every file, since one of them may have been
        written through a mapping."""
        if len(self._dirty) + len(self._rescan) + len(self._closed) <= MAX_CHANGES:
            return None
        if self._dirty or self._rescan:
            self._dirty, self._rescan = set(), set()
            return f"more than {MAX_CHANGES} paths changed since the last capture"
        self._closed, self._distrust = set(), True
        return (f"more than {MAX_CHANGES} files closed after writing since the last"
                " capture: the next one reads every file")

    def on_overflow(self) -> None:
        self.invalidate("the inotify queue overflowed")

    # -- internals -----------------------------------------------------------------------
    def _barrier(self) -> None:
        # A full scan too: it trusts the stat cache, and a file closed after writing
        # (through a mapping, say, which leaves the stat as it was) is read again only
        # if its close is in the changes taken (without the barrier, a full scan after a
        # flood or an overflow would leave the closes still queued for the next capture).
        if not self.monitor.barrier():
            self.invalidate("the inotify queue could not be read")

    def _keep_mirror(self) -> None:
        """Watch the merged view if it is mounted and not watched: a container started,
        or started again (a new mount; `docker restart` keeps the old one). No scan is
        needed for what was done through it meanwhile. A new mount has new inodes, so a
        change can reach the upper folder under another name only for a file linked
        since it was mounted, after the last barrier: its new name is in this capture's
        dirty set (the upper folder reports a link under its own name), and so is any
        folder made for it. A file linked before the mount, and still linked, is among
        the files with other links that every capture looks at. (A daemon starts with
        a full scan.)"""
        mirror = self.mirror
        if mirror is None or self._degraded:
            return
        if mirror.broken:
            self._degrade(f"cannot watch the container's view: {mirror.broken}")
            return
        if mirror.live:
            return
        root = mirror.open_mounted()
        if root is None:
            return
        os.close(root)
        with self.monitor.holding_events():
            with self._lock:
                stale = mirror.clear()
                mirror.live = True
                rels = [""] + [rel for rel in self._wds if rel]
            for wd in stale:
                self.monitor.forget_raw(wd)
            self._mirror_many(rels)
        if mirror.broken:
            self._degrade(f"cannot watch the container's view: {mirror.broken}")
            return
        if "" not in mirror.wds:
            with self._lock:
                mirror.live = False  # unmounted as we looked: try again next time

    def _watch_new_folder(self, rel: str) -> None:
        """Watch a folder that appeared, and every folder below it (it is rescanned)."""
        excluded = self.excluded
        if excluded is not None and excluded(rel, True):
            return  # never captured: its changes are nobody's business
        try:
            root = os.open(os.path.join(self.path, rel),
                           os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return  # gone again, or a symlink now: the rescan will see what is there

        def watch(fd: int, below: str) -> None:
            self.watch_folder(f"{rel}/{below}" if below else rel, fd)

        def skip(below: str) -> bool:
            return excluded is not None and excluded(f"{rel}/{below}", True)

        try:
            for _ in folders_below(root, MAX_DEPTH, watch, skip):
                if self._degraded:
                    break
        except RecursionError:
            # Deeper than any capture takes: no picture to vouch for below it.
            self.invalidate(f"{rel} holds folders more than {MAX_DEPTH} deep")
        except OSError:
            pass  # changed while we looked: the rescan will see what is there
        finally:
            os.close(root)

    def _unwatch_below(self, rel: str) -> None:
        prefix = rel + "/"
        with self._lock:
            doomed = [wd for wd, p in self._paths.items() if p == rel or p.startswith(prefix)]
            for wd in doomed:
                del self._paths[wd]
            if self.mirror is not None:
                doomed += self.mirror.below(rel)
        self._drop(doomed)

    def _unwatch_all(self) -> None:
        with self._lock:
            doomed, self._paths = list(self._paths), {}
            if self.mirror is not None:
                doomed += self.mirror.clear()
        self._drop(doomed)

    def _drop(self, wds: list[int]) -> None:
        for wd in wds:
            self.monitor.rm_watch(wd)

    def _degrade(self, reason: str) -> None:
        """Past the watch limit the tracker cannot vouch for anything: it lets go of its
        watches and every capture of this folder is a full scan from now on."""
        self._degraded = True
        self._unwatch_all()
        self.invalidate(f"cannot watch every folder: {reason}")

    def close(self) -> None:
        self._unwatch_all()


class ChangeMonitor:
    """The daemon's one inotify instance and its reader thread. Lock order: the read
    lock (held while events are dispatched) before the monitor's lock."""

    def __init__(self, max_watches_per_workspace: int = 1 << 20) -> None:
        self.max_watches = max_watches_per_workspace
        fd = _libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        self.fd = fd
        self._owners: dict[int, WorkspaceTracker] = {}
        self._trackers: dict[str, WorkspaceTracker] = {}
        self._lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._events = bytearray(EVENT_BUFFER)  # read into under _read_lock
        self._wake_r, self._wake_w = os.pipe()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="change-monitor", daemon=True)
        self._thread.start()

    def tracker(self, workspace: str) -> WorkspaceTracker:
        with self._lock:
            t = self._trackers.get(workspace)
            if t is None:
                t = self._trackers[workspace] = WorkspaceTracker(self, workspace,
                                                                 self.max_watches)
            return t

    def release(self, workspace: str) -> None:
        """Stop watching ``workspace`` (its session was deleted)."""
        with self._lock:
            tracker = self._trackers.pop(workspace, None)
        if tracker is not None:
            tracker.close()

    def barrier(self) -> bool:
        """Dispatch every event queued before this call, here (not by waking the reader
        thread: a thread hand-off per checkpoint, milliseconds under load); False if
        the queue could not be read (every tracker has then been told to scan)."""
        return self._drain()

    @contextlib.contextmanager
    def holding_events(self):
        """No event is dispatched (nor a watch added elsewhere) while this is held."""
        with self._lock:
            yield

    def add_watch(self, path: str, owner: WorkspaceTracker, rel: str) -> int:
        """The watch descriptor, or minus the errno. The owner learns the watch's folder
        under this lock, so no event can reach it before it knows the path."""
        with self._lock:
            wd = _libc.inotify_add_watch(self.fd, os.fsencode(path), WATCH_MASK)
            if wd < 0:
                return -ctypes.get_errno()
            owner._known_many([(rel, wd)])
            return wd

    def add_raw(self, path: str) -> int:
        """A watch nobody owns yet, or minus the errno (the caller holds the lock and
        names its owner before letting go of it)."""
        wd = _libc.inotify_add_watch(self.fd, os.fsencode(path), WATCH_MASK)
        return wd if wd >= 0 else -ctypes.get_errno()

    def forget_raw(self, wd: int) -> None:
        """Let go of a watch whose mount is gone (the caller holds the lock)."""
        if self._owners.pop(wd, None) is not None:
            _libc.inotify_rm_watch(self.fd, wd)

    def rm_watch(self, wd: int) -> None:
        with self._lock:
            if self._owners.pop(wd, None) is not None:
                _libc.inotify_rm_watch(self.fd, wd)

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        while not self._stopping:
            try:
                poller.poll()
                # Let a checkpoint's barrier drain the queue itself: reading here at once
                # would take the interpreter lock from it, mid-request.
                time.sleep(READER_DELAY)
                if self._stopping or not self._drain():
                    break
            except Exception:  # the reader must not die while trackers trust it
                log.exception("the change monitor failed; every workspace falls back to"
                              " full scans")
                self._overflow()
                time.sleep(0.1)

    def _drain(self) -> bool:
        """Read and dispatch every queued event, in order (the reader thread and barriers
        both drain; one at a time). False once the inotify instance has failed."""
        with self._read_lock:
            while True:
                try:  # into one buffer: os.read would allocate a fresh one every time
                    count = os.readv(self.fd, [self._events])
                except BlockingIOError:
                    return True
                except OSError as exc:
                    if exc.errno == errno.EINTR:
                        continue
                    log.error("inotify read failed: %s; every workspace falls back to scans",
                              exc)
                    self._overflow()
                    return False
                chunk = self._events
                offset = 0  # a read returns whole events only
                while offset + _EVENT.size <= count:
                    wd, mask, _cookie, length = _EVENT.unpack_from(chunk, offset)
                    end = offset + _EVENT.size + length
                    name = os.fsdecode(bytes(chunk[offset + _EVENT.size:end]).rstrip(b"\0"))
                    offset = end
                    self._dispatch(wd, mask, name)

    def _dispatch(self, wd: int, mask: int, name: str) -> None:
        if mask & IN_Q_OVERFLOW:
            self._overflow()
            return
        with self._lock:
            owner = self._owners.get(wd)
            if mask & IN_IGNORED:
                self._owners.pop(wd, None)
        if owner is not None:
            try:
                owner.on_event(wd, mask, name)
            except Exception as exc:  # never leave a tracker trusted after a failure
                log.exception("change tracking of %s failed", owner.path)
                owner.invalidate(f"its change tracking failed: {exc!r}")

    def _overflow(self) -> None:
        with self._lock:
            trackers = list(self._trackers.values())
        for t in trackers:
            t.on_overflow()

    def close(self) -> None:
        self._stopping = True
        os.write(self._wake_w, b"x")
        self._thread.join(5)
        os.close(self.fd)
        os.close(self._wake_r)
        os.close(self._wake_w)
