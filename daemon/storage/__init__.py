"""The storage backends: where records and bytes live.

Contracts, each in a file of its own with its terms, guarantees and lifecycle:
- ``blob_store``: ``BlobStore``, immutable bytes by their SHA-256.
- ``metadata_store``: ``Store``, the world's records and the head's compare-and-set;
  ``leases``: ``LeaseStore``, its part for a fleet (which host holds each session).
- ``graph_checkpoints``: ``GraphStore``, LangGraph's graph checkpoints, and their records.

Implementations:
- ``store``: ``MemoryStore``, the reference; ``sqlite_store`` and ``postgres_store``
  implement it over SQL (``sql_store``: the shared statements, ``schema``: the one
  schema text both fill in, ``migrations``: versioned schemas applied once at start).
- ``graph_store``: graph stores (memory, SQLite, PostgreSQL).
- ``blobs``: ``LocalBlobStore`` (the pack, ``packs``, plus files) and
  ``MemoryBlobStore``; ``s3_blobs``: a bucket shared by a fleet, with the local store
  as its cache.
- ``config``: turning ``--store`` / ``--blobs`` into the backends above (``urls``: a
  store's URL without its password, for messages and logs).

Storage imports nothing of capture (tests/test_layers.py).
"""
