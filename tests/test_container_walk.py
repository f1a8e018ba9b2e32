"""A random walk of agent work inside a container, as ``nobody``: every checkpoint of
the writable layer restores exactly.

The image's lower layer holds a tree of ``nobody``'s, so the walk does what only a
layer on top of an image shows: files copied up by a change of mode or time, files
and folders of the image deleted (whiteouts), folders of the image removed and made
again (opaque folders), folders moved. A checkpoint follows each batch of changes at
once; now and then the session is restored to a random earlier checkpoint and the
walk carries on from there. After each restore the container's view of ``/data``
(the merged folder) and the writable layer under it must be as they were at that
checkpoint (fidelity.py's fingerprint).

The same walk runs against a daemon killed with SIGKILL at random moments of half its
checkpoints and restores. (It found the container left paused by a checkpoint, or
stopped by a restore, that the kill cut short.)
"""

from __future__ import annotations

import itertools
import json
import os
import random
import shlex
from pathlib import Path

import pytest
from worldline.client.errors import ResourceExhausted, Unavailable

from .conftest import DaemonProcess
from .fidelity import NOBODY, differences, fingerprint
from .test_agent_walk import arm_kill, listing, restart_killed
from .test_container_fidelity import as_nobody, as_root, upper
from .test_containers import IMAGE, docker

pytestmark = pytest.mark.docker

ROUNDS = 70
RESTORE_EVERY = 12
KILL_ROUNDS = 50

LOWER_TREE = f"""
mkdir -p /data/lower/a /data/lower/b /data/lower/deep/x/y /data/lower/bin
for f in 1 2 3; do echo "a$f" > /data/lower/a/file$f; echo "b$f" > /data/lower/b/file$f; done
echo z > /data/lower/deep/x/y/z.txt
cp /bin/busybox /data/lower/bin/tool
printf head > /data/lower/hole && truncate -s 70000 /data/lower/hole
ln -s a/file1 /data/lower/link
ln /data/lower/a/file2 /data/lower/b/also2
chown -R {NOBODY}:{NOBODY} /data
"""


@pytest.fixture
def walk_image(containers):
    """An image whose lower layer holds /data/lower, all of it ``nobody``'s."""
    name = f"wl-walk-base-{os.urandom(3).hex()}"
    docker("create", "--name", name, IMAGE, "sleep", "1000000")
    containers.append(name)
    docker("start", name)
    as_root(name, LOWER_TREE)
    image = f"worldline/walk-{os.urandom(3).hex()}:latest"
    docker("commit", name, image)
    yield image
    docker("rmi", "-f", image, check=False)


def _merged(container: str) -> str:
    return json.loads(docker("inspect", container))[0]["GraphDriver"]["Data"]["MergedDir"]


def _change(rng: random.Random, top: str, number: int) -> str:
    """One change, as a line of sh run in /data; what it makes is named n<number>."""
    folders, files, every = listing(Path(top))
    q = shlex.quote
    new = q(f"{rng.choice(folders)}/n{number}")
    f = q(rng.choice(files)) if files else new
    d = q(rng.choice(folders[1:])) if len(folders) > 1 else new
    anything = q(rng.choice(every)) if every else new
    return rng.choice([
        f"printf %s {'x' * rng.randrange(0, 3000)}{number} > {rng.choice([f, new])}",
        f"printf %s {number} >> {f}",
        f"truncate -s {rng.randrange(0, 90000)} {f}",
        f"printf head > {new} && truncate -s {rng.choice([5000, 300000])} {new}"
        f" && printf tail >> {new}",
        f"chmod {rng.choice(['644', '600', '755', '4755', '2755', '444'])} {f}",
        f"chmod {rng.choice(['755', '700', '2775', '1777'])} {d}",
        f"touch -h -d '{rng.choice(['2001-02-03 04:05:06', '1999-12-31 23:59:59'])}'"
        f" {anything}",
        f"ln {f} {new}",
        f"ln -s {rng.choice(['a/file1', '/etc/passwd', '../../..', 'nowhere'])} {new}",
        f"mkfifo {new}",
        f"mkdir {new}",
        f"mv {anything} {new}",
        f"rm -f {f}",
        f"rm -rf {d}",
        f"rm -rf {d} && mkdir {d} && printf again > {d}/again",  # an opaque folder
    ])


def _sandbox(workspace, image: str, containers: list[str]) -> str:
    name = f"wl-walk-{os.urandom(3).hex()}"
    # --init: tini as PID 1, which heeds the SIGTERM of a restore's stop (a `sleep` PID 1
    # would drop it, and is killed at once: test_containers)
    docker("create", "--init", "--name", name, "-v", f"{workspace}:/workspace", image,
           "sleep", "1000000")
    containers.append(name)
    docker("start", name)
    return name


def _world(c: str) -> tuple[dict, dict]:
    """The container's view of /data, and the writable layer's /data (none until /data
    is first changed)."""
    layer = os.path.join(upper(c), "data")
    return (fingerprint(os.path.join(_merged(c), "data")),
            fingerprint(layer) if os.path.lexists(layer) else {})


def _same(a: tuple[dict, dict], b: tuple[dict, dict]) -> bool:
    return not differences(a[0], b[0]) and not differences(a[1], b[1])


def _walk_step(rng: random.Random, c: str, numbers) -> None:
    top = os.path.join(_merged(c), "data")
    lines = [_change(rng, top, next(numbers)) for _ in range(rng.randrange(1, 5))]
    as_nobody(c, "cd /data\n" + "\n".join(f"( {line} ) 2>/dev/null || true"
                                          for line in lines))


def test_every_checkpoint_of_a_walk_in_a_container_restores_exactly(client, workspace,
                                                                   walk_image, containers):
    rng = random.Random(5)
    c = _sandbox(workspace, walk_image, containers)
    s = client.create_session(str(workspace), container=c)
    numbers = itertools.count()
    kept: dict[str, tuple[dict, dict]] = {}
    for i in range(ROUNDS):
        _walk_step(rng, c, numbers)
        cp = s.checkpoint()  # at once: no pause after the changes
        kept[cp.id] = _world(c)
        if i % RESTORE_EVERY == RESTORE_EVERY - 1:
            target = rng.choice(list(kept))
            s.restore(target)
            merged, layer = _world(c)
            assert differences(kept[target][0], merged) == [], f"round {i}: the view"
            assert differences(kept[target][1], layer) == [], f"round {i}: the layer"
    # the walk changed the world, not only tried to: most checkpoints differ
    assert len({repr(world) for world in kept.values()}) > ROUNDS // 2
    # a fork is the same world, in a container of its own (with seed 7 this found a
    # change every later checkpoint missed, which the restores did not show: see below)
    for n, target in enumerate(rng.sample(list(kept), 2)):
        fork = client.fork(target, workspace=str(workspace.parent / f"fork{n}"))
        containers.append(fork.container)
        merged, layer = _world(fork.container)
        assert differences(kept[target][0], merged) == [], f"fork of {target}: the view"
        assert differences(kept[target][1], layer) == [], f"fork of {target}: the layer"


def test_a_walk_in_a_container_killed_at_random_moments(tmp_path, workspace, walk_image,
                                                       containers):
    """After each kill the container runs again, unpaused; a killed checkpoint left
    the world as it was; a killed restore left it as it was or as its target; nothing
    is set aside; and acknowledged checkpoints restore exactly."""
    rng = random.Random(2)
    c = _sandbox(workspace, walk_image, containers)
    d = DaemonProcess(tmp_path / "root").start()
    client = d.client()
    sid = client.create_session(str(workspace), container=c).id
    numbers = itertools.count()
    kept: dict[str, tuple[dict, dict]] = {}
    kills = cut = 0
    try:
        for i in range(KILL_ROUNDS):
            _walk_step(rng, c, numbers)
            before = _world(c)
            target = rng.choice(list(kept)) if kept and i % 4 == 3 else None
            timer = arm_kill(d, rng, 0.5, 0.01 if target is None else 0.5)
            try:
                if target is None:
                    kept[client.checkpoint(sid).id] = before
                else:
                    client.restore(sid, target)
                    assert _same(kept[target], _world(c)), f"round {i}: restored"
            except Unavailable:  # killed during the call: nothing was acknowledged
                cut += 1
            if timer is None:
                continue
            kills += 1
            client = restart_killed(d, timer, client)
            assert client.get_session(sid).needs_attention is None, f"round {i}"
            state = json.loads(docker("inspect", c))[0]["State"]
            assert state["Running"] and not state["Paused"], f"round {i}: {state}"
            now = _world(c)
            assert _same(before, now) or (target is not None and _same(kept[target], now)), \
                f"round {i}: a killed {'restore' if target else 'checkpoint'}"
        assert kills >= 10 and cut >= 5
        for cp_id in rng.sample(list(kept), 8):
            client.restore(sid, cp_id)
            assert _same(kept[cp_id], _world(c)), f"at the end: {cp_id}"
    finally:
        client.close()
        d.stop()


@pytest.mark.parametrize("reader", ["container", "host"])
def test_a_file_left_with_one_name_is_still_captured_when_it_changes(client, workspace,
                                                                    walk_image, containers,
                                                                    reader):
    """Found by a walk in a fork of a container. overlayfs changes a file in the upper
    folder through the upper name its inode met first, so inotify reports the change
    in that name's folder. After `ln a b` of an image's file and `rm a`, while the
    inode is still cached (something read the files meanwhile: the container itself,
    or the host through the merged view), b's changes were reported in a's folder,
    gone, and no checkpoint saw them again. The container's merged view is now watched
    too (mirror.py), where the change is reported under b's name."""
    c = _sandbox(workspace, walk_image, containers)
    s = client.create_session(str(workspace), container=c)
    s.checkpoint()

    def read() -> None:
        if reader == "container":
            as_nobody(c, "cd /data/lower/deep; for f in x/y/z.txt n17; do"
                         " if [ -e $f ]; then cat $f >/dev/null; fi; done")
        else:
            fingerprint(os.path.join(_merged(c), "data"))
    as_nobody(c, "cd /data/lower/deep && ln x/y/z.txt n17")
    s.checkpoint()
    read()
    as_nobody(c, "cd /data/lower/deep && rm x/y/z.txt")
    before = s.checkpoint()
    read()
    as_nobody(c, "cd /data/lower/deep && truncate -s 35213 n17")
    after = s.checkpoint()
    assert client.diff(before.id, after.id).container.modified == ["data/lower/deep/n17"]
    want = _world(c)
    s.restore(before.id)
    s.restore(after.id)
    merged, layer = _world(c)
    assert differences(want[0], merged) == [] and differences(want[1], layer) == []


LINKED_AND_LEFT = {
    # the image's file, linked and its first name removed
    "image-file": "ln x/y/z.txt n17 && cat n17 >/dev/null && rm x/y/z.txt",
    # a new file, its first name removed, its folder left
    "new-file": "mkdir q && echo hi > q/a && ln q/a n17 && cat n17 >/dev/null && rm q/a",
    # the first name's folder removed too: its watch goes with it
    "folder-gone": "mkdir q && echo hi > q/a && ln q/a n17 && cat n17 >/dev/null && rm -r q",
}


@pytest.mark.parametrize("how", sorted(LINKED_AND_LEFT))
def test_a_file_linked_and_left_with_one_name_between_checkpoints_is_still_captured(
        client, workspace, walk_image, containers, how):
    """The link made and its first name gone between two checkpoints, so no checkpoint
    ever saw the file with two names: its later changes reach the upper folder through
    the first name (0.7.19 looked again only at files a checkpoint had seen linked, and
    missed all three)."""
    c = _sandbox(workspace, walk_image, containers)
    s = client.create_session(str(workspace), container=c)
    s.checkpoint()
    as_nobody(c, f"cd /data/lower/deep && {LINKED_AND_LEFT[how]}")
    before = s.checkpoint()
    as_nobody(c, "cd /data/lower/deep && truncate -s 35213 n17")
    after = s.checkpoint()
    assert client.diff(before.id, after.id).container.modified == ["data/lower/deep/n17"]
    as_nobody(c, "cd /data/lower/deep && chmod 600 n17")
    assert client.diff(after.id, s.checkpoint().id).container.modified == [
        "data/lower/deep/n17"]


@pytest.mark.parametrize("restarted", ["container", "daemon"])
def test_the_view_is_watched_again_after_a_restart(fresh_daemon, workspace, walk_image,
                                                   containers, restarted):
    """Each start of a container mounts a new merged view, and a daemon starts with no
    watch at all: the view is watched again, so a file linked and left with one name
    after the restart is still captured when it changes."""
    c = _sandbox(workspace, walk_image, containers)
    client = fresh_daemon.start().client()
    try:
        s = client.create_session(str(workspace), container=c)
        s.checkpoint()
        if restarted == "container":
            docker("stop", "-t", "0", c)  # its view unmounted (`restart` keeps it)
            docker("start", c)
        else:
            client.close()
            fresh_daemon.stop()
            client = fresh_daemon.start().client()
            s = client.get_session(s.id)
        as_nobody(c, "cd /data/lower/deep && echo changed > x/y/z.txt")
        first = s.checkpoint()  # after the restart: everything scanned
        as_nobody(c, f"cd /data/lower/deep && {LINKED_AND_LEFT['new-file']}")
        before = s.checkpoint()
        assert "data/lower/deep/n17" in client.diff(first.id, before.id).container.added
        as_nobody(c, "cd /data/lower/deep && truncate -s 35213 n17")
        after = s.checkpoint()
        assert client.diff(before.id, after.id).container.modified == [
            "data/lower/deep/n17"]
    finally:
        client.close()


def test_a_restore_that_fails_part_way_leaves_the_container_running_and_usable(
        tmp_path, tmpfs, walk_image, containers):
    """The agent (``nobody`` in the container) fills the small file system of the
    workspace the container mounts, then a restore of the whole world needs room there
    to write a file aside: RESOURCE_EXHAUSTED naming the file. The container runs,
    unpaused, and the agent goes on in it; the next checkpoint records the world as it
    is (no session set aside); once there is room, the restore makes the workspace and
    the container's layer exactly the checkpoint's. A canary open to all is never
    touched."""
    ws = tmpfs(tmp_path / "ws", "2m", mode="0777")
    canary = tmp_path / "canary"
    canary.mkdir()
    (canary / "keep.txt").write_text("keep\n")
    os.chmod(canary, 0o777)
    untouched = fingerprint(canary)
    c = _sandbox(ws, walk_image, containers)
    d = DaemonProcess(tmp_path / "root").start()
    write = ("cd /workspace; echo {0} > a.txt; head -c 1200000 /dev/urandom > f.bin;"
             " echo {0} > z.txt; echo {0} > /data/lower/a/file1; mkdir -p /data/{0}")
    try:
        with d.client() as client:
            s = client.create_session(str(ws), container=c)
            as_nobody(c, write.format("first"))
            first = (s.checkpoint().id, fingerprint(ws), _world(c))
            as_nobody(c, write.format("second"))
            s.checkpoint()
            with pytest.raises(ResourceExhausted, match="no space left to write f.bin"):
                s.restore(first[0])
            state = json.loads(docker("inspect", c))[0]["State"]
            assert state["Running"] and not state["Paused"]
            as_nobody(c, "echo later > /workspace/later.txt; echo later > /data/later")
            s.checkpoint()  # not FAILED_PRECONDITION: nothing was set aside
            assert not client.get_session(s.id).needs_attention
            assert [e.kind for e in client.audit(s.id, kind="restore.failed")] == [
                "restore.failed"]
            as_nobody(c, "rm /workspace/f.bin")
            s.restore(first[0])
            assert differences(first[1], fingerprint(ws)) == []
            assert _same(first[2], _world(c))
        assert differences(untouched, fingerprint(canary)) == []
    finally:
        d.stop()
