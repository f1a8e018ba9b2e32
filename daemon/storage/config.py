"""Which backends a daemon runs on: ``--store`` and ``--blobs`` (or
``$WORLDLINE_STORE``, ``$WORLDLINE_BLOBS``), and the host id that names it in a fleet.

- store ``sqlite`` (the default): ``<root>/meta.db``; ``postgresql://...``: a
  PostgreSQL database shared by a fleet.
- blobs ``local`` (the default): ``<root>/blobs``; ``s3://bucket/prefix``: a bucket
  shared by a fleet, with ``<root>/blobs`` as this host's cache (at most
  ``cache_bytes``). Its endpoint, region and credentials come the SDK's usual way
  (``AWS_ENDPOINT_URL``, ``AWS_REGION``, ``AWS_ACCESS_KEY_ID``, ...).
- host id: ``--host-id`` or ``$WORLDLINE_HOST_ID``; on PostgreSQL, the hostname when
  not given. The embedded default has none: one data root is one host.
- encryption key: ``--encryption-key FILE``, or systemd's credential
  ``$CREDENTIALS_DIRECTORY/worldline-key``; "" keeps the data in the clear
  (keyring.py says where the data key is kept).
"""

from __future__ import annotations

import os
import socket
import sqlite3
from dataclasses import dataclass

from worldline.wire.errors import InvalidArgument

from .blobs import LocalBlobStore
from .crypto import DataKey
from .keyring import key_file, open_data_key
from .urls import redact

DEFAULT_CACHE_BYTES = 16 << 30


@dataclass(frozen=True)
class StorageConfig:
    store: str = "sqlite"
    blobs: str = "local"
    host_id: str = ""
    cache_bytes: int = DEFAULT_CACHE_BYTES
    lease_seconds: float = 30.0
    advertise: str = ""  # the address other hosts' users reach this daemon at
    encryption_key: str = ""  # the file of the key-encryption key (keyring.py), or none

    @classmethod
    def resolve(cls, store: str | None = None, blobs: str | None = None,
                host_id: str | None = None, cache_bytes: int | None = None,
                lease_seconds: float = 30.0, advertise: str | None = None,
                encryption_key: str | None = None) -> StorageConfig:
        """Flags first, then the environment, then the defaults; checked."""
        env = os.environ
        store = store or env.get("WORLDLINE_STORE") or "sqlite"
        blobs = blobs or env.get("WORLDLINE_BLOBS") or "local"
        if store != "sqlite" and not store.startswith(("postgresql://", "postgres://")):
            raise InvalidArgument(f"store {redact(store)!r} is not sqlite or postgresql://...")
        if blobs != "local" and not blobs.startswith("s3://"):
            raise InvalidArgument(f"blobs {blobs!r} is not local or s3://bucket/prefix")
        host_id = host_id or env.get("WORLDLINE_HOST_ID") or ""
        if not host_id and store != "sqlite":
            host_id = socket.gethostname()
        if host_id and not all(c.isalnum() or c in "-_.:" for c in host_id):
            raise InvalidArgument(f"host id {host_id!r}: letters, digits and -_.: only")
        if not 1.0 <= lease_seconds <= 3600.0:
            raise InvalidArgument(f"lease of {lease_seconds} s: from 1 to 3600 seconds")
        advertise = advertise or env.get("WORLDLINE_ADVERTISE") or ""
        return cls(store, blobs, host_id, cache_bytes or DEFAULT_CACHE_BYTES, lease_seconds,
                   advertise, key_file(encryption_key))

    @property
    def shown_store(self) -> str:
        return redact(self.store)

    def open_store(self, root: str, key=None):
        """``key``: the ``crypto.DataKey`` sealing the agent's content, or None."""
        if self.store == "sqlite":
            from .sqlite_store import SqliteStore
            return SqliteStore(os.path.join(root, "meta.db"), key=key)
        from .postgres_store import PostgresStore
        return PostgresStore(self.store, key=key)

    def open_graph_store(self, root: str, key=None):
        if self.store == "sqlite":
            from .graph_store import SqliteGraphStore
            return SqliteGraphStore(os.path.join(root, "graphs.db"), key=key)
        from .graph_store import PostgresGraphStore
        return PostgresGraphStore(self.store, key=key)

    def open_data_key(self, root: str) -> DataKey | None:
        """The data key (keyring.py), before anything else of the data root is opened:
        InvalidArgument for a missing or wrong key; None for data kept in the clear."""
        return open_data_key(root, self.store, self.blobs, self.encryption_key)

    def open_blobs(self, root: str, store, key: DataKey | None = None):
        if self.blobs == "local":
            found = pack_file(root) if self.store == "sqlite" else ""
            if found == store.path:
                return LocalBlobStore(os.path.join(root, "blobs"), pack_file=found,
                                      store_lock=store.write_lock, key=key)
            return LocalBlobStore(os.path.join(root, "blobs"), key=key)
        from .s3_blobs import S3BlobStore
        # A cache: the bucket holds what is durable, so its pack skips the fsync.
        local = LocalBlobStore(os.path.join(root, "blobs"), durable=False, key=key)
        return S3BlobStore(self.blobs, local, store, self.host_id or socket.gethostname(),
                           self.cache_bytes)


def pack_file(root: str) -> str:
    """The SQLite file that holds the pack of the embedded data root ``root``: its
    ``meta.db`` (a checkpoint's blobs and its record are made durable by one fsync), or
    ``blobs/pack.db`` in a data root an older version made, which keeps it there."""
    meta = os.path.join(root, "meta.db")
    legacy = os.path.join(root, "blobs", "pack.db")
    if not os.path.exists(legacy) or _has_pack(meta):
        return meta
    return legacy


def _has_pack(path: str) -> bool:
    if not os.path.exists(path):
        return False
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table'"
                          " AND name = 'objects'").fetchone() is not None
    finally:
        db.close()

