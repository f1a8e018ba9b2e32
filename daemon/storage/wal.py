"""A SQLite file's write-ahead log copied into the file in the background.

SQLite's automatic checkpoint runs inside the COMMIT that pushes the WAL past 1,000
pages: that commit copies the log into the database file and fsyncs it (several
milliseconds; a hundred after a large capture) while holding the store's write lock,
so every other checkpoint waits behind it. Each connection that writes a file in this
daemon turns the automatic checkpoint off (``PRAGMA wal_autocheckpoint=0``) and tells
the file's ``Checkpointer`` after its commits; the checkpointer's own connection runs
a PASSIVE checkpoint (copies what no reader still needs, never waits for a reader or
a writer) at most every ``INTERVAL`` while commits come. Writers go on appending to the
log meanwhile: SQLite lets one checkpoint run beside the writer.

Durability is SQLite's as before: with ``synchronous=NORMAL`` a checkpoint syncs the
WAL before it copies frames and the database file after, and the log is reused from
its start only once everything in it is in the file. An idle daemon's housekeeping
still truncates the log (``SqliteDatabase.compact_wal``).

The log's restart is taken here too. The first commit after a checkpoint that copied
everything starts the log again from its beginning, and SQLite syncs the log's new
header inside that COMMIT, before it writes a frame (even with ``synchronous=NORMAL``:
frames written after a restart must never reach the disk before their header). That
is a flush of the disk under the write lock, in the capture's turn, on the first
checkpoint after every pause of a quarter of a second: the pause between an agent's
tool calls. So once a checkpoint here has copied the whole log, a writer of the file
(``restart``, given by ``checkpointer``) commits a write of one page that changes
nothing (``SqliteDatabase.restart_log``): the restart, and its header's sync, happen
here, and the next commit appends to the log. That page is not a commit to copy: the
log counts as ``fresh`` until a real one comes.

One checkpointer per file and process, however many connections write the file (the
store and the pack share meta.db): ``checkpointer(path)`` counts its users and
``release()`` stops it with the last. It also holds what every connection to the file
must know: whether an fsync of the log failed (``fail``). Linux reports a failed
write-back once, to the first fsync after it, and may drop the pages it could not
write; a later fsync then succeeds over a log with a hole, and SQLite's recovery stops
at the hole, taking every commit after it. So after one failure no connection of
this process commits, flushes or copies the log again (the store says why, and the
health service says NOT_SERVING) until the daemon is restarted on a healthy disk:
nothing is acknowledged past the hole. (Closing the file's last connection still
copies the log into the file, as SQLite always does.)
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable

from ..observe import WAL_COPY

log = logging.getLogger("worldline.wal")

INTERVAL = 0.25  # seconds between checkpoints while commits keep coming
WAL_HEADER, FRAME_HEADER = 32, 24  # bytes: SQLite's log header, and each frame's
BUSY_MS = 100  # how long a checkpoint waits for another (compact_wal's) to end
JOIN_SECONDS = 5.0  # how long closing the last connection waits for the thread

_lock = threading.Lock()
_running: dict[tuple[int, int], Checkpointer] = {}  # by (st_dev, st_ino)


def checkpointer(path: str, restart: Callable[[], None] | None = None) -> Checkpointer:
    """The running checkpointer of the file at ``path`` (started if none), with one more
    user; ``restart``, that user's way to restart the log (``SqliteDatabase.restart_log``),
    given back by ``release``. Files are told apart by inode, not name: one made anew
    where another was is another file."""
    st = os.stat(path)
    key = (st.st_dev, st.st_ino)
    with _lock:
        found = _running.get(key)
        if found is None:
            found = _running[key] = Checkpointer(path, key)
        found.users += 1
        if restart is not None:
            found.restarts.append(restart)
        return found


class Checkpointer:
    def __init__(self, path: str, key: tuple[int, int]) -> None:
        self.path = path
        self.key = key
        self.users = 0
        self.checkpoints = 0  # completed or partial, since start (tests, metrics)
        self.failed: str | None = None  # why the log takes no more writes (``fail``)
        self.restarts: list[Callable[[], None]] = []  # the users' ``restart``s
        self.fresh = False  # the log holds no commit, only a restart's page (``restart``)
        self._copies = WAL_COPY.labels(os.path.basename(path))
        self._due = threading.Event()
        self._stopping = threading.Event()  # cuts the pauses short: a stop never waits
        self._thread = threading.Thread(target=self._run, name="wal-checkpoint", daemon=True)
        self._thread.start()

    def committed(self) -> None:
        """A commit was written to the log: a checkpoint is due (within ``INTERVAL``)."""
        self.fresh = False
        if not self._due.is_set():
            self._due.set()

    def fail(self, reason: str) -> None:
        """An fsync of the log failed: nothing is committed to it, flushed or copied
        from it again in this process (the first reason is kept)."""
        if self.failed is None:
            self.failed = reason
            log.error("%s's write-ahead log failed to reach the disk (%s): no more writes"
                      " until the daemon restarts", self.path, reason)

    def restart(self) -> None:
        """Start the log again from its beginning, here rather than in the next commit,
        through a writer of the file (none left: nothing is done; a failed log: the
        writer does nothing). A failure is logged: the next commit restarts the log, as
        SQLite always does."""
        with _lock:
            restart = self.restarts[0] if self.restarts else None
        if restart is None:
            return
        try:
            restart()  # which sets ``fresh``, under the write lock
        except Exception as exc:  # busy, the disk, a log that failed meanwhile
            log.warning("restarting %s's write-ahead log: %s", self.path, exc)

    def release(self, restart: Callable[[], None] | None = None) -> None:
        """One user fewer (``restart``: the one it gave); the last stops the thread
        (after any checkpoint due)."""
        with _lock:
            if restart is not None and restart in self.restarts:
                self.restarts.remove(restart)
            self.users -= 1
            if self.users > 0:
                return
            if _running.get(self.key) is self:
                del _running[self.key]
        self._stopping.set()
        self._due.set()
        self._thread.join(JOIN_SECONDS)  # a stop never hangs on it (the log stays valid)
        if self._thread.is_alive():
            log.warning("the checkpoint of %s's write-ahead log did not end within %.0f s;"
                        " leaving it", self.path, JOIN_SECONDS)

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA synchronous=NORMAL")  # the WAL synced before, the file after
        db.execute(f"PRAGMA busy_timeout={BUSY_MS}")
        db.execute("PRAGMA wal_autocheckpoint=0")
        return db

    def _run(self) -> None:
        db = None
        while True:
            self._due.wait()
            self._stopping.wait(INTERVAL)  # let the commits of a burst gather
            self._due.clear()
            if self.failed is None:  # a log with a hole is never copied into the file
                try:
                    if db is None:
                        db = self._connect()
                    started = time.perf_counter()
                    _, logged, copied = db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                    self._copies.observe(time.perf_counter() - started)
                    self.checkpoints += 1
                    if 0 < logged == copied and not (self.fresh or self._stopping.is_set()):
                        self.restart()  # all in the file: the log can start again (and
                        # one that holds only a restart's page has been started again)
                except sqlite3.Error as exc:  # busy, or the disk: tried again after the
                    # interval (the thread must not die: the log would grow unbounded)
                    log.warning("checkpoint of %s's write-ahead log: %s", self.path, exc)
                    self._due.set()
                    self._stopping.wait(INTERVAL)
            if self._stopping.is_set():
                if db is not None:
                    db.close()
                return
