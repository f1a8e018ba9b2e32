"""A data root made from 0.7.7 on keeps its pack in meta.db, so a checkpoint's blobs and
its record are made durable by one fsync of one write-ahead log; a data root made before
keeps its pack in blobs/pack.db and works as it did."""

from __future__ import annotations

import os
import random
import sqlite3
import stat
import subprocess
import threading
import time

import pytest
from worldline.daemon.records import AuditEvent
from worldline.daemon.storage import reserve
from worldline.daemon.storage.blobs import LocalBlobStore
from worldline.daemon.storage.config import StorageConfig
from worldline.daemon.storage.packs import Pack
from worldline.daemon.storage.reserve import free_bytes
from worldline.daemon.storage.sqlite_store import SqliteStore, flushes_deferred

from .conftest import DaemonProcess, tree_state


def _tables(path) -> set[str]:
    db = sqlite3.connect(path)
    try:
        return {n for (n,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    finally:
        db.close()


def _event(n: int) -> AuditEvent:
    return AuditEvent("note", "", "", {"n": n}, "2026-11-25T00:00:00Z")


class _Fsyncs:
    """Every ``os.fsync`` of a file the daemon's Python code makes, by the file's path
    (not a folder's: the first flush of each new log also syncs its folder, test_wal)."""

    def __init__(self, monkeypatch) -> None:
        self.paths: list[str] = []
        real = os.fsync

        def fsync(fd):
            if not stat.S_ISDIR(os.fstat(fd).st_mode):
                self.paths.append(os.readlink(f"/proc/self/fd/{fd}"))
            return real(fd)
        monkeypatch.setattr(os, "fsync", fsync)


def _open(root):
    store = StorageConfig().open_store(str(root))
    return store, StorageConfig().open_blobs(str(root), store)


def test_a_new_data_root_keeps_its_pack_in_meta_db(tmp_path):
    store, blobs = _open(tmp_path)
    try:
        assert blobs.pack.path == store.path == str(tmp_path / "meta.db")
        digest = blobs.put_bytes(b"x" * 300)
        with blobs.committing():
            store.append_audit([_event(1)])
    finally:
        blobs.close()
        store.close()
    assert not (tmp_path / "blobs" / "pack.db").exists()
    assert {"objects", "checkpoints"} <= _tables(tmp_path / "meta.db")
    store, blobs = _open(tmp_path)  # and the next start finds it there
    try:
        assert blobs.read_bytes(digest) == b"x" * 300
    finally:
        blobs.close()
        store.close()


def test_a_data_root_made_before_0_7_7_keeps_its_pack_in_blobs(tmp_path):
    SqliteStore(str(tmp_path / "meta.db")).close()
    old = LocalBlobStore(str(tmp_path / "blobs"))  # 0.7.6's layout
    data = b"y" * 300
    digest = old.put_bytes(data)
    old.sync()
    old.close()
    for _ in range(2):
        store, blobs = _open(tmp_path)
        try:
            assert blobs.pack.path == str(tmp_path / "blobs" / "pack.db")
            assert not blobs.pack_in_store
            assert blobs.read_bytes(digest) == data
            data = digest.encode() * 10
            digest = blobs.put_bytes(data)
            with blobs.committing():
                store.append_audit([_event(2)])
        finally:
            blobs.close()
            store.close()
    assert "objects" not in _tables(tmp_path / "meta.db")


def _old_pack_on_a_small_disk(tmp_path, tmpfs):
    """A pack made before 0.7 (no incremental vacuum) of 400 blobs, copied to a 3 MiB
    file system with no room for it twice: (its folder, its blobs, the free bytes)."""
    old = LocalBlobStore(str(tmp_path / "made" / "blobs"))  # 0.7.6's layout
    rng = random.Random(3)
    blobs = {old.put_bytes(data): data for data in (rng.randbytes(4096) for _ in range(400))}
    old.sync()
    old.close()
    db = sqlite3.connect(tmp_path / "made" / "blobs" / "pack.db")
    db.execute("PRAGMA auto_vacuum=NONE")  # as a pack before 0.7 was made
    db.execute("VACUUM")
    db.close()
    small = tmpfs(tmp_path / "small", "3m")
    subprocess.run(["cp", "-a", str(tmp_path / "made" / "blobs"), str(small)], check=True)
    assert os.path.getsize(small / "blobs" / "pack.db") > 1.5 * 2**20  # no room twice
    return small / "blobs", blobs, free_bytes(str(small))


def _opens_as_it_is(folder, blobs, free: int) -> None:
    """The pack opens unconverted, every blob readable, and the disk as free as it was
    (but for the log's index, and a page or two): the start took no room from anyone."""
    reopened = LocalBlobStore(str(folder))
    try:
        assert free_bytes(str(folder)) >= free - 128 * 1024
        assert all(reopened.read_bytes(d) == data for d, data in blobs.items())
        assert reopened.pack._db.execute("PRAGMA auto_vacuum").fetchone()[0] == 0
        after = reopened.put_bytes(b"stored after the open")
        reopened.sync()
        assert reopened.read_bytes(after) == b"stored after the open"
    finally:
        reopened.close()


def test_a_pack_made_before_0_7_on_a_full_disk_opens_as_it_is(tmp_path, tmpfs, caplog):
    """A pack made before 0.7 is converted at its first open by a VACUUM, which writes
    the file again beside it and back through its log. On a disk with no room for that
    the pack opens as it is, every blob readable, and the VACUUM is not tried: before
    0.7.34 it ran on until the disk was full, at every start, and its log kept the
    space (no session's checkpoint could pass --min-free-bytes after)."""
    folder, blobs, free = _old_pack_on_a_small_disk(tmp_path, tmpfs)
    with caplog.at_level("WARNING"):
        _opens_as_it_is(folder, blobs, free)
    assert "keeps its freed pages until an open with room to convert it: that needs" \
        in caplog.text


def test_a_conversion_that_fails_anyway_gives_its_logs_room_back(tmp_path, tmpfs,
                                                                monkeypatch):
    """The room was there when asked, and taken by another writer before the VACUUM
    wrote its copy back (forced: the free space is said to be a terabyte). The VACUUM
    fails on the full disk, and its log, which held the copy, is truncated at once."""
    folder, blobs, free = _old_pack_on_a_small_disk(tmp_path, tmpfs)
    monkeypatch.setattr(reserve, "free_bytes", lambda path: 1 << 40)
    _opens_as_it_is(folder, blobs, free)


def test_a_checkpoint_commit_takes_one_fsync_for_its_blobs_and_its_record(
        tmp_path, monkeypatch):
    store, blobs = _open(tmp_path)
    try:
        blobs.put_bytes(b"warm")
        blobs.sync()
        fsyncs = _Fsyncs(monkeypatch)
        blobs.put_bytes(b"a" * 200)
        blobs.put_bytes(b"b" * 200)
        with blobs.committing():
            store.append_audit([_event(3)])
        assert fsyncs.paths == [store.path + "-wal"]
        # a commit whose record never came (it failed): the next sync flushes the rows
        # even with none of its own
        blobs.put_bytes(b"c" * 200)
        with blobs.committing():
            pass
        assert len(fsyncs.paths) == 1 and blobs.pack.unflushed
        blobs.sync()
        assert fsyncs.paths == [store.path + "-wal"] * 2 and not blobs.pack.unflushed
    finally:
        blobs.close()
        store.close()


def test_fsyncs_deferred_on_a_thread_are_taken_by_its_flush(tmp_path, monkeypatch):
    """``flushes_deferred``: this thread's commits return before their fsync, which the
    flush it yields takes (one for the file's commits and the pack's rows). Another
    thread's commits are flushed as ever meanwhile; a block that raises leaves its
    commits to the next fsync of the log; blocks do not nest."""
    store, blobs = _open(tmp_path)
    try:
        blobs.put_bytes(b"warm")
        blobs.sync()
        fsyncs = _Fsyncs(monkeypatch)
        with flushes_deferred() as flush:
            blobs.put_bytes(b"e" * 200)
            with blobs.committing():
                store.append_audit([_event(5)])
            store.append_audit([_event(6)])
            assert fsyncs.paths == [] and store._flushed < store._committed
            other = threading.Thread(target=store.append_audit, args=([_event(7)],))
            other.start()
            other.join(10)
            assert fsyncs.paths == [store.path + "-wal"]  # the other thread's, at once
            with pytest.raises(RuntimeError):
                with flushes_deferred():
                    pass
            store.append_audit([_event(8)])
        assert len(fsyncs.paths) == 1 and store._flushed < store._committed
        flush()
        assert fsyncs.paths == [store.path + "-wal"] * 2
        assert store._flushed == store._committed
        with pytest.raises(RuntimeError, match="after the commit"):
            with flushes_deferred():
                store.append_audit([_event(9)])
                raise RuntimeError("after the commit")
        assert len(fsyncs.paths) == 2 and store._flushed < store._committed
        store.append_audit([_event(10)])  # not deferred: flushed, the one before with it
        assert len(fsyncs.paths) == 3 and store._flushed == store._committed
    finally:
        blobs.close()
        store.close()


def test_a_legacy_pack_commit_is_flushed_by_its_own_fsync(tmp_path, monkeypatch):
    SqliteStore(str(tmp_path / "meta.db")).close()
    (tmp_path / "blobs").mkdir()
    Pack(str(tmp_path / "blobs" / "pack.db")).close()  # 0.7.6's layout, empty
    store, blobs = _open(tmp_path)
    try:
        fsyncs = _Fsyncs(monkeypatch)
        blobs.put_bytes(b"d" * 200)
        with blobs.committing():
            store.append_audit([_event(4)])
        assert fsyncs.paths == [blobs.pack.path + "-wal", store.path + "-wal"]
    finally:
        blobs.close()
        store.close()


def test_commits_waiting_for_a_flush_share_the_next_one(tmp_path, monkeypatch):
    """Group commit: while one fsync runs, the commits written meanwhile wait for it and
    are then all made durable by one more, not one each; none returns before its own."""
    store = SqliteStore(str(tmp_path / "meta.db"))
    try:
        store.append_audit([_event(0)])
        base = store._committed
        real = os.fsync
        entered, release = threading.Event(), threading.Event()
        calls = []

        def slow_fsync(fd):
            calls.append(store._committed)
            if len(calls) == 1:
                entered.set()
                release.wait(10)
            return real(fd)
        monkeypatch.setattr(os, "fsync", slow_fsync)
        first = threading.Thread(target=store.append_audit, args=([_event(1)],))
        first.start()
        assert entered.wait(10)
        others = [threading.Thread(target=store.append_audit, args=([_event(n)],))
                  for n in range(2, 6)]
        for t in others:
            t.start()
        while store._committed < base + 5:  # all four written, each waiting for its flush
            threading.Event().wait(0.005)
        assert all(t.is_alive() for t in others)
        release.set()
        for t in [first, *others]:
            t.join(10)
        assert calls == [base + 1, base + 5]  # the second fsync covered the four commits
        assert store._flushed == base + 5
    finally:
        store.close()


def test_a_daemon_restarted_finds_every_checkpoint_of_its_new_layout(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    states = {}
    d = DaemonProcess(tmp_path / "root").start()
    with d.client() as c:
        s = c.create_session(str(ws))
        for n in range(5):
            (ws / f"f{n}.txt").write_text(f"version {n}\n" * (n + 1))
            states[s.checkpoint().id] = tree_state(ws)
    d.proc.kill()  # no clean close: what was acknowledged must be there
    d.proc.wait(10)
    assert not (tmp_path / "root" / "blobs" / "pack.db").exists()
    d = DaemonProcess(tmp_path / "root").start()
    with d.client() as c:
        for cp, state in states.items():
            c.restore(s.id, cp, acknowledge_side_effects=True)
            assert tree_state(ws) == state
        assert c.fsck()["problems"] == []
    assert d.stop() == 0


def test_a_pack_write_inside_a_store_transaction_fails_at_once(tmp_path):
    """The two connections to meta.db share one write lock; a pack commit attempted
    inside a store transaction on the same thread would wait SQLite's busy timeout (10 s)
    for a lock its own thread holds. It fails at once instead, and changes nothing."""
    store, blobs = _open(tmp_path)
    try:
        blobs.put_bytes(b"e" * 200)
        t = time.monotonic()
        with pytest.raises(RuntimeError, match="already open on this thread"):
            with store._tx():
                blobs.sync()
        assert time.monotonic() - t < 1.0
        assert blobs.pack.pending  # the rows wait for the next sync, which works
        blobs.sync()
        assert not blobs.pack.pending
    finally:
        blobs.close()
        store.close()


def test_a_new_small_blob_is_looked_for_in_the_pack_only(tmp_path, monkeypatch):
    """A blob of at most MAX_BLOB bytes is only ever a pack row (from 0.2 on), so a put
    asks no file system question for it; a large one still looks for its file."""
    from worldline.daemon.storage.blob_store import digest_of
    from worldline.daemon.storage.packs import MAX_BLOB
    store, blobs = _open(tmp_path)
    try:
        looked: list[str] = []
        real = os.path.exists
        monkeypatch.setattr(os.path, "exists", lambda p: looked.append(p) or real(p))
        blobs.put_bytes(b"small and new" * 10)
        blobs.put_many([b"one tree" * 10, b"another tree" * 10])
        assert looked == []
        big = b"b" * (MAX_BLOB + 1)
        blobs.put_bytes(big)
        assert looked == [blobs._path(digest_of(big))]
        with blobs.committing():
            store.append_audit([_event(5)])
    finally:
        blobs.close()
        store.close()


def test_a_small_blob_file_of_a_0_1_data_root_still_reads_and_is_stored_again(tmp_path):
    store, blobs = _open(tmp_path)
    try:
        from worldline.daemon.storage.blob_store import digest_of
        data = b"written by 0.1 as a file" * 4
        digest = digest_of(data)
        path = blobs._path(digest)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        assert blobs.has(digest) and blobs.read_bytes(digest) == data
        assert blobs.put_bytes(data) == digest  # not found as a file: a pack row too
        with blobs.committing():
            store.append_audit([_event(6)])
        assert blobs.pack.has(digest)
        os.unlink(path)
        assert blobs.read_bytes(digest) == data
    finally:
        blobs.close()
        store.close()
