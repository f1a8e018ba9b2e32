"""0.7.15: a checkpoint's small pack is staged in the metadata store, in the checkpoint's
own transaction, instead of a PUT on the checkpoint's path; the host moves staged
objects to the bucket as one object once they are due, and at rest with deltas. Every
host reads a staged blob verified, a kill at any step loses nothing, and a read racing
a move finds the blob where it went. On the S3 emulator with both SQL indexes."""

from __future__ import annotations

import os
import sqlite3
import time

import pytest
from worldline.client.errors import Aborted, DataLoss, Unavailable
from worldline.daemon.storage import s3_blobs
from worldline.daemon.storage.blob_index import is_staged
from worldline.daemon.storage.s3_blobs import STAGE_BYTES
from worldline.daemon.storage.sqlite_store import SqliteStore

from .test_blob_contract import corrupt_in_bucket, s3_blob_store
from .test_s3_blobs import _bucket_of, _edited_history, _packs_of, obstore_get
from .test_store_contract import make_cp, new_session


def _staging(request, tmp_path, index, host="a", bucket=None):
    return s3_blob_store(request, tmp_path, host=host, index=index, bucket=bucket,
                         stage_bytes=STAGE_BYTES)


def _where(index, digests) -> set[str]:
    return {loc.object.split("/")[0] for loc in index.locate_blobs(list(digests)).values()}


def test_a_checkpoints_pack_is_staged_in_its_transaction_and_read_anywhere(
        request, tmp_path, index, s3_server):
    a = _staging(request, tmp_path, index)
    s, first = new_session(index)
    put = {a.put_bytes(b"an agent's edit %d\n" % i * 40): b"an agent's edit %d\n" % i * 40
           for i in range(5)}
    with a.committing() as objects:
        (staged,) = objects
        assert is_staged(staged.name) and staged.body is not None
        assert a.requests["put"] == 0 and not index.locate_blobs(list(put))
        cp = index.append_checkpoint(make_cp(s.id, first.id), [], first.id, None, [], objects)
    assert _where(index, put) == {"staged"} and s3_server.keys(_bucket_of(a)) == []
    assert a.staged() == (1, staged.nbytes)
    b = _staging(request, tmp_path, index, host="b", bucket=_bucket_of(a))
    assert all(b.read_bytes(d) == data for d, data in put.items())
    assert b.requests["get"] == 0  # read from the metadata store, verified
    # A checkpoint that loses its compare-and-set records its staged object on its own.
    e = a.put_bytes(b"staged for a checkpoint that is refused")
    with pytest.raises(Aborted):
        with a.committing() as objects:
            index.append_checkpoint(make_cp(s.id, cp.id), [], "moved", None, [], objects)
    assert _where(index, [e]) == {"staged"} and b.read_bytes(e).startswith(b"staged for")


def test_a_large_pack_or_a_full_stage_is_put(request, tmp_path, index, s3_server,
                                             monkeypatch):
    a = _staging(request, tmp_path, index)
    big = [a.put_bytes(os.urandom(4096)) for _ in range(300)]  # 1.2 MB, incompressible
    a.sync()
    assert _where(index, big) == {"packs"} and a.staged() == (0, 0)
    monkeypatch.setattr(s3_blobs, "STAGE_LIMIT", 2000)
    first = a.put_bytes(os.urandom(1500))
    a.sync()
    second = a.put_bytes(os.urandom(1000))  # over the host's limit with the first
    a.sync()
    assert _where(index, [first]) == {"staged"} and _where(index, [second]) == {"packs"}
    assert a.staged() == (1, 1500)


def test_staged_objects_move_to_the_bucket_as_one_when_due(request, tmp_path, index,
                                                           s3_server, monkeypatch):
    a = _staging(request, tmp_path, index)
    put = _edited_history(a, syncs=6)
    assert a.flush_staged() == (0, 0)  # not due: few, small and young
    assert s3_server.keys(_bucket_of(a)) == []
    monkeypatch.setattr(s3_blobs, "FLUSH_OBJECTS", 6)
    moved, nbytes = a.flush_staged()
    assert moved == 6 and nbytes > 0 and a.requests["put"] == 1
    assert _where(index, put) == {"packs"} and a.staged() == (0, 0)
    assert index.staged_objects(None, float("inf")) == []  # the bytes left the store
    c = _staging(request, tmp_path, index, host="c", bucket=_bucket_of(a))
    assert all(c.read_bytes(d) == data for d, data in put.items())
    assert c.requests["get"] == 1
    monkeypatch.setattr(s3_blobs, "FLUSH_SECONDS", 0.0)  # due by age: the next sync's
    d = a.put_bytes(b"one more edit")
    a.sync()
    assert a.flush_staged() == (1, len(b"one more edit")) and _where(index, [d]) == {"packs"}


def test_a_move_puts_objects_small_enough_to_be_rewritten_at_rest(
        request, tmp_path, index, s3_server, monkeypatch):
    a = _staging(request, tmp_path, index)
    put = {}
    for _ in range(5):
        data = os.urandom(1500)  # a staged object of 1,500 bytes each (raw)
        put[a.put_bytes(data)] = data
        a.sync()
    monkeypatch.setattr(s3_blobs, "FLUSH_BYTES", 3000)
    assert a.flush_staged() == (5, 7500)  # due: 7,500 bytes staged
    sizes = sorted(len(obstore_get(a, k[len("fleet/"):]))
                   for k in _packs_of(s3_server, a))
    assert sizes == [1500, 3000, 3000] and a.requests["put"] == 3
    later = _staging(request, tmp_path, index, bucket=_bucket_of(a))  # a's next run
    assert later.consolidate(older_than=time.time() + 1)[0] == 0  # 3 packs: too few
    last = os.urandom(1000)  # a checkpoint more, staged, then moved: 4 moved objects
    put[a.put_bytes(last)] = last
    a.sync()
    assert a.flush_staged(due_only=False) == (1, 1000) and len(a._moved) == 4
    # Moved by this run: rewritten at rest however few, once.
    assert a.consolidate(older_than=time.time() + 1)[:2] == (4, 8500)
    assert a.consolidate(older_than=time.time() + 1)[0] == 0
    b = _staging(request, tmp_path, index, host="b", bucket=_bucket_of(a))
    assert all(b.read_bytes(d) == data for d, data in put.items())
    # One moved object alone rewrites to its very bytes: nothing to gain, not tried again.
    c = _staging(request, tmp_path, index, host="c")
    c.put_bytes(os.urandom(100))
    c.sync()
    assert c.flush_staged(due_only=False)[0] == 1 and c._moved
    assert c.consolidate(older_than=time.time() + 1) == (0, 0, 0) and not c._moved


def test_a_restarted_host_moves_what_an_earlier_run_staged(request, tmp_path, index,
                                                            s3_server):
    a = _staging(request, tmp_path, index)
    put = _edited_history(a, syncs=3)
    again = _staging(request, tmp_path, index, bucket=_bucket_of(a))  # the same host, later
    other = _staging(request, tmp_path, index, host="b", bucket=_bucket_of(a))
    assert again.staged()[0] == 3 and other.staged() == (0, 0)
    assert again.flush_staged(due_only=False)[0] == 3 and _where(index, put) == {"packs"}


@pytest.mark.parametrize("killed", ["after-the-put", "before-the-put"])
def test_a_move_killed_midway_loses_nothing(request, tmp_path, index, s3_server,
                                             monkeypatch, killed):
    a = _staging(request, tmp_path, index)
    put = _edited_history(a, syncs=5)

    def die(*args, **kwargs):
        raise SystemExit("killed")

    monkeypatch.setattr(index if killed == "after-the-put" else a, "rewrite_blobs"
                        if killed == "after-the-put" else "_put_object", die)
    with pytest.raises(SystemExit):
        a.flush_staged(due_only=False)
    monkeypatch.undo()
    assert _where(index, put) == {"staged"}
    assert len(_packs_of(s3_server, a)) == (1 if killed == "after-the-put" else 0)
    b = _staging(request, tmp_path, index, host="b", bucket=_bucket_of(a))
    assert all(b.read_bytes(d) == data for d, data in put.items())
    a = _staging(request, tmp_path, index, bucket=_bucket_of(a))  # restarted
    assert a.flush_staged(due_only=False)[0] == 5 and _where(index, put) == {"packs"}
    time.sleep(1.1)  # the bucket's times are in whole seconds
    removed, _ = a.compact(older_than=time.time())
    # the orphan of the killed move, unless the move made the very same bytes
    assert len(_packs_of(s3_server, a)) == 1 and removed <= 1
    c = _staging(request, tmp_path, index, host="c", bucket=_bucket_of(a))
    assert all(c.read_bytes(d) == data for d, data in put.items())


def test_a_read_racing_a_move_finds_the_blob_where_it_went(request, tmp_path, index,
                                                            s3_server, monkeypatch):
    a = _staging(request, tmp_path, index)
    put = _edited_history(a, syncs=4)
    b = _staging(request, tmp_path, index, host="b", bucket=_bucket_of(a))
    locate = b._locate
    raced = []

    def locate_then_move(digest):
        found = locate(digest)
        if not raced:
            raced.append(a.flush_staged(due_only=False))
        return found

    monkeypatch.setattr(b, "_locate", locate_then_move)
    digest, data = next(iter(put.items()))
    assert b.read_bytes(digest) == data
    assert raced[0][0] == 4 and b.requests["get"] == 1  # the staged row gone: the bucket's
    assert all(b.read_bytes(d) == x for d, x in put.items())


def test_checkpoints_stage_while_the_bucket_is_away(request, tmp_path, index, s3_server,
                                                    monkeypatch):
    """The bucket away: a small checkpoint still commits (nothing to PUT), moving fails
    and changes nothing, and the move succeeds once the bucket is back."""
    a = _staging(request, tmp_path, index)

    def away(name, body):
        raise Unavailable("the bucket is away")

    monkeypatch.setattr(a, "_put_object", away)
    put = _edited_history(a, syncs=3)
    assert _where(index, put) == {"staged"}
    with pytest.raises(Unavailable):
        a.flush_staged(due_only=False)
    assert a.staged()[0] == 3 and _where(index, put) == {"staged"}
    monkeypatch.undo()
    assert a.flush_staged(due_only=False)[0] == 3 and _where(index, put) == {"packs"}


def test_gc_forgets_staged_blobs_and_moves_a_gone_hosts(request, tmp_path, index,
                                                        s3_server):
    """gc's delete of a staged blob's row keeps the rest; a staged object with nothing
    live is forgotten with its bytes (no request to the bucket); gc's rewrite takes a
    host's staged objects however few they are, into one object with deltas."""
    a = _staging(request, tmp_path, index)
    put = _edited_history(a, syncs=4)
    order = list(put)
    gone = order[:3]  # the first sync's blobs: its object has nothing live left
    for digest in gone:
        assert a.delete(digest, older_than=time.time() + 1) > 0
    removed, _ = a.compact(older_than=time.time() + 1)
    assert removed == 1 and a.requests["delete"] == 0 and a.staged()[0] == 3
    g = _staging(request, tmp_path, index, host="g", bucket=_bucket_of(a))  # gc elsewhere
    done, _, after = g.consolidate(older_than=time.time() + 1, any_host=True)
    assert done == 3 and after > 0 and index.staged_objects(None, float("inf")) == []
    c = _staging(request, tmp_path, index, host="c", bucket=_bucket_of(a))
    assert all(c.read_bytes(d) == put[d] for d in order[3:])
    assert not any(c.has(d) for d in gone)


def test_a_staged_entry_that_does_not_match_is_data_loss(request, tmp_path, index,
                                                         s3_server):
    a = _staging(request, tmp_path, index)
    d = a.put_bytes(b"kept in the metadata store until it moves" * 20)
    a.sync()
    corrupt_in_bucket(a, d)
    b = _staging(request, tmp_path, index, host="b", bucket=_bucket_of(a))
    with pytest.raises(DataLoss):
        b.read_bytes(d)
    assert not b.cache.has(d)  # nothing unverified reaches the cache


def test_a_blob_index_of_0_7_14_gains_the_column_once(request, tmp_path):
    path = str(tmp_path / "meta.db")
    old = SqliteStore(path)
    old.add_blob_object("packs/old.pack", 5, "a", 1.0, [("d" * 64, 0, 5, 5, "raw")])
    old.close()
    db = sqlite3.connect(path)
    db.execute("ALTER TABLE blob_objects DROP COLUMN body")
    db.execute("UPDATE meta SET value = '12' WHERE key = 'schema_version'")
    db.commit()
    db.close()
    for _ in range(2):
        store = SqliteStore(path)
        assert store.schema_found in (12, store.schema_version)
        assert store.object_entries("packs/old.pack")[0][0] == "d" * 64
        store.close()
    store = SqliteStore(path)
    store.add_blob_object("staged/new.pack", 3, "a", 2.0, [("e" * 64, 0, 3, 3, "raw")],
                          b"new")
    assert store.staged_body("staged/new.pack") == b"new"
    store.close()


def test_a_postgres_blob_index_of_0_7_14_gains_the_column_once(postgres_url):
    from worldline.daemon.storage.postgres_store import SCHEMA_VERSION, PostgresStore
    old = PostgresStore(postgres_url)
    old.add_blob_object("packs/old.pack", 5, "a", 1.0, [("d" * 64, 0, 5, 5, "raw")])
    with old._tx() as db:
        db.execute("ALTER TABLE blob_objects DROP COLUMN body")
        db.execute("UPDATE meta SET value = '11' WHERE key = 'schema_version'")
    old.close()
    store = PostgresStore(postgres_url)
    assert (store.schema_found, store.schema_version) == (11, SCHEMA_VERSION)
    store.add_blob_object("staged/new.pack", 3, "a", 2.0, [("e" * 64, 0, 3, 3, "raw")],
                          b"new")
    assert store.staged_body("staged/new.pack") == b"new"
    assert store.object_entries("packs/old.pack")[0][0] == "d" * 64
    store.close()
