"""Bytes between the fleet's bucket and the host's cache (s3_blobs.py): what a sync
uploads (a batch of puts packed into objects, a large blob streamed up from the cache)
and what a read that missed the cache fetches (a pack object, each of its entries
verified into the cache; a large blob streamed down and verified before the cache
takes it).

These are sections of ``S3BlobStore``, which calls them with itself: they use its
bucket client, index and cache, and leave the bookkeeping (what waits for upload,
what is indexed, what the cache holds) to it.
"""

from __future__ import annotations

import hashlib
import os
import time
from typing import TYPE_CHECKING

from worldline.wire.errors import DataLoss

from . import bucket_packs, packs
from .blob_index import Location, StoredObject
from .crypto import OVERHEAD
from .s3_bucket import ALONE, PACK_LIMIT, Vanished

if TYPE_CHECKING:
    from .s3_blobs import S3BlobStore

ASK_ALL_OVER = 1 << 20  # a batch larger than this asks the index about every digest


def upload_batch(store: S3BlobStore, batch: dict[str, bytes | None], reput: set[str]) -> None:
    """Upload what ``batch`` (digest -> its bytes, or None: read back from the cache)
    holds that the bucket lacks: the index is asked about the digests worth a round
    trip (``reput``, or all of a large batch), the rest packed into objects of at most
    ``PACK_LIMIT`` (``S3BlobStore._upload_pack``: staged or PUT), a blob over
    ``ALONE`` an object of its own."""
    now = time.time()
    large = (any(data is None for data in batch.values())
             or sum(len(data) for data in batch.values()) > ASK_ALL_OVER)
    ask = sorted(batch) if large else sorted(reput.intersection(batch))
    stored = store.index.touch_blobs(ask, now) if ask else set()
    entries: list[tuple[str, int, int, int, str]] = []
    pack = bytearray()
    for digest in sorted(d for d in batch if d not in stored):
        data = batch[digest]
        if data is None:
            size = store.cache.size(digest)
            if size > ALONE:
                upload_alone(store, digest, size, now)
                continue
            data = store.cache.read_bytes(digest)
        packed, codec = bucket_packs.whole(data, packs.FAST)
        entries.append((digest, len(pack), len(packed), len(data), codec))
        pack += packed
        if len(pack) >= PACK_LIMIT:
            store._upload_pack(pack, entries, now)
            pack, entries = bytearray(), []
    if entries:
        store._upload_pack(pack, entries, now)


def upload_alone(store: S3BlobStore, digest: str, size: int, now: float) -> None:
    """A large blob as an object of its own, in parts, from the cache's file (sealed as
    it is, with a key: verified first)."""
    name = f"blobs/{digest[:2]}/{digest}-{os.urandom(8).hex()}"
    if store.key is not None:  # the cache's file as it is: sealed, verified first
        store.cache.verify(digest)
        fd = store.cache.open_blob(digest)
        try:
            with os.fdopen(fd, "rb", closefd=False) as f:
                store.client.put_parts(name, f)
        finally:
            os.close(fd)
        store._uploaded(StoredObject(name, size + OVERHEAD, store.host, now,
                                    [(digest, 0, size + OVERHEAD, size, "raw")]))
        return
    fd, tmp = scratch(store)
    try:
        store.cache.copy_to_fd(digest, fd)
        with open(tmp, "rb") as f:
            store.client.put_parts(name, f)
    finally:
        os.close(fd)
        os.unlink(tmp)
    store._uploaded(StoredObject(name, size, store.host, now,
                                [(digest, 0, size, size, "raw")]))


def fetch_pack(store: S3BlobStore, name: str, wanted: str) -> None:
    """Every entry of object ``name`` the cache lacks, verified, into the cache. If
    the index no longer places ``wanted`` there (a rewrite moved it after it was
    looked up), ``Vanished``: the caller looks it up again."""
    body = store._get_object(name)
    entries = store.index.object_entries(name)
    if wanted not in {d for d, _ in entries}:
        raise Vanished(name)
    fresh = [(d, loc) for d, loc in entries if not store.cache.has(d)]
    found = store._decoded(name, body, fresh)
    for digest, loc in fresh:
        data = found[digest]
        kind = bucket_packs.CODECS.get(loc.codec)
        if kind is not None:  # a whole entry: the cache's row takes its bytes as they are
            packed = (kind, body[loc.off:loc.off + loc.len])
        else:  # a delta within the object: the cache keeps the blob whole
            packed = packs.compress_whole(data, packs.FAST)
        store.cache.put_verified(digest, data, packed)
        with store._lock:
            store._used(digest, len(data))
            store._keep_recent(digest, data)


def fetch_alone(store: S3BlobStore, digest: str, loc: Location) -> None:
    """A large blob: streamed to a temporary beside the cache, hashed on the way,
    and put into the cache only if it matches its digest."""
    fd, tmp = scratch(store)
    try:
        try:
            result = store.client.get(loc.object)
        except FileNotFoundError:
            if store.index.object_entries(loc.object):
                raise DataLoss(f"object {loc.object} of {store.url} is indexed but"
                               " missing") from None
            raise Vanished(loc.object) from None
        hasher = hashlib.sha256()
        for chunk in result.stream(min_chunk_size=1 << 20):
            hasher.update(chunk)
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view):]
        if store.key is not None:  # the cache's file as it is: it verifies it, takes it
            os.close(fd)
            fd = -1
            size = store.cache.put_sealed_file(digest, tmp)
            with store._lock:
                store._used(digest, size)
            return
        if hasher.hexdigest() != digest:
            raise DataLoss(f"object {loc.object} of {store.url} does not match its digest")
        got, size = store.cache.put_fd(fd)
    finally:
        if fd >= 0:
            os.close(fd)
            os.unlink(tmp)
    if got != digest:  # the temporary is ours alone: this would be a local fault
        raise DataLoss(f"blob {digest} changed on its way into the cache")
    with store._lock:
        store._used(digest, size)


def scratch(store: S3BlobStore) -> tuple[int, str]:
    """A new temporary file beside the cache's, open for reading and writing."""
    path = os.path.join(store.cache.tmp, f"s3-{os.urandom(8).hex()}")
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600), path
