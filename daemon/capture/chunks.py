"""Big files as content-defined chunks: a change stores about the chunks it touched.

A file of at least ``CHUNK_FROM`` bytes, and every file with a hole, is read once, run
by run of data (``sparse.extents``: holes are never read), and cut by a FastCDC gear
hash (``cdc_cuts``, in C in daemon/_codec.c; ``cuts_python`` its twin, cut for cut).
A cut depends only on the bytes just before it, so an edit moves the cuts around it
and no others: an insertion leaves every later chunk as it was. Chunks are ordinary
blobs (at most ``MAX`` bytes, so rows of the pack, compressed and deduplicated there
like any other: the same content in another file, session or host is the same blob).

The file's tree entry is of kind ``chunked``; its ref names a *chunk map*, canonical
JSON ``{"size": N, "pages": [[offset, length, page], ...]}``, each page a blob
``{"pieces": [[offset, length, chunk, fingerprint], ...]}`` whose offsets count from
the page's own; a chunk's fingerprint is its BLAKE3, which the next capture computes
instead of SHA-256 for every chunk and finds in the head's map for all that did not
change (only new chunks are hashed for their digest). A page ends after a chunk
whose digest says so (about one in ``PAGE_CUT``, at most ``PAGE_MAX`` pieces), so
pages too are cut by content and an edit changes one page, whose offsets relative to
itself do not shift: a one-byte change of a 1 GiB file stores a chunk, a page and a
map of a few KiB. The sparse extent map of older data
roots (kind ``sparse``, its pieces in the map itself) reads through the same
``read_map``.

A restore writes the file from its chunks; chunks the file on disk holds already (by
the map of the entry the restore's plan saw there) are copied from it in the kernel
(``copy_file_range``), then read back and checked against their digests, so what was
changed under the restore is written from the store instead.

Tests shrink the sizes through ``WORLDLINE_CHUNK_FROM`` (bytes from which a dense file
is chunked) and ``WORLDLINE_CHUNK_AVG`` (the average chunk; min a quarter, max four
times), read when the daemon starts.
"""

from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

from blake3 import blake3
from worldline.wire.errors import DataLoss, NotFound

from ..observe import RESTORE_COPIED
from ..storage.blob_store import BlobStore
from . import sparse
from .trees import MAPPED, Entry

CHUNK_FROM = int(os.environ.get("WORLDLINE_CHUNK_FROM", 8 << 20))
AVG = int(os.environ.get("WORLDLINE_CHUNK_AVG", 64 << 10))
MIN, MAX = AVG // 4, AVG * 4
BITS = AVG.bit_length() - 1  # a cut on BITS top bits of the hash: one in AVG bytes
READ = 8 << 20  # bytes read at a time
PAGE_CUT = 128  # a page ends after one chunk in about this many
PAGE_MAX = 1024  # pieces in a page at most (its JSON stays well under a pack row's limit)
SYNC_EVERY = 256 << 20  # new bytes held for the pack before a local store is synced
_AHEAD = 3  # blocks read ahead of the hashing
Piece = tuple[int, int, str, str]  # offset, length, digest, fingerprint ("": none)


def _gear() -> list[int]:
    """The gear table: splitmix64 from 0, as daemon/_codec.c makes it."""
    out, x, m = [], 0, (1 << 64) - 1
    for _ in range(256):
        x = (x + 0x9E3779B97F4A7C15) & m
        z = x
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
        out.append(z ^ (z >> 31))
    return out


GEAR = _gear()


def cuts_python(data: bytes, min_: int, avg: int, max_: int, bits: int,
                last: bool) -> list[int]:
    """The end of each chunk of ``data``, cut by FastCDC's normalized gear hash: no cut
    before ``min_`` bytes, a harder test (``bits + 1`` top bits zero) up to ``avg``, an
    easier one (``bits - 1``) after, a forced cut at ``max_``. Unless ``last``, bytes
    after the last cut fewer than ``max_`` are left (what follows may move their cut)."""
    m = (1 << 64) - 1
    mask_s = (m << (64 - bits - 1)) & m
    mask_l = (m << (64 - bits + 1)) & m
    ends, at, size = [], 0, len(data)
    while at < size:
        rest = size - at
        if not last and rest < max_:
            break
        n = min(rest, max_)
        cut = n
        if n > min_:
            h, i, normal = 0, min_, min(avg, n)
            cut = n
            while i < n:
                h = ((h << 1) + GEAR[data[at + i]]) & m
                if not h & (mask_s if i < normal else mask_l):
                    cut = i + 1
                    break
                i += 1
        at += cut
        ends.append(at)
    return ends


try:  # the same cuts in C, the interpreter lock released
    from .._codec import cdc_cuts
except ImportError:  # pragma: no cover - the C build is part of the install
    cdc_cuts = cuts_python


def address(blobs: BlobStore):
    """How ``blobs`` names content (the one place a chunk's digest is computed): the
    store's ``address``, keyed when the store has a data key."""
    return blobs.address


_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def pool() -> ThreadPoolExecutor:
    """Threads hashing chunks (hashlib releases the interpreter lock)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max(1, min(4, os.cpu_count() or 1)),
                                       thread_name_prefix="chunks")
        return _pool


def fingerprint(data) -> str:
    """A chunk's BLAKE3, beside its digest in the map: three times as fast as SHA-256
    here, and as hard to forge, so a chunk whose fingerprint the head's map holds
    takes its digest from there without being hashed again."""
    return blake3(data).hexdigest()


def _hash_block(name, prints: dict[str, tuple[int, str]], data: memoryview,
                ends: list[int]) -> list[tuple[str, str]]:
    at, out = 0, []
    for end in ends:
        chunk = data[at:end]
        mark = fingerprint(chunk)
        hit = prints.get(mark)
        out.append((hit[1] if hit is not None and hit[0] == end - at else name(chunk), mark))
        at = end
    return out


def _blocks(fd: int, size: int, dense: bool,
            short: list[int]) -> Iterable[tuple[int, memoryview, list[int]]]:
    """(file offset, bytes, chunk ends) of each block of the file's data, read once,
    into a ring of ``_AHEAD + 2`` buffers: a block's bytes stay as they are while at
    most ``_AHEAD`` blocks after it are taken (no allocation, and no page faults, per
    block). A read that comes short (the file shrank meanwhile) ends it: its end is
    appended to ``short``."""
    ring = [memoryview(bytearray(min(READ, size) + MAX)) for _ in range(_AHEAD + 2)]
    turn = 0
    runs = [(0, size)] if dense else sparse.extents(fd, size)
    for start, length in runs:
        end, off, tail = start + length, start, memoryview(b"")
        while True:
            buf = ring[turn % len(ring)]
            turn += 1
            kept = len(tail)
            buf[:kept] = tail
            want = min(READ, end - off)
            got = os.preadv(fd, [buf[kept:kept + want]], off) if want else 0
            data = buf[:kept + got]
            last = off + got >= end or got < want  # the end, or it shrank
            ends = cdc_cuts(data, MIN, AVG, MAX, BITS, last)
            if ends:
                yield off - kept, data, ends
            tail = data[ends[-1]:] if ends else data
            off += got
            if got < want:
                short.append(off)
                return
            if last:
                break


# Maps of captures not persisted (a restore's look at the layer): a restore copies
# from the file on disk by the map its plan saw, which no checkpoint stored.
_unsaved: OrderedDict[str, tuple[int, list[Piece]]] = OrderedDict()
_UNSAVED = 16


def _remember(digest: str, size: int, pieces: list[Piece]) -> None:
    with _pool_lock:
        _unsaved[digest] = (size, pieces)
        _unsaved.move_to_end(digest)
        while len(_unsaved) > _UNSAVED:
            _unsaved.popitem(last=False)


def _canonical(body: dict) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def capture(fd: int, size: int, blobs: BlobStore, persist: bool, dense: bool,
            kept: str | None = None, previous: str | None = None) -> tuple[str, int]:
    """Store the file open at ``fd`` (``size`` bytes; only its data runs unless
    ``dense``) as chunks, pages and a map; returns the map's digest and the size it
    records: ``size``, or less when the file shrank while read (a map never says
    more bytes than were there: no zeros that the file never held). ``kept``: a map the
    head names, whose chunks are stored and kept, so not asked about again;
    ``previous``: the path's last map, whose pages serve as delta bases."""
    name = address(blobs)
    known: set[str] = set()
    prints: dict[str, tuple[int, str]] = {}
    if kept is not None:
        try:
            for _, n, d, f in _pieces(blobs, kept)[1]:
                known.add(d)
                if f:
                    prints[f] = (n, d)
        except (NotFound, DataLoss):
            pass
    pieces: list[Piece] = []
    queue: list = []
    held = 0

    def drain(block) -> None:
        nonlocal held
        base, data, ends, future = block
        new, at = [], 0
        for end, (digest, mark) in zip(ends, future.result(), strict=True):
            pieces.append((base + at, end - at, digest, mark))
            if persist and digest not in known:
                known.add(digest)
                new.append(bytes(data[at:end]))
            at = end
        if new:
            blobs.put_many(new)
            held += sum(map(len, new))
            if held >= SYNC_EVERY and blobs.local:
                blobs.sync()  # a first capture of a big file: the pack's rows not all in memory
                held = 0

    short: list[int] = []
    for base, data, ends in _blocks(fd, size, dense, short):
        queue.append((base, data, ends, pool().submit(_hash_block, name, prints, data, ends)))
        if len(queue) > _AHEAD:
            drain(queue.pop(0))
    for block in queue:
        drain(block)
    end = pieces[-1][0] + pieces[-1][1] if pieces else 0
    if short:  # it ended there: what was read is the file
        size = end
    else:  # a hole at its end may be gone too (a sparse file truncated meanwhile)
        size = max(end, min(size, os.fstat(fd).st_size))
    return _store_map(blobs, persist, size, pieces, previous), size


def _store_map(blobs: BlobStore, persist: bool, size: int,
               pieces: list[Piece], previous: str | None) -> str:
    old: dict[str, str] = {}  # first chunk of a page of the previous map -> that page
    if persist and previous is not None:
        try:
            for _, _, page in _pages(blobs, previous):
                first = _read_page(blobs, page)
                if first:
                    old[first[0][2]] = page
        except (NotFound, DataLoss):
            old = {}
    name = address(blobs)
    pages, run = [], []
    for i, piece in enumerate(pieces):
        run.append(piece)
        if (len(run) < PAGE_MAX and i + 1 < len(pieces)
                and int(piece[2][:8], 16) % PAGE_CUT):
            continue
        start = run[0][0]
        body = _canonical({"pieces": [[o - start, n, d, f] for o, n, d, f in run]})
        page = (blobs.put_bytes(body, base=old.get(run[0][2])) if persist
                else name(body))
        pages.append([start, run[-1][0] + run[-1][1] - start, page])
        run = []
    body = _canonical({"pages": pages, "size": size})
    if not persist:
        digest = name(body)
        _remember(digest, size, pieces)
        return digest
    return blobs.put_bytes(body, base=previous)


def _load(blobs: BlobStore, digest: str, what: str) -> dict:
    try:
        body = json.loads(blobs.read_bytes(digest))
        if not isinstance(body, dict):
            raise TypeError("not an object")
        return body
    except (ValueError, TypeError) as exc:
        raise DataLoss(f"{what} {digest} is malformed: {exc}") from None


def _pages(blobs: BlobStore, digest: str) -> list[tuple[int, int, str]]:
    try:
        return [(int(o), int(n), str(d)) for o, n, d in
                _load(blobs, digest, "chunk map")["pages"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise DataLoss(f"chunk map {digest} is malformed: {exc}") from None


def _read_page(blobs: BlobStore, digest: str) -> list[Piece]:
    try:
        return [(int(p[0]), int(p[1]), str(p[2]), str(p[3]) if len(p) > 3 else "")
                for p in _load(blobs, digest, "chunk page")["pieces"]]
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise DataLoss(f"chunk page {digest} is malformed: {exc}") from None


def _pieces(blobs: BlobStore, digest: str) -> tuple[int, list[Piece]]:
    """(size, [(offset, length, digest, fingerprint)]) of a chunk map, or of a sparse
    extent map (no fingerprints: "")."""
    with _pool_lock:
        found = _unsaved.get(digest)
    if found is not None and not blobs.has(digest):
        return found
    body = _load(blobs, digest, "chunk map")
    try:
        if "pages" not in body:  # a sparse extent map: its pieces are in it
            return int(body["size"]), [(int(o), int(n), str(d), "")
                                       for o, n, d in body["pieces"]]
        out = []
        for start, _, page in _pages(blobs, digest):
            out += [(start + o, n, d, f) for o, n, d, f in _read_page(blobs, page)]
        return int(body["size"]), out
    except (KeyError, TypeError, ValueError) as exc:
        raise DataLoss(f"chunk map {digest} is malformed: {exc}") from None


def read_map(blobs: BlobStore, digest: str) -> tuple[int, list[tuple[int, int, str]]]:
    """(size, [(offset, length, digest)]) of a chunk map, or of a sparse extent map."""
    size, pieces = _pieces(blobs, digest)
    return size, [(o, n, d) for o, n, d, _ in pieces]


def refs(blobs: BlobStore, digest: str) -> list[str]:
    """Every blob a map names besides itself: its pages and its chunks (what gc keeps
    and fsck verifies). A missing or malformed page raises, as a missing map does."""
    body = _load(blobs, digest, "chunk map")
    if "pages" not in body:
        return [d for _, _, d in read_map(blobs, digest)[1]]
    out = []
    for _, _, page in _pages(blobs, digest):
        out.append(page)
        out += [p[2] for p in _read_page(blobs, page)]
    return out


def needed(blobs: BlobStore, digest: str, have: Entry | None) -> list[str]:
    """The blobs a restore of map ``digest`` over the entry ``have`` reads from the
    store: its pages and the chunks the file there does not hold (those it does are
    copied from it, and read from the store only if changed meanwhile)."""
    there: set[str] = set()
    if have is not None and have.kind in MAPPED:
        try:
            there = {d for _, _, d in read_map(blobs, have.ref)[1]}
        except (NotFound, DataLoss):
            pass
    return [d for d in refs(blobs, digest) if d not in there]


def refs_safe(blobs: BlobStore, digest: str, problems: list[str] | None) -> list[str]:
    """``refs``, or what of them could be read: with ``problems`` (fsck, gc's dry look),
    a missing or malformed map or page is said there rather than raised."""
    try:
        return refs(blobs, digest)
    except (NotFound, DataLoss) as exc:
        if problems is None:
            raise
        problems.append(f"chunk map {digest}: {exc.message}")
        out = []
        try:
            for _, _, page in _pages(blobs, digest):
                out.append(page)
                try:
                    out += [p[2] for p in _read_page(blobs, page)]
                except (NotFound, DataLoss):
                    pass
        except (NotFound, DataLoss):
            pass
        return out


def changed_ranges(blobs: BlobStore, old: str | None,
                   new: str) -> tuple[int, list[tuple[int, int]]]:
    """(size, [(offset, end)]) of the ranges of map ``new`` whose chunks map ``old``
    (None: no earlier version) does not hold, adjacent ones joined: what a binary diff
    of a chunked file says changed."""
    size, pieces = read_map(blobs, new)
    had = {d for _, _, d in read_map(blobs, old)[1]} if old is not None else set()
    out: list[tuple[int, int]] = []
    for offset, length, digest in pieces:
        if digest in had:
            continue
        if out and out[-1][1] == offset:
            out[-1] = (out[-1][0], offset + length)
        else:
            out.append((offset, offset + length))
    return size, out


def _copy_range(src: int, dst: int, offset_src: int, offset_dst: int, n: int) -> bool:
    """Copy ``n`` bytes in the kernel; False if the file systems cannot (or it ended)."""
    while n > 0:
        try:
            done = os.copy_file_range(src, dst, n, offset_src, offset_dst)
        except OSError:
            return False
        if done == 0:
            return False
        n, offset_src, offset_dst = n - done, offset_src + done, offset_dst + done
    return True


def _check(fd: int, name, offset: int, length: int, digest: str, mark: str) -> bool:
    data = os.pread(fd, length, offset)
    return fingerprint(data) == mark if mark else name(data) == digest


def _write_piece(fd: int, blobs: BlobStore, digest: str, offset: int, length: int,
                 map_digest: str) -> None:
    data = blobs.read_bytes(digest)
    if len(data) != length:
        raise DataLoss(f"chunk map {map_digest}: chunk {digest} has {len(data)} bytes,"
                       f" not {length}")
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def write(fd: int, blobs: BlobStore, digest: str, source: int | None = None,
          source_map: str | None = None) -> int:
    """Write the file of map ``digest`` into the empty file open at ``fd``; returns the
    bytes of data written. ``source``, a file open for reading whose content is map
    ``source_map`` (the file the restore replaces, as its plan saw it): chunks it holds
    are copied from it and checked, so a range changed under the restore is written
    from the store instead. Holes are left holes."""
    size, pieces = _pieces(blobs, digest)
    os.ftruncate(fd, size)
    have: dict[str, int] = {}
    if source is not None and source_map is not None:
        try:
            have = {d: o for o, _, d in read_map(blobs, source_map)[1]}
        except (NotFound, DataLoss):
            have = {}
    name = address(blobs)
    copied = []
    written = 0
    for offset, length, piece, mark in pieces:
        at = have.get(piece)
        if at is not None and _copy_range(source, fd, at, offset, length):
            copied.append((offset, length, piece, mark))
        else:
            _write_piece(fd, blobs, piece, offset, length, digest)
        written += length
    if copied:
        checks = pool().map(lambda p: _check(fd, name, *p), copied)
        for (offset, length, piece, _), good in zip(copied, list(checks), strict=True):
            if good:
                RESTORE_COPIED.inc(length)
            else:  # changed on disk since the plan saw it
                _write_piece(fd, blobs, piece, offset, length, digest)
    return written
