"""The write-ahead log is copied into its file by a thread of the file's own, never by a
commit (wal.py): no checkpoint of the world waits behind a copy of the log."""

from __future__ import annotations

import ctypes
import errno
import hashlib
import os
import shutil
import sqlite3
import time

import pytest
from worldline.client.errors import Unavailable
from worldline.daemon.storage import blob_files, sqlite_store, wal
from worldline.daemon.storage import blobs as blobs_module
from worldline.daemon.storage.blobs import LocalBlobStore
from worldline.daemon.storage.sqlite_store import SqliteDatabase, SqliteStore

SCHEMA = "CREATE TABLE IF NOT EXISTS t (k INTEGER PRIMARY KEY, v BLOB NOT NULL);"


def _wait(predicate, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "not within the time allowed"
        time.sleep(0.02)


def _rows_in_main_file(path, tmp_path) -> int:
    """The rows a copy of the database file alone holds (without its -wal): what
    checkpoints have copied into it."""
    copy = tmp_path / "copy.db"
    shutil.copyfile(path, copy)
    db = sqlite3.connect(copy)
    try:
        if not db.execute("SELECT 1 FROM sqlite_master WHERE name = 't'").fetchone():
            return 0  # not even the table's creation was copied
        return db.execute("SELECT COUNT(*) FROM t").fetchone()[0]
    finally:
        db.close()
        copy.unlink()


def test_a_commit_never_copies_the_log_and_the_thread_does(tmp_path, monkeypatch):
    path = str(tmp_path / "a.db")
    db = SqliteDatabase(path, SCHEMA)
    try:
        assert db._db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
        checkpointer = db._wal
        monkeypatch.setattr(checkpointer, "committed", lambda: None)  # the thread held
        for i in range(1500):  # past SQLite's automatic checkpoint (1,000 pages)
            with db._tx() as c:
                c.execute("INSERT INTO t VALUES (?, ?)", (i, os.urandom(3000)))
        assert os.path.getsize(path + "-wal") > 1000 * 4096
        assert _rows_in_main_file(path, tmp_path) == 0  # no commit copied the log
        monkeypatch.undo()
        before = checkpointer.checkpoints
        with db._tx() as c:
            c.execute("INSERT INTO t VALUES (?, ?)", (10_000, b"the last"))
        _wait(lambda: checkpointer.checkpoints > before)
        assert _rows_in_main_file(path, tmp_path) == 1501
        assert db._one("SELECT v FROM t WHERE k = 10000", ()) == (b"the last",)
    finally:
        db.close()


def test_one_thread_per_file_however_many_connections_write_it(tmp_path):
    """The store and the pack share meta.db (0.7.7 on): one checkpointer, stopped with
    the last of them."""
    store = SqliteStore(str(tmp_path / "meta.db"))
    blobs = LocalBlobStore(str(tmp_path / "blobs"), pack_file=store.path,
                           store_lock=store.write_lock)
    checkpointer = store._wal
    assert blobs.pack._wal is checkpointer and checkpointer.users == 2
    assert [c for c in wal._running.values() if c.path == store.path] == [checkpointer]
    digest = blobs.put_bytes(b"a blob " * 100)
    blobs.sync()
    blobs.close()
    assert wal._running[checkpointer.key] is checkpointer and checkpointer._thread.is_alive()
    store.close()
    assert checkpointer.key not in wal._running and not checkpointer._thread.is_alive()
    again = LocalBlobStore(str(tmp_path / "blobs"), pack_file=str(tmp_path / "meta.db"))
    try:
        assert again.read_bytes(digest) == b"a blob " * 100
    finally:
        again.close()


def test_a_failing_checkpoint_is_tried_again_and_the_thread_lives(tmp_path, monkeypatch):
    """A checkpoint that fails (another checkpoint running, a full disk) leaves the log
    as it is; the thread tries again rather than dying, which would let the log grow
    without bound."""
    path = str(tmp_path / "a.db")
    db = SqliteDatabase(path, SCHEMA)
    checkpointer = db._wal
    failures = []

    class Failing:  # the checkpointer's connection, its first three checkpoints failing
        def __init__(self, real):
            self.real = real

        def execute(self, sql, *args):
            if "wal_checkpoint" in sql and len(failures) < 3:
                failures.append(sql)
                raise sqlite3.OperationalError("disk I/O error")
            return self.real.execute(sql, *args)

        def close(self):
            self.real.close()

    real_connect = checkpointer._connect
    monkeypatch.setattr(checkpointer, "_connect", lambda: Failing(real_connect()))
    monkeypatch.setattr(wal, "INTERVAL", 0.01)
    try:
        with db._tx() as c:
            c.execute("INSERT INTO t VALUES (1, x'00')")
        _wait(lambda: checkpointer.checkpoints >= 1)
        assert len(failures) == 3 and checkpointer._thread.is_alive()
        assert _rows_in_main_file(path, tmp_path) == 1
    finally:
        db.close()


def _log_header(path: str) -> bytes:
    """The log's checkpoint sequence number and salts (bytes 12 to 24 of its header),
    which change each time the log starts again from its beginning."""
    with open(path + "-wal", "rb") as f:
        return f.read(32)[12:24]


def _insert(db: SqliteDatabase, key: int) -> None:
    with db._tx() as c:
        c.execute("INSERT INTO t VALUES (?, ?)", (key, b"row %d" % key))


def test_the_checkpointer_restarts_the_log_once_it_is_all_copied(tmp_path, monkeypatch):
    """Once the checkpointer has copied the whole log into the file, it starts the log
    again itself (a page that changes nothing: ``fresh``), so no commit after the pause
    syncs a new header inside its COMMIT (wal.py); a log that holds only that page is
    not started again. The same commit with that restart held back starts the log
    again itself."""
    path = str(tmp_path / "a.db")
    db = SqliteDatabase(path, SCHEMA)
    checkpointer = db._wal
    monkeypatch.setattr(wal, "INTERVAL", 0.01)
    try:
        restarts = checkpointer.restarts[:]
        assert restarts == [db.restart_log]
        checkpointer.restarts.clear()  # held back
        _insert(db, 1)
        _wait(lambda: checkpointer.checkpoints >= 1)
        before = _log_header(path)
        _insert(db, 2)
        assert _log_header(path) != before  # the commit started the log again
        assert not checkpointer.fresh
        before = _log_header(path)
        checkpointer.restarts[:] = restarts
        copies = checkpointer.checkpoints
        checkpointer.committed()  # a checkpoint after this one, whenever insert 2's came
        _wait(lambda: checkpointer.checkpoints > copies and checkpointer.fresh)
        assert _log_header(path) != before  # the checkpointer started it again
        before, copies = _log_header(path), checkpointer.checkpoints
        checkpointer._due.set()  # a checkpoint of a log that holds only the restart's page
        _wait(lambda: checkpointer.checkpoints > copies)
        assert _log_header(path) == before and checkpointer.fresh  # not started again
        assert db._all("SELECT k FROM t") == [(1,), (2,)]
    finally:
        db.close()


def test_the_commits_after_a_restart_append_to_the_log(tmp_path, monkeypatch):
    """After the log's restart (``restart_log``, here through the idle compaction's; no
    checkpoint runs meanwhile: the thread pauses until the close), each commit appends
    to the log: none starts it again, so none syncs a header inside its COMMIT."""
    monkeypatch.setattr(wal, "INTERVAL", 600)
    path = str(tmp_path / "a.db")
    db = SqliteDatabase(path, SCHEMA)
    checkpointer = db._wal
    try:
        _insert(db, 1)
        assert db.compact_wal(0) and checkpointer.fresh
        before = _log_header(path)
        application_id = db._one("PRAGMA application_id", ())
        for key in range(2, 5):
            _insert(db, key)
            assert _log_header(path) == before, key  # appended
            assert not checkpointer.fresh
        assert db._all("SELECT k FROM t") == [(k,) for k in range(1, 5)]
        assert db._one("PRAGMA application_id", ()) == application_id
        assert checkpointer.checkpoints == 0
    finally:
        started = time.monotonic()
        db.close()
    assert time.monotonic() - started < wal.JOIN_SECONDS  # the close cut the pause short
    assert not checkpointer._thread.is_alive()


def test_a_restart_that_fails_leaves_it_to_the_next_commit(tmp_path, monkeypatch, caplog):
    """A restart that fails (forced: the disk full) is logged and changes nothing: the
    thread lives, the log is not taken for fresh, and the next commit starts the log
    again itself, as SQLite always did."""
    path = str(tmp_path / "a.db")
    db = SqliteDatabase(path, SCHEMA)
    checkpointer = db._wal
    real = db._db
    failed = []

    class Full:  # the writer's connection, its restarts failing
        in_transaction = property(lambda self: real.in_transaction)

        def execute(self, sql, *args):
            if sql.startswith("PRAGMA application_id="):
                failed.append(sql)
                raise sqlite3.OperationalError("database or disk is full")
            return real.execute(sql, *args)

        def __getattr__(self, name):
            return getattr(real, name)

    monkeypatch.setattr(db, "_db", Full())
    monkeypatch.setattr(wal, "INTERVAL", 0.01)
    try:
        _insert(db, 1)
        _wait(lambda: failed)
        _wait(lambda: "restarting" in caplog.text)
        assert not checkpointer.fresh and checkpointer._thread.is_alive()
        before = _log_header(path)
        _insert(db, 2)
        assert _log_header(path) != before  # the commit started the log again
        assert db._all("SELECT k FROM t") == [(1,), (2,)]
    finally:
        monkeypatch.setattr(db, "_db", real)
        db.close()


def test_a_compacted_log_starts_again_with_one_page(tmp_path, monkeypatch):
    """An idle file's log is copied into it and truncated (compact_wal), then started
    again with the restart's one page, which the next compaction leaves as it is; the
    next commit appends to it. What was committed stays, in the file and after a new
    open. (No checkpoint runs meanwhile: the thread pauses until the close.)"""
    monkeypatch.setattr(wal, "INTERVAL", 600)
    path = str(tmp_path / "a.db")
    db = SqliteDatabase(path, SCHEMA)
    try:
        page = db._one("PRAGMA page_size", ())[0]
        for key in range(1, 40):
            _insert(db, key)
        assert os.path.getsize(path + "-wal") > 30 * page
        assert db.compact_wal(0)
        assert db._wal.fresh
        assert os.path.getsize(path + "-wal") == 32 + 24 + page  # a header, one frame
        header = _log_header(path)
        assert not db.compact_wal(0)  # nothing in it to copy
        assert _log_header(path) == header
        _insert(db, 40)
        assert _log_header(path) == header and not db._wal.fresh
        assert _rows_in_main_file(path, tmp_path) == 39
    finally:
        db.close()
    again = SqliteDatabase(path, SCHEMA)
    try:
        assert again._all("SELECT k FROM t") == [(k,) for k in range(1, 41)]
    finally:
        again.close()


def test_an_idle_daemon_leaves_its_logs_one_page_long(tmp_path):
    """A real daemon: its checkpoints' log is copied into meta.db beside the writers, and
    once it is idle (the repack done too) each SQLite log is truncated and started again
    with one page, meta.db's once though the pack and the store both write it."""
    from .conftest import DaemonProcess
    ws = tmp_path / "ws"
    ws.mkdir()
    root = tmp_path / "root"
    d = DaemonProcess(root).start()
    try:
        with d.client() as c:
            s = c.create_session(str(ws))
            for n in range(30):
                (ws / f"f{n % 5}.txt").write_text(f"version {n}\n" * 200)
                s.checkpoint()

        def logs_compacted() -> bool:
            sizes = [os.path.getsize(p) for p in (root / "meta.db-wal", root / "graphs.db-wal")
                     if p.exists()]
            return all(size in (0, 32 + 24 + 4096) for size in sizes)

        _wait(logs_compacted, seconds=30)
        assert not (root / "blobs" / "pack.db").exists()
    finally:
        assert d.stop() == 0
    with sqlite3.connect(root / "meta.db") as db:
        assert db.execute("SELECT COUNT(*) FROM checkpoints").fetchone()[0] == 31


def test_a_failed_fsync_of_the_log_stops_every_connection_to_the_file(tmp_path, monkeypatch):
    """An fsync of meta.db's log that fails (forced: EIO) is the file's, not one
    connection's: the store and the pack sharing the file both refuse to commit or
    flush, and the checkpointer stops copying the log into the file, until the file is
    opened again by a new process (here: every connection closed and opened anew)."""
    store = SqliteStore(str(tmp_path / "meta.db"))
    blobs = LocalBlobStore(str(tmp_path / "blobs"), pack_file=store.path,
                           store_lock=store.write_lock)
    kept = blobs.put_bytes(b"acknowledged " * 50)
    blobs.sync()
    checkpointer = store._wal
    monkeypatch.setattr(wal, "INTERVAL", 0.01)
    real_fsync = os.fsync

    def failing(fd):
        monkeypatch.setattr(os, "fsync", real_fsync)  # once: Linux reports it once
        raise OSError(5, "Input/output error")
    monkeypatch.setattr(os, "fsync", failing)
    blobs.put_bytes(b"lost with its fsync " * 50)
    with pytest.raises(Unavailable, match="Input/output error"):
        blobs.sync()
    copies = checkpointer.checkpoints
    assert store.broken() == blobs.pack.broken() == "fsync: Input/output error"
    with pytest.raises(Unavailable, match="takes no more writes"):
        with store._tx() as db:
            db.execute("INSERT INTO meta VALUES ('k', 'v')")
    blobs.put_bytes(b"after the failure " * 50)
    with pytest.raises(Unavailable, match="takes no more writes"):
        blobs.sync()
    checkpointer.committed()
    time.sleep(0.2)
    assert checkpointer.checkpoints == copies  # the log is never copied into the file
    assert not store.compact_wal(0)
    assert blobs.read_bytes(kept) == b"acknowledged " * 50  # reads still answer
    log_before = os.path.getsize(store.path + "-wal")
    blobs.close()
    store.close()
    # nor by SQLite's last close: the connections are left open (the daemon then ends
    # without closing them), and the log stays whole for the next start's recovery
    assert str(tmp_path / "meta.db") in sqlite_store.left_open()
    assert os.path.getsize(store.path + "-wal") == log_before
    store = SqliteStore(str(tmp_path / "meta.db"))
    blobs = LocalBlobStore(str(tmp_path / "blobs"), pack_file=store.path,
                           store_lock=store.write_lock)
    try:
        assert store.broken() is None
        assert blobs.read_bytes(kept) == b"acknowledged " * 50
        blobs.put_bytes(b"a new one " * 50)
        blobs.sync()
    finally:
        blobs.close()
        store.close()


def _syncfs_fails(monkeypatch) -> None:
    """The blob store's syncfs fails with EIO (a write-back the disk could not make)."""
    def failing(fd):
        ctypes.set_errno(errno.EIO)
        return -1
    monkeypatch.setattr(blob_files, "_syncfs", failing)


def test_a_failed_flush_of_blob_files_stops_the_blob_stores_syncs(tmp_path, monkeypatch):
    """syncfs failing (forced: EIO) for a blob too large for the pack: the sync fails,
    no per-file fsync is tried in its place (it might not see the failure again), and
    no later sync is taken in this process; the next start verifies the temporary
    against its name before it takes it."""
    store = LocalBlobStore(str(tmp_path / "blobs"))
    big = os.urandom(blobs_module.MAX_BLOB + 1)
    digest = store.put_bytes(big)

    _syncfs_fails(monkeypatch)
    monkeypatch.setattr(blobs_module.os, "fsync", lambda fd: pytest.fail("fell back"))
    with pytest.raises(Unavailable, match="Input/output error"):
        store.sync()
    assert store.broken() == "flushing blob files: Input/output error"
    monkeypatch.undo()
    store.put_bytes(b"small " * 10)
    with pytest.raises(Unavailable, match="takes no more writes"):
        store.sync()  # the disk answers again, but this process trusts it no more
    store.close()
    again = LocalBlobStore(str(tmp_path / "blobs"))
    try:
        assert again.broken() is None
        assert again.recover() == (1, 0)  # the temporary matched its name
        assert again.read_bytes(digest) == big
    finally:
        again.close()


def test_a_start_whose_recovered_blob_files_cannot_be_flushed_says_why(tmp_path,
                                                                       monkeypatch):
    """The blob files a crash left as temporaries are renamed into place at the next
    start and flushed; a disk that fails that flush stops the start with UNAVAILABLE
    saying so (the daemon prints it and exits 1), not with a traceback."""
    store = LocalBlobStore(str(tmp_path / "blobs"))
    body = b"left behind by a crash " * 100
    digest = hashlib.sha256(body).hexdigest()
    (tmp_path / "blobs" / "tmp" / f"{digest}.0123456789abcdef").write_bytes(body)

    _syncfs_fails(monkeypatch)
    try:
        with pytest.raises(Unavailable, match="could not make the 1 blob file.*Input/output"):
            store.recover()
    finally:
        store.close()


def test_the_logs_name_is_made_durable_before_a_commit_is(tmp_path, monkeypatch):
    """SQLite makes the log when the file is opened and syncs its folder only when it
    first copies the log into the file, after commits were acknowledged; an fsync of the
    log does not make its name durable everywhere (ext4 without a journal). So the
    first flush of each log file fsyncs the folder too, after the log, and later
    flushes do not."""
    synced = []
    real_fsync = os.fsync

    def recording(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)
    monkeypatch.setattr(os, "fsync", recording)
    path = str(tmp_path / "a.db")
    for opened in range(2):  # the last close removes the log: the next open makes another
        db = SqliteDatabase(path, SCHEMA)
        try:
            monkeypatch.setattr(db._wal, "committed", lambda: None)  # no copy into the file
            synced.clear()
            for i in range(3):
                with db._tx() as c:
                    c.execute("INSERT INTO t VALUES (?, ?)", (opened * 10 + i, b"x"))
            assert synced == [path + "-wal", str(tmp_path)] + [path + "-wal"] * 2
        finally:
            db.close()
