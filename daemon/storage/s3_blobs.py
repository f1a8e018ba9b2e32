"""The fleet's blob store: an S3-compatible bucket shared by every host, with the
host's ``LocalBlobStore`` as a cache in front of it.

Contract: ``BlobStore``'s (blob_store.py), with durability meaning *in the bucket*.

- **Puts** go to the cache (which keeps deltas, as on a single host) and are noted
  for upload. ``sync()`` asks the blob index once which of the noted digests the
  bucket has (renewing their ``stored_at``, so gc on another host leaves them be),
  and uploads the rest. It asks only about the digests worth a round trip: those this
  host had cached before (it uploaded or fetched them: a file edited back, a fork's
  files) and, in a batch over ``ASK_ALL_OVER``, every digest (an install or a build
  another host may have stored). A new blob in a small batch (an agent's edit, the
  trees above it) is uploaded without asking: recording it renews the row of a
  digest already indexed, as asking would have, so a checkpoint on the fleet costs
  one round trip less, and a blob another host happened to store already costs its
  bytes in this pack (garbage, for gc's repack) instead.
  Small blobs go as **one pack object**:
  entries compressed one by one as the local pack compresses whole rows (so a host
  filling its cache stores them as they come), concatenated, written under a
  write-once name (``If-None-Match: *``) of its own: its content's SHA-256 and a
  random part (``pack_name``), so no two uploads share a name and no delete decided
  earlier can hit an object just uploaded. Large ones (over ``ALONE``) are objects of
  their own, uploaded in parts, named by their digest and a random part. Each object is indexed only
  after its upload: a checkpoint's objects in the checkpoint's own transaction
  (``committing()`` yields them for ``Store.append_checkpoint``), other uploads in one
  transaction per object at the end of ``sync()``. An object stays in ``_unindexed``
  until a transaction that recorded it has committed, and every checkpoint records
  all that are there (another session's sync may have uploaded its blobs), so an
  acknowledged checkpoint's blobs are in the bucket and findable from any host, and
  no index row ever names a missing object. A crash between an upload and the commit
  leaves an object no row names: gc removes it after the grace period.
- **Reads** are served by the cache when it has the blob. On a miss the whole object
  holding it is fetched once (a pack holds what one checkpoint added, so a restore or
  fork on a cold host reads a few packs, not thousands of ranges), every entry
  verified against its digest and put into the cache. Bytes that do not match their
  digest raise ``DataLoss``; nothing unverified reaches a caller or the cache.
- **The cache** is not what is durable: its rows are committed by a thread of their
  own (``_commit_behind``) with no fsync, and readable here until then. It is bounded
  (``cache_bytes``): after a sync, blobs the bucket holds are
  evicted least recently used first until the cache is under its bound. Blobs still
  to be uploaded are never evicted.
- **Garbage collection and rewriting at rest** (s3_sweep.py): ``delete`` removes a
  digest's index row (and its cached copy) if it is older than the grace period;
  ``compact`` then deletes objects no row names and rewrites packs that are mostly
  garbage; ``consolidate`` rewrites small packs into one, with deltas, once the host
  has rested. ``flush_staged`` moves staged objects to the bucket.
- **fsck** (s3_fsck.py) reads the durable copy (``check_objects``, ``read_uncached``)
  and ``mend`` puts good copies back under new write-once names.
- **Transfers** (s3_transfer.py): a sync's batch packed and uploaded, a large blob
  streamed up; a missed read's pack fetched into the cache, a large blob streamed
  down. The store keeps what they are for: what waits, what is indexed, what is cached.
- **The bucket's client** (s3_bucket.py): its settings, the objects' names, each
  request counted.
- **With a data key** (the cache's, ``--encryption-key``): a pack object, staged or
  PUT, is sealed whole (AES-256-GCM) after its entries are compressed, and opened as
  it is read, before any entry is decoded; its name carries the keyed address of its
  content. A large blob's object holds the cache's file as it is, a sealed stream,
  and a fetched one is verified (tag and keyed address) before the cache takes it.
  Every entry is checked against its keyed address as without a key, which also
  binds a sealed object to the rows that name it. The fleet's keyring is the object
  ``KEYRING`` (keyring.py), which no sweep deletes.

Errors: the bucket unreachable is ``Unavailable``; an object the index names but the
bucket lacks, or bytes that do not match, ``DataLoss``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from worldline.wire.errors import DataLoss, NotFound

from ..faults import crash_point
from ..observe import MOVED_OBJECTS, STAGED_BYTES
from . import bucket_packs, s3_fsck, s3_sweep, s3_transfer
from .blob_index import STAGED, BlobIndex, Location, StoredObject, is_staged
from .blob_store import check_digest
from .blobs import LocalBlobStore
from .s3_bucket import (  # noqa: F401 - the names this module has always offered
    ALONE,
    CLIENT_SETTINGS,
    OBJECT_CONTEXT,
    PACK_LIMIT,
    PART_BYTES,
    REQUEST_SECONDS,
    RETRY_SHARE,
    Bucket,
    S3Store,
    Vanished,
    bucket_client,
    content_of,
    duration_seconds,
    obstore,
    pack_name,
    parse_url,
)
from .s3_fsck import Broken, BucketCheck  # noqa: F401
from .s3_sweep import (  # noqa: F401
    CONSOLIDATE_BYTES,
    CONSOLIDATE_MIN,
    CONSOLIDATE_SMALL,
    REPACK_BELOW,
)
from .s3_transfer import ASK_ALL_OVER  # noqa: F401

log = logging.getLogger(__name__)

RECENT_BYTES = 96 << 20  # fetched blobs kept in memory for the reads that follow
UNINDEXED_SECONDS = 60.0  # an upload not indexed within this is sent again (gc grace: 600)
STAGE_BYTES = 1 << 20  # a pack this small is staged in the metadata store, not PUT
STAGE_LIMIT = 64 << 20  # ...while this host's staged bytes stay under this
# Staged objects go to the bucket (in objects of at most FLUSH_BYTES, or one staged
# object: under CONSOLIDATE_SMALL either way) once this host has staged FLUSH_BYTES,
# or FLUSH_OBJECTS objects, or the oldest is FLUSH_SECONDS old.
FLUSH_BYTES = 1 << 20
FLUSH_OBJECTS = 256
FLUSH_SECONDS = 30.0


class S3BlobStore:
    local = False

    def __init__(self, url: str, cache: LocalBlobStore, index: BlobIndex, host: str,
                 cache_bytes: int = 16 << 30, stage_bytes: int | None = None,
                 request_seconds: float = REQUEST_SECONDS) -> None:
        self.url = url
        self.client = Bucket(url, request_seconds)  # every request to the bucket
        self.bucket = self.client.store  # the SDK's store
        self.requests = self.client.requests  # since start, for metrics/bench
        self.cache = cache
        self.key = cache.key  # seals what goes to the bucket, as the cache's files
        self.pack = cache.pack  # the cache's pack file (its WAL is compacted when idle)
        self.index = index
        self.host = host
        self.cache_bytes = cache_bytes
        self.stage_bytes = STAGE_BYTES if stage_bytes is None else stage_bytes  # 0: PUT all
        self._upload: dict[str, bytes | None] = {}  # digest -> bytes, or None: read back
        self._uploading: dict[str, bytes | None] = {}  # taken by the running sync
        self._reput: set[str] = set()  # noted for upload, cached here before: ask first
        self._unindexed: dict[str, StoredObject] = {}  # uploaded, no commit recorded it yet
        self._lru: OrderedDict[str, int] = OrderedDict()  # digest -> size, in the cache
        self._lru_bytes = 0
        self._recent: OrderedDict[str, bytes] = OrderedDict()  # verified, just fetched
        self._recent_bytes = 0
        self._lock = threading.Lock()
        self._sync_lock = threading.Lock()
        self._fetch_lock = threading.Lock()
        self._rewrite_lock = threading.Lock()  # compact and consolidate: one at a time
        self._behind = threading.Condition(self._lock)  # the cache's commits: _commit_behind
        self._behind_due = self._closing = False
        self._behind_thread: threading.Thread | None = None
        # This host's staged objects recorded: name -> (bytes, created_at); an earlier
        # run's too, which the first flush moves.
        self._staged: dict[str, tuple[int, float]] = {
            name: (nbytes, created_at) for name, nbytes, created_at, _host
            in index.staged_objects(host, float("inf"))}
        self._moved: set[str] = set()  # objects this run moved there, not rewritten since
        self._gauges()
        for digest, size in cache.inventory():  # what earlier runs cached: oldest first
            self._used(digest, size)

    def close(self) -> None:
        with self._lock:
            self._closing = True
            self._behind.notify()
            thread = self._behind_thread
        if thread is not None:
            thread.join()
        try:
            self.cache.sync()  # what the thread had not taken yet
        finally:
            self.cache.close()

    def _commit_behind(self) -> None:
        """The cache's new rows are committed by a thread of their own: the bucket is
        what is durable, so a checkpoint does not wait for them, and a cold fork goes on
        writing its files while the rows it fetched are committed. Until then they are
        readable here, like any put not yet synced; a crash only loses cache."""
        with self._lock:
            self._behind_due = True
            if self._behind_thread is None:
                self._behind_thread = threading.Thread(target=self._behind_loop,
                                                       name="cache-commit", daemon=True)
                self._behind_thread.start()
            self._behind.notify()

    def _behind_loop(self) -> None:
        while True:
            with self._lock:
                while not self._behind_due and not self._closing:
                    self._behind.wait()
                if self._closing:
                    return
                self._behind_due = False
            try:
                self.cache.sync()
            except Exception:  # the rows wait in the cache for the next commit
                log.warning("the blob cache could not commit; trying again", exc_info=True)
                time.sleep(1.0)
                with self._lock:
                    self._behind_due = True

    # -- the bucket's objects, sealed with a key ------------------------------------------
    def _sealed(self, body: bytes) -> bytes:
        """A pack object's bytes as the bucket (or its staged row) holds them."""
        return body if self.key is None else self.key.seal_blob(body, OBJECT_CONTEXT)

    def _opened(self, name: str, body: bytes) -> bytes:
        if self.key is None:
            return body
        try:
            return self.key.open_blob(body, OBJECT_CONTEXT)
        except DataLoss:
            raise DataLoss(f"object {name} of {self.url} fails its authentication tag"
                           " (damaged, or sealed with another key)") from None

    def _pack_name(self, body: bytes) -> str:
        return pack_name(body, self.cache.address)

    def _put_object(self, name: str, body) -> None:
        """A pack: one PUT under a name of its own (pack_name), write-once
        (If-None-Match: *); sealed with a key."""
        self.client.put_once(name, self._sealed(body))

    def _get_object(self, name: str, opened: bool = True) -> bytes:
        """A pack object's bytes (``opened``: as they were before ``_sealed``)."""
        if is_staged(name):  # its bytes are its row's; no row: moved to the bucket
            body = self.index.staged_body(name)
            if body is None:
                raise Vanished(name)
            return self._opened(name, body) if opened else body
        try:
            body = bytes(self.client.get(name).bytes())
            return self._opened(name, body) if opened else body
        except FileNotFoundError:
            if self.index.object_entries(name):
                raise DataLoss(f"object {name} of {self.url} is indexed but missing") from None
            raise Vanished(name) from None

    # -- putting ---------------------------------------------------------------------------
    def _note(self, digest: str, data: bytes | None, size: int) -> None:
        with self._lock:
            if digest not in self._upload:
                self._upload[digest] = data if data is not None and size <= ALONE else None
                if digest in self._lru:
                    self._reput.add(digest)
            self._used(digest, size)

    def _used(self, digest: str, size: int) -> None:
        """Most recently used now (the caller holds the lock)."""
        if digest in self._lru:
            self._lru.move_to_end(digest)
        else:
            self._lru[digest] = size
            self._lru_bytes += size

    def put_bytes(self, data: bytes, base: str | None = None) -> str:
        digest = self.cache.put_bytes(data, base)
        self._note(digest, data, len(data))
        return digest

    def put_many(self, blobs: list[bytes]) -> list[str]:
        digests = self.cache.put_many(blobs)
        for digest, data in zip(digests, blobs, strict=True):
            self._note(digest, data, len(data))
        return digests

    def put_fd(self, fd: int, limit: int | None = None) -> tuple[str, int]:
        digest, size = self.cache.put_fd(fd, limit)
        self._note(digest, None, size)
        return digest, size

    def sync(self) -> None:
        self._commit_behind()
        self._send()
        self._index(self._waiting())
        with self._sync_lock:
            self._evict()

    @contextmanager
    def committing(self):
        self._send()
        objects = self._waiting()
        try:
            yield objects
        except BaseException:
            try:  # the checkpoint did not commit: its uploads are indexed on their own
                self._index(objects)
            except Exception:  # they stay waiting: the next sync or checkpoint has them
                log.warning("objects uploaded for a failed checkpoint are not indexed yet",
                            exc_info=True)
            raise
        self._recorded(objects)
        self._commit_behind()  # after the checkpoint's commit, which it would slow
        with self._sync_lock:
            self._evict()

    def _send(self) -> None:
        """What was put since the last send, uploaded (the caller has the cache commit
        behind: sync before, a checkpoint once it has committed)."""
        with self._sync_lock:
            self._resend_stale()
            with self._lock:
                batch, self._upload = self._upload, {}
                reput, self._reput = self._reput, set()
                self._uploading = batch
            try:
                if batch:
                    s3_transfer.upload_batch(self, batch, reput)
            except BaseException:
                with self._lock:  # the next sync tries them again
                    for digest, data in batch.items():
                        self._upload.setdefault(digest, data)
                    self._reput |= reput
                raise
            finally:
                with self._lock:
                    self._uploading = {}

    def _waiting(self) -> list[StoredObject]:
        """The objects uploaded and not yet recorded."""
        with self._lock:
            return sorted(self._unindexed.values())

    def _resend_stale(self) -> None:
        """An object left unrecorded too long (the metadata store was away) is given
        up: gc on another host may delete an object nothing names once its grace period
        is over, so its blobs (kept in the cache: eviction takes only indexed ones) go
        out again, in this upload (the caller holds the sync lock)."""
        stale = time.time() - UNINDEXED_SECONDS
        with self._lock:
            for o in [o for o in self._unindexed.values() if o.created_at < stale]:
                del self._unindexed[o.name]
                for digest, *_ in o.entries:
                    self._upload.setdefault(digest, None)
                    self._reput.add(digest)

    def _index(self, objects: list[StoredObject]) -> None:
        for o in objects:
            self.index.add_blob_object(*o)
            self._recorded([o])

    def _recorded(self, objects: list[StoredObject]) -> None:
        with self._lock:
            for o in objects:
                self._unindexed.pop(o.name, None)
                if o.body is not None:
                    self._staged[o.name] = (o.nbytes, o.created_at)
            self._gauges()

    def _upload_pack(self, pack: bytearray, entries, now: float) -> None:
        """A pack: staged (its bytes go into the metadata store with its row, in the
        transaction that records it) when it is small and this host has not staged too
        much; else PUT."""
        body = bytes(pack)
        with self._lock:
            staged = self._staged_bytes()
        if len(body) <= self.stage_bytes and staged + len(body) <= STAGE_LIMIT:
            # A name of its own, never a content's: a checkpoint recording a pack of the
            # very bytes of one being moved meanwhile must not find that one's row and
            # then lose it to the move.
            sealed = self._sealed(body)
            self._uploaded(StoredObject(f"{STAGED}{os.urandom(16).hex()}.pack", len(sealed),
                                        self.host, now, entries, sealed))
            return
        name = self._pack_name(body)
        self._put_object(name, body)
        crash_point("blobs.after_put")
        self._uploaded(StoredObject(name, len(body), self.host, now, entries))

    def _uploaded(self, o: StoredObject) -> None:
        with self._lock:
            self._unindexed[o.name] = o

    # -- reading ---------------------------------------------------------------------------
    def _locate(self, digest: str) -> Location:
        loc = self.index.locate_blobs([check_digest(digest)]).get(digest)
        if loc is None:
            raise NotFound(f"blob {digest} is not stored")
        return loc

    def _ensure_cached(self, digest: str) -> None:
        """Bring the blob into the cache from the bucket, verified (with the rest of
        its pack), unless the cache has it. An object that vanished under the read (gc
        on another host repacked it) is looked up once more."""
        try:
            self._fetch(digest)
        except Vanished:
            self._fetch(digest)

    def _fetch(self, digest: str) -> None:
        with self._lock:  # put or fetched by this process, not evicted since: cached
            if digest in self._lru:
                self._lru.move_to_end(digest)
                return
        if self.cache.has(digest):
            with self._lock:
                if digest in self._lru:
                    self._lru.move_to_end(digest)
            return
        with self._fetch_lock:  # one fetch of an object, however many readers miss it
            if self.cache.has(digest):
                return
            loc = self._locate(digest)
            if loc.codec == "raw" and loc.off == 0 and loc.size > ALONE:
                s3_transfer.fetch_alone(self, digest, loc)
            else:
                s3_transfer.fetch_pack(self, loc.object, digest)
            self._commit_behind()

    def _decoded(self, name: str, body: bytes,
                 entries: list[tuple[str, Location]]) -> dict[str, bytes]:
        """digest -> bytes of ``entries`` of object ``name`` (its ``body``), each
        verified against its digest (DataLoss otherwise)."""
        return bucket_packs.decode_all(
            bucket_packs.ObjectReader(body, f"{name} of {self.url}", self.cache.address),
            [(d, loc.off, loc.len, loc.codec, loc.size) for d, loc in entries])

    def address(self, data: bytes) -> str:
        return self.cache.address(data)  # names are the cache's (its key's)

    def hasher(self):
        return self.cache.hasher()

    def has(self, digest: str) -> bool:
        check_digest(digest)
        with self._lock:
            if digest in self._upload or digest in self._uploading:
                return True
        return self.cache.has(digest) or bool(self.index.locate_blobs([digest]))

    def _keep_recent(self, digest: str, data: bytes) -> None:
        """Verified bytes just fetched, kept in memory a while (the caller holds the
        lock): a restore or fork reads what it made this host fetch right after, and
        is spared reading each blob back from the cache."""
        self._recent[digest] = data
        self._recent_bytes += len(data)
        while self._recent_bytes > RECENT_BYTES:
            _, old = self._recent.popitem(last=False)
            self._recent_bytes -= len(old)

    def _recently_fetched(self, digest: str) -> bytes | None:
        with self._lock:
            return self._recent.get(digest)

    def read_bytes(self, digest: str) -> bytes:
        data = self._recently_fetched(digest)
        if data is not None:
            return data
        try:
            self._ensure_cached(digest)
            return self.cache.read_bytes(digest)
        except NotFound:  # evicted (or lost) between the two: from the bucket once more
            self._not_cached(digest)
            self._ensure_cached(digest)
            return self.cache.read_bytes(digest)

    def copy_to_fd(self, digest: str, fd: int) -> int:
        data = self._recently_fetched(digest)
        if data is not None:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            return len(data)
        self._ensure_cached(digest)
        try:
            return self.cache.copy_to_fd(digest, fd)
        except NotFound:  # raised before a byte is written: as read_bytes
            self._not_cached(digest)
            self._ensure_cached(digest)
            return self.cache.copy_to_fd(digest, fd)

    def _not_cached(self, digest: str) -> None:
        with self._lock:
            size = self._lru.pop(digest, None)
            if size is not None:
                self._lru_bytes -= size

    def verify(self, digest: str) -> None:
        """The blob is readable and whole: from the cache if it has it, else fetched
        (and verified) from the bucket."""
        self._ensure_cached(digest)
        self.cache.verify(digest)

    def size(self, digest: str) -> int:
        with self._lock:
            pending = digest in self._upload or digest in self._uploading
        if pending:
            return self.cache.size(digest)
        return self._locate(digest).size

    def stored_at(self, digest: str) -> float:
        with self._lock:
            if digest in self._upload or digest in self._uploading:
                return time.time()
        return self._locate(digest).stored_at

    def digests(self) -> Iterator[str]:
        with self._lock:
            pending = set(self._upload) | set(self._uploading)
        indexed = list(self.index.indexed_digests())
        return iter(indexed + sorted(pending - set(indexed)))

    # -- fsck: the durable copy (s3_fsck.py) --------------------------------------------------
    def check_objects(self, takes: Callable[[str], bool] = lambda name: True) -> BucketCheck:
        """Every object the index names (those ``takes(name)`` chooses) read from the
        bucket and verified in memory (s3_fsck.check_objects)."""
        return s3_fsck.check_objects(self, takes)

    def read_uncached(self, digest: str) -> bytes:
        """The blob's bytes, verified, nothing written to the cache (s3_fsck)."""
        return s3_fsck.read_uncached(self, digest)

    def mend(self, broken: dict[str, str], sources: list[LocalBlobStore]
             ) -> tuple[dict[str, str], dict[str, str]]:
        """Good copies of ``broken`` blobs put back in the bucket (s3_fsck.mend)."""
        return s3_fsck.mend(self, broken, sources)

    # -- garbage collection ------------------------------------------------------------------
    def freeable(self, digest: str, older_than: float | None, gone: set[str]) -> int:
        with self._lock:
            if digest in self._upload or digest in self._uploading:
                return 0
        loc = self.index.locate_blobs([check_digest(digest)]).get(digest)
        if loc is None or (older_than is not None and loc.stored_at >= older_than):
            return 0
        return loc.len

    def delete(self, digest: str, older_than: float | None = None) -> int:
        check_digest(digest)
        with self._lock:
            if digest in self._upload or digest in self._uploading:
                return 0  # being stored right now
        freed = self.index.forget_blob(digest, older_than)
        if freed:
            self._uncache(digest, settle=True)
        return freed

    def _uncache(self, digest: str, settle: bool = False) -> None:
        """The digest out of the cache, unless other cached rows are built on it. With
        ``settle`` (it is forgotten, not evicted), a row the cache has not committed yet
        (the commit-behind's) is committed first, so it goes too."""
        gone = self.cache.delete(digest) > 0 or not self.cache.has(digest)
        if not gone and settle:
            self.cache.sync()
            gone = self.cache.delete(digest) > 0 or not self.cache.has(digest)
        if not gone:
            with self._lock:  # a base other cached rows are built on: kept, counted, later
                if digest in self._lru:
                    self._lru.move_to_end(digest)
            return
        with self._lock:
            size = self._lru.pop(digest, None)
            if size is not None:
                self._lru_bytes -= size
            data = self._recent.pop(digest, None)
            if data is not None:
                self._recent_bytes -= len(data)

    # -- rewriting the bucket (s3_sweep.py) ----------------------------------------------------
    def compact(self, older_than: float) -> tuple[int, int]:
        """gc's sweep of the bucket (s3_sweep.compact); the caller holds the gc lock."""
        return s3_sweep.compact(self, older_than)

    def consolidate(self, keep_going: Callable[[], bool] = lambda: True,
                    older_than: float | None = None, any_host: bool = False,
                    hints: Callable[[], dict[str, str]] | None = None
                    ) -> tuple[int, int, int]:
        """Small packs rewritten into one, with deltas (s3_sweep.consolidate); the
        caller holds the gc lock."""
        return s3_sweep.consolidate(self, keep_going, older_than, any_host, hints)

    def _delete_objects(self, names: list[str]) -> None:
        """Delete objects of the bucket (a staged one is never there)."""
        self.client.delete([name for name in names if not is_staged(name)])

    def _unstage(self, names) -> None:
        """Staged objects (or objects moved from them) no longer recorded: moved to the
        bucket, rewritten, or forgotten."""
        with self._lock:
            for name in names:
                self._staged.pop(name, None)
                self._moved.discard(name)
            self._gauges()

    # -- staged objects --------------------------------------------------------------------
    def staged(self) -> tuple[int, int]:
        """(objects, bytes) this host has staged in the metadata store."""
        with self._lock:
            return len(self._staged), self._staged_bytes()

    def _gauges(self) -> None:
        """The metrics of what waits: staged bytes, moved objects not yet rewritten (the
        caller holds the lock, or is the constructor)."""
        STAGED_BYTES.set(self._staged_bytes())
        MOVED_OBJECTS.set(len(self._moved))

    def _staged_bytes(self) -> int:
        """The caller holds the lock (or is the constructor)."""
        return sum(nbytes for nbytes, _ in self._staged.values())

    def _flush_due(self, now: float) -> bool:
        """The caller holds the lock."""
        if not self._staged:
            return False
        return (len(self._staged) >= FLUSH_OBJECTS
                or self._staged_bytes() >= FLUSH_BYTES
                or min(at for _, at in self._staged.values()) <= now - FLUSH_SECONDS)

    def flush_staged(self, due_only: bool = True) -> tuple[int, int]:
        """Move this host's staged objects to the bucket, oldest first, in objects of at
        most ``FLUSH_BYTES`` (under ``CONSOLIDATE_SMALL``: at rest they are rewritten
        with deltas like any small pack). With ``due_only``, only once they are many,
        large or old enough (``FLUSH_*``; the daemon asks every second, busy or not; at
        rest ``consolidate`` takes them first). Returns (objects moved, bytes PUT)."""
        with self._lock:
            if not self._staged or (due_only and not self._flush_due(time.time())):
                return 0, 0
            oldest = sorted(self._staged.items(), key=lambda item: (item[1][1], item[0]))
        groups: list[list[str]] = [[]]
        total = 0
        for name, (nbytes, _) in oldest:
            if groups[-1] and total + nbytes > FLUSH_BYTES:
                groups.append([])
                total = 0
            groups[-1].append(name)
            total += nbytes
        moved = nbytes_put = 0
        for group in groups:
            nbytes_put += s3_sweep.move(self, group)
            moved += len(group)
        return moved, nbytes_put

    # -- the cache's bound -----------------------------------------------------------------
    def _evict(self) -> None:
        if self._lru_bytes <= self.cache_bytes:
            return
        with self._lock:
            doomed = []
            total = self._lru_bytes
            for digest, size in self._lru.items():
                if total <= self.cache_bytes:
                    break
                if digest in self._upload or digest in self._uploading:
                    continue
                doomed.append(digest)
                total -= size
        # Only what the bucket holds leaves the cache (a blob an earlier run cached but
        # never uploaded stays, and goes out with the next sync that puts it).
        indexed = self.index.locate_blobs(doomed) if doomed else {}
        for digest in doomed:  # in the bucket: a later read fetches it again
            if digest in indexed:
                self._uncache(digest)
