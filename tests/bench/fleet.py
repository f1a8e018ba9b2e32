"""The fleet case: checkpoint-small on PostgreSQL (fsync on, as a real server runs) + an S3
bucket (moto's server, an emulator, on loopback) beside the same on the embedded
default, alternating in one run; the bucket's PUTs per checkpoint; and a cold fork of
the Django tree on a second daemon holding none of its blobs, beside `cp -a` of the
tree.

The hosts share this machine's two cores and disk, as real hosts would not: before the
cold forks every daemon already running is let settle (its idle repack done, see
run.settle), and each fork and each `cp -a` starts after os.sync(), so neither side
pays for the other's writeback. The copies are removed only after the last round: this
machine's ext4 has no journal, and such an ext4 skips inodes freed in the last minutes
one by one when it allocates (`recently_deleted`), so whichever side ran right after a
tree was deleted would create its files several times slower."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import time

from ..conftest import DaemonProcess, unmount_below
from .metrics import PUTS, scrape


def case(bench):
    from ..services import PostgresCluster, S3Emulator, free_port
    from . import peers
    from .run import ROUNDS, WARMUP, Case, Stat, settle, stat, timed
    from .trees import edit, pick_files

    cluster, s3 = PostgresCluster(fsync=True).start(), S3Emulator().start()
    hosts: list[DaemonProcess] = []
    try:
        url, bucket = cluster.new_database(), s3.new_bucket()
        env = {**s3.env, "WORLDLINE_LOG_LEVEL": "WARNING"}

        def host(name: str, *extra: str) -> DaemonProcess:
            root = bench.run_dir / f"fleet-{name}"
            shutil.rmtree(root, ignore_errors=True)
            d = DaemonProcess(root, ["--store", url, "--blobs", f"s3://{bucket}/bench",
                                     "--host-id", name, *extra], env=env).start()
            hosts.append(d)
            return d

        metrics = f"127.0.0.1:{free_port()}"
        a = host("a", "--metrics-listen", metrics)
        ws_fleet, ws_local = bench.copy("fleet-wl"), bench.copy("fleet-local")
        with a.client() as ca:
            fleet_session = ca.create_session(str(ws_fleet))
            local_session = bench.client.create_session(str(ws_local))
            rng = random.Random(11)
            fleet, local, puts = [], [], []
            puts_before = scrape(metrics).get(PUTS, 0.0)
            for i in range(WARMUP + ROUNDS):
                files = pick_files(bench.django, rng)
                edit(ws_fleet, files, f"fleet {i}")
                before = len(s3.keys(bucket))
                t_fleet = timed(fleet_session.checkpoint)
                added = len(s3.keys(bucket)) - before
                edit(ws_local, files, f"fleet {i}")
                t_local = timed(local_session.checkpoint)
                if i >= WARMUP:
                    fleet.append(t_fleet)
                    local.append(t_local)
                    puts.append(added)
            cp = fleet_session.checkpoint()

        settle(a.root)
        rested(s3, bucket, "bench/packs/", metrics)  # host a's packs moved and rewritten
        # Every PUT the loop's checkpoints cost, moving what they staged included.
        puts_all = (scrape(metrics).get(PUTS, 0.0)
                    - puts_before) / (WARMUP + ROUNDS + 1)
        settle(bench.daemon.root)
        cold, cp_a = [], []
        for i in range(max(3, ROUNDS // 10)):
            b = host(f"b{i}")  # a new host: an empty cache, none of the tree's blobs
            target = bench.run_dir / f"fleet-fork-{i}"
            with b.client() as cb:
                os.sync()
                cold.append(timed(lambda cb=cb, t=target: cb.fork(cp.id, workspace=str(t))))
            b.stop()
            subprocess.run(["umount", "-l", str(target)], capture_output=True)
            unmount_below(bench.run_dir / f"fleet-b{i}")
            dst = bench.run_dir / f"fleet-cp-{i}"
            os.sync()
            cp_a.append(timed(lambda d=dst: peers.run(["cp", "-a", str(ws_fleet), str(d)])))
        for i in range(len(cp_a)):
            shutil.rmtree(bench.run_dir / f"fleet-cp-{i}")
        replayed, at_rest, git_pack = bucket_of_history(bench, cluster, s3, env)
        fleet_s, local_s, cold_s, cp_s = stat(fleet), stat(local), stat(cold), stat(cp_a)
        per_cp = sum(puts) / len(puts)
        ratio = fleet_s.median / local_s.median
        cold_ratio = cold_s.median / cp_s.median
        ok = ratio <= 2.0 and cold_ratio <= 3.0 and per_cp <= 1.0 and puts_all <= 1.0
        return Case("fleet", "checkpoint-small on PostgreSQL + S3 (moto's server); a cold"
                    " fork on a second host", fleet_s,
                    {"checkpoint-small on the embedded default": local_s,
                     "cold fork of django on a host with no blobs": cold_s,
                     "cp -a of the tree": cp_s,
                     "PUTs per checkpoint, on its path": stat(puts, unit="PUTs", scale=1.0),
                     "PUTs per checkpoint, moves and the rewrite at rest included":
                         Stat(puts_all, puts_all, 1, "PUTs"),
                     "history-400's bucket after the replay": Stat(replayed, replayed, 1,
                                                                   "bytes"),
                     "history-400's bucket at rest": Stat(at_rest, at_rest, 1, "bytes"),
                     "git gc --aggressive pack of history-400": Stat(git_pack, git_pack, 1,
                                                                     "bytes")},
                    round(ratio, 4), "fleet / embedded",
                    "≤ 2 × embedded; cold fork ≤ 3 × cp -a; 1 PUT per checkpoint", ok,
                    f"cold fork / cp -a = {cold_ratio:.3f}; PUTs per checkpoint ="
                    f" {per_cp:.2f} on its path, {puts_all:.2f} with the moves of what it"
                    f" staged and the rewrite at rest (S3 is moto's emulator on loopback,"
                    f" not a real bucket);"
                    f" history-400 replayed on a host of its own: its bucket"
                    f" {replayed / 1e6:.2f} MB after the replay, {at_rest / 1e6:.2f} MB once"
                    f" the host rested and rewrote its packs = {at_rest / git_pack:.2f} ×"
                    f" git's pack (context, no target)")
    finally:
        for d in hosts:
            if d.proc is not None:
                d.stop()
        s3.stop()
        cluster.remove()


def object_sizes(s3, bucket: str, prefix: str = "") -> list[int]:
    """The size of each object under ``prefix`` in the bucket."""
    pages = s3.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return [o["Size"] for page in pages for o in page.get("Contents", [])]


def rested(s3, bucket: str, prefix: str, metrics: str, patience: float = 300.0) -> None:
    """Wait until the host writing under ``prefix`` (its metrics at ``metrics``) has moved
    what it staged and rewritten its small packs at rest (fewer left than a rewrite
    waits for), so that nothing moves or rewrites while the next measure runs."""
    from worldline.daemon.storage.s3_blobs import CONSOLIDATE_MIN, CONSOLIDATE_SMALL
    deadline = time.monotonic() + patience
    while time.monotonic() < deadline:
        small = sum(size < CONSOLIDATE_SMALL for size in object_sizes(s3, bucket, prefix))
        waiting = scrape(metrics)
        if (small < CONSOLIDATE_MIN and waiting["worldline_staged_bytes"] == 0
                and waiting["worldline_moved_objects"] == 0):
            return
        time.sleep(1.0)
    raise RuntimeError(f"the packs under {prefix} were not rewritten in {patience:.0f} s")


def bucket_of_history(bench, cluster, s3, env: dict) -> tuple[int, int, int]:
    """history-400 replayed on a fleet host of its own (a database and a bucket of its
    own), a checkpoint after each commit: the bucket's bytes after the replay, and once
    the host has rested long enough to rewrite its packs (s3_blobs.consolidate); and
    git's aggressive pack of the same commits."""
    from ..services import free_port
    from .history import Replay, git_pack, source
    url, bucket = cluster.new_database(), s3.new_bucket()
    repo, commits = source(bench.cache)
    ws = bench.run_dir / "fleet-history-ws"
    shutil.rmtree(ws, ignore_errors=True)
    replay = Replay(repo, ws, bench.run_dir / "fleet-history.index")
    replay.first(commits[0])
    root = bench.run_dir / "fleet-history-host"
    shutil.rmtree(root, ignore_errors=True)
    metrics = f"127.0.0.1:{free_port()}"
    d = DaemonProcess(root, ["--store", url, "--blobs", f"s3://{bucket}/history",
                             "--host-id", "history", "--metrics-listen", metrics],
                      env=env).start()
    try:
        with d.client() as c:
            session = c.create_session(str(ws))
            for prev, commit in zip(commits, commits[1:], strict=False):
                replay.step(prev, commit)
                session.checkpoint()
        replayed = sum(object_sizes(s3, bucket)) + scrape(metrics)["worldline_staged_bytes"]
        rested(s3, bucket, "history/packs/", metrics)
        at_rest = sum(object_sizes(s3, bucket))
    finally:
        d.stop()
    return replayed, at_rest, git_pack(bench)
