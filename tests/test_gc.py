"""Retention and garbage collection: what is pruned, what is always kept, and gc
running beside live checkpoints losing nothing."""

from __future__ import annotations

import os
import threading
import time

import pytest
from worldline.client import FailedPrecondition

from .conftest import ONLY_FIRST, DaemonProcess, beside, only_the_first_holds, tree_state


@pytest.fixture
def gc_daemon(tmp_path):
    d = DaemonProcess(tmp_path / "root", extra=["--gc-grace", "0.3"]).start()
    yield d
    d.stop()


def test_keep_last_prunes_files_not_history(gc_daemon, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    with gc_daemon.client() as c:
        s = c.create_session(str(ws))
        cps = []
        for i in range(6):
            (ws / "big.bin").write_bytes(os.urandom(200_000))
            cps.append(s.checkpoint(label="kept" if i == 1 else None,
                                    messages=[{"role": "user", "content": f"step {i}"}]))
        fork = c.fork(cps[2].id)
        states = {}
        time.sleep(0.4)
        dry = c.gc(dry_run=True, keep_last=2, keep_labelled=True)
        assert dry["checkpoints_pruned"] == 3 and not any(cp.pruned for cp in c.log(s.id))
        report = c.gc(keep_last=2, keep_labelled=True)
        assert report["checkpoints_pruned"] == 3  # the initial one, cps[0], cps[3]
        assert report["bytes_freed"] >= 2 * 200_000
        pruned = {cp.id for cp in c.log(s.id) if cp.pruned}
        assert pruned == {c.log(s.id)[0].id, cps[0].id, cps[3].id}
        with pytest.raises(FailedPrecondition):
            s.restore(cps[0].id)
        assert [m["content"] for m in c.show(cps[3].id).messages][-1] == "step 3"
        for keep in (cps[1], cps[2], cps[4], cps[5]):  # labelled, fork source, last two
            s.restore(keep.id)
            states[keep.id] = tree_state(ws)
        assert c.fsck()["ok"]
        assert fork.forked_from == cps[2].id


def test_gc_beside_live_checkpoints_loses_nothing(gc_daemon, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    with gc_daemon.client() as c:
        s = c.create_session(str(ws))
        expected = {}
        stop = threading.Event()
        errors = []

        def collect():
            with gc_daemon.client() as g:
                while not stop.is_set():
                    try:
                        g.gc(keep_last=3)
                    except Exception as exc:  # reported below
                        errors.append(exc)
                    time.sleep(0.05)

        collector = threading.Thread(target=collect)
        collector.start()
        try:
            for i in range(60):
                # alternate between a few contents, so checkpoints reuse old blobs that
                # retention has made unreachable: the race gc must not lose
                (ws / "f.txt").write_text(f"content {i % 12}\n")
                (ws / "g.txt").write_text(f"other {i % 3}\n")
                cp = s.checkpoint()
                expected[cp.id] = tree_state(ws)
                time.sleep(0.02)
        finally:
            stop.set()
            collector.join()
        assert not errors
        kept = [cp for cp in c.log(s.id) if not cp.pruned]
        assert len(kept) >= 3
        for cp in kept:
            if cp.id in expected:
                s.restore(cp.id)
                assert tree_state(ws) == expected[cp.id]
        assert c.fsck()["ok"]


def test_gc_never_removes_a_blob_a_checkpoint_is_reusing(tmp_path):
    """Regression: a checkpoint that dedupes against an old, unreachable blob writes
    nothing, so gc could delete that blob between the capture and the commit. The
    checkpoint is held open right there (a pause fault) while gc runs."""
    # gc promises: a blob stored or reused within the grace period is kept; here the
    # checkpoint commits 0.6 s after its reuse, inside a 1 s grace
    d = DaemonProcess(tmp_path / "root", extra=["--gc-grace", "1.0"],
                      env={"WORLDLINE_FAULTS": "checkpoint.after_blobs@0.6:4"}).start()
    ws = tmp_path / "ws"
    ws.mkdir()
    try:
        with d.client() as c:
            s = c.create_session(str(ws))
            (ws / "f.txt").write_text("the old content\n")
            s.checkpoint()  # 1
            (ws / "f.txt").write_text("newer\n")
            s.checkpoint()  # 2
            (ws / "f.txt").write_text("newest\n")
            s.checkpoint()  # 3
            assert c.gc(keep_last=1)["checkpoints_pruned"] >= 2  # the old content unreachable
            time.sleep(1.2)  # and older than the grace period
            (ws / "f.txt").write_text("the old content\n")
            result = {}
            t = threading.Thread(target=lambda: result.setdefault("cp", c.checkpoint(s.id)))
            t.start()  # checkpoint 4: reuses the old blob, then pauses before its commit
            time.sleep(0.3)
            c.gc(keep_last=1)
            t.join()
            (ws / "f.txt").write_text("something else\n")
            s.restore(result["cp"].id)
            assert (ws / "f.txt").read_text() == "the old content\n"
            assert c.fsck()["ok"]
    finally:
        d.stop()


_DRY_RUN = """
import json, os
from collections import Counter
from pathlib import Path
from worldline.daemon import maintenance
from worldline.daemon.main import Daemon

base = Path({base!r})
ws = base / "ws"
ws.mkdir()
daemon = Daemon(str(base / "root"), "unix://" + str(base / "root" / "wl.sock"))
daemon.start()
try:
    world = daemon.world
    sid = world.create_session(str(ws)).id
    f, g = os.urandom(20_000).hex(), os.urandom(20_000).hex()
    for i in range(6):  # f edited each time, g edited, then removed at the fourth
        (ws / "f").write_text(f + f"f's edit {{i}}\\n")
        if i < 3:
            (ws / "g").write_text(g + f"g's edit {{i}}\\n")
        elif i == 3:
            (ws / "g").unlink()
        world.checkpoint(sid)
    reads, read = Counter(), world.trees.read
    world.trees.read = lambda digest, *a, **k: reads.update([digest]) or read(digest, *a, **k)
    keep = maintenance.Retention(keep_last=2)
    dry = maintenance.gc(world, dry_run=True, policy=keep, grace=0)
    dry_reads = dict(reads)
    real = maintenance.gc(world, policy=keep, grace=0)
    again = maintenance.gc(world, policy=keep, grace=0)
finally:
    daemon.stop()
print(json.dumps({{"reads": dry_reads, "dry": dry.__dict__, "real": real.__dict__,
                  "again": again.__dict__}}))
"""


def test_a_dry_run_reports_what_the_sweep_then_frees_walking_once(tmp_path):
    """A dry run with retention reports the blobs and bytes the real run then frees: a
    blob a kept one is a delta of stays, as the sweep keeps it, and a whole unneeded
    chain goes (0.7.26 counted every unneeded blob, by its size before compression);
    it reads each tree once (0.7.26 walked them all twice). An in-process daemon, in
    a fresh interpreter, counts its tree reads."""
    import json

    from .conftest import run_python
    got = json.loads(run_python(_DRY_RUN.format(base=str(tmp_path)), timeout=120))
    assert got["reads"] and max(got["reads"].values()) == 1, got["reads"]
    dry, real, again = got["dry"], got["real"], got["again"]
    assert dry["checkpoints_pruned"] == real["checkpoints_pruned"] == 5  # 7 kept 2
    assert dry["blobs_removed"] == real["blobs_removed"] >= 3, (dry, real)  # g's chain
    assert dry["bytes_freed"] == real["bytes_freed"] > 0, (dry, real)
    assert again["blobs_removed"] == 0, again  # the real run left no garbage behind


@pytest.mark.parametrize("pause", ["restore.planned", "restore.before_commit", "fork.mid"])
def test_a_checkpoint_being_restored_or_forked_is_not_pruned_under_it(tmp_path, pause):
    """Regression, found by `make soak`: a restore to a checkpoint (held before its
    journal, then after its files are written) or a fork of it (its files written),
    while gc prunes by retention a checkpoint that only it names a blob of, stored
    before the grace period. The prune waits for it (in_use.py): the restore or fork
    commits, every checkpoint it names is whole, fsck finds nothing. (0.7.26 pruned
    it and swept the blob, and the checkpoint then committed named a blob that was
    gone, as did every later one through the stat cache.)"""
    d = DaemonProcess(tmp_path / "root", extra=["--gc-grace", "0.5"],
                      env={"WORLDLINE_FAULTS": f"{pause}@2.0"}).start()
    ws = tmp_path / "ws"
    ws.mkdir()
    old = ONLY_FIRST
    try:
        with d.client() as c:
            s, first = only_the_first_holds(c, ws)
            time.sleep(0.7)  # the first one's blob is older than the grace period
            done = beside(  # gc while it waits at the fault point
                (lambda: c.fork(first.id, workspace=str(tmp_path / "fork")))
                if pause.startswith("fork") else
                (lambda: c.restore(s.id, first.id, acknowledge_side_effects=True)),
                lambda: c.gc(keep_last=1), after=0.8)
            assert first.id not in {cp.id for cp in c.log(s.id) if cp.pruned}
            assert c.fsck()["ok"], c.fsck()
            if pause.startswith("fork"):
                fork = done
                assert (tmp_path / "fork" / "f.txt").read_text() == old
                (tmp_path / "fork" / "f.txt").write_text("changed\n")
                c.restore(fork.id, fork.head, acknowledge_side_effects=True)
                assert (tmp_path / "fork" / "f.txt").read_text() == old
            else:
                assert (ws / "f.txt").read_text() == old
                brought = done.checkpoint.id
                (ws / "f.txt").write_text("changed\n")
                s.checkpoint()
                time.sleep(0.7)
                c.gc(keep_last=2)  # the first one pruned now: the restore's names it all
                assert first.id in {cp.id for cp in c.log(s.id) if cp.pruned}
                s.restore(brought, acknowledge_side_effects=True)
                assert (ws / "f.txt").read_text() == old
                assert c.fsck()["ok"], c.fsck()
    finally:
        d.stop()


def test_a_restore_set_aside_for_an_operator_keeps_its_target_from_gc(tmp_path):
    """A restore killed part-way whose workspace was written to before the daemon came
    back is set aside for an operator, who may complete it (``session resolve
    --complete``): until then its target is kept from retention, so gc run first
    neither prunes it nor sweeps what only it names, and the completion brings the
    target back whole."""
    from .test_hostile import _killed_mid_restore
    d, ws, s, first, _ = _killed_mid_restore(tmp_path, files=6, nth=2,
                                             options=("--gc-grace", "0.5"))
    (ws / "f5.txt").write_text("edited after the crash\n")  # so the journal is set aside
    d.start()
    try:
        with d.client() as c:
            assert c.get_session(s.id).needs_attention
            time.sleep(0.7)  # the first one's blobs are older than the grace period
            c.gc(keep_last=1)
            assert first.id not in {cp.id for cp in c.log(s.id) if cp.pruned}
            done = c.resolve_session(s.id, complete=True)
            assert done.needs_attention is None and c.log(s.id)[-1].kind == "restore"
            assert all((ws / f"f{i}.txt").read_text() == f"v1 {i}\n" for i in range(6))
            assert c.fsck()["ok"], c.fsck()
    finally:
        d.stop()


def _published(store, host: str = "a"):
    """A fleet host's publication of its holds to ``store`` (Core.publish_holds, world/core.py)."""
    def publish(held: set[str]) -> None:
        now = time.time()
        store.publish_holds(host, held, now + 30, now)
    return publish


def test_a_fleet_hosts_holds_are_published_as_they_begin_and_end():
    from worldline.daemon.in_use import InUse
    from worldline.daemon.storage.store import MemoryStore

    store = MemoryStore()
    in_use = InUse(_published(store))
    with in_use.holding("c1"):
        assert store.held_checkpoints(time.time()) == {"c1"}
        with in_use.holding("c1"), in_use.holding("c2"):
            assert store.held_checkpoints(time.time()) == {"c1", "c2"}
        assert store.held_checkpoints(time.time()) == {"c1"}  # held once more
    assert store.held_checkpoints(time.time()) == set()


def test_a_hold_that_cannot_be_published_is_not_taken():
    """A restore whose hold the fleet cannot see does not run (it fails, UNAVAILABLE at
    the edge), and leaves nothing held."""
    from worldline.client.errors import Unavailable
    from worldline.daemon.in_use import InUse

    def unreachable(held: set[str]) -> None:
        raise Unavailable("the store is unreachable")
    in_use = InUse(unreachable)
    with pytest.raises(Unavailable), in_use.holding("c1"):
        pytest.fail("the block ran without its hold published")
    with in_use.frozen() as held:
        assert held == set()


def test_a_lease_renewal_never_waits_for_gc_and_gc_publishes_as_it_ends():
    """A renewal during this host's gc (holds frozen) returns at once: the leases it
    renews must not wait for a long prune. The holds are published as gc ends."""
    from worldline.daemon.in_use import InUse
    from worldline.daemon.storage.store import MemoryStore

    store = MemoryStore()
    calls: list[set[str]] = []
    publish = _published(store)
    in_use = InUse(lambda held: (calls.append(set(held)), publish(held)))
    with in_use.holding("c1"):
        calls.clear()
        with in_use.frozen():
            renewal = threading.Thread(target=in_use.publish)
            renewal.start()
            renewal.join(2.0)
            assert not renewal.is_alive() and calls == []
        assert calls == [{"c1"}]
        in_use.publish()
        assert calls == [{"c1"}, {"c1"}]


def test_a_fleet_host_that_holds_nothing_writes_no_holds_at_its_renewals():
    """Renewals extend what is held; a host that holds nothing, and has published so,
    leaves the shared store be. Its first publication clears what a previous run left,
    and the journal's targets are published as holds."""
    from worldline.daemon.in_use import InUse
    from worldline.daemon.storage.store import MemoryStore

    store = MemoryStore()
    store.publish_holds("a", {"left-by-a-killed-run"}, time.time() + 30, time.time())
    calls: list[set[str]] = []
    publish = _published(store)
    journal: set[str] = set()
    in_use = InUse(lambda held: (calls.append(set(held)), publish(held)),
                   also=lambda: set(journal))
    in_use.publish()
    assert calls == [set()] and store.held_checkpoints(time.time()) == set()
    in_use.publish()
    in_use.publish()
    assert calls == [set()]
    with in_use.holding("c1"):
        in_use.publish()
        assert calls == [set(), {"c1"}, {"c1"}]
        journal.add("c1")  # a restore to c1 killed midway: its journal keeps it
    assert calls[-1] == {"c1"}
    in_use.publish()
    assert calls[-1] == {"c1"} and len(calls) == 5
    journal.clear()  # an operator resolved it
    in_use.publish()
    in_use.publish()
    assert calls[3:] == [{"c1"}, {"c1"}, set()]
    assert store.held_checkpoints(time.time()) == set()


def test_a_publication_of_nothing_that_failed_is_made_again():
    from worldline.client.errors import Unavailable
    from worldline.daemon.in_use import InUse

    calls: list[set[str]] = []
    failing = [True]

    def publish(held: set[str]) -> None:
        calls.append(set(held))
        if failing[0]:
            raise Unavailable("the store is unreachable")
    in_use = InUse(publish)
    with pytest.raises(Unavailable):
        in_use.publish()
    failing[0] = False
    in_use.publish()
    in_use.publish()
    assert calls == [set(), set()]
