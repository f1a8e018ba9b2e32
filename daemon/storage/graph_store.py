"""Graph stores: ``MemoryGraphStore`` (the reference), ``SqliteGraphStore`` and
``PostgresGraphStore`` (one ``SqlGraphStore`` of statements). The contract they keep,
and the records they keep, are in graph_checkpoints.py.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from dataclasses import replace

from .crypto import DataKey
from .graph_checkpoints import (
    GraphBlob,
    GraphCheckpoint,
    GraphQuery,
    GraphWrite,
    Typed,
    matches,
)
from .schema import POSTGRESQL, SQLITE, ddl
from .sealed import Columns
from .sqlite_store import SqliteDatabase


def _select(rows: Iterable[GraphCheckpoint], query: GraphQuery) -> list[GraphCheckpoint]:
    """The query's page of ``rows`` (already newest first): the one place filters apply."""
    out = []
    for cp in rows:
        if query.before_id is not None and cp.checkpoint_id >= query.before_id:
            continue
        if query.after is not None and cp.order >= query.after:
            continue
        if query.filter and not matches(cp.metadata, query.filter):
            continue
        out.append(cp)
        if len(out) >= query.limit:
            break
    return out


class MemoryGraphStore:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._threads: dict[str, str] = {}
        self._cps: dict[tuple[str, str, str], GraphCheckpoint] = {}
        self._blobs: dict[tuple[str, str, str, str], GraphBlob] = {}
        self._writes: dict[tuple[str, str, str, str, int], GraphWrite] = {}

    def bind_thread(self, thread_id, session_id):
        with self._lock:
            return self._threads.setdefault(thread_id, session_id)

    def thread_session(self, thread_id):
        with self._lock:
            return self._threads.get(thread_id)

    def put_checkpoint(self, cp, blobs):
        with self._lock:
            self._cps[cp.key] = cp
            for b in blobs:
                self._blobs.setdefault((b.thread_id, b.ns, b.channel, b.version), b)

    def put_writes(self, writes):
        with self._lock:
            for w in writes:
                key = (w.thread_id, w.ns, w.checkpoint_id, w.task_id, w.idx)
                if w.idx < 0:
                    self._writes[key] = w
                else:
                    self._writes.setdefault(key, w)

    def checkpoints(self, query):
        with self._lock:
            rows = [cp for cp in self._cps.values()
                    if (query.thread_id is None or cp.thread_id == query.thread_id)
                    and (query.ns is None or cp.ns == query.ns)
                    and (query.checkpoint_id is None or cp.checkpoint_id == query.checkpoint_id)]
        return _select(sorted(rows, key=lambda cp: cp.order, reverse=True), query)

    def blobs(self, thread_id, ns, versions):
        with self._lock:
            found = (self._blobs.get((thread_id, ns, ch, v)) for ch, v in versions.items())
            return [b for b in found if b is not None]

    def writes(self, thread_id, ns, checkpoint_id):
        with self._lock:
            return sorted((w for k, w in self._writes.items()
                           if k[:3] == (thread_id, ns, checkpoint_id)),
                          key=lambda w: (w.task_id, w.idx))

    def _delete(self, doomed: list[tuple[str, str, str]]) -> int:
        for key in doomed:
            del self._cps[key]
        gone = set(doomed)
        self._writes = {k: w for k, w in self._writes.items() if k[:3] not in gone}
        touched = {key[:2] for key in doomed}
        named = {(cp.thread_id, cp.ns, ch, v) for cp in self._cps.values()
                 if (cp.thread_id, cp.ns) in touched for ch, v in cp.versions.items()}
        self._blobs = {k: b for k, b in self._blobs.items()
                       if k[:2] not in touched or k in named}
        return len(doomed)

    def delete_threads(self, thread_ids):
        with self._lock:
            return self._delete([k for k in self._cps if k[0] in set(thread_ids)])

    def delete_runs(self, run_ids):
        runs = set(run_ids)
        with self._lock:
            return self._delete([k for k, cp in self._cps.items() if cp.run_id in runs])

    def keep_latest(self, thread_ids):
        wanted = set(thread_ids)
        with self._lock:
            newest: dict[tuple[str, str], str] = {}
            for (thread, ns, cid) in self._cps:
                if thread in wanted and cid > newest.get((thread, ns), ""):
                    newest[(thread, ns)] = cid
            return self._delete([k for k in self._cps
                                 if k[0] in wanted and k[2] != newest[k[:2]]])

    def copy_thread(self, source, target):
        with self._lock:
            cps = [replace(cp, thread_id=target) for k, cp in self._cps.items()
                   if k[0] == source]
            for cp in cps:
                self._cps[cp.key] = cp
            for k, b in list(self._blobs.items()):
                if k[0] == source:
                    self._blobs[(target, *k[1:])] = replace(b, thread_id=target)
            for k, w in list(self._writes.items()):
                if k[0] == source:
                    self._writes[(target, *k[1:])] = replace(w, thread_id=target)
            return len(cps)

    def close(self):
        return None


_GRAPH_SCHEMA = """
CREATE TABLE IF NOT EXISTS graph_threads (
    thread_id TEXT PRIMARY KEY, session_id TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS graph_checkpoints (
    thread_id TEXT NOT NULL, ns TEXT NOT NULL, checkpoint_id TEXT NOT NULL, parent_id TEXT,
    type TEXT NOT NULL, data $BLOB NOT NULL, metadata TEXT NOT NULL, versions TEXT NOT NULL,
    run_id TEXT, world_checkpoint_id TEXT, created_at TEXT NOT NULL,
    PRIMARY KEY (thread_id, ns, checkpoint_id))${WITHOUT_ROWID};
CREATE INDEX IF NOT EXISTS graph_checkpoints_order
    ON graph_checkpoints (checkpoint_id DESC, thread_id DESC, ns DESC);
CREATE INDEX IF NOT EXISTS graph_checkpoints_run ON graph_checkpoints (run_id);
CREATE TABLE IF NOT EXISTS graph_blobs (
    thread_id TEXT NOT NULL, ns TEXT NOT NULL, channel TEXT NOT NULL, version TEXT NOT NULL,
    type TEXT NOT NULL, data $BLOB NOT NULL,
    PRIMARY KEY (thread_id, ns, channel, version))${WITHOUT_ROWID};
CREATE TABLE IF NOT EXISTS graph_writes (
    thread_id TEXT NOT NULL, ns TEXT NOT NULL, checkpoint_id TEXT NOT NULL,
    task_id TEXT NOT NULL, idx INTEGER NOT NULL, channel TEXT NOT NULL, type TEXT NOT NULL,
    data $BLOB NOT NULL, task_path TEXT NOT NULL,
    PRIMARY KEY (thread_id, ns, checkpoint_id, task_id, idx))${WITHOUT_ROWID};
"""
GRAPH_SCHEMA = ddl(_GRAPH_SCHEMA, SQLITE)  # schema.py

_GCP_COLS = ("thread_id, ns, checkpoint_id, parent_id, type, data, metadata, versions,"
             " world_checkpoint_id, created_at")


def _gcp(row, sealed: Columns) -> GraphCheckpoint:
    thread, ns, cid, parent, type_, data, metadata, versions, world, created = row
    key = (thread, ns, cid)
    return GraphCheckpoint(
        thread, ns, cid, parent,
        Typed(type_, sealed.open_bytes(data, "graph_checkpoints", "data", *key)),
        sealed.open_text(metadata, "graph_checkpoints", "metadata", *key),
        json.loads(versions), world, created)


def _gcp_row(cp: GraphCheckpoint, sealed: Columns) -> tuple:
    """The row of ``cp``, in the order of _GCP_COLS and then run_id."""
    return (*cp.key, cp.parent_id, cp.checkpoint.type,
            sealed.seal_bytes(cp.checkpoint.data, "graph_checkpoints", "data", *cp.key),
            sealed.seal_text(cp.metadata_json, "graph_checkpoints", "metadata", *cp.key),
            json.dumps(cp.versions), cp.world_checkpoint_id, cp.created_at, cp.run_id)


def _blob_row(b: GraphBlob, sealed: Columns) -> tuple:
    key = (b.thread_id, b.ns, b.channel, b.version)
    return (*key, b.value.type, sealed.seal_bytes(b.value.data, "graph_blobs", "data", *key))


def _write_row(w: GraphWrite, sealed: Columns) -> tuple:
    key = (w.thread_id, w.ns, w.checkpoint_id, w.task_id, w.idx)
    return (*key, w.channel, w.value.type,
            sealed.seal_bytes(w.value.data, "graph_writes", "data", *key), w.task_path)


def _write(thread_id: str, ns: str, checkpoint_id: str, row, sealed: Columns) -> GraphWrite:
    task, idx, channel, type_, data, path = row
    data = sealed.open_bytes(data, "graph_writes", "data", thread_id, ns, checkpoint_id,
                             task, idx)
    return GraphWrite(thread_id, ns, checkpoint_id, task, idx, channel, Typed(type_, data),
                      path)


_REPLACE_CHECKPOINT = (
    " ON CONFLICT (thread_id, ns, checkpoint_id) DO UPDATE SET parent_id = excluded.parent_id,"
    " type = excluded.type, data = excluded.data, metadata = excluded.metadata,"
    " versions = excluded.versions, world_checkpoint_id = excluded.world_checkpoint_id,"
    " created_at = excluded.created_at, run_id = excluded.run_id")
_REPLACE_WRITE = (
    " ON CONFLICT (thread_id, ns, checkpoint_id, task_id, idx) DO UPDATE SET"
    " channel = excluded.channel, type = excluded.type, data = excluded.data,"
    " task_path = excluded.task_path")


class SqlGraphStore:
    """The GraphStore statements, written once for SQLite and PostgreSQL (the database
    class mixed in gives ``_tx``, ``_one`` and ``_all`` with ``?`` placeholders).
    ``sealed``: with a data key, a checkpoint's value and metadata, blobs' and writes'
    values are sealed, each bound to its row's key (sealed.py)."""

    sealed = Columns()

    def bind_thread(self, thread_id, session_id):
        with self._tx() as db:
            db.execute("INSERT INTO graph_threads VALUES (?, ?) ON CONFLICT DO NOTHING",
                       (thread_id, session_id))
            return db.execute("SELECT session_id FROM graph_threads WHERE thread_id = ?",
                              (thread_id,)).fetchone()[0]

    def thread_session(self, thread_id):
        row = self._one("SELECT session_id FROM graph_threads WHERE thread_id = ?", (thread_id,))
        return None if row is None else row[0]

    def put_checkpoint(self, cp, blobs):
        with self._tx() as db:
            db.execute(
                f"INSERT INTO graph_checkpoints ({_GCP_COLS}, run_id)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)" + _REPLACE_CHECKPOINT,
                _gcp_row(cp, self.sealed))
            db.executemany("INSERT INTO graph_blobs VALUES (?, ?, ?, ?, ?, ?)"
                           " ON CONFLICT DO NOTHING",
                           [_blob_row(b, self.sealed) for b in blobs])

    def put_writes(self, writes):
        rows = [_write_row(w, self.sealed) for w in writes]
        with self._tx() as db:
            db.executemany("INSERT INTO graph_writes VALUES (?,?,?,?,?,?,?,?,?)"
                           + _REPLACE_WRITE, [r for r in rows if r[4] < 0])
            db.executemany("INSERT INTO graph_writes VALUES (?,?,?,?,?,?,?,?,?)"
                           " ON CONFLICT DO NOTHING", [r for r in rows if r[4] >= 0])

    def checkpoints(self, query):
        where, args = [], []
        for column, value in (("thread_id", query.thread_id), ("ns", query.ns),
                              ("checkpoint_id", query.checkpoint_id)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        if query.before_id is not None:
            where.append("checkpoint_id < ?")
            args.append(query.before_id)
        if query.after is not None:
            where.append("(checkpoint_id, thread_id, ns) < (?, ?, ?)")
            args.extend(query.after)
        sql = (f"SELECT {_GCP_COLS} FROM graph_checkpoints"
               f" {'WHERE ' + ' AND '.join(where) if where else ''}"
               " ORDER BY checkpoint_id DESC, thread_id DESC, ns DESC")
        if not query.filter:
            sql += f" LIMIT {int(query.limit)}"
        rows = (_gcp(r, self.sealed) for r in self._all(sql, tuple(args)))
        return _select(rows, query)

    def blobs(self, thread_id, ns, versions):
        out = []
        for channel, version in versions.items():
            row = self._one("SELECT type, data FROM graph_blobs WHERE thread_id = ? AND ns = ?"
                            " AND channel = ? AND version = ?", (thread_id, ns, channel, version))
            if row is not None:
                data = self.sealed.open_bytes(row[1], "graph_blobs", "data", thread_id, ns,
                                              channel, version)
                out.append(GraphBlob(thread_id, ns, channel, version, Typed(row[0], data)))
        return out

    def writes(self, thread_id, ns, checkpoint_id):
        rows = self._all("SELECT task_id, idx, channel, type, data, task_path FROM graph_writes"
                         " WHERE thread_id = ? AND ns = ? AND checkpoint_id = ?"
                         " ORDER BY task_id, idx", (thread_id, ns, checkpoint_id))
        return [_write(thread_id, ns, checkpoint_id, r, self.sealed) for r in rows]

    def _delete(self, db, keys: list[tuple[str, str, str]]) -> int:
        db.executemany("DELETE FROM graph_checkpoints WHERE thread_id = ? AND ns = ?"
                       " AND checkpoint_id = ?", keys)
        db.executemany("DELETE FROM graph_writes WHERE thread_id = ? AND ns = ?"
                       " AND checkpoint_id = ?", keys)
        for thread, ns in {k[:2] for k in keys}:
            named = set()
            for (versions,) in db.execute("SELECT versions FROM graph_checkpoints"
                                          " WHERE thread_id = ? AND ns = ?", (thread, ns)):
                named.update(json.loads(versions).items())
            stored = db.execute("SELECT channel, version FROM graph_blobs"
                                " WHERE thread_id = ? AND ns = ?", (thread, ns)).fetchall()
            db.executemany("DELETE FROM graph_blobs WHERE thread_id = ? AND ns = ?"
                           " AND channel = ? AND version = ?",
                           [(thread, ns, ch, v) for ch, v in stored if (ch, v) not in named])
        return len(keys)

    def _keys(self, db, sql: str, args: Iterable) -> list[tuple[str, str, str]]:
        return [tuple(r) for a in args for r in db.execute(sql, (a,))]

    def delete_threads(self, thread_ids):
        with self._tx() as db:
            return self._delete(db, self._keys(
                db, "SELECT thread_id, ns, checkpoint_id FROM graph_checkpoints"
                " WHERE thread_id = ?", set(thread_ids)))

    def delete_runs(self, run_ids):
        with self._tx() as db:
            return self._delete(db, self._keys(
                db, "SELECT thread_id, ns, checkpoint_id FROM graph_checkpoints"
                " WHERE run_id = ?", set(run_ids)))

    def keep_latest(self, thread_ids):
        with self._tx() as db:
            return self._delete(db, self._keys(
                db, "SELECT thread_id, ns, checkpoint_id FROM graph_checkpoints AS g"
                " WHERE thread_id = ? AND checkpoint_id < (SELECT max(checkpoint_id)"
                " FROM graph_checkpoints WHERE thread_id = g.thread_id AND ns = g.ns)",
                set(thread_ids)))

    def copy_thread(self, source, target):
        if self.sealed.key is not None:
            return self._copy_sealed(source, target)
        with self._tx() as db:
            n = db.execute(
                f"INSERT INTO graph_checkpoints ({_GCP_COLS}, run_id)"
                f" SELECT ?, {_GCP_COLS.split(', ', 1)[1]}, run_id FROM graph_checkpoints"
                " WHERE thread_id = ?" + _REPLACE_CHECKPOINT, (target, source)).rowcount
            db.execute("INSERT INTO graph_blobs SELECT ?, ns, channel, version, type,"
                       " data FROM graph_blobs WHERE thread_id = ? ON CONFLICT DO NOTHING",
                       (target, source))
            db.execute("INSERT INTO graph_writes SELECT ?, ns, checkpoint_id, task_id,"
                       " idx, channel, type, data, task_path FROM graph_writes"
                       " WHERE thread_id = ? ON CONFLICT DO NOTHING", (target, source))
            return n

    def _copy_sealed(self, source: str, target: str) -> int:
        """copy_thread with a data key: each value is opened and sealed again for its
        new row (a sealed value is bound to its row's key, thread included)."""
        sealed = self.sealed
        with self._tx() as db:
            cps = [_gcp(r, sealed) for r in db.execute(
                f"SELECT {_GCP_COLS} FROM graph_checkpoints WHERE thread_id = ?",
                (source,)).fetchall()]
            blobs = [GraphBlob(source, ns, ch, v, Typed(type_, sealed.open_bytes(
                data, "graph_blobs", "data", source, ns, ch, v)))
                for ns, ch, v, type_, data in db.execute(
                    "SELECT ns, channel, version, type, data FROM graph_blobs"
                    " WHERE thread_id = ?", (source,)).fetchall()]
            writes = [_write(source, r[0], r[1], r[2:], sealed) for r in db.execute(
                "SELECT ns, checkpoint_id, task_id, idx, channel, type, data, task_path"
                " FROM graph_writes WHERE thread_id = ?", (source,)).fetchall()]
            db.executemany(f"INSERT INTO graph_checkpoints ({_GCP_COLS}, run_id)"
                           " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)" + _REPLACE_CHECKPOINT,
                           [_gcp_row(replace(cp, thread_id=target), sealed) for cp in cps])
            db.executemany("INSERT INTO graph_blobs VALUES (?, ?, ?, ?, ?, ?)"
                           " ON CONFLICT DO NOTHING",
                           [_blob_row(replace(b, thread_id=target), sealed) for b in blobs])
            db.executemany("INSERT INTO graph_writes VALUES (?,?,?,?,?,?,?,?,?)"
                           " ON CONFLICT DO NOTHING",
                           [_write_row(replace(w, thread_id=target), sealed) for w in writes])
            return len(cps)


class SqliteGraphStore(SqlGraphStore, SqliteDatabase):
    """Graph records in their own SQLite file beside the world's metadata."""

    def __init__(self, path: str, key: DataKey | None = None) -> None:
        self.sealed = Columns(key)
        super().__init__(path, GRAPH_SCHEMA)


# PostgreSQL's types for the same tables (bytes are BYTEA).
PG_GRAPH_SCHEMA = ddl(_GRAPH_SCHEMA, POSTGRESQL)


class PostgresGraphStore(SqlGraphStore):
    """Graph records in the fleet's PostgreSQL database, so a thread is read and
    resumed from any host."""

    def __init__(self, url: str, key: DataKey | None = None) -> None:
        from .postgres_db import LOCK_MIGRATIONS, PostgresDatabase
        self.sealed = Columns(key, as_text=True)  # metadata TEXT: base64; data BYTEA
        self._db = PostgresDatabase(url)
        with self._db.advisory_lock(LOCK_MIGRATIONS), self._db._tx() as db:
            db.execute(PG_GRAPH_SCHEMA)
        self.path = self._db.path

    def _tx(self):
        return self._db._tx()

    def _one(self, sql, args=()):
        return self._db._one(sql, args)

    def _all(self, sql, args=()):
        return self._db._all(sql, args)

    def compact_wal(self, idle_seconds: float) -> bool:
        return False

    def close(self) -> None:
        self._db.close()
