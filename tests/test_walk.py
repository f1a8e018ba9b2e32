"""The full-scan walker: the C walk and its Python twin keep one contract (walk.py)."""

from __future__ import annotations

import ctypes
import os
import struct

import pytest
from worldline.daemon.capture import walk as walk_mod
from worldline.daemon.capture.walk import SIG, signature, walk_python

IMPLEMENTATIONS = [pytest.param(walk_python, id="python")]
if walk_mod.walk_native is not None:
    IMPLEMENTATIONS.append(pytest.param(walk_mod.walk_native, id="native"))

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def test_the_native_walker_is_built():
    """`make install` compiles daemon/capture/_walk.c; a missing compiler must not pass silently."""
    assert walk_mod.walk_native is not None, (
        "worldline.daemon.capture._walk was not built: install gcc and the Python headers, then"
        " `make install` (the daemon falls back to the slower Python walk)")


def _tree(root) -> None:
    (root / "a" / "b" / "c").mkdir(parents=True)
    (root / "empty").mkdir()
    (root / "top.txt").write_text("top")
    (root / "a" / "one.py").write_text("1")
    (root / "a" / "b" / "two.py").write_text("22")
    (root / "a" / "b" / "c" / "three").write_bytes(b"\0\1\2")
    os.symlink("../top.txt", root / "a" / "link")
    os.symlink("/nowhere/at/all", root / "dangling")
    os.mkfifo(root / "a" / "fifo")
    (root / "caf\u00e9").write_text("accent")
    (root / os.fsdecode(b"bad\xffname")).write_text("not utf-8")
    (root / "locked").mkdir(mode=0o500)


def _walk(impl, root, files=None, folders=None, inotify_fd=-1, max_depth=400, prefix="",
          max_entries=None):
    fd = os.open(root, _DIR)
    more = () if max_entries is None else (max_entries,)
    try:
        return impl(fd, inotify_fd, 0x2, max_depth, False, lambda: (files or {}, folders or {}),
                    signature(os.fstat(fd)), prefix, *more)
    finally:
        os.close(fd)


def _normal(result):
    """Records with their entries sorted and watch descriptors reduced to a flag."""
    records, reused, root, listed = result
    return ([(rel, wd != 0, opaque, sorted(entries)) for rel, wd, opaque, entries in records],
            sorted((rel, wd != 0, names) for rel, wd, names in reused), root, listed)


def _memos(root, result):
    """What a committed full scan would remember: every file, and every folder's memo."""
    records, _, _, _ = result
    files, folders = {}, {}
    for rel, _wd, _opaque, entries in records:
        for name, sig, extra in entries:
            path = f"{rel}/{name}" if rel else name
            mode = SIG.unpack(sig)[4]
            if mode & 0o170000 == 0o100000:
                files[path] = (sig, "d" * 64, "", "file")
            elif mode & 0o170000 == 0o120000:
                files[path] = (sig, extra, "", "symlink")
            elif mode & 0o170000 == 0o040000:
                folders[path] = (sig, "t" * 64 + path, 0, "dir", "")
    fd = os.open(root, _DIR)
    folders[""] = (signature(os.fstat(fd)), "root", 0, "dir", "")
    os.close(fd)
    return files, folders


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_lists_every_kind_without_following_links(tmp_path, impl):
    _tree(tmp_path)
    records, reused, root, _ = _walk(impl, tmp_path)
    assert reused == [] and root == len(records) - 1
    by_rel = {rel: {name: (SIG.unpack(sig), extra) for name, sig, extra in entries}
              for rel, _wd, _o, entries in records}
    assert set(by_rel) == {"", "a", "a/b", "a/b/c", "empty", "locked"}
    assert by_rel["a"]["link"][1] == "../top.txt"
    assert by_rel[""]["dangling"][1] == "/nowhere/at/all"
    assert by_rel["a"]["fifo"][1] is None
    assert os.fsdecode(b"bad\xffname") in by_rel[""]
    st = os.lstat(tmp_path / "a" / "b" / "two.py")
    size, mtime, ctime, ino, mode, uid, gid, nlink, blocks = by_rel["a/b"]["two.py"][0]
    assert (size, mtime, ctime, ino, mode, uid, gid, nlink, blocks) == (
        2, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_mode, st.st_uid, st.st_gid,
        st.st_nlink, st.st_blocks)
    # children come before their parent, and a folder's entry names its record
    index = {rel: i for i, (rel, *_rest) in enumerate(records)}
    assert records[by_rel[""]["a"][1]][0] == "a"
    assert index["a/b/c"] < index["a/b"] < index["a"] < index[""]


def test_both_implementations_agree(tmp_path):
    if walk_mod.walk_native is None:
        pytest.skip("the native walker is not built (test_the_native_walker_is_built fails)")
    _tree(tmp_path)
    for depth in range(30):  # a deep chain too, past a few thread hand-offs
        (tmp_path / "deep" / ("d" * (depth + 1))).mkdir(parents=True, exist_ok=True)
    py = _walk(walk_python, tmp_path)
    native = _walk(walk_mod.walk_native, tmp_path)
    assert _normal(native) == _normal(py)
    files, folders = _memos(tmp_path, py)
    # with memos: the folders that hold are the same, and so is what is left to build
    assert _normal(_walk(walk_mod.walk_native, tmp_path, files, folders)) == \
        _normal(_walk(walk_python, tmp_path, files, folders))


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_a_memo_holds_until_something_below_changes(tmp_path, impl):
    _tree(tmp_path)
    os.unlink(tmp_path / "a" / "fifo")  # a folder with a FIFO is always looked at again
    files, folders = _memos(tmp_path, _walk(impl, tmp_path))
    records, reused, root, _ = _walk(impl, tmp_path, files, folders)
    assert records == [] and root == folders[""]
    assert {rel for rel, *_ in reused} == set(folders)

    # a file's content changes: its folder and every folder above it are rebuilt
    with open(tmp_path / "a" / "b" / "two.py", "a") as f:
        f.write("more")
    records, reused, root, _ = _walk(impl, tmp_path, files, folders)
    assert [r[0] for r in records] == ["a/b", "a", ""]
    assert {rel for rel, *_ in reused} == {"a/b/c", "empty", "locked"}
    entries = dict((name, extra) for name, _s, extra in records[1][3])
    assert entries["b"] == 0 and entries["link"] == "../top.txt"

    # a name added to a folder changes the folder's own signature
    files, folders = _memos(tmp_path, _walk(impl, tmp_path))
    (tmp_path / "empty" / "new").write_text("x")
    records, _, _, _ = _walk(impl, tmp_path, files, folders)
    assert [r[0] for r in records] == ["empty", ""]

    # a mode change of a folder is its own signature too
    files, folders = _memos(tmp_path, _walk(impl, tmp_path))
    os.chmod(tmp_path / "a" / "b" / "c", 0o700)
    records, _, _, _ = _walk(impl, tmp_path, files, folders)
    assert [r[0] for r in records] == ["a/b/c", "a/b", "a", ""]


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_depth_limit_and_prefix(tmp_path, impl):
    deep = tmp_path
    for i in range(6):
        deep = deep / f"l{i}"
    deep.mkdir(parents=True)
    with pytest.raises(RecursionError) as err:
        _walk(impl, tmp_path, max_depth=4)
    assert str(err.value) == "l0/l1/l2/l3/l4"
    records, _, _, _ = _walk(impl, tmp_path / "l0", prefix="l0")
    assert [r[0] for r in records][-2:] == ["l0/l1", "l0"]


def _names_below(root) -> int:
    return sum(len(dirs) + len(files) for _, dirs, files in os.walk(root))


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_counts_every_name_and_stops_past_the_most_entries(tmp_path, impl):
    """``listed`` is every name in the tree, in the folders whose memo holds too; past
    ``max_entries`` the walk raises TooManyEntries (a limit reached exactly is not
    passed), whatever folder the names are in."""
    _tree(tmp_path)
    for i in range(300):  # one large folder, beside the small ones
        (tmp_path / "empty" / f"n{i:03}").write_text("")
    names = _names_below(tmp_path)
    first = _walk(impl, tmp_path)
    assert first[3] == names
    files, folders = _memos(tmp_path, first)
    records, reused, _, listed = _walk(impl, tmp_path, files, folders)
    held = {rel: below for rel, _, below in reused}
    assert listed == names and held["empty"] == 300  # the memos held: counted too
    assert held["a/b"] == 3 and held["a/b/c"] == 1  # each folder's names, and below it
    assert _walk(impl, tmp_path, max_entries=names)[3] == names
    for limit in (0, 5, 200, names - 1):
        with pytest.raises(walk_mod.TooManyEntries) as err:
            _walk(impl, tmp_path, files, folders, max_entries=limit)
        rel, seen = err.value.args
        assert limit <= seen <= names and isinstance(rel, str)
    with pytest.raises(ValueError):
        _walk(impl, tmp_path, max_entries=-1)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_a_folder_of_many_names_is_cut_short_while_it_is_listed(tmp_path, impl):
    """A single folder past the limit is not listed to its end first: the walk stops
    within the limit (measured by what the exception says it had listed)."""
    for i in range(5000):
        (tmp_path / f"f{i}").write_text("")
    with pytest.raises(walk_mod.TooManyEntries) as err:
        _walk(impl, tmp_path, max_entries=100)
    assert err.value.args == ("", 100)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_watches_every_folder_before_listing_it(tmp_path, impl):
    _tree(tmp_path)
    libc = ctypes.CDLL(None, use_errno=True)
    ifd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        records, _, _, _ = _walk(impl, tmp_path, inotify_fd=ifd)
        wds = {rel: wd for rel, wd, _o, _e in records}
        assert all(wd > 0 for wd in wds.values()) and len(set(wds.values())) == len(wds)
        (tmp_path / "a" / "b" / "c" / "after").write_text("seen")
        event = os.read(ifd, 4096)
        wd, mask, _cookie, length = struct.unpack_from("iIII", event)
        assert wd == wds["a/b/c"] and event[16:16 + length].rstrip(b"\0") == b"after"
    finally:
        os.close(ifd)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_a_failure_is_an_error_not_a_silent_gap(tmp_path, impl):
    (tmp_path / "file").write_text("not a folder")
    fd = os.open(tmp_path / "file", os.O_RDONLY | os.O_CLOEXEC)
    try:
        with pytest.raises(NotADirectoryError):
            impl(fd, -1, 0, 4, False, lambda: ({}, {}), signature(os.fstat(fd)))
    finally:
        os.close(fd)


# -- full scans with memos: what a start after a crash or a restart relies on ----------

def _same_size_rewrite(path) -> None:
    path.write_text("#" * len(path.read_text()))


def _mutations(root):
    """Changes a daemon that was not running would not have seen, one per round."""
    deep = root / "a" / "b" / "c"
    return [
        lambda: (deep / "f0.py").open("a").write("appended\n"),
        lambda: _same_size_rewrite(deep / "f1.py"),
        lambda: os.unlink(deep / "f2.py"),
        lambda: (deep / "new.py").write_text("new"),
        lambda: os.chmod(root / "a" / "b", 0o700),
        lambda: os.chmod(deep / "f3.py", 0o600),
        lambda: (os.unlink(deep / "f4.py"), os.symlink("f0.py", deep / "f4.py")),
        lambda: os.rename(root / "x" / "y", root / "x" / "z"),
        lambda: __import__("shutil").rmtree(root / "gone"),
        lambda: (root / "a" / "b" / "c" / "d" / "e").mkdir(parents=True),
    ]


def test_a_scan_with_memos_equals_a_scan_without(tmp_path):
    """A full scan that reuses folder memos and cached files gives the same root as a
    scan that knows nothing, after every kind of change a stopped daemon could miss."""
    import time

    from worldline.daemon.capture.snapshot import WorkspaceSnapshotter
    from worldline.daemon.capture.statcache import RACY_NS, StatCache
    from worldline.daemon.capture.trees import TreeReader
    from worldline.daemon.storage.blobs import MemoryBlobStore

    root = tmp_path / "ws"
    for i in range(6):
        (root / "a" / "b" / "c").mkdir(parents=True, exist_ok=True)
        (root / "a" / "b" / "c" / f"f{i}.py").write_text(f"file {i}\n" * (i + 1))
        (root / "x" / "y" / f"k{i}").mkdir(parents=True)
        (root / "x" / "y" / f"k{i}" / "data").write_bytes(os.urandom(100 * i))
        (root / "gone" / f"g{i}").mkdir(parents=True)
    blobs = MemoryBlobStore()
    trees = TreeReader(blobs)
    cache = StatCache(str(tmp_path / "index.db"))
    snap = WorkspaceSnapshotter(str(root), blobs, trees, cache)
    for mutate in _mutations(root):
        time.sleep(RACY_NS / 1e9 * 1.5)  # past the racy window: files and folders cacheable
        first = snap.capture()
        snap.commit(first)
        mutate()
        warm = snap.capture()
        cold = WorkspaceSnapshotter(str(root), blobs, TreeReader(blobs),
                                    StatCache(None)).capture(persist=False)
        assert warm.root == cold.root, mutate
        assert warm.root != first.root
        assert warm.reused, "the memos were never used"
        snap.commit(warm)
    # the cache survives a reopen, from its log and from its snapshot: nothing changed,
    # so the root's memo holds and nothing is rebuilt
    time.sleep(RACY_NS / 1e9 * 1.5)
    snap.commit(snap.capture())
    for compact in (False, True):
        cache.write_behind()  # as the daemon's housekeeping does every second
        if compact:
            cache.compact()
        reopened = WorkspaceSnapshotter(str(root), blobs, trees,
                                        StatCache(str(tmp_path / "index.db")))
        again = reopened.capture()
        assert again.root == cold.root and "" in again.reused


def test_folders_below_holds_one_descriptor_per_level(tmp_path):
    """The small walks (removing a tree, clearing leftovers, watching a new folder) keep
    one descriptor per level, not one per folder waiting its turn, and never recurse."""
    from worldline.daemon.capture.walk import folders_below

    for i in range(300):
        (tmp_path / "wide" / f"s{i}" / "leaf").mkdir(parents=True)
    deep = tmp_path / "deep"
    deep.mkdir()
    fd = os.open(deep, _DIR)
    for _ in range(50):
        os.mkdir("d", dir_fd=fd)
        sub = os.open("d", _DIR, dir_fd=fd)
        os.close(fd)
        fd = sub
    os.close(fd)
    root = os.open(tmp_path, _DIR)
    try:
        baseline = len(os.listdir("/proc/self/fd"))
        most, seen = 0, []
        for _fd, rel, _entries in folders_below(root, 400):
            seen.append(rel)
            most = max(most, len(os.listdir("/proc/self/fd")) - baseline)
        assert len(seen) == 1 + 1 + 300 * 2 + 1 + 50
        assert most <= 53 + 3  # the deepest chain, not the 300 siblings
        assert len(os.listdir("/proc/self/fd")) == baseline  # all closed
        with pytest.raises(RecursionError):
            for _ in folders_below(root, 10):
                pass
        assert len(os.listdir("/proc/self/fd")) == baseline
    finally:
        os.close(root)
