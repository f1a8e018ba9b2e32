"""The fleet's blob store on an S3 emulator (moto's server): one pack object per sync,
every host reading every blob verified, the cache's bound, and gc's sweep of the
bucket. Races are the index's (SQL), tested here against real SQLite/PostgreSQL."""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import time

import pytest
from worldline.client.errors import Aborted, DataLoss, InvalidArgument, NotFound, Unavailable
from worldline.daemon.storage import bucket_packs, packs, s3_blobs
from worldline.daemon.storage.blobs import LocalBlobStore
from worldline.daemon.storage.s3_blobs import ALONE

from .test_blob_contract import s3_blob_store


def _index_fails(monkeypatch, index, exc: BaseException) -> None:
    """Recording an uploaded object raises ``exc`` until ``monkeypatch.undo()``: a
    daemon killed after its PUT (SystemExit), or the metadata store away."""
    def fail(*args, **kwargs):
        raise exc

    monkeypatch.setattr(index, "add_blob_object", fail)


def _bucket_of(blobs) -> str:
    return blobs.url[5:].split("/", 1)[0]


def test_one_pack_object_per_sync_and_large_blobs_alone(request, tmp_path, index, s3_server):
    a = s3_blob_store(request, tmp_path, index=index)
    small = [a.put_bytes(b"file %d\n" % i * 50) for i in range(40)]
    a.put_many([b"tree %d" % i for i in range(10)])
    a.sync()
    assert a.requests["put"] == 1
    a.sync()  # nothing new: no request
    assert a.requests["put"] == 1
    a.put_bytes(small and b"file 0\n" * 50)  # already in the bucket: found, not sent
    a.sync()
    assert a.requests["put"] == 1
    big = os.urandom(ALONE + 1)
    src = tmp_path / "big"
    src.write_bytes(big)
    fd = os.open(src, os.O_RDONLY)
    try:
        digest, _ = a.put_fd(fd)
    finally:
        os.close(fd)
    a.put_bytes(b"one more small one")
    a.sync()
    assert a.requests["put"] == 3
    keys = s3_server.keys(_bucket_of(a))
    assert sum(k.startswith("fleet/packs/") for k in keys) == 2
    assert any(k.startswith(f"fleet/blobs/{digest[:2]}/{digest}-") for k in keys)


def test_a_deleted_blob_leaves_the_cache_before_the_cache_has_committed_it(
        request, tmp_path, index, monkeypatch):
    """The cache's rows are committed behind the checkpoint (by a thread); a blob
    forgotten before that thread has run is deleted from the cache all the same (it
    was kept, still reported by has(), as the contract test once caught)."""
    a = s3_blob_store(request, tmp_path, index=index)
    monkeypatch.setattr(a, "_commit_behind", lambda: None)  # the thread never runs
    for data in (b"x" * 100, os.urandom(packs.MAX_BLOB + 1)):
        digest = a.put_bytes(data)
        a.sync()
        assert a.cache.has(digest) and a.delete(digest) > 0
        assert not a.has(digest) and not a.cache.has(digest)


def _asked(monkeypatch, index) -> list[list[str]]:
    """The digests each ``touch_blobs`` call asks the index about (the real call runs)."""
    asked: list[list[str]] = []
    touch = index.touch_blobs

    def counted(digests, now):
        asked.append(list(digests))
        return touch(digests, now)

    monkeypatch.setattr(index, "touch_blobs", counted)
    return asked


def test_only_what_may_be_stored_already_is_asked_about(request, tmp_path, index,
                                                        s3_server, monkeypatch):
    """A small batch of new blobs (an agent's edit) is uploaded without a round trip
    to the index; a blob this host cached before (a file edited back) is asked about,
    found and not sent; a large batch asks about every digest (an install another host
    may have stored), and sends none that is stored."""
    a = s3_blob_store(request, tmp_path, host="a", index=index)
    asked = _asked(monkeypatch, index)
    first = a.put_bytes(b"version 1\n" * 40)
    a.sync()
    assert asked == [] and a.requests["put"] == 1
    second = a.put_bytes(b"version 2\n" * 40)
    assert a.put_bytes(b"version 1\n" * 40) == first  # edited back
    a.sync()
    assert asked == [[first]] and a.requests["put"] == 2
    second_pack = index.locate_blobs([second])[second].object
    assert [d for d, _ in index.object_entries(second_pack)] == [second]  # not first again
    # Host b never saw them: a large batch holding them asks, and sends only the rest.
    b = s3_blob_store(request, tmp_path, host="b", index=index, bucket=_bucket_of(a))
    big = [os.urandom(200_000) for _ in range(6)]
    fresh = b.put_many(big)
    b.put_bytes(b"version 1\n" * 40)
    b.put_bytes(b"version 2\n" * 40)
    b.sync()
    assert sorted(asked[-1]) == sorted([*fresh, first, second])
    (pack,) = {index.locate_blobs([d])[d].object for d in fresh}
    assert sorted(d for d, _ in index.object_entries(pack)) == sorted(fresh)


def test_a_blob_stored_elsewhere_and_uploaded_again_keeps_one_row(request, tmp_path, index,
                                                                  s3_server):
    """Host b puts, in a small batch, a blob host a stored long ago (b never saw it):
    b uploads its own copy without asking. Recording it keeps a's row, renewed, so gc
    (which removes rows older than its grace) leaves it; had gc removed the row first,
    the recording names b's copy. Either way every host reads it."""
    a = s3_blob_store(request, tmp_path, host="a", index=index)
    shared, other = b"the same file, written on two hosts\n" * 20, b"only on b\n" * 20
    d = a.put_bytes(shared)
    a.sync()
    first = index.locate_blobs([d])[d]
    cutoff = time.time() + 0.01
    time.sleep(0.02)
    b = s3_blob_store(request, tmp_path, host="b", index=index, bucket=_bucket_of(a))
    b.put_bytes(shared)
    b.sync()
    assert b.requests["put"] == 1  # its own copy went out
    renewed = index.locate_blobs([d])[d]
    assert renewed.object == first.object and renewed.stored_at > first.stored_at
    assert b.delete(d, older_than=cutoff) == 0  # gc spares it
    # gc removes the row before host c's recording: c's copy is what the row names.
    assert b.delete(d, older_than=time.time() + 1) > 0
    c = s3_blob_store(request, tmp_path, host="c", index=index, bucket=_bucket_of(a))
    c.put_bytes(shared)
    c.put_bytes(other)
    c.sync()
    assert index.locate_blobs([d])[d].object != first.object
    reader = s3_blob_store(request, tmp_path, host="r", index=index, bucket=_bucket_of(a))
    assert reader.read_bytes(d) == shared


def test_another_host_reads_everything_verified_a_pack_at_a_time(request, tmp_path, index,
                                                                 s3_server):
    a = s3_blob_store(request, tmp_path, host="a", index=index)
    data = {a.put_bytes(os.urandom(3000)): None for _ in range(200)}
    a.sync()
    b = s3_blob_store(request, tmp_path, host="b", index=index, bucket=_bucket_of(a))
    for digest in data:
        assert b.has(digest)
        assert b.read_bytes(digest) == a.read_bytes(digest)
    assert b.requests["get"] == 1  # the one pack, then the cache
    with pytest.raises(NotFound):
        b.read_bytes("e" * 64)


def test_the_cache_stays_within_its_bound_and_refetches(request, tmp_path, index, s3_server):
    a = s3_blob_store(request, tmp_path, index=index, cache_bytes=64 << 10)
    digests = []
    for round_ in range(6):
        digests += [a.put_bytes(os.urandom(4096)) for _ in range(8)]
        a.sync()
        assert a._lru_bytes <= 64 << 10, round_
    oldest = digests[0]
    assert not a.cache.has(oldest)  # evicted, still in the bucket
    assert len(a.read_bytes(oldest)) == 4096


def test_a_cached_base_that_deltas_are_built_on_stays_counted(request, tmp_path, index,
                                                               s3_server):
    """Eviction cannot remove a cached row other rows are built on: it stays in the
    cache and in the bound's count (to go with its dependents), never forgotten."""
    a = s3_blob_store(request, tmp_path, index=index, cache_bytes=1 << 30)
    text = b"".join(b"line %d of a file under edit\n" % i for i in range(2000))
    base = a.put_bytes(text)
    a.sync()
    delta = a.put_bytes(text + b"one more line\n", base=base)
    a.sync()
    a.cache.sync()  # the cache's commit-behind done (a row not committed yet is not
    # evicted: it stays for a later eviction, which would make the next lines racy)
    assert a.cache.pack.row(delta).base == base
    a.cache_bytes = 1  # now everything should go
    a._evict()
    assert a.cache.has(base) and base in a._lru  # kept, and still counted
    assert not a.cache.has(delta)  # the delta went first
    a._evict()
    assert not a.cache.has(base) and base not in a._lru  # then its base
    assert a.read_bytes(delta).endswith(b"one more line\n")


def test_gc_sweeps_the_bucket_and_never_what_a_sync_relies_on(request, tmp_path, index,
                                                             s3_server):
    a = s3_blob_store(request, tmp_path, host="a", index=index)
    b = s3_blob_store(request, tmp_path, host="b", index=index, bucket=_bucket_of(a))
    keep = [a.put_bytes(b"keep %d" % i * 100) for i in range(5)]
    drop = [a.put_bytes(os.urandom(2000)) for _ in range(20)]
    a.sync()
    cutoff = time.time() + 0.01
    time.sleep(0.02)
    a.put_bytes(b"keep 0" * 100)  # host a relies on it again: the sync renews it
    a.sync()
    assert b.delete(keep[0], older_than=cutoff) == 0
    for d in drop:
        assert b.delete(d, older_than=cutoff) > 0
    # the pack is mostly garbage now: rewritten with its live entries, the old one deleted
    removed, freed = b.compact(older_than=time.time() + 1)
    assert removed == 1 and freed > 20 * 1000
    keys = [k for k in s3_server.keys(_bucket_of(a)) if k.startswith("fleet/packs/")]
    assert len(keys) == 1
    fresh = s3_blob_store(request, tmp_path, host="c", index=index, bucket=_bucket_of(a))
    for d in keep:
        assert fresh.read_bytes(d) == b"keep %d" % keep.index(d) * 100
    for d in drop:
        assert not fresh.has(d)


def test_a_crash_between_the_put_and_the_index_leaves_an_orphan_gc_removes(
        request, tmp_path, index, s3_server, monkeypatch):
    a = s3_blob_store(request, tmp_path, index=index)
    d = a.put_bytes(b"never indexed")
    _index_fails(monkeypatch, index, SystemExit("killed after the PUT"))
    with pytest.raises(SystemExit):
        a.sync()
    monkeypatch.undo()
    assert len(s3_server.keys(_bucket_of(a))) == 1  # in the bucket, named by no row
    assert not index.locate_blobs([d])
    a = s3_blob_store(request, tmp_path, index=index, bucket=_bucket_of(a))  # restarted
    assert a.has(d)  # in the cache: it goes out with the next sync that puts it
    a.put_bytes(b"never indexed")
    a.put_bytes(b"and one more")  # so the next pack is another object
    a.sync()
    assert index.locate_blobs([d]) and len(s3_server.keys(_bucket_of(a))) == 2
    time.sleep(1.1)  # the bucket's times are in whole seconds
    removed, _ = a.compact(older_than=time.time())  # the orphan goes; the indexed pack stays
    assert removed == 1 and len(s3_server.keys(_bucket_of(a))) == 1
    assert index.blob_objects()[0][3] > 0 and a.read_bytes(d) == b"never indexed"


def test_a_checkpoint_records_its_objects_in_its_own_commit(request, tmp_path, index,
                                                             s3_server):
    from .test_store_contract import make_cp, new_session
    a = s3_blob_store(request, tmp_path, index=index)
    s, first = new_session(index)
    d = a.put_bytes(b"indexed by the checkpoint's own transaction")
    with a.committing() as objects:
        assert [e[0] for o in objects for e in o.entries] == [d]
        assert a.requests["put"] == 1 and not index.locate_blobs([d])  # sent, not recorded
        cp = index.append_checkpoint(make_cp(s.id, first.id), [], first.id, None, [], objects)
    assert index.locate_blobs([d])[d].object == objects[0].name
    # One sync sends what another session put; that session's checkpoint, committed
    # first, records the object too.
    e = a.put_bytes(b"put for one checkpoint, sent by another's sync")
    with a.committing() as sent:
        with a.committing() as other:
            assert other == sent and e in {x[0] for o in other for x in o.entries}
            cp = index.append_checkpoint(make_cp(s.id, cp.id), [], cp.id, None, [], other)
        assert index.locate_blobs([e])
        with pytest.raises(Aborted):  # this one lost its compare-and-set: nothing lost
            index.append_checkpoint(make_cp(s.id, first.id), [], first.id, None, [], sent)
    b = s3_blob_store(request, tmp_path, host="b", index=index, bucket=_bucket_of(a))
    assert b.read_bytes(e) == b"put for one checkpoint, sent by another's sync"


def test_a_checkpoint_that_fails_still_indexes_what_it_uploaded(request, tmp_path, index,
                                                                s3_server, monkeypatch):
    from .test_store_contract import make_cp, new_session
    a = s3_blob_store(request, tmp_path, index=index)
    s, first = new_session(index)
    d = a.put_bytes(b"uploaded for a checkpoint that is refused")
    with pytest.raises(Aborted):
        with a.committing() as objects:
            index.append_checkpoint(make_cp(s.id, first.id), [], "moved", None, [], objects)
    assert index.locate_blobs([d])  # recorded on its own: findable, gc's to judge
    # The metadata store away: the upload waits, and is recorded by the next sync.
    e = a.put_bytes(b"uploaded while the metadata store is away")
    _index_fails(monkeypatch, index, Unavailable("the metadata store is away"))
    with pytest.raises(Unavailable):
        a.sync()
    monkeypatch.undo()
    assert not index.locate_blobs([e])
    a.sync()
    assert index.locate_blobs([e])
    # Away for longer than an unrecorded upload may wait (gc elsewhere could delete an
    # object nothing names): its blobs are sent again, then recorded.
    f = a.put_bytes(b"uploaded before a long outage")
    _index_fails(monkeypatch, index, Unavailable("the metadata store is away"))
    with pytest.raises(Unavailable):
        a.sync()
    monkeypatch.undo()
    puts = a.requests["put"]
    monkeypatch.setattr(s3_blobs, "UNINDEXED_SECONDS", -1.0)
    a.sync()
    assert a.requests["put"] == puts + 1 and index.locate_blobs([f])
    b = s3_blob_store(request, tmp_path, host="b", index=index, bucket=_bucket_of(a))
    assert b.read_bytes(f) == b"uploaded before a long outage"


def test_the_cache_bound_counts_what_earlier_runs_cached(request, tmp_path, index,
                                                         s3_server):
    a = s3_blob_store(request, tmp_path, index=index, cache_bytes=1 << 30)
    old = [a.put_bytes(os.urandom(4096)) for _ in range(16)]
    a.sync()
    a.cache.close()
    # the same cache opened again, now bounded at 32 KiB: the blobs of the last run count
    again = s3_blob_store(request, tmp_path, index=index, cache_bytes=32 << 10,
                          bucket=_bucket_of(a))
    assert again._lru_bytes >= 16 * 4096
    again.put_bytes(b"one more")
    again.sync()
    assert again._lru_bytes <= 32 << 10
    assert sum(again.cache.has(d) for d in old) <= 8
    assert all(len(again.read_bytes(d)) == 4096 for d in old)  # from the bucket


def _committed(blobs, digest: str) -> bool:
    """The blob is a committed row of the cache's pack (read through a connection of
    our own, so rows pending in the store's memory do not count)."""
    import sqlite3
    db = sqlite3.connect(f"file:{blobs.cache.pack.path}?mode=ro", uri=True)
    try:
        return db.execute("SELECT 1 FROM objects WHERE digest = ?",
                          (bytes.fromhex(digest),)).fetchone() is not None
    finally:
        db.close()


def test_the_cache_commits_behind_and_at_close(request, tmp_path, index, s3_server):
    a = s3_blob_store(request, tmp_path, index=index)
    d = a.put_bytes(b"committed by the cache's own thread\n" * 40)
    a.sync()  # in the bucket and indexed; the cache's row is committed behind
    deadline = time.monotonic() + 10
    while not _committed(a, d) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _committed(a, d)
    b = s3_blob_store(request, tmp_path, host="b", index=index, bucket=_bucket_of(a))
    e = b.put_bytes(b"fetched by another host\n" * 40)
    b.sync()
    assert a.read_bytes(e) == b"fetched by another host\n" * 40  # a fetch: cached behind
    left = a.put_bytes(b"put, never synced\n" * 40)
    a.close()  # the thread stops; close commits what it had not taken
    assert _committed(a, e) and _committed(a, left)


def _text(i: int) -> bytes:
    """A compressible blob, as source files are."""
    return b"".join(b"def function_%d_%d(x):\n    return x * %d\n\n" % (i, j, j)
                    for j in range(60))


def _old_host_upload(a, index, blobs: dict[str, bytes], codec_of) -> str:
    """A pack object as a host writes it (entries concatenated, indexed after the PUT),
    each entry encoded by ``codec_of(data) -> (codec, bytes)``: how hosts before 0.7.8
    wrote theirs, or a damaged or unknown one."""
    body, entries = bytearray(), []
    for digest, data in blobs.items():
        codec, stored = codec_of(data)
        entries.append((digest, len(body), len(stored), len(data), codec))
        body += stored
    name = f"packs/old-{os.urandom(8).hex()}.pack"
    a._put_object(name, bytes(body))
    index.add_blob_object(name, len(body), "old", time.time(), entries)
    return name


def test_entries_are_zstd_frames_a_cold_cache_keeps_as_they_are(request, tmp_path, index,
                                                                s3_server):
    """0.7.8: an entry is a zstd frame of the whole blob (codec "zstd"), raw when that
    saves too little; a host filling its cache from the bucket stores the entry's bytes
    as its row, with no compression again."""
    a = s3_blob_store(request, tmp_path, host="a", index=index)
    texts = {a.put_bytes(_text(i)): _text(i) for i in range(20)}
    noise = os.urandom(4000)
    noise_digest = a.put_bytes(noise)
    a.sync()
    found = index.locate_blobs(sorted(texts) + [noise_digest])
    assert {found[d].codec for d in texts} == {"zstd"}
    assert found[noise_digest].codec == "raw"
    assert all(found[d].len < len(texts[d]) // 4 for d in texts)
    b = s3_blob_store(request, tmp_path, host="b", index=index, bucket=_bucket_of(a))
    for digest, data in [*texts.items(), (noise_digest, noise)]:
        assert b.read_bytes(digest) == data
    body = bytes(obstore_get(a, found[next(iter(texts))].object))
    for digest in texts:
        row = b.cache.pack.row(digest)
        loc = found[digest]
        assert row.kind == packs.ZSTD and row.data == body[loc.off:loc.off + loc.len]
    assert b.cache.pack.row(noise_digest).kind == packs.RAW


def obstore_get(store, name: str) -> bytes:
    import obstore
    return obstore.get(store.bucket, name).bytes()


def test_a_bucket_written_before_0_7_8_reads_on_a_new_host(request, tmp_path, index,
                                                          s3_server):
    """Entries of codec "pack" (deflate of the hex-packed bytes, what hosts before 0.7.8
    wrote) read, verified, and become the cache's zlib rows as they are."""
    a = s3_blob_store(request, tmp_path, host="a", index=index)
    blobs = {hashlib.sha256(_text(i)).hexdigest(): _text(i) for i in range(10)}
    _old_host_upload(a, index, blobs, lambda data: ("pack", packs.compress(data)))
    b = s3_blob_store(request, tmp_path, host="b", index=index, bucket=_bucket_of(a))
    for digest, data in blobs.items():
        assert b.read_bytes(digest) == data
        row = b.cache.pack.row(digest)
        assert row.kind == packs.ZLIB and row.data == packs.compress(data)
    b.cache.sync()
    again = s3_blob_store(request, tmp_path, host="b2", index=index, bucket=_bucket_of(a))
    assert again.read_bytes(next(iter(blobs))) == next(iter(blobs.values()))


@pytest.mark.parametrize("codec_of", [
    lambda data: ("brotli", data),  # a codec this worldline does not know
    lambda data: ("zstd", packs.zstd_whole(data + b"!", packs.FAST)),  # other bytes
    lambda data: ("zstd", packs.zstd_whole(data, packs.FAST)[:-3]),  # cut short
    lambda data: ("pack", b"not deflate at all"),
], ids=["unknown-codec", "wrong-frame", "cut-frame", "bad-deflate"])
def test_an_entry_that_does_not_decode_to_its_digest_is_data_loss(request, tmp_path, index,
                                                                   s3_server, codec_of):
    a = s3_blob_store(request, tmp_path, host="a", index=index)
    data = _text(7)
    digest = hashlib.sha256(data).hexdigest()
    _old_host_upload(a, index, {digest: data}, codec_of)
    b = s3_blob_store(request, tmp_path, host="b", index=index, bucket=_bucket_of(a))
    with pytest.raises(DataLoss):
        b.read_bytes(digest)
    assert not b.cache.has(digest)


def test_a_recording_racing_gcs_removal_always_leaves_the_row(index):
    """The gc guarantee of recording without asking, under real concurrency: gc's
    removal of an old row (one statement, only if older than its cutoff) races a host
    recording an object that holds the same digest. Whichever wins, the row is there
    afterwards, naming an object that holds the blob."""
    import threading

    def remove(start, digest):
        start.wait()
        index.forget_blob(digest, older_than=2000.0)

    def record(start, digest, name):
        start.wait()
        index.add_blob_object(name, 10, "b", time.time(), [(digest, 0, 10, 10, "raw")])

    missing = []
    for i in range(60):
        digest = hashlib.sha256(b"raced %d" % i).hexdigest()
        index.add_blob_object(f"packs/old-{i}.pack", 10, "a", 1000.0,
                              [(digest, 0, 10, 10, "raw")])
        start = threading.Barrier(2)
        threads = [threading.Thread(target=remove, args=(start, digest)),
                   threading.Thread(target=record, args=(start, digest, f"packs/new-{i}.pack"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        found = index.locate_blobs([digest]).get(digest)
        if found is None or found.stored_at < 2000.0:
            missing.append((i, found))
    assert missing == []


# -- a host's small packs rewritten at rest (0.7.14) -----------------------------------------
def _edited_history(a, syncs: int = 20, files: int = 3, seed: int = 0) -> dict[str, bytes]:
    """``syncs`` checkpoints' worth of uploads on host ``a``: each a new version of
    ``files`` files, put against the version before (as a capture puts them), then a
    sync: one small pack object each. Returns every blob put (digest -> bytes)."""
    from .test_bucket_packs import _versions
    histories = [_versions(syncs, seed=seed * 100 + f) for f in range(files)]
    put: dict[str, bytes] = {}
    last: list[str | None] = [None] * files
    for i in range(syncs):
        for f in range(files):
            data = histories[f][i]
            last[f] = a.put_bytes(data, base=last[f])
            put[last[f]] = data
        a.sync()
    return put


def _packs_of(s3_server, blobs) -> list[str]:
    return [k for k in s3_server.keys(_bucket_of(blobs)) if k.startswith("fleet/packs/")]


def test_a_hosts_small_packs_are_rewritten_at_rest_as_one_with_deltas(request, tmp_path, index,
                                                                       s3_server):
    a = s3_blob_store(request, tmp_path, host="a", index=index)
    put = _edited_history(a)
    b = s3_blob_store(request, tmp_path, host="b", index=index, bucket=_bucket_of(a))
    theirs = _edited_history(b, syncs=s3_blobs.CONSOLIDATE_MIN, seed=1)
    before = {row[0]: row[1] for row in index.blob_objects()}
    mine = {row[0]: row[1] for row in index.blob_objects() if row[4] == "a"}
    assert len(_packs_of(s3_server, a)) == 20 + s3_blobs.CONSOLIDATE_MIN
    assert a.consolidate(older_than=time.time() - 60) == (0, 0, 0)  # none that old yet
    done, read, written = a.consolidate(older_than=time.time() + 1)
    assert (done, read) == (20, sum(mine.values()))
    assert written < read / 4
    rows = index.locate_blobs(sorted(put))
    assert len({loc.object for loc in rows.values()}) == 1  # one object now
    assert sum(loc.codec == "delta" for loc in rows.values()) >= len(put) - 3
    assert {loc.object for loc in index.locate_blobs(sorted(theirs)).values()} <= set(before)
    assert len(_packs_of(s3_server, a)) == 1 + s3_blobs.CONSOLIDATE_MIN  # b's stay b's
    assert a.consolidate(older_than=time.time() + 1) == (0, 0, 0)  # one small object left
    c = s3_blob_store(request, tmp_path, host="c", index=index, bucket=_bucket_of(a))
    for digest, data in put.items():
        assert c.read_bytes(digest) == data
    assert c.requests["get"] == 1  # the one object, every entry verified into the cache
    assert c.cache.pack.row(next(iter(put))).kind in packs.WHOLE


@pytest.mark.parametrize("killed", ["after-the-put", "after-the-index"])
def test_a_rewrite_killed_midway_loses_nothing_and_gc_tidies_up(request, tmp_path, index,
                                                                 s3_server, monkeypatch, killed):
    a = s3_blob_store(request, tmp_path, host="a", index=index)
    put = _edited_history(a)

    def die(*args, **kwargs):
        raise SystemExit(f"killed {killed}")

    if killed == "after-the-put":
        monkeypatch.setattr(index, "rewrite_blobs", die)
    else:
        monkeypatch.setattr(a, "_delete_objects", die)
    with pytest.raises(SystemExit):
        a.consolidate(older_than=time.time() + 1)
    monkeypatch.undo()
    assert len(_packs_of(s3_server, a)) == 21  # the old ones and the new one
    c = s3_blob_store(request, tmp_path, host="c", index=index, bucket=_bucket_of(a))
    assert all(c.read_bytes(d) == data for d, data in put.items())
    time.sleep(1.1)  # the bucket's times are in whole seconds
    a = s3_blob_store(request, tmp_path, host="a", index=index, bucket=_bucket_of(a))  # again
    removed, _ = a.compact(older_than=time.time())
    # an orphan the index never recorded, or the 20 objects no row names any more
    assert removed == (1 if killed == "after-the-put" else 20)
    assert len(_packs_of(s3_server, a)) == (20 if killed == "after-the-put" else 1)
    if killed == "after-the-put":
        assert a.consolidate(older_than=time.time() + 1)[0] == 20
    d = s3_blob_store(request, tmp_path, host="d", index=index, bucket=_bucket_of(a))
    assert all(d.read_bytes(x) == data for x, data in put.items())


@pytest.mark.parametrize("race", ["object-deleted", "rows-moved"])
def test_a_read_racing_a_rewrite_finds_the_blob_where_it_went(request, tmp_path, index,
                                                              s3_server, monkeypatch, race):
    """Host b looks a blob up; host a rewrites its objects before b reads the old one:
    it is gone (or, deleted a moment later, no longer names the blob), and b looks the
    blob up again."""
    a = s3_blob_store(request, tmp_path, host="a", index=index)
    put = _edited_history(a)
    b = s3_blob_store(request, tmp_path, host="b", index=index, bucket=_bucket_of(a))
    if race == "rows-moved":
        monkeypatch.setattr(a, "_delete_objects", lambda names: None)
    locate = b._locate
    raced = []

    def locate_then_rewrite(digest):
        found = locate(digest)
        if not raced:
            raced.append(a.consolidate(older_than=time.time() + 1))
        return found

    monkeypatch.setattr(b, "_locate", locate_then_rewrite)
    digest, data = next(iter(put.items()))
    assert b.read_bytes(digest) == data
    assert raced[0][0] == 20
    assert b.requests["get"] == 2  # the old object (gone, or without it), then the new one
    assert all(b.read_bytes(d) == x for d, x in put.items())


def test_gc_forgets_a_base_and_the_blobs_built_on_it_still_read(request, tmp_path, index,
                                                                 s3_server):
    """A rewritten object's deltas locate their bases themselves: gc removing the rows of
    most of its blobs, the first versions included, leaves the rest readable, and the
    compaction that rewrites the object, now mostly garbage, stores them anew."""
    a = s3_blob_store(request, tmp_path, host="a", index=index)
    put = _edited_history(a)
    a.consolidate(older_than=time.time() + 1)
    order = list(put)
    keep = set(order[-9:])  # the last three versions of each file; everything below goes
    cutoff = time.time() + 1
    for digest in order:
        if digest not in keep:
            assert a.delete(digest, older_than=cutoff) > 0
    b = s3_blob_store(request, tmp_path, host="b", index=index, bucket=_bucket_of(a))
    assert all(b.read_bytes(d) == put[d] for d in keep)  # bases gone from the index
    removed, freed = a.compact(older_than=time.time() + 1)
    assert removed == 1 and freed > 0
    assert len(_packs_of(s3_server, a)) == 1
    c = s3_blob_store(request, tmp_path, host="c", index=index, bucket=_bucket_of(a))
    assert all(c.read_bytes(d) == put[d] for d in keep)
    assert not any(c.has(d) for d in set(order) - keep)


def test_a_bucket_without_bulk_deletes_has_the_old_objects_deleted_one_by_one(
        request, tmp_path, index, s3_server, monkeypatch):
    a = s3_blob_store(request, tmp_path, host="a", index=index)
    put = _edited_history(a, syncs=s3_blobs.CONSOLIDATE_MIN)
    real = s3_blobs.obstore.delete

    def no_bulk(store, paths):
        if not isinstance(paths, str):
            raise OSError("NotImplemented: this server has no DeleteObjects")
        return real(store, paths)

    monkeypatch.setattr(s3_blobs.obstore, "delete", no_bulk)
    assert a.consolidate(older_than=time.time() + 1)[0] == s3_blobs.CONSOLIDATE_MIN
    assert len(_packs_of(s3_server, a)) == 1
    assert a.requests["delete"] == 1 + s3_blobs.CONSOLIDATE_MIN  # the refused one, then each
    b = s3_blob_store(request, tmp_path, host="b", index=index, bucket=_bucket_of(a))
    assert all(b.read_bytes(d) == data for d, data in put.items())


def test_gc_rewrites_the_small_packs_of_a_host_that_never_rested(request, tmp_path, index,
                                                                 s3_server):
    """Host b uploaded and went away without resting; gc on host a, whose cache knows
    none of b's bases, rewrites b's packs with the bases the trees give (``hints``),
    asked for only when there is something to rewrite."""
    b = s3_blob_store(request, tmp_path, host="b", index=index)
    put = _edited_history(b)
    a = s3_blob_store(request, tmp_path, host="a", index=index, bucket=_bucket_of(b))
    order = list(put)
    files = 3
    hints = {d: order[i - files] for i, d in enumerate(order) if i >= files}
    asked = []

    def hints_of():
        asked.append(1)
        return hints

    assert a.consolidate(older_than=time.time() + 1, hints=hints_of) == (0, 0, 0)  # not a's
    assert asked == []
    done, read, written = a.consolidate(older_than=time.time() + 1, any_host=True,
                                        hints=hints_of)
    assert done == 20 and written < read / 4 and asked == [1]
    rows = index.locate_blobs(order)
    assert sum(loc.codec == "delta" for loc in rows.values()) >= len(put) - files
    c = s3_blob_store(request, tmp_path, host="c", index=index, bucket=_bucket_of(b))
    assert all(c.read_bytes(d) == data for d, data in put.items())


@pytest.mark.parametrize("goes_on", [0, 20], ids=["while-reading", "while-encoding"])
def test_a_rewrite_told_to_stop_changes_nothing(request, tmp_path, index, s3_server, goes_on):
    """A call arriving while a host rewrites at rest (``keep_going`` turns false) stops
    it before its upload, whether it was still reading the objects or already encoding
    (asked every ``ASK_EVERY`` entries): nothing is put, moved or deleted."""
    a = s3_blob_store(request, tmp_path, host="a", index=index)
    put = _edited_history(a, files=4)  # 80 blobs: the encoding is asked at least once
    assert len(put) > bucket_packs.ASK_EVERY
    keys, rows = _packs_of(s3_server, a), index.locate_blobs(sorted(put))
    puts = a.requests["put"]
    asked = []

    def keep_going():
        asked.append(1)
        return len(asked) <= goes_on

    assert a.consolidate(keep_going, older_than=time.time() + 1) == (0, 0, 0)
    assert len(asked) == goes_on + 1  # stopped at the first "no"
    assert (_packs_of(s3_server, a), index.locate_blobs(sorted(put))) == (keys, rows)
    assert a.requests["put"] == puts
    assert a.consolidate(older_than=time.time() + 1)[0] == 20  # at the next rest


def test_a_rewrite_deletes_no_object_a_checkpoint_recorded_a_row_in_meanwhile(
        request, tmp_path, index, s3_server, monkeypatch):
    """gc forgot a blob's row; while a host rewrites its packs, a checkpoint records
    that blob again in the object it was in (a pack of the very same bytes, uploaded
    again): the rewrite's transaction does not forget that object, so the object stays
    in the bucket and the blob reads on every host."""
    a = s3_blob_store(request, tmp_path, host="a", index=index)
    put = _edited_history(a)
    digest = next(iter(put))
    loc = index.locate_blobs([digest])[digest]
    assert a.delete(digest, older_than=time.time() + 1) > 0
    rewrite = index.rewrite_blobs

    def recorded_meanwhile(new, read_from):
        assert digest not in read_from  # the rewrite read it as gone
        index.add_blob_object(loc.object, 1, "b", time.time(),
                              [(digest, loc.off, loc.len, loc.size, loc.codec)])
        return rewrite(new, read_from)

    monkeypatch.setattr(index, "rewrite_blobs", recorded_meanwhile)
    assert a.consolidate(older_than=time.time() + 1)[0] == 20
    assert f"fleet/{loc.object}" in s3_server.keys(_bucket_of(a))  # kept: a row names it
    assert len(_packs_of(s3_server, a)) == 2
    b = s3_blob_store(request, tmp_path, host="b", index=index, bucket=_bucket_of(a))
    assert all(b.read_bytes(d) == data for d, data in put.items())


@pytest.mark.parametrize("kind", ["pack", "large"])
def test_gc_deletes_no_object_a_host_uploads_the_same_bytes_as_meanwhile(
        request, tmp_path, index, s3_server, monkeypatch, kind):
    """gc forgot every blob of an object and deletes it; meanwhile, between gc's look
    at the index and its DELETE, another host uploads the very same blobs again (the
    same pack's bytes, or the same large file) and records them. Its upload has a name
    of its own (pack_name), so the DELETE takes only the old object and every blob
    reads on every host (before 0.7.16 the names were the content's: the upload found
    the old object there, recorded it, and lost it to the DELETE)."""
    data = ([b"file %d\n" % i * 50 for i in range(10)] if kind == "pack"
            else [os.urandom(s3_blobs.ALONE + 1)])
    a = s3_blob_store(request, tmp_path, host="a", index=index)
    digests = [a.put_bytes(x) for x in data]
    a.sync()
    old = s3_server.keys(_bucket_of(a))
    assert all(a.delete(d, older_than=time.time() + 1) > 0 for d in digests)
    b = s3_blob_store(request, tmp_path, host="b", index=index, bucket=_bucket_of(a))
    delete = a._delete_objects

    def after_b_uploaded(names):
        for x in data:
            b.put_bytes(x)
        b.sync()  # uploaded and recorded, after gc decided
        delete(names)

    monkeypatch.setattr(a, "_delete_objects", after_b_uploaded)
    assert a.compact(older_than=time.time() + 1)[0] == 1
    keys = s3_server.keys(_bucket_of(a))
    assert len(keys) == 1 and keys != old
    c = s3_blob_store(request, tmp_path, host="c", index=index, bucket=_bucket_of(a))
    assert [c.read_bytes(d) for d in digests] == data


@pytest.fixture
def silent_bucket(s3_server, monkeypatch):
    """An endpoint that accepts connections and never answers (a bucket hung behind a
    load balancer), in place of the emulator's for the stores made after it."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held: list[socket.socket] = []

    def accept():
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:  # closed: the test is over
                return

    threading.Thread(target=accept, daemon=True).start()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{server.getsockname()[1]}")
    yield held
    server.close()
    for conn in held:
        conn.close()


def test_a_bucket_that_never_answers_fails_a_call_after_one_request_timeout(
        tmp_path, index, silent_bucket):
    """A PUT and a GET to a bucket that hangs each fail as UNAVAILABLE once one request
    has timed out (``request_seconds``), not after the SDK's 3 minutes of retried GETs;
    and the environment's client settings (AWS_ALLOW_HTTP here, for the plain-HTTP
    endpoint) still hold beside the store's own."""
    from worldline.daemon.storage.s3_blobs import S3BlobStore
    a = S3BlobStore("s3://hung/fleet", LocalBlobStore(str(tmp_path / "cache-a")), index, "a",
                    stage_bytes=0, request_seconds=1.0)
    a.put_bytes(b"x" * 100)
    start = time.monotonic()
    with pytest.raises(Unavailable, match="did not answer PUT"):
        a.sync()
    assert 1.0 <= time.monotonic() - start < 3.0
    _read_from_elsewhere_fails_within(a, index, 1.0, 3.0)
    assert len(silent_bucket) == 2  # one connection each: neither was tried again


def _read_from_elsewhere_fails_within(store, index, least: float, most: float) -> None:
    """A read of a blob another host put in the bucket fails UNAVAILABLE within
    [least, most) seconds."""
    digest = hashlib.sha256(b"y" * 100).hexdigest()
    index.add_blob_object("packs/elsewhere.pack", 100, "b", time.time(),
                          [(digest, 0, 100, 100, "raw")])
    start = time.monotonic()
    with pytest.raises(Unavailable, match="did not answer GET"):
        store.read_bytes(digest)
    assert least <= time.monotonic() - start < most


def test_a_timeout_the_environment_sets_is_not_retried_either(tmp_path, index,
                                                              silent_bucket, monkeypatch):
    """AWS_TIMEOUT shorter than the store's own request timeout: a GET to a bucket
    that hangs still fails after that one timeout, with one connection (the retries'
    window follows the timeout that holds, not the 30 s default's 18 s)."""
    from worldline.daemon.storage.s3_blobs import S3BlobStore
    monkeypatch.setenv("AWS_TIMEOUT", "1s")
    a = S3BlobStore("s3://hung/fleet", LocalBlobStore(str(tmp_path / "cache-a")), index, "a")
    _read_from_elsewhere_fails_within(a, index, 1.0, 3.0)
    assert len(silent_bucket) == 1


def test_durations_are_read_as_the_sdk_spells_them():
    from worldline.daemon.storage.s3_blobs import duration_seconds
    assert duration_seconds("30s") == 30.0
    assert duration_seconds("500ms") == 0.5
    assert duration_seconds("1m 30s") == duration_seconds("1m30s") == 90.0
    assert duration_seconds("1.5s") == 1.5
    for unreadable in ("30", "soon", "1H", "", "0s", "5s later"):
        assert duration_seconds(unreadable) is None


def test_a_setting_the_sdk_cannot_take_is_a_clear_error(tmp_path, index, s3_server,
                                                        monkeypatch):
    from worldline.daemon.storage.s3_blobs import S3BlobStore
    monkeypatch.setenv("AWS_TIMEOUT", "soon")
    with pytest.raises(InvalidArgument, match="AWS_.*not valid.*soon"):
        S3BlobStore("s3://b/fleet", LocalBlobStore(str(tmp_path / "cache")), index, "a")
