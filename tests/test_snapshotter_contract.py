"""The Snapshotter contract, run against every implementation: a world captured
then changed comes back exactly, touching only what differs."""

from __future__ import annotations

import mmap
import os
import time
from pathlib import Path

import pytest
from worldline.daemon.capture.snapshot import MemoryFile, MemorySnapshotter, WorkspaceSnapshotter
from worldline.daemon.capture.statcache import RACY_NS, StatCache, signature
from worldline.daemon.capture.tracker import Changes
from worldline.daemon.capture.trees import DIR, FILE, SYMLINK, TreeReader, diff, entry_at
from worldline.daemon.storage.blob_store import digest_of
from worldline.daemon.storage.blobs import MemoryBlobStore

from .conftest import tree_state


class DirWorld:
    def __init__(self, path: Path, blobs, trees):
        self.path = path
        self.snap = WorkspaceSnapshotter(str(path), blobs, trees, StatCache(None))

    def write(self, rel, data=b"", mode=0o644):
        p = self.path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        os.chmod(p, mode)

    def symlink(self, rel, target):
        p = self.path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, p)

    def mkdir(self, rel, mode=0o755):
        p = self.path / rel
        p.mkdir(parents=True, exist_ok=True)
        os.chmod(p, mode)

    def remove(self, rel):
        p = self.path / rel
        if p.is_dir() and not p.is_symlink():
            import shutil
            shutil.rmtree(p)
        else:
            p.unlink()

    def state(self):
        return tree_state(self.path)


class MemWorld:
    def __init__(self, blobs, trees):
        self.snap = MemorySnapshotter(blobs, trees)

    def write(self, rel, data=b"", mode=0o644):
        self.snap.files[rel] = MemoryFile(FILE, mode, data)

    def symlink(self, rel, target):
        self.snap.files[rel] = MemoryFile(SYMLINK, 0, target.encode())

    def mkdir(self, rel, mode=0o755):
        self.snap.files[rel] = MemoryFile(DIR, mode)

    def remove(self, rel):
        for k in [k for k in self.snap.files if k == rel or k.startswith(rel + "/")]:
            del self.snap.files[k]

    def state(self):
        """Files with their implied parent folders made explicit."""
        out = dict(self.snap.files)
        for path in list(out):
            parts = path.split("/")
            for i in range(1, len(parts)):
                out.setdefault("/".join(parts[:i]), MemoryFile(DIR, 0o755))
        return out


@pytest.fixture(params=["memory", "directory"])
def world(request, tmp_path):
    blobs = MemoryBlobStore()
    trees = TreeReader(blobs)
    if request.param == "memory":
        return MemWorld(blobs, trees), trees
    (tmp_path / "w").mkdir()
    return DirWorld(tmp_path / "w", blobs, trees), trees


def populate(w):
    w.write("a.txt", b"alpha")
    w.write("bin/run.sh", b"#!/bin/sh\necho hi\n", 0o755)
    w.symlink("link-out", "/etc/passwd")
    w.symlink("dangling", "does/not/exist")
    w.mkdir("empty/inner", 0o700)
    w.write("deep/a/b/c/d.bin", bytes(range(256)) * 10)
    w.write("ünïcødé ✓.txt", "ü".encode())


def test_round_trip_after_heavy_change(world):
    w, trees = world
    populate(w)
    before = w.state()
    cap = w.snap.capture()
    w.remove("deep")
    w.remove("a.txt")
    w.mkdir("a.txt")  # a file replaced by a folder
    w.write("a.txt/inside", b"x")
    w.write("bin/run.sh", b"changed", 0o644)
    w.symlink("new-link", "a.txt")
    w.remove("empty")
    current = w.snap.capture(persist=False)
    changes = diff(trees, current.root, cap.root, current.trees)
    assert "deep/a/b/c/d.bin" in changes.added and "new-link" in changes.deleted
    w.snap.apply(current, cap.root)
    assert w.state() == before
    assert w.snap.capture(persist=False).root == cap.root


def test_identical_worlds_have_identical_roots(world):
    w, trees = world
    populate(w)
    a = w.snap.capture()
    b = w.snap.capture()
    assert a.root == b.root and diff(trees, a.root, b.root).added == []


def test_mode_only_change_is_captured(world):
    w, trees = world
    w.write("x.sh", b"echo", 0o644)
    a = w.snap.capture()
    w.write("x.sh", b"echo", 0o755)
    b = w.snap.capture()
    assert diff(trees, a.root, b.root).modified == ["x.sh"]


@pytest.mark.parametrize("size, hint", [(0, 0), (1, 1), (5000, 5000), (5000, 10),
                                        (3 << 20, 3 << 20), (3 << 20, 0), (10, 5000)])
def test_read_small_reads_the_whole_file_whatever_its_stat_said(tmp_path, size, hint):
    """The buffer follows the size the capture stat'ed; a file that grew or shrank since
    is still read to its end, byte for byte."""
    from worldline.daemon.capture.snapshot import read_small
    data = os.urandom(size)
    (tmp_path / "f").write_bytes(data)
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    try:
        assert read_small(fd, hint) == data
    finally:
        os.close(fd)


def test_a_large_folder_encoded_from_its_previous_rows_is_byte_for_byte_its_encoding():
    """``TreeReader.encode_update`` replaces the touched rows of the base's kept rows;
    over many versions (names changed, added, removed; with and without the root's own
    entry; sockets, which count for no size) it gives exactly ``encode`` of the tree."""
    import random

    from worldline.daemon.capture.trees import (
        SOCKET,
        Entry,
        Tree,
        encode,
    )
    rng = random.Random(7)
    blobs = MemoryBlobStore()
    reader = TreeReader(blobs)

    def entry() -> Entry:
        kind = rng.choice([FILE, FILE, FILE, DIR, SYMLINK, SOCKET])
        return Entry(kind, rng.choice([0o644, 0o4755, 0o600]), os.urandom(32).hex(),
                     rng.randrange(1 << 40), rng.randrange(70000), 100,
                     rng.randrange(1 << 62), rng.choice(["", '{"x":[["user.a","00"]]}']))

    names = ["é", "a b", "Z", "\udcff", "x" * 200] + [f"n{i:03d}" for i in range(150)]
    tree = Tree({name: entry() for name in names})
    base = blobs.put_bytes(encode(tree))
    reader.remember(base, tree)
    kept_once = False
    for _ in range(300):
        new = Tree(reader.read(base))
        touched = rng.sample(names + [f"new{i}" for i in range(40)], rng.randrange(1, 6))
        for name in touched:
            if rng.random() < 0.3:
                new.pop(name, None)
            else:
                new[name] = entry()
        if rng.random() < 0.5:
            new.own = Entry(DIR, 0o755, "", 0, 0, 0, rng.randrange(1 << 62), "")
        data, total, rows = reader.encode_update(new, base, touched)
        assert data == encode(new)
        assert total == sum(e.size for e in new.values() if e.kind != SOCKET)
        kept_once = kept_once or reader._rows.get(base) is not None
        base = blobs.put_bytes(data)
        reader.remember(base, new)
        if rows is not None:
            reader.keep_rows(base, rows)
    assert kept_once  # the rows of earlier versions were used, not only built


def test_kept_trees_are_out_of_the_cycle_collectors_sight():
    """The trees a reader keeps, their entries and a large folder's kept rows hold only
    strings and numbers: they are untracked by the cycle collector (daemon/_codec.c's
    ``untrack``), which under the eight-session load traversed them all at every young
    collection (35 to 60 ms pauses of every call, finding nothing). A kept tree given a
    new entry is tracked again (a dict does that itself), and reads back unchanged."""
    import gc

    from worldline.daemon.capture.trees import Entry, Tree, encode
    try:
        from worldline.daemon._codec import untrack
    except ImportError:
        pytest.fail("worldline.daemon._codec was not built: install gcc and the Python"
                    " headers, then make install")
    with pytest.raises(TypeError):
        untrack(5)
    blobs = MemoryBlobStore()
    reader = TreeReader(blobs)
    tree = Tree({f"n{i:03d}": Entry(FILE, 0o644, f"{i:064x}", i) for i in range(100)},
                own=Entry(DIR, 0o755, "", 0, 0, 0, 1, ""))
    assert gc.is_tracked(tree) and gc.is_tracked(tree["n000"])
    digest = blobs.put_bytes(encode(tree))
    reader.remember(digest, tree)
    assert not gc.is_tracked(tree) and not gc.is_tracked(tree.own)
    assert not any(gc.is_tracked(e) for e in tree.values())
    new = Tree(reader.read(digest))
    new["n000"] = Entry(FILE, 0o600, "f" * 64, 7)
    data, _, rows = reader.encode_update(new, digest, ["n000"])
    assert rows is not None and data == encode(new)
    reader.keep_rows(blobs.put_bytes(data), rows)
    assert not any(gc.is_tracked(x) for x in (rows, rows.names, rows.rows))
    gc.collect()
    assert reader.read(digest) is tree and encode(tree) == blobs.read_bytes(digest)
    tree["late"] = Entry(FILE, 0o644, "e" * 64, 1)
    assert gc.is_tracked(tree)


def test_the_restore_journal_finds_every_entry_it_or_an_earlier_daemon_wrote(tmp_path):
    """``get`` opens files only for sessions it knows may have one: those it wrote, and
    those the folder held when it was opened (a daemon that died mid-restore)."""
    import json

    from worldline.daemon.world.journal import RestoreJournal
    folder = tmp_path / "journal"
    RestoreJournal(str(folder)).write({"session": "left", "target": "c1"})
    journal = RestoreJournal(str(folder))  # the next daemon
    assert journal.get("left") == {"session": "left", "target": "c1"}
    assert journal.get("other") is None
    journal.write({"session": "new", "target": "c2"})
    assert json.loads((folder / "new.json").read_text()) == journal.get("new")
    journal.remove("new")
    assert journal.get("new") is None
    journal.set_aside("left")
    assert journal.get("left") is None and journal.get_set_aside("left")["target"] == "c1"


def test_a_folder_looked_at_again_and_unchanged_puts_nothing(tmp_path):
    """Folders holding hard links are re-examined by every capture (a write through
    one name gives no event for the others). Found unchanged, their trees and the
    layer's hard-link groups are the head's blobs: the capture puts only what the edit
    changed (on a fleet each put of a blob stored before is a question to the index)."""
    from worldline.daemon.capture.tracker import Changes

    class Counted(MemoryBlobStore):
        def __init__(self) -> None:
            super().__init__()
            self.put: list[bytes] = []

        def put_bytes(self, data, base=None):
            self.put.append(data)
            return super().put_bytes(data, base)

    blobs = Counted()
    w = DirWorld(tmp_path / "ws", blobs, TreeReader(blobs))
    w.write("src/main.py", b"print(1)\n")
    os.link(w.path / "src/main.py", w.path / "src/alias.py")
    w.write("docs/readme.txt", b"read me\n")
    w.write("top.txt", b"top\n")
    first = w.snap.capture()
    w.snap.commit(first)
    linked = {"src/main.py", "src/alias.py"}
    w.write("docs/readme.txt", b"read me again\n")
    blobs.put.clear()
    second = w.snap.capture(changes=Changes(False, dirty={"docs/readme.txt"}, linked=linked),
                            base=first.root)
    assert not second.full
    trees = TreeReader(blobs)
    root = trees.read(second.root)
    assert root["src"].ref == trees.read(first.root)["src"].ref  # the same tree
    put = set(blobs.put)
    assert put == {b"read me again\n", blobs.read_bytes(root["docs"].ref),
                   blobs.read_bytes(second.root)}
    w.snap.commit(second)
    # A change through a linked name is seen, and its folder's tree is put.
    with open(w.path / "src/alias.py", "ab") as f:
        f.write(b"print(2)\n")
    blobs.put.clear()
    third = w.snap.capture(changes=Changes(False, linked=linked), base=second.root)
    assert b"print(1)\nprint(2)\n" in blobs.put
    assert blobs.read_bytes(trees.read(third.root)["src"].ref) in blobs.put
    assert w.state() == tree_state(w.path)


@pytest.mark.parametrize("full", [False, True], ids=["incremental", "full-scan"])
def test_a_file_whose_stat_cannot_vouch_for_it_is_read_again(tmp_path, full):
    """A write through a shared mapping to a page already writable leaves the file's
    stat as it was. A file the tracker saw closed after writing, or one mapped now, is
    read again whatever its stat says, in an incremental capture and in a full scan
    (where the memos of its folder, and of the root, must not hold); a mapped file
    leaves no stat cache entry behind."""
    blobs = MemoryBlobStore()
    trees = TreeReader(blobs)
    w = DirWorld(tmp_path / "ws", blobs, trees)
    files = ("deep/er/db", "top")
    for rel in files:
        w.write(rel, bytes(8192))
    w.write("deep/other", b"x")
    maps = []
    for rel in files:
        fd = os.open(w.path / rel, os.O_RDWR)
        maps.append(mmap.mmap(fd, 8192))
        os.close(fd)
        maps[-1][0:5] = b"first"  # the page becomes writable: the file's time moves
    time.sleep(0.25)  # past the racy window: the stat cache may learn them
    old = w.snap.capture()
    w.snap.commit(old)
    assert set(files) <= set(old.seen) and {"", "deep", "deep/er"} <= set(old.memos)
    stats = [signature(os.stat(w.path / rel)) for rel in files]
    for m in maps:
        m[8:14] = b"second"  # the same page: no trace in the stat, unless a write-back
        # (any process's sync: the suite runs in two) made the page read-only meanwhile
    time.sleep(RACY_NS / 1e9 * 1.5)  # past the racy window, whichever it was
    untouched = [signature(os.stat(w.path / rel)) for rel in files] == stats

    def read(**kw) -> tuple:
        got = w.snap.capture(changes=Changes(full, **kw.pop("changes", {})), base=old.root,
                             **kw)
        return got, [blobs.read_bytes(entry_at(trees, got.root, rel).ref) for rel in files]

    before = b"first" + bytes(8187)
    now = b"first\0\0\0second" + bytes(8178)
    # What the stat cache vouched for (a time a write-back moved: the scan reads them)
    assert read()[1] == ([before, before] if untouched or not full else [now, now])
    closed, content = read(changes={"dirty": set(files), "closed": set(files)})
    assert content == [now, now]
    assert set(files) <= set(closed.seen)  # closed: the cache may learn them now
    mapped, content = read(mapped=frozenset(files))
    assert content == [now, now]
    assert not set(files) & set(mapped.seen)
    w.snap.commit(mapped)
    assert not set(files) & set(w.snap.stat_cache.entries(w.snap.path))
    for m in maps:
        m.close()


def test_the_trees_kept_are_bounded_by_their_entries_not_only_by_their_number():
    """A reader keeps at most so many trees *and* so many entries over all of them,
    dropping the least recently used first; a tree too large to keep alone is not kept
    (it is decoded again when read, and reads back the same). A count of trees alone
    let a few large folders, each changed a few thousand times, take all the memory."""
    from worldline.daemon.capture.trees import Entry, Tree, encode

    class Counted(MemoryBlobStore):
        reads = 0

        def read_bytes(self, digest):
            Counted.reads += 1
            return super().read_bytes(digest)

    blobs = Counted()
    reader = TreeReader(blobs, capacity=100, entries=1000, rows=(100, 500))

    def tree(tag: str, n: int) -> tuple[str, Tree]:
        t = Tree({f"{tag}{i:04d}": Entry(FILE, 0o644, f"{i:064x}", i) for i in range(n)})
        return blobs.put_bytes(encode(t)), t

    made = [tree(tag, 300) for tag in "abcd"]
    for digest, t in made:
        reader.remember(digest, t)
        assert reader.kept()[1] <= 1000
    assert reader.kept()[:2] == (3, 900)  # a's were dropped to make room for d's
    Counted.reads = 0
    assert reader.read(made[3][0]) is made[3][1] and Counted.reads == 0
    assert reader.read(made[0][0]) == made[0][1] and Counted.reads == 1  # decoded again
    assert reader.kept()[:2] == (3, 900)  # ... and kept, b's dropped for it
    reader.read(made[1][0])
    assert Counted.reads == 2
    big, t = tree("z", 1200)
    reader.remember(big, t)
    assert reader.kept()[:2] == (3, 900)  # too large to keep: nothing dropped for it
    assert reader.read(big) == t and Counted.reads == 3 and reader.kept()[:2] == (3, 900)
    for digest, t in made[:3]:
        reader.remember(digest, t)  # kept again: counted once each
    assert reader.kept()[:2] == (3, 900)
    small = [tree(f"s{i}_", 1) for i in range(150)]
    for digest, t in small:
        reader.remember(digest, t)
    assert reader.kept()[:2] == (100, 100)  # the count bound holds for small trees


def test_a_large_folder_changed_many_times_keeps_memory_bounded_and_every_version(tmp_path):
    """The hostile-agent shape of the unbounded cache: one folder of thousands of files,
    one of them changed before each capture. With the reader's bounds made small, the
    kept trees and rows stay within them, the large folder's rows are still kept (they
    fit), and every version reads back as the folder was."""
    from worldline.daemon.capture.tracker import Changes

    blobs = MemoryBlobStore()
    trees = TreeReader(blobs, entries=5000, rows=(4, 2500))
    w = DirWorld(tmp_path / "ws", blobs, trees)
    files = {f"f{i:04d}": b"%d\n" % i for i in range(2000)}
    for name, data in files.items():
        w.write(f"big/{name}", data)
    w.write("small/readme", b"hi\n")
    time.sleep(RACY_NS / 1e9 * 1.5)
    head = w.snap.capture()
    w.snap.commit(head)
    versions = [(head.root, dict(files))]
    for step in range(30):
        name = f"f{step * 61 % 2000:04d}"
        files[name] = b"changed %d\n" % step
        w.write(f"big/{name}", files[name])
        head = w.snap.capture(changes=Changes(False, dirty={f"big/{name}"}), base=head.root)
        w.snap.commit(head)
        versions.append((head.root, dict(files)))
        kept_trees, entries, folders, rows = trees.kept()
        assert entries + kept_trees <= 5000 and rows + folders <= 2500 and folders <= 4
    assert trees.kept()[3] == 2000  # the big folder's last rows: kept, within bounds
    fresh = TreeReader(blobs)
    for root, contents in versions:
        big = fresh.read(fresh.read(root)["big"].ref)
        assert {name: blobs.read_bytes(e.ref) for name, e in big.items()} == contents
    assert w.state() == tree_state(w.path)


@pytest.mark.parametrize("persist", [True, False], ids=["stored", "looked-at"])
@pytest.mark.parametrize("start", [1 << 20, 5 << 20], ids=["small", "large"])
def test_a_file_growing_while_read_is_read_within_its_allowance(tmp_path, monkeypatch,
                                                                persist, start):
    """Every way a changed file's bytes are read (whole into memory, hashed then
    copied aside, hashed only for a capture that stores nothing) stops one byte past
    what the budget allows it (``Budget.allowance``), whatever the file grew to after
    its size was read (the growth is forced at ``capture.file_opened``)."""
    from worldline.client.errors import ResourceExhausted
    from worldline.daemon.capture import snapshot
    from worldline.daemon.capture.limits import Limits

    blobs = MemoryBlobStore()
    w = DirWorld(tmp_path / "ws", blobs, TreeReader(blobs))
    w.snap.limits = Limits(max_file_bytes=8 << 20, max_checkpoint_bytes=64 << 20)
    w.write("log", os.urandom(start))
    got: list[int] = []  # the bytes each read gave, all of them this file's
    real_read, real_pread = os.read, os.pread

    def counted(read):
        def reading(*args):
            data = read(*args)
            got.append(len(data))
            return data
        return reading
    monkeypatch.setattr(os, "read", counted(real_read))
    monkeypatch.setattr(os, "pread", counted(real_pread))

    def grow(name: str, detail: str = "") -> None:
        if name == "capture.file_opened":
            with open(w.path / "log", "ab") as f:
                f.write(bytes(32 << 20))
    monkeypatch.setattr(snapshot, "crash_point", grow)
    with pytest.raises(ResourceExhausted, match="log grew while it was read.*--max-file-bytes"):
        w.snap.capture(persist=persist)
    assert (8 << 20) < sum(got) <= (8 << 20) + 1
    monkeypatch.undo()
    assert not blobs.has(digest_of((w.path / "log").read_bytes()))


def _names_on_disk(root: Path) -> int:
    return sum(len(dirs) + len(files) for _, dirs, files in os.walk(root))


def test_every_capture_counts_the_names_its_layer_holds(tmp_path):
    """``--max-entries`` needs each capture to know how many names its layer holds:
    a full scan from its walk (the folders whose memo held counted there), an
    incremental capture from the head's count and what changed (a folder removed or
    replaced takes every name below it along), a capture after a restore from the
    restored tree's. Through a real tracker and random changes, every count equals the
    names on disk and the count read back from the trees alone."""
    import random
    import shutil

    from worldline.daemon.capture.layers import WORKSPACE, Layer
    from worldline.daemon.capture.limits import Limits
    from worldline.daemon.capture.tracker import ChangeMonitor

    ws = tmp_path / "ws"
    ws.mkdir()
    blobs = MemoryBlobStore()
    rng = random.Random(11)
    monitor = ChangeMonitor()

    def layer_with(trees: TreeReader) -> Layer:
        tracker = monitor.tracker(str(ws))
        snap = WorkspaceSnapshotter(str(ws), blobs, trees, cache, tracker, limits=Limits())
        return Layer(WORKSPACE, str(ws), snap, tracker)

    def folders() -> list[Path]:
        return [Path(d) for d, _, _ in os.walk(ws)]

    def files() -> list[Path]:
        return [Path(d) / f for d, _, fs in os.walk(ws) for f in fs]

    def new_tree(at: Path) -> None:
        for i in range(rng.randint(1, 6)):
            sub = at / "/".join(f"d{rng.randint(0, 3)}" for _ in range(rng.randint(0, 2)))
            sub.mkdir(parents=True, exist_ok=True)
            (sub / f"n{i}").write_text(str(i))

    def change() -> None:
        kind = rng.choice(["write", "write", "tree", "rm", "rmtree", "dir-to-file",
                           "file-to-dir", "move", "link"])
        here = rng.choice(folders())
        if kind == "write":
            (here / f"f{rng.randint(0, 9)}").write_text(str(rng.random()))
        elif kind == "tree":
            new_tree(here / f"t{rng.randint(0, 99)}")
        elif kind == "rm" and files():
            rng.choice(files()).unlink()
        elif kind in ("rmtree", "dir-to-file", "move") and here != ws:
            if kind == "move":
                here.rename(ws / f"moved{rng.randint(0, 99)}")
                return
            shutil.rmtree(here)
            if kind == "dir-to-file":
                here.write_text("was a folder")
        elif kind == "file-to-dir" and files():
            f = rng.choice(files())
            f.unlink()
            new_tree(f)
        elif kind == "link" and files():
            os.symlink("../elsewhere", here / f"l{rng.randint(0, 9)}")

    cache = StatCache(None)
    try:
        new_tree(ws)
        layer, base, incremental = layer_with(TreeReader(blobs)), None, 0
        earlier = ""  # the tree of step 10, restored at step 30
        for step in range(60):
            change()
            if step == 30:  # a restore to an earlier tree, then a reader that knows none
                current, _ = layer.capture(base, persist=False, consume=False)
                layer.snap.apply(current, earlier)
                layer.now_equals(earlier)
                base, layer = earlier, layer_with(TreeReader(blobs))
            if step in (19, 49):  # a full scan past the racy window writes every memo
                time.sleep(RACY_NS / 1e9 * 1.5)
            if step in (19, 20, 49, 50):  # then one with most of them holding
                layer.tracker.invalidate("a full scan, with memos")
            capture, _ = layer.capture(base)
            layer.committed(capture)
            base = capture.root
            if step in (20, 50):
                assert capture.full and capture.reused
            if step == 10:
                earlier = capture.root
            incremental += not capture.full
            assert capture.entries == _names_on_disk(ws) == TreeReader(blobs).count(base), step
        assert incremental > 40
    finally:
        monitor.close()


@pytest.mark.parametrize("where", ["file", "folder", "symlink", "fifo", "root"])
def test_an_entry_carrying_too_many_xattrs_is_refused_naming_it(tmp_path, monkeypatch,
                                                                   where):
    """The kernel bounds an xattr's value and the list of names, not their number: on
    XFS or btrfs one file may carry hundreds of megabytes, which a capture held in
    memory and wrote into its folder's tree at every version. Past MAX_XATTR_BYTES
    (scaled down here: this file system keeps a few kilobytes an inode) a capture is
    RESOURCE_EXHAUSTED naming the entry; at the limit it is captured."""
    from worldline.client.errors import ResourceExhausted
    from worldline.daemon.capture import fsmeta
    from worldline.daemon.capture.limits import Limits

    monkeypatch.setattr(fsmeta, "MAX_XATTR_BYTES", 300)
    blobs = MemoryBlobStore()
    trees = TreeReader(blobs)
    w = DirWorld(tmp_path / "ws", blobs, trees)
    w.snap.limits = Limits()
    w.write("src/keep.txt", b"kept\n")
    target = {"file": "src/f", "folder": "src/d", "symlink": "src/l", "fifo": "src/p",
              "root": ""}[where]
    path = w.path / target
    if where == "file":
        w.write(target, b"data")
    elif where == "folder":
        path.mkdir()
    elif where == "fifo":
        os.mkfifo(path)
    elif where == "symlink":
        os.symlink("keep.txt", path)
    trusted = where in ("symlink", "fifo")  # user.* xattrs only on files and folders

    def carry(size: int) -> None:
        name = "trusted.big" if trusted else "user.big"
        os.setxattr(path, name, b"x" * (size - len(name)), follow_symlinks=False)

    carry(300)  # names and values: exactly the limit
    captured = w.snap.capture()
    entry = (trees.read(captured.root).own if where == "root"
             else entry_at(trees, captured.root, target))
    assert len(b"".join(entry.xattrs().values())) == 300 - len("user.big" if not trusted
                                                               else "trusted.big")
    carry(301)
    with pytest.raises(ResourceExhausted) as err:
        w.snap.capture()
    named = target or f"the workspace {w.path}"
    assert err.value.message.startswith(f"{named} carries more than 300 bytes of extended")


def test_entries_carrying_xattrs_weigh_their_bytes_in_the_kept_trees():
    """A tree weighs its entries, or its encoding's bytes at ENTRY_BYTES an entry,
    whichever is more, in the reader's bounds (and a folder's rows the same): entries
    carrying kilobytes of xattrs each cannot fill the daemon's memory under a bound
    counted in entries."""
    from worldline.daemon.capture.trees import ENTRY_BYTES, Entry, Tree, encode, make_extra

    blobs = MemoryBlobStore()
    trees = TreeReader(blobs, entries=5000, rows=(4, 5000))
    heavy = make_extra({"user.big": b"x" * 32768})  # 64 KiB of hex in its folder's tree
    for i in range(20):
        tree = Tree({f"f{j}": Entry(FILE, 0o644, digest_of(b"%d" % i), 1, 0, 0, 0, heavy)
                     for j in range(10)})
        data = encode(tree)
        trees.read(blobs.put_bytes(data))
        kept, entries, _, _ = trees.kept()
        assert kept == 1 and entries + kept == len(data) // ENTRY_BYTES + 1
    plain = Tree({f"f{j}": Entry(FILE, 0o644, "a" * 64, 1, 0, 0, 0) for j in range(10)})
    trees.read(blobs.put_bytes(encode(plain)))
    assert trees.kept()[:2] == (2, len(data) // ENTRY_BYTES + 10)  # plain: its entries
