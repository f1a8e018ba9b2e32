"""fsck of the fleet's blob store (s3_blobs.py): the durable copy read, and mended.

``check_objects`` reads every object the index names from where it is durable, the
bucket (a staged one from its row), each blob verified in memory, nothing written to
the cache: a host whose cache holds every blob still sees what the bucket lost, and a
full disk does not stop it. ``read_uncached`` is fsck's read of one blob, with nothing
written to the cache either. ``mend`` puts good copies the host holds back under new
write-once names, and points the rows at them as a rewrite does (only rows that still
name the broken object).

These are sections of ``S3BlobStore``, which calls them with itself: they use its
bucket client, index, cache and locks.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from worldline.wire.errors import DataLoss, NotFound, Unavailable

from .. import progress
from . import bucket_packs
from .blob_index import Location, StoredObject
from .crypto import STREAM_CONTEXT
from .s3_bucket import ALONE, PACK_LIMIT, BaseError, Vanished, answer_error

if TYPE_CHECKING:
    from .blobs import LocalBlobStore
    from .s3_blobs import S3BlobStore


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


def check_objects(store: S3BlobStore, takes: Callable[[str], bool] = lambda name: True
                  ) -> BucketCheck:
    """Read every object the index names (those ``takes(name)`` chooses: a sampled
    pass) from where it is durable, the bucket (a staged object: its row), and
    verify each blob the index places in it against its digest: in memory, nothing
    written to the cache or the disk (a large blob streamed and hashed on the way).
    The cache is not asked: a host whose cache holds every blob still finds an
    object the bucket lost. An object that cannot be read (the bucket does not
    answer) is reported unchecked, and so is every one after it."""
    check = BucketCheck()
    objects = store.index.blob_objects()
    check.objects_total = len(objects)
    chosen = [name for name, _bytes, _at, _live, _host in objects if takes(name)]
    progress.begin("reading the bucket's objects", len(chosen), "objects")
    for n, name in enumerate(chosen):
        progress.advance()
        try:
            _check_object(store, name, check)
        except Unavailable as exc:
            check.unchecked.append(f"object {name}: not read: {exc.message}")
            check.unchecked.extend(f"object {later}: not read: the bucket did not answer"
                                   " before it" for later in chosen[n + 1:])
            break
        check.objects_checked += 1
    return check


def _check_object(store: S3BlobStore, name: str, check: BucketCheck) -> None:
    alone = name.startswith("blobs/")
    try:
        if alone:
            body, got = None, _stream_digest(store, name, check)
        else:
            body = store._get_object(name, opened=False)
            check.bytes_read += len(body)
    except (Vanished, DataLoss):  # a rewrite deleted it after the listing, or lost
        body = got = None
        entries = store.index.object_entries(name)
        if entries:
            check.blobs_checked += len(entries)
            check.broken.extend(Broken(d, name, "missing", f"object {name} is not in"
                                       f" {store.url}") for d, _ in entries)
        return
    entries = store.index.object_entries(name)  # after the read: what is still in it
    check.blobs_checked += len(entries)
    if alone:
        for digest, loc in entries:
            if got != (digest, loc.size):
                check.broken.append(Broken(digest, name, "damaged", f"object {name}"
                                           " does not match its digest"))
        return
    try:
        body = store._opened(name, body)
    except DataLoss as exc:  # every entry is in the sealed whole: each is damaged
        check.broken.extend(Broken(d, name, "damaged", exc.message) for d, _ in entries)
        return
    for digest, found in decode_each(store, name, body, entries).items():
        if isinstance(found, DataLoss):
            check.broken.append(Broken(digest, name, "damaged", found.message))


def _stream_digest(store: S3BlobStore, name: str, check: BucketCheck) -> tuple[str, int]:
    """(SHA-256, size) of a large blob's object, read in chunks (FileNotFoundError:
    ``Vanished`` or ``DataLoss``, as ``_get_object``)."""
    try:
        result = store.client.get(name)
    except FileNotFoundError:
        raise Vanished(name) from None
    hasher, size, read = store.cache.hasher(), 0, 0

    def counted():
        nonlocal read
        for chunk in result.stream(min_chunk_size=1 << 20):
            read += len(chunk)
            yield chunk

    try:
        for chunk in store.cache.opening(counted()):
            hasher.update(chunk)
            size += len(chunk)
    except (BaseError, OSError) as exc:
        raise answer_error(store.url, f"GET {name}", exc) from None
    except DataLoss:  # its tag: no digest of it matches
        check.bytes_read += read
        return "", size
    check.bytes_read += read
    return hasher.hexdigest(), size


def decode_each(store: S3BlobStore, name: str, body: bytes,
                entries: list[tuple[str, Location]]) -> dict[str, bytes | DataLoss]:
    """digest -> bytes of each of ``entries`` of object ``name``, verified, or the
    DataLoss that entry alone raised (one damaged entry spoils only itself and the
    entries built on it)."""
    out: dict[str, bytes | DataLoss] = {}
    reader = bucket_packs.ObjectReader(body, f"{name} of {store.url}", store.cache.address)
    for digest, loc in entries:
        try:
            out[digest] = bucket_packs.decode_all(
                reader, [(digest, loc.off, loc.len, loc.codec, loc.size)])[digest]
        except DataLoss as exc:
            out[digest] = exc
    return out


def read_uncached(store: S3BlobStore, digest: str) -> bytes:
    """The blob's bytes, verified, with nothing written to the cache: from the cache
    when it holds it whole, else from its object, whose other entries are kept in
    memory a while (``_keep_recent``) for the reads that follow. fsck's walk of the
    trees reads so: it needs no space on a full disk."""
    data = store._recently_fetched(digest)
    if data is not None:
        return data
    try:
        return store.cache.read_bytes(digest)
    except (NotFound, DataLoss):  # not cached, or its copy there is damaged
        pass
    for _ in range(2):  # once more if a rewrite moved it meanwhile
        loc = store._locate(digest)
        if loc.object.startswith("blobs/"):
            try:
                body = bytes(store.client.get(loc.object, counted=False).bytes())
            except FileNotFoundError:
                raise DataLoss(f"object {loc.object} of {store.url} is indexed but"
                               " missing") from None
            if store.key is not None:
                try:
                    body = store.key.open_blob(body, STREAM_CONTEXT)
                except DataLoss:
                    raise DataLoss(f"object {loc.object} of {store.url} fails its"
                                   " authentication tag") from None
            if store.cache.address(body) != digest:
                raise DataLoss(f"object {loc.object} of {store.url} does not match its"
                               " digest")
            return body
        try:
            body = store._get_object(loc.object)
        except Vanished:
            continue
        entries = store.index.object_entries(loc.object)
        if digest not in {d for d, _ in entries}:
            continue
        found = decode_each(store, loc.object, body, entries)
        with store._lock:
            for d, data in found.items():
                if not isinstance(data, DataLoss):
                    store._keep_recent(d, data)
        data = found[digest]
        if isinstance(data, DataLoss):
            raise data
        return data
    raise NotFound(f"blob {digest} moved twice while it was read")


def mend(store: S3BlobStore, broken: dict[str, str], sources: list[LocalBlobStore]
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
    roots = ", ".join(s.root for s in [store.cache, *sources])
    for digest in sorted(broken):
        reasons = []
        for source in [store.cache, *sources]:
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
            _mended(store, store._pack_name(body), body, entries, broken, done, parts=False)
        for digest, source in large.items():
            fd = source.open_blob(digest)  # (with a key: sealed, as the bucket's)
            try:
                with os.fdopen(fd, "rb", closefd=False) as f:
                    size = os.fstat(fd).st_size
                    _mended(store, f"blobs/{digest[:2]}/{digest}-{os.urandom(8).hex()}",
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


def _mended(store: S3BlobStore, name: str, body, entries, broken: dict[str, str],
            done: dict[str, str], parts: bool) -> None:
    """One mending object: uploaded, its rows pointed at it, the objects it replaces
    forgotten and deleted; ``done`` gains the digests whose rows now name it."""
    nbytes = entries[0][2] if parts else len(body)
    if parts:
        store.client.put_parts(name, body)
    else:
        store._put_object(name, body)
    read_from = {d: broken[d] for d, *_ in entries}
    forgotten = store.index.rewrite_blobs(
        StoredObject(name, nbytes, store.host, time.time(), entries), read_from)
    store._unstage(read_from.values())
    store._delete_objects(forgotten)
    located = store.index.locate_blobs(list(read_from))
    done.update((d, name) for d in read_from if d in located and located[d].object == name)
