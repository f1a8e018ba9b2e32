"""The stat cache's file on disk (daemon/capture/statcache.py)."""

from __future__ import annotations

import marshal
import os
import sqlite3
import subprocess
import time

from worldline.daemon.capture.statcache import StatCache

PAGE = 4096


def _entry(i: int) -> tuple:
    return (os.urandom(56), os.urandom(32).hex(), "", "file")


def test_a_compaction_takes_the_pages_it_frees_and_an_idle_one_empties_the_log(tmp_path):
    """A compaction that folds the log into a snapshot writes the snapshot into the
    pages the log and the old snapshot leave, not into new ones at the end of the file
    (until 0.7.21 the file held both, and `make bench`'s storage-100 counted a
    snapshot's worth in the round whose write-ahead log was copied into it). An idle
    compaction gives back the pages it freed and leaves no write-ahead log behind: at
    rest the file is the size of what it holds."""
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


def _rows(path: str) -> tuple[int, int]:
    db = sqlite3.connect(path)
    try:
        return tuple(db.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                     for t in ("snapshot", "log"))
    finally:
        db.close()


def test_a_first_capture_is_written_as_the_snapshot_leaving_an_idle_daemon_nothing_to_fold(
        tmp_path):
    """A change as large as the maps it changes (a workspace's first capture) is
    written as the workspace's snapshot, no log row: the idle compaction that used to
    rewrite it a second later (about 20 ms a Django-sized workspace, eight of them at
    once after eight sessions were made, every call to the cache waiting) has nothing
    to do. A small change after it is logged, and folded when idle."""
    path = str(tmp_path / "index.db")
    cache = StatCache(path)
    files = {f"src/pkg{i // 50}/module{i}.py": _entry(i) for i in range(6000)}
    cache.update("/ws", files, set(), {"src": (os.urandom(56), "d" * 64, 1, "dir", "")})
    assert _rows(path) == (1, 0)
    assert cache.compact() == 0
    cache.update("/ws", {"src/pkg0/module0.py": _entry(0)}, set())
    assert _rows(path) == (1, 0)  # kept in memory until written behind
    assert cache.write_behind() == 1 and _rows(path) == (1, 1)
    assert cache.compact() == 1 and _rows(path) == (1, 0)
    cache.close()
    again = StatCache(path)
    assert again.entries("/ws") == {**files, "src/pkg0/module0.py": again.entries("/ws")[
        "src/pkg0/module0.py"]}
    assert again.folders("/ws").keys() == {"src"}
    again.close()


def test_an_idle_compaction_goes_one_workspace_at_a_time_and_stops_at_a_write(tmp_path):
    """Each workspace is folded under the lock on its own, and the daemon's idleness is
    asked again before each: a write that comes in while one is folded (here: made to
    come then) leaves the others for the next idle moment, so the write waited for one
    workspace's compaction at most, not for all of them."""
    path = str(tmp_path / "index.db")
    cache = StatCache(path)
    for ws in ("/a", "/b", "/c"):
        cache.update(ws, {f"f{i}": _entry(i) for i in range(100)}, set())  # snapshots
        cache.update(ws, {"f0": _entry(0)}, set())  # a log row each
    assert cache.write_behind() == 3
    fold = cache._compact

    def fold_then_a_write(workspace, ws):
        fold(workspace, ws)
        cache._last_write = time.monotonic()  # an update, come in meanwhile
    cache._compact = fold_then_a_write
    cache._last_write = time.monotonic() - 10
    assert cache.compact(idle_seconds=1.0) == 1
    assert _rows(path) == (3, 2)
    cache._compact = fold
    assert cache.compact() == 2 and _rows(path) == (3, 0)
    cache.close()


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


def _damaged_cache(path: str) -> dict:
    """A cache file holding two workspaces, /a's small and /b's spread over overflow
    pages, each of which is then overwritten with 0xff: /b's rows lead SQLite to a
    page number past the file's end (SQLITE_CORRUPT), while the file opens and /a's
    rows read. Returns /a's entries."""
    cache = StatCache(path)
    a = {f"f{i}": _entry(i) for i in range(10)}
    cache.update("/a", a, set())
    cache.update("/b", {"Q" * 200_000: _entry(0)}, set())
    cache.compact()
    cache.close()
    data = bytearray(open(path, "rb").read())
    hit = 0
    for start in range(PAGE, len(data), PAGE):
        if b"Q" * 64 in data[start:start + PAGE]:
            data[start:start + PAGE] = b"\xff" * PAGE
            hit += 1
    assert hit >= 40
    with open(path, "wb") as f:
        f.write(data)
    return a


def test_a_damaged_cache_file_is_set_aside_whatever_finds_it(tmp_path):
    """A cache is never a reason to fail: whether a read (a workspace's first capture)
    or a write (a session's deletion) finds the file damaged, the file is set aside
    beside it, an empty one takes its place, and every workspace's maps are read again
    from it (empty: each next capture reads every file again). Before 0.7.22 the
    call failed, and so did every later one."""
    for finds in ("read", "write"):
        path = str(tmp_path / f"{finds}.db")
        a = _damaged_cache(path)
        cache = StatCache(path)
        assert cache.entries("/a").keys() == a.keys()  # the file opens and /a reads
        if finds == "read":
            assert cache.entries("/b") == {}
        else:
            cache.forget("/b")  # frees /b's pages: walks their chain
        assert os.path.exists(path + ".damaged"), finds
        assert cache.entries("/a") == {}, finds  # read again, from the empty file
        cache.update("/a", a, set())  # and it takes writes
        cache.close()
        again = StatCache(path)
        assert again.entries("/a").keys() == a.keys()
        again.close()


def test_a_row_the_cache_cannot_read_is_forgotten_alone(tmp_path):
    """A snapshot row that is not what the cache writes (marshal cannot read it) is
    dropped with its log, the other workspaces untouched."""
    path = str(tmp_path / "index.db")
    cache = StatCache(path)
    cache.update("/a", {"x": _entry(0)}, set())
    cache.update("/b", {"y": _entry(1)}, set())
    cache.compact()
    cache.close()
    db = sqlite3.connect(path)
    db.execute("UPDATE snapshot SET data = x'00ff00' WHERE workspace = '/b'")
    db.commit()
    db.close()
    cache = StatCache(path)
    assert cache.entries("/b") == {}
    assert cache.entries("/a").keys() == {"x"}
    cache.close()
    db = sqlite3.connect(path)
    assert [w for (w,) in db.execute("SELECT workspace FROM snapshot")] == ["/a"]
    db.close()
    assert not os.path.exists(path + ".damaged")


def test_logged_changes_are_written_behind_in_one_transaction_and_at_close(tmp_path):
    """A small change is applied at once and logged later (the daemon's housekeeping
    calls write_behind every second): the checkpoint that made it does not wait for
    the insert. A compaction or a forget drops the changes it holds or forgets; a
    close writes what is left; a cache dropped without a close (a killed daemon)
    loses only what was not written, whose files are read again."""
    path = str(tmp_path / "index.db")
    cache = StatCache(path)
    for ws in ("/a", "/b", "/c"):
        cache.update(ws, {f"f{i}": _entry(i) for i in range(50)}, set())  # snapshots
    for i in range(5):
        cache.update("/a", {"f0": _entry(i)}, set())
        cache.update("/b", {f"new{i}": _entry(i)}, {"f1"})
    cache.update("/c", {"f0": _entry(9)}, set())
    assert _rows(path) == (3, 0)
    want = {ws: dict(cache.entries(ws)) for ws in ("/a", "/b", "/c")}
    cache.forget("/c")
    assert cache.write_behind() == 10 and _rows(path) == (2, 10)
    assert cache.write_behind() == 0
    last = _entry(2)
    cache.update("/a", {"f2": last}, set())
    cache.close()  # writes the last one
    again = StatCache(path)
    assert again.entries("/a") == {**want["/a"], "f2": last}
    assert again.entries("/b") == want["/b"] and again.entries("/c") == {}
    again.update("/b", {"f3": _entry(3)}, set())
    assert again.compact() == 2 and _rows(path) == (2, 0)  # folded, nothing left behind
    again.update("/a", {"new": _entry(4)}, set())  # never written: "killed"
    killed = again
    third = StatCache(path)
    assert "new" in killed.entries("/a") and "new" not in third.entries("/a")
    assert third.entries("/a") == {**want["/a"], "f2": last}
    third.close()
    killed._db.close()
