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

from ..observe import WAL_COPY

log = logging.getLogger("worldline.wal")

INTERVAL = 0.25  # seconds between checkpoints while commits keep coming
BUSY_MS = 100  # how long a checkpoint waits for another (compact_wal's) to end
JOIN_SECONDS = 5.0  # how long closing the last connection waits for the thread

_lock = threading.Lock()
_running: dict[tuple[int, int], Checkpointer] = {}  # by (st_dev, st_ino)


def checkpointer(path: str) -> Checkpointer:
    """The running checkpointer of the file at ``path`` (started if none), with one more
    user. Files are told apart by inode, not name: one made anew where another was is
    another file."""
    st = os.stat(path)
    key = (st.st_dev, st.st_ino)
    with _lock:
        found = _running.get(key)
        if found is None:
            found = _running[key] = Checkpointer(path, key)
        found.users += 1
        return found


class Checkpointer:
    def __init__(self, path: str, key: tuple[int, int]) -> None:
        self.path = path
        self.key = key
        self.users = 0
        self.checkpoints = 0  # completed or partial, since start (tests, metrics)
        self.failed: str | None = None  # why the log takes no more writes (``fail``)
        self._copies = WAL_COPY.labels(os.path.basename(path))
        self._due = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="wal-checkpoint", daemon=True)
        self._thread.start()

    def committed(self) -> None:
        """A commit was written to the log: a checkpoint is due (within ``INTERVAL``)."""
        if not self._due.is_set():
            self._due.set()

    def fail(self, reason: str) -> None:
        """An fsync of the log failed: nothing is committed to it, flushed or copied
        from it again in this process (the first reason is kept)."""
        if self.failed is None:
            self.failed = reason
            log.error("%s's write-ahead log failed to reach the disk (%s): no more writes"
                      " until the daemon restarts", self.path, reason)

    def release(self) -> None:
        """One user fewer; the last stops the thread (after any checkpoint due)."""
        with _lock:
            self.users -= 1
            if self.users > 0:
                return
            if _running.get(self.key) is self:
                del _running[self.key]
        self._stopping = True
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
            if not self._stopping:
                time.sleep(INTERVAL)  # let the commits of a burst gather
            self._due.clear()
            if self.failed is None:  # a log with a hole is never copied into the file
                try:
                    if db is None:
                        db = self._connect()
                    started = time.perf_counter()
                    db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                    self._copies.observe(time.perf_counter() - started)
                    self.checkpoints += 1
                except sqlite3.Error as exc:  # busy, or the disk: tried again after the
                    # interval (the thread must not die: the log would grow unbounded)
                    log.warning("checkpoint of %s's write-ahead log: %s", self.path, exc)
                    self._due.set()
                    time.sleep(INTERVAL)
            if self._stopping:
                if db is not None:
                    db.close()
                return
