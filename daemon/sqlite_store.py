"""The embedded metadata store: SQLite in WAL mode.

One writer connection behind a lock takes every write transaction; each thread
reads through its own connection, so reads never wait behind a commit's fsync (WAL
lets readers run beside the writer, each on the last committed snapshot).
``synchronous=FULL``: a checkpoint acknowledged to a client has its transaction
on disk, so neither a killed daemon nor a power cut loses it.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

from worldline.client.errors import (
    Aborted,
    AlreadyExists,
    FailedPrecondition,
    NotFound,
    ResourceExhausted,
)

from .records import (
    GENESIS_HASH,
    Approval,
    AuditEvent,
    Checkpoint,
    Session,
    Task,
    ToolCall,
    chain_hash,
)

SCHEMA_VERSION = 3
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY, name TEXT NOT NULL, workspace TEXT NOT NULL, container TEXT,
    head TEXT NOT NULL, forked_from TEXT, created_at TEXT NOT NULL,
    spec TEXT NOT NULL DEFAULT '{}', needs_attention TEXT, deleted_at TEXT);
CREATE TABLE IF NOT EXISTS checkpoints (
    id TEXT PRIMARY KEY, session_id TEXT NOT NULL REFERENCES sessions(id),
    seq INTEGER NOT NULL, parent_id TEXT, kind TEXT NOT NULL, created_at TEXT NOT NULL,
    tree TEXT NOT NULL, bytes INTEGER NOT NULL, state_digest TEXT NOT NULL,
    tasks_digest TEXT NOT NULL, conversation_parent TEXT, messages_added INTEGER NOT NULL,
    message_count INTEGER NOT NULL, label TEXT NOT NULL, reasoning TEXT NOT NULL,
    trace_id TEXT NOT NULL, restored_from TEXT, container TEXT, acknowledged TEXT NOT NULL,
    pruned INTEGER NOT NULL DEFAULT 0, resume TEXT NOT NULL DEFAULT '',
    UNIQUE (session_id, seq));
CREATE TABLE IF NOT EXISTS messages (
    checkpoint_id TEXT NOT NULL, idx INTEGER NOT NULL, body TEXT NOT NULL,
    PRIMARY KEY (checkpoint_id, idx)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS tool_calls (
    id TEXT PRIMARY KEY, session_id TEXT NOT NULL, name TEXT NOT NULL, args_json TEXT NOT NULL,
    result_json TEXT, effect TEXT NOT NULL, idempotency_key TEXT, checkpoint_id TEXT NOT NULL,
    created_at TEXT NOT NULL, rule TEXT NOT NULL, approval_id TEXT);
CREATE INDEX IF NOT EXISTS tool_calls_by_checkpoint ON tool_calls (checkpoint_id);
CREATE TABLE IF NOT EXISTS tasks (
    session_id TEXT NOT NULL, id TEXT NOT NULL, position INTEGER NOT NULL, title TEXT NOT NULL,
    parent TEXT, status TEXT NOT NULL, note TEXT NOT NULL, updated_at TEXT NOT NULL,
    PRIMARY KEY (session_id, id));
CREATE TABLE IF NOT EXISTS approvals (
    id TEXT PRIMARY KEY, session_id TEXT NOT NULL, tool TEXT NOT NULL, args_json TEXT NOT NULL,
    status TEXT NOT NULL, checkpoint_id TEXT NOT NULL, created_at TEXT NOT NULL,
    expires_at TEXT NOT NULL, reason TEXT NOT NULL, decided_at TEXT);
CREATE TABLE IF NOT EXISTS audit (
    seq INTEGER PRIMARY KEY, kind TEXT NOT NULL, session_id TEXT, subject_id TEXT NOT NULL,
    detail TEXT NOT NULL, created_at TEXT NOT NULL, prev_hash TEXT NOT NULL, hash TEXT NOT NULL);
"""

_SESSION_COLS = ("id, name, workspace, container, head, forked_from, created_at, spec,"
                 " needs_attention, deleted_at")
_MUTABLE_SESSION_FIELDS = {"container", "spec", "needs_attention", "deleted_at"}
_CP_COLS = ("id, session_id, seq, parent_id, kind, created_at, tree, bytes, state_digest,"
            " tasks_digest, conversation_parent, messages_added, message_count, label,"
            " reasoning, trace_id, restored_from, container, acknowledged, pruned, resume")


def _cp(row) -> Checkpoint:
    *head, acknowledged, pruned, resume = row
    return Checkpoint(*head, acknowledged=tuple(json.loads(acknowledged)), pruned=bool(pruned),
                      resume=resume)


def _cp_row(cp: Checkpoint) -> tuple:
    return (cp.id, cp.session_id, cp.seq, cp.parent_id, cp.kind, cp.created_at, cp.tree,
            cp.bytes, cp.state_digest, cp.tasks_digest, cp.conversation_parent,
            cp.messages_added, cp.message_count, cp.label, cp.reasoning, cp.trace_id,
            cp.restored_from, cp.container, json.dumps(list(cp.acknowledged)), int(cp.pruned),
            cp.resume)


def _event(row) -> AuditEvent:
    seq, kind, session_id, subject_id, detail, created_at, prev_hash, hash_ = row
    return AuditEvent(kind, session_id, subject_id, json.loads(detail), created_at, seq,
                      prev_hash, hash_)


class SqliteDatabase:
    """One SQLite file in WAL mode: a writer connection behind a lock for write
    transactions (``_tx``), a read connection per thread (``_one``, ``_all``)."""

    def __init__(self, path: str, schema: str) -> None:
        self.path = path
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.execute("PRAGMA busy_timeout=10000")
        self._lock = threading.RLock()
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._db.executescript(schema)
        self._last_write = 0.0

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._last_write = time.monotonic()
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    yield self._db
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")
            except sqlite3.OperationalError as exc:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                if "full" in str(exc):
                    raise ResourceExhausted(f"no space left for metadata: {exc}") from None
                raise

    def _reader(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, isolation_level=None,
                                 check_same_thread=False)
            db.execute("PRAGMA busy_timeout=10000")
            self._local.db = db
            with self._lock:
                self._readers.append(db)
        return db

    def _one(self, sql: str, args: tuple):
        return self._reader().execute(sql, args).fetchone()

    def _all(self, sql: str, args: tuple = ()) -> list:
        return self._reader().execute(sql, args).fetchall()

    def compact_wal(self, idle_seconds: float) -> bool:
        """When nothing was written for ``idle_seconds``, move the WAL into the database
        and truncate it, so an idle daemon's data root holds no write-ahead log (WAL
        mode otherwise keeps it at its high-water mark, megabytes). Never waits long on
        a reader; returns True if the WAL was emptied."""
        wal = self.path + "-wal"
        with self._lock:
            if time.monotonic() - self._last_write < idle_seconds:
                return False
            try:
                if os.path.getsize(wal) == 0:
                    return False
            except FileNotFoundError:
                return False
            self._db.execute("PRAGMA busy_timeout=100")
            try:
                busy, _, _ = self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            finally:
                self._db.execute("PRAGMA busy_timeout=10000")
            return busy == 0

    def close(self) -> None:
        with self._lock:
            for db in self._readers:
                db.close()
            self._db.close()


class SqliteStore(SqliteDatabase):
    def __init__(self, path: str) -> None:
        super().__init__(path, SCHEMA)
        self._db.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)",
                         (str(SCHEMA_VERSION),))
        self._migrate()

    def _migrate(self) -> None:
        """Bring a data root made by an earlier version to this schema, once."""
        (version,) = self._db.execute(
            "SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        with self._tx() as db:
            if int(version) < 2:  # 0.4: a session's spec and needs_attention
                columns = {row[1] for row in db.execute("PRAGMA table_info(sessions)")}
                if "spec" not in columns:
                    db.execute("ALTER TABLE sessions ADD COLUMN spec TEXT NOT NULL"
                               " DEFAULT '{}'")
                if "needs_attention" not in columns:
                    db.execute("ALTER TABLE sessions ADD COLUMN needs_attention TEXT")
            if int(version) < 3:  # 0.5: deleted sessions, the agent's resume point
                columns = {row[1] for row in db.execute("PRAGMA table_info(sessions)")}
                if "deleted_at" not in columns:
                    db.execute("ALTER TABLE sessions ADD COLUMN deleted_at TEXT")
                columns = {row[1] for row in db.execute("PRAGMA table_info(checkpoints)")}
                if "resume" not in columns:
                    db.execute("ALTER TABLE checkpoints ADD COLUMN resume TEXT NOT NULL"
                               " DEFAULT ''")
            db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'",
                       (str(SCHEMA_VERSION),))

    # -- sessions ------------------------------------------------------------------
    def create_session(self, session, first, tasks, events):
        with self._tx() as db:
            try:
                db.execute(f"INSERT INTO sessions ({_SESSION_COLS}) VALUES"
                           " (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                           (session.id, session.name, session.workspace, session.container,
                            first.id, session.forked_from, session.created_at, session.spec,
                            session.needs_attention, session.deleted_at))
                db.execute(f"INSERT INTO checkpoints ({_CP_COLS}) VALUES"
                           f" ({', '.join('?' * 21)})", _cp_row(first))
            except sqlite3.IntegrityError:
                raise AlreadyExists(f"session {session.id} already exists") from None
            self._replace_tasks(db, session.id, tasks)
            self._append_audit(db, events)

    def get_session(self, session_id):
        row = self._one(f"SELECT {_SESSION_COLS} FROM sessions WHERE id = ?", (session_id,))
        if row is None:
            raise NotFound(f"session {session_id} does not exist")
        return Session(*row)

    def list_sessions(self):
        return [Session(*r) for r in self._all(
            f"SELECT {_SESSION_COLS} FROM sessions ORDER BY id")]

    def update_session(self, session_id, **fields):
        unknown = set(fields) - _MUTABLE_SESSION_FIELDS
        if unknown:
            raise ValueError(f"session fields {sorted(unknown)} cannot change")
        with self._tx() as db:
            cur = db.execute(f"UPDATE sessions SET {', '.join(f'{k} = ?' for k in fields)}"
                             " WHERE id = ?", (*fields.values(), session_id))
            if cur.rowcount == 0:
                raise NotFound(f"session {session_id} does not exist")

    # -- checkpoints -----------------------------------------------------------------
    def append_checkpoint(self, cp, messages, expected_head, tasks, events):
        with self._tx() as db:
            row = db.execute("SELECT head FROM sessions WHERE id = ?", (cp.session_id,)).fetchone()
            if row is None:
                raise NotFound(f"session {cp.session_id} does not exist")
            if row[0] != expected_head:
                raise Aborted(f"session {cp.session_id} head moved to {row[0]}"
                              f" (expected {expected_head})")
            (seq,) = db.execute("SELECT MAX(seq) + 1 FROM checkpoints WHERE session_id = ?",
                                (cp.session_id,)).fetchone()
            cp = replace(cp, seq=seq)
            try:
                db.execute(f"INSERT INTO checkpoints ({_CP_COLS}) VALUES"
                           f" ({', '.join('?' * 21)})", _cp_row(cp))
            except sqlite3.IntegrityError:
                raise AlreadyExists(f"checkpoint {cp.id} already exists") from None
            db.executemany("INSERT INTO messages VALUES (?, ?, ?)",
                           [(cp.id, i, m) for i, m in enumerate(messages)])
            db.execute("UPDATE sessions SET head = ? WHERE id = ?", (cp.id, cp.session_id))
            if tasks is not None:
                self._replace_tasks(db, cp.session_id, tasks)
            self._append_audit(db, events)
            return cp

    def get_checkpoint(self, checkpoint_id):
        row = self._one(f"SELECT {_CP_COLS} FROM checkpoints WHERE id = ?", (checkpoint_id,))
        if row is None:
            raise NotFound(f"checkpoint {checkpoint_id} does not exist")
        return _cp(row)

    def list_checkpoints(self, session_id=None):
        if session_id is None:
            rows = self._all(f"SELECT {_CP_COLS} FROM checkpoints ORDER BY session_id, seq")
        else:
            self.get_session(session_id)
            rows = self._all(f"SELECT {_CP_COLS} FROM checkpoints WHERE session_id = ?"
                             " ORDER BY seq", (session_id,))
        return [_cp(r) for r in rows]

    def prune_checkpoints(self, checkpoint_ids, events):
        with self._tx() as db:
            db.executemany("UPDATE checkpoints SET pruned = 1 WHERE id = ?",
                           [(cid,) for cid in checkpoint_ids])
            self._append_audit(db, events)

    def conversation(self, checkpoint_id):
        self.get_checkpoint(checkpoint_id)
        rows = self._all(
            "WITH RECURSIVE chain(id, depth) AS ("
            " SELECT ?, 0 UNION ALL"
            " SELECT c.conversation_parent, chain.depth + 1 FROM checkpoints c"
            " JOIN chain ON c.id = chain.id WHERE c.conversation_parent IS NOT NULL)"
            " SELECT m.body FROM chain JOIN messages m ON m.checkpoint_id = chain.id"
            " ORDER BY chain.depth DESC, m.idx", (checkpoint_id,))
        return [r[0] for r in rows]

    def lineage(self, checkpoint_id):
        self.get_checkpoint(checkpoint_id)
        rows = self._all(
            "WITH RECURSIVE chain(id, depth) AS ("
            " SELECT ?, 0 UNION ALL"
            " SELECT c.parent_id, chain.depth + 1 FROM checkpoints c"
            " JOIN chain ON c.id = chain.id WHERE c.parent_id IS NOT NULL)"
            " SELECT chain.id, c.session_id FROM chain JOIN checkpoints c ON c.id = chain.id"
            " ORDER BY depth", (checkpoint_id,))
        return [(r[0], r[1]) for r in rows]

    # -- tool calls -------------------------------------------------------------------
    def add_tool_call(self, call, events):
        with self._tx() as db:
            if call.approval_id:
                used = db.execute("SELECT id FROM tool_calls WHERE approval_id = ?",
                                  (call.approval_id,)).fetchone()
                if used is not None:
                    raise FailedPrecondition(f"approval {call.approval_id} was already used"
                                             f" by tool call {used[0]}")
            db.execute("INSERT INTO tool_calls VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       (call.id, call.session_id, call.name, call.args_json, call.result_json,
                        call.effect, call.idempotency_key, call.checkpoint_id, call.created_at,
                        call.rule, call.approval_id))
            self._append_audit(db, events)

    def list_tool_calls(self, session_id=None, checkpoint_ids=None):
        sql, args = "SELECT * FROM tool_calls WHERE 1=1", []
        if session_id is not None:
            sql += " AND session_id = ?"
            args.append(session_id)
        if checkpoint_ids is not None:
            ids = list(checkpoint_ids)
            if not ids:
                return []
            sql += " AND checkpoint_id IN (SELECT value FROM json_each(?))"
            args.append(json.dumps(ids))
        return [ToolCall(*r) for r in self._all(sql + " ORDER BY id", tuple(args))]

    # -- tasks ---------------------------------------------------------------------------
    def set_task(self, session_id, task, events):
        with self._tx() as db:
            if db.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone() is None:
                raise NotFound(f"session {session_id} does not exist")
            (pos,) = db.execute("SELECT COALESCE(MAX(position), 0) + 1 FROM tasks"
                                " WHERE session_id = ?", (session_id,)).fetchone()
            db.execute(
                "INSERT INTO tasks VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (session_id, id)"
                " DO UPDATE SET title = excluded.title, parent = excluded.parent,"
                " status = excluded.status, note = excluded.note, updated_at = excluded.updated_at",
                (session_id, task.id, pos, task.title, task.parent, task.status, task.note,
                 task.updated_at))
            self._append_audit(db, events)

    def list_tasks(self, session_id):
        self.get_session(session_id)
        rows = self._all("SELECT id, title, parent, status, note, updated_at FROM tasks"
                         " WHERE session_id = ? ORDER BY position", (session_id,))
        return [Task(*r) for r in rows]

    def _replace_tasks(self, db, session_id: str, tasks: list[Task]) -> None:
        db.execute("DELETE FROM tasks WHERE session_id = ?", (session_id,))
        db.executemany("INSERT INTO tasks VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                       [(session_id, t.id, i, t.title, t.parent, t.status, t.note, t.updated_at)
                        for i, t in enumerate(tasks, 1)])

    # -- approvals ---------------------------------------------------------------------------
    def add_approval(self, approval, events):
        with self._tx() as db:
            db.execute("INSERT INTO approvals VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       _approval_row(approval))
            self._append_audit(db, events)

    def get_approval(self, approval_id):
        row = self._one("SELECT * FROM approvals WHERE id = ?", (approval_id,))
        if row is None:
            raise NotFound(f"approval {approval_id} does not exist")
        return Approval(*row)

    def decide_approval(self, approval_id, status, reason, decided_at, events):
        with self._tx() as db:
            cur = db.execute("UPDATE approvals SET status = ?, reason = ?, decided_at = ?"
                             " WHERE id = ? AND status = 'pending'",
                             (status, reason, decided_at, approval_id))
            if cur.rowcount != 1:
                row = db.execute("SELECT status FROM approvals WHERE id = ?",
                                 (approval_id,)).fetchone()
                if row is None:
                    raise NotFound(f"approval {approval_id} does not exist")
                raise FailedPrecondition(f"approval {approval_id} is already {row[0]}")
            self._append_audit(db, events)
            return Approval(*db.execute("SELECT * FROM approvals WHERE id = ?",
                                        (approval_id,)).fetchone())

    def list_approvals(self, session_id=None, status=None):
        sql, args = "SELECT * FROM approvals WHERE 1=1", []
        if session_id is not None:
            sql += " AND session_id = ?"
            args.append(session_id)
        if status is not None:
            sql += " AND status = ?"
            args.append(status)
        return [Approval(*r) for r in self._all(sql + " ORDER BY id", tuple(args))]

    # -- audit -------------------------------------------------------------------------------
    def append_audit(self, events):
        with self._tx() as db:
            self._append_audit(db, events)

    def _append_audit(self, db, events: list[AuditEvent]) -> None:
        if not events:
            return
        row = db.execute("SELECT seq, hash FROM audit ORDER BY seq DESC LIMIT 1").fetchone()
        seq, prev = row if row else (0, GENESIS_HASH)
        for event in events:
            seq += 1
            event = replace(event, seq=seq)
            digest = chain_hash(prev, event)
            db.execute("INSERT INTO audit VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                       (seq, event.kind, event.session_id, event.subject_id,
                        json.dumps(event.detail, sort_keys=True), event.created_at, prev, digest))
            prev = digest

    def list_audit(self, session_id=None, kind=None, limit=0):
        sql, args = "SELECT * FROM audit WHERE 1=1", []
        if session_id is not None:
            sql += " AND session_id = ?"
            args.append(session_id)
        if kind is not None:
            sql += " AND kind = ?"
            args.append(kind)
        events = [_event(r) for r in self._all(sql + " ORDER BY seq", tuple(args))]
        return events[-limit:] if limit else events


def _approval_row(a: Approval) -> tuple:
    return (a.id, a.session_id, a.tool, a.args_json, a.status, a.checkpoint_id, a.created_at,
            a.expires_at, a.reason, a.decided_at)
