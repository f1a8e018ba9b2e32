"""Storage on real edits: how versions of files are stored over a history, on a real
daemon with its own data root."""

from __future__ import annotations

import hashlib
import os
import random

import pytest
from worldline.daemon.storage import repack
from worldline.daemon.storage.blobs import LocalBlobStore
from worldline.daemon.storage.crypto import DataKey, new_key
from worldline.daemon.storage.packs import (
    COPIES,
    DELTA,
    ZDELTA,
    Pack,
    Row,
    best_delta,
    encode_delta,
)
from worldline.daemon.storage.repack import Repacker

from .conftest import pack_of


def _replace(path, data: bytes) -> None:
    """Write as git and most editors do: a new file renamed over the old one."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_bytes(data)
    os.rename(tmp, path)


def test_a_file_edited_right_before_each_checkpoint_is_stored_as_deltas(
        fresh_daemon, workspace):
    """A file written just before a checkpoint gets no stat cache entry (its time cannot
    vouch for it), so its previous version comes from the tree: each version is a delta
    of the one before it, not of whatever older version the stat cache last saw (which
    drifts until the delta no longer pays and whole copies are stored)."""
    src = workspace / "module.py"
    lines = [f"def f{i}(x):\n    return x * {i}  # {os.urandom(8).hex()}\n".encode()
             for i in range(600)]
    _replace(src, b"".join(lines))
    fresh_daemon.start()
    versions = [hashlib.sha256(src.read_bytes()).hexdigest()]
    with fresh_daemon.client() as c:
        s = c.create_session(str(workspace))
        for n in range(4):
            lines[n * 100] = f"def edited{n}(x):\n    return -x\n".encode()
            data = b"".join(lines)
            _replace(src, data)
            s.checkpoint()  # at once: the file is newer than the stat cache may trust
            versions.append(hashlib.sha256(data).hexdigest())
    assert fresh_daemon.stop() == 0
    pack = Pack(str(pack_of(fresh_daemon.root / "blobs")))
    try:
        for before, digest in zip(versions, versions[1:], strict=False):
            row = pack.row(digest)
            assert row is not None and row.kind == DELTA, row  # one line: a splice
            assert len(row.data) < 200 and row.base == before
    finally:
        pack.close()


# -- the idle repack -------------------------------------------------------------------------

def _names(data: bytes):
    """A stand-in for trees.files_named: blobs written as b"tree:" name=digest lines."""
    if not data.startswith(b"tree:"):
        return None
    return [tuple(line.split("=")) for line in data[5:].decode().splitlines()]


def _text(n: int, seed: str) -> bytes:
    return b"".join(f"{seed} line {i}: {hashlib.sha256(f'{seed}{i}'.encode()).hexdigest()}\n"
                    .encode() for i in range(n))


def _all_read_back(blobs, expected: dict[str, bytes]) -> None:
    again = LocalBlobStore(blobs.root, key=blobs.key)
    try:
        for digest, data in expected.items():
            assert again.read_bytes(digest) == data
    finally:
        again.close()


def test_the_repack_makes_a_checkpoints_copies_smaller(tmp_path):
    """A checkpoint stores a version edited in several places as copies and inserts,
    compressed on their own; the idle repack stores it as a zstd frame with the base
    as its dictionary, at zstd's strongest level, when that is an eighth smaller: here
    the edits are pieces of the file's own text, shorter than the 16-byte blocks a copy
    needs, which such a frame copies and the copies cannot. Same base and depth; every
    version still reads back."""
    blobs = LocalBlobStore(str(tmp_path / "b"))
    versions = [_text(800, "module")]
    rng = random.Random(5)
    for i in range(1, 5):
        old = versions[-1]
        lines = old.splitlines(keepends=True)
        for at in (i * 90, 400 + i * 50, 700 + i * 10):
            pieces = b"".join(old[o:o + 10] for o in rng.sample(range(len(old) - 10), 12))
            lines[at] = b"edit %d: %s\n" % (i, pieces)
        versions.append(b"".join(lines))
    digests = [blobs.put_bytes(versions[0])]
    for v in versions[1:]:
        digests.append(blobs.put_bytes(v, base=digests[-1]))
    blobs.sync()
    before = [blobs.pack.row(d) for d in digests[1:]]
    assert all(r.kind == COPIES for r in before)
    repacker = Repacker(blobs)
    while repacker.step():
        pass
    after = [blobs.pack.row(d) for d in digests[1:]]
    for old, new in zip(before, after, strict=True):
        assert new.kind in (DELTA, ZDELTA) and len(new.data) <= len(old.data) * 7 // 8
        assert (new.base, new.depth) == (old.base, old.depth)
    _all_read_back(blobs, dict(zip(digests, versions, strict=True)))


@pytest.mark.parametrize("keyed", [False, True])
def test_the_repack_gives_a_renamed_file_its_old_version_as_base(tmp_path, keyed):
    """A file moved to another folder and edited is stored whole by its checkpoint (its
    new path has no history); the repack finds the version of the same name and makes
    the row a small delta of it. Every blob still reads back, from a fresh process.
    With a data key the repack reads rows through their seal and writes them sealed."""
    blobs = LocalBlobStore(str(tmp_path / "b"), key=DataKey(new_key()) if keyed else None)
    old = _text(2000, "settings")
    d_old = blobs.put_bytes(old)
    blobs.put_bytes(f"tree:settings.py={d_old}".encode())
    blobs.sync()
    new = old.replace(b"settings line 7:", b"settings line seven:")
    d_new = blobs.put_bytes(new)  # the move: no base given
    blobs.put_bytes(f"tree:settings.py={d_new}".encode())
    blobs.sync()
    whole = len(blobs.pack.row(d_new).data)
    repacker = Repacker(blobs, _names)
    while repacker.step():
        pass
    row = blobs.pack.row(d_new)
    assert row.kind in (DELTA, ZDELTA) and row.base == d_old and len(row.data) < whole // 20
    assert row.sealed == keyed
    assert repacker.rows_rewritten >= 1 and repacker.bytes_saved > 0
    _all_read_back(blobs, {d_old: old, d_new: new})


def test_the_repack_rewrites_old_delta_rows_and_moves_their_dependents(tmp_path):
    """Splices of edits far apart (all 0.6 could write) are re-encoded as zstd frames;
    when a row gets a new base, the rows built on it move to their new depth, and no
    chain ever loops."""
    blobs = LocalBlobStore(str(tmp_path / "b"))
    versions = [_text(1500, "v0")]
    for i in range(1, 6):
        lines = versions[-1].splitlines(keepends=True)
        lines[i * 200] = f"edit {i}\n".encode()
        lines[1400 - i * 100] = f"another edit {i}\n".encode()
        versions.append(b"".join(lines))
    digests = [hashlib.sha256(v).hexdigest() for v in versions]
    blobs.put_bytes(versions[0])
    blobs.sync()
    for i in range(1, 6):  # written as 0.6 wrote them
        with blobs._lock:
            blobs.pack.pending[digests[i]] = Row(
                DELTA, digests[i - 1], i, len(versions[i]), 0.0,
                encode_delta(versions[i - 1], versions[i]))
        blobs.sync()
    before = sum(len(blobs.pack.row(d).data) for d in digests)
    repacker = Repacker(blobs)
    while repacker.step():
        pass
    rows = [blobs.pack.row(d) for d in digests]
    assert all(r.kind != DELTA for r in rows)
    assert sum(len(r.data) for r in rows) < before
    for d, r in zip(digests, rows, strict=True):  # depth is one more than the base's
        assert r.depth == (0 if r.base is None else blobs.pack.row(r.base).depth + 1), d
        seen, at = set(), d
        while at is not None:  # every chain ends
            assert at not in seen
            seen.add(at)
            at = blobs.pack.row(at).base
    _all_read_back(blobs, dict(zip(digests, versions, strict=True)))


def test_the_repack_yields_to_a_checkpoint_under_way(tmp_path):
    """While a put is pending a sync, a repack step applies nothing."""
    blobs = LocalBlobStore(str(tmp_path / "b"))
    d = blobs.put_bytes(_text(500, "a"))
    blobs.sync()
    blobs.put_bytes(b"pending, not yet synced")
    before = blobs.pack.row(d)
    assert Repacker(blobs).step() is False
    assert blobs.pack.row(d) == before and blobs.pack.mark("repacked") == 0
    blobs.sync()
    assert Repacker(blobs).step() is True


def test_space_freed_in_the_pack_goes_back_to_the_file_system(tmp_path):
    blobs = LocalBlobStore(str(tmp_path / "b"))
    digests = [blobs.put_bytes(os.urandom(30_000)) for _ in range(60)]
    blobs.sync()
    path = tmp_path / "b" / "pack.db"
    blobs.pack.compact_wal(0)
    full = path.stat().st_size
    for d in digests[:50]:
        assert blobs.delete(d) > 0
    repacker = Repacker(blobs)
    while repacker.step():
        pass
    blobs.pack.compact_wal(0)
    assert path.stat().st_size < full // 3
    _all_read_back(blobs, {d: blobs.read_bytes(d) for d in digests[50:]})


def test_a_pack_made_before_0_7_is_converted_to_give_space_back(tmp_path):
    import sqlite3
    path = tmp_path / "b" / "pack.db"
    path.parent.mkdir()
    sqlite3.connect(path).execute("CREATE TABLE t (x)").connection.close()  # auto_vacuum off
    blobs = LocalBlobStore(str(tmp_path / "b"))
    assert blobs.pack._one("PRAGMA auto_vacuum", ())[0] == 2  # incremental
    blobs.close()


def test_a_pack_keyed_by_eight_bytes_before_0_7_4_keeps_its_key_and_every_row(tmp_path):
    import sqlite3

    from worldline.daemon.storage import packs
    path = tmp_path / "b" / "pack.db"
    path.parent.mkdir()
    old = sqlite3.connect(path)  # the schema a 0.7.3 pack was made with
    old.executescript(packs.FIRST + packs.SCHEMA.replace(
        f"substr(digest, 1, {packs.KEY_BYTES})", "substr(digest, 1, 8)"))
    old.close()
    blobs = LocalBlobStore(str(tmp_path / "b"))
    base = os.urandom(5000)
    written = {blobs.put_bytes(base): base}
    edited = base[:100] + b"an edit" + base[100:]
    written[blobs.put_bytes(edited, base=next(iter(written)))] = edited
    blobs.sync()
    blobs.close()
    blobs = LocalBlobStore(str(tmp_path / "b"))  # reopened: the key is read from the index
    assert blobs.pack._key_len == 8
    assert blobs.pack.present(set(written)) == set(written)
    assert all(blobs.pack.has(d) for d in written)
    _all_read_back(blobs, written)
    plan = blobs.pack._one(f"EXPLAIN QUERY PLAN SELECT id FROM objects WHERE"
                           f" {blobs.pack._by_digest}", blobs.pack._key(next(iter(written))))
    assert "objects_by_key" in plan[-1]
    blobs.close()


def test_a_new_pack_finds_rows_by_four_bytes_through_its_index(tmp_path):
    import sqlite3
    blobs = LocalBlobStore(str(tmp_path / "b"))
    # rows whose digests share their first four bytes are told apart by the whole digest
    data = {blobs.put_bytes(bytes([i]) * 3000): bytes([i]) * 3000 for i in range(50)}
    blobs.sync()
    assert blobs.pack._key_len == 4
    db = sqlite3.connect(tmp_path / "b" / "pack.db")
    prefix = bytes.fromhex(next(iter(data)))[:4]
    db.executemany("UPDATE objects SET digest = ? WHERE id = ?",
                   [(prefix + bytes(d)[4:], i) for i, d in db.execute("SELECT id, digest"
                                                                       " FROM objects")])
    db.commit()
    stored = {bytes(r[0]).hex() for r in db.execute("SELECT digest FROM objects")}
    db.close()
    blobs.close()
    blobs = LocalBlobStore(str(tmp_path / "b"))
    assert blobs.pack.present(stored) == stored
    assert blobs.pack.present(set(data)) == {next(iter(data))}  # the others: one key, not ours
    plan = blobs.pack._one(f"EXPLAIN QUERY PLAN SELECT id FROM objects WHERE"
                           f" {blobs.pack._by_digest}", blobs.pack._key(next(iter(data))))
    assert "objects_by_key" in plan[-1]
    blobs.close()


def test_a_daemon_killed_during_the_repack_loses_nothing(tmp_path):
    """SIGKILL inside a repack transaction, and right after a step: at the next start
    every checkpoint restores byte for byte and fsck finds nothing wrong. (Each round
    copies the file into a new folder, edited: stored whole, then repacked as a delta
    of the same-named file, so the repack surely rewrites rows. The file itself is
    edited in two places far apart: its versions are copy deltas, and those the
    killed repack did not reach are read as such by the restores.)"""
    from .conftest import DaemonProcess, tree_state
    ws = tmp_path / "ws"
    ws.mkdir()
    lines = [f"def f{i}():\n    return {i}  # {i * 7919 % 1000}\n" for i in range(800)]
    (ws / "a.py").write_text("".join(lines))
    states, session = {}, None
    for round_, point in enumerate(("repack.mid", "repack.step")):
        d = DaemonProcess(tmp_path / "root", env={"WORLDLINE_FAULTS": point}).start()
        with d.client() as c:
            s = c.create_session(str(ws)) if session is None else c.get_session(session)
            session = s.id
            for n in range(6):
                lines[n * 50] = f"# {point} {n}\n"
                lines[799 - n * 40] = f"# and at the end, {point} {n}\n"
                _replace(ws / "a.py", "".join(lines).encode())
                (ws / f"copy{round_}-{n}").mkdir()
                _replace(ws / f"copy{round_}-{n}" / "a.py", "".join(lines).encode() + b"#\n")
                states[s.checkpoint().id] = tree_state(ws)
        assert d.proc.wait(timeout=60) == -9  # the idle repack reached the crash point
    pack = Pack(str(pack_of(tmp_path / "root" / "blobs")))
    try:
        assert pack._one("SELECT count(*) FROM objects WHERE kind = ?", (COPIES,))[0] > 0
    finally:
        pack.close()
    d = DaemonProcess(tmp_path / "root").start()
    with d.client() as c:
        for cp, state in states.items():
            c.restore(session, cp, acknowledge_side_effects=True)
            assert tree_state(ws) == state
        assert c.fsck()["problems"] == []
    assert d.stop() == 0


def test_a_repack_step_stops_between_rows_when_a_call_arrives(tmp_path):
    """The step asks ``idle()`` between rows: a call that arrives waits for one row's
    work at most, and the mark covers only the rows encoded."""
    blobs = LocalBlobStore(str(tmp_path / "b"))
    for i in range(10):
        blobs.put_bytes(_text(300, f"file {i}"))
    blobs.sync()
    answers = iter([True] * (10 + 3) + [False] * 100)  # all 10 read, 3 encoded
    assert Repacker(blobs).step(lambda: next(answers)) is False
    assert blobs.pack.mark("repacked") == 3
    repacker = Repacker(blobs)
    while repacker.step():
        pass
    assert blobs.pack.mark("repacked") == 10


def test_a_repack_step_stops_between_a_rows_encodings_when_a_call_arrives(
        tmp_path, monkeypatch):
    """A row is encoded against each candidate base in turn, each at zstd's strongest
    level (half a second for a blob of 1 MiB): the step asks ``idle()`` before each,
    not only before the row (0.7.37 tried every candidate of a row a call waited on),
    and the mark leaves that row for the next idle moment."""
    blobs = LocalBlobStore(str(tmp_path / "b"))
    versions = [_text(300, "v0")]
    for i in range(1, 3):  # each version a delta from the one before: its candidate
        versions.append(versions[-1] + _text(5, f"v{i}"))
    digests = [blobs.put_bytes(versions[0])]
    for data in versions[1:]:
        digests.append(blobs.put_bytes(data, base=digests[-1]))
    blobs.sync()
    calls: list[None] = []
    encoded: list[int] = []  # at which call to idle() each candidate was tried
    monkeypatch.setattr(repack, "best_delta",
                        lambda *a, **kw: encoded.append(len(calls)) or best_delta(*a, **kw))

    def idle() -> bool:  # 3 reads, rows 1 and 2; then the call, before row 2's candidate
        calls.append(None)
        return len(calls) <= 5

    assert Repacker(blobs).step(idle) is False
    assert encoded == []  # no candidate of row 2 was tried
    assert blobs.pack.mark("repacked") == 1
    monkeypatch.undo()
    repacker = Repacker(blobs)
    while repacker.step():
        pass
    assert blobs.pack.mark("repacked") == 3
    _all_read_back(blobs, dict(zip(digests, versions, strict=True)))


def test_a_repack_step_reads_no_row_once_a_call_has_arrived(tmp_path, monkeypatch):
    """A row's read rebuilds and verifies a blob, which may be large: the step asks
    ``idle()`` before each read too, not only before each encoding (0.7.26 read its
    whole batch of 32 rows first, while a call waited)."""
    blobs = LocalBlobStore(str(tmp_path / "b"))
    for i in range(12):
        blobs.put_bytes(_text(300, f"file {i}"))
    blobs.sync()
    reads: list[str] = []
    read = blobs.pack.read
    monkeypatch.setattr(blobs.pack, "read", lambda digest: reads.append(digest) or read(digest))
    at_the_call: list[int] = []

    def idle() -> bool:  # a call arrives once two rows have been read
        if len(reads) < 2:
            return True
        at_the_call.append(len(reads))
        return False

    assert Repacker(blobs).step(idle) is False
    assert at_the_call and len(reads) == at_the_call[0] == 2
    assert blobs.pack.mark("repacked") == 0  # nothing encoded: the next idle moment goes on
    monkeypatch.undo()
    repacker = Repacker(blobs)
    while repacker.step():
        pass
    assert blobs.pack.mark("repacked") == 12


def test_a_delta_base_is_read_with_one_question_per_stored_version(tmp_path, monkeypatch):
    """A put's delta base that is not in memory is read from the pack with one query per
    version it is rebuilt from (0.7.4 asked twice for every one): each query hands the
    interpreter lock away, and a capture holding its turn waits to get it back."""
    blobs = LocalBlobStore(str(tmp_path / "b"))
    first = os.urandom(3000)
    second = first[:1000] + b"an edit in the middle" + first[1000:]
    a = blobs.put_bytes(first)
    b = blobs.put_bytes(second, base=a)
    blobs.sync()
    pack = blobs.pack
    assert pack.row(b).kind == DELTA and pack.row(b).depth == 1
    asked = []
    real = Pack._one
    monkeypatch.setattr(Pack, "_one", lambda self, sql, args: asked.append(sql) or real(
        self, sql, args))
    for digest, data, depth, questions in ((a, first, 0, 1), (b, second, 1, 2)):
        pack.forget(a)
        pack.forget(b)  # as after a restart, or once the recent blobs moved it out
        asked.clear()
        assert pack.base_for(digest) == (data, depth)
        assert len(asked) == questions
    pack.remember(a, first)  # bytes known, depth not: one question, for the depth
    asked.clear()
    assert pack.base_for(a) == (first, 0) and len(asked) == 1
    blobs.close()


def test_whole_rows_are_zstd_frames_and_zlib_rows_from_before_0_7_8_read(tmp_path):
    """A blob stored whole is a zstd frame when that saves an eighth, else raw; a pack
    written before 0.7.8 holds zlib rows (deflate of the hex-packed bytes), read as
    ever."""
    import sqlite3

    from worldline.daemon.storage import packs
    text = b"".join(b"line %d of a source file, %s\n" % (i, b"ab" * 16) for i in range(300))
    noise = os.urandom(3000)
    blobs = LocalBlobStore(str(tmp_path / "b"))
    written = {blobs.put_bytes(text): text, blobs.put_bytes(noise): noise}
    blobs.sync()
    kinds = {d: blobs.pack.row(d).kind for d in written}
    assert kinds == {hashlib.sha256(text).hexdigest(): packs.ZSTD,
                     hashlib.sha256(noise).hexdigest(): packs.RAW}
    assert len(blobs.pack.row(hashlib.sha256(text).hexdigest()).data) < len(text) // 8
    blobs.close()
    old = b"".join(b"an older version, line %d\n" % i for i in range(400))
    db = sqlite3.connect(tmp_path / "b" / "pack.db")  # a row as 0.7.7 wrote it
    db.execute("INSERT INTO objects (digest, kind, base, depth, size, stored_ms, data)"
               " VALUES (?, ?, NULL, 0, ?, 0, ?)",
               (hashlib.sha256(old).digest(), packs.ZLIB, len(old), packs.compress(old)))
    db.commit()
    db.close()
    written[hashlib.sha256(old).hexdigest()] = old
    _all_read_back(blobs, written)
