"""The stat cache's file on disk (daemon/storage/statcache.py)."""

from __future__ import annotations

import marshal
import os

from worldline.daemon.storage.statcache import StatCache

PAGE = 4096


def _entry(i: int) -> tuple:
    return (os.urandom(56), os.urandom(32).hex(), "", "file")


def test_a_compaction_takes_the_pages_it_frees_and_an_idle_one_empties_the_log(tmp_path):
    """The first capture of a workspace logs every file; the compaction that folds the
    log into a snapshot writes the snapshot into the pages the log leaves, not into
    new ones at the end of the file (until 0.7.21 the file held both, and `make
    bench`'s storage-100 counted a snapshot's worth in the round whose write-ahead
    log was copied into it). An idle compaction leaves no write-ahead log behind."""
    path = str(tmp_path / "index.db")
    cache = StatCache(path)
    files = {f"src/pkg{i // 50}/module{i}.py": _entry(i) for i in range(6000)}
    cache.update("/ws", files, set())
    snapshot = len(marshal.dumps((files, {})))
    cache.compact()
    assert os.path.getsize(path + "-wal") == 0
    assert os.path.getsize(path) <= snapshot * 1.2 + 8 * PAGE
    for _ in range(3):  # rounds of small changes, each folded in
        for i in range(100):
            cache.update("/ws", {f"src/pkg0/module{i % 7}.py": _entry(i)}, set())
        cache.compact()
        assert os.path.getsize(path + "-wal") == 0
        assert os.path.getsize(path) <= snapshot * 1.2 + 8 * PAGE
    cache.close()
    again = StatCache(path)
    assert again.entries("/ws").keys() == files.keys()
    again.close()
