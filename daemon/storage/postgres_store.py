"""The fleet's metadata store: PostgreSQL, shared by every daemon of a fleet.

The statements are ``SqlStore``'s (sql_store.py), the same as SQLite's; what differs
is how concurrent daemons are kept apart. A head's compare-and-set reads the session
row ``FOR UPDATE``, so two hosts appending to one session serialise and the second
sees the head moved (``Aborted``); the audit chain's tail is held by a transaction
advisory lock, so events from every host form one chain; a tool call citing an
approval locks the approval's row, so an approval is used up once fleet-wide. The
schema is versioned (migrations.py), applied at start under an advisory lock.
"""

from __future__ import annotations

from contextlib import contextmanager

from worldline.wire.errors import Aborted

from . import blob_index
from .blob_index import BlobIndexSql, StoredObject
from .crypto import DataKey
from .migrations import Migration, latest, migrate
from .postgres_db import LOCK_AUDIT_CHAIN, LOCK_GC, LOCK_MIGRATIONS, PostgresDatabase, psycopg
from .schema import METADATA, POSTGRESQL, ddl
from .sealed import Columns
from .sql_store import SqlStore

SCHEMA = ddl(METADATA, POSTGRESQL)

# Version 3 is the first PostgreSQL schema (SQLite's numbering: the same columns).
MIGRATIONS = (
    Migration(3, "0.5: the first PostgreSQL schema", lambda db: None),
    Migration(4, "0.6: the blob index of the bucket",
              lambda db: db.execute(blob_index.PG_SCHEMA)),
    Migration(5, "0.6: the host that holds a session, its lease", lambda db: db.execute(
        "ALTER TABLE sessions ADD COLUMN IF NOT EXISTS host TEXT NOT NULL DEFAULT '';"
        " ALTER TABLE sessions ADD COLUMN IF NOT EXISTS lease_expires DOUBLE PRECISION"
        " NOT NULL DEFAULT 0; ALTER TABLE sessions ADD COLUMN IF NOT EXISTS released_to TEXT;"
        " CREATE INDEX IF NOT EXISTS sessions_by_host ON sessions (host)")),
    Migration(6, "0.6: where each host answers", lambda db: db.execute(
        "CREATE TABLE IF NOT EXISTS hosts (host TEXT PRIMARY KEY, address TEXT NOT NULL,"
        " seen_at DOUBLE PRECISION NOT NULL)")),
    Migration(7, "0.7: digests as bytes, not hex text", lambda db: db.execute(
        "ALTER TABLE checkpoints ALTER COLUMN tree TYPE BYTEA USING decode(tree, 'hex'),"
        " ALTER COLUMN state_digest TYPE BYTEA USING decode(state_digest, 'hex'),"
        " ALTER COLUMN tasks_digest TYPE BYTEA USING decode(tasks_digest, 'hex'),"
        " ALTER COLUMN container TYPE BYTEA USING decode(container, 'hex');"
        " ALTER TABLE audit ALTER COLUMN prev_hash TYPE BYTEA USING decode(prev_hash, 'hex'),"
        " ALTER COLUMN hash TYPE BYTEA USING decode(hash, 'hex')")),
    # No change: a host older than this step reads the bucket's "zstd" entries as raw
    # bytes (and fails them as corrupt, DataLoss); the version makes such a host refuse
    # the store at start. Hosts already running are not asked again: stop them before
    # the first host of this version starts (docs/fleet.md, Upgrading a fleet).
    Migration(10, "0.7.8: the bucket's entries may be zstd frames (codec 'zstd')",
              lambda db: None),
    # No change either: a host older than this step fails the bucket's entries of codec
    # "delta" (a host's packs rewritten at rest, bucket_packs.py) as an unknown codec;
    # the version makes such a host refuse the store at start, as above.
    Migration(11, "0.7.14: the bucket's entries may be deltas within their object"
              " (codec 'delta')", lambda db: None),
    Migration(12, "0.7.15: a checkpoint's new blobs may be staged in the metadata store"
              " (blob_objects.body)", lambda db: db.execute(
                  "ALTER TABLE blob_objects ADD COLUMN IF NOT EXISTS body BYTEA")),
    # A host older than this step neither publishes the holds of its restores and forks
    # nor reads other hosts' before gc: the version makes it refuse the store at start.
    Migration(13, "0.7.28: the checkpoints each host's restores and forks hold (holds);"
              " the audit log by kind and time (gc reads its recent prunes)",
              lambda db: db.execute(
                  "CREATE TABLE IF NOT EXISTS holds (host TEXT NOT NULL, checkpoint_id TEXT"
                  " NOT NULL, expires DOUBLE PRECISION NOT NULL,"
                  " PRIMARY KEY (host, checkpoint_id));"
                  " CREATE INDEX IF NOT EXISTS audit_by_kind ON audit (kind, created_at)")),
    Migration(14, "0.8: a checkpoint's warnings (checkpoints.warnings, a JSON list or '')",
              lambda db: db.execute("ALTER TABLE checkpoints ADD COLUMN IF NOT EXISTS"
                                    " warnings TEXT NOT NULL DEFAULT ''")),
    # No change: a host that knows no data key would read sealed values as text and
    # write its own in the clear among them; the version makes it refuse the store.
    Migration(15, "0.8: the agent's content may be sealed with a data key (meta.sealed)",
              lambda db: None),
)
SCHEMA_VERSION = latest(MIGRATIONS)


class PostgresStore(SqlStore, BlobIndexSql, PostgresDatabase):
    FOR_UPDATE = " FOR UPDATE"
    IN_LIST = "{column} = ANY(?)"
    local = False  # every commit waits on the network (Store.local)

    def flush_later(self) -> None:
        return None  # a commit's wait is the network's

    def __init__(self, url: str, pool_size: int = 8, connect_timeout: float = 10.0,
                 key: DataKey | None = None) -> None:
        """``key``: the data key whose ``meta`` subkey seals the agent's content
        (sealed.py: as base64 text, which a TEXT column takes); None keeps every value
        in the clear."""
        PostgresDatabase.__init__(self, url, pool_size=pool_size,
                                  connect_timeout=connect_timeout)
        self.integrity_errors = (psycopg.IntegrityError,)
        self.sealed = Columns(key, as_text=True)
        with self.advisory_lock(LOCK_MIGRATIONS):
            self.schema_found, self.schema_version = migrate(
                self._tx, lambda db: db.execute(SCHEMA + blob_index.PG_SCHEMA), MIGRATIONS,
                f"metadata store {self.path}")
        self._bind_key()

    @contextmanager
    def gc_lock(self):
        with self.advisory_lock(LOCK_GC, wait=False) as got:
            if not got:
                raise Aborted("garbage collection, or a host rewriting its packs in the bucket, is"
                              " running on another host; try later")
            yield

    def add_blob_object(self, name, nbytes, host, created_at, entries, body=None):
        # One statement, atomic by itself: no transaction of its own to begin and end.
        self._write_one(*_objects_statement([StoredObject(name, nbytes, host, created_at,
                                                          entries, body)]))

    def add_objects(self, db, objects):
        if objects:
            db.execute(*_objects_statement(objects))

    def _lock_chain(self, db) -> None:
        db.execute("SELECT pg_advisory_xact_lock(?)", (LOCK_AUDIT_CHAIN,))

    @staticmethod
    def _list_arg(values: list[str]):
        return list(values)


def _objects_statement(objects: list[StoredObject]) -> tuple[str, tuple]:
    """The objects and their index rows in one statement (one round trip), the rows in
    digest order (blob_index.index_rows). Each object is a statement of its own in the
    WITH, its bytes a parameter of their own: a bytea in an array would be sent as
    escaped text, which cost a staged checkpoint of 20 KB almost a millisecond."""
    heads = sorted(objects)
    rows = blob_index.index_rows(objects)
    sql = ("WITH " + ", ".join(f"o{i} AS (INSERT INTO blob_objects VALUES (?, ?, ?, ?, ?)"
                                " ON CONFLICT (name) DO NOTHING)" for i in range(len(heads)))
           + " INSERT INTO blob_index SELECT * FROM unnest(?::text[], ?::text[], ?::bigint[],"
           " ?::bigint[], ?::bigint[], ?::text[], ?::double precision[])" + blob_index.RENEW)
    return sql, (*[v for o in heads for v in (o.name, o.nbytes, o.created_at, o.host, o.body)],
                 *([list(c) for c in zip(*rows, strict=True)] if rows else [[]] * 7))
