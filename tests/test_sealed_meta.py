"""The metadata stores with a data key: the agent's content sealed at rest (sealed.py).

A canary string written through every sealed column is not found in the bytes the
store keeps (SQLite's file and its log; every text and bytea column of PostgreSQL),
and is found there without a key (so the search can fail). A value moved to another
row, written in the clear, or read with another key is DataLoss; a wrong or missing
key is refused at open, nothing read."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from worldline.client.errors import DataLoss, FailedPrecondition, InvalidArgument
from worldline.daemon import ids
from worldline.daemon.records import Approval, AuditEvent, Checkpoint, Task, ToolCall
from worldline.daemon.storage.crypto import DataKey
from worldline.daemon.storage.graph_store import (
    GraphBlob,
    GraphCheckpoint,
    GraphQuery,
    GraphWrite,
    Typed,
)
from worldline.daemon.storage.sealed import Columns
from worldline.daemon.storage.sqlite_store import SqliteStore

from .conftest import DaemonProcess
from .test_store_contract import make_cp, new_session

CANARY = "canary-7f3a1c-do-not-leak"
KEY = DataKey(bytes(range(32)))
OTHER = DataKey(bytes(range(1, 33)))


def open_store(kind: str, request, tmp_path, key):
    if kind == "sqlite":
        return SqliteStore(str(tmp_path / "meta.db"), key=key)
    from worldline.daemon.storage.postgres_store import PostgresStore
    return PostgresStore(request.getfixturevalue("postgres_url"), key=key)


def open_graphs(kind: str, request, tmp_path, key):
    if kind == "sqlite":
        from worldline.daemon.storage.graph_store import SqliteGraphStore
        return SqliteGraphStore(str(tmp_path / "graphs.db"), key=key)
    from worldline.daemon.storage.graph_store import PostgresGraphStore
    return PostgresGraphStore(request.getfixturevalue("postgres_url"), key=key)


def write_everything(store, graphs) -> Checkpoint:
    """The canary in every column that is sealed; the checkpoint that holds it."""
    session, first = new_session(store)
    c = CANARY
    cp = Checkpoint(ids.new_id(), session.id, 0, first.id, "checkpoint", ids.now(), "0" * 64,
                    0, "0" * 64, "0" * 64, first.id, 1, 1, label=f"label {c}",
                    reasoning=f"reasoning {c}", resume=json.dumps({"entry": c}),
                    warnings=(f"warning {c}",))
    store.append_checkpoint(cp, [json.dumps({"role": "user", "content": c})], first.id,
                            [Task("t1", f"title {c}", None, "pending", f"note {c}", ids.now())],
                            [AuditEvent("checkpoint", session.id, cp.id, {"label": c},
                                        ids.now())])
    store.set_task(session.id, Task("t2", f"sub {c}", "t1", "pending", c, ids.now()),
                   [AuditEvent("task", session.id, "t2", {"title": c}, ids.now())])
    approval = Approval(ids.new_id(), session.id, "send_email", json.dumps({"to": c}),
                        "pending", cp.id, ids.now(), ids.now())
    store.add_approval(approval, [])
    store.add_tool_call(ToolCall(ids.new_id(), session.id, "search", json.dumps({"q": c}),
                                 json.dumps({"hit": c}), "read_only", f"key {c}", cp.id,
                                 ids.now()), [AuditEvent("tool_call.replay", session.id, "x",
                                                         {"idempotency_key": c}, ids.now())])
    graphs.put_checkpoint(GraphCheckpoint("th", "", "g1", None, Typed("json", c.encode()),
                                          json.dumps({"run_id": "r1", "note": c}), {"m": "1"},
                                          cp.id, ids.now()),
                          [GraphBlob("th", "", "m", "1", Typed("json", c.encode()))])
    graphs.put_writes([GraphWrite("th", "", "g1", "task", 0, "m", Typed("json", c.encode()))])
    return cp


def found_in_sqlite(tmp_path: Path) -> bool:
    kept = b"".join(p.read_bytes() for p in sorted(tmp_path.iterdir())
                    if p.name.startswith(("meta.db", "graphs.db")))
    return CANARY.encode() in kept


def found_in_postgres(url: str) -> bool:
    import psycopg
    with psycopg.connect(url) as db:
        columns = db.execute("SELECT table_name, column_name FROM information_schema.columns"
                             " WHERE table_schema = 'public'"
                             " AND data_type IN ('text', 'bytea')").fetchall()
        assert len(columns) > 20  # every table's, the sealed ones among them
        for table, column in columns:
            for (value,) in db.execute(f'SELECT "{column}" FROM "{table}"'):
                raw = value.encode() if isinstance(value, str) else bytes(value or b"")
                if CANARY.encode() in raw:
                    return True
    return False


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
@pytest.mark.parametrize("keyed", [True, False])
def test_no_canary_in_what_the_store_keeps_with_a_key(kind, keyed, request, tmp_path):
    key = KEY if keyed else None
    store = open_store(kind, request, tmp_path, key)
    graphs = open_graphs(kind, request, tmp_path, key)
    try:
        cp = write_everything(store, graphs)
        # every value reads back as written
        assert store.get_checkpoint(cp.id).label == f"label {CANARY}"
        assert CANARY in store.conversation(cp.id)[0]
        assert {t.title for t in store.list_tasks(cp.session_id)} == {
            f"title {CANARY}", f"sub {CANARY}"}
        [call] = store.list_tool_calls(cp.session_id)
        assert (call.args_json, call.idempotency_key) == (json.dumps({"q": CANARY}),
                                                          f"key {CANARY}")
        assert json.loads(store.list_approvals(cp.session_id)[0].args_json) == {"to": CANARY}
        assert {"idempotency_key": CANARY} in [e.detail for e in store.list_audit()]
        [g] = graphs.checkpoints(GraphQuery("th", "", filter={"note": CANARY}))
        assert g.checkpoint.data == CANARY.encode()
        assert graphs.writes("th", "", "g1")[0].value.data == CANARY.encode()
        if kind == "sqlite":
            assert found_in_sqlite(tmp_path) is not keyed  # the log's pages, the file's
    finally:
        store.close()
        graphs.close()
    if kind == "sqlite":
        assert found_in_sqlite(tmp_path) is not keyed  # the log copied into the file
    else:
        assert found_in_postgres(request.getfixturevalue("postgres_url")) is not keyed


@pytest.mark.parametrize("keyed", [True, False])
def test_the_audit_chains_hashes_are_not_kept_in_the_clear_with_a_key(keyed, tmp_path):
    """A chain hash is SHA-256 of its event in the clear: kept as it is, it would let
    whoever holds the file confirm a guess of an event's detail."""
    store = SqliteStore(str(tmp_path / "meta.db"), key=KEY if keyed else None)
    new_session(store)
    store.append_audit([AuditEvent("gc", None, "gc", {"n": i}, ids.now()) for i in range(3)])
    events = store.list_audit()
    store.close()
    kept = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.name.startswith("meta.db"))
    assert all((bytes.fromhex(e.hash) in kept) is not keyed for e in events)
    store = SqliteStore(str(tmp_path / "meta.db"), key=KEY if keyed else None)
    assert store.list_audit() == events  # the chain reads back whole, and goes on from it
    store.append_audit([AuditEvent("gc", None, "gc", {}, ids.now())])
    assert store.list_audit()[-1].prev_hash == events[-1].hash
    store.close()


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
@pytest.mark.parametrize("made_with, opened_with, error", [
    (KEY, OTHER, InvalidArgument),  # a wrong key
    (KEY, None, FailedPrecondition),  # a sealed store, no key
    (None, KEY, FailedPrecondition)])  # records in the clear, a key
def test_a_store_opens_only_with_the_key_it_was_made_with(kind, made_with, opened_with, error,
                                                          request, tmp_path):
    store = open_store(kind, request, tmp_path, made_with)
    new_session(store)
    store.close()
    with pytest.raises(error):
        open_store(kind, request, tmp_path, opened_with)
    open_store(kind, request, tmp_path, made_with).close()  # and is left as it was


def sealed_store(tmp_path):
    store = SqliteStore(str(tmp_path / "meta.db"), key=KEY)
    session, first = new_session(store)
    a = store.append_checkpoint(make_cp(session.id, first.id, n_msgs=1), ['"a"'], first.id,
                                None, [])
    b = store.append_checkpoint(make_cp(session.id, a.id, n_msgs=1), ['"b"'], a.id, None, [])
    return store, a, b


def raw(tmp_path, sql: str, args=()) -> None:
    db = sqlite3.connect(tmp_path / "meta.db")
    with db:
        db.execute(sql, args)
    db.close()


def test_a_value_moved_to_another_row_is_data_loss(tmp_path):
    store, a, b = sealed_store(tmp_path)
    assert store.conversation(b.id) == ['"a"', '"b"']
    raw(tmp_path, "UPDATE messages SET body = (SELECT body FROM messages WHERE"
        " checkpoint_id = ?) WHERE checkpoint_id = ?", (a.id, b.id))
    with pytest.raises(DataLoss):
        store.conversation(b.id)
    store.close()


def test_a_value_in_the_clear_where_a_sealed_one_belongs_is_data_loss(tmp_path):
    store, a, _ = sealed_store(tmp_path)
    raw(tmp_path, "UPDATE checkpoints SET label = 'planted' WHERE id = ?", (a.id,))
    with pytest.raises(DataLoss):
        store.get_checkpoint(a.id)
    store.close()


def test_a_sealed_row_read_with_another_key_is_data_loss(tmp_path):
    store, a, _ = sealed_store(tmp_path)
    store.sealed = Columns(OTHER)  # past the check at open: each read checks its own tag
    with pytest.raises(DataLoss):
        store.get_checkpoint(a.id)
    with pytest.raises(DataLoss):
        store.conversation(a.id)
    store.close()


def test_sealed_problems_name_every_value_that_does_not_open(tmp_path):
    store, a, b = sealed_store(tmp_path)
    store.set_task(a.session_id, Task("t", "title", None, "pending", "", ids.now()), [])
    store.add_tool_call(ToolCall(ids.new_id(), a.session_id, "search", "{}", None,
                                 "read_only", None, b.id, ids.now()), [])
    assert store.sealed_problems() == []
    raw(tmp_path, "UPDATE tool_calls SET args_json = (SELECT title FROM tasks)")
    raw(tmp_path, "UPDATE messages SET body = x'00' WHERE checkpoint_id = ?", (a.id,))
    problems = store.sealed_problems()
    assert len(problems) == 2
    assert any("tool_calls.args_json" in p for p in problems)
    assert any(f"messages.body of row {a.id}/0" in p for p in problems)
    store.close()


def test_fsck_checks_every_sealed_value_through_a_daemon(tmp_path, workspace):
    root = tmp_path / "root"
    daemon = KeyedDaemon(root).start()
    try:
        client = daemon.client()
        session = client.create_session(str(workspace))
        client.record_tool_call(session.id, "search", {"q": 1}, effect="read_only")
        assert client.fsck()["ok"]
    finally:
        daemon.stop()
    raw(root, "UPDATE tool_calls SET args_json = (SELECT label FROM checkpoints LIMIT 1)")
    daemon.start()
    try:
        report = daemon.client().fsck()
        assert not report["ok"]
        assert any("tool_calls.args_json" in p for p in report["problems"])
    finally:
        daemon.stop()


def test_texts_kept_once_opened_stay_within_their_budget_and_their_place(monkeypatch):
    from worldline.daemon.storage import sealed
    monkeypatch.setattr(sealed, "MEMO_BYTES", 2000)
    columns = Columns(KEY)
    values = [columns.seal_text(f"text {i}" * 20, "t", "c", i) for i in range(100)]
    for _ in range(2):
        assert [columns.open_text(v, "t", "c", i) for i, v in enumerate(values)] == [
            f"text {i}" * 20 for i in range(100)]
    assert 0 < columns._memo_bytes <= 2000 and len(columns._memo) < 20
    # a value kept for its own row does not open in another
    with pytest.raises(DataLoss):
        columns.open_text(values[99], "t", "c", 98)


def test_a_graph_value_moved_to_another_thread_is_data_loss(tmp_path):
    from worldline.daemon.storage.graph_store import SqliteGraphStore
    graphs = SqliteGraphStore(str(tmp_path / "graphs.db"), key=KEY)
    for thread in ("t1", "t2"):
        graphs.put_checkpoint(GraphCheckpoint(thread, "", "c", None, Typed("json", b"x"), "{}",
                                              {"m": "1"}, None, ids.now()),
                              [GraphBlob(thread, "", "m", "1", Typed("json", thread.encode()))])
    db = sqlite3.connect(tmp_path / "graphs.db")
    with db:
        db.execute("UPDATE graph_blobs SET data = (SELECT data FROM graph_blobs WHERE"
                   " thread_id = 't1') WHERE thread_id = 't2'")
    db.close()
    assert graphs.blobs("t1", "", {"m": "1"})[0].value.data == b"t1"
    with pytest.raises(DataLoss):
        graphs.blobs("t2", "", {"m": "1"})
    graphs.close()


# -- through a real daemon -----------------------------------------------------------------
# The daemon started as it runs (daemon.main.run over a real socket), its stores opened
# with a data key the way the daemon's start gives them one (StorageConfig.open_store);
# with no key given, as without one (a like-for-like peer: tests/sealed_cost.py).
KEYED_DAEMON = """
import sys
from worldline.daemon.main import run
from worldline.daemon.storage.config import StorageConfig
from worldline.daemon.storage.crypto import DataKey

KEY = DataKey(bytes.fromhex(sys.argv[3])) if sys.argv[3] else None


class Keyed(StorageConfig):
    def open_store(self, root, key=None):
        return super().open_store(root, key=KEY)

    def open_graph_store(self, root, key=None):
        return super().open_graph_store(root, key=KEY)


config = StorageConfig.resolve(store=sys.argv[4] or None)
sys.exit(run(sys.argv[1], sys.argv[2], storage=Keyed(**vars(config))))
"""


class KeyedDaemon(DaemonProcess):
    def __init__(self, root: Path, key: bytes | None = bytes(range(32)),
                 store: str = "") -> None:
        super().__init__(root)
        self.key = key
        self.store = store  # "": sqlite; or a postgresql:// URL

    def start(self, wait: bool = True) -> KeyedDaemon:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", KEYED_DAEMON, str(self.root), self.address,
                 self.key.hex() if self.key else "", self.store], stdout=subprocess.DEVNULL,
                stderr=log, env=self.env)
        if wait:
            self.wait_serving()
        return self


def meta_files_hold_canary(root: Path) -> bool:
    return any(CANARY.encode() in p.read_bytes() for p in root.iterdir()
               if p.name.startswith("meta.db"))


@pytest.mark.parametrize("keyed", [True, False])
@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_no_canary_in_the_data_roots_metadata_through_a_daemon(kind, keyed, request, tmp_path,
                                                               workspace):
    root = tmp_path / "root"
    url = request.getfixturevalue("postgres_url") if kind == "postgres" else ""
    daemon = KeyedDaemon(root, bytes(range(32)) if keyed else None, url).start()
    try:
        client = daemon.client()
        session = client.create_session(str(workspace))
        cp = client.checkpoint(session.id, label=f"label {CANARY}",
                               reasoning=f"why {CANARY}",
                               messages=[{"role": "user", "content": CANARY}],
                               warnings=[f"warning {CANARY}"])
        client.record_tool_call(session.id, "search", {"q": CANARY}, effect="read_only",
                                result={"hit": CANARY}, idempotency_key=f"k-{CANARY}")
        client.request_approval(session.id, "send_email", {"to": CANARY})
        shown = client.show(cp.id)
        assert shown.label == f"label {CANARY}"
        assert CANARY in json.dumps(shown.messages)
        if not url:
            assert meta_files_hold_canary(root) is not keyed  # the log, as the daemon runs
    finally:
        assert daemon.stop() == 0
    if url:
        assert found_in_postgres(url) is not keyed
    else:
        assert meta_files_hold_canary(root) is not keyed  # the file, the log now in it
    if keyed:  # and the sealed store does not open without its key
        with pytest.raises(RuntimeError, match="exited 1"):
            KeyedDaemon(root, None, url).start()
