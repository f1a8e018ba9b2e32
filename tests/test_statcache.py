"""The stat cache's file on disk (daemon/storage/statcache.py)."""

from __future__ import annotations

import marshal
import os
import sqlite3
import subprocess

from worldline.daemon.storage.statcache import StatCache

PAGE = 4096


def _entry(i: int) -> tuple:
    return (os.urandom(56), os.urandom(32).hex(), "", "file")


def test_a_compaction_takes_the_pages_it_frees_and_an_idle_one_empties_the_log(tmp_path):
    """The first capture of a workspace logs every file; the compaction that folds the
    log into a snapshot writes the snapshot into the pages the log leaves, not into
    new ones at the end of the file (until 0.7.21 the file held both, and `make
    bench`'s storage-100 counted a snapshot's worth in the round whose write-ahead
    log was copied into it). An idle compaction gives back the pages it freed and
    leaves no write-ahead log behind: at rest the file is the size of what it holds."""
    path = str(tmp_path / "index.db")
    cache = StatCache(path)
    files = {f"src/pkg{i // 50}/module{i}.py": _entry(i) for i in range(6000)}
    cache.update("/ws", files, set())
    snapshot = len(marshal.dumps((files, {})))
    cache.compact()
    assert os.path.getsize(path + "-wal") == 0
    assert os.path.getsize(path) <= snapshot * 1.2 + 8 * PAGE
    at_rest = os.path.getsize(path)
    for _ in range(3):  # rounds of small changes, each folded in
        for i in range(100):
            cache.update("/ws", {f"src/pkg0/module{i % 7}.py": _entry(i)}, set())
        cache.compact()
        assert os.path.getsize(path + "-wal") == 0
        # the pages the round's log took are given back
        assert abs(os.path.getsize(path) - at_rest) <= 2 * PAGE
    cache.close()
    again = StatCache(path)
    assert again.entries("/ws").keys() == files.keys()
    again.close()


def _made_before_0721(path: str, count: int) -> dict:
    """A stat cache file as 0.7.20 made it (no incremental vacuum), its log holding a
    first capture of ``count`` files; those files."""
    old = sqlite3.connect(path)
    old.execute("CREATE TABLE snapshot (workspace TEXT PRIMARY KEY, data BLOB NOT NULL)")
    old.execute("CREATE TABLE log (seq INTEGER PRIMARY KEY, workspace TEXT NOT NULL,"
                " data BLOB NOT NULL)")
    files = {f"f{i}": _entry(i) for i in range(count)}
    old.execute("INSERT INTO log (workspace, data) VALUES (?, ?)",
                ("/ws", marshal.dumps((files, [], {}))))
    old.commit()
    assert old.execute("PRAGMA auto_vacuum").fetchone()[0] == 0
    old.close()
    return files


def test_a_file_made_before_0721_gives_space_back_once_opened(tmp_path):
    """A stat cache file made without incremental vacuum is converted when opened."""
    path = str(tmp_path / "index.db")
    files = _made_before_0721(path, 3000)
    cache = StatCache(path)
    assert cache._db.execute("PRAGMA auto_vacuum").fetchone()[0] == 2
    assert cache.entries("/ws").keys() == files.keys()
    cache.compact()
    assert os.path.getsize(path) <= len(marshal.dumps((files, {}))) * 1.2 + 8 * PAGE
    cache.close()


def test_a_conversion_the_disk_has_no_room_for_never_stops_a_start(tmp_path):
    """Converting a file made before 0.7.21 rewrites it (VACUUM). On a disk with no room
    for that, the cache opens as it is, every entry kept: a daemon always starts."""
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(small)], check=True)
    try:
        path = str(small / "index.db")
        files = _made_before_0721(path, 12000)
        assert os.path.getsize(path) > 1.5 * 2**20  # no room to write it again
        cache = StatCache(path)
        assert cache.entries("/ws").keys() == files.keys()
        assert cache._db.execute("PRAGMA auto_vacuum").fetchone()[0] != 2
        cache.close()
    finally:
        subprocess.run(["umount", "-l", str(small)], check=True)
