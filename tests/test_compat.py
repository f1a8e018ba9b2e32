"""Data roots made by 0.3 keep working: their trees (rows without owners) restore as
before, never with a setuid or setgid bit, and their meta.db is migrated once."""

from __future__ import annotations

import json
import os
import sqlite3

from worldline.daemon.capture.apply import TreeWriter
from worldline.daemon.capture.snapshotter import Capture
from worldline.daemon.capture.trees import EMPTY_TREE, TreeReader, decode
from worldline.daemon.storage.blobs import MemoryBlobStore
from worldline.daemon.storage.sqlite_store import SCHEMA_VERSION, SqliteStore


def test_a_tree_written_by_0_3_restores_as_before(tmp_path):
    blobs = MemoryBlobStore()
    content = blobs.put_bytes(b"#!/bin/sh\necho hi\n")
    sub = blobs.put_bytes(json.dumps([["f.txt", "f", 0o640, content, 18]]).encode())
    # 0.3's rows: [name, code, mode, ref, size], no owner, no times
    root = blobs.put_bytes(json.dumps([
        ["run.sh", "f", 0o4755, content, 18], ["sub", "d", 0o750, sub, 18],
        ["link", "l", 0, "run.sh", 0]]).encode())
    tree = decode(blobs.read_bytes(root))
    assert tree.own is None and not tree["run.sh"].has_meta
    target = tmp_path / "ws"
    target.mkdir(mode=0o711)
    fd = os.open(target, os.O_RDONLY | os.O_DIRECTORY)
    try:
        warnings = TreeWriter(blobs, TreeReader(blobs), False).write(
            fd, Capture(blobs.put_bytes(EMPTY_TREE), 0), root)
    finally:
        os.close(fd)
    assert (target / "run.sh").read_bytes() == b"#!/bin/sh\necho hi\n"
    assert os.stat(target / "run.sh").st_mode & 0o7777 == 0o755  # never setuid root
    assert any("setuid/setgid bits dropped" in w for w in warnings)
    assert os.stat(target / "sub").st_mode & 0o777 == 0o750
    assert os.stat(target / "sub" / "f.txt").st_mode & 0o777 == 0o640
    assert os.readlink(target / "link") == "run.sh"
    assert os.stat(target).st_mode & 0o777 == 0o711  # 0.3 kept the root's own mode


def test_meta_db_of_0_3_is_migrated_once(tmp_path):
    path = tmp_path / "meta.db"
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        INSERT INTO meta VALUES ('schema_version', '1');
        CREATE TABLE sessions (id TEXT PRIMARY KEY, name TEXT NOT NULL,
            workspace TEXT NOT NULL, container TEXT, head TEXT NOT NULL, forked_from TEXT,
            created_at TEXT NOT NULL);
        INSERT INTO sessions VALUES ('01J0000000000000000000000A', 'old', '/tmp/old', NULL,
            '01J0000000000000000000000B', NULL, '2026-01-01T00:00:00Z');
    """)
    db.commit()
    db.close()
    for _ in range(2):  # a second open finds nothing to do
        store = SqliteStore(str(path))
        session = store.get_session("01J0000000000000000000000A")
        assert (session.name, session.spec, session.needs_attention) == ("old", "{}", None)
        store.update_session(session.id, needs_attention="look")
        assert store.get_session(session.id).needs_attention == "look"
        store.update_session(session.id, needs_attention=None)
        store.close()
    version = sqlite3.connect(path).execute(
        "SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0]
    assert int(version) == SCHEMA_VERSION


def test_a_checkpoints_table_made_before_0_7_4_is_rebuilt_keyed_by_id(tmp_path):
    """0.7.4 keys the checkpoints table by id (no second index of ids); a table made
    before is rebuilt once at open, every row and the (session, seq) rule kept."""
    import pytest
    from worldline.daemon import ids
    from worldline.daemon.records import AuditEvent

    from .test_store_contract import make_cp, new_session
    path = tmp_path / "meta.db"
    store = SqliteStore(str(path))
    session, first = new_session(store)
    head = first
    for i in range(30):
        cp = make_cp(session.id, head.id)
        head = store.append_checkpoint(cp, [f"message {i}"], head.id, None, [
            AuditEvent("checkpoint", session.id, cp.id, {"tree": cp.tree}, ids.now())])
    before = store.list_checkpoints(session.id)
    store.close()
    db = sqlite3.connect(path)  # as 0.7.3 made it: rows with rowids, ids in an index
    made = db.execute("SELECT sql FROM sqlite_master WHERE name = 'checkpoints'").fetchone()[0]
    assert made.rstrip().endswith("WITHOUT ROWID")
    db.executescript(f"""
        BEGIN;
        {made.replace("CREATE TABLE checkpoints", "CREATE TABLE old").replace(
            "WITHOUT ROWID", "")};
        INSERT INTO old SELECT * FROM checkpoints;
        DROP TABLE checkpoints;
        ALTER TABLE old RENAME TO checkpoints;
        UPDATE meta SET value = '7' WHERE key = 'schema_version';
        COMMIT;""")
    assert db.execute("SELECT count(*) FROM sqlite_master WHERE"
                      " name = 'sqlite_autoindex_checkpoints_1'").fetchone()[0] == 1
    db.close()
    for _ in range(2):  # the second open finds nothing to do
        store = SqliteStore(str(path))
        assert store.list_checkpoints(session.id) == before
        assert store.get_checkpoint(head.id) == head
        for change, rule in (("id = 'another'", "session_id, checkpoints.seq"),
                             ("seq = 1000", "checkpoints.id")):
            with pytest.raises(sqlite3.IntegrityError, match=rule), store._tx() as tx:
                tx.execute("CREATE TEMP TABLE one AS SELECT * FROM checkpoints WHERE id = ?",
                           (head.id,))
                tx.execute(f"UPDATE one SET {change}")
                tx.execute("INSERT INTO checkpoints SELECT * FROM one")
        store.close()
    db = sqlite3.connect(path)
    assert "WITHOUT ROWID" in db.execute(
        "SELECT sql FROM sqlite_master WHERE name = 'checkpoints'").fetchone()[0]
    assert db.execute("SELECT count(*) FROM sqlite_master WHERE"
                      " name = 'sqlite_autoindex_checkpoints_1'").fetchone()[0] == 0
    assert int(db.execute("SELECT value FROM meta WHERE key = 'schema_version'")
               .fetchone()[0]) == SCHEMA_VERSION >= 8
    db.close()
