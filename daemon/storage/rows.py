"""How a pack row's bytes encode a blob (packs.py keeps the rows; bucket_packs.py
encodes a bucket object's entries the same way): whole, or as a delta from a base.

A changed file or tree whose previous version is given as its *base* is stored as a
*delta*, made by a checkpoint in microseconds because the agent is waiting
(``quick_delta``), of one of two kinds:
- a *splice* (``DELTA``) when the change is one small region, the usual single edit:
  the length of the prefix and suffix it shares with the base, and the middle
  deflated (a few bytes of framing);
- else *copies* (``COPIES``): the bytes it shares with its base, anywhere in it and in
  any order, as copies, and the rest inserted (git's copy/insert delta;
  ``copy_delta``, in C), hex-packed, then compressed as one zstd frame at level
  ``FAST`` with this thread's compressor, which needs no dictionary to be set up.
The idle repack (repack.py) later stores a row as the smallest splice or *zstd frame*
(``ZDELTA``) it can make at zstd's strongest level, when that is an eighth smaller: a
frame compressed with the whole base as a raw-content dictionary, so every part of
the new version that the base holds is a copy and what is new is entropy coded. A
checkpoint makes copies rather than such a frame: they take about half the time (a
frame takes longer still inside a checkpoint) and come within a tenth of its size.
Packs written by older versions hold frames a checkpoint made, and splices of
changes far apart (which store everything between the two edits); both read as ever.
Other rows are stored whole: a zstd frame (``ZSTD``, level ``FAST``) when that saves an
eighth, else raw; the idle repack may later store a row at zstd's strongest level.
Packs written by older versions also hold zlib rows (``ZLIB``: deflate of the
hex-packed bytes), which stay readable, and a cache filled from a bucket such versions
wrote takes its entries as such rows.

Each encoding that runs per blob has a twin in C (daemon/_codec.c), held byte for byte
to the Python one here by the tests; the Python twin runs when the C module is not
built.
"""

from __future__ import annotations

import re
import threading
import zlib

import zstandard

MAX_BLOB = 1 << 20  # bigger blobs stay files: streamed, never held whole in memory
RAW, ZLIB, DELTA, ZDELTA, ZSTD, COPIES = 0, 1, 2, 3, 4, 5  # DELTA: a splice; ZDELTA: a
# zstd frame with the base as dictionary; COPIES: copies and inserts (copy_delta), zstd
WHOLE = (RAW, ZLIB, ZSTD)  # the kinds of a row that needs no base (decode_whole)
FAST, SMALL = 3, 19  # zstd levels: a checkpoint's deltas, and the idle repack's


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
    """A ``ZLIB`` row's bytes (and a bucket entry's of codec "pack"): what older
    versions wrote, kept as the format ``decompress`` reads; nothing writes it now."""
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
    the change is one small region, else its copies, hex-packed and compressed with
    zstd's level 3 (``COPIES``: made in about half the time a zstd frame with the base
    as dictionary takes, and within a tenth of its size)."""
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
