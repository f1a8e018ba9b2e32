"""Rewriting the fleet's bucket (s3_blobs.py): gc's sweep, rewriting at rest, and the
move of staged objects to the bucket.

- **Garbage collection** (one host at a time, under the store's gc lock): after
  ``S3BlobStore.delete`` removed the index rows of dead digests, ``compact`` deletes
  objects no row names and rewrites packs that are mostly garbage (``rewrite``).
- **Rewriting at rest** (``consolidate``, under the gc lock too, called by the daemon
  once the host has rested): this host's small packs become one object, each entry a
  delta from an earlier entry of the same object where that is smaller (the base its
  cache stores the blob against; bucket_packs.py), so what checkpoints uploaded whole
  is stored about as git's pack stores it, and still reads with one GET. ``rewrite``
  reads the live entries (from the cache, verified, when it holds them all), PUTs the
  new object, points the rows at it and forgets the old objects in one transaction,
  then deletes them. A kill between those steps leaves an object no row names, which
  ``compact`` deletes; a reader that had located a blob in an old object finds it gone
  or no longer naming the blob (``Vanished``) and looks it up again. gc rewrites
  every host's small packs the same way (``any_host``: those of a host gone before it
  rested), with bases from the checkpoints' trees (maintenance.base_hints).
- **Moving staged objects** (``move``, for ``S3BlobStore.flush_staged``): their whole
  entries copied as they are into one object of the bucket.

These are sections of ``S3BlobStore``, which calls them with itself: they use its
bucket client, index, cache and locks.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from worldline.wire.errors import NotFound

from ..faults import crash_point
from . import bucket_packs, packs
from .blob_index import Location, StoredObject, is_staged
from .crypto import KEYRING
from .s3_bucket import Vanished, content_of

if TYPE_CHECKING:
    from .s3_blobs import S3BlobStore

REPACK_BELOW = 0.5  # a pack whose live entries are less than this share is rewritten
CONSOLIDATE_SMALL = 2 << 20  # a pack smaller than this is rewritten with others at rest
CONSOLIDATE_MIN = 16  # ...once this host has made this many
CONSOLIDATE_BYTES = 16 << 20  # ...at most this many bytes of them into one


def compact(store: S3BlobStore, older_than: float) -> tuple[int, int]:
    """Delete objects no index row names (and objects of the bucket the index never
    recorded: a crash between a PUT and its index) and rewrite packs that are mostly
    garbage, among objects made before ``older_than``; return (objects removed,
    bytes freed). The caller holds the store's gc lock."""
    removed = freed = 0
    with store._rewrite_lock:
        for name, nbytes, created_at, live, _host in store.index.blob_objects():
            if created_at >= older_than:
                continue  # a sync may still be indexing it
            if live and (not name.startswith("packs/") or live >= nbytes * REPACK_BELOW):
                continue
            if live:  # its live entries go to a new object, then it is deleted
                if rewrite(store, [name]) is None:
                    continue  # rewritten to the very same bytes: nothing to free
            else:
                store._delete_objects([name])
                store.index.remove_blob_object(name)
                store._unstage([name])
            removed += 1
            freed += nbytes - live
        known = {row[0] for row in store.index.blob_objects()}  # rewrites included
        known.add(KEYRING)  # not a blob's: the fleet's data key, wrapped
        for batch in store.client.listing():
            for meta in batch:
                if (meta["path"] in known
                        or meta["last_modified"].timestamp() >= older_than):
                    continue
                store._delete_objects([meta["path"]])
                removed += 1
                freed += meta["size"]
    return removed, freed


def consolidate(store: S3BlobStore, keep_going: Callable[[], bool] = lambda: True,
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
    with store._rewrite_lock:
        small = sorted((created_at, name, nbytes) for name, nbytes, created_at, live, host
                       in store.index.blob_objects()
                       if (any_host or host == store.host)
                       and (name.startswith("packs/") or is_staged(name))
                       and live and nbytes < CONSOLIDATE_SMALL and created_at < cutoff)
        if len(small) < CONSOLIDATE_MIN and not any(
                is_staged(n) or n in store._moved for _, n, _ in small):
            return 0, 0, 0  # (staged or moved ones are rewritten however few they are)
        group, before = [], 0
        for _, name, nbytes in small:
            if group and before + nbytes > CONSOLIDATE_BYTES:
                break
            group.append(name)
            before += nbytes
        after = rewrite(store, group, keep_going, hints() if hints else None)
        if after is None:
            return 0, 0, 0
        return len(group), before, after


def _cached_entries(store: S3BlobStore, wanted: list[tuple[str, Location]]
                    ) -> dict[str, bytes] | None:
    """The bytes of every blob of ``wanted``, verified, if the cache holds them all
    (a host rewriting what it uploaded, the usual case: no GET); else None."""
    if not all(store.cache.has(d) for d, _ in wanted):
        return None
    try:
        return {d: store.cache.read_bytes(d) for d, _ in wanted}
    except NotFound:  # evicted meanwhile
        return None


def rewrite(store: S3BlobStore, names: list[str],
            keep_going: Callable[[], bool] = lambda: True,
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
        wanted = store.index.object_entries(name)
        if not wanted:
            continue
        found = _cached_entries(store, wanted)
        if found is None:  # not all in the cache: the object itself
            try:
                body = store._get_object(name)
            except Vanished:  # no row names it any longer: nothing of it to keep
                continue
            found = store._decoded(name, body, wanted)
        blobs.update(found)
        read_from.update(dict.fromkeys(found, name))
        if not keep_going():
            return None
    if not blobs:
        return None
    bases = {}
    for digest in blobs:
        row = store.cache.pack.row(digest)
        if row is not None and row.base in blobs:
            bases[digest] = row.base
        elif hints and hints.get(digest) in blobs:
            bases[digest] = hints[digest]
    try:
        body, entries = bucket_packs.build(blobs, bases, keep_going=keep_going)
    except bucket_packs.GaveUp:
        return None
    new = store._pack_name(body)
    if content_of(new) in {content_of(name) for name in names}:
        # the very bytes of one of them: nothing to gain (nor to try again, if moved)
        with store._lock:
            store._moved.difference_update(names)
            store._gauges()
        return None
    if not keep_going():
        return None
    store._put_object(new, body)
    crash_point("blobs.rewrite_after_put")
    forgotten = store.index.rewrite_blobs(
        StoredObject(new, len(body), store.host, time.time(), entries), read_from)
    store._unstage(read_from.values())
    crash_point("blobs.rewrite_after_index")  # the old objects: compact's LIST sweep
    store._delete_objects(forgotten)  # not one a checkpoint recorded rows in meanwhile
    return len(body)


def move(store: S3BlobStore, names: list[str]) -> int:
    """Staged objects ``names`` as one object of the bucket: their live entries
    copied as they are (whole entries, nothing to decode: this runs while
    checkpoints do), one PUT, then one transaction points the rows at it and
    forgets the staged rows with their bytes. A kill after the PUT leaves an object
    no row names (compact deletes it) and the staged rows as they were. Returns the
    bytes PUT."""
    with store._rewrite_lock:
        parts: list[bytes] = []
        entries: list[tuple[str, int, int, int, str]] = []
        read_from: dict[str, str] = {}
        off = 0
        for name, (sealed, rows) in store.index.staged_entries(names).items():
            body = store._opened(name, sealed)
            for digest, loc in rows:
                if loc.codec in bucket_packs.CODECS:  # whole: its bytes as they are
                    chunk, codec = body[loc.off:loc.off + loc.len], loc.codec
                else:  # (a staged object holds whole entries; anything else: made so)
                    data = store._decoded(name, body, [(digest, loc)])[digest]
                    chunk, codec = bucket_packs.whole(data, packs.FAST)
                parts.append(chunk)
                entries.append((digest, off, len(chunk), loc.size, codec))
                read_from[digest] = name
                off += len(chunk)
        body = b"".join(parts)
        if entries:
            new = store._pack_name(body)
            store._put_object(new, body)
            crash_point("blobs.flush_after_put")
            store.index.rewrite_blobs(
                StoredObject(new, len(body), store.host, time.time(), entries), read_from)
            with store._lock:
                store._moved.add(new)
        for name in set(names) - set(read_from.values()):  # nothing live left in it
            store.index.remove_blob_object(name)
        store._unstage(names)  # (the gauges too)
        return len(body)
