"""The pack: small blobs packed into one SQLite file, compressed, and stored as
differences from an earlier version where that is much smaller.

Why: a checkpoint after a small edit stores a few changed files and the trees of
the folders above them, a dozen blobs of a few KB each. As files, each costs a
file-system block and an inode, and each stores the whole content again although
one line changed. In the pack each is a row; a changed file or tree whose previous
version is given as its *base* is stored as a *delta*, made by a checkpoint in
microseconds because the agent is waiting (``quick_delta``), of one of two kinds:
- a *splice* (``DELTA``) when the change is one small region, the usual single edit:
  the length of the prefix and suffix it shares with the base, and the middle
  deflated (a few bytes of framing);
- else *copies* (``COPIES``, since 0.7.12): the bytes it shares with its base,
  anywhere in it and in any order, as copies, and the rest inserted (git's copy/insert
  delta; ``copy_delta``, in C), hex-packed, then compressed as one zstd frame at level
  ``FAST`` with this thread's compressor, which needs no dictionary to be set up.
The idle repack (repack.py) later stores a row as the smallest splice or *zstd frame*
(``ZDELTA``) it can make at zstd's strongest level, when that is an eighth smaller: a
frame compressed with the whole base as a raw-content dictionary, so every part of
the new version that the base holds is a copy and what is new is entropy coded.
Until 0.7.12 a checkpoint wrote those zstd frames itself. Over the 1,368 deltas of
more than one region that a replay of history-400 makes, in a loop: such a frame 23
us (median; 61 mean) and 590 KB in all, copies 10 us (19 mean) and 632 KB (4 us and
889 KB before their compression); inside a checkpoint the frame took about twice as
long.
Until 0.7 every delta was a splice, which stores everything between two edits far
apart.
Other rows are stored whole: a zstd frame (``ZSTD``, level ``FAST``) when that saves an
eighth, else raw; the idle repack may later store a row at zstd's strongest level.
Packs made before 0.7.8 also hold zlib rows (``ZLIB``: deflate of the hex-packed
bytes), which stay readable, and a cache filled from a bucket written before 0.7.8
takes its entries as such rows.

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
from .sqlite_store import SqliteDatabase, to_incremental_vacuum

log = logging.getLogger("worldline.pack")

MAX_BLOB = 1 << 20  # bigger blobs stay files: streamed, never held whole in memory
MAX_DEPTH = 100  # a cold read rebuilds at most this many versions (about 3 ms)
RAW, ZLIB, DELTA, ZDELTA, ZSTD, COPIES = 0, 1, 2, 3, 4, 5  # DELTA: a splice; ZDELTA: a
# zstd frame with the base as dictionary; COPIES: copies and inserts (copy_delta), zstd
WHOLE = (RAW, ZLIB, ZSTD)  # the kinds of a row that needs no base (decode_whole)
FAST, SMALL = 3, 19  # zstd levels: a checkpoint's deltas, and the idle repack's
_CACHE_BYTES = 32 << 20

# The index key: the digest's first KEY_BYTES bytes. A pack made before 0.7.4 keys its
# rows by 8 (and keeps them: the key is read from its index at open). Four bytes tell
# rows apart as well in practice (a lookup among ten million rows meets another row of
# its key one time in 400, checked whole) and make each index entry 4 bytes smaller:
# the index is a fifth smaller, and what a checkpoint adds to it too.
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
# `incremental_vacuum`); a pack made before 0.7 is converted once at open when small.
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


_BLOCK = 4096


def _shared_prefix(a: bytes, b: bytes) -> int:
    limit = min(len(a), len(b))
    lo = 0
    while lo + _BLOCK <= limit and a[lo:lo + _BLOCK] == b[lo:lo + _BLOCK]:
        lo += _BLOCK  # whole blocks first (memcmp speed), then a binary search in one
    hi = min(limit, lo + _BLOCK)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _shared_suffix(a: bytes, b: bytes, limit: int) -> int:
    la, lb = len(a), len(b)
    lo = 0
    while lo + _BLOCK <= limit and a[la - lo - _BLOCK:la - lo] == b[lb - lo - _BLOCK:lb - lo]:
        lo += _BLOCK
    hi = min(limit, lo + _BLOCK)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[la - mid:la - lo] == b[lb - mid:lb - lo]:
            lo = mid
        else:
            hi = mid - 1
    return lo


_HEX_RUN = re.compile(rb"(?:[0-9a-f]{2}){16,}")


def pack_hex_python(data: bytes) -> bytes:
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


def unpack_hex_python(packed: bytes) -> bytes:
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


try:  # the same codec in C (daemon/_codec.c): no Python loop per run
    from .._codec import pack_hex, unpack_hex
except ImportError:
    pack_hex, unpack_hex = pack_hex_python, unpack_hex_python


def compress(data: bytes) -> bytes:
    """A ``ZLIB`` row's bytes (and a bucket entry's of codec "pack"): what worldline
    wrote before 0.7.8, kept as the format ``decompress`` reads; nothing writes it now."""
    return zlib.compress(pack_hex(data), 1)


def decompress(data: bytes) -> bytes:
    return unpack_hex(zlib.decompress(data))


def shared_ends_python(base: bytes, data: bytes) -> tuple[int, int]:
    """The lengths of the prefix ``data`` shares with ``base``, and of the suffix they
    share in what is left after that prefix."""
    prefix = _shared_prefix(base, data)
    return prefix, _shared_suffix(base, data, min(len(base), len(data)) - prefix)


try:  # in C: a word at a time, outside the interpreter lock (7-14 us a call in Python)
    from .._codec import shared_ends
except ImportError:
    shared_ends = shared_ends_python


def encode_delta(base: bytes, data: bytes, ends: tuple[int, int] | None = None) -> bytes:
    """A *splice*: varint(shared prefix), varint(shared suffix), then the middle of
    ``data``, hex-packed and deflated with the part of ``base`` it replaces as
    dictionary. The smallest delta of an edit in one place (a few bytes of framing)."""
    prefix, suffix = ends or shared_ends(base, data)
    middle = pack_hex(data[prefix:len(data) - suffix])
    replaced = pack_hex(base[prefix:len(base) - suffix])[-32768:]
    packer = (zlib.compressobj(6, zlib.DEFLATED, -15, zdict=replaced) if replaced
              else zlib.compressobj(6, zlib.DEFLATED, -15))
    return _varint(prefix) + _varint(suffix) + packer.compress(middle) + packer.flush()


COPY_BLOCK = 16  # bytes of the base hashed together: the shortest copy a delta makes
_K1, _K2, _M64 = 0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, (1 << 64) - 1


def _block_hash(data: bytes, at: int, bits: int) -> int:
    low = int.from_bytes(data[at:at + 8], "little")
    high = int.from_bytes(data[at + 8:at + 16], "little")
    return (((low * _K1) ^ (high * _K2)) & _M64) >> (64 - bits)


def copy_delta_python(base: bytes, data: bytes) -> bytes:
    """``data`` as copies from ``base`` and inserts (what a ``COPIES`` row holds,
    hex-packed and compressed). Operations follow each other to the end:
    varint(length << 1 | 1), varint(offset in the base) for a copy; varint(length <<
    1), then the bytes, for an insert.

    The shared prefix and suffix are one copy each; the middle is matched against an
    index of the base's ``COPY_BLOCK``-byte blocks (one offset per hash, the first;
    a table of at least twice as many slots as blocks, 16 at least), at every byte
    until a block matches, each match extended forward, then backward into the bytes
    not yet written. No entropy coding: made in a few microseconds on the checkpoint's
    path, then stored at zstd's strongest level by the idle repack (repack.py) when
    that is an eighth smaller."""
    prefix, suffix = shared_ends(base, data)
    lo, hi = prefix, len(data) - suffix
    out = bytearray(_copy(prefix, 0) if prefix else b"")
    literal = lo
    if hi - lo >= 2 * COPY_BLOCK and COPY_BLOCK <= len(base) < 1 << 32:
        blocks = len(base) // COPY_BLOCK
        bits = max(4, (2 * blocks - 1).bit_length())
        table: dict[int, int] = {}
        for k in range(blocks):
            table.setdefault(_block_hash(base, k * COPY_BLOCK, bits), k * COPY_BLOCK)
        pos = lo
        while pos + COPY_BLOCK <= hi:
            found = table.get(_block_hash(data, pos, bits))
            if found is None or base[found:found + COPY_BLOCK] != data[pos:pos + COPY_BLOCK]:
                pos += 1
                continue
            at, to = found, pos
            n = _shared_prefix(base[at:], data[to:hi])
            while to > literal and at > 0 and data[to - 1] == base[at - 1]:
                to, at, n = to - 1, at - 1, n + 1
            out += _insert(data[literal:to]) + _copy(n, at)
            pos = literal = to + n
    out += _insert(data[literal:hi])
    if suffix:
        out += _copy(suffix, len(base) - suffix)
    return bytes(out)


def _copy(length: int, offset: int) -> bytes:
    return _varint(length << 1 | 1) + _varint(offset)


def _insert(chunk: bytes) -> bytes:
    return _varint(len(chunk) << 1) + chunk if chunk else b""


def apply_copies_python(base: bytes, delta: bytes, size: int) -> bytes:
    """The bytes of a ``copy_delta``, which must make exactly ``size`` bytes; raises
    ValueError for any delta that does not, or reads outside its base or itself."""
    if size < 0:
        raise ValueError("a negative size")
    out = bytearray()
    at = 0
    while at < len(delta):
        tag, at = _varint_at(delta, at, "an operation is cut short")
        n = tag >> 1
        if n == 0:
            raise ValueError("an operation of no bytes")
        if n > size - len(out):
            raise ValueError("the operations make more bytes than the row says")
        if tag & 1:
            offset, at = _varint_at(delta, at, "a copy is cut short")
            if offset > len(base) or n > len(base) - offset:
                raise ValueError("a copy reaches past the end of its base")
            out += base[offset:offset + n]
        else:
            if n > len(delta) - at:
                raise ValueError("an insert is cut short")
            out += delta[at:at + n]
            at += n
    if len(out) != size:
        raise ValueError("the operations make fewer bytes than the row says")
    return bytes(out)


def _varint_at(data: bytes, at: int, wrong: str) -> tuple[int, int]:
    """A varint of at most 64 bits (as in C), else ValueError(wrong)."""
    try:
        n, at = _read_varint(data, at)
    except ValueError:
        raise ValueError(wrong) from None
    if n >> 64:
        raise ValueError(wrong)
    return n, at


try:  # in C, outside the interpreter lock: a few microseconds for a usual edit
    from .._codec import apply_copies, copy_delta
except ImportError:
    copy_delta, apply_copies = copy_delta_python, apply_copies_python


SPLICE_MAX = 512  # changed bytes (old and new) in one region up to which a splice wins


def _splice(base: bytes, data: bytes) -> bytes | None:
    """The splice of ``data`` from ``base`` when the change is one small region (then
    the smallest delta there is: its framing is a few bytes, a zstd frame's a dozen);
    None otherwise. Both the checkpoint's choice and the repack's start here."""
    prefix, suffix = ends = shared_ends(base, data)
    if len(base) + len(data) - 2 * (prefix + suffix) <= SPLICE_MAX:
        return encode_delta(base, data, ends)
    return None


def quick_delta(base: bytes, data: bytes) -> tuple[int, bytes]:
    """(kind, bytes) of the checkpoint's delta of ``data`` from ``base``: a splice when
    the change is one small region (about 11 us), else its copies, hex-packed and
    compressed with zstd's level 3 (``COPIES``: 10 us where a zstd frame with the base
    as dictionary takes 23, and within a tenth of its size)."""
    splice = _splice(base, data)
    if splice is not None:
        return DELTA, splice
    return COPIES, zstd_whole(pack_hex(copy_delta(base, data)), FAST)


def apply_copies_row(base: bytes, stored: bytes, size: int) -> bytes:
    """The bytes (``size`` of them, at most ``MAX_BLOB``, as any row's) of a ``COPIES``
    row: a zstd frame of its copy delta, hex-packed. A size past that, or a frame that
    says it holds more than any copy delta of ``size`` bytes can be, is refused before
    anything is allocated."""
    if size > MAX_BLOB:
        raise ValueError(f"a delta of {size} bytes")
    try:
        said = zstandard.frame_content_size(stored)
    except zstandard.ZstdError as exc:
        raise ValueError(f"not a zstd frame: {exc}") from None
    if not 0 <= said <= 2 * size + 1024:
        raise ValueError(f"a copy delta of {said} bytes for a blob of {size}")
    return apply_copies(base, unpack_hex(zstd_apply(None, stored, said)), size)


def best_delta(base: bytes, data: bytes, level: int = FAST) -> tuple[int, bytes]:
    """(kind, bytes) of the better delta of ``data`` from ``base`` (the repack's): a
    splice when the change is one small region, else a zstd frame that copies from
    anywhere in the base."""
    splice = _splice(base, data)
    if splice is not None:
        return DELTA, splice
    return ZDELTA, zstd_delta(base, data, level)


def zstd_delta(base: bytes, data: bytes, level: int = FAST) -> bytes:
    """``data`` as a zstd frame compressed with ``base`` as its dictionary (raw content:
    the frame may copy from anywhere in it). The frame records its content size."""
    if not base:
        return zstd_whole(data, level)
    dictionary = zstandard.ZstdCompressionDict(base, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
    return zstandard.ZstdCompressor(level=level, dict_data=dictionary, write_checksum=False,
                                    write_content_size=True, write_dict_id=False).compress(data)


_contexts = threading.local()  # zstd contexts: made once per thread, not per blob


def _compressor(level: int) -> zstandard.ZstdCompressor:
    """This thread's compressor at ``level``: making one costs about 15 us, more than
    compressing a small file (a ZstdCompressor is not to be shared between threads)."""
    made = _contexts.__dict__.setdefault("compressors", {})
    found = made.get(level)
    if found is None:
        found = made[level] = zstandard.ZstdCompressor(
            level=level, write_checksum=False, write_content_size=True, write_dict_id=False)
    return found


def _decompressor() -> zstandard.ZstdDecompressor:
    found = getattr(_contexts, "decompressor", None)
    if found is None:
        found = _contexts.decompressor = zstandard.ZstdDecompressor()
    return found


def zstd_whole(data: bytes, level: int = SMALL) -> bytes:
    """``data`` as one zstd frame that records its content size (``ZSTD`` rows; the
    bucket's ``zstd`` entries at level ``FAST``)."""
    return _compressor(level).compress(data)


def compress_whole(data: bytes, level: int = FAST) -> tuple[int, bytes]:
    """(kind, bytes) of ``data`` stored whole: a zstd frame at ``level`` (``ZSTD``) when
    that saves an eighth, else its raw bytes (``RAW``). A checkpoint's whole rows, and a
    bucket's whole entries (bucket_packs.whole)."""
    if len(data) >= 64:
        packed = zstd_whole(data, level)
        if len(packed) < len(data) * 7 // 8:
            return ZSTD, packed
    return RAW, data


def decode_whole(kind: int, stored: bytes, size: int) -> bytes:
    """The bytes of a blob stored whole as ``kind`` (one of ``WHOLE``): a pack's row, or
    a bucket's entry (bucket_packs.CODECS). Raises ValueError, zlib.error or ZstdError when
    ``stored`` is not such an encoding of ``size`` bytes."""
    if kind == RAW:
        return stored
    if kind == ZLIB:
        return decompress(stored)
    if kind == ZSTD:
        return zstd_apply(None, stored, size)
    raise ValueError(f"a row of kind {kind} is not stored whole")


def zstd_apply(base: bytes | None, frame: bytes, size: int) -> bytes:
    """The bytes of a ``zstd_delta`` (or, with no base, ``zstd_whole``) frame, which must
    say it holds ``size`` bytes: a damaged header never makes a huge allocation."""
    try:
        said = zstandard.frame_content_size(frame)
    except zstandard.ZstdError as exc:
        raise ValueError(f"not a zstd frame: {exc}") from None
    if said != size:
        raise ValueError(f"a zstd frame says {said} bytes, the row {size}")
    if not base:
        return _decompressor().decompress(frame)
    dictionary = zstandard.ZstdCompressionDict(base, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
    return zstandard.ZstdDecompressor(dict_data=dictionary).decompress(frame)


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
            log.warning("%s (%d MB) was made before 0.7: the space gc frees in it is reused"
                        " but not given back to the file system", self.path, size >> 20)
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
