"""The embedded metadata store: SQLite in WAL mode.

One writer connection behind a lock takes every write transaction; each thread
reads through its own connection, so reads never wait behind a commit's fsync (WAL
lets readers run beside the writer, each on the last committed snapshot).

Durability: a write transaction returns only once it is on disk, so neither a killed
daemon nor a power cut loses a checkpoint acknowledged to a client. The fsync of the
write-ahead log that makes it so is taken after the commit, outside the write lock
(``_flush``): the next transaction is written while this one's flush runs, and one
fsync covers every commit written before it began (group commit). The WAL is a log:
its later commits are only valid after its earlier ones, so a flushed commit is never
found after a crash without those before it, whichever connection wrote them (the
pack, when it lives in this file, relies on that). No commit copies the WAL into the
file (SQLite's automatic checkpoint, under the write lock): a thread per file does,
beside the writers (wal.py). The statements are ``SqlStore``'s (sql_store.py), shared
with PostgreSQL.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace

from worldline.wire.errors import DataLoss, ResourceExhausted, Unavailable

from ..faults import crash_point
from ..observe import METADATA_FSYNC
from ..records import Session, Task
from . import blob_index, reserve, wal
from .blob_index import BlobIndexSql
from .crypto import DataKey
from .durable import fsync_folder, out_of_space
from .migrations import Migration, latest, migrate
from .schema import METADATA, SQLITE, ddl
from .sealed import Columns
from .sql_store import SqlStore, digest_in

log = logging.getLogger(__name__)

SCHEMA = ddl(METADATA, SQLITE)


def _add_columns(table: str, *columns: str):
    """A migration step adding ``columns`` ("name TYPE ...") that are not there yet (a
    0.3 data root may have some of them already)."""
    def run(db) -> None:
        have = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
        for column in columns:
            if column.split()[0] not in have:
                db.execute(f"ALTER TABLE {table} ADD COLUMN {column}")
    return run


def _steps(*steps):
    def run(db) -> None:
        for step in steps:
            step(db)
    return run


# Version 1 is 0.1-0.3's schema; SCHEMA above is the latest whole.
MIGRATIONS = (
    Migration(2, "0.4: a session's container spec and needs_attention",
              _add_columns("sessions", "spec TEXT NOT NULL DEFAULT '{}'", "needs_attention TEXT")),
    Migration(3, "0.5: deleted sessions, the agent's resume point", _steps(
        _add_columns("sessions", "deleted_at TEXT"),
        _add_columns("checkpoints", "resume TEXT NOT NULL DEFAULT ''"))),
    # New tables need no step: opening the file makes every absent table of SCHEMA.
    Migration(4, "0.6: the blob index of a bucket (s3 blobs)", lambda db: None),
    Migration(5, "0.6: the host that holds a session, its lease", _add_columns(
        "sessions", "host TEXT NOT NULL DEFAULT ''", "lease_expires REAL NOT NULL DEFAULT 0",
        "released_to TEXT")),
    Migration(6, "0.6: where each host answers (table made at open)", lambda db: None),
    Migration(7, "0.7: digests as bytes, not hex text", lambda db: _binary_digests(db)),
    Migration(8, "0.7.4: checkpoints keyed by their id (no second index of ids)",
              lambda db: _checkpoints_by_id(db)),
    # Nothing to change in an older file (its pack stays in blobs/pack.db); the version
    # keeps a worldline older than this step from opening a data root whose pack is
    # here, where it would find no blobs at all.
    Migration(9, "0.7.7: the pack may live in this file (data roots made from 0.7.7 on)",
              lambda db: None),
    # Nothing to change either: the version keeps a worldline older than this step,
    # which reads an entry of codec "zstd" as raw bytes (and fails it as corrupt), from
    # a bucket this store indexes.
    Migration(10, "0.7.8: a bucket's entries may be zstd frames (codec 'zstd')",
              lambda db: None),
    # Nor here: the version keeps a worldline older than this step, which fails a pack
    # row of kind COPIES as an unknown encoding, from a data root whose pack may hold
    # them.
    Migration(11, "0.7.12: the pack may hold copy deltas (rows of kind COPIES)",
              lambda db: None),
    # Nor here: the version keeps a worldline older than this step, which fails a
    # bucket's entry of codec "delta" as an unknown codec, from a bucket this store
    # indexes.
    Migration(12, "0.7.14: a bucket's entries may be deltas within their object"
              " (codec 'delta')", lambda db: None),
    Migration(13, "0.7.15: a checkpoint's new blobs may be staged in the metadata store"
              " (blob_objects.body)", _add_columns("blob_objects", "body BLOB")),
    Migration(14, "0.8: a checkpoint's warnings (checkpoints.warnings, a JSON list or '')",
              _add_columns("checkpoints", "warnings TEXT NOT NULL DEFAULT ''")),
    # Nothing to change: the version keeps a worldline that knows no data key, which
    # would read sealed values as text and write its own in the clear among them, from
    # a store that may be sealed (sealed.py, meta.sealed).
    Migration(15, "0.8: the agent's content may be sealed with a data key (meta.sealed)",
              lambda db: None),
)


def _binary_digests(db) -> None:
    """Rewrite the digests an older data root holds as hex text (migration 7)."""
    for table, key, columns in (
            ("checkpoints", "id", ("tree", "state_digest", "tasks_digest", "container")),
            ("audit", "seq", ("prev_hash", "hash"))):
        rows = db.execute(f"SELECT {key}, {', '.join(columns)} FROM {table}").fetchall()
        db.executemany(
            f"UPDATE {table} SET {', '.join(f'{c} = ?' for c in columns)} WHERE {key} = ?",
            [tuple(digest_in(v) for v in row[1:]) + (row[0],) for row in rows])


def _checkpoints_by_id(db) -> None:
    """Rebuild an older checkpoints table (keyed by rowid, with a second index of ids)
    as SCHEMA's (keyed by id), every row copied as it is, in the migration's
    transaction (migration 8)."""
    made = db.execute("SELECT sql FROM sqlite_master WHERE type = 'table'"
                      " AND name = 'checkpoints'").fetchone()[0]
    if "WITHOUT ROWID" in made.upper():
        return
    start = SCHEMA.index("CREATE TABLE IF NOT EXISTS checkpoints")
    create = SCHEMA[start:SCHEMA.index(";", start)].replace(
        "CREATE TABLE IF NOT EXISTS checkpoints", "CREATE TABLE checkpoints_by_id")
    db.execute(create)
    old = {r[1] for r in db.execute("PRAGMA table_info(checkpoints)")}
    columns = ", ".join(r[1] for r in db.execute("PRAGMA table_info(checkpoints_by_id)")
                        if r[1] in old)  # a later version's columns come by their step
    db.execute(f"INSERT INTO checkpoints_by_id ({columns}) SELECT {columns} FROM checkpoints")
    db.execute("DROP TABLE checkpoints")
    db.execute("ALTER TABLE checkpoints_by_id RENAME TO checkpoints")


SCHEMA_VERSION = latest(MIGRATIONS)
# The files each thread has a write transaction open to (``SqliteDatabase._tx``).
_WRITING = threading.local()
# The commits whose fsync each thread takes later, if it asked to (``flushes_deferred``).
_DEFERRED = threading.local()
# A new file gives freed pages back to the file system when asked (the pack's
# ``incremental_vacuum``: a data root may keep its pack in this file, migration 9).
FIRST = "PRAGMA auto_vacuum=INCREMENTAL;"
# Files an fsync failed for, with their connections, never closed (SqliteDatabase.close)
_LEFT_OPEN: list[tuple[str, list[sqlite3.Connection]]] = []


def damaged(exc: sqlite3.DatabaseError) -> bool:
    """Whether SQLite says the file is damaged, or not a database at all (not busy, full,
    unreadable or the like, which say nothing of what the file holds)."""
    return (getattr(exc, "sqlite_errorcode", 0) & 0xFF) in (11, 26)  # CORRUPT, NOTADB


def to_incremental_vacuum(db: sqlite3.Connection, path: str | None) -> None:
    """Convert a file made without ``auto_vacuum=INCREMENTAL`` to it: a ``VACUUM``, which
    copies the file into a temporary one and writes that back through the file's log,
    so it takes about twice the file's size. With less free than that and the reserve's
    size more, the file is left as it is until an open with room (logged): a start must
    not fill the disk, which stops every session's checkpoints (a ``VACUUM`` run
    regardless would fill the disk at each start, and its log keep the space). One
    that fails anyway (another writer took the room meanwhile) gives its log's space
    back at once. What a start opens never stops it."""
    if path is not None:
        need = 2 * os.path.getsize(path) + reserve.SIZE
        free = reserve.free_bytes(os.path.dirname(os.path.abspath(path)))
        if free < need:
            log.warning("%s keeps its freed pages until an open with room to convert it:"
                        " that needs %d MB free, %d MB are", path, need >> 20, free >> 20)
            return
    db.execute("PRAGMA auto_vacuum=INCREMENTAL")
    try:
        db.execute("VACUUM")
    except sqlite3.OperationalError as exc:
        log.warning("%s keeps its freed pages until an open with room to convert it: %s",
                    path, exc)
        try:  # the log holds the copy that did not fit: nothing else is in it
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.Error as again:
            log.warning("%s: the failed conversion's log was not truncated: %s", path,
                        again)


def left_open() -> list[str]:
    """The files whose connections ``close`` left open: a process that closed any must
    end without closing them (``os._exit``: a normal exit closes every connection)."""
    return [path for path, _ in _LEFT_OPEN]


@contextmanager
def flushes_deferred() -> Iterator[Callable[[], None]]:
    """Within the block, a write transaction this thread commits to a database that
    makes each commit durable returns before its fsync. The callable yielded takes
    those fsyncs (each a group commit, as ever): call it after the block, before
    anything is acknowledged. A checkpoint's commit is CPU work but for its fsync: it
    runs in the capture's turn at the admission gate, and the fsync after that turn
    (world/checkpoint.py). A block that raises leaves its commits to the next fsync of
    the same log (nothing was acknowledged)."""
    if getattr(_DEFERRED, "commits", None) is not None:
        raise RuntimeError("fsyncs are deferred already on this thread")
    commits: dict[SqliteDatabase, int] = {}  # each file's latest: its fsync covers the rest

    def flush() -> None:
        for db, number in commits.items():
            db._flush(number)
    _DEFERRED.commits = commits
    try:
        yield flush
    finally:
        _DEFERRED.commits = None


class SqliteDatabase:
    """One SQLite file in WAL mode: a writer connection behind a lock for write
    transactions (``_tx``), a read connection per thread (``_one``, ``_all``)."""

    def __init__(self, path: str, schema: str, first: str = "",
                 lock: threading.RLock | None = None, flush: bool = True) -> None:
        """``first``: pragmas that only a new file takes (run before anything else).
        ``lock``: the write lock of another ``SqliteDatabase`` on the same file, so their
        transactions take turns here rather than in SQLite's busy handler (which sleeps
        milliseconds). ``flush``: every write transaction is durable when it returns
        (False: the subclass flushes when it needs to)."""
        self.path = path
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        try:
            self._open(schema, first, lock, flush)
        except sqlite3.DatabaseError as exc:
            self._db.close()
            if not damaged(exc):
                raise
            raise DataLoss(f"the database {path} is damaged ({exc}); nothing was changed:"
                           " move it aside and put back a copy from a backup before"
                           " starting the daemon again") from None

    def _open(self, schema: str, first: str, lock: threading.RLock | None,
              flush: bool) -> None:
        path = self.path
        if first:
            self._db.executescript(first)
        self._db.execute("PRAGMA journal_mode=WAL")
        # The commit does not sync; ``_flush`` does, outside the lock. (NORMAL still
        # syncs the database file when the WAL is copied into it, before the WAL is
        # reused, so what was flushed stays durable.)
        self._db.execute("PRAGMA synchronous=NORMAL")
        # No commit copies the WAL into the file (milliseconds, under the write lock):
        # a thread of the file's own does, beside the writers (wal.py).
        self._db.execute("PRAGMA wal_autocheckpoint=0")
        self._flush_each = flush
        self._committed = 0  # write transactions committed on this connection
        self._flushed = 0  # how many of them an fsync of the WAL has made durable
        self._flush_lock = threading.Lock()
        self._log_named: tuple[int, int] | None = None  # (st_dev, st_ino): _name_log
        self._fsyncs = METADATA_FSYNC.labels(os.path.basename(path))
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.execute("PRAGMA busy_timeout=10000")
        self._lock = lock or threading.RLock()
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._db.executescript(schema)
        self._last_write = 0.0
        self._page_size = int(self._db.execute("PRAGMA page_size").fetchone()[0])
        self._wal: wal.Checkpointer | None = wal.checkpointer(path, self.restart_log)

    @contextmanager
    def _tx(self, pipelined: bool = False) -> Iterator[sqlite3.Connection]:
        open_here = _WRITING.__dict__.setdefault("paths", set())
        if self.path in open_here:  # another connection's transaction to this file, open
            # on this thread: its write lock is ours (shared), SQLite's is not, and this
            # one would wait busy_timeout for it and fail. Never done; say so at once.
            raise RuntimeError(f"a write transaction of {self.path} is already open on"
                               " this thread")
        with self._lock:
            self._refuse_if_broken()
            self._last_write = time.monotonic()
            open_here.add(self.path)
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    yield self._db
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")
            except sqlite3.OperationalError as exc:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                if "full" in str(exc):
                    raise ResourceExhausted(f"no space left for metadata: {exc}") from None
                raise
            finally:
                open_here.discard(self.path)
            self._committed += 1
            mine = self._committed
            self._on_commit()
        self._wal.committed()
        if self._flush_each:
            deferred = getattr(_DEFERRED, "commits", None)
            if deferred is None:
                self._flush(mine)
            else:
                deferred[self] = mine

    def _on_commit(self) -> None:
        """Called under the write lock as each write transaction commits, in commit
        order (``SqliteStore`` keeps what it has read up to date)."""

    def _flush(self, commit: int) -> None:
        """Return once write transaction number ``commit`` is durable: an fsync of the WAL
        begun after it was written covers it, and every commit written before that
        fsync began (whoever asks next for one of those finds it done)."""
        with self._flush_lock:
            if self._flushed >= commit:
                return
            self._refuse_if_broken()  # a later fsync may succeed over the hole
            written = self._committed  # every commit up to here is in the WAL's pages
            try:
                fd = os.open(self.path + "-wal", os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:  # no log: the commits were moved into the file,
                self._flushed = written  # which is synced when they are
                return
            started = time.perf_counter()
            try:
                crash_point("metadata.fsync")
                os.fsync(fd)
                self._name_log(fd)
            except OSError as exc:
                # The pages it could not write may be gone: no later fsync may be taken
                # for theirs (wal.py), nor any later commit acknowledged.
                self._wal.fail(f"fsync: {exc.strerror or exc}")
                if out_of_space(exc):
                    raise ResourceExhausted(f"no space left for metadata: {exc}; the"
                                            f" daemon takes no more writes until it is"
                                            f" restarted") from None
                raise self._refusal() from exc
            finally:
                os.close(fd)
            self._fsyncs.observe(time.perf_counter() - started)
            self._flushed = written

    def _name_log(self, fd: int) -> None:
        """The log's name durable too, once for each log file: SQLite makes the log when
        the file is opened and removes it when the last connection closes, and syncs
        the folder only at its first copy of the log into the file (a quarter of a
        second after the first commits, wal.py), where the commits before it were
        acknowledged already. An fsync of the log does not make its name durable on
        every file system (ext4 without a journal, for one)."""
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != self._log_named:
            fsync_folder(os.path.dirname(os.path.abspath(self.path)))
            self._log_named = (st.st_dev, st.st_ino)

    def broken(self) -> str | None:
        """Why this file's log takes no more writes in this process (an fsync of it
        failed: wal.py), or None."""
        return self._wal.failed if self._wal is not None else None

    def _refuse_if_broken(self) -> None:
        if self.broken() is not None:
            raise self._refusal()

    def _refusal(self) -> Unavailable:
        return Unavailable(f"the metadata store {self.path} failed to make a write"
                           f" durable ({self.broken()}): it takes no more writes, so none"
                           " is acknowledged over a log that may have lost one; restart"
                           " the daemon once the disk is healthy (its last acknowledged"
                           " writes are kept)")

    @property
    def write_lock(self) -> threading.RLock:
        """Held by every write transaction (and the WAL's compaction) of this file."""
        return self._lock

    def _reader(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, isolation_level=None,
                                 check_same_thread=False)
            db.execute("PRAGMA busy_timeout=10000")
            self._local.db = db
            with self._lock:
                self._readers.append(db)
        return db

    def _write_one(self, sql: str, args: tuple = ()) -> list:
        """One writing statement on its own; the rows it returns."""
        with self._tx() as db:
            return db.execute(sql, args).fetchall()

    def _one(self, sql: str, args: tuple):
        return self._reader().execute(sql, args).fetchone()

    def _all(self, sql: str, args: tuple = ()) -> list:
        return self._reader().execute(sql, args).fetchall()

    def restart_log(self) -> None:
        """Start the WAL again from its beginning: a write transaction of one page that
        changes nothing (the file's application id, written as it is). SQLite restarts
        the log at a write once everything in it is in the file, and syncs the log's new
        header before that write's frame; the next commit then appends to the log, with
        no sync inside it (wal.py). The log then holds no commit (``fresh``), and the
        frame is no commit of this connection's: its fsync is the next commit's."""
        with self._lock:
            if self._wal is None or self.broken() is not None:
                return
            crash_point("metadata.restart")
            try:
                application_id = int(self._db.execute("PRAGMA application_id").fetchone()[0])
                self._db.execute(f"PRAGMA application_id={application_id}")
            except sqlite3.Error:
                if self._db.in_transaction:  # the next write transaction begins anew
                    self._db.execute("ROLLBACK")
                raise
            self._wal.fresh = True

    def compact_wal(self, idle_seconds: float) -> bool:
        """When nothing was written for ``idle_seconds``, move the WAL into the database
        and truncate it, then start it again with one page (``restart_log``), so an idle
        daemon's data root holds no more than that of a write-ahead log (WAL mode
        otherwise keeps it at its high-water mark, megabytes) and the first commit after
        the pause syncs nothing but itself. Never waits long on a reader; returns True
        if the WAL was emptied."""
        log_path = self.path + "-wal"
        with self._lock:
            if (self.broken() or self._wal is None
                    or time.monotonic() - self._last_write < idle_seconds):
                return False
            try:
                size = os.path.getsize(log_path)
            except FileNotFoundError:
                return False
            one_page = wal.WAL_HEADER + wal.FRAME_HEADER + self._page_size
            if size == 0 or (self._wal.fresh and size <= one_page):
                return False  # empty, or no more than a restart's header and page
            self._db.execute("PRAGMA busy_timeout=100")
            try:
                busy, _, _ = self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            finally:
                self._db.execute("PRAGMA busy_timeout=10000")
            if busy == 0:
                self._wal.restart()  # a failure is logged, and the next commit restarts it
            return busy == 0

    def close(self) -> None:
        """Close every connection, unless an fsync of the log failed: SQLite's last close
        copies the log into the file, and a log with a hole (wal.py) would put pages the
        disk never kept into the file, beside acknowledged ones. Those connections are
        left open instead (``left_open``) and the daemon ends without closing them, so
        the next start's recovery reads the log and stops at the hole."""
        if self._wal is not None:
            self._wal.release(self.restart_log)
        with self._lock:
            if self.broken() is not None:
                _LEFT_OPEN.append((self.path, [self._db, *self._readers]))
            else:
                for db in self._readers:
                    db.close()
                self._db.close()
        self._wal = None


class SqliteStore(SqlStore, BlobIndexSql, SqliteDatabase):
    """The embedded store. It keeps each session and its task list as last read or
    checkpointed here (``_seen``): reading them is a checkpoint's first question, about
    0.2 ms of SQLite on a 2-core VM, and this process is the file's one writer (the data
    root's lock). Every write transaction empties it as it commits (``_on_commit``,
    under the write lock, in commit order), but for a checkpoint's own, which moves its
    session's head and may replace its tasks, and leaves exactly that. A read puts what
    it found only if no transaction committed since it began, so what it keeps is
    never older than the file."""

    integrity_errors = (sqlite3.IntegrityError,)
    local = True

    def flush_later(self) -> AbstractContextManager[Callable[[], None]]:
        return flushes_deferred()

    def __init__(self, path: str, key: DataKey | None = None) -> None:
        """``key``: the data key whose ``meta`` subkey seals the agent's content
        (sealed.py); None keeps every value in the clear."""
        self.sealed = Columns(key)
        self._seen: dict[str, tuple[Session, tuple[Task, ...]]] = {}
        self._seen_lock = threading.Lock()
        self._commits_seen = 0  # write transactions committed: a read's snapshot's age
        self._checkpointing = threading.local()  # (session id, new head, tasks or None)
        # The latest tables are made when absent (an older file gains its new tables
        # here, its new columns from the migrations).
        super().__init__(path, SCHEMA + blob_index.SCHEMA, FIRST)
        self.schema_found, self.schema_version = migrate(
            self._tx, lambda db: None, MIGRATIONS, f"metadata store {path}")
        self._bind_key()

    def get_session_and_tasks(self, session_id):
        with self._seen_lock:
            seen, commits = self._seen.get(session_id), self._commits_seen
        if seen is not None:
            return seen[0], list(seen[1])
        session, tasks = super().get_session_and_tasks(session_id)
        with self._seen_lock:
            if self._commits_seen == commits:  # no commit since the read began
                self._seen[session_id] = (session, tuple(tasks))
        return session, tasks

    def get_session(self, session_id):
        with self._seen_lock:
            seen = self._seen.get(session_id)
        return seen[0] if seen is not None else super().get_session(session_id)

    def append_checkpoint(self, cp, messages, expected_head, tasks, events, objects=()):
        self._checkpointing.change = (cp.session_id, cp.id,
                                      None if tasks is None else tuple(tasks))
        try:
            return super().append_checkpoint(cp, messages, expected_head, tasks, events,
                                             objects)
        finally:
            self._checkpointing.change = None

    def _on_commit(self) -> None:
        change = getattr(self._checkpointing, "change", None)
        with self._seen_lock:
            self._commits_seen += 1
            kept = self._seen.get(change[0]) if change is not None else None
            self._seen.clear()
            if kept is not None:
                session_id, head, tasks = change
                self._seen[session_id] = (replace(kept[0], head=head),
                                          kept[1] if tasks is None else tasks)
