"""Big files stored as content-defined chunks (daemon/capture/chunks.py): the cuts, and
a real daemon capturing, restoring, deduplicating, checking and diffing them. The
daemons here chunk from 256 KiB with 16 KiB chunks (WORLDLINE_CHUNK_FROM/_AVG), so the
files stay small."""

from __future__ import annotations

import hashlib
import os
import random
import socket
import threading
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest
from worldline.daemon.capture import chunks

from tests.conftest import DaemonProcess, corrupt_blob, stored_blobs

SMALL = {"WORLDLINE_CHUNK_FROM": str(256 << 10), "WORLDLINE_CHUNK_AVG": str(16 << 10)}
AVG = 16 << 10
SIZES = (AVG // 4, AVG, AVG * 4, (AVG).bit_length() - 1)


def cut(data: bytes) -> list[bytes]:
    """The chunks a daemon of ``SMALL`` cuts a dense file of ``data`` into."""
    from worldline.daemon._codec import cdc_cuts
    ends = cdc_cuts(data, *SIZES, True)
    return [data[a:b] for a, b in zip([0] + ends, ends, strict=False)]


def test_the_c_chunker_cuts_where_its_python_twin_does():
    from worldline.daemon._codec import cdc_cuts
    rng = random.Random(61)
    for min_, avg, max_ in ((64, 256, 1024), (1024, 4096, 16384), (0, 64, 64)):
        bits = avg.bit_length() - 1
        for size in (0, 1, max_ - 1, max_, 3 * max_ + 7, 200_000):
            data = rng.randbytes(size)
            for last in (True, False):
                assert cdc_cuts(data, min_, avg, max_, bits, last) == \
                    chunks.cuts_python(data, min_, avg, max_, bits, last)
    low = bytes(300_000)  # no cut ever found: every chunk is max long
    assert cdc_cuts(low, 1024, 4096, 16384, 12, True) == \
        chunks.cuts_python(low, 1024, 4096, 16384, 12, True)


def test_an_insertion_leaves_the_chunks_after_it_as_they_were():
    rng = random.Random(7)
    data = rng.randbytes(4 << 20)
    before = cut(data)
    middle = len(data) // 2
    after = cut(data[:middle] + rng.randbytes(4096) + data[middle:])
    sizes = [len(c) for c in before]
    assert AVG // 4 <= min(sizes[:-1]) and max(sizes) <= AVG * 4
    assert AVG // 2 < len(data) / len(before) < AVG * 3
    new = set(after) - set(before)
    assert sum(map(len, new)) <= 4096 + 3 * AVG * 4  # the chunks around the insertion
    assert len(new) <= 4
    later = len(before) // 2 - 3  # every chunk after the insertion's: the same
    assert after[-later:] == before[-later:]


def _metrics_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def chunking(tmp_path):
    """A daemon chunking small files, its metrics served: (daemon, metrics URL)."""
    port = _metrics_port()
    d = DaemonProcess(tmp_path / "root", extra=["--metrics-listen", f"127.0.0.1:{port}"],
                      env=SMALL)
    d.start()
    yield d, f"http://127.0.0.1:{port}/metrics"
    assert d.stop() == 0


def _sample(url: str, name: str) -> float:
    for line in urllib.request.urlopen(url, timeout=10).read().decode().splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _pack_bytes(root: Path) -> int:
    """Bytes the data root's blob store holds: its pack's rows and its blob files."""
    import sqlite3

    from tests.conftest import pack_of
    files = sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(root / "blobs")
                if len(os.path.basename(d)) == 2 for n in names)
    db = sqlite3.connect(f"file:{pack_of(root / 'blobs')}?mode=ro", uri=True)
    try:
        return files + db.execute(
            "SELECT coalesce(sum(length(data)), 0) FROM objects").fetchone()[0]
    finally:
        db.close()


def test_a_big_file_costs_what_changed_and_restores_from_the_file_on_disk(
        chunking, tmp_path):
    d, metrics = chunking
    ws = tmp_path / "ws"
    ws.mkdir()
    data = random.Random(1).randbytes(3 << 20)
    big = ws / "big.bin"
    big.write_bytes(data)
    os.chmod(big, 0o640)
    os.utime(big, ns=(1_600_000_000_123_456_789, 1_600_000_000_123_456_789))
    with d.client() as c:
        s = c.create_session(str(ws))
        first = s.checkpoint()
        stored = _pack_bytes(d.root)
        changed = bytearray(data)
        changed[1_000_000] ^= 0xFF
        big.write_bytes(changed)
        second = s.checkpoint()
        grew = _pack_bytes(d.root) - stored
        assert grew < 4 * AVG + 32 << 10  # a chunk, a page, a map, trees: not 3 MiB
        assert c.read_file(second.id, "big.bin") == bytes(changed)
        fork = c.fork(second.id, workspace=str(tmp_path / "fork"))
        forked = Path(fork.workspace) / "big.bin"
        assert forked.read_bytes() == bytes(changed)
        with open(forked, "r+b") as f:  # the fork's own change, checkpointed in chunks
            f.seek(10)
            f.write(b"fork")
        assert c.read_file(fork.checkpoint().id, "big.bin")[10:14] == b"fork"
        patch = c.diff(first.id, second.id, patch=True)
        text = patch.patch
        assert "Binary files a/big.bin and b/big.bin differ" in text
        assert "bytes" in text and "of 3145728" in text
        copied = _sample(metrics, "worldline_restore_copied_bytes_total")
        s.restore(first.id)
        assert big.read_bytes() == data
        st = big.stat()
        assert (st.st_mode & 0o7777, st.st_mtime_ns) == (0o640, 1_600_000_000_123_456_789)
        # all but the changed chunk came from the file on disk
        assert _sample(metrics, "worldline_restore_copied_bytes_total") - copied \
            >= len(data) - 4 * AVG


def _held_daemon(tmp_path):
    """A daemon chunking small files that holds its restores at ``restore.chunk_source``
    when asked (``_held_at_chunk_source``); and its pause folder."""
    pauses = tmp_path / "pauses"
    pauses.mkdir()
    d = DaemonProcess(tmp_path / "root", env={
        **SMALL, "WORLDLINE_FAULTS": "restore.chunk_source~",
        "WORLDLINE_PAUSE_DIR": str(pauses), "WORLDLINE_PAUSE_TIMEOUT": "20"}).start()
    return d, pauses


def _a_byte_changed_since(c, ws, big, data: bytes, at: int):
    """A session over ``ws`` checkpointed with ``big`` holding ``data``, then again with
    the byte at ``at`` changed: the session and its first checkpoint."""
    s = c.create_session(str(ws))
    first = s.checkpoint()
    big.write_bytes(data[:at] + b"x" + data[at + 1:])
    s.checkpoint()
    return s, first


@contextmanager
def _held_at_chunk_source(pauses, restore):
    """``restore()`` run in a thread and held once the file on disk is open as the
    source of its chunks (the pause point ``restore.chunk_source``): the block acts as
    the agent there; on leaving it the restore goes on. Yields the list the restore's
    answer is put in."""
    (pauses / "restore.chunk_source.hold").touch()
    out: list = []
    done = threading.Thread(target=lambda: out.append(restore()))
    done.start()
    deadline = time.monotonic() + 20
    while not (pauses / "restore.chunk_source.reached").exists():
        assert time.monotonic() < deadline and done.is_alive()
        time.sleep(0.005)
    try:
        yield out
    finally:
        (pauses / "restore.chunk_source.go").touch()
        done.join(30)


def test_a_range_changed_under_the_restore_is_written_from_the_store(tmp_path):
    """A restore copies from the file on disk only the chunks it reads back equal to
    their digests: the agent writing into the file (same inode, its time put back, so
    nothing else tells) after the restore checked it and before it copies still gets
    the checkpoint's bytes."""
    d, pauses = _held_daemon(tmp_path)
    ws = tmp_path / "ws"
    ws.mkdir()
    data = random.Random(2).randbytes(1 << 20)
    big = ws / "big.bin"
    big.write_bytes(data)
    try:
        with d.client() as c:
            s, first = _a_byte_changed_since(c, ws, big, data, 400_000)
            with _held_at_chunk_source(pauses, lambda: s.restore(first.id)) as out:
                st = big.stat()
                with open(big, "r+b") as f:  # the agent scribbles where the plan trusts it,
                    f.seek(800_000)
                    f.write(b"\1" * 100)
                os.utime(big, ns=(st.st_atime_ns, st.st_mtime_ns))  # and covers its tracks
        assert out and not out[0].warnings, out
        assert big.read_bytes() == data
    finally:
        assert d.stop() == 0


def test_a_big_sparse_file_is_restored_sparse(chunking, tmp_path):
    d, _ = chunking
    ws = tmp_path / "ws"
    ws.mkdir()
    rng = random.Random(3)
    runs = {0: rng.randbytes(300_000), 20 << 20: rng.randbytes(200_000),
            (40 << 20) - 5000: rng.randbytes(5000)}
    sparse_file = ws / "disk.img"
    with open(sparse_file, "wb") as f:
        f.truncate(40 << 20)
        for at, run in runs.items():
            f.seek(at)
            f.write(run)
    want = sparse_file.read_bytes()
    with d.client() as c:
        s = c.create_session(str(ws))
        first = s.checkpoint()
        sparse_file.unlink()
        (ws / "other").write_text("x")
        s.checkpoint()
        s.restore(first.id)
        fork = c.fork(first.id, workspace=str(tmp_path / "fork"))
        forked = Path(fork.workspace) / "disk.img"
        assert forked.read_bytes() == want
        assert forked.stat().st_blocks * 512 < 4 << 20
    st = sparse_file.stat()
    assert st.st_size == 40 << 20
    assert st.st_blocks * 512 < 4 << 20  # holes stayed holes
    assert sparse_file.read_bytes() == want


def test_chunks_are_shared_across_sessions_and_an_insertion(chunking, tmp_path):
    d, _ = chunking
    data = random.Random(4).randbytes(2 << 20)
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    (one / "a.db").write_bytes(data)
    (two / "b.db").write_bytes(data[:1 << 20] + b"inserted" * 512 + data[1 << 20:])
    with d.client() as c:
        c.create_session(str(one)).checkpoint()
        before, rows = _pack_bytes(d.root), stored_blobs(d.root)
        c.create_session(str(two)).checkpoint()
        added, new_rows = _pack_bytes(d.root) - before, stored_blobs(d.root) - rows
    assert added < 4096 + 3 * 4 * AVG + (32 << 10)  # chunks around the insertion, pages
    assert new_rows < 16  # of ~128 chunks


def test_fsck_names_the_files_and_checkpoints_a_corrupt_chunk_breaks(chunking, tmp_path):
    d, _ = chunking
    ws = tmp_path / "ws"
    ws.mkdir()
    data = random.Random(5).randbytes(1 << 20)
    (ws / "data.bin").write_bytes(data)
    with d.client() as c:
        s = c.create_session(str(ws))
        cp = s.checkpoint()
        assert c.fsck()["ok"]
        chunk = cut(data)[3]
        digest = hashlib.sha256(chunk).hexdigest()
        corrupt_blob(d.root / "blobs", digest, b"rot" * 10)
        report = c.fsck()
    assert not report["ok"]
    broken = [b for b in report["broken"] if b["digest"] == digest]
    assert broken, report
    assert {"checkpoint_id": cp.id, "path": "data.bin"} in broken[0]["files"]


def test_a_whole_blob_big_file_of_an_older_root_reads_and_extends(tmp_path):
    """A data root whose big file is one whole blob (as 0.7 stored it: a daemon that
    never chunks writes it so) is read, restored and checkpointed in chunks after."""
    root = tmp_path / "root"
    ws = tmp_path / "ws"
    ws.mkdir()
    data = random.Random(6).randbytes(2 << 20)
    (ws / "model.bin").write_bytes(data)
    old = DaemonProcess(root, env={"WORLDLINE_CHUNK_FROM": str(1 << 40)}).start()
    try:
        with old.client() as c:
            s = c.create_session(str(ws))
            whole = s.checkpoint()
            sid = s.id
    finally:
        assert old.stop() == 0
    blob = root / "blobs" / hashlib.sha256(data).hexdigest()[:2]
    assert (blob / hashlib.sha256(data).hexdigest()[2:]).exists()  # a whole-file blob
    new = DaemonProcess(root, env=SMALL).start()
    try:
        with new.client() as c:
            assert c.read_file(whole.id, "model.bin") == data
            changed = data[:100] + b"!" + data[101:]
            (ws / "model.bin").write_bytes(changed)
            s = c.get_session(sid)
            chunked = s.checkpoint()
            assert c.read_file(chunked.id, "model.bin") == changed
            assert "Binary files" in c.diff(whole.id, chunked.id, patch=True).patch
            s.restore(whole.id)
            assert (ws / "model.bin").read_bytes() == data
            s.restore(chunked.id)
            assert (ws / "model.bin").read_bytes() == changed
            assert c.fsck()["ok"]
            c.gc()
            assert c.fsck()["ok"]
    finally:
        assert new.stop() == 0


def test_a_chunked_file_checkpointed_on_one_host_is_forked_on_another(
        tmp_path, postgres_url, s3_server):
    """On a fleet the chunks go to the bucket with the checkpoint; another host, its
    cache empty, forks the file from them; fsck reads them back from the bucket."""
    from tests.test_fleet import Fleet
    fleet = Fleet(tmp_path, postgres_url, s3_server.new_bucket(), s3_server.env)
    try:
        a = fleet.host("a", env_extra=SMALL)
        b = fleet.host("b", env_extra=SMALL)
        ws = tmp_path / "ws"
        ws.mkdir()
        data = random.Random(8).randbytes(1 << 20)
        (ws / "big.bin").write_bytes(data)
        with a.client() as ca, b.client() as cb:
            s = ca.create_session(str(ws))
            s.checkpoint()
            changed = data[:700_000] + b"?" + data[700_001:]
            (ws / "big.bin").write_bytes(changed)
            cp = s.checkpoint()
            fork = cb.get_session(s.id).fork(cp.id, workspace=str(tmp_path / "fork"))
            assert (Path(fork.workspace) / "big.bin").read_bytes() == changed
            report = cb.fsck()
            assert report["ok"], report["problems"]
    finally:
        fleet.stop_all()


def test_the_repack_leaves_raw_chunks_alone_and_encodes_the_rest(tmp_path, monkeypatch):
    """Chunks of random bytes, stored raw (the checkpoint's zstd found nothing to take),
    are not encoded again at the strongest level by the idle repack; compressible rows
    still are."""
    from worldline.daemon.storage import repack
    from worldline.daemon.storage.blobs import LocalBlobStore
    blobs = LocalBlobStore(str(tmp_path / "b"))
    rng = random.Random(9)
    raw = [blobs.put_bytes(rng.randbytes(64 << 10)) for _ in range(8)]
    text = blobs.put_bytes(b"".join(b"line %d of a log\n" % i for i in range(4000)))
    blobs.sync()
    encoded: list[int] = []
    real = repack.zstd_whole

    def counted(data, level):
        encoded.append(len(data))
        return real(data, level)
    monkeypatch.setattr(repack, "zstd_whole", counted)
    repacker = repack.Repacker(blobs)
    while repacker.step():
        pass
    assert 64 << 10 not in encoded and len(encoded) == 1  # the log only
    assert [blobs.read_bytes(d) for d in raw + [text]]


def test_a_file_that_shrank_while_read_is_mapped_as_long_as_what_was_read(tmp_path):
    """A capture reads a big file as far as its size at the open; a file truncated
    after that (here: ``size`` says more than the file holds) is mapped as far as the
    reads went, dense or sparse: never a map whose size runs past its pieces into
    zeros the file never held."""
    from worldline.daemon.storage.blobs import LocalBlobStore
    blobs = LocalBlobStore(str(tmp_path / "blobs"))
    data = random.Random(9).randbytes(300_000)
    dense = tmp_path / "dense.bin"
    dense.write_bytes(data)
    holey = tmp_path / "holey.bin"
    with open(holey, "wb") as f:
        f.write(data[:100_000])
        f.truncate(1 << 20)  # a hole to its end
    for path, claimed, dense_, want in ((dense, 900_000, True, 300_000),
                                        (holey, 2 << 20, False, 1 << 20)):
        fd = os.open(path, os.O_RDONLY)
        try:
            ref, size = chunks.capture(fd, claimed, blobs, True, dense=dense_)
        finally:
            os.close(fd)
        mapped, pieces = chunks.read_map(blobs, ref)
        assert (size, mapped) == (want, want), path
        assert pieces[-1][0] + pieces[-1][1] <= mapped
    blobs.close()


@pytest.mark.parametrize("swap", ["truncate", "grow", "symlink", "root_file"])
def test_a_restore_held_with_the_file_on_disk_open_as_its_source(tmp_path, swap):
    """Held once the file on disk is open as the source of its chunks: the agent cuts
    it short or grows it (its time put back), or puts a symlink to a secret or a
    root-owned 0600 file (a second name of root's) at its name. What is restored is
    the checkpoint's bytes or nothing (the name left to what is there now, said in a
    warning): never the secret's bytes, and the secret as it was."""
    d, pauses = _held_daemon(tmp_path)
    ws, keep = tmp_path / "ws", tmp_path / "keep"
    ws.mkdir()
    keep.mkdir(mode=0o700)
    secret = keep / "secret"
    secret.write_bytes(random.Random(4).randbytes(1 << 20))
    os.chmod(secret, 0o600)
    before = secret.read_bytes()
    data = random.Random(3).randbytes(1 << 20)
    big = ws / "big.bin"
    big.write_bytes(data)
    try:
        with d.client() as c:
            s, first = _a_byte_changed_since(c, ws, big, data, 300_000)
            with _held_at_chunk_source(pauses, lambda: s.restore(first.id)) as out:
                st = big.stat()
                if swap == "truncate":
                    os.truncate(big, 200_000)
                elif swap == "grow":
                    with open(big, "ab") as f:
                        f.write(b"more" * 1000)
                if swap in ("truncate", "grow"):  # its time put back: the name still passes
                    os.utime(big, ns=(st.st_atime_ns, st.st_mtime_ns))
                else:
                    big.unlink()
                    if swap == "symlink":
                        big.symlink_to(secret)
                    else:
                        os.link(secret, ws / "second")
                        os.rename(ws / "second", big)
        assert out, "the restore did not answer"
        if swap in ("truncate", "grow"):  # the same file, changed in place: written over
            assert big.read_bytes() == data and not out[0].warnings
        else:  # another file at the name: left alone, said
            assert out[0].warnings
            assert big.is_symlink() or big.stat().st_ino == secret.stat().st_ino
        st = secret.stat()
        assert (st.st_uid, st.st_mode & 0o7777, secret.read_bytes()) == (0, 0o600, before)
    finally:
        assert d.stop() == 0
