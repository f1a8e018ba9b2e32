"""The bytes of a bucket's pack objects: how an entry is encoded, read back and, when
a host rewrites packs at rest, stored as a delta from another entry of the same object.

A checkpoint uploads what it added as one small pack object of whole entries, each a
zstd frame at level 3 (``zstd``) or its raw bytes (``raw``): quick to make while the
agent waits, and every object readable alone. Over a real history that is the whole
content of every changed file again at every checkpoint: several times the size of
the pack `git gc --aggressive` makes of the same commits, where the host's own pack
(deltas from the previous version) is about one and a half times it (measured:
docs/benchmark.md). At rest a host *rewrites* its small objects into one
(s3_sweep.py, ``consolidate``): each entry is stored as a delta from an earlier entry of the same
object when that is smaller (the base the host's cache stores it against: the version
the same path had, or the better one the idle repack found), else whole at zstd's
strongest level.

An entry of codec ``delta`` is a header, then the delta:

- 1 byte: the delta's kind, as the pack's rows (``packs.DELTA``: a splice;
  ``packs.ZDELTA``: a zstd frame with the whole base as its dictionary);
- 32 bytes: the base's digest;
- 1 byte: the base's codec (``raw``, ``zstd`` or ``delta``: ``HEADER_CODECS``);
- three varints: the base's offset, length and size in the same object.

The header locates the base itself, so an object decodes with no help from the index
(a base gc forgot still sits in the object, and its dependents still read). A base
always ends before its dependent starts, so decoding moves backwards only and always
ends; a chain is at most ``MAX_CHAIN`` long. Every base is checked against the digest
its header names, and every entry a reader takes against its own (the caller's):
bytes that do not decode, or decode to anything else, are ``DataLoss``, never data.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable

import zstandard
from worldline.wire.errors import DataLoss

from . import blobs, packs
from .packs import _read_varint, _varint

DELTA = "delta"  # the codec of an entry stored as a delta from another (header above)
HEADER_CODECS = ("raw", "zstd", DELTA)  # a base's codec in a header: its index here
MAX_CHAIN = 50  # deltas a read rebuilds for one entry, at most
LEVEL = packs.SMALL  # the rewrite's zstd level: it runs at rest, the bucket keeps it
ASK_EVERY = 64  # entries encoded between two questions whether to go on


# A whole entry's codec in the index -> the pack's row of the same bytes (a cache
# filled from the bucket keeps them as they are). "pack" (deflate of the hex-packed
# bytes) is what hosts of older versions wrote; "zstd" is a frame of the whole blob.
CODECS = {"raw": packs.RAW, "pack": packs.ZLIB, "zstd": packs.ZSTD}


def whole(data: bytes, level: int) -> tuple[bytes, str]:
    """(bytes, codec) of ``data`` stored whole, as the pack stores a whole row
    (packs.compress_whole: a zstd frame when that saves an eighth, else raw)."""
    kind, stored = packs.compress_whole(data, level)
    return stored, "zstd" if kind == packs.ZSTD else "raw"


class ObjectReader:
    """The entries of one object's bytes, decoded on demand. ``entry`` returns an
    entry's bytes unverified against its own digest (the caller knows it); the bases it
    rebuilds on the way are verified against the digests their headers name."""

    def __init__(self, body: bytes, name: str, address=blobs.digest_of) -> None:
        """``address``: how the store names content (BlobStore.address)."""
        self.body = body
        self.name = name
        self.address = address
        self._bases: dict[int, bytes] = {}  # offset -> verified bytes of a base read

    def entry(self, off: int, length: int, codec: str, size: int, digest: str) -> bytes:
        try:
            return self._decode(off, length, codec, size, 0)
        except (zlib.error, zstandard.ZstdError, ValueError) as exc:
            raise DataLoss(f"blob {digest} in {self.name} does not decode: {exc}") from None

    def _decode(self, off: int, length: int, codec: str, size: int, depth: int) -> bytes:
        if off < 0 or length < 0 or off + length > len(self.body):
            raise ValueError(f"an entry at {off}+{length} ends past the object's"
                             f" {len(self.body)} bytes")
        raw = self.body[off:off + length]
        if codec != DELTA:
            kind = CODECS.get(codec)
            if kind is None:
                raise ValueError(f"an unknown codec {codec!r}")
            return packs.decode_whole(kind, raw, size)
        if depth >= MAX_CHAIN:
            raise ValueError(f"a chain of deltas longer than {MAX_CHAIN}")
        if len(raw) < 34:
            raise ValueError("a delta's header is cut short")
        kind, base_digest, at = raw[0], raw[1:33].hex(), 34
        if raw[33] >= len(HEADER_CODECS):
            raise ValueError(f"a base of unknown codec {raw[33]}")
        base_codec = HEADER_CODECS[raw[33]]
        base_off, at = _read_varint(raw, at)
        base_len, at = _read_varint(raw, at)
        base_size, at = _read_varint(raw, at)
        if base_off + base_len > off:
            raise ValueError("a delta's base does not come before it")
        base = self._bases.get(base_off)
        if base is None:
            base = self._decode(base_off, base_len, base_codec, base_size, depth + 1)
            if self.address(base) != base_digest:
                raise ValueError(f"a delta's base at {base_off} is not {base_digest}")
            self._bases[base_off] = base
        payload = raw[at:]
        if kind == packs.DELTA:
            data = packs.apply_delta(base, payload)
        elif kind == packs.ZDELTA:
            data = packs.zstd_apply(base, payload, size)
        else:
            raise ValueError(f"a delta of unknown kind {kind}")
        if len(data) != size:
            raise ValueError(f"{len(data)} bytes, not {size}")
        return data


class _Placed:
    __slots__ = ("off", "length", "codec", "size", "depth", "data")

    def __init__(self, off: int, length: int, codec: str, size: int, depth: int,
                 data: bytes) -> None:
        self.off, self.length, self.codec = off, length, codec
        self.size, self.depth, self.data = size, depth, data


class GaveUp(Exception):
    """``build``'s ``keep_going`` turned false: nothing was made."""


def build(blobs: dict[str, bytes], bases: dict[str, str], level: int = LEVEL,
          keep_going: Callable[[], bool] = lambda: True,
          ) -> tuple[bytes, list[tuple[str, int, int, int, str]]]:
    """One object's bytes holding every blob of ``blobs`` (digest -> verified bytes), and
    its entries (digest, offset, length, size, codec). ``bases`` suggests a base for a
    digest (another digest of ``blobs``): the entry is that delta when the base is in
    the object within ``MAX_CHAIN`` and the delta is smaller than the entry whole.
    Bases are placed before their dependents; a suggestion that would make a cycle is
    ignored. ``keep_going`` is asked every ``ASK_EVERY`` entries (GaveUp when false)."""
    body = bytearray()
    placed: dict[str, _Placed] = {}
    entries: list[tuple[str, int, int, int, str]] = []

    def place(digest: str) -> None:
        data = blobs[digest]
        base_digest = bases.get(digest)
        base = placed.get(base_digest) if base_digest is not None else None
        stored, codec, depth = _encode(data, base_digest, base, level)
        entry = placed[digest] = _Placed(len(body), len(stored), codec, len(data), depth, data)
        body.extend(stored)
        entries.append((digest, entry.off, entry.length, entry.size, entry.codec))
        if len(entries) % ASK_EVERY == 0 and not keep_going():
            raise GaveUp

    for digest in blobs:
        # its chain of suggested bases up to one placed already, one not in the object,
        # or one met before on this chain (a cycle), then placed from the farthest down
        chain: list[str] = []
        seen: set[str] = set()
        at: str | None = digest
        while at is not None and at in blobs and at not in placed and at not in seen:
            chain.append(at)
            seen.add(at)
            at = bases.get(at)
        for found in reversed(chain):
            place(found)
    return bytes(body), entries


def _encode(data: bytes, base_digest: str | None, base: _Placed | None,
            level: int) -> tuple[bytes, str, int]:
    """(bytes, codec, depth) of one entry: the delta from ``base`` when it is smaller than
    the entry whole, else whole."""
    delta = None
    if base is not None and base.depth + 1 < MAX_CHAIN:
        kind, payload = packs.best_delta(base.data, data, level)
        delta = (bytes([kind]) + bytes.fromhex(base_digest)
                 + bytes([HEADER_CODECS.index(base.codec)]) + _varint(base.off)
                 + _varint(base.length) + _varint(base.size) + payload)
        if len(delta) * 4 <= len(data):  # the usual edit: no need to compress it whole
            return delta, DELTA, base.depth + 1
    stored, codec = whole(data, level)
    if delta is not None and len(delta) < len(stored):
        return delta, DELTA, base.depth + 1
    return stored, codec, 0


def decode_all(reader: ObjectReader,
               wanted: Iterable[tuple[str, int, int, str, int]]) -> dict[str, bytes]:
    """digest -> bytes of each wanted entry (digest, offset, length, codec, size) of the
    object, every one verified against its digest."""
    out: dict[str, bytes] = {}
    for digest, off, length, codec, size in wanted:
        data = reader.entry(off, length, codec, size, digest)
        if reader.address(data) != digest:
            raise DataLoss(f"blob {digest} in {reader.name} does not match its digest")
        out[digest] = data
    return out
