"""The BlobStore contract: immutable bytes named by the SHA-256 of their content.

Terms
- A *blob* is a byte string; its *digest* is the lowercase hex SHA-256 of those bytes
  (``digest_of``), and the blob's only name. A string that is not 64 lowercase hex
  digits is no digest (``check_digest``: InvalidArgument).
- Keys: a store given a data key (crypto.DataKey: ``--encryption-key``) names blobs by
  their *keyed* address (HMAC-SHA256 under the key's address subkey) instead of the
  SHA-256, and keeps every byte it writes sealed (AES-256-GCM): ``address(data)`` and
  ``hasher()`` are how every caller computes a name, never a hash of its own
  (``digest_of`` is the unkeyed address, for stores without a key).

Lifecycle
- ``put_*`` makes a blob readable under its digest; it stays readable, unchanged,
  until ``delete`` (only garbage collection calls it, with a grace period:
  ``older_than``, so a blob a checkpoint under way just reused is never lost). Putting
  bytes that are already stored is cheap and returns the same digest.
- A checkpoint puts all its blobs, calls ``sync()`` once (or ``committing()``, which
  also names the bucket objects its transaction must index), then commits the
  metadata that references them (Store.append_checkpoint). A blob put but not yet
  synced is readable by this process; after a crash it is simply absent, and no
  record names it.
- A store is shared by every session and thread of one daemon, and closed by it at
  its stop (``close``, where an implementation holds files or connections; not part
  of the Protocol).

Guarantees
- Atomicity: a blob is visible under its digest only once all its bytes are there;
  a crash mid-put leaves at most an unnamed temporary, never a short blob.
- Durability: once ``sync()`` returns, every blob put before it survives a crash.
- Integrity: reads verify the digest; bytes that no longer match raise ``DataLoss``.
- Threads: every method may be called from any thread at once (each implementation
  holds its own locks).

Errors
- ``NotFound`` for a digest that is not stored; ``InvalidArgument`` for a string that
  is not a digest; ``ResourceExhausted`` when the disk is full (``Overread``: a file
  that grew past the limit it was read under; ``DestinationFull``: no space in the
  caller's file, not in the store); ``DataLoss`` for bytes that no longer match;
  ``Unavailable`` for a bucket that cannot be reached.

Implementations: ``LocalBlobStore`` (a pack and files under the data root) in
blobs.py, ``MemoryBlobStore`` (the reference) in memory_blobs.py, ``S3BlobStore`` (a
fleet's bucket, with a local store as its cache) in s3_blobs.py; tests/test_blob_contract.py holds
every one to this contract.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Protocol

from worldline.wire.errors import InvalidArgument, ResourceExhausted

if TYPE_CHECKING:
    from .blob_index import StoredObject

_DIGEST_RE = re.compile(r"^[0-9a-f]{64}$")


def digest_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def check_digest(digest: str) -> str:
    if not _DIGEST_RE.match(digest):
        raise InvalidArgument(f"{digest!r} is not a blob digest")
    return digest


def store_address(store, data: bytes) -> str:
    """``address`` of a store holding its data key (or None) as ``key``: the keyed
    address with a key, else the SHA-256. Implementations take it as their method."""
    return store.key.address(data) if store.key is not None else digest_of(data)


def store_hasher(store):
    """``hasher`` of a store holding its data key (or None) as ``key``."""
    return store.key.hasher() if store.key is not None else hashlib.sha256()


class BlobStore(Protocol):
    """Immutable bytes by their SHA-256; the module's docstring is the contract."""

    # True when ``committing`` writes only this host's disk; False for a bucket (it
    # uploads, and waits on the network).
    local: bool

    def address(self, data: bytes) -> str:
        """The digest ``data`` is stored under (a keyed store's: its keyed address)."""

    def hasher(self):
        """An incremental hasher (``update``, ``hexdigest``) whose digest is ``address``'s."""

    def has(self, digest: str) -> bool: ...

    def put_bytes(self, data: bytes, base: str | None = None) -> str:
        """Store ``data``; return its digest. ``base``, when given, is a stored blob
        likely to resemble ``data`` (its previous version): a store may keep ``data`` as
        a difference from it. It is only a hint: the blob reads back the same."""

    def put_many(self, blobs: list[bytes]) -> list[str]:
        """``put_bytes`` of each, in one go (a full scan's thousands of trees, mostly
        stored already): their digests, in order."""

    def put_fd(self, fd: int, limit: int | None = None) -> tuple[str, int]:
        """Store the file open at ``fd``, read from its start; return (digest, size).
        With ``limit``, a file found to hold more bytes than that (one that grows while
        it is read) raises Overread, having read at most one byte more and stored
        nothing."""

    def read_bytes(self, digest: str) -> bytes:
        """The blob's bytes, verified."""

    def copy_to_fd(self, digest: str, fd: int) -> int:
        """Write the blob's bytes, verified, to ``fd``; return the size."""

    def verify(self, digest: str) -> None:
        """Raise NotFound or DataLoss unless the blob is stored whole."""

    def size(self, digest: str) -> int: ...

    def stored_at(self, digest: str) -> float:
        """When the blob was stored (seconds since the epoch): gc's grace period."""

    def delete(self, digest: str, older_than: float | None = None) -> int:
        """Remove the blob; return the bytes freed (0 if it was absent). With
        ``older_than`` (seconds since the epoch), only if it was stored, or last
        reused by a put, before then: checked and removed atomically with respect to
        puts, so a checkpoint reusing the blob at that moment never loses it."""

    def freeable(self, digest: str, older_than: float | None, gone: set[str]) -> int:
        """The bytes ``delete(digest, older_than)`` would free now, removing nothing,
        were the blobs in ``gone`` deleted already (0: it would keep the blob). A dry
        run's sweep, asked in ``digests()`` order, so its figures are the real one's."""

    def digests(self) -> Iterator[str]: ...

    def sync(self) -> None:
        """Make every blob put so far durable."""

    def committing(self) -> AbstractContextManager[list[StoredObject]]:
        """``sync()`` for a checkpoint: yields the bucket objects whose index rows the
        checkpoint's transaction must write (``Store.append_checkpoint(objects=)``),
        none for a store with no bucket. Should the block raise, the store records them
        itself, so nothing it uploaded stays unfindable."""


class Overread(ResourceExhausted):
    """A file held more than the bytes it was allowed when read (``put_fd``'s
    ``limit``): it grew while it was read. The caller names the file and the limit."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"more than {limit} bytes to read")
        self.limit = limit


class DestinationFull(ResourceExhausted):
    """``copy_to_fd`` found no space left in the caller's file, not in the store."""
