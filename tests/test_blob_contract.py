"""The BlobStore contract, run against every implementation."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import zstandard
from worldline.client.errors import DataLoss, InvalidArgument, NotFound
from worldline.daemon.storage.blob_index import is_staged
from worldline.daemon.storage.blobs import LocalBlobStore, MemoryBlobStore
from worldline.daemon.storage.crypto import DataKey, new_key
from worldline.daemon.storage.packs import (
    COPIES,
    DELTA,
    MAX_BLOB,
    MAX_DEPTH,
    ZDELTA,
    Row,
    encode_delta,
    pack_hex,
    unpack_hex,
    zstd_apply,
    zstd_delta,
    zstd_whole,
)

from .conftest import corrupt_blob, run_together

BIG = MAX_BLOB + 1  # bigger than the pack takes: stored as a file


def s3_blob_store(request, tmp_path, host: str = "a", cache_bytes: int = 1 << 30,
                  bucket: str | None = None, index=None, stage_bytes: int = 0, key=None):
    """An S3BlobStore on the session's S3 emulator: a new bucket (or ``bucket``), its
    index in a SQLite store (or ``index``), a cache of its own. It stages nothing
    unless ``stage_bytes`` says (the daemon's default stages a checkpoint's small pack:
    tests/test_staging.py): these tests are about what reaches the bucket."""
    from worldline.daemon.storage.s3_blobs import S3BlobStore
    from worldline.daemon.storage.sqlite_store import SqliteStore
    server = request.getfixturevalue("s3_server")
    bucket = bucket or server.new_bucket()
    index = index or SqliteStore(str(tmp_path / f"meta-{host}.db"))
    return S3BlobStore(f"s3://{bucket}/fleet",
                       LocalBlobStore(str(tmp_path / f"cache-{host}"), key=key),
                       index, host, cache_bytes=cache_bytes, stage_bytes=stage_bytes)


def local_in_store(request, tmp_path, key=None) -> LocalBlobStore:
    """A data root's blob store from 0.7.7 on: its pack in the metadata store's file."""
    from worldline.daemon.storage.sqlite_store import SqliteStore
    store = SqliteStore(str(tmp_path / "meta.db"))
    request.addfinalizer(store.close)
    return LocalBlobStore(str(tmp_path / "blobs"), pack_file=store.path,
                          store_lock=store.write_lock, key=key)


@pytest.fixture(params=["memory", "local", "local-in-store", "s3", "s3-staged",
                        "memory-keyed", "local-keyed", "local-in-store-keyed", "s3-keyed",
                        "s3-staged-keyed"])
def blobs(request, tmp_path):
    """Every store, in the clear and with a data key (``-keyed``: --encryption-key)."""
    kind, keyed, _ = request.param.partition("-keyed")
    key = DataKey(new_key()) if keyed else None
    if kind == "s3":
        return s3_blob_store(request, tmp_path, key=key)
    if kind == "s3-staged":  # small packs staged in the index's store, as the daemon's
        from worldline.daemon.storage.s3_blobs import STAGE_BYTES
        return s3_blob_store(request, tmp_path, stage_bytes=STAGE_BYTES, key=key)
    if kind == "local-in-store":
        return local_in_store(request, tmp_path, key)
    return (MemoryBlobStore(key) if kind == "memory"
            else LocalBlobStore(str(tmp_path / "b"), key=key))


def corrupt_in_bucket(blobs, digest: str) -> None:
    """Bit rot in the bucket: the object holding ``digest`` rewritten with one byte of
    the blob's entry flipped, and the host's cached copy gone."""
    loc = blobs.index.locate_blobs([digest])[digest]
    if is_staged(loc.object):  # its bytes are its row's in the metadata store
        body = bytearray(blobs.index.staged_body(loc.object))
        body[loc.off + loc.len // 2] ^= 0xFF
        with blobs.index._tx() as db:
            db.execute("UPDATE blob_objects SET body = ? WHERE name = ?",
                       (bytes(body), loc.object))
        blobs.cache.delete(digest)
        return
    bucket, prefix = blobs.url[5:].split("/", 1)
    s3 = __import__("boto3").client("s3")
    key = f"{prefix}/{loc.object}"
    body = bytearray(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    body[loc.off + loc.len // 2] ^= 0xFF
    s3.put_object(Bucket=bucket, Key=key, Body=bytes(body))
    blobs.cache.delete(digest)


def test_put_read_is_content_addressed(blobs):
    d = blobs.put_bytes(b"hello")
    assert d == blobs.address(b"hello")
    assert (d == hashlib.sha256(b"hello").hexdigest()) == (getattr(blobs, "key", None) is None)
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
    for data in (b"x" * 100, os.urandom(BIG)):
        d = blobs.put_bytes(data)
        blobs.sync()
        assert blobs.delete(d) > 0 and not blobs.has(d)


def test_a_base_is_a_hint_and_reads_back_the_same(blobs):
    v1 = b"line\n" * 2000
    d1 = blobs.put_bytes(v1)
    blobs.sync()
    versions = [v1]
    digests = [d1]
    for i in range(MAX_DEPTH * 2 + 3):  # a long line of versions, each from the last
        versions.append(versions[-1] + b"appended %d\n" % i)
        digests.append(blobs.put_bytes(versions[-1], base=digests[-1]))
        if i % 3 == 0:
            blobs.sync()
    blobs.sync()
    for d, v in zip(digests, versions, strict=True):
        assert blobs.read_bytes(d) == v and blobs.size(d) == len(v)
    assert blobs.put_bytes(b"other", base="c" * 64) == blobs.address(b"other")
    assert blobs.read_bytes(blobs.address(b"other")) == b"other"


def test_corruption_is_data_loss(blobs, tmp_path):
    d = blobs.put_bytes(b"precious" * (1 if isinstance(blobs, MemoryBlobStore) else BIG))
    blobs.sync()
    if isinstance(blobs, MemoryBlobStore):
        blobs.corrupt(d, b"garbage!")
    elif hasattr(blobs, "bucket"):
        corrupt_in_bucket(blobs, d)
    else:
        corrupt_blob(Path(blobs.root), d, b"garbage!")
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
    data = os.urandom(BIG)
    d = blobs.put_bytes(data)
    assert blobs.has(d) and blobs.read_bytes(d) == data
    assert not os.path.exists(os.path.join(blobs.root, d[:2], d[2:]))  # no name before sync
    blobs.sync()
    assert os.path.exists(os.path.join(blobs.root, d[:2], d[2:]))


def test_recovery_finishes_renames_and_drops_torn_temporaries(tmp_path):
    blobs = LocalBlobStore(str(tmp_path / "b"))
    flushed = b"flushed before the crash" * BIG
    whole = blobs.put_bytes(flushed)
    torn = blobs.put_bytes(os.urandom(BIG))
    with open(blobs._candidates(torn)[0], "r+b") as f:  # as a power cut would leave it
        f.truncate(10)
    stream = os.path.join(blobs.tmp, "stream-0123")  # a stream never named by its digest
    with open(stream, "wb") as f:
        f.write(b"partial")
    reopened = LocalBlobStore(str(tmp_path / "b"))  # as a restarted daemon would
    assert reopened.recover() == (1, 2)
    assert reopened.read_bytes(whole) == flushed
    assert not reopened.has(torn)
    assert os.listdir(reopened.tmp) == []


def test_local_blobs_are_read_only_and_leave_no_temporaries(tmp_path):
    blobs = LocalBlobStore(str(tmp_path / "b"))
    d = blobs.put_bytes(os.urandom(BIG))
    blobs.sync()
    assert os.stat(os.path.join(blobs.root, d[:2], d[2:])).st_mode & 0o777 == 0o444
    assert os.listdir(blobs.tmp) == []


def test_put_fd_within_a_limit_stores_nothing_past_it(blobs, tmp_path):
    """``put_fd(fd, limit)``: a file of at most ``limit`` bytes is stored as ever; one
    holding more (it grew since its size was read) is Overread, with nothing stored and
    no temporary left behind (a local store copies large content aside)."""
    from worldline.daemon.storage.blob_store import Overread
    data = os.urandom((3 << 20) + 5)
    src = tmp_path / "src"
    src.write_bytes(data)
    fd = os.open(src, os.O_RDONLY)
    try:
        digest, size = blobs.put_fd(fd, len(data))
        assert size == len(data) and blobs.read_bytes(digest) == data
        src.write_bytes(data + b"more")
        with pytest.raises(Overread) as raised:
            blobs.put_fd(fd, len(data))
        assert raised.value.limit == len(data)
        with pytest.raises(Overread):
            blobs.put_fd(fd, 1 << 20)
    finally:
        os.close(fd)
    assert not blobs.has(blobs.address(data + b"more"))
    local = getattr(blobs, "cache", blobs)  # a bucket's store copies through its cache
    if isinstance(local, LocalBlobStore):  # only the stored blob's is there, if any
        assert all(name.startswith(digest) for name in os.listdir(local.tmp))


def test_put_fd_of_stored_content_copies_nothing(tmp_path, monkeypatch):
    """A large file that is already stored is recognised by its digest before any copy
    of it is written (0.3 copied a 20 GiB blob into blobs/tmp first)."""
    blobs = LocalBlobStore(str(tmp_path / "b"))
    data = os.urandom(BIG)
    src = tmp_path / "src"
    src.write_bytes(data)
    with open(src, "rb") as f:
        first, _ = blobs.put_fd(f.fileno())
    blobs.sync()

    def no_copy(*args, **kwargs):  # the fault forced: any copy aside fails the test
        raise AssertionError("a copy was written")
    monkeypatch.setattr(blobs, "_write_temp", no_copy)
    with open(src, "rb") as f:
        f.read(1000)  # the descriptor's offset does not matter: it reads from the start
        again, size = blobs.put_fd(f.fileno())
    assert (again, size) == (first, len(data))


def test_concurrent_puts_and_syncs_lose_nothing(blobs):
    """Regression: overlapping syncs once renamed each other's temporaries, and a sync
    could return before another thread's sync had made its blobs durable."""
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

    run_together([lambda n=n: worker(n) for n in range(8)])
    assert errors == []
    assert all(blobs.has(d) for d in digests)
    if isinstance(blobs, LocalBlobStore):
        assert os.listdir(blobs.tmp) == []


def test_freeable_says_what_delete_would_free_and_removes_nothing(blobs):
    """gc's dry run asks ``freeable`` where the sweep deletes, in ``digests()`` order:
    for every blob, a chain of versions each a delta of the last among them, the bytes
    it names are those the delete then frees, asking removes nothing, and the blob
    kept (a needed one, skipped as the sweep does) still reads whole."""
    import time
    chain = [b"line\n" * 2000]
    for i in range(4):
        chain.append(chain[-1] + b"appended %d\n" % i)
    digests = [blobs.put_bytes(chain[0])]
    for data in chain[1:]:
        digests.append(blobs.put_bytes(data, base=digests[-1]))
    digests.append(blobs.put_bytes(os.urandom(BIG)))
    young = blobs.put_bytes(b"put after the cutoff")
    blobs.sync()
    kept = digests[2]  # the middle of the chain stays: what it is built on stays too
    order = list(blobs.digests())
    assert set(order) >= {*digests, young}
    cutoff = time.time()
    time.sleep(0.02)
    blobs.put_bytes(b"put after the cutoff")  # reused since: kept
    blobs.sync()
    gone: set[str] = set()
    for digest in order:
        if digest == kept:
            continue
        would = blobs.freeable(digest, cutoff, gone)
        assert blobs.has(digest)  # asking removed nothing
        assert blobs.delete(digest, older_than=cutoff) == would, digest
        if would:
            gone.add(digest)
    assert young not in gone and blobs.has(young)
    assert gone >= {*digests[3:]}  # the versions after the kept one, and the file
    assert blobs.read_bytes(kept) == chain[2]  # whatever else went, it reads whole


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


# -- the pack (LocalBlobStore's small blobs) --------------------------------------------

def test_small_blobs_are_packed_and_a_new_version_is_a_delta(tmp_path):
    blobs = LocalBlobStore(str(tmp_path / "b"))
    v1 = os.urandom(20_000)
    d1 = blobs.put_bytes(v1)
    blobs.sync()
    v2 = v1[:5000] + b"an edit" + v1[5000:] + b"# appended\n"
    d2 = blobs.put_bytes(v2, base=d1)
    blobs.sync()
    row = blobs.pack.row(d2)
    assert row.kind == COPIES and row.base == d1 and len(row.data) < 64
    assert [p for p in os.listdir(blobs.root) if len(p) == 2] == []  # no files
    reopened = LocalBlobStore(str(tmp_path / "b"))  # synced rows survive a restart
    assert reopened.read_bytes(d2) == v2 and reopened.read_bytes(d1) == v1
    # a base is never deleted under its delta; the sweep order frees both at once
    assert reopened.delete(d1) == 0 and reopened.has(d1)
    order = list(reopened.digests())
    assert order.index(d2) < order.index(d1)
    assert reopened.delete(d2) > 0 and reopened.delete(d1) > 0
    assert list(reopened.digests()) == []


def test_an_edit_in_one_place_is_a_splice_of_a_few_bytes(tmp_path):
    blobs = LocalBlobStore(str(tmp_path / "b"))
    v1 = b"".join(b"line %d of the module\n" % i for i in range(3000))
    d1 = blobs.put_bytes(v1)
    d2 = blobs.put_bytes(v1 + b"# one more line\n", base=d1)
    blobs.sync()
    row = blobs.pack.row(d2)
    assert row.kind == DELTA and len(row.data) < 24, len(row.data)


def test_a_delta_copies_from_anywhere_in_its_base(tmp_path):
    """Edits far apart in a large file, and a block moved from its end to its start,
    store about what changed, not everything between the edits (the old prefix/suffix
    delta stored 70 KB here)."""
    blobs = LocalBlobStore(str(tmp_path / "b"))
    lines = [f"line {i}: {os.urandom(12).hex()}\n".encode() for i in range(4000)]
    v1 = b"".join(lines)
    d1 = blobs.put_bytes(v1)
    lines[10] = b"an edit near the start\n"
    lines[3990] = b"an edit near the end\n"
    v2 = b"".join(lines[3000:] + lines[:3000])
    d2 = blobs.put_bytes(v2, base=d1)
    blobs.sync()
    row = blobs.pack.row(d2)
    assert row.kind == COPIES and len(row.data) < 200, len(row.data)
    assert len(encode_delta(v1, v2)) > 50_000  # what 0.6 stored
    assert LocalBlobStore(str(tmp_path / "b")).read_bytes(d2) == v2


def test_rows_of_the_zstd_delta_encoding_read(tmp_path):
    """Rows the idle repack writes, and that checkpoints wrote before 0.7.12 (a zstd
    frame with the base as its dictionary, kind ZDELTA), read."""
    blobs = LocalBlobStore(str(tmp_path / "b"))
    v1 = b"".join(b"row %d\n" % i for i in range(2000))
    d1 = blobs.put_bytes(v1)
    blobs.sync()
    v2 = v1[:100] + b"one" + v1[100:9000] + b"two" + v1[9000:]
    d2 = hashlib.sha256(v2).hexdigest()
    with blobs._lock:
        blobs.pack.pending[d2] = Row(ZDELTA, d1, 1, len(v2), 0.0, zstd_delta(v1, v2))
    blobs.sync()
    assert LocalBlobStore(str(tmp_path / "b")).read_bytes(d2) == v2


def _framed(ops: bytes) -> bytes:
    return zstd_whole(pack_hex(ops))


@pytest.mark.parametrize("damage", [
    lambda d: _framed(d[:-1]),  # the last operation cut short
    lambda d: _framed(d + b"\x21\x00"),  # a copy too many: more bytes than the row's
    lambda d: _framed(b"\xff" * 11),  # a varint past 64 bits
    lambda d: _framed(b"\x21\xff\xff\x7f"),  # a copy from past the end of the base
    lambda d: _framed(b""),  # no operations: no bytes
    lambda d: _framed(d)[:-3],  # the frame cut short
    lambda d: pack_hex(d),  # no frame at all
    lambda d: _framed(d * 200),  # a frame holding more than any delta of this blob
])
def test_a_damaged_copies_row_is_data_loss_never_wrong_bytes(tmp_path, damage):
    """Each way a copy delta can be wrong (its operations, its hex packing, its zstd
    frame) is found when the row is read, not served."""
    blobs = LocalBlobStore(str(tmp_path / "b"))
    v1 = b"".join(b"entry %d\n" % i for i in range(500))
    d1 = blobs.put_bytes(v1)
    d2 = blobs.put_bytes(v1[:500] + b"changed" + v1[600:4000] + b"and here" + v1[4100:],
                         base=d1)
    blobs.sync()
    row = blobs.pack.row(d2)
    assert row.kind == COPIES
    ops = unpack_hex(zstd_apply(None, row.data, zstandard.frame_content_size(row.data)))
    with blobs.pack._tx() as db:
        db.execute("UPDATE objects SET data = ? WHERE digest = ?",
                   (damage(ops), bytes.fromhex(d2)))
    with pytest.raises(DataLoss):
        LocalBlobStore(str(tmp_path / "b")).read_bytes(d2)


def test_rows_of_the_old_delta_encoding_still_read(tmp_path):
    """A pack written before 0.7 holds prefix/suffix deltas (kind DELTA): they read."""
    blobs = LocalBlobStore(str(tmp_path / "b"))
    v1 = b"base content\n" * 500
    d1 = blobs.put_bytes(v1)
    blobs.sync()
    v2 = v1[:3000] + b"old-style edit" + v1[3000:]
    d2 = hashlib.sha256(v2).hexdigest()
    with blobs._lock:
        blobs.pack.pending[d2] = Row(DELTA, d1, 1, len(v2), 0.0, encode_delta(v1, v2))
    blobs.sync()
    assert LocalBlobStore(str(tmp_path / "b")).read_bytes(d2) == v2


def test_unsynced_pack_rows_are_readable_here_and_gone_after_a_crash(tmp_path):
    blobs = LocalBlobStore(str(tmp_path / "b"))
    d = blobs.put_bytes(b"not yet synced")
    assert blobs.read_bytes(d) == b"not yet synced" and blobs.delete(d) == 0
    assert not LocalBlobStore(str(tmp_path / "b")).has(d)  # another process: not there


def test_a_damaged_row_anywhere_in_a_chain_is_data_loss(tmp_path):
    blobs = LocalBlobStore(str(tmp_path / "b"))
    v1 = b"base content\n" * 500
    d1 = blobs.put_bytes(v1)
    d2 = blobs.put_bytes(v1 + b"more\n", base=d1)
    blobs.sync()
    corrupt_blob(Path(blobs.root), d1, b"\x00" * 10)
    reopened = LocalBlobStore(str(tmp_path / "b"))  # nothing cached: what the disk holds
    for store in (blobs, reopened):
        for d in (d1, d2):
            with pytest.raises(DataLoss):
                store.verify(d)  # fsck's check never trusts memory
    for d in (d1, d2):
        with pytest.raises(DataLoss):
            reopened.read_bytes(d)


def test_a_base_chosen_by_a_put_is_safe_from_a_concurrent_gc(tmp_path):
    import time
    blobs = LocalBlobStore(str(tmp_path / "b"))
    v1 = b"v1\n" * 1000
    d1 = blobs.put_bytes(v1)
    blobs.sync()
    cutoff = time.time() + 0.01
    time.sleep(0.02)
    d2 = blobs.put_bytes(v1 + b"v2\n", base=d1)  # d1 becomes a base: reused, depended on
    assert blobs.delete(d1, older_than=cutoff) == 0
    assert blobs.delete(d1, older_than=time.time() + 1) == 0  # d2, pending, needs it
    blobs.sync()
    assert blobs.read_bytes(d2) == v1 + b"v2\n"


def test_a_blob_store_says_whether_its_commits_stay_on_this_host(blobs, request):
    """``local``, as for stores: a bucket's ``committing`` uploads, so a checkpoint that
    writes to one commits after its capture's turn, never in it (world/checkpoint.py)."""
    assert blobs.local is not request.node.callspec.params["blobs"].startswith("s3")
