"""The blob store kept on this host: ``LocalBlobStore``, a pack and files under the
data root (packs.py). The contract it keeps is ``BlobStore`` in blob_store.py; the
reference, ``MemoryBlobStore``, is in memory_blobs.py (and importable here), a
fleet's bucket in s3_blobs.py.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Collection, Iterator
from contextlib import contextmanager

from worldline.wire.errors import (
    DataLoss,
    NotFound,
    Unavailable,
)

from ..observe import BLOB_REUSED, BLOB_WRITTEN
from . import blob_files
from .blob_files import DIGEST_RE
from .blob_store import (
    DestinationFull,
    check_digest,
    digest_of,  # noqa: F401 - importable here
    store_address,
    store_hasher,
)
from .crypto import OVERHEAD, DataKey
from .memory_blobs import MemoryBlobStore  # noqa: F401 - importable here
from .packs import MAX_BLOB, RAW, WHOLE, Pack, Row
from .streams import (  # noqa: F401 - CHUNK and within: importable here
    CHUNK,
    disk_full,
    file_chunks,
    within,
    write_all,
)


class LocalBlobStore:
    """Small blobs (up to ``packs.MAX_BLOB``) in the pack, ``<root>/pack.db`` (see
    packs.py); bigger ones as read-only files ``<root>/<2 hex>/<62 hex>``.

    Pack rows put since the last sync are pending, readable by this process; ``sync()``
    commits them in one transaction, made durable by an fsync of the pack's WAL (skipped
    with ``durable=False``: a bucket's cache). A file is written to a temporary
    ``<root>/tmp/<digest>.<random>`` and remembered as pending; ``sync()`` flushes every
    pending temporary with one ``syncfs`` (one flush per checkpoint, not one per blob),
    then renames each into place. A name therefore never exists before its bytes are
    durable. The renames themselves need no second flush: a crash can only lose a rename
    whose temporary is durable and named after its digest, and ``recover()`` at the next
    start verifies such a temporary against its name and finishes the rename. Anything
    else in ``tmp`` (a temporary whose bytes never reached the disk) is removed. The
    files' part (temporaries, the flush and renames, recovery) is blob_files.py's."""

    local = True

    address = store_address
    hasher = store_hasher

    def __init__(self, root: str, durable: bool = True, pack_file: str = "",
                 store_lock: threading.RLock | None = None, key: DataKey | None = None
                 ) -> None:
        """``pack_file``: where the pack is when not ``<root>/pack.db``: the metadata
        store's SQLite file (``store_lock`` its write lock), whose checkpoint commit
        then makes the pack's new rows durable with its own fsync (``committing``).
        ``key``: blobs are named by keyed addresses, and rows and files are sealed
        (a file as one sealed stream: ``VERSION || nonce || ciphertext || tag``)."""
        self.key = key
        self._overhead = OVERHEAD if key is not None else 0
        self.root = root
        self.tmp = os.path.join(root, "tmp")
        os.makedirs(self.tmp, mode=0o700, exist_ok=True)
        self._pending: dict[str, str] = {}  # digest -> temporary, not yet in a sync
        self._moving: dict[str, str] = {}  # digest -> temporary, taken by the running sync
        self._reused: dict[str, float] = {}  # digest -> when a put last found it stored
        self._pins: dict[str, int] = {}  # digest -> puts reading it as a delta base now
        self._lock = threading.Lock()
        self._sync_lock = threading.Lock()  # one sync at a time: each waits for the last
        self.failed: str | None = None  # why no sync is taken any more (``broken``)
        self.pack = Pack(pack_file or os.path.join(root, "pack.db"), durable, store_lock, key)
        self.pack_in_store = bool(pack_file)

    def close(self) -> None:
        self.pack.close()

    def _path(self, digest: str) -> str:
        check_digest(digest)
        return os.path.join(self.root, digest[:2], digest[2:])

    def _candidates(self, digest: str) -> list[str]:
        """Where the blob may be: its temporary (until renamed), then its name."""
        final = self._path(digest)
        with self._lock:
            tmp = self._pending.get(digest) or self._moving.get(digest)
        return [tmp, final] if tmp else [final]

    def _in_flight(self, digest: str) -> bool:
        """Put but not yet synced (the caller holds the lock)."""
        return (digest in self._pending or digest in self._moving
                or digest in self.pack.pending or digest in self.pack.committing)

    def has(self, digest: str) -> bool:
        check_digest(digest)
        with self._lock:
            if self._in_flight(digest):
                return True
        return self.pack.has(digest) or os.path.exists(self._path(digest))

    def _reuse(self, digest: str, size: int | None = None) -> bool:
        """True if the blob is stored. A stored one counts as freshly stored for gc's grace
        period: the reuse is noted in memory (gc runs in this process), under the lock gc
        deletes with, *before* looking for the blob, so no lock is held while looking and
        a blob found is one gc had not deleted and now will not (nor is a file touched,
        which would dirty an inode per reuse).

        ``size``, when known and at most MAX_BLOB: the blob can only be a row of the pack,
        so no file is looked for (a failed stat per new blob, each a hand-off of the
        interpreter lock in the middle of a capture). Only data roots written by the
        first versions hold such blobs as files; one found there again is stored in the
        pack as well, once."""
        with self._lock:
            if self._in_flight(digest):
                return True
            self._reused[digest] = time.time()
        if self.pack.has(digest):
            return True
        if (size is None or size > MAX_BLOB) and os.path.exists(self._path(digest)):
            return True
        with self._lock:
            self._reused.pop(digest, None)
        return False

    def put_bytes(self, data: bytes, base: str | None = None) -> str:
        digest = self.address(data)
        if self._reuse(digest, len(data)):
            BLOB_REUSED.inc(len(data))
            return digest
        BLOB_WRITTEN.inc(len(data))
        if len(data) > MAX_BLOB:
            self._add_pending(digest, self._write_temp(self._sealing([data]), digest))
            return digest
        usable = base is not None and base != digest and DIGEST_RE.match(base) is not None
        if usable:
            with self._lock:  # gc leaves a pinned base be until its delta is pending
                self._pins[base] = self._pins.get(base, 0) + 1
        try:
            found = self.pack.base_for(base) if usable else None
            row = self.pack.encode(data, base, *(found or (None, 0)))
            with self._lock:
                added = not self._in_flight(digest)
                if added:
                    self.pack.pending[digest] = row
        finally:
            if usable:
                with self._lock:
                    if self._pins[base] == 1:
                        del self._pins[base]
                    else:
                        self._pins[base] -= 1
        self.pack.remember(digest, data, row.depth if added else None)
        return digest

    def put_verified(self, digest: str, data: bytes,
                     packed: tuple[int, bytes] | None = None) -> None:
        """Store ``data``, already verified to be ``digest`` by the caller, given also
        as (kind, bytes) of a whole row of the pack's own (``ZSTD`` or ``ZLIB``) when it
        has that: the row takes those bytes as they are, with no compression again (a
        cache filled from a bucket, whose packs hold those encodings)."""
        if len(data) > MAX_BLOB or self._reuse(digest):
            if len(data) > MAX_BLOB:
                self.put_bytes(data)
            return
        kind, stored = packed if packed is not None else (RAW, data)
        if kind not in WHOLE:
            raise ValueError(f"a whole row cannot be of kind {kind}")
        row = Row(kind, None, 0, len(data), time.time(), stored)
        with self._lock:
            if not self._in_flight(digest):
                self.pack.pending[digest] = row

    def put_many(self, blobs: list[bytes]) -> list[str]:
        digests = [self.address(data) for data in blobs]
        now = time.time()
        with self._lock:  # as _reuse: noted first, so what is found stays found
            fresh = {d for d in digests if not self._in_flight(d)}
            for d in fresh:
                self._reused[d] = now
        stored = self.pack.present(fresh)
        large = {d for d, data in zip(digests, blobs, strict=True) if len(data) > MAX_BLOB}
        stored |= {d for d in (fresh - stored) & large  # small ones: rows only (_reuse)
                   if os.path.exists(self._path(d))}
        with self._lock:
            for d in fresh - stored:
                self._reused.pop(d, None)
        for d, data in zip(digests, blobs, strict=True):
            if d in fresh and d not in stored:
                self.put_bytes(data)
            else:
                BLOB_REUSED.inc(len(data))
        return digests

    def put_fd(self, src: int, limit: int | None = None) -> tuple[str, int]:
        """Store the file open at ``src`` (read from offset 0). Its digest is computed
        first, so content that is already stored is recognised before a copy of it is
        written anywhere; only new content is read again and copied aside (each pass
        within ``limit``: a temporary cut short by Overread is removed)."""
        hasher, size = self.hasher(), 0
        for chunk in file_chunks(src, limit):
            hasher.update(chunk)
            size += len(chunk)
        digest = hasher.hexdigest()
        if self._reuse(digest):
            BLOB_REUSED.inc(size)
            return digest, size
        hasher, size = self.hasher(), 0

        def copied():
            nonlocal size
            for chunk in file_chunks(src, limit):
                hasher.update(chunk)
                size += len(chunk)
                yield chunk

        tmp = self._write_temp(self._sealing(copied()))
        digest = hasher.hexdigest()  # what was copied (the file may have changed between)
        if self._reuse(digest):
            BLOB_REUSED.inc(size)
            os.unlink(tmp)
        else:
            BLOB_WRITTEN.inc(size)
            named = os.path.join(self.tmp, f"{digest}.{os.path.basename(tmp)}")
            os.rename(tmp, named)  # now recoverable by its name
            self._add_pending(digest, named)
        return digest, size

    def _sealing(self, chunks):
        """What a blob file holds of ``chunks``: them, or with a key their sealed stream."""
        return chunks if self.key is None else self.key.seal_stream(chunks)

    def opening(self, chunks):
        """The blob's bytes from what its file holds (``_sealing``'s inverse). With a
        key, DataLoss at the end if the tag does not verify: a caller uses nothing it
        was given before the iteration ends."""
        return chunks if self.key is None else self.key.open_stream(chunks)

    def _file_digest(self, fd: int) -> tuple[str, int]:
        """(address, size) of the blob file open at ``fd``, opened (DataLoss: its tag)."""
        hasher, size = self.hasher(), 0
        for chunk in self.opening(file_chunks(fd)):
            hasher.update(chunk)
            size += len(chunk)
        return hasher.hexdigest(), size

    def put_sealed_file(self, digest: str, path: str) -> int:
        """Take the file at ``path`` (in ``tmp``), which holds what this store's blob file
        of ``digest`` holds (a bucket's object of it, fetched), as that blob: verified
        (its tag and its address; DataLoss otherwise, and it is removed), then renamed
        to a pending temporary. Returns the blob's size."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                got, size = self._file_digest(fd)
            finally:
                os.close(fd)
            if got != digest:
                raise DataLoss(f"blob {digest} does not match its digest")
        except BaseException:
            os.unlink(path)
            raise
        if self._reuse(digest):
            os.unlink(path)
            return size
        named = os.path.join(self.tmp, f"{digest}.{os.urandom(8).hex()}")
        os.rename(path, named)
        self._add_pending(digest, named)
        return size

    def _add_pending(self, digest: str, tmp: str) -> None:
        with self._lock:
            if digest in self._pending or digest in self._moving:
                os.unlink(tmp)  # another thread stored the same bytes meanwhile
            else:
                self._pending[digest] = tmp

    def _write_temp(self, chunks, digest: str = "") -> str:
        """Write ``chunks`` to a new read-only temporary in ``tmp``; return its path
        (blob_files.write_temp)."""
        return blob_files.write_temp(self.tmp, chunks, digest)

    @contextmanager
    def committing(self):
        # The pack in the metadata store's file: the checkpoint's commit inside this block
        # (to the same write-ahead log, after the pack's rows) is flushed before it
        # returns, and its fsync covers them. One fsync per checkpoint, not two.
        self.sync(flush_pack=not self.pack_in_store)
        yield []

    def sync(self, flush_pack: bool = True) -> None:
        """Every blob put before this call is durable when it returns (the pack's rows:
        unless ``flush_pack`` is False, when the caller's next commit to the same file
        flushes them). Syncs run one at a time and each takes everything pending, so
        concurrent checkpoints share one flush (group commit) and none returns before
        its own blobs are on disk."""
        with self._sync_lock:
            if self.failed is not None:
                raise self._refusal()
            with self._lock:
                batch, self._pending = self._pending, {}
                self._moving.update(batch)
                self.pack.committing, self.pack.pending = self.pack.pending, {}
            try:
                self.pack.commit(flush=flush_pack)
            except BaseException as exc:
                with self._lock:  # the rows wait for the next sync
                    self.pack.pending.update(self.pack.committing)
                    self.pack.committing = {}
                    self._pending.update(batch)
                    for digest in batch:
                        self._moving.pop(digest, None)
                if isinstance(exc, OSError):
                    raise disk_full(exc) from exc
                raise
            with self._lock:
                self.pack.committing = {}
            if not batch:
                return
            blob_files.place(self, batch)

    def broken(self) -> str | None:
        """Why this store takes no more syncs in this process (a flush of its files or of
        its pack's log failed), or None."""
        return self.failed or self.pack.broken()

    def _refusal(self) -> Unavailable:
        return Unavailable(f"the blob store {self.root} failed to make its files durable"
                           f" ({self.failed}): it takes no more writes, so no checkpoint"
                           " is acknowledged over files that may have lost their bytes;"
                           " restart the daemon once the disk is healthy")

    def _open_verified(self, digest: str) -> int:
        for _ in range(2):  # a temporary may be renamed between the lookup and the open
            for path in self._candidates(digest):
                try:
                    return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                except FileNotFoundError:
                    continue
        raise NotFound(f"blob {digest} does not exist")

    def open_blob(self, digest: str) -> int:
        """A read-only descriptor of a blob stored as a file (one over ``MAX_BLOB``), for
        a caller that streams it and has verified it (``verify``); NotFound if it is
        not a file here. With a key it reads the sealed stream the file holds."""
        return self._open_verified(digest)

    def _packed(self, digest: str, cached: bool = True) -> bytes | None:
        """The bytes of a blob in the pack, verified; None if it is not there."""
        try:
            data = self.pack.read(check_digest(digest), cached)
        except NotFound:
            return None
        if self.address(data) != digest:
            self.pack.forget(digest)
            raise DataLoss(f"blob {digest} is corrupt: its bytes no longer match its digest")
        self.pack.remember(digest, data)  # verified: the next read, or version, is cheap
        return data

    def read_bytes(self, digest: str) -> bytes:
        packed = self._packed(digest)
        if packed is not None:
            return packed
        fd = self._open_verified(digest)
        try:
            data = b"".join(self.opening(file_chunks(fd)))
        finally:
            os.close(fd)
        if self.address(data) != digest:
            raise DataLoss(f"blob {digest} is corrupt: its bytes no longer match its digest")
        return data

    def verify(self, digest: str) -> None:
        if self._packed(digest, cached=False) is not None:  # what the disk holds
            return
        fd = self._open_verified(digest)
        try:
            actual = self._file_digest(fd)[0]
        finally:
            os.close(fd)
        if actual != digest:
            raise DataLoss(f"blob {digest} is corrupt: its bytes no longer match its digest")

    def copy_to_fd(self, digest: str, dst: int) -> int:
        packed = self._packed(digest)
        if packed is not None:
            try:
                write_all(dst, packed)
            except OSError as exc:
                raise disk_full(exc, DestinationFull) from exc
            return len(packed)
        fd = self._open_verified(digest)
        hasher = self.hasher()
        size = 0
        try:  # (with a key, the tag is checked at the end: the caller's file is its own
            # temporary, renamed in only when this returns: apply.py)
            for chunk in self.opening(file_chunks(fd)):
                hasher.update(chunk)
                size += len(chunk)
                write_all(dst, chunk)
        except OSError as exc:
            raise disk_full(exc, DestinationFull) from exc
        finally:
            os.close(fd)
        if hasher.hexdigest() != digest:
            raise DataLoss(f"blob {digest} is corrupt: its bytes no longer match its digest")
        return size

    def _stat(self, digest: str) -> os.stat_result:
        for path in self._candidates(digest) + [self._path(digest)]:
            try:
                return os.stat(path)
            except FileNotFoundError:
                continue
        raise NotFound(f"blob {digest} does not exist")

    def size(self, digest: str) -> int:
        row = self.pack.row(check_digest(digest))
        return row.size if row is not None else self._stat(digest).st_size - self._overhead

    def stored_at(self, digest: str) -> float:
        with self._lock:
            reused = self._reused.get(digest, 0.0)
        row = self.pack.row(check_digest(digest))
        return max(row.stored_at if row is not None else self._stat(digest).st_mtime, reused)

    def _sweepable(self, digest: str, older_than: float | None, gone: Collection[str] = ()
                   ) -> tuple[Row | None, os.stat_result | None] | None:
        """What a sweep may delete of ``digest`` now, (its pack row, None) or (None, its
        file's stat); None to keep it: a put is making a delta of it or storing it, it
        was stored or last reused at ``older_than`` or after, or a delta is built on it
        (but those in ``gone``, a dry run's, counted as deleted already). The caller
        holds the lock."""
        if digest in self._pins:
            return None  # a put is making a delta of it right now
        reused = self._reused.get(digest, 0.0)
        row = self.pack.row(digest)
        if row is not None:
            if digest in self.pack.pending or digest in self.pack.committing:
                return None  # being stored right now
            if (older_than is not None and max(row.stored_at, reused) >= older_than) \
                    or self.pack.depends_on(digest, gone):
                return None
            return row, None
        try:
            st = os.stat(self._path(digest))
        except FileNotFoundError:
            return None
        if older_than is not None and max(st.st_mtime, reused) >= older_than:
            return None
        return None, st

    def freeable(self, digest: str, older_than: float | None, gone: set[str]) -> int:
        with self._lock:
            found = self._sweepable(digest, older_than, gone)
        if found is None:
            return 0
        row, st = found
        return len(row.data) if row is not None else st.st_size

    def delete(self, digest: str, older_than: float | None = None) -> int:
        path = self._path(digest)
        with self._lock:
            found = self._sweepable(digest, older_than)
            if found is None:
                return 0
            row, st = found
            if row is not None:
                self._reused.pop(digest, None)
                return self.pack.delete(digest)
            try:
                os.unlink(path)
            except FileNotFoundError:
                return 0
            self._reused.pop(digest, None)
            if older_than is not None and len(self._reused) > 100_000:
                # bounded memory: reuses older than the grace gc is applying are moot
                self._reused = {d: t for d, t in self._reused.items() if t >= older_than}
        return st.st_size

    def digests(self) -> Iterator[str]:
        """Every stored digest; those of the pack first, each delta before its base, so
        a sweep that deletes in this order frees a whole unneeded chain at once."""
        packed = list(self.pack.digests_dependents_first())
        with self._lock:
            found = set(self._pending) | set(self._moving) | set(self.pack.pending) | set(
                self.pack.committing)
        for prefix in os.listdir(self.root):
            if len(prefix) == 2:
                found.update(prefix + rest for rest in os.listdir(os.path.join(self.root, prefix))
                             if DIGEST_RE.match(prefix + rest))
        return iter(packed + sorted(found - set(packed)))

    def inventory(self) -> Iterator[tuple[str, int]]:
        """(digest, size) of every blob stored (committed rows of the pack, then files)."""
        for raw, size in self.pack._all("SELECT digest, size FROM objects"):
            yield bytes(raw).hex(), size
        for prefix in os.listdir(self.root):
            if len(prefix) != 2:
                continue
            for rest in os.listdir(os.path.join(self.root, prefix)):
                if DIGEST_RE.match(prefix + rest):
                    try:
                        yield prefix + rest, os.stat(
                            os.path.join(self.root, prefix, rest)).st_size - self._overhead
                    except FileNotFoundError:
                        continue

    def recover(self) -> tuple[int, int]:
        """At start, before any put: finish the renames a crash interrupted and remove
        every other temporary (blob_files.recover). Returns (renamed, removed)."""
        return blob_files.recover(self)
