"""The storage backends: where records and bytes live.

- ``store``: the ``Store`` Protocol (sessions, checkpoints, conversation, tool calls,
  tasks, approvals, audit) and ``MemoryStore``, its reference; ``sqlite_store`` and
  ``postgres_store`` implement it over SQL (``sql``: the shared statements,
  ``migrations``: versioned schemas applied once at start).
- ``graph_store``: LangGraph's graph checkpoints (memory and SQLite).
- ``blobs``: the ``BlobStore`` Protocol, ``LocalBlobStore`` (the pack, ``packs``, plus
  files) and ``MemoryBlobStore``; ``s3_blobs``: a bucket shared by a fleet, with the
  local store as its cache.
- ``statcache``: what a capture knows of each file (signatures), per workspace.
- ``config``: turning ``--store`` / ``--blobs`` into the backends above.
"""
