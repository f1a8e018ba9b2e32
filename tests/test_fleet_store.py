"""PostgreSQL as the fleet's shared store: what must hold with several daemons writing
at once, the versioned schema, and a server that goes away and comes back. Two
``PostgresStore`` objects on one database stand in for two hosts."""

from __future__ import annotations

import os
import threading
import time

import pytest
from worldline.client.errors import Aborted, FailedPrecondition, Unavailable
from worldline.daemon import ids
from worldline.daemon.records import GENESIS_HASH, AuditEvent, Checkpoint, ToolCall, chain_hash
from worldline.daemon.storage import postgres_store, sqlite_store
from worldline.daemon.storage.postgres_store import PostgresStore
from worldline.daemon.storage.sqlite_store import SqliteStore

from tests.conftest import run_together
from tests.services import PostgresCluster, UnixRelay
from tests.test_store_contract import make_cp, new_session


@pytest.fixture
def two_hosts(postgres_url):
    a, b = PostgresStore(postgres_url), PostgresStore(postgres_url)
    yield a, b
    a.close()
    b.close()


def test_compare_and_set_across_hosts_loses_all_but_one(two_hosts):
    a, b = two_hosts
    s, first = new_session(a)
    results = []

    def attempt(store):
        try:
            results.append(store.append_checkpoint(make_cp(s.id, first.id), ["{}"], first.id,
                                                   None, []))
        except Aborted as exc:
            results.append(exc)

    run_together([lambda st=st: attempt(st) for st in (a, b) * 6])
    wins = [r for r in results if isinstance(r, Checkpoint)]
    assert len(results) == 12 and len(wins) == 1
    assert a.get_session(s.id).head == b.get_session(s.id).head == wins[0].id
    assert [c.seq for c in b.list_checkpoints(s.id)] == [0, 1]


def test_the_audit_chain_stays_one_chain_with_many_writers(two_hosts):
    a, b = two_hosts

    def write(store, n):
        for i in range(10):
            store.append_audit([AuditEvent("x", None, f"{n}-{i}", {"i": i}, ids.now()),
                                AuditEvent("y", None, f"{n}-{i}", {}, ids.now())])

    run_together([lambda st=st, n=n: write(st, n) for n, st in enumerate((a, b, a, b))])
    events = a.list_audit()
    assert [e.seq for e in events] == list(range(1, 81))
    prev = GENESIS_HASH
    for e in events:
        assert e.prev_hash == prev and chain_hash(prev, e) == e.hash
        prev = e.hash
    # each append's two events are adjacent: one transaction holds the tail
    for x, y in zip(events[::2], events[1::2], strict=True):
        assert (x.kind, y.kind, x.subject_id) == ("x", "y", y.subject_id)


def test_an_approval_is_used_up_once_across_hosts(two_hosts):
    from worldline.daemon.records import Approval
    a, b = two_hosts
    s, first = new_session(a)
    approval = Approval(ids.new_id(), s.id, "deploy", "{}", "approved", first.id, ids.now(),
                        ids.now(), "", ids.now())
    a.add_approval(approval, [])
    outcomes = []

    def cite(store):
        call = ToolCall(ids.new_id(), s.id, "deploy", "{}", None, "external_non_idempotent",
                        None, first.id, ids.now(), "", approval.id)
        try:
            store.add_tool_call(call, [])
            outcomes.append("used")
        except FailedPrecondition:
            outcomes.append("refused")

    run_together([lambda st=st: cite(st) for st in (a, b) * 4])
    assert sorted(outcomes) == ["refused"] * 7 + ["used"]


def test_the_schema_is_versioned_and_migrated_once(postgres_url, tmp_path):
    first = PostgresStore(postgres_url)
    second = PostgresStore(postgres_url)
    assert first.schema_found is None and second.schema_found == first.schema_version
    assert first.schema_version == postgres_store.SCHEMA_VERSION
    with first._tx() as db:
        db.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(FailedPrecondition):
        PostgresStore(postgres_url)
    first.close()
    second.close()
    lite = SqliteStore(str(tmp_path / "meta.db"))
    assert lite.schema_version == sqlite_store.SCHEMA_VERSION
    with lite._tx() as db:
        db.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    lite.close()
    with pytest.raises(FailedPrecondition):
        SqliteStore(str(tmp_path / "meta.db"))


def test_a_server_restart_is_unavailable_then_served_again():
    cluster = PostgresCluster().start()
    try:
        store = PostgresStore(cluster.new_database(), connect_timeout=2.0)
        s, first = new_session(store)
        cluster.stop("immediate")
        with pytest.raises(Unavailable):
            store.append_checkpoint(make_cp(s.id, first.id), [], first.id, None, [])
        with pytest.raises(Unavailable):
            store.get_session(s.id)
        cluster.start()
        # The pool reconnects by itself (with a backoff): calls succeed again, with no
        # new store and no restart of the daemon that holds it.
        deadline = time.monotonic() + 60
        while True:
            try:
                cp = store.append_checkpoint(make_cp(s.id, first.id), [], first.id, None, [])
                break
            except Unavailable:
                assert time.monotonic() < deadline, "the store never came back"
                time.sleep(0.2)
        assert store.get_session(s.id).head == cp.id
        store.close()
    finally:
        cluster.remove()


def test_a_checkpoints_transaction_takes_two_round_trips(pg_cluster, postgres_url,
                                                         tmp_path):
    """On PostgreSQL a checkpoint's transaction is pipelined: its reads (the head, the
    next seq, the audit chain's last link) share one round trip, its writes go with the
    COMMIT. Each round trip of a fleet's checkpoint is a wait on the network: through a
    link that holds each request 0.2 s, the transaction takes two of them."""
    delay = 0.2
    link = UnixRelay(tmp_path / ".s.PGSQL.5432",
                     os.path.join(pg_cluster.dir, ".s.PGSQL.5432"), delay=delay)
    store = PostgresStore(postgres_url.replace(f"host={pg_cluster.dir}", f"host={tmp_path}"))
    try:
        s, first = new_session(store)
        cp = make_cp(s.id, first.id, n_msgs=2, count=2)
        t = time.monotonic()
        cp = store.append_checkpoint(cp, ["a", "b"], first.id, None,
                                     [AuditEvent("checkpoint", s.id, cp.id, {}, ids.now())])
        round_trips = (time.monotonic() - t) / delay
        assert 1.5 < round_trips < 2.5, round_trips
        assert store.get_session(s.id).head == cp.id
        assert store.conversation(cp.id)[-2:] == ["a", "b"]
    finally:
        store.close()
        link.close()


def test_a_deadlock_is_aborted_and_keeps_nothing(postgres_url):
    """A transaction the server rolls back (here a deadlock) is ABORTED, to be tried
    again, not UNAVAILABLE: the server answered."""
    store = PostgresStore(postgres_url)
    with store._tx() as db:
        db.execute("CREATE TABLE pair (k INTEGER PRIMARY KEY, v INTEGER NOT NULL)")
        db.execute("INSERT INTO pair VALUES (1, 0), (2, 0)")
    barrier = threading.Barrier(2)
    errors: list[Exception] = []

    def cross(first: int, second: int) -> None:
        try:
            with store._tx() as db:
                db.execute("UPDATE pair SET v = v + 1 WHERE k = ?", (first,))
                barrier.wait()
                db.execute("UPDATE pair SET v = v + 1 WHERE k = ?", (second,))
        except Exception as exc:
            errors.append(exc)

    run_together([lambda: cross(1, 2), lambda: cross(2, 1)])
    assert len(errors) == 1 and isinstance(errors[0], Aborted), errors
    assert "try again" in str(errors[0])
    assert sorted(store._all("SELECT v FROM pair")) == [(1,), (1,)]  # the loser kept nothing
    store.close()


def test_checkpoints_renewing_rows_a_move_points_elsewhere_never_deadlock(postgres_url):
    """A checkpoint renews the index rows of digests it records again while a host moves
    or rewrites the objects holding them (rewrite_blobs): both take the rows in digest
    order, so neither waits on the other in a cycle (a move once took them in its
    objects' order, and PostgreSQL aborted a checkpoint: deadlock detected)."""
    from worldline.daemon.storage.blob_index import StoredObject
    mover, recorder = PostgresStore(postgres_url), PostgresStore(postgres_url)
    digests = [f"{i:064x}" for i in range(64)]
    backwards = [(d, 10 * n, 10, 10, "raw") for n, d in enumerate(reversed(digests))]
    mover.add_blob_object("staged/first", 640, "a", 1.0, backwards, b"x" * 640)
    errors: list[Exception] = []

    def move() -> None:
        try:
            for i in range(40):
                where = {d: loc.object for d, loc in mover.locate_blobs(digests).items()}
                mover.rewrite_blobs(StoredObject(f"packs/{i}.pack", 640, "a", 2.0 + i,
                                                 backwards), where)
        except Exception as exc:
            errors.append(exc)

    def record() -> None:
        try:
            for i in range(40):
                with recorder._tx() as db:
                    recorder.add_objects(db, [StoredObject(
                        f"staged/again-{i}", 640, "b", time.time(), list(reversed(backwards)),
                        b"y" * 640)])
        except Exception as exc:
            errors.append(exc)

    run_together([move, record])
    assert errors == []
    mover.close()
    recorder.close()
