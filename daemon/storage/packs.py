"""The pack: small blobs packed into one SQLite file, compressed, and stored as
differences from an earlier version where that is much smaller.

Why: a checkpoint after a small edit stores a few changed files and the trees of
the folders above them, a dozen blobs of a few KB each. As files, each costs a
file-system block and an inode, and each stores the whole content again although
one line changed. In the pack each is a row; a changed file or tree whose previous
version is given as its *base* is stored as a *delta*: a splice when the change is
one small region, else copies from anywhere in the base, and later, by the idle
repack, the smallest of those or a zstd frame with the base as dictionary. The
encodings of a row are rows.py's; this module keeps the rows: the SQLite table, its
index, the rows pending a commit and a cache of recent blobs.

Rules that keep every blob readable:
- A delta's base is itself in the pack, and a chain of deltas is at most
  ``MAX_DEPTH`` long: past that a version is stored whole (compressed).
- A blob that a stored or pending delta depends on is never deleted; gc's sweep
  takes dependents first (``digests_dependents_first``), so one pass frees a chain.
- A put *pins* the base it reads (under the store's lock, which deletions take)
  until its delta is pending, so a base cannot vanish between the two.
- Reads rebuild the blob and verify its SHA-256: a damaged row anywhere in a chain
  is ``DataLoss``, never wrong bytes.

Durability is the blob store's: rows are *pending* (readable by this process) until
``commit``, one transaction per sync, in WAL mode.

With a data key (``--encryption-key``) every row's bytes are sealed as they are
committed (AES-256-GCM, the row's digest as associated data: a row copied under
another digest does not open), after their compression or delta, so both still work;
a row read back is opened before it is decoded, and a bad tag is ``DataLoss``.
Pending rows, in memory, stay open.
"""

from __future__ import annotations

import logging
import math
import os
import re
import struct
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Collection, Iterator
from dataclasses import dataclass

import zstandard
from worldline.wire.errors import DataLoss, NotFound

from ..faults import crash_point
from .rows import (  # noqa: F401 - the encodings, importable from here as they always were
    COPIES,
    COPY_BLOCK,
    DELTA,
    FAST,
    MAX_BLOB,
    RAW,
    SMALL,
    SPLICE_MAX,
    WHOLE,
    ZDELTA,
    ZLIB,
    ZSTD,
    _read_varint,
    _varint,
    apply_copies,
    apply_copies_python,
    apply_copies_row,
    apply_delta,
    best_delta,
    compress,
    compress_whole,
    copy_delta,
    copy_delta_python,
    decode_whole,
    decompress,
    encode_delta,
    pack_hex,
    pack_hex_python,
    quick_delta,
    shared_ends,
    shared_ends_python,
    unpack_hex,
    unpack_hex_python,
    zstd_apply,
    zstd_delta,
    zstd_whole,
)
from .sqlite_store import SqliteDatabase, to_incremental_vacuum

log = logging.getLogger("worldline.pack")

MAX_DEPTH = 100  # a cold read rebuilds at most this many versions (about 3 ms)
_CACHE_BYTES = 32 << 20

# The index key: the digest's first KEY_BYTES bytes. A pack written by older versions
# keys its rows by 8 (and keeps them: the key is read from its index at open). Four
# bytes tell rows apart as well in practice (a lookup among ten million rows meets
# another row of its key one time in 400, checked whole) and make each index entry 4
# bytes smaller: the index is a fifth smaller, and what a checkpoint adds to it too.
KEY_BYTES = 4

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS objects (
    id INTEGER PRIMARY KEY,     -- in order of storing: rows are appended
    digest BLOB NOT NULL, kind INTEGER NOT NULL, base INTEGER, depth INTEGER NOT NULL,
    size INTEGER NOT NULL, stored_ms INTEGER NOT NULL, data BLOB NOT NULL,
    dependents INTEGER NOT NULL DEFAULT 0);  -- rows whose base this row is
-- found by the digest's first KEY_BYTES bytes (a short key to index), then checked whole
CREATE INDEX IF NOT EXISTS objects_by_key ON objects (substr(digest, 1, {KEY_BYTES}));
-- the rows built on a row (the repack moves them when it gives the row a new base)
CREATE INDEX IF NOT EXISTS objects_by_base ON objects (base) WHERE base IS NOT NULL;
-- how far the idle repack has come (the last row id it looked at)
CREATE TABLE IF NOT EXISTS marks (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""
# A new pack gives freed pages back to the file system a few at a time (the repack's
# `incremental_vacuum`); a pack an older version made without that is converted once
# at open when small.
FIRST = "PRAGMA auto_vacuum=INCREMENTAL;"
CONVERT_AT_OPEN = 1 << 30

_BELOW = ("WITH RECURSIVE d(id) AS (SELECT id FROM objects WHERE base = ?"
          " UNION SELECT o.id FROM objects AS o JOIN d ON o.base = d.id)"
          " SELECT o.id, o.depth, o.digest FROM objects AS o JOIN d ON o.id = d.id")


_INDEX_KEY = re.compile(r"substr\(digest,\s*1,\s*(\d+)\)")


def _key_bytes(db) -> int:
    """How many bytes of the digest this pack's index keys its rows by."""
    sql = db.execute("SELECT sql FROM sqlite_master WHERE type = 'index'"
                     " AND name = 'objects_by_key'").fetchone()
    found = _INDEX_KEY.search(sql[0]) if sql is not None else None
    if found is None:
        raise DataLoss(f"a pack's key index is not one this worldline knows: {sql}")
    return int(found.group(1))


@dataclass(frozen=True)
class Row:
    kind: int
    base: str | None
    depth: int
    size: int
    stored_at: float
    data: bytes
    sealed: bool = False  # ``data`` as the pack file holds it, sealed (Pack.key)


_SIX_WORDS = struct.Struct("<6I")


class _Bloom:
    """The digests stored in the pack, approximately: "absent" is certain, "present"
    is checked in the database. A put of new content, the usual case, asks nothing of
    SQLite. Digests are uniform already: six 4-byte slices are the six hashes."""

    def __init__(self, expected: int) -> None:
        self.bits = 1 << max(23, (expected * 16).bit_length())
        self.mask = self.bits - 1
        self.array = bytearray(self.bits // 8)
        self.count = 0
        self._lock = threading.Lock()

    def add(self, raw: bytes) -> None:
        mask = self.mask
        with self._lock:
            for p in _SIX_WORDS.unpack_from(raw):
                p &= mask
                self.array[p >> 3] |= 1 << (p & 7)
            self.count += 1

    def __contains__(self, raw: bytes) -> bool:
        # unrolled: asked for every blob a checkpoint puts
        a, b, c, d, e, f = _SIX_WORDS.unpack_from(raw)
        m, bits = self.mask, self.array
        a, b, c, d, e, f = a & m, b & m, c & m, d & m, e & m, f & m
        return bool(bits[a >> 3] >> (a & 7) & 1 and bits[b >> 3] >> (b & 7) & 1
                    and bits[c >> 3] >> (c & 7) & 1 and bits[d >> 3] >> (d & 7) & 1
                    and bits[e >> 3] >> (e & 7) & 1 and bits[f >> 3] >> (f & 7) & 1)

    @property
    def crowded(self) -> bool:
        return self.count * 16 > self.bits


class Pack(SqliteDatabase):
    """The pack file of a LocalBlobStore. The store's lock guards ``pending`` and
    ``committing`` changes and every ``delete``; reads take no lock of the store's."""

    def __init__(self, path: str, durable: bool = True,
                 lock: threading.RLock | None = None, key=None) -> None:
        """``lock``: the metadata store's write lock when the pack lives in its file;
        ``key``: a crypto.DataKey that seals every row's bytes."""
        super().__init__(path, SCHEMA, FIRST, lock, flush=False)
        self.key = key
        self._convert_to_incremental_vacuum()
        # Commits are made durable by an fsync of the WAL (``commit``); deletions need
        # none: one lost to a crash only leaves garbage for the next gc. A cache in
        # front of a bucket (``durable=False``) skips that fsync: what a crash takes
        # from it is fetched again (WAL with synchronous=NORMAL stays consistent).
        self.durable = durable
        self._rows_at = 0  # the number (``_committed``) of the last commit of rows
        self.pending: dict[str, Row] = {}  # not yet committed: readable, not durable
        self.committing: dict[str, Row] = {}  # taken by the running commit
        self._cache: OrderedDict[str, tuple[bytes, int | None]] = OrderedDict()  # recent
        self._cached = 0  # blobs, and their depth when known: the next put's base
        self._cache_lock = threading.Lock()
        self._ids: OrderedDict[str, int] = OrderedDict()  # digest -> row id, recent rows
        self._key_len = _key_bytes(self._db)
        # every statement that finds a row by digest, with ``self._key(digest)``
        self._by_digest = self._matching("digest")
        self._row_by_digest = self._matching("o.digest")  # in ``row``'s join
        self._bloom = self._load_bloom()
        self.last_commit = 0.0  # monotonic time of the last sync's commit (repack waits)

    def _convert_to_incremental_vacuum(self) -> None:
        if self._db.execute("PRAGMA auto_vacuum").fetchone()[0] != 0:
            return
        size = os.path.getsize(self.path)
        if size > CONVERT_AT_OPEN:
            log.warning("%s (%d MB) was made by an older worldline: the space gc frees in"
                        " it is reused but not given back to the file system", self.path,
                        size >> 20)
            return
        log.info("converting %s (%d MB) to give freed space back, once", self.path,
                 size >> 20)
        to_incremental_vacuum(self._db, self.path)

    def _load_bloom(self) -> _Bloom:
        rows = self._all("SELECT digest FROM objects")
        bloom = _Bloom(len(rows))
        for (raw,) in rows:
            bloom.add(bytes(raw))
        return bloom

    def _matching(self, column: str) -> str:
        """The condition that finds a row by its digest in ``column`` through the index."""
        return f"substr({column}, 1, {self._key_len}) = ? AND {column} = ?"

    def _key(self, digest: str) -> tuple[bytes, bytes]:
        """(index key, digest bytes): rows are found by key, then checked whole."""
        raw = bytes.fromhex(digest)
        return raw[:self._key_len], raw

    def _remember_id(self, digest: str, row_id: int) -> None:
        with self._cache_lock:
            self._ids[digest] = row_id
            self._ids.move_to_end(digest)
            if len(self._ids) > 100_000:
                self._ids.popitem(last=False)

    # -- reading -------------------------------------------------------------------------
    def row(self, digest: str) -> Row | None:
        found = self.pending.get(digest) or self.committing.get(digest)
        if found is not None:
            return found
        key = self._key(digest)
        if key[1] not in self._bloom:
            return None
        r = self._one("SELECT o.kind, b.digest, o.depth, o.size, o.stored_ms / 1000.0, o.data,"
                      " o.id FROM objects AS o LEFT JOIN objects AS b ON b.id = o.base"
                      f" WHERE {self._row_by_digest}", key)
        if r is None:
            return None
        self._remember_id(digest, r[6])
        return Row(r[0], r[1].hex() if r[1] is not None else None, r[2], r[3], r[4], r[5],
                   self.key is not None)

    def _seal(self, digest: str | bytes, data: bytes) -> bytes:
        """A row's bytes as the file holds them (sealed with a key: ``row``)."""
        if self.key is None:
            return data
        raw = digest if isinstance(digest, bytes) else bytes.fromhex(digest)
        return self.key.seal_blob(data, raw)

    def _opened(self, digest: str, row: Row) -> bytes:
        if not row.sealed:
            return row.data
        try:
            return self.key.open_blob(row.data, bytes.fromhex(digest))
        except DataLoss:
            raise DataLoss(f"blob {digest} is corrupt: its row fails its authentication tag"
                           " (damaged, or sealed with another key)") from None

    def has(self, digest: str) -> bool:
        if digest in self.pending or digest in self.committing or digest in self._cache:
            return True  # (a dict's membership test needs no lock)
        key = self._key(digest)
        if key[1] not in self._bloom:
            return False  # new content, the usual case: nothing asked of SQLite
        return self._one(f"SELECT 1 FROM objects WHERE {self._by_digest}", key) is not None

    def present(self, digests: set[str]) -> set[str]:
        """Which of ``digests`` are stored, pending or committed: few queries for many.
        Pending rows and the cache (put or read here, not deleted since) answer first,
        the filter rules out what is new, and the database is asked about the rest."""
        found = {d for d in digests if d in self.pending or d in self.committing}
        with self._cache_lock:
            found |= {d for d in digests if d in self._cache}
        maybe = [self._key(d) for d in digests - found]
        maybe = [k for k in maybe if k[1] in self._bloom]
        for i in range(0, len(maybe), 500):
            chunk = maybe[i:i + 500]
            wanted = {k[1] for k in chunk}
            rows = self._all(f"SELECT digest FROM objects WHERE substr(digest, 1,"
                             f" {self._key_len}) IN ({', '.join('?' * len(chunk))})",
                             tuple(k[0] for k in chunk))
            found |= {bytes(r[0]).hex() for r in rows if bytes(r[0]) in wanted}
        return found

    def read(self, digest: str, cached: bool = True) -> bytes:
        """The blob's bytes, unverified (the caller verifies the digest); with
        ``cached`` False, rebuilt from the rows on disk alone."""
        if cached:
            with self._cache_lock:
                found = self._cache.get(digest)
            if found is not None:
                return found[0]
        row = self.row(digest)
        if row is None:
            raise NotFound(f"blob {digest} does not exist")
        return self._rebuilt(digest, row, cached)

    def _rebuilt(self, digest: str, row: Row, cached: bool) -> bytes:
        """The bytes of the blob stored as ``row`` (its base read as ``read`` does)."""
        stored = self._opened(digest, row)
        try:
            if row.kind in WHOLE:
                data = decode_whole(row.kind, stored, row.size)
            elif row.kind == COPIES:
                data = apply_copies_row(self.read(row.base, cached), stored, row.size)
            elif row.kind == ZDELTA:
                data = zstd_apply(self.read(row.base, cached), stored, row.size)
            elif row.kind == DELTA:
                data = apply_delta(self.read(row.base, cached), stored)
            else:
                raise DataLoss(f"blob {digest} has an unknown encoding {row.kind}")
        except (zlib.error, zstandard.ZstdError, ValueError) as exc:
            raise DataLoss(f"blob {digest} is corrupt: {exc}") from None
        except NotFound:
            raise DataLoss(f"blob {digest} is corrupt: its base {row.base} is gone") from None
        if len(data) != row.size:
            raise DataLoss(f"blob {digest} is corrupt: {len(data)} bytes, not {row.size}")
        return data

    def remember(self, digest: str, data: bytes, depth: int | None = None) -> None:
        """Keep a recent blob's bytes (and its depth, when known) in memory: the next
        version will be its delta."""
        if len(data) > MAX_BLOB:
            return
        with self._cache_lock:
            old = self._cache.get(digest)
            if old is not None:
                if depth is not None:
                    self._cache[digest] = (old[0], depth)
                return
            self._cache[digest] = (data, depth)
            self._cached += len(data)
            while self._cached > _CACHE_BYTES:
                _, (old_data, _depth) = self._cache.popitem(last=False)
                self._cached -= len(old_data)

    def forget(self, digest: str) -> None:
        with self._cache_lock:
            old = self._cache.pop(digest, None)
            if old is not None:
                self._cached -= len(old[0])
            self._ids.pop(digest, None)

    # -- writing -------------------------------------------------------------------------
    def encode(self, data: bytes, base: str | None, base_data: bytes | None,
               base_depth: int) -> Row:
        """The checkpoint's encoding of ``data``, quick to make (the agent waits): its
        delta from ``base`` when given (``quick_delta``) and it takes at most a quarter
        of its bytes, the usual edit; else the smaller of that delta and the whole blob
        compressed. The idle repack (repack.py) may make it smaller."""
        now = time.time()
        delta = None
        if base is not None and base_data is not None and base_depth < MAX_DEPTH:
            kind, encoded = quick_delta(base_data, data)
            delta = Row(kind, base, base_depth + 1, len(data), now, encoded)
            if len(delta.data) * 4 <= len(data):
                return delta
        kind, stored = compress_whole(data, FAST)
        best = Row(kind, None, 0, len(data), now, stored)
        # A delta costs its readers a rebuild: it must at least halve the row.
        return delta if delta is not None and len(delta.data) < len(best.data) // 2 else best

    def base_for(self, digest: str) -> tuple[bytes, int] | None:
        """(bytes, depth) of a blob that can serve as a base, or None."""
        with self._cache_lock:
            found = self._cache.get(digest)
        if found is not None and found[1] is not None:
            return (found[0], found[1]) if found[1] < MAX_DEPTH else None
        row = self.row(digest)
        if row is None or row.depth >= MAX_DEPTH:
            return None
        if found is not None:  # the bytes were known, their depth was not
            return found[0], row.depth
        try:  # from the row just read: one question to SQLite, not two
            return self._rebuilt(digest, row, True), row.depth
        except (NotFound, DataLoss):
            return None

    def commit(self, flush: bool = True) -> None:
        """Commit every row taken into ``committing``, in one transaction, and make it
        durable. ``flush=False`` leaves the fsync to the next flush of the same WAL: a
        pack in the metadata store's file, whose checkpoint commit follows and is
        flushed before it returns (sqlite_store.py); that fsync covers these rows,
        written before it to the same log. A later ``commit()`` flushes them too, even
        with no rows of its own."""
        rows = self.committing
        if rows:
            self._insert(rows)
            self._rows_at = self._committed
        if self.durable and flush:
            self._flush(self._rows_at)  # at once if an earlier fsync covered them

    @property
    def unflushed(self) -> bool:
        """A commit of rows left its fsync to a later one (``commit``)."""
        return self._flushed < self._rows_at

    def _insert(self, rows: dict[str, Row]) -> None:
        self.last_commit = time.monotonic()
        inserted: dict[str, int] = {}
        with self._tx() as db:
            next_id = (db.execute("SELECT max(id) FROM objects").fetchone()[0] or 0) + 1
            values, bases = [], []
            for digest, r in sorted(rows.items(), key=lambda item: item[1].depth):
                key = self._key(digest)
                if key[1] in self._bloom and db.execute(
                        f"SELECT 1 FROM objects WHERE {self._by_digest}",
                        key).fetchone() is not None:
                    continue  # stored already (the filter says so for new ones: never)
                base_id = None  # bases go first: a delta is one deeper than its base
                if r.base is not None:
                    base_id = inserted.get(r.base) or self._id_of(db, r.base)
                    if base_id is None:
                        raise DataLoss(f"blob {digest}: its base {r.base} is not stored")
                    bases.append((base_id,))
                inserted[digest] = next_id
                values.append((next_id, key[1], r.kind, base_id, r.depth, r.size,
                               math.ceil(r.stored_at * 1000), self._seal(key[1], r.data)))
                next_id += 1
                self._bloom.add(key[1])  # before the commit: "absent" must stay certain
            db.executemany("INSERT INTO objects (id, digest, kind, base, depth, size, stored_ms,"
                           " data) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", values)
            db.executemany("UPDATE objects SET dependents = dependents + 1 WHERE id = ?", bases)
        for digest, row_id in inserted.items():
            self._remember_id(digest, row_id)
        if self._bloom.crowded:
            self._bloom = self._load_bloom()

    def _id_of(self, db, digest: str) -> int | None:
        with self._cache_lock:
            known = self._ids.get(digest)
        if known is not None:
            return known
        found = db.execute(f"SELECT id FROM objects WHERE {self._by_digest}",
                           self._key(digest)).fetchone()
        return found[0] if found is not None else None

    def depends_on(self, digest: str, gone: Collection[str] = ()) -> bool:
        """True if a stored or pending delta has ``digest`` as its base; ``gone``: rows
        counted as deleted already (a dry run's sweep), whose deltas do not count."""
        for rows in (self.pending, self.committing):
            if any(r.base == digest for r in rows.values()):
                return True
        found = self._one(f"SELECT id, dependents FROM objects WHERE {self._by_digest}",
                          self._key(digest))
        if found is None or found[1] == 0:
            return False
        if not gone:
            return True
        built_on = self._all("SELECT digest FROM objects WHERE base = ?", (found[0],))
        return any(bytes(raw).hex() not in gone for (raw,) in built_on)

    def delete(self, digest: str) -> int:
        """Remove a committed row; the bytes it held (0 if absent)."""
        self.forget(digest)
        with self._tx() as db:
            r = db.execute(f"SELECT id, length(data), base FROM objects WHERE {self._by_digest}",
                           self._key(digest)).fetchone()
            if r is None:
                return 0
            db.execute("DELETE FROM objects WHERE id = ?", (r[0],))
            if r[2] is not None:
                db.execute("UPDATE objects SET dependents = dependents - 1 WHERE id = ?",
                           (r[2],))
            return r[1]

    # -- the idle repack (repack.py) -------------------------------------------------------
    def mark(self, name: str) -> int:
        found = self._one("SELECT value FROM marks WHERE name = ?", (name,))
        return found[0] if found is not None else 0

    def row_id(self, digest: str) -> tuple[int, int] | None:
        """(row id, depth) of a committed row."""
        return self._one(f"SELECT id, depth FROM objects WHERE {self._by_digest}",
                         self._key(digest))

    def below(self, row_id: int, db=None) -> dict[int, tuple[int, str]]:
        """The rows built on this one, directly or not: id -> (depth, digest)."""
        rows = (db.execute(_BELOW, (row_id,)).fetchall() if db is not None
                else self._all(_BELOW, (row_id,)))
        return {r[0]: (r[1], bytes(r[2]).hex()) for r in rows}

    def rewrite(self, changes, mark: str, through: int) -> set[str]:
        """Give rows new encodings (``repack._Change``s), each only if it is still as it
        was read and its new base is still there, is not built on it, and keeps the chain
        within MAX_DEPTH; move the rows built on it to their new depth; record ``mark``.
        One transaction. Returns the digests whose depth changed."""
        shifted: set[str] = set()
        with self._tx() as db:
            for c in changes:
                cur = db.execute("SELECT kind, base, length(data), depth FROM objects"
                                 " WHERE id = ?", (c.row_id,)).fetchone()
                if cur is None or tuple(cur[:3]) != c.old:
                    continue
                new_depth = 0
                built_on = self.below(c.row_id, db)
                deepest = max((d for d, _ in built_on.values()), default=-1)
                if c.base_id is not None:
                    base = db.execute("SELECT depth FROM objects WHERE id = ?",
                                      (c.base_id,)).fetchone()
                    if base is None or c.base_id == c.row_id or c.base_id in built_on:
                        continue
                    new_depth = base[0] + 1
                shift = new_depth - cur[3]
                if max(deepest, cur[3]) + shift > MAX_DEPTH:
                    continue
                db.execute("UPDATE objects SET kind = ?, base = ?, depth = ?, data = ?"
                           " WHERE id = ?", (c.kind, c.base_id, new_depth,
                                             self._seal(c.digest, c.data), c.row_id))
                if cur[1] is not None:
                    db.execute("UPDATE objects SET dependents = dependents - 1 WHERE id = ?",
                               (cur[1],))
                if c.base_id is not None:
                    db.execute("UPDATE objects SET dependents = dependents + 1 WHERE id = ?",
                               (c.base_id,))
                if shift and built_on:
                    db.executemany("UPDATE objects SET depth = depth + ? WHERE id = ?",
                                   [(shift, i) for i in built_on])
                    shifted.update(digest for _, digest in built_on.values())
                shifted.add(c.digest)
                crash_point("repack.mid")
            db.execute("INSERT INTO marks VALUES (?, ?) ON CONFLICT (name) DO UPDATE"
                       " SET value = excluded.value", (mark, through))
        return shifted

    def forget_depth(self, digest: str) -> None:
        """A row's depth changed: the next put asks the database, not the memory."""
        with self._cache_lock:
            found = self._cache.get(digest)
            if found is not None:
                self._cache[digest] = (found[0], None)

    def vacuum_step(self, pages: int) -> bool:
        """Give up to ``pages`` free pages back to the file system; False if none."""
        if self._one("PRAGMA freelist_count", ())[0] == 0:
            return False
        with self._tx() as db:
            db.execute(f"PRAGMA incremental_vacuum({int(pages)})").fetchall()
        return True

    def digests_dependents_first(self) -> Iterator[str]:
        for (digest,) in self._all("SELECT digest FROM objects ORDER BY depth DESC"):
            yield digest.hex()

    def stored_bytes(self, digest: str) -> int:
        row = self.row(digest)
        return len(row.data) if row is not None else 0
