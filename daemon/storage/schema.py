"""The SQL schema of the metadata store, written once for SQLite and PostgreSQL.

The two differ only in names of types and in what SQLite alone has or needs, so each
schema is one text (``METADATA`` here; blob_index.py and graph_store.py keep theirs)
written with these placeholders, which ``ddl`` fills in for a dialect:

    placeholder        SQLite            PostgreSQL
    $BLOB              BLOB              BYTEA
    $REAL              REAL              DOUBLE PRECISION
    $INT64             INTEGER           BIGINT      (SQLite's INTEGER holds 64 bits;
                                                      its INTEGER PRIMARY KEY is the rowid)
    ${IF_NOT_EXISTS}   IF NOT EXISTS     (nothing)   (SQLite makes every absent table at
                                                      each open; PostgreSQL once, by
                                                      migrations.migrate)
    ${WITHOUT_ROWID}   WITHOUT ROWID     (nothing)

A line that starts with ``POSTGRESQL_ONLY`` is PostgreSQL's alone (an index a fleet's
hosts need; an embedded store has one host). Digests are kept as their 32 bytes
(sql_store.digest_in), not 64 hex digits. A checkpoint row is found by its id: in
SQLite the table is keyed by it (WITHOUT ROWID), so no second index of ids is kept
beside the rows (a checkpoint's metadata is a large share of what it stores).

Changing a schema is a new ``Migration`` of each backend (sqlite_store.py,
postgres_store.py) beside the change here: a data root made before it is migrated,
not made anew.
"""

from __future__ import annotations

from string import Template

SQLITE, POSTGRESQL = "sqlite", "postgresql"
POSTGRESQL_ONLY = "@postgresql "

TYPES = {
    SQLITE: {"BLOB": "BLOB", "REAL": "REAL", "INT64": "INTEGER",
             "IF_NOT_EXISTS": "IF NOT EXISTS ", "WITHOUT_ROWID": " WITHOUT ROWID"},
    POSTGRESQL: {"BLOB": "BYTEA", "REAL": "DOUBLE PRECISION", "INT64": "BIGINT",
                 "IF_NOT_EXISTS": "", "WITHOUT_ROWID": ""},
}


def ddl(schema: str, dialect: str) -> str:
    """``schema`` (written as above) in ``dialect``'s terms."""
    lines = []
    for line in schema.split("\n"):
        if line.startswith(POSTGRESQL_ONLY):
            if dialect != POSTGRESQL:
                continue
            line = line[len(POSTGRESQL_ONLY):]
        lines.append(line)
    return Template("\n".join(lines)).substitute(TYPES[dialect])


METADATA = """
CREATE TABLE ${IF_NOT_EXISTS}sessions (
    id TEXT PRIMARY KEY, name TEXT NOT NULL, workspace TEXT NOT NULL, container TEXT,
    head TEXT NOT NULL, forked_from TEXT, created_at TEXT NOT NULL,
    spec TEXT NOT NULL DEFAULT '{}', needs_attention TEXT, deleted_at TEXT,
    host TEXT NOT NULL DEFAULT '', lease_expires $REAL NOT NULL DEFAULT 0, released_to TEXT);
@postgresql CREATE INDEX sessions_by_host ON sessions (host);
CREATE TABLE ${IF_NOT_EXISTS}checkpoints (
    id TEXT PRIMARY KEY, session_id TEXT NOT NULL REFERENCES sessions(id),
    seq INTEGER NOT NULL, parent_id TEXT, kind TEXT NOT NULL, created_at TEXT NOT NULL,
    tree $BLOB NOT NULL, bytes $INT64 NOT NULL, state_digest $BLOB NOT NULL,
    tasks_digest $BLOB NOT NULL, conversation_parent TEXT, messages_added INTEGER NOT NULL,
    message_count INTEGER NOT NULL, label TEXT NOT NULL, reasoning TEXT NOT NULL,
    trace_id TEXT NOT NULL, restored_from TEXT, container $BLOB, acknowledged TEXT NOT NULL,
    pruned INTEGER NOT NULL DEFAULT 0, resume TEXT NOT NULL DEFAULT '',
    warnings TEXT NOT NULL DEFAULT '', UNIQUE (session_id, seq))${WITHOUT_ROWID};
CREATE TABLE ${IF_NOT_EXISTS}messages (
    checkpoint_id TEXT NOT NULL, idx INTEGER NOT NULL, body TEXT NOT NULL,
    PRIMARY KEY (checkpoint_id, idx))${WITHOUT_ROWID};
CREATE TABLE ${IF_NOT_EXISTS}tool_calls (
    id TEXT PRIMARY KEY, session_id TEXT NOT NULL, name TEXT NOT NULL, args_json TEXT NOT NULL,
    result_json TEXT, effect TEXT NOT NULL, idempotency_key TEXT, checkpoint_id TEXT NOT NULL,
    created_at TEXT NOT NULL, rule TEXT NOT NULL, approval_id TEXT);
CREATE INDEX ${IF_NOT_EXISTS}tool_calls_by_checkpoint ON tool_calls (checkpoint_id);
CREATE TABLE ${IF_NOT_EXISTS}tasks (
    session_id TEXT NOT NULL, id TEXT NOT NULL, position INTEGER NOT NULL, title TEXT NOT NULL,
    parent TEXT, status TEXT NOT NULL, note TEXT NOT NULL, updated_at TEXT NOT NULL,
    PRIMARY KEY (session_id, id));
CREATE TABLE ${IF_NOT_EXISTS}approvals (
    id TEXT PRIMARY KEY, session_id TEXT NOT NULL, tool TEXT NOT NULL, args_json TEXT NOT NULL,
    status TEXT NOT NULL, checkpoint_id TEXT NOT NULL, created_at TEXT NOT NULL,
    expires_at TEXT NOT NULL, reason TEXT NOT NULL, decided_at TEXT);
CREATE TABLE ${IF_NOT_EXISTS}hosts (
    host TEXT PRIMARY KEY, address TEXT NOT NULL, seen_at $REAL NOT NULL);
CREATE TABLE ${IF_NOT_EXISTS}holds (
    host TEXT NOT NULL, checkpoint_id TEXT NOT NULL, expires $REAL NOT NULL,
    PRIMARY KEY (host, checkpoint_id))${WITHOUT_ROWID};
CREATE TABLE ${IF_NOT_EXISTS}audit (
    seq $INT64 PRIMARY KEY, kind TEXT NOT NULL, session_id TEXT, subject_id TEXT NOT NULL,
    detail TEXT NOT NULL, created_at TEXT NOT NULL, prev_hash $BLOB NOT NULL, hash $BLOB NOT NULL);
@postgresql CREATE INDEX audit_by_kind ON audit (kind, created_at);
"""
