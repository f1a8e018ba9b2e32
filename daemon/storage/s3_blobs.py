"""The fleet's blob store: an S3-compatible bucket shared by every host, with the
host's ``LocalBlobStore`` as a cache in front of it.

Contract: ``BlobStore``'s (blobs.py), with durability meaning *in the bucket*.

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
- **Garbage collection** (one host at a time, under the store's gc lock): ``delete``
  removes a digest's index row (and its cached copy) if it is older than the grace
  period; ``compact`` then deletes objects no row names and rewrites packs that are
  mostly garbage (``_rewrite``, below).
- **Rewriting at rest** (``consolidate``, under the gc lock too, called by the daemon
  once the host has rested): this host's small packs become one object, each entry a
  delta from an earlier entry of the same object where that is smaller (the base its
  cache stores the blob against; bucket_packs.py), so what checkpoints uploaded whole
  is stored about as git's pack stores it, and still reads with one GET. ``_rewrite``
  reads the live entries (from the cache, verified, when it holds them all), PUTs the
  new object, points the rows at it and forgets the old objects in one transaction,
  then deletes them. A kill between those steps leaves an object no row names, which
  ``compact`` deletes; a reader that had located a blob in an old object finds it gone
  or no longer naming the blob (``_Vanished``) and looks it up again. gc rewrites
  every host's small packs the same way (``any_host``: those of a host gone before it
  rested), with bases from the checkpoints' trees (maintenance.base_hints).

- **fsck** reads the durable copy (``check_objects``): every object the index names,
  from the bucket (a staged one from its row), each blob verified in memory, nothing
  written to the cache, so a host whose cache holds every blob still sees what the
  bucket lost, and a full disk does not stop it. ``mend`` puts good copies the host
  holds back under new write-once names, and points the rows at them as a rewrite
  does (only rows that still name the broken object).

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

import hashlib
import logging
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta

from worldline.wire.errors import DataLoss, InvalidArgument, NotFound, Unavailable

from .. import progress
from ..faults import crash_point
from ..observe import BUCKET_REQUESTS, MOVED_OBJECTS, STAGED_BYTES
from . import bucket_packs, packs
from .blob_index import STAGED, BlobIndex, Location, StoredObject, is_staged
from .blob_store import check_digest, digest_of
from .blobs import LocalBlobStore
from .crypto import KEYRING, OVERHEAD, STREAM_CONTEXT

log = logging.getLogger(__name__)

try:
    import obstore
    from obstore.exceptions import AlreadyExistsError, BaseError
    from obstore.store import S3Store
except ImportError:  # pragma: no cover - the fleet extra is not installed
    obstore = None

ALONE = 8 << 20  # a blob larger than this is an object of its own
ASK_ALL_OVER = 1 << 20  # a batch larger than this asks the index about every digest
PART_BYTES = 16 << 20  # its parts
PACK_LIMIT = 64 << 20  # entries in one pack object, at most
RECENT_BYTES = 96 << 20  # fetched blobs kept in memory for the reads that follow
UNINDEXED_SECONDS = 60.0  # an upload not indexed within this is sent again (gc grace: 600)
REPACK_BELOW = 0.5  # a pack whose live entries are less than this share is rewritten
CONSOLIDATE_SMALL = 2 << 20  # a pack smaller than this is rewritten with others at rest
CONSOLIDATE_MIN = 16  # ...once this host has made this many
CONSOLIDATE_BYTES = 16 << 20  # ...at most this many bytes of them into one
STAGE_BYTES = 1 << 20  # a pack this small is staged in the metadata store, not PUT
STAGE_LIMIT = 64 << 20  # ...while this host's staged bytes stay under this
# Staged objects go to the bucket (in objects of at most FLUSH_BYTES, or one staged
# object: under CONSOLIDATE_SMALL either way) once this host has staged FLUSH_BYTES,
# or FLUSH_OBJECTS objects, or the oldest is FLUSH_SECONDS old.
FLUSH_BYTES = 1 << 20
FLUSH_OBJECTS = 256
FLUSH_SECONDS = 30.0
# A request to the bucket gives up after REQUEST_SECONDS (object_store's default: a
# 16 MiB part or a 64 MiB pack on a slow link). An error that comes back (5xx, a
# refused or dropped connection) is retried for RETRY_SHARE of that, with backoff; a
# request that hangs is not tried again, so a bucket that accepts and never answers
# fails a call in about REQUEST_SECONDS, not the SDK's 3 minutes of retried GETs.
REQUEST_SECONDS = 30.0
RETRY_SHARE = 0.6
# The HTTP client's settings the SDK takes from AWS_<NAME> (AWS_ALLOW_HTTP, ...): passed
# on explicitly, since options given to the store replace what it read from there.
CLIENT_SETTINGS = (
    "allow_http", "allow_invalid_certificates", "connect_timeout", "default_content_type",
    "http1_only", "http2_keep_alive_interval", "http2_keep_alive_timeout",
    "http2_keep_alive_while_idle", "http2_only", "pool_idle_timeout",
    "pool_max_idle_per_host", "proxy_url", "proxy_ca_certificate", "proxy_excludes",
    "randomize_addresses", "read_timeout", "timeout", "user_agent")


@dataclass
class Broken:
    """A blob the index names that its object cannot give whole: ``missing`` (the
    object is not in the bucket) or ``damaged`` (its bytes do not decode, or not to
    the digest)."""
    digest: str
    object: str
    state: str
    reason: str


@dataclass
class BucketCheck:
    """What ``check_objects`` found."""
    objects_total: int = 0  # the objects the index names
    objects_checked: int = 0  # ...read and verified
    bytes_read: int = 0
    blobs_checked: int = 0
    broken: list[Broken] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)  # what was not read, and why


class _Vanished(Exception):
    """An object was deleted after its rows were read (a repack moved them)."""


OBJECT_CONTEXT = b"worldline bucket object"  # a sealed pack object's associated data


def pack_name(body: bytes, address=digest_of) -> str:
    """A new pack object's name: its content's SHA-256 and a random part. Never the
    name of an object that exists or existed: a delete (gc's sweep of an object no row
    names, a rewrite's of the objects it replaced) decided on an earlier look can only
    hit the object it looked at, never one a host has just uploaded the same bytes as
    and is about to record (0.7.16; before, a pack was named by its content alone)."""
    return f"packs/{address(body)}-{os.urandom(8).hex()}.pack"


def content_of(name: str) -> str | None:
    """The content's SHA-256 a pack's name carries (``packs/<sha256>[-<random>].pack``,
    either generation), None for any other object."""
    return name[6:70] if name.startswith("packs/") else None


def bucket_client(request_seconds: float) -> tuple[dict[str, str], dict]:
    """(client options, retry config) for the store: the environment's AWS_<setting>
    values, a request timeout of ``request_seconds`` unless AWS_TIMEOUT says, and
    retries for RETRY_SHARE of whichever timeout holds (so a request that hangs is not
    tried again however short AWS_TIMEOUT is; a value the SDK cannot read keeps
    ``request_seconds`` here, and the SDK refuses it)."""
    options = {key: os.environ[f"AWS_{key.upper()}"] for key in CLIENT_SETTINGS
               if f"AWS_{key.upper()}" in os.environ}
    timeout = request_seconds
    if "timeout" in options:
        timeout = duration_seconds(options["timeout"]) or request_seconds
    else:
        options["timeout"] = f"{int(request_seconds * 1000)}ms"
    retry = {"retry_timeout": timedelta(seconds=timeout * RETRY_SHARE)}
    return options, retry


_UNIT_SECONDS = {
    **dict.fromkeys(("nsec", "ns"), 1e-9), **dict.fromkeys(("usec", "us", "\u00b5s"), 1e-6),
    **dict.fromkeys(("msec", "ms", "millis"), 1e-3),
    **dict.fromkeys(("seconds", "second", "secs", "sec", "s"), 1.0),
    **dict.fromkeys(("minutes", "minute", "mins", "min", "m"), 60.0),
    **dict.fromkeys(("hours", "hour", "hrs", "hr", "h"), 3600.0),
    **dict.fromkeys(("days", "day", "d"), 86400.0),
    **dict.fromkeys(("weeks", "week", "w"), 604800.0)}
_DURATION_PART = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z\u00b5]+)")


def duration_seconds(text: str) -> float | None:
    """A duration as the SDK's client settings spell it (humantime, case and all:
    ``30s``, ``500ms``, ``1m 30s``), in seconds; None if it is not one this reads (the
    SDK may still take it: months, years) or is zero."""
    total, at = 0.0, 0
    text = text.strip()
    while at < len(text):
        part = _DURATION_PART.match(text, at)
        if part is None or part.group(2) not in _UNIT_SECONDS:
            return None
        total += float(part.group(1)) * _UNIT_SECONDS[part.group(2)]
        at = part.end()
    return total or None


def parse_url(url: str) -> tuple[str, str]:
    """``s3://bucket/prefix`` -> (bucket, prefix without slashes at its ends)."""
    if not url.startswith("s3://") or not url[5:].split("/", 1)[0]:
        raise InvalidArgument(f"blob store {url!r} is not s3://bucket[/prefix]")
    bucket, _, prefix = url[5:].partition("/")
    return bucket, prefix.strip("/")


class S3BlobStore:
    local = False

    def __init__(self, url: str, cache: LocalBlobStore, index: BlobIndex, host: str,
                 cache_bytes: int = 16 << 30, stage_bytes: int | None = None,
                 request_seconds: float = REQUEST_SECONDS) -> None:
        if obstore is None:
            raise Unavailable("s3 blobs need obstore: pip install 'worldline[fleet]'")
        self.url = url
        name, prefix = parse_url(url)
        # Endpoint, region and credentials the SDK's usual way: AWS_ENDPOINT_URL,
        # AWS_REGION / AWS_DEFAULT_REGION, AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY
        # (AWS_ALLOW_HTTP=true for a plain-HTTP endpoint).
        options, retry = bucket_client(request_seconds)
        try:
            self.bucket = S3Store(name, prefix=prefix or None, client_options=options,
                                  retry_config=retry)
        except BaseError as exc:  # a setting of the environment's the SDK cannot take
            raise InvalidArgument(f"blob store {url}: the environment's AWS_* settings are"
                                  f" not valid: {str(exc).splitlines()[0]}") from None
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
        self.requests = {"put": 0, "get": 0, "delete": 0}  # since start, for metrics/bench
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

    # -- the bucket ------------------------------------------------------------------------
    def _count(self, op: str) -> None:
        self.requests[op] += 1
        BUCKET_REQUESTS.labels(op).inc()

    def _call(self, what: str, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except FileNotFoundError:
            raise
        except AlreadyExistsError:
            raise
        except (BaseError, OSError) as exc:
            raise Unavailable(f"the blob bucket {self.url} did not answer {what}:"
                              f" {str(exc).splitlines()[0] if str(exc) else exc}") from None

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
        body = self._sealed(body)
        self._count("put")
        try:
            self._call(f"PUT {name}", obstore.put, self.bucket, name, body, mode="create")
        except AlreadyExistsError:
            pass  # nobody else writes this name: a retry whose first attempt landed

    def _put_parts(self, name: str, body) -> None:
        """A large blob: a multipart upload (under a name of its own, like a pack's: S3
        has no write-once condition on multipart uploads that every server honours)."""
        self._count("put")
        self._call(f"PUT {name} (multipart)", obstore.put, self.bucket, name, body,
                   use_multipart=True, chunk_size=PART_BYTES)

    def _get_object(self, name: str, opened: bool = True) -> bytes:
        """A pack object's bytes (``opened``: as they were before ``_sealed``)."""
        if is_staged(name):  # its bytes are its row's; no row: moved to the bucket
            body = self.index.staged_body(name)
            if body is None:
                raise _Vanished(name)
            return self._opened(name, body) if opened else body
        self._count("get")
        try:
            body = bytes(self._call(f"GET {name}", obstore.get, self.bucket, name).bytes())
            return self._opened(name, body) if opened else body
        except FileNotFoundError:
            if self.index.object_entries(name):
                raise DataLoss(f"object {name} of {self.url} is indexed but missing") from None
            raise _Vanished(name) from None

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
                    self._upload_batch(batch, reput)
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

    def _upload_batch(self, batch: dict[str, bytes | None], reput: set[str]) -> None:
        now = time.time()
        large = (any(data is None for data in batch.values())
                 or sum(len(data) for data in batch.values()) > ASK_ALL_OVER)
        ask = sorted(batch) if large else sorted(reput.intersection(batch))
        stored = self.index.touch_blobs(ask, now) if ask else set()
        entries: list[tuple[str, int, int, int, str]] = []
        pack = bytearray()
        for digest in sorted(d for d in batch if d not in stored):
            data = batch[digest]
            if data is None:
                size = self.cache.size(digest)
                if size > ALONE:
                    self._upload_alone(digest, size, now)
                    continue
                data = self.cache.read_bytes(digest)
            packed, codec = bucket_packs.whole(data, packs.FAST)
            entries.append((digest, len(pack), len(packed), len(data), codec))
            pack += packed
            if len(pack) >= PACK_LIMIT:
                self._upload_pack(pack, entries, now)
                pack, entries = bytearray(), []
        if entries:
            self._upload_pack(pack, entries, now)

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

    def _upload_alone(self, digest: str, size: int, now: float) -> None:
        name = f"blobs/{digest[:2]}/{digest}-{os.urandom(8).hex()}"
        if self.key is not None:  # the cache's file as it is: sealed, verified first
            self.cache.verify(digest)
            fd = self.cache.open_blob(digest)
            try:
                with os.fdopen(fd, "rb", closefd=False) as f:
                    self._put_parts(name, f)
            finally:
                os.close(fd)
            self._uploaded(StoredObject(name, size + OVERHEAD, self.host, now,
                                        [(digest, 0, size + OVERHEAD, size, "raw")]))
            return
        fd, tmp = self._scratch()
        try:
            self.cache.copy_to_fd(digest, fd)
            with open(tmp, "rb") as f:
                self._put_parts(name, f)
        finally:
            os.close(fd)
            os.unlink(tmp)
        self._uploaded(StoredObject(name, size, self.host, now,
                                    [(digest, 0, size, size, "raw")]))

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
        except _Vanished:
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
                self._fetch_alone(digest, loc)
            else:
                self._fetch_pack(loc.object, digest)
            self._commit_behind()

    def _fetch_pack(self, name: str, wanted: str) -> None:
        """Every entry of object ``name`` the cache lacks, verified, into the cache. If
        the index no longer places ``wanted`` there (a rewrite moved it after it was
        looked up), ``_Vanished``: the caller looks it up again."""
        body = self._get_object(name)
        entries = self.index.object_entries(name)
        if wanted not in {d for d, _ in entries}:
            raise _Vanished(name)
        fresh = [(d, loc) for d, loc in entries if not self.cache.has(d)]
        found = self._decoded(name, body, fresh)
        for digest, loc in fresh:
            data = found[digest]
            kind = bucket_packs.CODECS.get(loc.codec)
            if kind is not None:  # a whole entry: the cache's row takes its bytes as they are
                packed = (kind, body[loc.off:loc.off + loc.len])
            else:  # a delta within the object: the cache keeps the blob whole
                packed = packs.compress_whole(data, packs.FAST)
            self.cache.put_verified(digest, data, packed)
            with self._lock:
                self._used(digest, len(data))
                self._keep_recent(digest, data)

    def _decoded(self, name: str, body: bytes,
                 entries: list[tuple[str, Location]]) -> dict[str, bytes]:
        """digest -> bytes of ``entries`` of object ``name`` (its ``body``), each
        verified against its digest (DataLoss otherwise)."""
        return bucket_packs.decode_all(
            bucket_packs.ObjectReader(body, f"{name} of {self.url}", self.cache.address),
            [(d, loc.off, loc.len, loc.codec, loc.size) for d, loc in entries])

    def _fetch_alone(self, digest: str, loc: Location) -> None:
        """A large blob: streamed to a temporary beside the cache, hashed on the way,
        and put into the cache only if it matches its digest."""
        self._count("get")
        fd, tmp = self._scratch()
        try:
            try:
                result = self._call(f"GET {loc.object}", obstore.get, self.bucket, loc.object)
            except FileNotFoundError:
                if self.index.object_entries(loc.object):
                    raise DataLoss(f"object {loc.object} of {self.url} is indexed but"
                                   " missing") from None
                raise _Vanished(loc.object) from None
            hasher = hashlib.sha256()
            for chunk in result.stream(min_chunk_size=1 << 20):
                hasher.update(chunk)
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view):]
            if self.key is not None:  # the cache's file as it is: it verifies it, takes it
                os.close(fd)
                fd = -1
                size = self.cache.put_sealed_file(digest, tmp)
                with self._lock:
                    self._used(digest, size)
                return
            if hasher.hexdigest() != digest:
                raise DataLoss(f"object {loc.object} of {self.url} does not match its digest")
            got, size = self.cache.put_fd(fd)
        finally:
            if fd >= 0:
                os.close(fd)
                os.unlink(tmp)
        if got != digest:  # the temporary is ours alone: this would be a local fault
            raise DataLoss(f"blob {digest} changed on its way into the cache")
        with self._lock:
            self._used(digest, size)

    def _scratch(self) -> tuple[int, str]:
        """A new temporary file beside the cache's, open for reading and writing."""
        path = os.path.join(self.cache.tmp, f"s3-{os.urandom(8).hex()}")
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600), path

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

    # -- fsck: the durable copy ---------------------------------------------------------------
    def check_objects(self, takes: Callable[[str], bool] = lambda name: True) -> BucketCheck:
        """Read every object the index names (those ``takes(name)`` chooses: a sampled
        pass) from where it is durable, the bucket (a staged object: its row), and
        verify each blob the index places in it against its digest: in memory, nothing
        written to the cache or the disk (a large blob streamed and hashed on the way).
        The cache is not asked: a host whose cache holds every blob still finds an
        object the bucket lost. An object that cannot be read (the bucket does not
        answer) is reported unchecked, and so is every one after it."""
        check = BucketCheck()
        objects = self.index.blob_objects()
        check.objects_total = len(objects)
        chosen = [name for name, _bytes, _at, _live, _host in objects if takes(name)]
        progress.begin("reading the bucket's objects", len(chosen), "objects")
        for n, name in enumerate(chosen):
            progress.advance()
            try:
                self._check_object(name, check)
            except Unavailable as exc:
                check.unchecked.append(f"object {name}: not read: {exc.message}")
                check.unchecked.extend(f"object {later}: not read: the bucket did not answer"
                                       " before it" for later in chosen[n + 1:])
                break
            check.objects_checked += 1
        return check

    def _check_object(self, name: str, check: BucketCheck) -> None:
        alone = name.startswith("blobs/")
        try:
            if alone:
                body, got = None, self._stream_digest(name, check)
            else:
                body = self._get_object(name, opened=False)
                check.bytes_read += len(body)
        except (_Vanished, DataLoss):  # a rewrite deleted it after the listing, or lost
            body = got = None
            entries = self.index.object_entries(name)
            if entries:
                check.blobs_checked += len(entries)
                check.broken.extend(Broken(d, name, "missing", f"object {name} is not in"
                                           f" {self.url}") for d, _ in entries)
            return
        entries = self.index.object_entries(name)  # after the read: what is still in it
        check.blobs_checked += len(entries)
        if alone:
            for digest, loc in entries:
                if got != (digest, loc.size):
                    check.broken.append(Broken(digest, name, "damaged", f"object {name}"
                                               " does not match its digest"))
            return
        try:
            body = self._opened(name, body)
        except DataLoss as exc:  # every entry is in the sealed whole: each is damaged
            check.broken.extend(Broken(d, name, "damaged", exc.message) for d, _ in entries)
            return
        for digest, found in self._decode_each(name, body, entries).items():
            if isinstance(found, DataLoss):
                check.broken.append(Broken(digest, name, "damaged", found.message))

    def _stream_digest(self, name: str, check: BucketCheck) -> tuple[str, int]:
        """(SHA-256, size) of a large blob's object, read in chunks (FileNotFoundError:
        ``_Vanished`` or ``DataLoss``, as ``_get_object``)."""
        self._count("get")
        try:
            result = self._call(f"GET {name}", obstore.get, self.bucket, name)
        except FileNotFoundError:
            raise _Vanished(name) from None
        hasher, size, read = self.cache.hasher(), 0, 0

        def counted():
            nonlocal read
            for chunk in result.stream(min_chunk_size=1 << 20):
                read += len(chunk)
                yield chunk

        try:
            for chunk in self.cache.opening(counted()):
                hasher.update(chunk)
                size += len(chunk)
        except (BaseError, OSError) as exc:
            raise Unavailable(f"the blob bucket {self.url} did not answer GET {name}:"
                              f" {str(exc).splitlines()[0] if str(exc) else exc}") from None
        except DataLoss:  # its tag: no digest of it matches
            check.bytes_read += read
            return "", size
        check.bytes_read += read
        return hasher.hexdigest(), size

    def _decode_each(self, name: str, body: bytes, entries: list[tuple[str, Location]]
                     ) -> dict[str, bytes | DataLoss]:
        """digest -> bytes of each of ``entries`` of object ``name``, verified, or the
        DataLoss that entry alone raised (one damaged entry spoils only itself and the
        entries built on it)."""
        out: dict[str, bytes | DataLoss] = {}
        reader = bucket_packs.ObjectReader(body, f"{name} of {self.url}", self.cache.address)
        for digest, loc in entries:
            try:
                out[digest] = bucket_packs.decode_all(
                    reader, [(digest, loc.off, loc.len, loc.codec, loc.size)])[digest]
            except DataLoss as exc:
                out[digest] = exc
        return out

    def read_uncached(self, digest: str) -> bytes:
        """The blob's bytes, verified, with nothing written to the cache: from the cache
        when it holds it whole, else from its object, whose other entries are kept in
        memory a while (``_keep_recent``) for the reads that follow. fsck's walk of the
        trees reads so: it needs no space on a full disk."""
        data = self._recently_fetched(digest)
        if data is not None:
            return data
        try:
            return self.cache.read_bytes(digest)
        except (NotFound, DataLoss):  # not cached, or its copy there is damaged
            pass
        for _ in range(2):  # once more if a rewrite moved it meanwhile
            loc = self._locate(digest)
            if loc.object.startswith("blobs/"):
                try:
                    body = bytes(self._call(f"GET {loc.object}", obstore.get, self.bucket,
                                            loc.object).bytes())
                except FileNotFoundError:
                    raise DataLoss(f"object {loc.object} of {self.url} is indexed but"
                                   " missing") from None
                if self.key is not None:
                    try:
                        body = self.key.open_blob(body, STREAM_CONTEXT)
                    except DataLoss:
                        raise DataLoss(f"object {loc.object} of {self.url} fails its"
                                       " authentication tag") from None
                if self.cache.address(body) != digest:
                    raise DataLoss(f"object {loc.object} of {self.url} does not match its"
                                   " digest")
                return body
            try:
                body = self._get_object(loc.object)
            except _Vanished:
                continue
            entries = self.index.object_entries(loc.object)
            if digest not in {d for d, _ in entries}:
                continue
            found = self._decode_each(loc.object, body, entries)
            with self._lock:
                for d, data in found.items():
                    if not isinstance(data, DataLoss):
                        self._keep_recent(d, data)
            data = found[digest]
            if isinstance(data, DataLoss):
                raise data
            return data
        raise NotFound(f"blob {digest} moved twice while it was read")

    def mend(self, broken: dict[str, str], sources: list[LocalBlobStore]
             ) -> tuple[dict[str, str], dict[str, str]]:
        """Put a good copy of each blob of ``broken`` (digest -> the object the index
        places it in, which the bucket lost or holds damaged) back in the bucket, from
        the first of this host's cache and ``sources`` (other data roots' blob stores)
        that holds it whole: small ones as one new pack object, large ones as objects
        of their own, each under a new write-once name as every upload (never a name
        that exists or existed: nothing is overwritten in place), then their rows
        pointed at it in one transaction with the damaged objects no row names any
        longer forgotten, and those deleted (``rewrite_blobs``, as a rewrite does: a row
        another host moved or forgot meanwhile is left as it is, and what was uploaded
        for it is garbage for gc). The caller holds the store's gc lock. Returns
        (digest -> the new object, for each row now pointed there; digest -> why it
        was not mended)."""
        small: dict[str, bytes] = {}
        large: dict[str, LocalBlobStore] = {}
        why: dict[str, str] = {}
        roots = ", ".join(s.root for s in [self.cache, *sources])
        for digest in sorted(broken):
            reasons = []
            for source in [self.cache, *sources]:
                try:
                    if not source.has(digest):
                        continue
                    if source.size(digest) > ALONE:
                        source.verify(digest)
                        large[digest] = source
                    else:
                        small[digest] = source.read_bytes(digest)
                    break
                except (NotFound, DataLoss) as exc:
                    reasons.append(f"{source.root}: {exc.message}")
            else:
                why[digest] = ("no good copy on this host"
                               + (f" ({'; '.join(reasons)})" if reasons else
                                  f" (looked in {roots})"))
        done: dict[str, str] = {}
        groups: list[dict[str, bytes]] = [{}]
        for digest, data in small.items():
            if groups[-1] and sum(map(len, groups[-1].values())) + len(data) > PACK_LIMIT:
                groups.append({})
            groups[-1][digest] = data
        try:
            for group in filter(None, groups):
                body, entries = bucket_packs.build(group, {})
                self._mended(self._pack_name(body), body, entries, broken, done, parts=False)
            for digest, source in large.items():
                fd = source.open_blob(digest)  # (with a key: sealed, as the bucket's)
                try:
                    with os.fdopen(fd, "rb", closefd=False) as f:
                        size = os.fstat(fd).st_size
                        self._mended(f"blobs/{digest[:2]}/{digest}-{os.urandom(8).hex()}",
                                     f, [(digest, 0, size, source.size(digest), "raw")],
                                     broken, done, parts=True)
                finally:
                    os.close(fd)
        except Unavailable as exc:  # the bucket or the index away: the rest waits
            for digest in set(small) | set(large):
                if digest not in done:
                    why[digest] = f"not mended: {exc.message}"
        for digest in set(small) | set(large):
            if digest not in done and digest not in why:
                why[digest] = ("its row was moved or forgotten meanwhile (gc, or a"
                               " rewrite): fsck again")
        return done, why

    def _mended(self, name: str, body, entries, broken: dict[str, str], done: dict[str, str],
                parts: bool) -> None:
        """One mending object: uploaded, its rows pointed at it, the objects it replaces
        forgotten and deleted; ``done`` gains the digests whose rows now name it."""
        nbytes = entries[0][2] if parts else len(body)
        if parts:
            self._put_parts(name, body)
        else:
            self._put_object(name, body)
        read_from = {d: broken[d] for d, *_ in entries}
        forgotten = self.index.rewrite_blobs(
            StoredObject(name, nbytes, self.host, time.time(), entries), read_from)
        self._unstage(read_from.values())
        self._delete_objects(forgotten)
        located = self.index.locate_blobs(list(read_from))
        done.update((d, name) for d in read_from if d in located and located[d].object == name)

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

    def compact(self, older_than: float) -> tuple[int, int]:
        """Delete objects no index row names (and objects of the bucket the index never
        recorded: a crash between a PUT and its index) and rewrite packs that are mostly
        garbage, among objects made before ``older_than``; return (objects removed,
        bytes freed). The caller holds the store's gc lock."""
        removed = freed = 0
        with self._rewrite_lock:
            for name, nbytes, created_at, live, _host in self.index.blob_objects():
                if created_at >= older_than:
                    continue  # a sync may still be indexing it
                if live and (not name.startswith("packs/") or live >= nbytes * REPACK_BELOW):
                    continue
                if live:  # its live entries go to a new object, then it is deleted
                    if self._rewrite([name]) is None:
                        continue  # rewritten to the very same bytes: nothing to free
                else:
                    self._delete_objects([name])
                    self.index.remove_blob_object(name)
                    self._unstage([name])
                removed += 1
                freed += nbytes - live
            known = {row[0] for row in self.index.blob_objects()}  # rewrites included
            known.add(KEYRING)  # not a blob's: the fleet's data key, wrapped
            for batch in self._call("LIST", obstore.list, self.bucket):
                for meta in batch:
                    if (meta["path"] in known
                            or meta["last_modified"].timestamp() >= older_than):
                        continue
                    self._delete_objects([meta["path"]])
                    removed += 1
                    freed += meta["size"]
        return removed, freed

    def consolidate(self, keep_going: Callable[[], bool] = lambda: True,
                    older_than: float | None = None, any_host: bool = False,
                    hints: Callable[[], dict[str, str]] | None = None
                    ) -> tuple[int, int, int]:
        """Rewrite this host's small pack objects (every host's with ``any_host``: gc's)
        made before ``older_than`` (default: now) into one, once there are
        ``CONSOLIDATE_MIN`` of them or one is staged or was moved from the stage by this
        host (flush_staged) since its last rewrite, each entry a delta from an earlier
        one where that is smaller (bucket_packs.py), then delete them. A blob's base is
        the one this host's cache stores it against, else its base in what ``hints()``
        returns (digest -> the digest the same path held before: gc finds them in the
        trees; asked only when there is a group to rewrite). One group of at most
        ``CONSOLIDATE_BYTES`` per call; gives up unchanged when ``keep_going()``
        turns false before the upload. Returns (objects rewritten, their bytes, the new
        object's bytes): (0, 0, 0) when there was nothing to do. The caller holds the
        store's gc lock (one rewriter across the fleet)."""
        cutoff = time.time() if older_than is None else older_than
        with self._rewrite_lock:
            small = sorted((created_at, name, nbytes) for name, nbytes, created_at, live, host
                           in self.index.blob_objects()
                           if (any_host or host == self.host)
                           and (name.startswith("packs/") or is_staged(name))
                           and live and nbytes < CONSOLIDATE_SMALL and created_at < cutoff)
            if len(small) < CONSOLIDATE_MIN and not any(
                    is_staged(n) or n in self._moved for _, n, _ in small):
                return 0, 0, 0  # (staged or moved ones are rewritten however few they are)
            group, before = [], 0
            for _, name, nbytes in small:
                if group and before + nbytes > CONSOLIDATE_BYTES:
                    break
                group.append(name)
                before += nbytes
            after = self._rewrite(group, keep_going, hints() if hints else None)
            if after is None:
                return 0, 0, 0
            return len(group), before, after

    def _cached_entries(self, wanted: list[tuple[str, Location]]) -> dict[str, bytes] | None:
        """The bytes of every blob of ``wanted``, verified, if the cache holds them all
        (a host rewriting what it uploaded, the usual case: no GET); else None."""
        if not all(self.cache.has(d) for d, _ in wanted):
            return None
        try:
            return {d: self.cache.read_bytes(d) for d, _ in wanted}
        except NotFound:  # evicted meanwhile
            return None

    def _delete_objects(self, names: list[str]) -> None:
        """Delete objects: several in one request (S3's DeleteObjects, up to a thousand
        per request), or one by one where the server does not take that; one already
        gone is no error."""
        names = [name for name in names if not is_staged(name)]  # never in the bucket
        if len(names) > 1:
            self._count("delete")
            try:
                obstore.delete(self.bucket, list(names))
                return
            except FileNotFoundError:
                return
            except (BaseError, OSError) as exc:  # no DeleteObjects here: one at a time
                log.info("the bucket refused a bulk delete (%s); deleting one by one",
                         str(exc).splitlines()[0] if str(exc) else exc)
        for name in names:
            self._count("delete")
            try:
                self._call(f"DELETE {name}", obstore.delete, self.bucket, name)
            except FileNotFoundError:
                pass

    def _rewrite(self, names: list[str], keep_going: Callable[[], bool] = lambda: True,
                 hints: dict[str, str] | None = None) -> int | None:
        """The live entries of objects ``names``, read and verified, written as one new
        object (bucket_packs.build: each a delta from the base this host's cache stores
        it against, or else ``hints`` gives, when that base is among them and the delta
        is smaller), and their index rows pointed at it in one transaction that also
        forgets the old objects, which are then deleted (in one request: S3's
        DeleteObjects). Returns the new
        object's size, or None if nothing changed (given up, nothing live left to read,
        or the rewrite is one of ``names`` already)."""
        blobs: dict[str, bytes] = {}
        read_from: dict[str, str] = {}
        for name in names:
            wanted = self.index.object_entries(name)
            if not wanted:
                continue
            found = self._cached_entries(wanted)
            if found is None:  # not all in the cache: the object itself
                try:
                    body = self._get_object(name)
                except _Vanished:  # no row names it any longer: nothing of it to keep
                    continue
                found = self._decoded(name, body, wanted)
            blobs.update(found)
            read_from.update(dict.fromkeys(found, name))
            if not keep_going():
                return None
        if not blobs:
            return None
        bases = {}
        for digest in blobs:
            row = self.cache.pack.row(digest)
            if row is not None and row.base in blobs:
                bases[digest] = row.base
            elif hints and hints.get(digest) in blobs:
                bases[digest] = hints[digest]
        try:
            body, entries = bucket_packs.build(blobs, bases, keep_going=keep_going)
        except bucket_packs.GaveUp:
            return None
        new = self._pack_name(body)
        if content_of(new) in {content_of(name) for name in names}:
            # the very bytes of one of them: nothing to gain (nor to try again, if moved)
            with self._lock:
                self._moved.difference_update(names)
                self._gauges()
            return None
        if not keep_going():
            return None
        self._put_object(new, body)
        crash_point("blobs.rewrite_after_put")
        forgotten = self.index.rewrite_blobs(
            StoredObject(new, len(body), self.host, time.time(), entries), read_from)
        self._unstage(read_from.values())
        crash_point("blobs.rewrite_after_index")  # the old objects: compact's LIST sweep
        self._delete_objects(forgotten)  # not one a checkpoint recorded rows in meanwhile
        return len(body)

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
            nbytes_put += self._move(group)
            moved += len(group)
        return moved, nbytes_put

    def _move(self, names: list[str]) -> int:
        """Staged objects ``names`` as one object of the bucket: their live entries
        copied as they are (whole entries, nothing to decode: this runs while
        checkpoints do), one PUT, then one transaction points the rows at it and
        forgets the staged rows with their bytes. A kill after the PUT leaves an object
        no row names (compact deletes it) and the staged rows as they were. Returns the
        bytes PUT."""
        with self._rewrite_lock:
            parts: list[bytes] = []
            entries: list[tuple[str, int, int, int, str]] = []
            read_from: dict[str, str] = {}
            off = 0
            for name, (sealed, rows) in self.index.staged_entries(names).items():
                body = self._opened(name, sealed)
                for digest, loc in rows:
                    if loc.codec in bucket_packs.CODECS:  # whole: its bytes as they are
                        chunk, codec = body[loc.off:loc.off + loc.len], loc.codec
                    else:  # (a staged object holds whole entries; anything else: made so)
                        data = self._decoded(name, body, [(digest, loc)])[digest]
                        chunk, codec = bucket_packs.whole(data, packs.FAST)
                    parts.append(chunk)
                    entries.append((digest, off, len(chunk), loc.size, codec))
                    read_from[digest] = name
                    off += len(chunk)
            body = b"".join(parts)
            if entries:
                new = self._pack_name(body)
                self._put_object(new, body)
                crash_point("blobs.flush_after_put")
                self.index.rewrite_blobs(
                    StoredObject(new, len(body), self.host, time.time(), entries), read_from)
                with self._lock:
                    self._moved.add(new)
            for name in set(names) - set(read_from.values()):  # nothing live left in it
                self.index.remove_blob_object(name)
            self._unstage(names)  # (the gauges too)
            return len(body)

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
