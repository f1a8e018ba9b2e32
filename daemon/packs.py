"""The pack: small blobs packed into one SQLite file, compressed, and stored as
differences from an earlier version where that is much smaller.

Why: a checkpoint after a small edit stores a few changed files and the trees of
the folders above them, a dozen blobs of a few KB each. As files, each costs a
file-system block and an inode, and each stores the whole content again although
one line changed. In the pack each is a row; a changed file or tree whose previous
version is given as its *base* is stored as a *delta*: the length of the prefix and
suffix it shares with the base, and the zlib-compressed middle. Other rows are
zlib-compressed when that saves an eighth, else raw.

Rules that keep every blob readable:
- A delta's base is itself in the pack, and a chain of deltas is at most
  ``MAX_DEPTH`` long: past that a version is stored whole (compressed).
- A blob that a stored or pending delta depends on is never deleted; gc's sweep
  takes dependents first (``digests_dependents_first``), so one pass frees a chain.
- Choosing a base and recording the dependent happen under the store's lock, the
  lock deletions take, so a base cannot vanish between the two.
- Reads rebuild the blob and verify its SHA-256: a damaged row anywhere in a chain
  is ``DataLoss``, never wrong bytes.

Durability is the blob store's: rows are *pending* (readable by this process) until
``commit``, one transaction per sync, in WAL mode.
"""

from __future__ import annotations

import math
import os
import re
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

from worldline.client.errors import DataLoss, NotFound

from .sqlite_store import SqliteDatabase

MAX_BLOB = 1 << 20  # bigger blobs stay files: streamed, never held whole in memory
MAX_DEPTH = 100  # a cold read rebuilds at most this many versions (about 3 ms)
RAW, ZLIB, DELTA = 0, 1, 2
_CACHE_BYTES = 32 << 20

SCHEMA = """
CREATE TABLE IF NOT EXISTS objects (
    id INTEGER PRIMARY KEY,     -- in order of storing: rows are appended
    digest BLOB NOT NULL, kind INTEGER NOT NULL, base INTEGER, depth INTEGER NOT NULL,
    size INTEGER NOT NULL, stored_at INTEGER NOT NULL, data BLOB NOT NULL,
    dependents INTEGER NOT NULL DEFAULT 0);  -- rows whose base this row is
-- found by the digest's first 8 bytes (a short key to index), then checked whole
CREATE INDEX IF NOT EXISTS objects_by_key ON objects (substr(digest, 1, 8));
"""


_BY_DIGEST = "substr(digest, 1, 8) = ? AND digest = ?"  # with _key(digest): uses the index


def _key(digest: str) -> tuple[bytes, bytes]:
    """(index key, digest bytes): rows are found by key, then checked whole."""
    raw = bytes.fromhex(digest)
    return raw[:8], raw


@dataclass(frozen=True)
class Row:
    kind: int
    base: str | None
    depth: int
    size: int
    stored_at: float
    data: bytes


def _shared_prefix(a: bytes, b: bytes) -> int:
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:  # binary search over memcmp-speed slice comparisons
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _shared_suffix(a: bytes, b: bytes, limit: int) -> int:
    lo, hi = 0, limit
    la, lb = len(a), len(b)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[la - mid:la - lo] == b[lb - mid:lb - lo]:
            lo = mid
        else:
            hi = mid - 1
    return lo


_HEX_RUN = re.compile(rb"(?:[0-9a-f]{2}){16,}")


def pack_hex(data: bytes) -> bytes:
    """``data`` with every run of 32 or more lowercase hex digits (the digests trees,
    states and task lists are full of) replaced by the bytes it spells, half as many:
    varint(literal length), literal, varint(run length), run, ..., a literal last."""
    out = bytearray()
    at = 0
    for m in _HEX_RUN.finditer(data):
        run = bytes.fromhex(m.group().decode())
        out += _varint(m.start() - at) + data[at:m.start()] + _varint(len(run)) + run
        at = m.end()
    out += _varint(len(data) - at) + data[at:]
    return bytes(out)


def unpack_hex(packed: bytes) -> bytes:
    parts, at, literal = [], 0, True
    while True:
        n, at = _read_varint(packed, at)
        chunk = packed[at:at + n]
        if len(chunk) != n:
            raise ValueError("a packed blob is cut short")
        parts.append(chunk if literal else chunk.hex().encode())
        at += n
        if literal and at == len(packed):
            return b"".join(parts)
        literal = not literal


def compress(data: bytes) -> bytes:
    return zlib.compress(pack_hex(data), 1)


def decompress(data: bytes) -> bytes:
    return unpack_hex(zlib.decompress(data))


def encode_delta(base: bytes, data: bytes) -> bytes:
    """varint(shared prefix), varint(shared suffix), then the middle of ``data``,
    hex-packed and deflated with the part of ``base`` it replaces as dictionary."""
    prefix = _shared_prefix(base, data)
    suffix = _shared_suffix(base, data, min(len(base), len(data)) - prefix)
    middle = pack_hex(data[prefix:len(data) - suffix])
    replaced = pack_hex(base[prefix:len(base) - suffix])[-32768:]
    packer = (zlib.compressobj(6, zlib.DEFLATED, -15, zdict=replaced) if replaced
              else zlib.compressobj(6, zlib.DEFLATED, -15))
    return _varint(prefix) + _varint(suffix) + packer.compress(middle) + packer.flush()


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise ValueError("a varint is cut short")
        byte = data[at]
        n |= (byte & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if not byte & 0x80:
            return n, at


def apply_delta(base: bytes, delta: bytes) -> bytes:
    prefix, at = _read_varint(delta, 0)
    suffix, at = _read_varint(delta, at)
    if prefix + suffix > len(base):
        raise ValueError("a delta's shared prefix and suffix are longer than its base")
    replaced = pack_hex(base[prefix:len(base) - suffix])[-32768:]
    unpacker = (zlib.decompressobj(-15, zdict=replaced) if replaced
                else zlib.decompressobj(-15))
    middle = unpack_hex(unpacker.decompress(delta[at:]) + unpacker.flush())
    return base[:prefix] + middle + base[len(base) - suffix:]


class Pack(SqliteDatabase):
    """The pack file of a LocalBlobStore. Callers hold the store's lock around
    ``pending`` changes, ``has``, ``choose_base`` and ``delete``."""

    def __init__(self, path: str) -> None:
        super().__init__(path, SCHEMA)
        # Commits are made durable by an fsync of the WAL (``commit``); deletions need
        # none: one lost to a crash only leaves garbage for the next gc.
        self._db.execute("PRAGMA synchronous=NORMAL")
        self.pending: dict[str, Row] = {}  # not yet committed: readable, not durable
        self.committing: dict[str, Row] = {}  # taken by the running commit
        self._cache: OrderedDict[str, bytes] = OrderedDict()  # recent blobs, for bases
        self._cached = 0
        self._cache_lock = threading.Lock()

    # -- reading -------------------------------------------------------------------------
    def row(self, digest: str) -> Row | None:
        found = self.pending.get(digest) or self.committing.get(digest)
        if found is not None:
            return found
        r = self._one("SELECT o.kind, b.digest, o.depth, o.size, o.stored_at, o.data"
                      " FROM objects AS o LEFT JOIN objects AS b ON b.id = o.base"
                      " WHERE substr(o.digest, 1, 8) = ? AND o.digest = ?", _key(digest))
        if r is None:
            return None
        return Row(r[0], r[1].hex() if r[1] is not None else None, r[2], r[3], r[4], r[5])

    def has(self, digest: str) -> bool:
        return digest in self.pending or digest in self.committing or self._one(
            f"SELECT 1 FROM objects WHERE {_BY_DIGEST}", _key(digest)) is not None

    def read(self, digest: str, cached: bool = True) -> bytes:
        """The blob's bytes, unverified (the caller verifies the digest); with
        ``cached`` False, rebuilt from the rows on disk alone."""
        if cached:
            with self._cache_lock:
                found = self._cache.get(digest)
            if found is not None:
                return found
        row = self.row(digest)
        if row is None:
            raise NotFound(f"blob {digest} does not exist")
        try:
            if row.kind == RAW:
                data = row.data
            elif row.kind == ZLIB:
                data = decompress(row.data)
            elif row.kind == DELTA:
                data = apply_delta(self.read(row.base, cached), row.data)
            else:
                raise DataLoss(f"blob {digest} has an unknown encoding {row.kind}")
        except (zlib.error, ValueError) as exc:
            raise DataLoss(f"blob {digest} is corrupt: {exc}") from None
        except NotFound:
            raise DataLoss(f"blob {digest} is corrupt: its base {row.base} is gone") from None
        if len(data) != row.size:
            raise DataLoss(f"blob {digest} is corrupt: {len(data)} bytes, not {row.size}")
        return data

    def remember(self, digest: str, data: bytes) -> None:
        """Keep a recent blob's bytes in memory: the next version will be its delta."""
        if len(data) > MAX_BLOB:
            return
        with self._cache_lock:
            if digest in self._cache:
                return
            self._cache[digest] = data
            self._cached += len(data)
            while self._cached > _CACHE_BYTES:
                _, old = self._cache.popitem(last=False)
                self._cached -= len(old)

    def forget(self, digest: str) -> None:
        with self._cache_lock:
            old = self._cache.pop(digest, None)
            if old is not None:
                self._cached -= len(old)

    # -- writing -------------------------------------------------------------------------
    def encode(self, data: bytes, base: str | None, base_data: bytes | None,
               base_depth: int) -> Row:
        """The smallest encoding of ``data``: a delta from ``base`` when given."""
        now = time.time()
        best = Row(RAW, None, 0, len(data), now, data)
        if len(data) >= 64:
            packed = compress(data)
            if len(packed) < len(data) * 7 // 8:
                best = Row(ZLIB, None, 0, len(data), now, packed)
        if base is not None and base_data is not None and base_depth < MAX_DEPTH:
            delta = encode_delta(base_data, data)
            if len(delta) < len(best.data) // 2:
                best = Row(DELTA, base, base_depth + 1, len(data), now, delta)
        return best

    def base_for(self, digest: str) -> tuple[bytes, int] | None:
        """(bytes, depth) of a blob that can serve as a base, or None."""
        row = self.row(digest)
        if row is None or row.depth >= MAX_DEPTH:
            return None
        try:
            return self.read(digest), row.depth
        except (NotFound, DataLoss):
            return None

    def commit(self) -> None:
        """Make every row taken into ``committing`` durable, in one transaction."""
        rows = self.committing
        if not rows:
            return
        with self._tx() as db:
            for digest, r in sorted(rows.items(), key=lambda item: item[1].depth):
                key = _key(digest)
                if db.execute(f"SELECT 1 FROM objects WHERE {_BY_DIGEST}",
                              key).fetchone() is not None:
                    continue
                base_id = None  # bases go first: a delta is one deeper than its base
                if r.base is not None:
                    found = db.execute(f"SELECT id FROM objects WHERE {_BY_DIGEST}",
                                       _key(r.base)).fetchone()
                    if found is None:
                        raise DataLoss(f"blob {digest}: its base {r.base} is not stored")
                    base_id = found[0]
                    db.execute("UPDATE objects SET dependents = dependents + 1 WHERE id = ?",
                               (base_id,))
                db.execute("INSERT INTO objects (digest, kind, base, depth, size, stored_at,"
                           " data) VALUES (?, ?, ?, ?, ?, ?, ?)",
                           (key[1], r.kind, base_id, r.depth, r.size, math.ceil(r.stored_at),
                            r.data))
        try:
            fd = os.open(self.path + "-wal", os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return  # a checkpoint moved the rows into the database and synced it
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def depends_on(self, digest: str) -> bool:
        """True if a stored or pending delta has ``digest`` as its base."""
        for rows in (self.pending, self.committing):
            if any(r.base == digest for r in rows.values()):
                return True
        found = self._one(f"SELECT dependents FROM objects WHERE {_BY_DIGEST}",
                          _key(digest))
        return found is not None and found[0] > 0

    def delete(self, digest: str) -> int:
        """Remove a committed row; the bytes it held (0 if absent)."""
        self.forget(digest)
        with self._tx() as db:
            r = db.execute(f"SELECT id, length(data), base FROM objects WHERE {_BY_DIGEST}",
                           _key(digest)).fetchone()
            if r is None:
                return 0
            db.execute("DELETE FROM objects WHERE id = ?", (r[0],))
            if r[2] is not None:
                db.execute("UPDATE objects SET dependents = dependents - 1 WHERE id = ?",
                           (r[2],))
            return r[1]

    def digests_dependents_first(self) -> Iterator[str]:
        for (digest,) in self._all("SELECT digest FROM objects ORDER BY depth DESC"):
            yield digest.hex()

    def stored_bytes(self, digest: str) -> int:
        row = self.row(digest)
        return len(row.data) if row is not None else 0
