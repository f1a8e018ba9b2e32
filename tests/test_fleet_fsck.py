"""A fleet's fsck reads the durable copy (issue 62): objects deleted and damaged in the
bucket behind a host whose cache still holds their blobs are found, named with the
checkpoints and files they break, and mended from the host's good copies; a sampled
pass reads its share; a host with a full disk still reports. Real daemons on real
PostgreSQL and moto's S3 server (an emulator)."""

from __future__ import annotations

import os
import time

import pytest
from worldline.client.errors import InvalidArgument, Unavailable

from . import test_fleet
from .fidelity import AGENT_UID, as_agent
from .test_fleet import Fleet, _checkpoints, _edit, _forks_equal, _unstaged

fleet = test_fleet.fleet  # the fleet tests' fixtures: one database and bucket,
own_postgres = test_fleet.own_postgres  # ...or a PostgreSQL cluster of the test's own


@pytest.fixture
def ws(tmp_path):
    w = tmp_path / "ws"
    w.mkdir()
    os.chown(w, AGENT_UID, AGENT_UID)
    as_agent("mkdir -p pkg && for i in $(seq 1 200); do printf 'module %s\\n' $i >"
             " pkg/m$i.py; done", w)
    return w


def _objects(url: str) -> dict[str, list[str]]:
    """The objects the blob index names -> the digests it places in each."""
    import psycopg
    with psycopg.connect(url) as conn:
        names = [r[0] for r in conn.execute("SELECT name FROM blob_objects")]
        rows = conn.execute("SELECT object, digest FROM blob_index").fetchall()
    found: dict[str, list[str]] = {name: [] for name in names}
    for name, digest in rows:
        found.setdefault(name, []).append(digest)
    return found


def _flip(s3, bucket: str, name: str) -> None:
    """One byte of the object, in the middle, changed in place in the bucket."""
    key = f"fleet/{name}"
    body = bytearray(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    body[len(body) // 2] ^= 0xFF
    s3.put_object(Bucket=bucket, Key=key, Body=bytes(body))


def test_a_warm_hosts_fsck_reads_the_bucket_and_mends_it_from_its_cache(
        fleet, ws, tmp_path, s3_server):
    # every pack PUT to the bucket; big files stored whole, as before chunks (chunks.py)
    a = fleet.host("a", env_extra={**_unstaged(tmp_path), "WORLDLINE_CHUNK_FROM": str(1 << 40)})
    as_agent("head -c 9000000 /dev/urandom > big.bin", ws)  # over 8 MiB: an object alone
    s, wanted = _checkpoints(a, ws, 6)
    objects = _objects(fleet.url)
    packs = sorted(n for n in objects if n.startswith("packs/"))
    (big,) = [n for n in objects if n.startswith("blobs/")]
    assert len(packs) >= 6, objects
    s3 = s3_server.client()
    deleted, flipped = packs[1:3], [*packs[3:5], big]
    for name in deleted:
        s3.delete_object(Bucket=fleet.bucket, Key=f"fleet/{name}")
    for name in flipped:
        _flip(s3, fleet.bucket, name)
    with a.client() as ca:
        d = ca.fsck()  # before 0.7.39 read through the cache: {"ok": true}
        assert not d["ok"] and d["source"] == "bucket", d
        assert d["objects_checked"] == d["objects_total"] == len(objects)
        assert d["unchecked"] == [] and d["bytes_read"] > 9_000_000
        broken = {b["digest"]: b for b in d["broken"]}
        for name in deleted:
            assert all(broken[x]["state"] == "missing" and broken[x]["object"] == name
                       for x in objects[name]), name
        for name in flipped:  # a byte changed spoils its entry (and those built on it)
            assert any(broken.get(x, {}).get("state") == "damaged" for x in objects[name]), name
        for name in deleted + flipped:
            assert any(name in p for p in d["problems"]), name
        assert {b["object"] for b in d["broken"]} == set(deleted + flipped)
        # each names the checkpoints and files it breaks
        (digest,) = objects[big]
        assert {f["path"] for f in broken[digest]["files"]} == {"big.bin"}
        assert set(wanted) <= set(broken[digest]["checkpoints"])
        assert all(b["checkpoints"] and b["files"] for b in d["broken"]), d["broken"]
        files = {f["path"] for b in d["broken"] for f in b["files"]}
        assert any(p.startswith("pkg/m") or p.startswith("new") for p in files), files
        # the quick check goes through the cache, which holds every blob whole
        quick = ca.fsck(cached=True)
        assert quick["ok"] and quick["source"] == "cache", quick
        mended = ca.fsck(repair=True)
        assert mended["ok"] and mended["not_repaired"] == [], mended
        new = {b["mended_to"] for b in mended["broken"]}
        assert len(mended["repaired"]) == len(broken) and all(new), mended
        assert not new & set(objects)  # new names: nothing overwritten in place
        again = ca.fsck()
        assert again["ok"] and again["broken"] == [], again
    keys = {k.removeprefix("fleet/") for k in s3_server.keys(fleet.bucket)}
    assert new <= keys and not set(deleted) & keys
    # a host with an empty cache forks every checkpoint byte for byte from the bucket
    b = fleet.host("b")
    _forks_equal(b, s.id, wanted, tmp_path, every=1)
    with b.client() as cb:
        assert cb.fsck()["ok"]


def test_a_sampled_fsck_reads_its_share_of_the_objects(fleet, ws, tmp_path):
    a = fleet.host("a", env_extra=_unstaged(tmp_path))
    _checkpoints(a, ws, 8)
    total = len(_objects(fleet.url))
    with a.client() as ca:
        whole = ca.fsck()
        assert whole["ok"] and whole["objects_checked"] == total
        parts = [ca.fsck(read_data_subset=f"{n}/3") for n in (1, 2, 3)]
        assert all(p["ok"] and p["read_data_subset"] == f"{n}/3"
                   for n, p in enumerate(parts, 1))
        assert sum(p["objects_checked"] for p in parts) == total  # each object once
        assert sum(p["bytes_read"] for p in parts) == whole["bytes_read"]
        assert sum(p["blobs_checked"] for p in parts) == whole["blobs_checked"]
        shares = [ca.fsck(read_data_subset="50%")["objects_checked"] / total
                  for _ in range(8)]
        assert 0.25 <= sum(shares) / len(shares) <= 0.75, shares
        assert ca.fsck(read_data_subset="100%")["objects_checked"] == total
        for wrong in ("0%", "150%", "4/3", "0/2", "half"):
            with pytest.raises(InvalidArgument):
                ca.fsck(read_data_subset=wrong)
        with pytest.raises(InvalidArgument):  # a data root to mend from, with no repair
            ca.fsck(repair_from=str(a.root))
        with pytest.raises(InvalidArgument):  # a folder that is no data root
            ca.fsck(repair=True, repair_from=str(tmp_path))


def _fill(folder) -> None:
    """Write until the file system says it is full, to its last block."""
    fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for chunk in (1 << 20, 4096, 1):
            try:
                while True:
                    os.write(fd, b"\0" * chunk)
            except OSError:
                pass
    finally:
        os.close(fd)


def test_fsck_on_a_full_disk_reports_and_mends_from_another_data_root(
        fleet, ws, tmp_path, tmpfs, s3_server):
    a = fleet.host("a", env_extra=_unstaged(tmp_path))
    as_agent("head -c 3000000 /dev/urandom > large.bin", ws)  # a file in the cache
    s, wanted = _checkpoints(a, ws, 4)
    assert a.stop() == 0  # a's data root: a copy to mend from
    objects = _objects(fleet.url)
    lost = sorted(n for n in objects if n.startswith("packs/"))[0]
    small_disk = tmpfs(tmp_path / "small", "64m")
    c = Fleet(small_disk, fleet.url, fleet.bucket, fleet.env).host("c")  # an empty cache
    try:
        _fill(small_disk)
        s3_server.client().delete_object(Bucket=fleet.bucket, Key=f"fleet/{lost}")
        with c.client() as cc:
            d = cc.fsck()  # before 0.7.39: RESOURCE_EXHAUSTED (fetched into the cache)
            assert not d["ok"] and d["unchecked"] == [], d
            assert {b["object"] for b in d["broken"]} == {lost}
            assert d["objects_checked"] == d["objects_total"] == len(_objects(fleet.url))
            quick = cc.fsck(cached=True)  # no room in the cache: verified in memory
            assert not quick["ok"] and quick["source"] == "cache"
            assert quick["broken"] and quick["unchecked"] == [], quick
            assert all(any(x in p for p in quick["problems"]) for x in objects[lost]), quick
            import psycopg
            from worldline.daemon.storage.postgres_db import LOCK_GC
            with psycopg.connect(fleet.url, autocommit=True) as other_host:  # collecting
                other_host.execute("SELECT pg_advisory_lock(%s)", (LOCK_GC,))
                held = cc.fsck(repair=True, repair_from=str(a.root))
                other_host.execute("SELECT pg_advisory_unlock(%s)", (LOCK_GC,))
            assert not held["ok"] and held["repaired"] == [], held  # reported, not mended
            assert len(held["not_repaired"]) == len(objects[lost]), held
            cold = cc.fsck(repair=True)  # c holds no copy of what was lost
            assert not cold["ok"] and cold["repaired"] == []
            assert len(cold["not_repaired"]) == len(objects[lost]), cold
            mended = cc.fsck(repair=True, repair_from=str(a.root))
            assert mended["ok"] and len(mended["repaired"]) == len(objects[lost]), mended
    finally:
        c.stop()
    _forks_equal(fleet.host("b"), s.id, wanted, tmp_path, every=1)


def test_postgresql_away_a_call_waits_its_timeout_and_is_served_soon_after_it_is_back(
        own_postgres, ws):
    """A call waits for a connection up to 10 s, then UNAVAILABLE; once the server is
    back, the pool (trying every second, not after 1, 2, 4, 8, ... s) serves the next
    call within about a second."""
    cluster, f = own_postgres
    with f.host("a").client() as ca:
        s = ca.create_session(str(ws))
        cluster.stop("immediate")
        waits = []
        while not waits or waits[-1] < 9:  # broken connections fail at once, then a
            t = time.monotonic()           # call waits for a new one, 10 s
            with pytest.raises(Unavailable):
                ca.list_sessions()
            waits.append(time.monotonic() - t)
            assert len(waits) < 10, waits
        assert max(waits) < 11.5, waits
        cluster.start()
        back = time.monotonic()
        while True:
            try:
                ca.list_sessions()
                break
            except Unavailable:
                assert time.monotonic() - back < 30, "never served again"
                time.sleep(0.05)
        served = time.monotonic() - back
        assert served < 2.0, served  # 3.4 s with the pool's own backoff
        _edit(ws, 1)
        s.checkpoint()


def test_a_host_connecting_as_an_ordinary_role_makes_its_tables_and_serves(
        pg_cluster, tmp_path, ws, s3_server):
    """docs/fleet.md's set-up: the hosts connect as a role of their own (LOGIN, owner of
    the database), not the superuser, whose reserved slots stay an operator's."""
    import uuid

    import psycopg
    role = "wl_role_" + uuid.uuid4().hex[:8]
    with psycopg.connect(pg_cluster.url(), autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN CONNECTION LIMIT 40")
        conn.execute(f"CREATE DATABASE {role} OWNER {role}")
    url = f"postgresql://{role}@/{role}?host={pg_cluster.dir}"
    f = Fleet(tmp_path, url, s3_server.new_bucket(), s3_server.env)
    try:
        with f.host("a").client() as ca:
            s = ca.create_session(str(ws))
            _edit(ws, 1)
            s.checkpoint()
            ca.gc()
            assert ca.fsck()["ok"]
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user"
                                ).fetchone() == (False,)
            assert conn.execute("SELECT count(*) FROM checkpoints").fetchone()[0] >= 2
    finally:
        f.stop_all()
