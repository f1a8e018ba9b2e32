"""Forks stay independent whichever way they are made: overlay mounts over read-only
views (where permitted) or copies."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from worldline.client import FailedPrecondition

from .conftest import DaemonProcess, tree_state
from .fidelity import AGENT_UID, as_agent, differences, fingerprint


def build(ws):
    (ws / "pkg/sub").mkdir(parents=True)
    (ws / "pkg/sub/mod.py").write_text("x = 1\n")
    (ws / "pkg/gone.py").write_text("bye\n")
    (ws / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(ws / "run.sh", 0o755)
    os.symlink("pkg/sub/mod.py", ws / "link")
    (ws / "empty").mkdir()


@pytest.fixture(params=["overlay", "copy"])
def forking_daemon(request, tmp_path):
    extra = ["--copy-forks"] if request.param == "copy" else []
    d = DaemonProcess(tmp_path / "root", extra=extra).start()
    yield d, request.param
    d.stop()


def test_forks_of_forks_stay_independent(forking_daemon, tmp_path):
    d, mode = forking_daemon
    ws = tmp_path / "ws"
    ws.mkdir()
    build(ws)
    with d.client() as c:
        s = c.create_session(str(ws))
        cp1 = s.checkpoint()
        (ws / "pkg/sub/mod.py").write_text("x = 2\n")
        (ws / "pkg/gone.py").unlink()
        (ws / "new.txt").write_text("new\n")
        cp2 = s.checkpoint()
        state2 = tree_state(ws)
        a = c.fork(cp2.id)
        b = c.fork(cp2.id)
        older = c.fork(cp1.id)  # a delta over the view the first fork built
        wa, wb = Path(a.workspace), Path(b.workspace)
        if mode == "overlay" and os.geteuid() == 0:
            assert os.path.ismount(wa) and os.path.ismount(wb)
        assert tree_state(wa) == state2 == tree_state(wb)
        assert (Path(older.workspace) / "pkg/gone.py").read_text() == "bye\n"
        assert (Path(older.workspace) / "pkg/sub/mod.py").read_text() == "x = 1\n"
        # writes in one fork show nowhere else
        (wa / "pkg/sub/mod.py").write_text("fork a\n")
        (wa / "only-a").write_text("a")
        os.unlink(wa / "run.sh")
        assert (wb / "pkg/sub/mod.py").read_text() == "x = 2\n"
        assert (ws / "pkg/sub/mod.py").read_text() == "x = 2\n"
        assert (wb / "run.sh").exists() and not (wb / "only-a").exists()
        # the fork's first checkpoint sees exactly its own changes
        fa = c.checkpoint(a.id)
        changes = c.diff(cp2.id, fa.id)
        assert (changes.added, changes.modified, changes.deleted) == (
            ["only-a"], ["pkg/sub/mod.py"], ["run.sh"])
        # and a fork of the fork
        aa = c.fork(fa.id)
        assert (Path(aa.workspace) / "only-a").read_text() == "a"
        assert c.fsck()["ok"]


def _forked(d: DaemonProcess, tmp_path: Path, workspace: Path, kept: str):
    """A session of a built workspace (``tmp_path``/ws) forked at ``workspace``, ``kept``
    written in the fork and checkpointed: (the fork, that checkpoint's id)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    build(ws)
    with d.client() as c:
        s = c.create_session(str(ws))
        f = c.fork(s.checkpoint().id, workspace=str(workspace))
        (Path(f.workspace) / "kept").write_text(kept)
        return f, c.checkpoint(f.id).id


@pytest.mark.skipif(os.geteuid() != 0, reason="overlay mounts need root")
def test_overlay_forks_come_back_after_a_reboot(tmp_path, tmpfs):
    """A fork's overlay is mounted again at start, its folder and those above it made
    again if the reboot took them (a /tmp emptied), and its session goes on: the new
    mount has a new device number (here another file system mounted meanwhile takes
    the old one, as a reboot's order of mounts may), which becomes the identity its
    workspace is checked against. Before 0.7.23 every call on the fork was refused
    ("no longer the folder this session was created on")."""
    d = DaemonProcess(tmp_path / "root").start()
    try:
        f, before = _forked(d, tmp_path, tmp_path / "scratch" / "fork", "written in the fork")
        d.stop()
        was = os.stat(f.workspace).st_dev
        subprocess.run(["umount", f.workspace], check=True)  # as a reboot would
        assert not os.path.ismount(f.workspace)
        shutil.rmtree(tmp_path / "scratch")  # its folders gone too: a /tmp a reboot emptied
        tmpfs(tmp_path / "meanwhile", "1m")
        d.start()
        assert os.path.ismount(f.workspace) and os.stat(f.workspace).st_dev != was
        assert (Path(f.workspace) / "kept").read_text() == "written in the fork"
        assert (Path(f.workspace) / "pkg/sub/mod.py").read_text() == "x = 1\n"
        with d.client() as c:
            (Path(f.workspace) / "kept").write_text("after the reboot")
            after = c.checkpoint(f.id).id
            assert c.diff(before, after).modified == ["kept"]
            c.restore(f.id, before)
            assert (Path(f.workspace) / "kept").read_text() == "written in the fork"
    finally:
        d.stop()


@pytest.mark.skipif(os.geteuid() != 0, reason="overlay mounts need root")
def test_a_copy_of_a_data_root_never_mounts_the_originals_forks(tmp_path):
    """An operator copies a data root (a backup, or a test of one) and starts a daemon
    on the copy while the original's forks are not mounted (the original down after a
    reboot). The copy's fork records name the original's layers, and the fork's
    workspace is the original's: the copy mounts nothing there, and says why. The
    original then mounts its fork as ever. A data root moved (the original folder
    gone) mounts its forks from where it is now. Before 0.7.28 the copy rebuilt the
    record from its own layers and mounted them over the original's fork workspace,
    where the original then found a mount not its own."""
    d = DaemonProcess(tmp_path / "root").start()
    try:
        f, _ = _forked(d, tmp_path, tmp_path / "fork", "the original's")
    finally:
        d.stop()
    subprocess.run(["umount", f.workspace], check=True)  # as a reboot would
    subprocess.run(["cp", "-a", str(tmp_path / "root"), str(tmp_path / "copy")], check=True)
    copy = DaemonProcess(tmp_path / "copy").start()
    try:
        assert not os.path.ismount(f.workspace)
        assert f"the data root at {tmp_path / 'root'}, which is there: this data root is a" \
            " copy" in copy.log.read_text()
    finally:
        copy.stop()
    written = "the original's"
    for root in ("root", "moved"):
        if root == "moved":  # the original folder gone: the fork comes from here now
            subprocess.run(["umount", f.workspace], check=True)
            os.rename(tmp_path / "root", tmp_path / "moved")
        d = DaemonProcess(tmp_path / root).start()
        try:
            assert os.path.ismount(f.workspace), root
            assert (Path(f.workspace) / "kept").read_text() == written
            with d.client() as c:
                written = f"then in {root}"
                (Path(f.workspace) / "kept").write_text(written)
                assert c.diff(c.get_session(f.id).head, c.checkpoint(f.id).id).modified == [
                    "kept"]
        finally:
            d.stop()
    subprocess.run(["umount", f.workspace], check=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="overlay mounts need root")
def test_a_fork_folder_swapped_for_a_symlink_is_never_mounted_through(tmp_path):
    """The agent (uid 1000) owns the folder its fork was made in. While the fork is
    not mounted (the daemon down, a reboot), it swaps the fork's folder, or the folder
    above it, for a symlink to a folder it may not write (here a canary; /etc in an
    attack). The start mounts nothing through it, says so, and the canary stays as it
    was; the fork's calls are refused, never followed. Before 0.7.23 the overlay was
    mounted over the symlink's target, its root the agent's: the agent could write
    there."""
    canary = tmp_path / "canary"
    canary.mkdir()
    (canary / "passwd").write_text("root:x:0:0\n")
    untouched = fingerprint(canary)
    mine = tmp_path / "agent"
    mine.mkdir()
    os.chown(mine, AGENT_UID, AGENT_UID)
    (mine / "deeper").mkdir()
    os.chown(mine / "deeper", AGENT_UID, AGENT_UID)
    d = DaemonProcess(tmp_path / "root").start()
    try:
        f, _ = _agent_fork(d, tmp_path, str(mine / "deeper" / "fork"))
        for swap in (f"mv deeper/fork deeper/was && ln -s {canary} deeper/fork",  # itself
                     f"rm deeper/fork && mv deeper/was deeper/fork && mv deeper deeper.was"
                     f" && ln -s {canary} deeper"):  # the folder above it
            d.stop()
            subprocess.run(["umount", f.workspace], capture_output=True)  # a reboot
            as_agent(swap, mine)
            d.start()
            assert not os.path.ismount(canary)
            assert "cannot mount fork" in d.log.read_text()
            assert fingerprint(canary) == untouched
            with d.client() as c, pytest.raises(FailedPrecondition):
                c.checkpoint(f.id)
            assert fingerprint(canary) == untouched
    finally:
        d.stop()


def test_a_restore_in_a_fork_keeps_the_holes_of_the_parents_sparse_files(forking_daemon,
                                                                          tmp_path):
    """In an overlay fork, changing a file of the parent's (its metadata, or a hard link
    to it) makes the kernel copy it up in 1 MiB chunks, and a chunk with data in it is
    copied dense. A restore that linked a hard-link group back to such a file, or gave
    it back its mode in place, filled its holes; it writes such a file again now."""
    from .fidelity import AGENT_UID, as_agent, differences, fingerprint
    d, _ = forking_daemon
    ws = tmp_path / "ws"
    ws.mkdir()
    os.chown(ws, AGENT_UID, AGENT_UID)
    as_agent("for f in linked alone; do printf head > $f; truncate -s 1048580 $f;"
             " printf tail >> $f; done; ln linked other", ws)
    with d.client() as c:
        cp = c.create_session(str(ws)).checkpoint()
        fork = c.fork(cp.id, workspace=str(tmp_path / "fork"))
        fw = Path(fork.workspace)
        want = fingerprint(fw)
        assert sorted(p for p, rec in want.items() if "data" in dict(rec)) == [
            "alone", "linked", "other"]  # sparse, as in the parent
        mine = c.get_session(fork.id).checkpoint()
        # the agent breaks the link (its write copies `other` up) and changes a mode
        as_agent("printf new > other; chmod 600 alone", fw)
        c.get_session(fork.id).restore(mine.id)
        left = differences(want, fingerprint(fw))
        assert not left, "; ".join(left)


def test_the_first_checkpoint_of_a_fork_keeps_its_hard_links(forking_daemon, tmp_path):
    """A fork made by copying knows the tree it wrote, so its first checkpoint looks
    only at what changed since; it must look at the files with other hard links too,
    or it records them as separate files. It did not (the change tracker's list of
    them was left empty), and every checkpoint of a copied fork lost its hard links."""
    d, _ = forking_daemon
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a").write_text("shared\n")
    os.link(ws / "a", ws / "b")
    (ws / "x").write_text("x\n")
    with d.client() as c:
        cp = c.create_session(str(ws)).checkpoint()
        fork = c.get_session(c.fork(cp.id, workspace=str(tmp_path / "fork")).id)
        fw = Path(fork.workspace)
        assert os.stat(fw / "a").st_ino == os.stat(fw / "b").st_ino
        (fw / "x").write_text("changed\n")
        first = fork.checkpoint()
        os.unlink(fw / "b")
        fork.checkpoint()
        fork.restore(first.id)
        assert os.stat(fw / "a").st_ino == os.stat(fw / "b").st_ino


def _agent_fork(d: DaemonProcess, tmp_path: Path, workspace: str = ""):
    """A session over a workspace the agent (uid 1000) owns and wrote, and an overlay
    fork of it (at ``workspace``, else the daemon's choice) with a file the agent
    wrote in the fork: (the fork's session, its fingerprint)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    os.chown(ws, AGENT_UID, AGENT_UID)
    as_agent("mkdir -p pkg/sub && echo 'x = 1' > pkg/sub/mod.py && ln -s pkg link", ws)
    with d.client() as c:
        s = c.create_session(str(ws))
        f = c.fork(s.checkpoint().id, workspace=workspace)
        assert os.path.ismount(f.workspace)
    as_agent("echo 'written in the fork' > kept && rm link", f.workspace)
    return f, fingerprint(f.workspace)


@pytest.mark.skipif(os.geteuid() != 0, reason="overlay mounts need root")
@pytest.mark.parametrize("damage", ["cut", "lost", "not ours"])
def test_a_damaged_fork_record_never_keeps_the_daemon_from_starting(tmp_path, damage):
    """A fork's mount record (forks/<id>/mount.json) that is cut short, lost, or names
    lower layers that are no view of this root (here a canary folder outside) is never
    mounted as it is: the daemon starts, mounts the fork again from its session over
    the same upper layer (nothing the agent wrote in it is lost), records it anew, and
    the canary is never read through the fork. Before 0.7.23 a cut record stopped the
    start (JSONDecodeError)."""
    canary = tmp_path / "canary"
    canary.mkdir()
    (canary / "secret").write_text("outside every session")
    untouched = fingerprint(canary)
    d = DaemonProcess(tmp_path / "root").start()
    try:
        f, state = _agent_fork(d, tmp_path)
        d.stop()
        subprocess.run(["umount", f.workspace], check=True)  # as a reboot would
        record = d.root / "forks" / f.id / "mount.json"
        if damage == "cut":
            record.write_text(record.read_text()[:40])
        elif damage == "lost":
            record.unlink()
        else:
            spec = json.loads(record.read_text())
            record.write_text(json.dumps(spec | {"lowers": [str(canary)]}))
        d.start()
        assert os.path.ismount(f.workspace)
        assert differences(fingerprint(f.workspace), state) == []
        assert not (Path(f.workspace) / "secret").exists()
        lowers = json.loads(record.read_text())["lowers"]
        assert lowers and all(Path(p).parent == d.root / "views" for p in lowers)
        assert "rebuilt from its session" in d.log.read_text()
        with d.client() as c:
            c.gc()  # the views the record names again are kept
        d.stop()
        subprocess.run(["umount", f.workspace], check=True)
        d.start()
        assert differences(fingerprint(f.workspace), state) == []
        assert fingerprint(canary) == untouched
    finally:
        d.stop()


@pytest.mark.skipif(os.geteuid() != 0, reason="overlay mounts need root")
def test_a_mounted_fork_with_a_damaged_record_keeps_its_views(tmp_path):
    """A daemon that died (no reboot) leaves its forks mounted. If a fork's record is
    damaged meanwhile, the start leaves the mount serving as it is, and gc removes no
    view (which ones it needs is unknown) until a start that finds it unmounted makes
    the record again."""
    d = DaemonProcess(tmp_path / "root").start()
    try:
        f, state = _agent_fork(d, tmp_path)
        d.kill()
        record = d.root / "forks" / f.id / "mount.json"
        lowers = json.loads(record.read_text())["lowers"]
        record.write_bytes(b"\xff" + os.urandom(30))
        d.start()
        assert os.path.ismount(f.workspace)
        assert "is left as it is" in d.log.read_text()
        with d.client() as c:
            c.gc()
        assert all(os.path.isdir(p) for p in lowers)
        assert "gc: no view removed" in d.log.read_text()
        assert differences(fingerprint(f.workspace), state) == []
        d.stop()
        subprocess.run(["umount", f.workspace], check=True)
        d.start()
        assert differences(fingerprint(f.workspace), state) == []
        assert json.loads(record.read_text())["lowers"]
    finally:
        d.stop()
