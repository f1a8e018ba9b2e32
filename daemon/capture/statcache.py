"""The stat cache: what each workspace file and folder looked like when it was last read.

Host-local, like git's index: capture's index of the workspaces it has read, kept in
SQLite. For each workspace it keeps

- *files*: relative path -> (signature, ref, extra, kind) for files and symlinks,
  where the signature is the entry's (size, mtime_ns, ctime_ns, inode, mode, uid, gid,
  nlink, blocks) packed in 56 bytes (walk.SIG), ref its content digest (a sparse
  file's extent map, a symlink's target) and extra its xattrs (trees.make_extra), so
  an unchanged file is never read again, nor its xattrs;
- *folders* (memos): relative path -> (signature, tree digest, size, kind, extra), so a full
  scan that finds a folder, every file in it and every folder below it as they were
  reuses the folder's tree without rebuilding it (walk.py says exactly when a memo
  holds).

It is a cache, never history: losing it costs one rehash. An entry is written only once
the blobs it names are durable, and only when the file or folder was not modified
within ``RACY_NS`` of being read (git's racy-clean rule: a change in the same timestamp
tick would leave the signature unchanged). A memo is only written for a folder whose
every entry was cached that way, and every memo is dropped when a capture rewrites its
tree from a tracker's changes.

Persistence: one SQLite file holding, per workspace, a snapshot (the two maps,
marshalled; with a data key, sealed, as each log row is: a symlink's target and xattr
values are the agent's content) and a log of the changes made since; loading reads the snapshot and
replays the log. A change as large as the maps it changes (a first capture) is
written as the snapshot itself, not logged. A logged change is written behind: kept
in memory (``_unwritten``) and written with the others by ``write_behind``, which the
daemon's housekeeping calls every second, so a checkpoint's reply never waits for it
(an insert and a commit of its own). A daemon
killed in that second loses those entries, as a power cut could always lose the
log's unsynced tail: the files they name are read once more. ``compact`` folds the log into the
snapshot: when a workspace's log grows past ``COMPACT_AT`` entries, when the daemon is
idle (one workspace at a time, until a write comes in), and when it stops. A
compaction deletes the old snapshot and the log before it writes the new snapshot, so
the new one takes their pages instead of new ones at the end of the file. An idle
compaction also gives the pages it freed back to the filesystem (the file is in
``auto_vacuum=INCREMENTAL`` mode; a file in another mode is converted when opened, a
``VACUUM`` once), then moves the write-ahead log into the file and truncates it, as
the daemon does for its other databases: at rest the file holds what the cache holds.
"""

from __future__ import annotations

import contextlib
import logging
import marshal
import os
import sqlite3
import threading
import time
from collections.abc import Iterator

from worldline.wire.errors import DataLoss

from ..storage.sqlite_store import damaged, to_incremental_vacuum
from .walk import SIG, signature

log = logging.getLogger(__name__)

__all__ = ["RACY_NS", "Signature", "Memo", "StatCache", "signature", "is_racy",
           "is_racy_signature"]

RACY_NS = 100_000_000
# Logged entries of one workspace that trigger a compaction at once (a compaction
# rewrites the whole snapshot: milliseconds for a Django-sized tree). An idle daemon,
# and one that stops, compacts whatever was logged.
COMPACT_AT = 16384

Signature = bytes  # walk.SIG: size, mtime_ns, ctime_ns, inode, mode, uid, gid, nlink, blocks
Memo = tuple[bytes, str, int, str, str]  # folder signature, tree digest, size, kind, extra
FILE, FOLDER = 0, 1
_INCREMENTAL = 2  # PRAGMA auto_vacuum


def is_racy(st: os.stat_result, now_ns: int | None = None) -> bool:
    now_ns = time.time_ns() if now_ns is None else now_ns
    return now_ns - max(st.st_mtime_ns, st.st_ctime_ns) < RACY_NS


def is_racy_signature(sig: bytes, now_ns: int | None = None) -> bool:
    _, mtime_ns, ctime_ns, *_ = SIG.unpack(sig)
    now_ns = time.time_ns() if now_ns is None else now_ns
    return now_ns - max(mtime_ns, ctime_ns) < RACY_NS


class _Workspace:
    __slots__ = ("files", "folders", "logged")

    def __init__(self, files: dict, folders: dict, logged: int) -> None:
        self.files: dict[str, tuple] = files
        self.folders: dict[str, Memo] = folders
        self.logged = logged  # entries in the log, not yet in the snapshot


class StatCache:
    """Per-workspace files and folder memos, kept in memory, persisted in SQLite."""

    def __init__(self, db_path: str | None, key=None) -> None:
        self._path = db_path
        self._key = key  # crypto.DataKey of a keyed data root: rows sealed with it
        try:
            self._db = _open(db_path)
        except sqlite3.DatabaseError as exc:
            if db_path is None or not damaged(exc):
                raise
            self._db = _open_anew(db_path, exc)
        self._loaded: dict[str, _Workspace] = {}
        self._unwritten: list[tuple[str, tuple]] = []  # (workspace, change), logged next
        self._lock = threading.Lock()
        self._last_write = time.monotonic()
        self._wal_written = True  # since its write-ahead log was last emptied

    def _renew(self, exc: sqlite3.DatabaseError) -> None:
        """The file turned out damaged while open (under the lock): set it aside, start
        an empty one, and forget every workspace's maps (each is read again)."""
        self._db.close()
        self._db = _open_anew(self._path, exc) if self._path else _open(None)
        self._loaded.clear()
        self._unwritten.clear()
        self._wal_written = True

    # A row holds agent content (a symlink's target is its ref, xattrs their values):
    # with a data key it is sealed, bound to its workspace.
    def _dumps(self, workspace: str, value) -> bytes:
        data = marshal.dumps(value)
        if self._key is None:
            return data
        return self._key.seal_meta(data, b"stat cache " + workspace.encode())

    def _loads(self, workspace: str, data: bytes):
        if self._key is not None:
            data = self._key.open_meta(bytes(data), b"stat cache " + workspace.encode())
        return marshal.loads(data)

    # -- reading -----------------------------------------------------------------------
    def entries(self, workspace: str) -> dict[str, tuple]:
        """The live file map of one workspace (callers hold the session's lock)."""
        return self._workspace(workspace).files

    def folders(self, workspace: str) -> dict[str, Memo]:
        """The live folder memos of one workspace (callers hold the session's lock)."""
        return self._workspace(workspace).folders

    def loaded(self, workspace: str) -> bool:
        """Whether the workspace's maps are in memory (reading them costs nothing)."""
        with self._lock:
            return workspace in self._loaded

    def _workspace(self, workspace: str) -> _Workspace:
        with self._lock:
            ws = self._loaded.get(workspace)
            if ws is None:
                ws = self._loaded[workspace] = self._load_or_forget(workspace)
            return ws

    def _load_or_forget(self, workspace: str) -> _Workspace:
        """The workspace's maps, or empty ones if what the file holds of them cannot be
        read (the file set aside if SQLite finds it damaged; the workspace's rows
        dropped if they are not what this cache writes): the next capture reads every
        file again, never trusting a damaged entry."""
        try:
            with self._renewed_if_damaged():
                return self._load(workspace)
        except (ValueError, EOFError, TypeError, AttributeError, KeyError, DataLoss) as exc:
            log.warning("the stat cache of %s cannot be read (%s: %s): forgotten; its next"
                        " capture reads every file again", workspace, type(exc).__name__, exc)
            self._db.execute("DELETE FROM snapshot WHERE workspace = ?", (workspace,))
            self._db.execute("DELETE FROM log WHERE workspace = ?", (workspace,))
            self._wal_written = True
        return _Workspace({}, {}, 0)

    def _load(self, workspace: str) -> _Workspace:
        row = self._db.execute("SELECT data FROM snapshot WHERE workspace = ?",
                               (workspace,)).fetchone()
        files, folders = self._loads(workspace, row[0]) if row else ({}, {})
        logged = 0
        for (data,) in self._db.execute("SELECT data FROM log WHERE workspace = ?"
                                        " ORDER BY seq", (workspace,)):
            logged += _apply(files, folders, self._loads(workspace, data))
        return _Workspace(files, folders, logged)

    # -- writing -----------------------------------------------------------------------
    def update(self, workspace: str, changed: dict[str, tuple],
               removed: set[str], folders: dict[str, Memo | None] | None = None) -> None:
        """Record files that changed, files that are gone, and folder memos (None: drop)."""
        folders = folders or {}
        if not changed and not removed and not folders:
            return
        ws = self._workspace(workspace)
        change = (dict(changed), sorted(removed),
                  {p: m for p, m in folders.items() if m is not None or p in ws.folders})
        with self._lock, self._renewed_if_damaged():
            if _size(change) >= len(ws.files) + len(ws.folders):
                # As large as the maps it changes (a first capture, a full scan that
                # found most things new): the snapshot costs what its log row would,
                # and leaves an idle daemon nothing to fold.
                _apply(ws.files, ws.folders, change)
                self._compact(workspace, ws)
            else:
                # written behind: the change's containers are its own, its entries tuples
                self._unwritten.append((workspace, change))
                ws.logged += _apply(ws.files, ws.folders, change)
                if ws.logged >= COMPACT_AT:
                    self._compact(workspace, ws)
            self._last_write = time.monotonic()
            self._wal_written = True

    def write_behind(self) -> int:
        """Log the changes ``update`` kept in memory, in one transaction; returns how
        many."""
        with self._lock, self._renewed_if_damaged():
            rows = [(w, self._dumps(w, change)) for w, change in self._unwritten]
            if not rows:
                return 0
            with self._transaction():
                self._db.executemany("INSERT INTO log (workspace, data) VALUES (?, ?)", rows)
            self._unwritten.clear()
            self._wal_written = True
            return len(rows)

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        """The block's statements committed together, or none (the caller holds the
        lock)."""
        self._db.execute("BEGIN")
        try:
            yield
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    def _drop_unwritten(self, workspace: str) -> None:
        """A workspace's snapshot written (or its maps forgotten) holds its unwritten
        changes, or drops them."""
        self._unwritten = [u for u in self._unwritten if u[0] != workspace]

    @contextlib.contextmanager
    def _renewed_if_damaged(self) -> Iterator[None]:
        """A read or write that finds the file damaged (under the lock) sets it aside and
        starts an empty one, losing nothing but the cache; any other error is raised."""
        try:
            yield
        except sqlite3.DatabaseError as exc:
            if not damaged(exc):
                raise
            self._renew(exc)

    def compact(self, idle_seconds: float = 0.0) -> int:
        """Fold every loaded workspace's log into its snapshot once nothing was written
        for ``idle_seconds``, then empty the write-ahead log; returns how many
        workspaces were compacted. One workspace at a time: an update that comes in
        the meantime waits for one workspace's compaction at most, and stops the rest."""
        done = 0
        for workspace in self._logged():
            with self._lock, self._renewed_if_damaged():
                if time.monotonic() - self._last_write < idle_seconds:
                    return done
                ws = self._loaded.get(workspace)
                if ws is not None and ws.logged:
                    self._compact(workspace, ws)
                    done += 1
        with self._lock, self._renewed_if_damaged():
            if time.monotonic() - self._last_write < idle_seconds:
                return done
            if self._wal_written:
                try:
                    # executescript steps it to the end (execute frees one page a call)
                    self._db.executescript("PRAGMA incremental_vacuum;")
                    busy, _, _ = self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
                    self._wal_written = busy != 0
                except sqlite3.OperationalError:  # a read of digests() in its way: next time
                    pass
        return done

    def _logged(self) -> list[str]:
        """The loaded workspaces with a log to fold."""
        with self._lock:
            return [workspace for workspace, ws in self._loaded.items() if ws.logged]

    def _compact(self, workspace: str, ws: _Workspace) -> None:
        data = self._dumps(workspace, (ws.files, ws.folders))
        with self._transaction():
            # the old rows first: the new snapshot takes the pages they free
            self._db.execute("DELETE FROM log WHERE workspace = ?", (workspace,))
            self._db.execute("DELETE FROM snapshot WHERE workspace = ?", (workspace,))
            self._db.execute("INSERT INTO snapshot VALUES (?, ?)", (workspace, data))
        self._drop_unwritten(workspace)
        ws.logged = 0
        self._wal_written = True

    def forget(self, workspace: str) -> None:
        with self._lock, self._renewed_if_damaged():
            self._loaded.pop(workspace, None)
            self._drop_unwritten(workspace)
            self._db.execute("DELETE FROM snapshot WHERE workspace = ?", (workspace,))
            self._db.execute("DELETE FROM log WHERE workspace = ?", (workspace,))
            self._wal_written = True

    def digests(self) -> set[str]:
        """Every digest the cache names (file contents and memo trees): garbage
        collection keeps these blobs, since a capture may name them without storing."""
        names: set[str] = set()
        with self._lock:
            with self._renewed_if_damaged():
                names = {w for (w,) in self._db.execute(
                    "SELECT workspace FROM snapshot UNION SELECT workspace FROM log")}
            names |= set(self._loaded)
        out: set[str] = set()
        for workspace in names:
            ws = self._workspace(workspace)
            with self._lock:
                out.update(v[1] for v in ws.files.values() if v[-1] != "symlink")
                out.update(m[1] for m in ws.folders.values())
        return out

    def close(self) -> None:
        try:
            self.write_behind()
        finally:
            self._db.close()


def _open(db_path: str | None) -> sqlite3.Connection:
    db = sqlite3.connect(db_path or ":memory:", check_same_thread=False, isolation_level=None)
    try:
        if db.execute("PRAGMA auto_vacuum").fetchone()[0] != _INCREMENTAL:
            to_incremental_vacuum(db, db_path)  # a file an older version made without it
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("DROP TABLE IF EXISTS stat")  # 0.1's row-per-file cache: rehash once
        db.execute("CREATE TABLE IF NOT EXISTS snapshot (workspace TEXT PRIMARY KEY,"
                   " data BLOB NOT NULL)")
        db.execute("CREATE TABLE IF NOT EXISTS log (seq INTEGER PRIMARY KEY,"
                   " workspace TEXT NOT NULL, data BLOB NOT NULL)")
        db.execute("CREATE INDEX IF NOT EXISTS log_workspace ON log (workspace, seq)")
    except BaseException:
        db.close()
        raise
    return db


def _open_anew(db_path: str, exc: sqlite3.DatabaseError) -> sqlite3.Connection:
    """Set a damaged cache file aside (with its write-ahead log, for whoever wants to
    look) and open an empty one in its place: losing a cache costs one rehash, never a
    start of the daemon."""
    aside = db_path + ".damaged"
    for suffix in ("", "-wal"):
        try:
            os.replace(db_path + suffix, aside + suffix)
        except FileNotFoundError:
            pass
    try:
        os.unlink(db_path + "-shm")
    except FileNotFoundError:
        pass
    log.warning("the stat cache %s is damaged (%s): set aside as %s; an empty one takes its"
                " place, and each workspace's next capture reads every file again",
                db_path, exc, aside)
    return _open(db_path)


def _size(change: tuple) -> int:
    """How many entries one change holds."""
    changed, removed, memos = change
    return len(changed) + len(removed) + len(memos)


def _apply(files: dict, folders: dict, change: tuple) -> int:
    """Apply one logged change; returns how many entries it holds."""
    changed, removed, memos = change
    for p in removed:
        files.pop(p, None)
    files.update(changed)
    for p, m in memos.items():
        if m is None:
            folders.pop(p, None)
        else:
            folders[p] = m
    return _size(change)
