"""The blob index: where each blob of a bucket lives (the fleet's blob store,
s3_blobs.py), kept in the metadata store so every host finds every blob.

- ``blob_objects``: the bucket's objects (packs of small blobs, large blobs alone),
  recorded once their PUT has succeeded: an index row never names an object the
  bucket does not have. A **staged** object (its name under ``staged/``) is not in
  the bucket: its bytes are the row's ``body``, written in the same transaction as the
  row (a checkpoint's few new blobs, until the host moves them to the bucket:
  s3_blobs.py), so forgetting the row forgets the bytes too. A checkpoint's objects
  are recorded in the checkpoint's own transaction (``add_objects``, called by
  ``append_checkpoint``); other uploads in one transaction per object
  (``add_blob_object``).
- ``blob_index``: digest -> (object, offset, length, size, codec, stored_at).
  ``stored_at`` is renewed whenever a host finds the blob already stored and relies
  on it (``touch_blobs``), in one statement with the finding, and when a host records
  an object holding a blob indexed already (the row keeps its first location), so
  garbage collection, which removes only rows older than its grace period (one
  statement: ``forget_blob``), never removes a blob a checkpoint being committed
  relies on: either the renewal comes first and the row stays, or the removal does and
  the recording inserts the row again, naming its own copy.

``BlobIndexSql`` is mixed into the SQL stores (SQLite, PostgreSQL): it uses their
``_tx``, ``_one``, ``_all``, ``IN_LIST`` and ``_list_arg``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple, Protocol

from .schema import POSTGRESQL, SQLITE, ddl

_SCHEMA = """
CREATE TABLE IF NOT EXISTS blob_objects (
    name TEXT PRIMARY KEY, bytes BIGINT NOT NULL, created_at DOUBLE PRECISION NOT NULL,
    host TEXT NOT NULL, body $BLOB);
CREATE TABLE IF NOT EXISTS blob_index (
    digest TEXT PRIMARY KEY, object TEXT NOT NULL, off BIGINT NOT NULL, len BIGINT NOT NULL,
    size BIGINT NOT NULL, codec TEXT NOT NULL, stored_at DOUBLE PRECISION NOT NULL);
CREATE INDEX IF NOT EXISTS blob_index_by_object ON blob_index (object);
"""
SCHEMA, PG_SCHEMA = ddl(_SCHEMA, SQLITE), ddl(_SCHEMA, POSTGRESQL)  # schema.py

STAGED = "staged/"  # a staged object's name starts so: its bytes are in its row
STAGED_RANGE = ("name >= 'staged/' AND name < 'staged0'")  # those names (an index range)


def is_staged(name: str) -> bool:
    return name.startswith(STAGED)


def index_rows(objects: list[StoredObject]) -> list[tuple]:
    """The index rows (digest, object, offset, length, size, codec, stored_at) that
    record ``objects``, one per digest, in digest order: a digest in several keeps its
    place in the first by name, renewed to the latest ``created_at`` (as recording them
    one by one would leave it)."""
    rows: dict[str, tuple] = {}
    for o in sorted(objects):
        for d, off, ln, size, codec in o.entries:
            first = rows.get(d)
            rows[d] = ((d, o.name, off, ln, size, codec, o.created_at) if first is None
                       else first[:6] + (max(first[6], o.created_at),))
    return [rows[d] for d in sorted(rows)]


# Forget an object (its name twice) once no index row names it.
FORGET_OBJECT = ("DELETE FROM blob_objects WHERE name = ? AND NOT EXISTS"
                 " (SELECT 1 FROM blob_index WHERE object = ?)")

# An index row for a digest indexed already: its location stays, its stored_at renews.
RENEW = (" ON CONFLICT (digest) DO UPDATE SET stored_at = excluded.stored_at"
         " WHERE blob_index.stored_at < excluded.stored_at")


class Location(NamedTuple):
    object: str
    off: int
    len: int
    size: int
    codec: str  # "zstd" (a zstd frame), "raw", "delta" (bucket_packs.py) or "pack" (zlib,
    # what older versions wrote)
    stored_at: float


class StoredObject(NamedTuple):
    """An object the bucket holds, not yet in the index: its name, size, the host
    that wrote it, when, and its entries (digest, offset, length, size, codec); a
    staged object's ``body`` too (its bytes, which its row keeps)."""
    name: str
    nbytes: int
    host: str
    created_at: float
    entries: list[tuple[str, int, int, int, str]]
    body: bytes | None = None


class BlobIndex(Protocol):
    def add_blob_object(self, name: str, nbytes: int, host: str, created_at: float,
                        entries: list[tuple[str, int, int, int, str]],
                        body: bytes | None = None) -> None:
        """Record an object the bucket now holds (or a staged one and its ``body``) and
        the blobs in it (digest, offset, length, size, codec), in one transaction; a
        digest indexed already keeps its first location, its ``stored_at`` renewed."""

    def touch_blobs(self, digests: list[str], now: float) -> set[str]:
        """Which of ``digests`` are indexed; their ``stored_at`` becomes ``now``."""

    def locate_blobs(self, digests: list[str]) -> dict[str, Location]: ...
    def indexed_digests(self) -> Iterator[str]: ...

    def forget_blob(self, digest: str, older_than: float | None) -> int:
        """Remove the digest's row (only if stored before ``older_than``); the length
        it held in its object, 0 if nothing was removed."""

    def blob_objects(self) -> list[tuple[str, int, float, int, str]]:
        """(name, bytes, created_at, bytes still indexed, host) of every object."""

    def remove_blob_object(self, name: str) -> None:
        """Forget an object that no row names any longer (after its DELETE)."""

    def object_entries(self, name: str) -> list[tuple[str, Location]]:
        """The blobs indexed in object ``name``, in offset order."""

    def staged_body(self, name: str) -> bytes | None:
        """A staged object's bytes; None once it is forgotten (moved to the bucket)."""

    def staged_objects(self, host: str | None, older_than: float
                       ) -> list[tuple[str, int, float, str]]:
        """(name, bytes, created_at, host) of the staged objects of ``host`` (of every
        host: None) made before ``older_than``, oldest first."""

    def staged_entries(self, names: list[str]
                       ) -> dict[str, tuple[bytes, list[tuple[str, Location]]]]:
        """name -> (body, the blobs indexed in it in offset order) of those of the
        staged objects ``names`` still recorded."""

    def rewrite_blobs(self, new: StoredObject, read_from: dict[str, str]) -> list[str]:
        """Record object ``new`` (a rewrite of others) and point the row of each of its
        entries that still names the object it was read from (``read_from``: digest ->
        that object) at its place in ``new`` (offset, length and codec), and forget those
        objects that no row names any longer, in one transaction; return the objects
        forgotten (only those may be deleted from the bucket: one a checkpoint recorded
        a row in meanwhile stays, for gc to judge)."""


class BlobIndexSql:
    def add_blob_object(self, name, nbytes, host, created_at, entries, body=None):
        with self._tx() as db:
            self.add_objects(db, [StoredObject(name, nbytes, host, created_at, entries, body)])

    def add_objects(self, db, objects: list[StoredObject]) -> None:
        """Record ``objects`` inside the caller's transaction ``db``, their index rows in
        digest order (index_rows: two transactions writing some of the same rows wait
        for each other in one order, never in a cycle); what is recorded already stays
        where it is, renewed."""
        db.executemany("INSERT INTO blob_objects VALUES (?, ?, ?, ?, ?) ON CONFLICT (name)"
                       " DO NOTHING", [(o.name, o.nbytes, o.created_at, o.host, o.body)
                                       for o in sorted(objects)])
        db.executemany("INSERT INTO blob_index VALUES (?, ?, ?, ?, ?, ?, ?)" + RENEW,
                       index_rows(objects))

    def touch_blobs(self, digests, now):
        found: set[str] = set()
        for i in range(0, len(digests), 1000):
            chunk = digests[i:i + 1000]
            rows = self._write_one("UPDATE blob_index SET stored_at = ? WHERE "
                                   + self.IN_LIST.format(column="digest") + " RETURNING digest",
                                   (now, self._list_arg(chunk)))
            found.update(r[0] for r in rows)
        return found

    def locate_blobs(self, digests):
        out: dict[str, Location] = {}
        for i in range(0, len(digests), 1000):
            chunk = digests[i:i + 1000]
            rows = self._all("SELECT digest, object, off, len, size, codec, stored_at FROM"
                             " blob_index WHERE " + self.IN_LIST.format(column="digest"),
                             (self._list_arg(chunk),))
            out.update((r[0], Location(*r[1:])) for r in rows)
        return out

    def indexed_digests(self):
        return iter([r[0] for r in self._all("SELECT digest FROM blob_index ORDER BY digest")])

    def forget_blob(self, digest, older_than):
        with self._tx() as db:
            if older_than is None:
                row = db.execute("DELETE FROM blob_index WHERE digest = ? RETURNING len",
                                 (digest,)).fetchone()
            else:
                row = db.execute("DELETE FROM blob_index WHERE digest = ? AND stored_at < ?"
                                 " RETURNING len", (digest, older_than)).fetchone()
        return 0 if row is None else row[0]

    def blob_objects(self):
        return [tuple(r) for r in self._all(
            "SELECT o.name, o.bytes, o.created_at, CAST(COALESCE(SUM(i.len), 0) AS BIGINT),"
            " o.host FROM blob_objects o"
            " LEFT JOIN blob_index i ON i.object = o.name"
            " GROUP BY o.name, o.bytes, o.created_at, o.host ORDER BY o.name")]

    def object_entries(self, name):
        rows = self._all("SELECT digest, object, off, len, size, codec, stored_at FROM"
                         " blob_index WHERE object = ? ORDER BY off", (name,))
        return [(r[0], Location(*r[1:])) for r in rows]

    def staged_body(self, name):
        row = self._one("SELECT body FROM blob_objects WHERE name = ?", (name,))
        return None if row is None or row[0] is None else bytes(row[0])

    def staged_objects(self, host, older_than):
        rows = self._all("SELECT name, bytes, created_at, host FROM blob_objects WHERE "
                         + STAGED_RANGE + " AND created_at < ? ORDER BY created_at, name",
                         (older_than,))
        return [tuple(r) for r in rows if host is None or r[3] == host]

    def staged_entries(self, names):
        out: dict[str, tuple[bytes, list[tuple[str, Location]]]] = {}
        for i in range(0, len(names), 1000):  # two queries a thousand objects
            chunk = self._list_arg(names[i:i + 1000])
            for name, body in self._all("SELECT name, body FROM blob_objects WHERE "
                                        + self.IN_LIST.format(column="name")
                                        + " AND body IS NOT NULL", (chunk,)):
                out[name] = (bytes(body), [])
            for r in self._all("SELECT digest, object, off, len, size, codec, stored_at FROM"
                               " blob_index WHERE " + self.IN_LIST.format(column="object")
                               + " ORDER BY object, off", (chunk,)):
                if r[1] in out:
                    out[r[1]][1].append((r[0], Location(*r[1:])))
        return {name: out[name] for name in names if name in out}  # in the order asked

    def rewrite_blobs(self, new, read_from):
        with self._tx() as db:
            db.execute("INSERT INTO blob_objects VALUES (?, ?, ?, ?, ?) ON CONFLICT (name)"
                       " DO NOTHING", (new.name, new.nbytes, new.created_at, new.host,
                                       new.body))
            # In digest order, as every writer of several rows takes them (add_objects,
            # touch_blobs): a checkpoint renewing some of these rows meanwhile waits for
            # this transaction, or it for the checkpoint, never both.
            db.executemany("UPDATE blob_index SET object = ?, off = ?, len = ?, codec = ?"
                           " WHERE digest = ? AND object = ?",
                           [(new.name, off, length, codec, d, read_from[d])
                            for d, off, length, _size, codec in sorted(new.entries)])
            return [old for old in sorted(set(read_from.values()))
                    if db.execute(FORGET_OBJECT + " RETURNING name", (old, old)).fetchone()]

    def remove_blob_object(self, name):
        with self._tx() as db:
            db.execute(FORGET_OBJECT, (name, name))
