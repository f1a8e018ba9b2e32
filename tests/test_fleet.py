"""Two hosts sharing one history: two daemons, each with its own data root and
socket, on one PostgreSQL database and one bucket (moto's S3 server, an emulator).
The agent's side acts as uid 1000; a canary folder beside the workspaces must stay
untouched by everything the hosts do."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from worldline.client.errors import FailedPrecondition, Unavailable

from .conftest import (
    ONLY_FIRST,
    DaemonProcess,
    beside,
    only_the_first_holds,
    run_together,
)
from .fidelity import AGENT_UID, as_agent, build_host_tree, differences, fingerprint

GRACE = 2  # seconds: gc's grace period on these hosts


class Fleet:
    def __init__(self, tmp_path, pg_url: str, bucket: str, s3_env: dict) -> None:
        self.tmp = tmp_path
        self.url = pg_url
        self.bucket = bucket
        self.env = s3_env
        self.hosts: dict[str, DaemonProcess] = {}

    def host(self, name: str, faults: str = "", start: bool = True,
             extra: tuple[str, ...] = (), env_extra: dict | None = None) -> DaemonProcess:
        env = {**self.env, **(env_extra or {})}
        if faults:
            env["WORLDLINE_FAULTS"] = faults
        d = DaemonProcess(self.tmp / f"root-{name}", [
            "--store", self.url, "--blobs", f"s3://{self.bucket}/fleet", "--host-id", name,
            "--lease-seconds", "2", "--gc-grace", str(GRACE), *extra], env=env)
        self.hosts[name] = d
        return d.start() if start else d

    def stop_all(self) -> None:
        for d in self.hosts.values():
            if d.proc is not None:
                d.stop(signal.SIGKILL)


@pytest.fixture
def fleet(tmp_path, postgres_url, s3_server):
    f = Fleet(tmp_path, postgres_url, s3_server.new_bucket(), s3_server.env)
    yield f
    f.stop_all()


@pytest.fixture
def canary(tmp_path):
    c = tmp_path / "canary"
    c.mkdir()
    (c / "keep.txt").write_text("untouched\n")
    before = fingerprint(c)
    yield c
    assert differences(before, fingerprint(c)) == []


@pytest.fixture
def agent_tree(tmp_path):
    ws = tmp_path / "ws-a"
    ws.mkdir()
    build_host_tree(ws)
    as_agent("mkdir -p pkg && for i in $(seq 1 200); do printf 'module %s\\n' $i >"
             " pkg/m$i.py; done", ws)
    return ws


def _edit(ws, n: int) -> None:
    as_agent(f"printf 'edit {n}\\n' >> pkg/m{n % 200 + 1}.py && printf 'new' > new{n}.txt", ws)


def test_a_checkpoint_made_on_one_host_is_forked_on_another_byte_for_byte(
        fleet, agent_tree, tmp_path, canary):
    a = fleet.host("a", extra=("--advertise", "a.internal:7070"))
    b = fleet.host("b")
    with a.client() as ca, b.client() as cb:
        s = ca.create_session(str(agent_tree))
        _edit(agent_tree, 1)
        cp = s.checkpoint(label="on a")
        want = fingerprint(agent_tree)
        listed = {x.id: x for x in cb.list_sessions()}
        assert listed[s.id].host == "a"
        assert [c.id for c in cb.get_session(s.id).log()][-1] == cp.id
        first = cb.get_session(s.id).log()[0].id  # log, diff and show answer on any host
        assert "new1.txt" in cb.diff(first, cp.id).added
        assert cb.show(cp.id).label == "on a"
        fork = cb.get_session(s.id).fork(cp.id, workspace=str(tmp_path / "fork-on-b"))
        assert fork.host == "b"
        assert differences(want, fingerprint(fork.workspace)) == []
        # b cannot act on a's session while a holds it
        with pytest.raises(FailedPrecondition, match="held by host a at a.internal:7070"):
            cb.get_session(s.id).checkpoint(label="not b's")
        with pytest.raises(FailedPrecondition, match="held by host a"):
            cb.get_session(s.id).record_tool_call("edit", effect="local")
        with pytest.raises(FailedPrecondition):
            cb.move_session(s.id, take_over=True, workspace=str(tmp_path / "taken"))
        # ...and a cannot act on b's fork
        with pytest.raises(FailedPrecondition, match="held by host b"):
            ca.get_session(fork.id).checkpoint()


def test_a_host_stops_another_takes_over_and_the_old_one_is_fenced(
        fleet, agent_tree, tmp_path, canary):
    a, b = fleet.host("a"), fleet.host("b")
    with a.client() as ca:
        s = ca.create_session(str(agent_tree))
        for n in range(3):
            _edit(agent_tree, n)
            s.checkpoint(label=f"edit {n}")
        want = fingerprint(agent_tree)
    assert a.stop() == 0  # a graceful stop ends a's leases at once
    target = tmp_path / "taken-by-b"
    with b.client() as cb:
        taken = cb.move_session(s.id, take_over=True, workspace=str(target))
        assert (taken.host, taken.workspace, taken.needs_attention) == ("b", str(target), None)
        assert differences(want, fingerprint(target)) == []
        log = cb.get_session(s.id).log()
        assert log[-1].kind == "restore" and log[-1].label == "taken over by b"
        as_agent("printf 'on b\\n' > after.txt", target)
        cp = cb.get_session(s.id).checkpoint(label="continued on b")
        assert cb.diff(log[-1].id, cp.id).added == ["after.txt"]
    a.start()  # a comes back: the session is b's now
    with a.client() as ca:
        with pytest.raises(FailedPrecondition, match="held by host b"):
            ca.get_session(s.id).checkpoint()
    assert os.stat(target / "after.txt").st_uid == AGENT_UID


def test_a_taken_over_session_keeps_its_exclusions(fleet, agent_tree, tmp_path):
    """The session's --exclude patterns are part of its spec: the host that takes it
    over captures what the first one did, and leaves out what it left out."""
    a, b = fleet.host("a"), fleet.host("b")
    with a.client() as ca:
        s = ca.create_session(str(agent_tree), exclude=["*.log"])
        _edit(agent_tree, 1)
        s.checkpoint(label="on a")
    assert a.stop() == 0
    target = tmp_path / "taken-by-b"
    with b.client() as cb:
        cb.move_session(s.id, take_over=True, workspace=str(target))
        before = cb.get_session(s.id).log()[-1].id
        as_agent("printf 'noise\\n' > build.log && printf 'kept\\n' > kept.txt", target)
        cp = cb.get_session(s.id).checkpoint(label="on b")
        assert cb.diff(before, cp.id).added == ["kept.txt"]


@pytest.mark.docker
def test_a_container_session_is_taken_over_with_its_layer_and_its_sandbox(
        fleet, agent_tree, tmp_path, containers, canary):
    from .test_container_fidelity import NOBODY, as_nobody, as_root
    from .test_containers import IMAGE, docker, fs_state
    a, b = fleet.host("a"), fleet.host("b")
    with a.client() as ca:
        s = ca.create_session(str(agent_tree), image=IMAGE)
        containers.append(s.container)
        as_root(s.container, "mkdir -p /data && chown 65534:65534 /data")
        as_nobody(s.container, "mkdir -p /data/sub && echo mine > /data/sub/own.txt"
                               " && ln -s own.txt /data/sub/link && chmod 640 /data/sub/own.txt")
        _edit(agent_tree, 1)
        cp = s.checkpoint(label="container and workspace")
        assert cp.container
        want_layer, want_ws = fs_state(s.container), fingerprint(agent_tree)
        spec_a = json.loads(docker("inspect", s.container))[0]["HostConfig"]
        as_nobody(s.container, "echo after the checkpoint > /data/sub/own.txt")  # not kept
    assert a.stop() == 0
    target = tmp_path / "container-on-b"
    with b.client() as cb:
        taken = cb.move_session(s.id, take_over=True, workspace=str(target))
        containers.append(taken.container)
        assert taken.host == "b" and taken.container and taken.container != s.container
        assert differences(want_ws, fingerprint(target)) == []
        info = json.loads(docker("inspect", taken.container))[0]
        assert info["State"]["Running"]
        assert [m["Source"] for m in info["Mounts"]] == [str(target)]  # b's workspace
        for key in ("Memory", "PidsLimit", "CapDrop", "ReadonlyRootfs", "SecurityOpt"):
            assert info["HostConfig"][key] == spec_a[key], key  # the same sandbox
        assert fs_state(taken.container) == want_layer  # the head's layer, not what came after
        assert as_nobody(taken.container, "stat -c '%u %a' /data/sub/own.txt").split() == [
            str(NOBODY), "640"]
        as_nobody(taken.container, "echo on b >> /data/sub/own.txt")  # nobody still writes
        after = cb.get_session(s.id).checkpoint(label="continued on b")
        assert "data/sub/own.txt" in cb.diff(cp.id, after.id).container.modified


@pytest.mark.docker
def test_a_taken_over_container_gets_empty_volumes_not_the_former_hosts_mounts(
        fleet, agent_tree, tmp_path, containers, canary):
    from .test_container_fidelity import as_root
    from .test_containers import IMAGE, docker
    elsewhere = tmp_path / "host-a-only"  # a folder of the former host, not of the world
    elsewhere.mkdir()
    (elsewhere / "secret").write_text("host a's\n")
    name = f"wl-takeover-{os.urandom(3).hex()}"
    docker("create", "--name", name, "-v", f"{agent_tree}:/workspace",
           "-v", f"{elsewhere}:/extra", IMAGE, "sleep", "1000000")
    containers.append(name)
    docker("start", name)
    a, b = fleet.host("a"), fleet.host("b")
    with a.client() as ca:
        s = ca.create_session(str(agent_tree), container=name)
        as_root(name, "echo layer > /l")
        s.checkpoint()
    assert a.stop() == 0
    with b.client() as cb:
        taken = cb.move_session(s.id, take_over=True, workspace=str(tmp_path / "on-b"))
        containers.append(taken.container)
        mounts = json.loads(docker("inspect", taken.container))[0]["Mounts"]
        assert str(elsewhere) not in [m.get("Source") for m in mounts]
        assert as_root(taken.container, "ls -A /extra").strip() == ""  # a fresh empty volume
        assert as_root(taken.container, "cat /l").strip() == "layer"
    assert (elsewhere / "secret").read_text() == "host a's\n"


def test_a_move_releases_to_one_host_and_the_holder_stops_serving_it(
        fleet, agent_tree, tmp_path, canary):
    a, b, c = fleet.host("a"), fleet.host("b"), fleet.host("c")
    with a.client() as ca, b.client() as cb, c.client() as cc:
        s = ca.create_session(str(agent_tree))
        moved = ca.move_session(s.id, to_host="b")
        assert moved.released_to == "b"
        with pytest.raises(FailedPrecondition, match="released to b"):
            ca.get_session(s.id).checkpoint()
        with pytest.raises(FailedPrecondition, match="released to host b"):
            cc.move_session(s.id, take_over=True, workspace=str(tmp_path / "on-c"))
        taken = cb.move_session(s.id, take_over=True, workspace=str(tmp_path / "on-b"))
        assert taken.host == "b" and taken.released_to is None


def test_gc_on_one_host_while_another_checkpoints_loses_nothing(fleet, agent_tree,
                                                                 tmp_path, canary):
    """The dangerous case: a checkpoint on a brings back content whose checkpoints were
    pruned (garbage older than the grace period) while b collects. a's sync renews the
    blob in the index, or finds it gone and sends it again; either way nothing a
    checkpoint names goes missing."""
    a, b = fleet.host("a"), fleet.host("b")
    with a.client() as ca, b.client() as cb:
        s = ca.create_session(str(agent_tree))
        for n in range(5):
            as_agent(f"printf 'version {n}\\n%.0s' $(seq 1 300) > churn.txt", agent_tree)
            s.checkpoint(label=f"v{n}")
        cb.gc(keep_last=1)  # the older versions pruned: their blobs are garbage now
        time.sleep(GRACE + 0.5)
        done, errors, made = threading.Event(), [], []

        def checkpoints():
            try:
                for n in range(20):
                    as_agent(f"printf 'version {n % 5}\\n%.0s' $(seq 1 300) > churn.txt",
                             agent_tree)
                    _edit(agent_tree, n)
                    made.append((s.checkpoint(label=f"{n}").id, fingerprint(agent_tree)))
            except Exception as exc:  # collected: pytest sees nothing raised in threads
                errors.append(exc)
            finally:
                done.set()

        worker = threading.Thread(target=checkpoints)
        worker.start()
        collected = 0
        while not done.is_set():
            collected += cb.gc()["blobs_removed"]
        worker.join()
        assert errors == [] and collected > 0
        time.sleep(GRACE + 0.5)
        cb.gc()
        for i, (cp_id, want) in enumerate(made[::4]):
            fork = cb.get_session(s.id).fork(cp_id, workspace=str(tmp_path / f"check{i}"))
            assert differences(want, fingerprint(fork.workspace)) == []
        assert cb.fsck()["ok"], cb.fsck()


def test_killed_between_the_pack_put_and_the_commit_loses_nothing(fleet, agent_tree,
                                                                  s3_server, canary,
                                                                  tmp_path):
    a = fleet.host("a")
    with a.client() as ca:
        s = ca.create_session(str(agent_tree))
    a.stop()
    # the next pack's PUT is the checkpoint's (a host staging none)
    a = fleet.host("a", faults="blobs.after_put", env_extra=_unstaged(tmp_path))
    with a.client() as ca:
        s = ca.get_session(s.id)
        _edit(agent_tree, 7)
        with pytest.raises(Unavailable):  # the daemon died mid-call
            s.checkpoint(label="dies after its PUT")
    a.proc.wait(20)
    a.proc = None
    keys = s3_server.keys(fleet.bucket)
    a = fleet.host("a")
    with a.client() as ca:
        s = ca.get_session(s.id)
        assert len(s.log()) == 1  # nothing was acknowledged
        _edit(agent_tree, 8)  # so the next pack is not the orphan's very bytes
        cp = s.checkpoint(label="after the restart")
        assert "new7.txt" in ca.diff(s.log()[0].id, cp.id).added
        time.sleep(GRACE + 1.1)  # past the grace (the bucket's clock is in whole seconds)
        ca.gc()
        assert ca.fsck()["ok"], ca.fsck()
    left = s3_server.keys(fleet.bucket)
    orphans = set(keys) - set(left)
    assert orphans  # the pack of the killed checkpoint, no longer in the bucket
    assert _indexed_objects(fleet.url) <= {k.removeprefix("fleet/") for k in left}


def _left_by_a(fleet, ws, n: int):
    """A session over ``ws`` on host a, edited and checkpointed, then a stopped: the
    session and the workspace's fingerprint, for a take-over elsewhere."""
    a = fleet.host("a")
    with a.client() as ca:
        s = ca.create_session(str(ws))
        _edit(ws, n)
        s.checkpoint()
        want = fingerprint(ws)
    a.stop()
    return s, want


def _killed_taking_over(fleet, session_id: str, target, fault: str) -> None:
    """Host b takes the session over into ``target`` and dies at crash point ``fault``."""
    b = fleet.host("b", faults=fault)
    with b.client() as cb:
        with pytest.raises(Unavailable):  # the daemon died mid-call
            cb.move_session(session_id, take_over=True, workspace=str(target))
    b.proc.wait(20)
    b.proc = None


def test_killed_during_a_take_over_it_can_be_taken_over_again(fleet, agent_tree, tmp_path,
                                                              canary):
    s, want = _left_by_a(fleet, agent_tree, 3)
    target = tmp_path / "half"
    _killed_taking_over(fleet, s.id, target, "takeover.mid")
    assert not target.exists()  # the half-made workspace is beside it, not in its place
    time.sleep(2.5)  # b's lease runs out: any host may finish the take-over
    c = fleet.host("c")
    with c.client() as cc:
        assert "take-over" in cc.get_session(s.id).needs_attention
        taken = cc.move_session(s.id, take_over=True, workspace=str(target))
        assert taken.host == "c" and taken.needs_attention is None
        assert differences(want, fingerprint(target)) == []
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".worldline-takeover-")]


@pytest.mark.parametrize("swapped", [False, True], ids=["finished", "another-folder"])
def test_a_take_over_killed_after_its_rename_is_finished_from_the_folder_in_place(
        fleet, agent_tree, tmp_path, canary, swapped):
    """A take-over that died with the workspace renamed into place, not yet recorded:
    the host that finishes it goes on from that folder (known by its identity), keeping
    what the agent wrote in it since; another folder put there instead is refused as
    not empty and left as it is."""
    s, want = _left_by_a(fleet, agent_tree, 3)
    target = tmp_path / "placed"
    _killed_taking_over(fleet, s.id, target, "takeover.placed")
    assert differences(want, fingerprint(target)) == []  # in place, the session not told
    if swapped:
        os.rename(target, tmp_path / "aside")
        target.mkdir()
        (target / "theirs.txt").write_text("not the session's")
    else:
        as_agent("printf 'later' > later.txt", target)  # written after the rename
    there = fingerprint(target)
    time.sleep(2.5)  # b's lease runs out: any host may finish the take-over
    c = fleet.host("c")
    with c.client() as cc:
        if swapped:
            with pytest.raises(FailedPrecondition, match="not empty"):
                cc.move_session(s.id, take_over=True, workspace=str(target))
            assert differences(there, fingerprint(target)) == []
            assert "take-over" in cc.get_session(s.id).needs_attention
            return
        taken = cc.move_session(s.id, take_over=True, workspace=str(target))
        assert taken.host == "c" and taken.needs_attention is None
        assert differences(there, fingerprint(target)) == []  # nothing written over
        took = taken.head  # the checkpoint equal to the head, which the take-over appended
        cp = taken.checkpoint(label="after the take-over")
        assert cc.diff(took, cp.id).added == ["later.txt"]
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".worldline-takeover-")]


def test_a_folder_put_at_a_take_overs_staging_path_is_never_written(fleet, agent_tree,
                                                                   tmp_path, canary):
    """The take-over writes the workspace in a staging folder beside it, by a name known
    in advance: a folder put there first (by whoever writes the parent: here root's,
    with a root-only file) is not the take-over's to write into, chown and rename into
    place. Refused, and left as it is (issue 57; it was reused before)."""
    s, _ = _left_by_a(fleet, agent_tree, 3)
    staging = tmp_path / f".worldline-takeover-{s.id}"
    staging.mkdir(mode=0o700)
    (staging / "root.key").write_text("root's own\n")
    os.chmod(staging / "root.key", 0o600)
    there = fingerprint(staging)
    b = fleet.host("b")
    with b.client() as cb:
        with pytest.raises(FailedPrecondition):
            cb.move_session(s.id, take_over=True, workspace=str(tmp_path / "taken"))
    assert differences(there, fingerprint(staging)) == []
    assert os.stat(staging).st_uid == 0 and not (tmp_path / "taken").exists()


@pytest.mark.docker
def test_a_container_take_over_killed_midway_binds_the_workspace_when_resumed(
        fleet, agent_tree, tmp_path, containers, canary):
    """A session recorded before 0.7.2 (its spec does not say which folder its container
    binds as the workspace) whose take-over dies after the claim: the host that
    finishes it binds the new workspace, not an empty volume in its place."""
    import psycopg

    from .test_container_fidelity import as_root
    from .test_containers import IMAGE, docker
    a = fleet.host("a")
    with a.client() as ca:
        s = ca.create_session(str(agent_tree), image=IMAGE)
        containers.append(s.container)
        as_root(s.container, "echo layer > /l")
        s.checkpoint()
    a.stop()
    with psycopg.connect(fleet.url) as conn:  # as 0.7.1 recorded it
        conn.execute("UPDATE sessions SET spec = (spec::jsonb - 'workspace')::text"
                     " WHERE id = %s", (s.id,))
    b = fleet.host("b", faults="takeover.mid")
    target = tmp_path / "resumed"
    with b.client() as cb:
        with pytest.raises(Unavailable):
            cb.move_session(s.id, take_over=True, workspace=str(target))
    b.proc.wait(20)
    b.proc = None
    time.sleep(2.5)  # b's lease runs out
    with fleet.host("c").client() as cc:
        taken = cc.move_session(s.id, take_over=True, workspace=str(target))
        containers.append(taken.container)
        mounts = json.loads(docker("inspect", taken.container))[0]["Mounts"]
        assert [(m["Type"], m["Source"]) for m in mounts] == [("bind", str(target))]
        assert as_root(taken.container, "cat /l").strip() == "layer"


def _indexed_objects(url: str) -> set[str]:
    import psycopg
    with psycopg.connect(url) as conn:
        return {r[0] for r in conn.execute("SELECT DISTINCT object FROM blob_index")}


def test_no_index_row_names_a_missing_object(fleet, agent_tree, s3_server):
    a = fleet.host("a")
    with a.client() as ca:
        s = ca.create_session(str(agent_tree))
        for n in range(4):
            _edit(agent_tree, n)
            s.checkpoint()
        ca.gc(keep_last=1)
        time.sleep(GRACE + 1.1)
        ca.gc()
    keys = {k.removeprefix("fleet/") for k in s3_server.keys(fleet.bucket)}
    assert _indexed_objects(fleet.url) <= keys


def test_gc_runs_on_one_host_at_a_time(fleet, agent_tree):
    import psycopg
    from worldline.client.errors import Aborted
    from worldline.daemon.storage.postgres_db import LOCK_GC
    a = fleet.host("a")
    with psycopg.connect(fleet.url, autocommit=True) as other_host:
        other_host.execute("SELECT pg_advisory_lock(%s)", (LOCK_GC,))
        with a.client() as ca:
            with pytest.raises(Aborted, match="another host"):
                ca.gc()
        other_host.execute("SELECT pg_advisory_unlock(%s)", (LOCK_GC,))
    with a.client() as ca:
        ca.gc()


@pytest.fixture
def own_postgres(tmp_path, s3_server):
    """(cluster, fleet): a fleet on a PostgreSQL cluster of its own, for a test to stop
    and start."""
    from tests.services import PostgresCluster
    cluster = PostgresCluster().start()
    f = Fleet(tmp_path, cluster.new_database(), s3_server.new_bucket(), s3_server.env)
    yield cluster, f
    f.stop_all()
    cluster.remove()


def test_postgres_restarted_under_load_is_unavailable_then_served_again(
        own_postgres, agent_tree):
    cluster, f = own_postgres
    a = f.host("a")
    with a.client() as ca:
        s = ca.create_session(str(agent_tree))
        cluster.stop("immediate")
        _edit(agent_tree, 1)
        with pytest.raises(Unavailable):
            s.checkpoint()
        with pytest.raises(Unavailable):
            ca.list_sessions()
        cluster.start()
        deadline = time.monotonic() + 60
        while True:
            try:
                cp = s.checkpoint(label="after the restart")
                break
            except Unavailable:
                assert time.monotonic() < deadline, "the daemon never recovered"
                time.sleep(0.5)
        assert "new1.txt" in ca.diff(s.log()[0].id, cp.id).added
    assert a.proc.poll() is None  # the same daemon process served throughout


def test_a_checkpoint_waits_on_postgresql_three_times(fleet, pg_cluster, agent_tree,
                                                      tmp_path):
    """Each round trip to the fleet's PostgreSQL is a wait on the network. Through a
    link that holds each request 0.2 s, an agent's edit checkpoints in three: the
    session read with its task list, the transaction's reads, its writes with the
    COMMIT. (The bucket's index is not asked about an edit's new blobs; content this
    host had before, as ``_edit``'s "new" files are, would be asked about: one more.)"""
    from tests.services import UnixRelay
    relayed = tmp_path / "relayed"
    relayed.mkdir()
    link = UnixRelay(relayed / ".s.PGSQL.5432",
                     os.path.join(pg_cluster.dir, ".s.PGSQL.5432"))
    fleet.url = fleet.url.replace(f"host={pg_cluster.dir}", f"host={relayed}")
    try:
        a = fleet.host("a")
        with a.client() as ca:
            s = ca.create_session(str(agent_tree))
            _edit(agent_tree, 0)
            s.checkpoint()
            link.delay = delay = 0.2
            times = []
            for n in range(1, 6):
                as_agent(f"printf 'edit {n}\\n' >> pkg/m{n}.py && printf 'note {n}' >"
                         f" note{n}.txt", agent_tree)
                t = time.monotonic()
                s.checkpoint()
                times.append(time.monotonic() - t)
            link.delay = 0.0
            # The second fastest: psycopg prepares a statement the fifth time a pooled
            # connection runs it, which costs that one call a round trip more (seen in
            # the server's statement log); a round trip added to the path would slow
            # every checkpoint.
            round_trips = sorted(times)[1] / delay
            assert 2.5 < round_trips < 3.7, times
            assert "note5.txt" in ca.diff(s.log()[0].id, s.log()[-1].id).added
    finally:
        fleet.stop_all()
        link.close()


def _customized(tmp_path, name: str, code: str) -> dict:
    """The environment of a host whose ``sitecustomize`` runs ``code`` before the daemon
    starts (a threshold lowered, a feature off); everything else is the daemon as
    shipped."""
    folder = tmp_path / name
    folder.mkdir(exist_ok=True)
    (folder / "sitecustomize.py").write_text(code)
    return {"PYTHONPATH": str(folder)}


def _restless(tmp_path) -> dict:
    """A host that rewrites its bucket packs as soon as it rests (4 objects, 0.3 s)."""
    return _customized(tmp_path, "restless",
                       "import worldline.daemon.main as m, worldline.daemon.storage.s3_blobs"
                       " as s\ns.CONSOLIDATE_MIN = 4\n"
                       "m.REPACK_IDLE_SECONDS = m.CONSOLIDATE_REST = m.CONSOLIDATE_EVERY = 0.3\n")


def _unstaged(tmp_path) -> dict:
    """A host that PUTs every pack, a checkpoint's too (as before 0.7.15), rather than
    staging it in the metadata store."""
    return _customized(tmp_path, "unstaged",
                       "import worldline.daemon.storage.s3_blobs as s\ns.STAGE_BYTES = 0\n")


def _checkpoints(host, ws, n: int) -> tuple:
    """A session on ``host`` over ``ws`` and ``n`` checkpoints of an agent's edits:
    (the session, checkpoint id -> the workspace's fingerprint when it was taken)."""
    wanted = {}
    with host.client() as c:
        s = c.create_session(str(ws))
        for i in range(n):
            _edit(ws, i)
            wanted[s.checkpoint(label=f"edit {i}").id] = fingerprint(ws)
    return s, wanted


def _forks_equal(host, session_id: str, wanted: dict, tmp_path, every: int) -> None:
    """Every ``every``-th checkpoint of ``wanted`` (id -> the workspace's fingerprint
    when it was taken), forked on ``host``, is that workspace byte for byte."""
    with host.client() as c:
        for n, (cp, want) in enumerate(wanted.items()):
            if n % every == 0:
                fork = c.get_session(session_id).fork(cp, workspace=str(tmp_path / f"fork-{n}"))
                assert differences(want, fingerprint(fork.workspace)) == [], n


def _bucket_packs(s3_server, fleet) -> list[str]:
    return [k for k in s3_server.keys(fleet.bucket) if k.startswith("fleet/packs/")]


def test_a_host_at_rest_rewrites_its_packs_killed_midway_or_not_and_loses_nothing(
        fleet, agent_tree, tmp_path, canary, s3_server):
    """0.7.14: a host at rest rewrites its small pack objects into one, with deltas. A
    host killed after the rewrite's PUT (before the index names it) restarts and
    rewrites again; every checkpoint then forks on another host byte for byte."""
    env = _restless(tmp_path)
    a = fleet.host("a", faults="blobs.rewrite_after_put", env_extra=env)
    s, wanted = _checkpoints(a, agent_tree, 6)
    assert a.proc.wait(30) == -signal.SIGKILL  # at rest: the rewrite, killed after its PUT
    a.proc = None
    from worldline.daemon.storage.postgres_store import PostgresStore
    index = PostgresStore(fleet.url)
    try:
        indexed = {"fleet/" + row[0] for row in index.blob_objects()}
        orphan = set(_bucket_packs(s3_server, fleet)) - indexed
        assert len(orphan) == 1 and len(indexed) >= 7  # the rewrite, which no row names
        a = fleet.host("a", env_extra=env)
        deadline = time.monotonic() + 30
        while len(index.blob_objects()) > 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        (rewrite,) = {"fleet/" + row[0] for row in index.blob_objects()}
    finally:
        index.close()
    # the orphan is gc's (unless the rewrite made the very same bytes, and so its name)
    assert set(_bucket_packs(s3_server, fleet)) == {rewrite} | orphan
    _forks_equal(fleet.host("b"), s.id, wanted, tmp_path, every=2)


@pytest.mark.parametrize("staged", [True, False], ids=["staged", "put"])
def test_gc_rewrites_the_packs_of_a_host_gone_before_it_rested(fleet, agent_tree, tmp_path,
                                                               canary, s3_server, staged):
    """Host b checkpoints and is killed before it ever rests, its checkpoints' packs
    staged in the metadata store (0.7.15) or, on a host staging none, PUT; `worldline
    gc` on host a rewrites b's small packs into one object of the bucket, with bases
    found in the checkpoints' trees, and every checkpoint still forks byte for byte."""
    b = fleet.host("b", env_extra=None if staged else _unstaged(tmp_path))
    s, wanted = _checkpoints(b, agent_tree, 18)
    b.kill()
    from worldline.daemon.storage.postgres_store import PostgresStore
    index = PostgresStore(fleet.url)
    try:
        before = _bucket_packs(s3_server, fleet)
        kept = index.staged_objects("b", float("inf"))
        assert (len(kept) >= 19, len(before) >= 18) == ((True, False) if staged
                                                        else (False, True))
        time.sleep(GRACE + 1.1)  # gc takes only what is older than its grace period
        a = fleet.host("a")
        a.cli("gc")
        after = _bucket_packs(s3_server, fleet)
        assert len(after) == 1 and not set(after) & set(before)
        assert index.staged_objects("b", float("inf")) == []  # their bytes left the store
        # the folders' trees, changed at every checkpoint, are deltas from the one before
        codecs = [loc.codec for _, loc in index.object_entries(after[0][len("fleet/"):])]
    finally:
        index.close()
    assert codecs.count("delta") >= 17
    _forks_equal(a, s.id, wanted, tmp_path, every=6)


def test_staged_checkpoints_survive_a_kill_and_a_killed_move(fleet, agent_tree, tmp_path,
                                                              canary, s3_server):
    """0.7.15: a checkpoint's small pack is staged in PostgreSQL, in the checkpoint's own
    transaction, with no PUT. Host a is SIGKILLed right after acknowledging checkpoints
    whose blobs are only staged; host b forks them byte for byte. Host a restarts and
    moves them to the bucket, SIGKILLed after that PUT; once more, and the move lands:
    one object, nothing staged, every checkpoint forks byte for byte."""
    from worldline.daemon.storage.postgres_store import PostgresStore
    prompt = _customized(tmp_path, "prompt",  # due a moment after they are staged
                         "import worldline.daemon.storage.s3_blobs as s\ns.FLUSH_SECONDS = 0.5\n")
    a = fleet.host("a")  # staged objects are due after 30 s, at rest after 10 s
    s, wanted = _checkpoints(a, agent_tree, 5)
    a.kill()
    index = PostgresStore(fleet.url)
    try:
        assert len(index.staged_objects("a", float("inf"))) >= 5
        assert _bucket_packs(s3_server, fleet) == []  # no checkpoint PUT a thing
        (tmp_path / "from-staged").mkdir()
        _forks_equal(fleet.host("b"), s.id, wanted, tmp_path / "from-staged", every=2)
        a = fleet.host("a", faults="blobs.flush_after_put", env_extra=prompt)
        assert a.proc.wait(30) == -signal.SIGKILL  # killed after the move's PUT
        a.proc = None
        assert len(_bucket_packs(s3_server, fleet)) == 1  # an object no row names
        assert len(index.staged_objects("a", float("inf"))) >= 5
        a = fleet.host("a", env_extra=prompt)
        deadline = time.monotonic() + 30
        while index.staged_objects("a", float("inf")) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert index.staged_objects("a", float("inf")) == []
        objects = [row[0] for row in index.blob_objects() if row[4] == "a"]
    finally:
        index.close()
    assert objects and all(name.startswith("packs/") for name in objects)
    (tmp_path / "from-bucket").mkdir()
    _forks_equal(fleet.host("c"), s.id, wanted, tmp_path / "from-bucket", every=1)


def test_a_host_that_stops_moves_what_it_staged(fleet, agent_tree, tmp_path, canary,
                                                s3_server):
    from worldline.daemon.storage.postgres_store import PostgresStore
    a = fleet.host("a")
    s, wanted = _checkpoints(a, agent_tree, 3)
    index = PostgresStore(fleet.url)
    try:
        assert len(index.staged_objects("a", float("inf"))) >= 3
        a.stop()
        assert index.staged_objects("a", float("inf")) == []
    finally:
        index.close()
    assert len(_bucket_packs(s3_server, fleet)) == 1
    _forks_equal(fleet.host("b"), s.id, wanted, tmp_path, every=1)


def test_sessions_checkpoint_at_once_while_staged_objects_move_all_the_time(
        fleet, agent_tree, tmp_path, canary):
    """Three sessions checkpoint the same edits at once (the same blobs, so their index
    rows are renewed by one checkpoint while a move points them elsewhere) on a host
    that moves what it staged every 50 ms: no call fails, and every checkpoint forks on
    another host byte for byte. (The deadlock PostgreSQL once detected between a move
    and a checkpoint is forced deterministically in test_fleet_store; this is the
    daemon's real threads doing both.)"""
    eager = _customized(tmp_path, "eager", "import worldline.daemon.main as m,"
                        " worldline.daemon.storage.s3_blobs as s\ns.FLUSH_OBJECTS = 1\n"
                        "m.WAL_IDLE_SECONDS = 0.05\n")
    a = fleet.host("a", env_extra=eager)
    spaces = [agent_tree]
    for k in (1, 2):
        spaces.append(tmp_path / f"ws-{k}")
        subprocess.run(["cp", "-a", str(agent_tree), str(spaces[-1])], check=True)
    done: dict[int, tuple] = {}
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            done[k] = _checkpoints(a, spaces[k], 12)
        except BaseException as exc:
            errors.append(exc)

    run_together([lambda k=k: work(k) for k in range(3)])
    assert errors == [] and len(done) == 3
    b = fleet.host("b")
    for k, (s, wanted) in done.items():
        (tmp_path / f"forks-{k}").mkdir()
        _forks_equal(b, s.id, wanted, tmp_path / f"forks-{k}", every=4)


def test_a_walk_on_a_fleet_host_killed_at_random_moments_is_taken_over_whole(
        fleet, places, tmp_path):
    """The agent's random walk (test_agent_walk) on a host of the fleet, its history in
    PostgreSQL and the bucket, the host killed at random moments of its checkpoints and
    restores; then the host dies for good and another takes the session over: the
    workspace it makes, and every acknowledged checkpoint restored or forked there, are
    exactly what the first host acknowledged."""
    from .test_agent_walk import killed_walk
    ws, canary = places
    untouched = fingerprint(canary)
    a = fleet.host("a")
    c, sid, kept = killed_walk(a, ws, canary, random.Random(5), 45)
    last = c.get_session(sid).log()[-1].id
    c.close()
    a.stop(signal.SIGKILL)
    a.proc = None
    time.sleep(2.5)  # a's lease runs out
    b = fleet.host("b")
    target = tmp_path / "taken-by-b"
    with b.client() as cb:
        taken = cb.move_session(sid, take_over=True, workspace=str(target))
        assert (taken.host, taken.needs_attention) == ("b", None)
        if last in kept:
            assert differences(kept[last], fingerprint(target)) == []
        rng = random.Random(6)
        for cp_id in rng.sample(list(kept), 12):
            cb.restore(sid, cp_id)
            assert differences(kept[cp_id], fingerprint(target)) == [], cp_id
        for n, cp_id in enumerate(rng.sample(list(kept), 2)):
            fork = cb.fork(cp_id, workspace=str(tmp_path / f"fork{n}"))
            assert differences(kept[cp_id], fingerprint(fork.workspace)) == [], cp_id
        assert cb.fsck()["ok"]
    assert fingerprint(canary) == untouched


def test_a_parent_swapped_during_a_take_over_is_refused_and_the_take_over_resumes(
        fleet, agent_tree, agent_home, canary):
    """The folders above a take-over's new workspace are the agent's (uid 1000), and it
    swaps one for a symlink to the canary while the take-over runs: once right after the
    path was checked (the folder it stages the workspace in is then made through no
    symlink), once with the workspace staged and not yet renamed into place (the rename
    goes through the parent, opened through no symlink). Both are FAILED_PRECONDITION,
    with nothing written through the symlink; with the folder put back, the take-over
    resumes and ends with the workspace exact."""
    from .test_hostile import _raced
    s, want = _left_by_a(fleet, agent_tree, 5)
    b = fleet.host("b", faults="takeover.checked@4,takeover.mid@4")
    target = agent_home / "proj" / "taken"
    swap = f"mv proj proj.real && ln -s {canary} proj"
    back = "rm proj && mv proj.real proj"
    with b.client() as cb:
        for _ in ("checked", "mid"):
            got = _raced(lambda: cb.move_session(s.id, take_over=True, workspace=str(target)),
                         swap, agent_home)
            assert isinstance(got, FailedPrecondition), got
            as_agent(back, agent_home)
            assert "take-over" in cb.get_session(s.id).needs_attention
        taken = cb.move_session(s.id, take_over=True, workspace=str(target))
        assert taken.needs_attention is None
        assert differences(want, fingerprint(target)) == []
    assert sorted(os.listdir(agent_home / "proj")) == ["taken", "ws"]


def test_a_restore_on_one_host_keeps_its_target_from_gc_on_another(fleet, tmp_path):
    """A restore under way on host a publishes its target as held (in_use.py): gc on
    host b, which cannot see a's memory, leaves it unpruned. (0.7.26's sweep took its
    files; 0.7.27's pruned it and kept them for the grace period only.)"""
    a = fleet.host("a", faults="restore.planned@3")
    b = fleet.host("b")
    ws = tmp_path / "ws"
    ws.mkdir()
    with a.client() as ca, b.client() as cb:
        s, first = only_the_first_holds(ca, ws)
        time.sleep(GRACE + 0.5)  # the first one's blob is older than the grace period
        done = beside(lambda: ca.restore(s.id, first.id, acknowledge_side_effects=True),
                      lambda: cb.gc(keep_last=1), after=1.0)  # a's waits at the fault point
        assert first.id not in {cp.id for cp in cb.log(s.id) if cp.pruned}
        assert cb.fsck()["ok"], cb.fsck()
        (ws / "f.txt").write_text("changed\n")
        ca.restore(s.id, done.checkpoint.id, acknowledge_side_effects=True)
        assert (ws / "f.txt").read_text() == ONLY_FIRST


def test_a_target_pruned_by_a_gc_that_chose_before_the_hold_keeps_its_files(
        fleet, tmp_path):
    """The race the holds leave: gc on b chooses what to prune, then a's restore holds
    the target and finds it still usable, then b prunes it. b's sweep reads every
    host's holds again after its prune, so the target's files stay, through later gcs
    past the grace period, for as long as the restore runs; its checkpoint names
    blobs that are all there. (0.7.27 kept them for the grace period only: a restore
    longer than that lost them.)"""
    a = fleet.host("a", faults="restore.planned@9")
    b = fleet.host("b", faults="gc.chosen@3")
    ws = tmp_path / "ws"
    ws.mkdir()
    with a.client() as ca, b.client() as cb, ThreadPoolExecutor(2) as pool:
        s, first = only_the_first_holds(ca, ws)
        time.sleep(GRACE + 0.5)  # the first one's blob is older than the grace period
        chose = pool.submit(cb.gc, keep_last=1)  # chooses, then waits 3 s at gc.chosen
        time.sleep(1.0)
        restoring = pool.submit(ca.restore, s.id, first.id, acknowledge_side_effects=True)
        assert chose.result(timeout=30)["checkpoints_pruned"] >= 1
        assert first.id in {cp.id for cp in cb.log(s.id) if cp.pruned}  # chosen unheld
        time.sleep(GRACE + 0.5)  # past the grace: only a's hold keeps its files now
        cb.gc(keep_last=1)
        assert cb.fsck()["ok"], cb.fsck()
        assert not restoring.done()  # the hold was still a's at that gc
        done = restoring.result(timeout=60)
        assert cb.fsck()["ok"], cb.fsck()
        (ws / "f.txt").write_text("changed\n")
        ca.restore(s.id, done.checkpoint.id, acknowledge_side_effects=True)
        assert (ws / "f.txt").read_text() == ONLY_FIRST
