"""``MemoryBlobStore``: the reference implementation of the BlobStore contract
(blob_store.py), a dict, and the store of tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from worldline.wire.errors import DataLoss, NotFound

from .blob_store import check_digest, store_address, store_hasher
from .crypto import DataKey
from .streams import file_chunks, write_all


class MemoryBlobStore:
    """The reference blob store: a dict. Durable for as long as the process lives."""

    local = True

    address = store_address
    hasher = store_hasher

    def __init__(self, key: DataKey | None = None) -> None:
        self._blobs: dict[str, bytes] = {}  # with a key: sealed, the digest bound to it
        self._stored_at: dict[str, float] = {}
        self._lock = threading.Lock()
        self.key = key

    def has(self, digest: str) -> bool:
        return check_digest(digest) in self._blobs

    def put_bytes(self, data: bytes, base: str | None = None) -> str:
        digest = self.address(data)  # the reference store keeps every blob whole
        with self._lock:
            if digest not in self._blobs:
                self._blobs[digest] = (bytes(data) if self.key is None else
                                       self.key.seal_blob(data, bytes.fromhex(digest)))
            self._stored_at[digest] = time.time()  # stored or reused: gc's clock
        return digest

    def put_many(self, blobs: list[bytes]) -> list[str]:
        return [self.put_bytes(data) for data in blobs]

    def put_fd(self, fd: int, limit: int | None = None) -> tuple[str, int]:
        data = b"".join(file_chunks(fd, limit))
        return self.put_bytes(data), len(data)

    def read_bytes(self, digest: str) -> bytes:
        try:
            data = self._blobs[check_digest(digest)]
        except KeyError:
            raise NotFound(f"blob {digest} does not exist") from None
        if self.key is not None:
            data = self.key.open_blob(data, bytes.fromhex(digest))
        if self.address(data) != digest:
            raise DataLoss(f"blob {digest} is corrupt: its bytes no longer match its digest")
        return data

    def verify(self, digest: str) -> None:
        self.read_bytes(digest)

    def copy_to_fd(self, digest: str, fd: int) -> int:
        data = self.read_bytes(digest)
        write_all(fd, data)
        return len(data)

    def size(self, digest: str) -> int:
        return len(self.read_bytes(digest))

    def stored_at(self, digest: str) -> float:
        self.read_bytes(digest)
        return self._stored_at[digest]

    def freeable(self, digest: str, older_than: float | None, gone: set[str]) -> int:
        with self._lock:
            if older_than is not None and self._stored_at.get(digest, 0.0) >= older_than:
                return 0
            data = self._blobs.get(digest)
        return len(data) if data is not None else 0

    def delete(self, digest: str, older_than: float | None = None) -> int:
        with self._lock:
            if older_than is not None and self._stored_at.get(digest, 0.0) >= older_than:
                return 0
            data = self._blobs.pop(check_digest(digest), None)
        return len(data) if data is not None else 0

    def digests(self) -> Iterator[str]:
        return iter(sorted(self._blobs))

    def sync(self) -> None:
        return None

    @contextmanager
    def committing(self):
        yield []

    def corrupt(self, digest: str, data: bytes) -> None:
        """Replace a blob's bytes behind its digest: for fault-injection tests only."""
        self._blobs[digest] = data
