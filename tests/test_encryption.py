"""Encryption at rest of blobs, packs and the bucket (docs/encryption.md): a real
daemon over its socket started with ``--encryption-key``; a wrong or missing key
refused at start; ``worldline key rotate``; fsck finding a flipped byte in a sealed
row; a fleet's bucket (moto's S3 server, an emulator) holding no plaintext."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest
from worldline.client.errors import DataLoss, InvalidArgument
from worldline.daemon.storage import crypto
from worldline.daemon.storage.blobs import LocalBlobStore

from .conftest import WORLDLINE, DaemonProcess, pack_of

CANARY = b"canary-7f3e9b21-do-not-leak"


def _key(path: Path) -> str:
    path.write_text(crypto.new_key().hex() + "\n")
    os.chmod(path, 0o600)
    return str(path)


def _workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "notes.txt").write_bytes(b"a line with " + CANARY + b"\n")
    (ws / "big.bin").write_bytes(os.urandom(1 << 20) + CANARY + os.urandom(1 << 20))
    for i in range(20):
        (ws / f"m{i}.py").write_text(f"print({i})\n" * 50)
    return ws


def _files_holding(root: Path, needle: bytes, where=lambda p: True) -> list[str]:
    return [str(p) for p in root.rglob("*")
            if p.is_file() and where(p) and needle in p.read_bytes()]


def _start_fails(root: Path, *extra: str) -> subprocess.CompletedProcess:
    res = subprocess.run(WORLDLINE + ["daemon", "--root", str(root), *extra],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode != 0, res.stderr
    return res


def _checkpointed(d: DaemonProcess, ws: Path) -> tuple[str, str]:
    with d.client() as c:
        s = c.create_session(str(ws))
        c.record_tool_call(s.id, "write_file", {"path": "x", "text": CANARY.decode()})
        cp = c.checkpoint(s.id, label="one",
                          messages=[{"role": "user", "content": CANARY.decode()}])
        (ws / "notes.txt").write_bytes(b"edited " + CANARY + b"\n")
        c.checkpoint(s.id, label="two")
        return s.id, cp.id


def _blob_rows(root: Path) -> list[tuple[bytes, bytes]]:
    db = sqlite3.connect(f"file:{pack_of(root / 'blobs')}?mode=ro", uri=True)
    try:
        return [(bytes(d), bytes(b)) for d, b in db.execute("SELECT digest, data FROM objects")]
    finally:
        db.close()


def test_a_keyed_data_root_keeps_no_plaintext_in_its_blobs_and_refuses_other_keys(tmp_path):
    root, ws = tmp_path / "root", _workspace(tmp_path)
    key = _key(tmp_path / "key")
    d = DaemonProcess(root, ["--encryption-key", key]).start()
    try:
        sid, first = _checkpointed(d, ws)
        with d.client() as c:
            c.restore(sid, first)
        assert (ws / "notes.txt").read_bytes() == b"a line with " + CANARY + b"\n"
    finally:
        d.stop()
    assert (root / "keyring").exists()
    # blobs: the big file's blob file and every row of the pack are sealed
    files = [p for p in (root / "blobs").rglob("*") if p.is_file() and len(p.parent.name) == 2]
    assert files and not [p for p in files if CANARY in p.read_bytes()]
    rows = _blob_rows(root)
    assert rows and all(data[:1] == crypto.VERSION for _, data in rows)
    assert not [d for d, data in rows if CANARY in data]
    # the name of content is keyed: a guessed file's SHA-256 is not stored
    import hashlib
    guessed = hashlib.sha256((ws / "notes.txt").read_bytes()).digest()
    assert guessed not in {d for d, _ in rows}

    other = _key(tmp_path / "other")
    for extra in ([], ["--encryption-key", other]):  # missing, then wrong: refused
        res = _start_fails(root, *extra)
        assert "error:" in res.stderr and "Traceback" not in res.stderr
    # the right key opens it again, and rotation moves it to another key
    rot = subprocess.run(WORLDLINE + ["key", "rotate", "--root", str(root),
                                      "--encryption-key", key, "--new-key", other],
                         capture_output=True, text=True, timeout=60)
    assert rot.returncode == 0, rot.stderr
    _start_fails(root, "--encryption-key", key)  # the old key opens nothing now
    d = DaemonProcess(root, ["--encryption-key", other]).start()
    try:
        with d.client() as c:
            c.restore(sid, first)
            assert c.fsck()["ok"]
    finally:
        d.stop()


def test_whole_data_root_holds_no_canary(tmp_path):
    """Every file of a keyed data root, its SQLite files and their write-ahead logs
    included: blobs and pack rows (blobs.py, packs.py) and the metadata store's columns
    (the conversation, state, tool arguments: sealed.py)."""
    root, ws = tmp_path / "root", _workspace(tmp_path)
    d = DaemonProcess(root, ["--encryption-key", _key(tmp_path / "key")]).start()
    try:
        _checkpointed(d, ws)
        leaks = _files_holding(root, CANARY)  # while running: the WAL files too
    finally:
        d.stop()
    leaks += _files_holding(root, CANARY)
    assert sorted(set(leaks)) == []


def test_a_chunked_file_is_sealed_chunk_by_chunk_and_restored_by_chunks(tmp_path):
    """A big file under a key: its chunks, its map's pages and its map are sealed like
    every blob (no canary anywhere in the root), and a restore by chunks gives the bytes
    back."""
    root, ws = tmp_path / "root", tmp_path / "ws"
    ws.mkdir()
    body = bytearray(os.urandom(1 << 20) + CANARY + os.urandom(1 << 20))
    (ws / "big.bin").write_bytes(body)
    d = DaemonProcess(root, ["--encryption-key", _key(tmp_path / "key")], env={
        "WORLDLINE_CHUNK_FROM": str(256 << 10), "WORLDLINE_CHUNK_AVG": str(16 << 10)}).start()
    try:
        with d.client() as c:
            s = c.create_session(str(ws))
            first = c.checkpoint(s.id, label="one").id
            body[1 << 19] ^= 0xFF
            (ws / "big.bin").write_bytes(body)
            c.checkpoint(s.id, label="two")
            c.restore(s.id, first)
            assert c.fsck()["ok"]
        leaks = _files_holding(root, CANARY)
    finally:
        d.stop()
    body[1 << 19] ^= 0xFF
    assert (ws / "big.bin").read_bytes() == bytes(body)
    assert sorted(set(leaks + _files_holding(root, CANARY))) == []


def test_a_data_root_in_the_clear_is_not_opened_with_a_key(tmp_path):
    root, ws = tmp_path / "root", _workspace(tmp_path)
    d = DaemonProcess(root).start()
    try:
        _checkpointed(d, ws)
    finally:
        d.stop()
    res = _start_fails(root, "--encryption-key", _key(tmp_path / "key"))
    assert "clear" in res.stderr
    assert not (root / "keyring").exists()


def test_fsck_names_a_sealed_row_with_one_byte_flipped(tmp_path):
    root, ws = tmp_path / "root", _workspace(tmp_path)
    d = DaemonProcess(root, ["--encryption-key", _key(tmp_path / "key")]).start()
    try:
        _checkpointed(d, ws)
        with d.client() as c:
            assert c.fsck()["ok"]
    finally:
        d.stop()
    raw, data = max(_blob_rows(root), key=lambda r: len(r[1]))
    flipped = bytearray(data)
    flipped[len(flipped) // 2] ^= 0x01
    db = sqlite3.connect(pack_of(root / "blobs"))
    with db:
        db.execute("UPDATE objects SET data = ? WHERE digest = ?", (bytes(flipped), raw))
    db.close()
    d.start()
    try:
        with d.client() as c:
            report = c.fsck()
    finally:
        d.stop()
    assert not report["ok"]
    assert any(raw.hex() in p for p in report["problems"]), report["problems"]


def test_a_sealed_blob_file_with_a_flipped_byte_is_data_loss(tmp_path):
    key = crypto.DataKey(crypto.new_key())
    blobs = LocalBlobStore(str(tmp_path / "b"), key=key)
    data = os.urandom(3 << 20)
    digest = blobs.put_bytes(data)
    blobs.sync()
    assert digest == key.address(data) and blobs.read_bytes(digest) == data
    path = tmp_path / "b" / digest[:2] / digest[2:]
    assert path.stat().st_size == len(data) + crypto.OVERHEAD
    raw = bytearray(path.read_bytes())
    raw[-100] ^= 0x01
    os.chmod(path, 0o644)
    path.write_bytes(bytes(raw))
    with pytest.raises(DataLoss):  # (and every read: the contract suite, keyed)
        blobs.verify(digest)
    blobs.close()
    with pytest.raises(DataLoss):  # another key's store: nothing opens
        LocalBlobStore(str(tmp_path / "b"), key=crypto.DataKey(crypto.new_key())
                       ).read_bytes(digest)


def test_a_bad_key_file_is_invalid_argument(tmp_path):
    from worldline.daemon.storage.keyring import open_data_key
    bad = tmp_path / "bad"
    bad.write_text("not a key\n")
    with pytest.raises(InvalidArgument):
        open_data_key(str(tmp_path / "root"), "sqlite", "local", str(bad))


def test_a_keyed_fleet_keeps_no_plaintext_in_its_bucket(tmp_path, postgres_url, s3_server):
    """Two hosts on one bucket, each started with the same key: the first makes the
    fleet's keyring in the bucket, the second finds it; no object, staged or PUT,
    holds the canary; a host with another key is refused."""
    import boto3
    bucket = s3_server.new_bucket()
    key = _key(tmp_path / "key")
    common = ["--store", postgres_url, "--blobs", f"s3://{bucket}/fleet",
              "--lease-seconds", "2", "--encryption-key", key]
    env = s3_server.env
    a = DaemonProcess(tmp_path / "root-a", [*common, "--host-id", "a"], env=env).start()
    b = DaemonProcess(tmp_path / "root-b", [*common, "--host-id", "b"], env=env)
    ws = _workspace(tmp_path)
    try:
        sid, first = _checkpointed(a, ws)
        b.start()
        with b.client() as c:  # a fork on the other host reads the bucket through its key
            fork = c.fork(first, str(tmp_path / "fork"))
            assert CANARY in (tmp_path / "fork" / "notes.txt").read_bytes(), fork
            assert c.fsck()["ok"]
    finally:
        a.stop()
        if b.proc is not None:
            b.stop()
    s3 = boto3.client("s3")
    names = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]]
    assert "fleet/keyring" in names and len(names) > 1
    leaks = [n for n in names
             if CANARY in s3.get_object(Bucket=bucket, Key=n)["Body"].read()]
    assert leaks == []
    for root in (a.root, b.root):  # the hosts' caches: sealed as a data root's blobs
        assert _files_holding(root / "blobs", CANARY) == []
    other = _key(tmp_path / "other")
    _start_fails(tmp_path / "root-c", *common[:-1], other, "--host-id", "c")
    # rotation of the fleet's key: the keyring object re-wrapped; the old key refused
    rot = subprocess.run(WORLDLINE + ["key", "rotate", "--store", postgres_url, "--blobs",
                                      f"s3://{bucket}/fleet", "--root", str(tmp_path / "x"),
                                      "--encryption-key", key, "--new-key", other],
                         capture_output=True, text=True, timeout=60, env={**os.environ, **env})
    assert rot.returncode == 0, rot.stderr
    _start_fails(tmp_path / "root-c", *common, "--host-id", "c")
    c = DaemonProcess(tmp_path / "root-c", [*common[:-1], other, "--host-id", "c"],
                      env=env).start()
    try:
        with c.client() as client:
            client.fork(first, str(tmp_path / "fork-c"))
        assert (tmp_path / "fork-c" / "big.bin").read_bytes() == (ws / "big.bin").read_bytes()
    finally:
        c.stop()


def test_a_large_blob_alone_in_the_bucket_is_the_hosts_sealed_file(request, tmp_path,
                                                                    s3_server):
    """A blob over ALONE goes to the bucket as the cache's sealed stream; another host
    fetches it through its tag and address into its cache, fsck's streamed check and
    the uncached read open it, and one byte flipped in the bucket is named by both."""
    import boto3
    from worldline.daemon.storage.s3_blobs import ALONE
    from worldline.daemon.storage.sqlite_store import SqliteStore

    from .test_blob_contract import s3_blob_store
    key = crypto.DataKey(crypto.new_key())
    index = SqliteStore(str(tmp_path / "meta.db"))
    request.addfinalizer(index.close)
    a = s3_blob_store(request, tmp_path, host="a", index=index, key=key)
    data = os.urandom(ALONE + 1)
    digest = a.put_bytes(data)
    a.sync()
    bucket = a.url[5:].split("/", 1)[0]
    s3 = boto3.client("s3")
    (name,) = [k for k in s3_server.keys(bucket) if k.startswith("fleet/blobs/")]
    body = s3.get_object(Bucket=bucket, Key=name)["Body"].read()
    assert len(body) == len(data) + crypto.OVERHEAD and data[1000:1064] not in body
    b = s3_blob_store(request, tmp_path, host="b", index=index, bucket=bucket, key=key)
    assert b.read_bytes(digest) == data and b.cache.has(digest)
    c = s3_blob_store(request, tmp_path, host="c", index=index, bucket=bucket, key=key)
    assert c.read_uncached(digest) == data
    assert not c.check_objects().broken
    flipped = bytearray(body)
    flipped[len(flipped) // 2] ^= 0x01
    s3.put_object(Bucket=bucket, Key=name, Body=bytes(flipped))
    assert [x.digest for x in c.check_objects().broken] == [digest]
    d = s3_blob_store(request, tmp_path, host="d", index=index, bucket=bucket, key=key)
    with pytest.raises(DataLoss):
        d.read_bytes(digest)
    with pytest.raises(DataLoss):
        d.read_uncached(digest)
    assert not [p for p in (tmp_path / "cache-d").rglob("*") if p.is_file()
                and len(p.parent.name) == 2]  # nothing unverified reached its cache
    from worldline.daemon.storage.keyring import _Bucket
    _Bucket(a.url, "sqlite").write(b"{}", create=True)  # the fleet's keyring: not garbage
    a.compact(older_than=time.time() + 60)  # every object no row names goes
    assert "fleet/keyring" in s3_server.keys(bucket)


def test_the_key_comes_from_systemds_credential_when_no_flag_names_one(tmp_path,
                                                                       monkeypatch):
    from worldline.daemon.storage.config import StorageConfig
    creds = tmp_path / "creds"
    creds.mkdir()
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))
    assert StorageConfig.resolve().encryption_key == ""  # none there: the clear
    _key(creds / "worldline-key")
    assert StorageConfig.resolve().encryption_key == str(creds / "worldline-key")
    assert StorageConfig.resolve(encryption_key="/k").encryption_key == "/k"


def test_a_fleet_in_the_clear_is_not_opened_with_a_key_even_with_its_bucket_empty(
        tmp_path, postgres_url, s3_server):
    """A host killed with its checkpoint's pack staged in PostgreSQL leaves the bucket
    empty: the data in the clear is found in the database, and a keyed start refused."""
    bucket = s3_server.new_bucket()
    common = ["--store", postgres_url, "--blobs", f"s3://{bucket}/fleet", "--host-id", "a"]
    a = DaemonProcess(tmp_path / "root-a", common, env=s3_server.env).start()
    try:
        with a.client() as c:
            ws = tmp_path / "small"
            ws.mkdir()
            (ws / "notes.txt").write_bytes(CANARY)  # a pack small enough to be staged
            s = c.create_session(str(ws))
            c.checkpoint(s.id)
    finally:
        a.kill()
    assert s3_server.keys(bucket) == []
    res = subprocess.run(WORLDLINE + ["daemon", "--root", str(tmp_path / "root-b"), *common,
                                      "--encryption-key", _key(tmp_path / "key")],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, **s3_server.env})
    assert res.returncode != 0 and "clear" in res.stderr, res.stderr
    assert s3_server.keys(bucket) == []  # no keyring made


def test_recovery_finishes_a_sealed_temporarys_rename_only_when_its_tag_verifies(tmp_path):
    """A crash between a blob file's flush and its rename: the next start opens each
    temporary named by a digest (tag and address) and renames only the whole ones."""
    key = crypto.DataKey(crypto.new_key())
    blobs = LocalBlobStore(str(tmp_path / "b"), key=key)
    good, bad = os.urandom(2 << 20), os.urandom(2 << 20)
    d_good, d_bad = blobs.put_bytes(good), blobs.put_bytes(bad)  # pending: not synced
    blobs.close()
    (damaged,) = (tmp_path / "b" / "tmp").glob(f"{d_bad}.*")
    raw = bytearray(damaged.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    os.chmod(damaged, 0o644)
    damaged.write_bytes(bytes(raw))
    again = LocalBlobStore(str(tmp_path / "b"), key=key)  # as the next start
    try:
        assert again.recover() == (1, 1)
        assert again.read_bytes(d_good) == good and not again.has(d_bad)
    finally:
        again.close()


def test_the_stat_cache_keeps_no_symlink_target_nor_xattr_in_the_clear(tmp_path):
    """The stat cache (``<root>/index.db``) remembers each file's ref and xattrs so an
    unchanged file is not read again; a symlink's ref is its target and the xattrs are
    the agent's bytes: under a key neither is written there in the clear."""
    root, ws = tmp_path / "root", _workspace(tmp_path)
    os.symlink("target-" + CANARY.decode(), ws / "link")
    os.setxattr(ws / "notes.txt", "user.note", CANARY)
    d = DaemonProcess(root, ["--encryption-key", _key(tmp_path / "key")]).start()
    try:
        with d.client() as c:
            s = c.create_session(str(ws))
            first = s.checkpoint()
            (ws / "m0.py").write_text("changed\n")
            time.sleep(0.2)  # past the racy window: the next capture trusts the cache
            s.checkpoint()
            os.unlink(ws / "link")
            s.restore(first.id)
            assert os.readlink(ws / "link") == "target-" + CANARY.decode()
            assert os.getxattr(ws / "notes.txt", "user.note") == CANARY
    finally:
        d.stop()
    assert _files_holding(root, CANARY) == []


def test_a_restore_journal_left_by_a_crash_holds_no_plaintext(tmp_path):
    """A restore journals every path it changes as it is and as it will be (a symlink's
    target, xattrs) and the checkpoint it appends (its label): under a key the journal
    a killed restore leaves is sealed, and the next start still completes it."""
    import signal

    from worldline.client.errors import Unavailable
    root, ws = tmp_path / "root", tmp_path / "ws"
    ws.mkdir()
    for i in range(4):
        (ws / f"f{i}.txt").write_text(f"{i}\n")
    os.symlink("one-" + CANARY.decode(), ws / "link")
    d = DaemonProcess(root, ["--encryption-key", _key(tmp_path / "key")],
                      env={"WORLDLINE_FAULTS": "restore.between_files:3"}).start()
    with d.client() as c:
        s = c.create_session(str(ws))
        first = s.checkpoint(label="label-" + CANARY.decode())
        os.unlink(ws / "link")
        os.symlink("two-" + CANARY.decode(), ws / "link")
        for i in range(4):
            (ws / f"f{i}.txt").write_text(f"{i} changed\n")
        s.checkpoint()
        with pytest.raises(Unavailable):  # killed between the files it writes
            s.restore(first.id)
    assert d.proc.wait(15) == -signal.SIGKILL
    d.proc = None
    assert list((root / "journal").glob("*.json"))  # the restore under way, journalled
    assert _files_holding(root / "journal", CANARY) == []
    d.env.pop("WORLDLINE_FAULTS")
    d.start()
    try:
        with d.client() as c:
            assert c.get_session(s.id).needs_attention is None
            assert c.log(s.id)[-1].kind == "restore"
        assert os.readlink(ws / "link") == "one-" + CANARY.decode()
        assert (ws / "f3.txt").read_text() == "3\n"
    finally:
        d.stop()


def test_a_key_file_others_can_read_is_warned_of(tmp_path, caplog):
    path = Path(_key(tmp_path / "key"))
    with caplog.at_level("WARNING", logger="worldline.crypto"):
        crypto.read_kek(str(path))
        assert not caplog.records  # 0600: nothing to say
        os.chmod(path, 0o644)
        assert crypto.read_kek(str(path)) == bytes.fromhex(path.read_text().strip())
    assert [r.levelname for r in caplog.records] == ["WARNING"]


def test_a_rotation_leaves_no_keyring_a_crash_set_aside_under_the_old_key(tmp_path):
    """A keyring is written aside (``keyring.<12 hex>``) and then linked or renamed in:
    one a crash left there holds the data key wrapped by the key of its day, so a
    rotation removes it, and the old key opens no file of the data root."""
    from worldline.daemon.storage import keyring
    root = tmp_path / "root"
    key, new = _key(tmp_path / "key"), _key(tmp_path / "new")
    root.mkdir()
    keyring.open_data_key(str(root), "sqlite", "local", key)
    left = root / "keyring.0123456789ab"  # what a crash before the unlink leaves
    left.write_bytes((root / "keyring").read_bytes())
    keyring.rotate(str(root), "sqlite", "local", key, new)
    old = crypto.read_kek(key)
    opened = []
    for p in root.iterdir():
        try:
            keyring._decode(p.read_bytes(), old, str(p))
            opened.append(p.name)
        except InvalidArgument:
            pass
    assert opened == []
    assert keyring.open_data_key(str(root), "sqlite", "local", new) is not None
