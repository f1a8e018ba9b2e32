"""The metadata conformance suite: a restore and a fork give back the world exactly.

Over every layer kind (a workspace folder, a fork's overlay view and a copied fork, a
container's upper folder): a tree with every kind of entry and metadata, owned by the
agent (uid 1000) and by others (65534), is checkpointed, destroyed and restored, and
forked; each time its ``rsync -aHAXS``-grade fingerprint (tests/fidelity.py) must be
the one it had.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from .conftest import DaemonProcess
from .fidelity import (
    AGENT_UID,
    NOBODY,
    as_agent,
    build_host_tree,
    differences,
    empty_folder,
    fingerprint,
)


@pytest.fixture
def world(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    build_host_tree(ws)
    return ws


def test_restore_gives_back_every_file_exactly(client, world):
    before = fingerprint(world)
    s = client.create_session(str(world))
    cp = s.checkpoint(label="everything")
    assert "agent.sock" in client.show(cp.id).skipped  # recorded, never recreated
    empty_folder(world)
    result = s.restore(cp.id)
    assert differences(before, fingerprint(world)) == []
    assert any("agent.sock" in w for w in result.warnings)
    # the agent's own setuid file is the agent's, never root's
    st = os.stat(world / "bin" / "tool")
    assert (st.st_uid, st.st_mode & 0o7777) == (AGENT_UID, 0o4755)
    # and the agent can go on writing its own files
    as_agent("echo more >> src/main.py && touch src/new.txt && rm src/deep/er/leaf.txt",
             world)


def test_restore_undoes_metadata_changes_alone(client, world):
    """A change of owner, mode, xattrs, time or links is a modification: diff says so,
    restore puts it back."""
    before = fingerprint(world)
    s = client.create_session(str(world))
    cp = s.checkpoint()
    as_agent("chmod 600 src/main.py && setfattr -x user.note src/main.py"
             " && touch -d 2020-01-01 src/deep/er/leaf.txt && rm src/hard.py"
             " && cp src/main.py src/hard.py && setfacl -b shared", world)
    os.chown(world / "others" / "nobody.txt", AGENT_UID, AGENT_UID)
    after = s.checkpoint()
    d = client.diff(cp.id, after.id)
    assert {"src/main.py", "src/deep/er/leaf.txt", "src/hard.py", "shared",
            "others/nobody.txt", "bin/also.py"} <= set(d.modified)
    s.restore(cp.id)
    assert differences(before, fingerprint(world)) == []


@pytest.mark.parametrize("how", ["overlay view", "copy"])
def test_fork_is_the_same_world(client, world, tmp_path, how):
    before = fingerprint(world)
    s = client.create_session(str(world))
    cp = s.checkpoint()
    if how == "overlay view":
        target = client
        fork = client.fork(cp.id, workspace=str(tmp_path / "fork"))
    else:
        d = DaemonProcess(tmp_path / "copy-root", ["--copy-forks"]).start()
        target = d.client()
        copy_ws = tmp_path / "ws2"
        copy_ws.mkdir()
        subprocess.run(["cp", "-a", f"{world}/.", str(copy_ws)], check=True)
        s2 = target.create_session(str(copy_ws))
        cp = s2.checkpoint()
        fork = target.fork(cp.id, workspace=str(tmp_path / "fork"))
    try:
        want = before if how == "overlay view" else fingerprint(copy_ws)
        assert differences(want, fingerprint(fork.workspace)) == []
        st = os.stat(fork.workspace)
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (AGENT_UID, 0o750)
        as_agent("echo more >> src/main.py && touch new.txt", fork.workspace)
    finally:
        if how == "copy":
            target.close()
            d.stop()


def test_sparse_file_stays_sparse_and_small(fresh_daemon, tmp_path):
    ws = tmp_path / "sparse-ws"
    ws.mkdir()
    fresh_daemon.start()
    with fresh_daemon.client() as c:
        s = c.create_session(str(ws))
        before = sum(f.stat().st_size for f in (fresh_daemon.root / "blobs").rglob("*")
                     if f.is_file())
        with open(ws / "disk.img", "wb") as f:
            f.truncate(20 << 30)
            f.seek(10 << 30)
            f.write(os.urandom(4096))
        cp = s.checkpoint()
        stored = sum(f.stat().st_size for f in (fresh_daemon.root / "blobs").rglob("*")
                     if f.is_file()) - before
        assert stored < 1 << 20, f"{stored} bytes stored for 4 KiB of data"
        os.unlink(ws / "disk.img")
        s.restore(cp.id)
        st = os.stat(ws / "disk.img")
        assert st.st_size == 20 << 30 and st.st_blocks * 512 <= 64 << 10
        with open(ws / "disk.img", "rb") as f:
            f.seek((10 << 30) - 4)
            assert f.read(4) == b"\0" * 4 and len(f.read(4096)) == 4096


def test_owner_that_cannot_be_set_never_leaves_a_privilege(tmp_path):
    """A daemon that cannot chown (here, the applier run as root without CAP_CHOWN, as
    in a user namespace where the id is not mapped) restores what it can, drops
    setuid/setgid where the owner could not be given back, and says so."""
    path = tmp_path / "tool"
    path.write_bytes(b"#!/bin/sh\n")
    script = (
        "import os\n"
        "from worldline.daemon.capture.fsmeta import Applier\n"
        "from worldline.daemon.capture.trees import Entry\n"
        f"e = Entry('file', 0o6755, '0' * 64, 10, {NOBODY}, {NOBODY}, 10**18, '')\n"
        "fd = os.open('tool', os.O_RDONLY)\n"
        "a = Applier()\n"
        "a.apply_fd(fd, e, 'tool')\n"
        "print('\\n'.join(a.warnings))\n")
    res = subprocess.run(["setpriv", "--bounding-set=-chown", "--inh-caps=-chown",
                          sys.executable, "-c", script],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    st = os.stat(path)
    assert st.st_uid == 0 and st.st_mode & 0o7777 == 0o755
    assert st.st_mtime_ns == 10**18
    assert "owner 65534:65534 not restored" in res.stdout
    assert "setuid/setgid bits dropped" in res.stdout
