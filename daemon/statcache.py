"""The stat cache: what each workspace file looked like when it was last hashed.

Host-local, like git's index: it maps a workspace-relative path to the
(size, mtime_ns, ctime_ns, inode, mode) it had when its content digest was taken,
so an unchanged file is never read again. It is a cache, never history: losing it
costs one rehash. An entry is only written once its blob is durable, and only when
the file was not modified within ``RACY_NS`` of being hashed (git's racy-clean
rule: a write in the same timestamp tick would leave the stat unchanged).
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time

RACY_NS = 100_000_000

Signature = tuple[int, int, int, int, int]  # size, mtime_ns, ctime_ns, inode, mode


def signature(st: os.stat_result) -> Signature:
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_mode)


def is_racy(st: os.stat_result, now_ns: int | None = None) -> bool:
    now_ns = time.time_ns() if now_ns is None else now_ns
    return now_ns - max(st.st_mtime_ns, st.st_ctime_ns) < RACY_NS


class StatCache:
    """Per-workspace path → (signature, digest), kept in memory, persisted in SQLite."""

    def __init__(self, db_path: str | None) -> None:
        self._db = sqlite3.connect(db_path or ":memory:", check_same_thread=False,
                                   isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS stat (workspace TEXT NOT NULL, path BLOB NOT NULL,"
            " size INTEGER, mtime_ns INTEGER, ctime_ns INTEGER, ino INTEGER, mode INTEGER,"
            " digest TEXT, PRIMARY KEY (workspace, path)) WITHOUT ROWID")
        self._loaded: dict[str, dict[str, tuple[Signature, str]]] = {}
        self._lock = threading.Lock()

    def entries(self, workspace: str) -> dict[str, tuple[Signature, str]]:
        """The live mapping for one workspace (callers hold the session's lock)."""
        with self._lock:
            cached = self._loaded.get(workspace)
            if cached is None:
                rows = self._db.execute(
                    "SELECT path, size, mtime_ns, ctime_ns, ino, mode, digest FROM stat"
                    " WHERE workspace = ?", (workspace,))
                cached = {os.fsdecode(p): ((s, m, c, i, md), d) for p, s, m, c, i, md, d in rows}
                self._loaded[workspace] = cached
            return cached

    def update(self, workspace: str, changed: dict[str, tuple[Signature, str]],
               removed: set[str]) -> None:
        if not changed and not removed:
            return
        entries = self.entries(workspace)
        with self._lock:
            self._db.execute("BEGIN")
            try:
                self._db.executemany(
                    "DELETE FROM stat WHERE workspace = ? AND path = ?",
                    [(workspace, os.fsencode(p)) for p in removed])
                self._db.executemany(
                    "INSERT OR REPLACE INTO stat VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    [(workspace, os.fsencode(p), *sig, d) for p, (sig, d) in changed.items()])
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            for p in removed:
                entries.pop(p, None)
            entries.update(changed)

    def forget(self, workspace: str) -> None:
        with self._lock:
            self._loaded.pop(workspace, None)
            self._db.execute("DELETE FROM stat WHERE workspace = ?", (workspace,))

    def digests(self) -> set[str]:
        """Every digest the cache names: garbage collection keeps these blobs."""
        with self._lock:
            return {d for (d,) in self._db.execute("SELECT DISTINCT digest FROM stat")}

    def close(self) -> None:
        self._db.close()
