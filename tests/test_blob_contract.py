"""The BlobStore contract, run against every implementation."""

from __future__ import annotations

import hashlib
import os

import pytest
from worldline.client.errors import DataLoss, InvalidArgument, NotFound
from worldline.daemon.blobs import LocalBlobStore, MemoryBlobStore


@pytest.fixture(params=["memory", "local"])
def blobs(request, tmp_path):
    return MemoryBlobStore() if request.param == "memory" else LocalBlobStore(str(tmp_path / "b"))


def test_put_read_is_content_addressed(blobs):
    d = blobs.put_bytes(b"hello")
    assert d == hashlib.sha256(b"hello").hexdigest()
    assert blobs.put_bytes(b"hello") == d
    assert blobs.has(d) and blobs.read_bytes(d) == b"hello" and blobs.size(d) == 5
    assert list(blobs.digests()) == [d]


def test_put_fd_streams(blobs, tmp_path):
    data = os.urandom(3 << 20)
    src = tmp_path / "src"
    src.write_bytes(data)
    fd = os.open(src, os.O_RDONLY)
    try:
        digest, size = blobs.put_fd(fd)
    finally:
        os.close(fd)
    assert size == len(data) and blobs.read_bytes(digest) == data
    out = tmp_path / "out"
    fd = os.open(out, os.O_WRONLY | os.O_CREAT)
    try:
        assert blobs.copy_to_fd(digest, fd) == len(data)
    finally:
        os.close(fd)
    assert out.read_bytes() == data


def test_missing_and_malformed(blobs):
    with pytest.raises(NotFound):
        blobs.read_bytes("a" * 64)
    with pytest.raises(InvalidArgument):
        blobs.has("../../etc/passwd")
    assert blobs.delete("b" * 64) == 0


def test_delete_frees(blobs):
    d = blobs.put_bytes(b"x" * 100)
    blobs.sync()
    assert blobs.delete(d) == 100 and not blobs.has(d)


def test_corruption_is_data_loss(blobs, tmp_path):
    d = blobs.put_bytes(b"precious")
    blobs.sync()
    if isinstance(blobs, MemoryBlobStore):
        blobs.corrupt(d, b"garbage!")
    else:
        path = os.path.join(blobs.root, d[:2], d[2:])
        os.chmod(path, 0o644)
        with open(path, "wb") as f:
            f.write(b"garbage!")
    with pytest.raises(DataLoss):
        blobs.read_bytes(d)
    fd = os.open(tmp_path / "sink", os.O_WRONLY | os.O_CREAT)
    try:
        with pytest.raises(DataLoss):
            blobs.copy_to_fd(d, fd)
    finally:
        os.close(fd)


def test_unsynced_blobs_are_readable_and_synced_ones_named(tmp_path):
    blobs = LocalBlobStore(str(tmp_path / "b"))
    d = blobs.put_bytes(b"pending")
    assert blobs.has(d) and blobs.read_bytes(d) == b"pending"
    assert not os.path.exists(os.path.join(blobs.root, d[:2], d[2:]))  # no name before sync
    blobs.sync()
    assert os.path.exists(os.path.join(blobs.root, d[:2], d[2:]))


def test_recovery_finishes_renames_and_drops_torn_temporaries(tmp_path):
    blobs = LocalBlobStore(str(tmp_path / "b"))
    whole = blobs.put_bytes(b"flushed before the crash")
    torn = blobs.put_bytes(b"only half of this reached the disk")
    with open(blobs._candidates(torn)[0], "r+b") as f:  # as a power cut would leave it
        f.truncate(10)
    stream = os.path.join(blobs.tmp, "stream-0123")  # a stream never named by its digest
    with open(stream, "wb") as f:
        f.write(b"partial")
    reopened = LocalBlobStore(str(tmp_path / "b"))  # as a restarted daemon would
    assert reopened.recover() == (1, 2)
    assert reopened.read_bytes(whole) == b"flushed before the crash"
    assert not reopened.has(torn)
    assert os.listdir(reopened.tmp) == []


def test_local_blobs_are_read_only_and_leave_no_temporaries(tmp_path):
    blobs = LocalBlobStore(str(tmp_path / "b"))
    d = blobs.put_bytes(b"abc")
    blobs.sync()
    assert os.stat(os.path.join(blobs.root, d[:2], d[2:])).st_mode & 0o777 == 0o444
    assert os.listdir(blobs.tmp) == []


def test_concurrent_puts_and_syncs_lose_nothing(blobs):
    """Regression: overlapping syncs once renamed each other's temporaries, and a sync
    could return before another thread's sync had made its blobs durable."""
    import threading
    errors, digests = [], []

    def worker(n):
        try:
            for i in range(60):
                d = blobs.put_bytes(b"%d-%d" % (n, i))
                shared = blobs.put_bytes(b"shared %d" % i)  # the same bytes from every thread
                blobs.sync()
                assert blobs.read_bytes(d) == b"%d-%d" % (n, i)
                assert blobs.read_bytes(shared) == b"shared %d" % i
                digests.append(d)
        except Exception as exc:  # collected: pytest sees nothing raised in threads
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert all(blobs.has(d) for d in digests)
    if isinstance(blobs, LocalBlobStore):
        assert os.listdir(blobs.tmp) == []


def test_delete_older_than_spares_a_blob_reused_meanwhile(blobs):
    import time
    d = blobs.put_bytes(b"old but about to be reused")
    blobs.sync()
    cutoff = time.time() + 0.01
    time.sleep(0.02)
    blobs.put_bytes(b"old but about to be reused")  # a checkpoint dedupes against it
    blobs.sync()
    assert blobs.delete(d, older_than=cutoff) == 0
    assert blobs.has(d)
    assert blobs.delete(d, older_than=time.time() + 1) > 0
