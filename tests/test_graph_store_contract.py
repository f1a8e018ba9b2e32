"""The GraphStore contract (daemon/storage/graph_checkpoints.py), run against every
backend."""

from __future__ import annotations

import json

import pytest
from worldline.daemon.storage.crypto import DataKey
from worldline.daemon.storage.graph_checkpoints import (
    GraphBlob,
    GraphCheckpoint,
    GraphQuery,
    GraphWrite,
    Typed,
)
from worldline.daemon.storage.graph_store import MemoryGraphStore, SqliteGraphStore

KEY = DataKey(bytes(range(32)))


@pytest.fixture(params=["memory", "sqlite", "postgres", "sqlite+key", "postgres+key"])
def store(request, tmp_path):
    """"+key": values sealed with a data key (sealed.py), the contract the same."""
    kind, _, keyed = request.param.partition("+")
    key = KEY if keyed else None
    if kind == "postgres":
        from worldline.daemon.storage.graph_store import PostgresGraphStore
        s = PostgresGraphStore(request.getfixturevalue("postgres_url"), key=key)
    elif kind == "sqlite":
        s = SqliteGraphStore(str(tmp_path / "graphs.db"), key=key)
    else:
        s = MemoryGraphStore()
    yield s
    s.close()


def cp(thread: str, cid: str, ns: str = "", parent: str | None = None,
       versions: dict | None = None, **metadata) -> GraphCheckpoint:
    return GraphCheckpoint(thread, ns, cid, parent, Typed("json", cid.encode()),
                           json.dumps(metadata), versions or {}, None, "2026-01-01T00:00:00Z")


def blob(thread: str, channel: str, version: str, value: bytes, ns: str = "") -> GraphBlob:
    return GraphBlob(thread, ns, channel, version, Typed("bytes", value))


def write(thread: str, cid: str, task: str, idx: int, channel: str, value: bytes,
          ns: str = "") -> GraphWrite:
    return GraphWrite(thread, ns, cid, task, idx, channel, Typed("bytes", value), "p")


def ids(rows) -> list[str]:
    return [r.checkpoint_id for r in rows]


def test_a_thread_is_bound_once(store):
    assert store.thread_session("t") is None
    assert store.bind_thread("t", "S1") == "S1"
    assert store.bind_thread("t", "S2") == "S1"
    assert store.thread_session("t") == "S1"


def test_checkpoints_round_trip_and_a_re_put_replaces(store):
    store.put_checkpoint(cp("t", "a", versions={"x": "1"}, step=1), [blob("t", "x", "1", b"v1")])
    store.put_checkpoint(cp("t", "a", versions={"x": "1"}, step=2), [blob("t", "x", "1", b"no")])
    [got] = store.checkpoints(GraphQuery("t", ""))
    assert got.metadata == {"step": 2} and got.checkpoint == Typed("json", b"a")
    assert got.versions == {"x": "1"} and got.parent_id is None
    # a blob is immutable once stored: the second put does not replace it
    assert [b.value.data for b in store.blobs("t", "", {"x": "1"})] == [b"v1"]
    assert store.blobs("t", "", {"x": "9"}) == []


def test_order_pages_and_filters(store):
    for i, source in enumerate(["input", "loop", "loop", "update", "loop"]):
        store.put_checkpoint(cp("t", f"c{i}", step=i, source=source), [])
    store.put_checkpoint(cp("u", "c9", step=9), [])
    store.put_checkpoint(cp("t", "c2", ns="child:1"), [])
    assert ids(store.checkpoints(GraphQuery("t", ""))) == ["c4", "c3", "c2", "c1", "c0"]
    assert ids(store.checkpoints(GraphQuery("t", None))) == ["c4", "c3", "c2", "c2", "c1", "c0"]
    assert ids(store.checkpoints(GraphQuery(None, None))) == [
        "c9", "c4", "c3", "c2", "c2", "c1", "c0"]
    assert ids(store.checkpoints(GraphQuery("t", "", before_id="c3"))) == ["c2", "c1", "c0"]
    # the filter applies before the limit
    loops = store.checkpoints(GraphQuery("t", "", filter={"source": "loop"}, limit=2))
    assert ids(loops) == ["c4", "c2"]
    assert ids(store.checkpoints(GraphQuery("t", "", filter={"source": "loop", "step": 1}))) == [
        "c1"]
    assert store.checkpoints(GraphQuery("t", "", filter={"missing": None})) == []
    # pages resume after the last key, ties between threads and namespaces included
    first = store.checkpoints(GraphQuery(None, None, limit=4))
    rest = store.checkpoints(GraphQuery(None, None, limit=4, after=first[-1].order))
    assert [r.key for r in first + rest] == [r.key for r in store.checkpoints(
        GraphQuery(None, None))]
    assert ids(store.checkpoints(GraphQuery("t", "", checkpoint_id="c1"))) == ["c1"]


def test_writes_are_idempotent_and_special_ones_replaced(store):
    store.put_checkpoint(cp("t", "a"), [])
    store.put_writes([write("t", "a", "task", 0, "ch", b"first"),
                      write("t", "a", "task", -1, "__error__", b"e1")])
    store.put_writes([write("t", "a", "task", 0, "ch", b"retried"),
                      write("t", "a", "task", -1, "__error__", b"e2")])
    got = {(w.idx, w.channel): w.value.data for w in store.writes("t", "", "a")}
    assert got == {(0, "ch"): b"first", (-1, "__error__"): b"e2"}
    assert store.writes("t", "child", "a") == []


def test_deleting_checkpoints_takes_their_writes_and_unnamed_blobs(store):
    store.put_checkpoint(cp("t", "a", versions={"x": "1", "y": "1"}, run_id="r1"),
                         [blob("t", "x", "1", b"x1"), blob("t", "y", "1", b"y1")])
    store.put_checkpoint(cp("t", "b", parent="a", versions={"x": "2", "y": "1"}, run_id="r2"),
                         [blob("t", "x", "2", b"x2")])
    store.put_writes([write("t", "a", "task", 0, "ch", b"w")])
    assert store.delete_runs(["r1"]) == 1
    assert ids(store.checkpoints(GraphQuery("t", ""))) == ["b"]
    assert store.writes("t", "", "a") == []
    assert store.blobs("t", "", {"x": "1"}) == []  # named by no remaining checkpoint
    assert [b.value.data for b in store.blobs("t", "", {"x": "2", "y": "1"})] == [b"x2", b"y1"]
    assert store.delete_runs(["nope"]) == 0


def test_keep_latest_per_namespace_and_delete_threads(store):
    for thread in ("t", "u"):
        for i in range(3):
            store.put_checkpoint(cp(thread, f"c{i}", versions={"x": str(i)}),
                                 [blob(thread, "x", str(i), b"v")])
        store.put_checkpoint(cp(thread, "c1", ns="child"), [])
    assert store.keep_latest(["t"]) == 2
    assert [r.key for r in store.checkpoints(GraphQuery("t", None))] == [
        ("t", "", "c2"), ("t", "child", "c1")]
    assert store.blobs("t", "", {"x": "0"}) == [] and store.blobs("t", "", {"x": "2"}) != []
    assert len(store.checkpoints(GraphQuery("u", None))) == 4
    assert store.delete_threads(["u", "nobody"]) == 4
    assert store.checkpoints(GraphQuery("u", None)) == []
    assert store.blobs("u", "", {"x": "2"}) == []
    assert store.keep_latest(["nobody"]) == 0


def test_copy_thread_copies_everything_and_leaves_the_source(store):
    store.put_checkpoint(cp("t", "a", versions={"x": "1"}), [blob("t", "x", "1", b"v")])
    store.put_checkpoint(cp("t", "a", ns="child"), [])
    store.put_writes([write("t", "a", "task", 0, "ch", b"w")])
    assert store.copy_thread("t", "u") == 2
    assert [r.key for r in store.checkpoints(GraphQuery("u", None))] == [
        ("u", "child", "a"), ("u", "", "a")]
    assert [w.value.data for w in store.writes("u", "", "a")] == [b"w"]
    assert [b.value.data for b in store.blobs("u", "", {"x": "1"})] == [b"v"]
    assert len(store.checkpoints(GraphQuery("t", None))) == 2
    store.delete_threads(["u"])
    assert [b.value.data for b in store.blobs("t", "", {"x": "1"})] == [b"v"]
