"""The hostile-agent suite: what a buggy or hostile agent tried against worldline 0.3.0
(issue 12's findings, one test each), and a race loop swapping folders and parents for
symlinks while checkpoints and restores run. The daemon runs as root; the agent's
actions run as uid 1000 (``as_agent``); a canary folder outside every session must stay
byte for byte untouched.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from worldline.client import (
    FailedPrecondition,
    InvalidArgument,
    ResourceExhausted,
    Unavailable,
)
from worldline.client.errors import Aborted
from worldline.client.paths import to_bytes

from .conftest import WORLDLINE, DaemonProcess
from .fidelity import AGENT_UID, as_agent, differences, fingerprint


@pytest.fixture
def canary(tmp_path) -> Path:
    """A folder outside every session, with a root-only secret, that nothing may touch."""
    path = tmp_path / "canary"
    (path / "ws").mkdir(parents=True)
    (path / "ws" / "secret").write_text("root only\n")
    os.chmod(path / "ws" / "secret", 0o600)
    (path / "ws" / "keep.txt").write_text("keep\n")
    os.chmod(path, 0o755)
    return path


def test_1_setuid_file_comes_back_owned_by_the_agent(client, agent_home):
    ws = agent_home / "proj" / "ws"
    as_agent("cp /bin/bash tool && chmod 4755 tool && mkdir grp && chmod 2775 grp", ws)
    s = client.create_session(str(ws))
    cp = s.checkpoint()
    as_agent("rm -rf tool grp", ws)
    s.restore(cp.id)
    st = os.stat(ws / "tool")
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (AGENT_UID, AGENT_UID, 0o4755)
    assert os.stat(ws / "grp").st_gid == AGENT_UID
    # run as the agent, the setuid tool gives the agent's euid, not root's
    euid = as_agent("./tool -p -c 'id -u'", ws).stdout.strip()
    assert euid == str(AGENT_UID)


def test_2_parent_swapped_for_a_symlink_is_refused(fresh_daemon, agent_home, canary):
    before = fingerprint(canary)
    ws = agent_home / "proj" / "ws"
    as_agent("echo mine > a.txt && cp /bin/true tool && chmod 4755 tool", ws)
    fresh_daemon.start()
    with fresh_daemon.client() as c:
        s = c.create_session(str(ws))
        cp = s.checkpoint()
        as_agent(f"mv proj proj.real && ln -s {canary} proj", agent_home)
        for attempt in (lambda: s.checkpoint(), lambda: s.restore(cp.id),
                        lambda: s.restore(cp.id, dry_run=True)):
            with pytest.raises(FailedPrecondition) as err:
                attempt()
            assert str(ws) in err.value.message
    fresh_daemon.stop()
    fresh_daemon.start()  # a restart's full scan must not read through the swap either
    with fresh_daemon.client() as c:
        with pytest.raises(FailedPrecondition):
            c.checkpoint(s.id)
        assert c.get_session(s.id).head == s.head
    assert differences(before, fingerprint(canary)) == []
    # put back, the session goes on
    as_agent("rm proj && mv proj.real proj", agent_home)
    with fresh_daemon.client() as c:
        c.checkpoint(s.id)


def _raced(call, swap: str, cwd: Path):
    """``call()`` on a thread, held at a pause point of the daemon's while the agent
    runs ``swap`` in ``cwd``; what it returned or raised."""
    out: dict = {}

    def run() -> None:
        try:
            out["value"] = call()
        except Exception as exc:  # the assertions read it
            out["value"] = exc
    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(1.0)  # the daemon is at its pause point (4 s) well before this
    as_agent(swap, cwd)
    thread.join(30)
    return out["value"]


def test_2b_a_parent_swapped_while_a_session_or_fork_is_made_is_refused(
        tmp_path, agent_home, canary):
    """The same swap, made while the daemon creates a session over the agent's folder
    or a fork into it (held open after the path was checked): refused with nothing
    read or written through the symlink. Before 0.7.23 the new session was bound to
    the canary's folder (its first checkpoint held the root-only secret), and the fork
    made its folder there."""
    before = fingerprint(canary)
    ws = agent_home / "proj" / "ws"
    as_agent("echo mine > a.txt && mkdir forks", agent_home / "proj")
    d = DaemonProcess(tmp_path / "root", env={
        "WORLDLINE_FAULTS": "session.checked@4,fork.checked@4"}).start()
    try:
        with d.client() as c:
            got = _raced(lambda: c.create_session(str(ws)),
                         f"mv proj proj.real && ln -s {canary} proj", agent_home)
            assert isinstance(got, FailedPrecondition), got
            assert c.list_sessions() == []
            as_agent("rm proj && mv proj.real proj", agent_home)
            cp = c.create_session(str(ws)).checkpoint()
            got = _raced(lambda: c.fork(cp.id, workspace=str(agent_home / "proj/forks/f1")),
                         f"mv forks forks.real && ln -s {canary} forks", agent_home / "proj")
            assert isinstance(got, FailedPrecondition), got
            assert len(c.list_sessions()) == 1
        assert not os.path.ismount(canary / "f1")
        assert differences(before, fingerprint(canary)) == []
    finally:
        d.stop()


def test_3_engine_data_root_is_never_a_workspace(client):
    root = Path("/var/lib/docker")
    if not root.is_dir():
        pytest.skip("no engine data root here")
    for path in (root, root / "overlay2"):
        if path.is_dir():
            with pytest.raises((InvalidArgument, FailedPrecondition)):
                client.create_session(str(path))


def _deep_tree(base: Path, depth: int) -> None:
    """A chain of ``depth`` folders below ``base`` (made through descriptors: the path
    is longer than PATH_MAX)."""
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        sub = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = sub
    os.close(fd)


def test_4_one_sessions_deep_folder_never_blinds_another(client, tmp_path):
    a_ws, b_ws, outside = tmp_path / "a", tmp_path / "b", tmp_path / "outside"
    for p in (a_ws, b_ws, outside):
        p.mkdir()
    a = client.create_session(str(a_ws))
    b = client.create_session(str(b_ws))
    (b_ws / "f.txt").write_text("1")
    b.checkpoint()
    _deep_tree(outside, 3000)
    try:
        os.rename(outside / "d", a_ws / "deep")  # 0.3's monitor died of recursion here
        time.sleep(0.5)
        (b_ws / "f.txt").write_text("2")
        (b_ws / "new.txt").write_text("new")
        cp = b.checkpoint()
        d = client.diff(client.log(b.id)[-2].id, cp.id)
        assert d.modified == ["f.txt"] and d.added == ["new.txt"]
        with pytest.raises(FailedPrecondition):
            a.checkpoint()  # too deep to capture: said clearly, nothing recorded
    finally:
        subprocess.run(["rm", "-rf", str(a_ws / "deep"), str(outside)], check=True)


def test_5a_a_restore_refused_up_front_leaves_no_journal(fresh_daemon, tmp_path):
    ws = tmp_path / "gone"
    ws.mkdir()
    fresh_daemon.start()
    with fresh_daemon.client() as c:
        s = c.create_session(str(ws))
        other_ws = tmp_path / "other"
        other_ws.mkdir()
        other = c.create_session(str(other_ws))
        cp = s.checkpoint()
        ws.rmdir()
        with pytest.raises(FailedPrecondition):
            s.restore(cp.id)
    assert not list((fresh_daemon.root / "journal").glob("*.json"))
    fresh_daemon.stop()
    fresh_daemon.start()  # 0.3 exited at once here ("workspace ... does not exist")
    with fresh_daemon.client() as c:
        c.checkpoint(other.id)


def _killed_mid_restore(tmp_path: Path, files: int, nth: int, others: int = 0,
                        options: tuple[str, ...] = ()):
    """A daemon (started with ``options``) killed (SIGKILL at a crash point) while it
    wrote the ``nth`` file of a restore of ``files`` files from v2 back to v1; returned
    stopped, its faults disarmed, with the workspace, the session, the restore's target
    and ``others`` sessions on folders of their own (made before the kill)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    for i in range(files):
        (ws / f"f{i}.txt").write_text(f"v1 {i}\n")
    d = DaemonProcess(tmp_path / "root", extra=list(options),
                      env={"WORLDLINE_FAULTS": f"restore.between_files:{nth}"})
    d.start()
    with d.client() as c:
        s = c.create_session(str(ws))
        extra = []
        for k in range(others):
            folder = tmp_path / f"other-{k}"
            folder.mkdir()
            extra.append(c.create_session(str(folder)))
        cp = s.checkpoint()
        for i in range(files):
            (ws / f"f{i}.txt").write_text(f"v2 {i}\n")
        s.checkpoint()
        with pytest.raises(Unavailable):
            s.restore(cp.id)  # killed on the nth file
    d.proc.wait(15)
    d.proc = None
    d.env.pop("WORLDLINE_FAULTS")
    return d, ws, s, cp, extra


def test_5b_an_interrupted_restore_never_overwrites_later_work(tmp_path):
    d, ws, s, cp, (other,) = _killed_mid_restore(tmp_path, files=10, nth=3, others=1)
    (ws / "later.txt").write_text("written after the crash\n")  # work the journal predates
    d.start()  # starts, and serves every other session
    with d.client() as c:
        c.checkpoint(other.id)
        session = c.get_session(s.id)
        assert session.needs_attention and "later.txt" in session.needs_attention
        assert (ws / "later.txt").read_text() == "written after the crash\n"
        with pytest.raises(FailedPrecondition):
            c.checkpoint(s.id)  # no checkpoint of a half-restored world
        listed = d.cli_json("session", "list")
        assert [x for x in listed if x["id"] == s.id][0]["needs_attention"]
        resolved = c.resolve_session(s.id, complete=False)
        assert resolved.needs_attention is None
        cp3 = c.checkpoint(s.id)
        assert "later.txt" in c.diff(cp.id, cp3.id).added
        assert (ws / "later.txt").exists()
        with pytest.raises(FailedPrecondition):
            c.resolve_session(s.id, complete=True)  # nothing left to resolve


def test_5c_a_set_aside_restore_can_be_completed(tmp_path):
    d, ws, s, _, _ = _killed_mid_restore(tmp_path, files=6, nth=2)
    (ws / "f5.txt").write_text("edited after the crash\n")
    d.start()
    with d.client() as c:
        assert c.get_session(s.id).needs_attention
        done = c.resolve_session(s.id, complete=True)
        assert done.needs_attention is None and c.log(s.id)[-1].kind == "restore"
        assert all((ws / f"f{i}.txt").read_text() == f"v1 {i}\n" for i in range(6))


def test_5d_a_copy_of_the_data_root_leaves_the_originals_worlds_alone(tmp_path):
    """An operator copies a data root whose daemon was killed mid-restore (a backup,
    started to look at it) before the original starts again. The copy's store names the
    original's workspaces: its start completed the original's restore into the
    original's workspace, and its sessions went on checkpointing and restoring the
    original's folders. Now its start changes no file of theirs: the restore is set
    aside, every session waits for an operator's word (checkpoints and restores
    refused; history, diffs and forks served), and `resolve --abandon` alone makes a
    session's world the copy's. The original then completes its own restore."""
    d, ws, s, cp, (other,) = _killed_mid_restore(tmp_path, files=10, nth=3, others=1)
    as_killed = {p.name: p.read_bytes() for p in ws.iterdir()}
    assert sorted(set(as_killed.values())) != [f"v1 {i}\n".encode() for i in range(10)]
    subprocess.run(["cp", "-a", str(d.root), str(tmp_path / "copy")], check=True)
    copy = DaemonProcess(tmp_path / "copy").start()
    try:
        with copy.client() as c:
            assert {p.name: p.read_bytes() for p in ws.iterdir()} == as_killed
            for sid in (s.id, other.id):
                assert "copy of the one at" in c.get_session(sid).needs_attention
                with pytest.raises(FailedPrecondition):
                    c.checkpoint(sid)
                with pytest.raises(FailedPrecondition):
                    c.restore(sid, cp.id)
            assert c.show(cp.id).id == cp.id and len(c.log(s.id)) >= 2
            (aside,) = c.audit(s.id, kind="restore.set_aside")  # the audit log says so
            assert aside.subject_id == cp.id and "copy of the one at" in aside.detail["reason"]
            (copied,) = c.audit(s.id, kind="session.copied")
            assert copied.detail == {"original": str(d.root), "restore": cp.id}
            assert c.audit(other.id, kind="restore.set_aside") == []
            assert [e.detail for e in c.audit(other.id, kind="session.copied")] == [
                {"original": str(d.root)}]
            assert c.verify_audit()["ok"]
            c.fork(cp.id, str(tmp_path / "seen"))
            assert (tmp_path / "seen" / "f0.txt").read_text() == "v1 0\n"
            assert "a restore to" in c.get_session(s.id).needs_attention
            for sid in (s.id, other.id):  # not into the original's workspace
                with pytest.raises(FailedPrecondition):
                    c.resolve_session(sid, complete=True)
            assert c.resolve_session(other.id, complete=False).needs_attention is None
            (tmp_path / "other-0" / "mine.txt").write_text("the copy's now\n")
            assert "mine.txt" in c.diff(other.head, c.checkpoint(other.id).id).added
        assert {p.name: p.read_bytes() for p in ws.iterdir()} == as_killed
    finally:
        copy.stop()
    d.start()  # the original: its restore is its own to complete
    with d.client() as c:
        assert c.get_session(s.id).needs_attention is None
        assert all((ws / f"f{i}.txt").read_text() == f"v1 {i}\n" for i in range(10))
        c.checkpoint(other.id)
    copy.start()  # a later start of the copy is not a first sight of it: nothing new
    copy.stop()
    log = copy.log.read_text()
    assert log.count("takes an id of its own") == 1
    assert log.count("waits for an operator") == 2  # its two sessions, at its first start


def test_7_another_sessions_checkpoint_restores_only_on_purpose(client, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    (one / "mine.txt").write_text("one\n")
    (two / "theirs.txt").write_text("two\n")
    a = client.create_session(str(one))
    b = client.create_session(str(two))
    theirs = b.checkpoint()
    with pytest.raises(FailedPrecondition) as err:
        a.restore(theirs.id)
    assert b.id in err.value.message
    assert (one / "mine.txt").exists() and not (one / "theirs.txt").exists()
    a.restore(theirs.id, from_other_session=True)
    assert (one / "theirs.txt").exists()
    # a fork's own ancestry is its lineage: no flag needed
    base = a.checkpoint()
    fork = client.fork(base.id, workspace=str(tmp_path / "fork"))
    fork.restore(base.id)


def test_8_approvals_mean_something(client, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    s = client.create_session(str(ws))
    denied = s.request_approval("deploy")
    client.decide_approval(denied.id, approve=False, reason="no")
    for tool in ("bash", "deploy"):
        with pytest.raises(FailedPrecondition):
            client.record_tool_call_raw(s.id, tool, approval_id=denied.id)
    ok = s.request_approval("deploy")
    client.decide_approval(ok.id, approve=True)
    with pytest.raises(FailedPrecondition):
        client.record_tool_call_raw(s.id, "push", approval_id=ok.id)  # another tool
    client.record_tool_call_raw(s.id, "deploy", approval_id=ok.id)
    with pytest.raises(FailedPrecondition) as err:
        client.record_tool_call_raw(s.id, "deploy", approval_id=ok.id)  # used up
    assert "already used" in err.value.message
    pending = s.request_approval("deploy")
    cancelled = client.cancel_approval(pending.id, reason="changed my mind")
    assert cancelled.status == "denied" and "cancelled" in cancelled.reason
    with pytest.raises(FailedPrecondition):
        client.decide_approval(pending.id, approve=True)


def test_8b_an_approval_belongs_to_its_session(client, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    a = client.create_session(str(one))
    b = client.create_session(str(two))
    approval = a.request_approval("deploy")
    client.decide_approval(approval.id, approve=True)
    with pytest.raises(FailedPrecondition):
        client.record_tool_call_raw(b.id, "deploy", approval_id=approval.id)


def test_9_limits(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    d = DaemonProcess(tmp_path / "root", ["--max-file-bytes", "1M", "--max-file-size", "10G",
                                          "--max-checkpoint-bytes", "3M"]).start()
    try:
        with d.client() as c:
            s = c.create_session(str(ws))
            head = s.head
            (ws / "big.bin").write_bytes(os.urandom(2 << 20))
            started = time.monotonic()
            with pytest.raises(ResourceExhausted) as err:
                s.checkpoint()
            assert time.monotonic() - started < 1.0
            assert "big.bin" in err.value.message and "--max-file-bytes" in err.value.message
            (ws / "big.bin").unlink()
            with open(ws / "huge.img", "wb") as f:
                f.truncate(20 << 30)  # 20 GiB of holes: past the logical size limit
            with pytest.raises(ResourceExhausted) as err:
                s.checkpoint()
            assert "huge.img" in err.value.message
            (ws / "huge.img").unlink()
            for i in range(4):
                (ws / f"part{i}.bin").write_bytes(os.urandom(900 << 10))
            with pytest.raises(ResourceExhausted) as err:
                s.checkpoint()
            assert "--max-checkpoint-bytes" in err.value.message
            assert [x.id for x in c.log(s.id)] == [head]  # nothing partial recorded
            (ws / "part3.bin").unlink()
            s.checkpoint()
            assert c.fsck()["ok"]
    finally:
        d.stop()


@pytest.mark.parametrize("start,grow,refused", [
    (1, 40, True),   # a small file, read whole into memory
    (5, 40, True),   # a larger one, hashed then copied aside in the data root
    (1, 2, False),   # growth within the limits: captured, as it was when read
], ids=["small-past-the-limits", "large-past-the-limits", "within-the-limits"])
def test_9c_a_file_that_grows_while_it_is_read(tmp_path, agent_home, canary, start, grow,
                                                 refused):
    """A process of the agent's on the host (never paused, as a container's are)
    writes on to a file the capture has opened and budgeted and not yet read (held
    there: ``capture.file_opened``). Before 0.7.34 the daemon read it to its end,
    whatever that was: past --max-file-bytes, --max-checkpoint-bytes and the data
    root's floor, into its memory or the data root. Now what it grew by counts as
    changed bytes do: past a limit the checkpoint is RESOURCE_EXHAUSTED naming the
    file and the limit, having read one byte past it at the most, and records nothing;
    within them, it is captured as it was read."""
    before = fingerprint(canary)
    ws = agent_home / "proj" / "ws"
    d = DaemonProcess(tmp_path / "root", ["--max-file-bytes", "16M",
                                          "--max-checkpoint-bytes", "24M"],
                      env={"WORLDLINE_FAULTS": "capture.file_opened@3"}).start()
    try:
        with d.client() as c:
            s = c.create_session(str(ws))  # empty: no file read, the point not passed
            head = s.head
            as_agent(f"head -c {start}M /dev/urandom > log", ws)
            outcome: list = []

            def checkpoint() -> None:
                try:
                    outcome.append(s.checkpoint())
                except ResourceExhausted as exc:
                    outcome.append(exc)
            taking = threading.Thread(target=checkpoint)
            taking.start()
            time.sleep(1.0)  # the capture waits at the point for 3 s
            as_agent(f"head -c {grow}M /dev/urandom >> log", ws)
            grown = (ws / "log").read_bytes()
            taking.join(30)
            assert not taking.is_alive() and len(outcome) == 1
            if refused:
                err = outcome[0]
                assert isinstance(err, ResourceExhausted), err
                assert "log grew while it was read" in err.message
                assert "--max-file-bytes" in err.message
                assert [x.id for x in c.log(s.id)] == [head]  # nothing recorded
                stored = sum(p.stat().st_size for p in (tmp_path / "root").rglob("*")
                             if p.is_file())
                assert stored < 24 << 20  # not the 41 MiB it grew to
                as_agent("truncate -s 2M log", ws)
                grown = (ws / "log").read_bytes()
                cp = s.checkpoint()
            else:
                cp = outcome[0]
                assert len(grown) == (start + grow) << 20
            as_agent("echo other > log", ws)
            s.restore(cp.id)
            assert (ws / "log").read_bytes() == grown
            assert c.fsck()["ok"]
    finally:
        d.stop()
    assert fingerprint(canary) == before


def test_9d_a_layer_filled_with_names_is_refused_not_walked_to_its_end(
        tmp_path, agent_home, canary):
    """An agent that makes millions of names (empty files, links: cheap for it) made a
    full scan hold about a kilobyte of the daemon's memory for each, until the machine
    ran out. Past --max-entries (here 2,000) a checkpoint is RESOURCE_EXHAUSTED naming
    the workspace and the limit, and records nothing: an incremental capture counts
    from its head, a full scan's walk (after a restart) stops at the limit. Another
    session goes on meanwhile, and a restore (whose look at the layer stores nothing)
    brings the layer back under the limit, unless that look is a full scan; once the
    agent removes the names, checkpoints and restores work again."""
    before = fingerprint(canary)
    ws = agent_home / "proj" / "ws"
    other = tmp_path / "other"
    other.mkdir()
    d = DaemonProcess(tmp_path / "root", ["--max-entries", "2000"])
    try:
        d.start()
        with d.client() as c:
            s = c.create_session(str(ws))
            neighbour = c.create_session(str(other))
            as_agent("mkdir -p src/a src/b && seq 1 600 | sed 's|^|src/a/f|' | xargs touch"
                     " && ln -s a src/alias", ws)
            first = s.checkpoint().id  # 604 names: within the limit
            logged = [x.id for x in c.log(s.id)]
            as_agent("mkdir many && seq 1 1500 | sed 's|^|many/g|' | xargs touch", ws)
            with pytest.raises(ResourceExhausted) as err:
                s.checkpoint()  # 2,105 names, counted from the head's 604
            assert f"the workspace {ws} holds 2,105 entries" in err.value.message
            assert "--max-entries" in err.value.message
            assert [x.id for x in c.log(s.id)] == logged  # nothing recorded
            (other / "note").write_text("the neighbour goes on\n")
            assert neighbour.checkpoint().id
            s.restore(first, acknowledge_side_effects=True)  # brings it under the limit
            assert not (ws / "many").exists() and len(list((ws / "src/a").iterdir())) == 600
            as_agent("mkdir many && seq 1 1500 | sed 's|^|many/g|' | xargs touch", ws)
        d.stop()
        d.start()  # a start: the first capture is a full scan, whose walk stops at 2,000
        with d.client() as c:
            s = c.get_session(s.id)
            for refused in (s.checkpoint, lambda: s.restore(first)):
                with pytest.raises(ResourceExhausted) as err:
                    refused()  # the full scan's walk stops at 2,000
                assert "holds more than 2,000 entries" in err.value.message
            assert (ws / "many" / "g1500").exists()  # the refused restore changed nothing
            as_agent("rm -rf many && echo changed > src/a/f1", ws)
            cp = s.checkpoint()
            as_agent("echo again > src/a/f1", ws)
            s.restore(first, acknowledge_side_effects=True)
            assert (ws / "src/a/f1").read_bytes() == b""
            s.restore(cp.id, acknowledge_side_effects=True)
            assert (ws / "src/a/f1").read_text() == "changed\n"
            assert c.fsck()["ok"]
    finally:
        d.stop()
    assert fingerprint(canary) == before


def test_9b_free_space_floor(tmp_path, tmpfs):
    root = tmpfs(tmp_path / "small", "64m")
    d = DaemonProcess(root / "data", ["--min-free-bytes", "60M"]).start()
    try:
        ws = tmp_path / "ws"
        ws.mkdir()
        with d.client() as c:
            s = c.create_session(str(ws))
            (ws / "f.bin").write_bytes(os.urandom(8 << 20))
            with pytest.raises(ResourceExhausted) as err:
                s.checkpoint()
            assert "floor" in err.value.message
    finally:
        d.stop()


def test_10_names_that_are_not_utf8(client, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    raw = [b"bad\xffname", b"back\\slash", b"caf\xc3\xa9"]
    for name in raw:
        (ws / os.fsdecode(name)).write_bytes(b"1")
    s = client.create_session(str(ws))
    for name in raw:
        (ws / os.fsdecode(name)).write_bytes(b"2")
    cp = s.checkpoint()
    d = client.diff(client.log(s.id)[0].id, cp.id, patch=True)
    assert sorted(to_bytes(p) for p in d.modified) == sorted(raw)
    assert "bad\\xffname" in d.patch
    for name in raw:
        os.unlink(ws / os.fsdecode(name))
    result = s.restore(cp.id)
    assert sorted(to_bytes(p) for p in result.files_written) == sorted(raw)
    assert sorted(os.listdir(os.fsencode(ws))) == sorted(raw)


def test_11_repeated_sigterm_stops_the_daemon(tmp_path):
    d = DaemonProcess(tmp_path / "root").start()
    for _ in range(3):
        d.proc.send_signal(signal.SIGTERM)
    assert d.proc.wait(15) == 0
    d.proc = None


def test_11a_a_stop_signal_delivered_to_any_thread_stops_the_daemon(tmp_path):
    """The kernel delivers a signal sent to the daemon to any of its threads. One that
    landed on a gRPC thread left the main thread asleep, waiting for its Python handler
    to run, and the daemon never stopped (test_11 failed so on a loaded machine).
    Here SIGTERM goes to one thread that is not the main one, on purpose (tgkill)."""
    import ctypes
    import platform
    d = DaemonProcess(tmp_path / "root").start()
    pid = d.proc.pid
    others = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid)
    assert others
    tgkill = {"x86_64": 234, "aarch64": 131}[platform.machine()]  # the syscall's number
    assert ctypes.CDLL(None).syscall(tgkill, pid, others[-1], signal.SIGTERM) == 0
    assert d.proc.wait(15) == 0
    d.proc = None


def test_11b_the_cli_is_quiet_on_a_closed_pipe(client, daemon, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    s = client.create_session(str(ws))
    cp = s.checkpoint(messages=[{"role": "user", "content": "x" * 300_000}])
    proc = subprocess.Popen(WORLDLINE + ["--address", daemon.address, "show", cp.id, "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.read(10)
    proc.stdout.close()  # as `| head -c 10` does
    proc.wait(30)
    assert proc.stderr.read() == b""


RACER = r"""
proj=$1 canary=$2 ws=$3
end=$(( $(date +%s) + $4 )); n=0
while [ "$(date +%s)" -lt "$end" ]; do
  n=$((n + 1))
  if [ $((n % 2)) = 1 ]; then  # a folder in the workspace becomes a symlink out, and back
    mv "$ws/sub" "$ws/sub.real" && ln -s "$canary/ws" "$ws/sub" && sleep 0.002
    rm -f "$ws/sub"; mv "$ws/sub.real" "$ws/sub"
  else  # the workspace's parent becomes a symlink to the canary, and back
    mv "$proj" "$proj.real" && ln -s "$canary" "$proj" && sleep 0.002
    rm -f "$proj"; mv "$proj.real" "$proj"
  fi
done 2>/dev/null
echo "$n"
"""


def test_race_swapping_folders_and_parents_for_symlinks(client, agent_home, canary):
    before = fingerprint(canary)
    proj = agent_home / "proj"
    ws = proj / "ws"
    as_agent("mkdir -p sub/deeper && echo one > sub/a.txt && echo two > sub/deeper/b.txt"
             " && cp /bin/true sub/tool && chmod 4755 sub/tool && echo top > top.txt", ws)
    s = client.create_session(str(ws))
    good = s.checkpoint()
    racer = subprocess.Popen(
        ["setpriv", f"--reuid={AGENT_UID}", f"--regid={AGENT_UID}", "--clear-groups",
         "sh", "-c", RACER, "racer", str(proj), str(canary), str(ws), "6"],
        cwd=agent_home, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    done = refused = 0
    deadline = time.monotonic() + 6
    try:
        while time.monotonic() < deadline:
            try:
                if done % 3 == 2:
                    s.restore(good.id, acknowledge_side_effects=True)
                else:
                    s.checkpoint()
                done += 1
            except (FailedPrecondition, Aborted):
                refused += 1
                if client.get_session(s.id).needs_attention:
                    try:
                        client.resolve_session(s.id, complete=False)
                    except FailedPrecondition:
                        pass
    finally:
        out, err = racer.communicate(timeout=60)
    swaps = int(out.decode().strip() or 0)
    assert swaps > 20, f"the racer did not race: {err.decode()}"
    assert done > 0, f"every operation was refused ({refused})"
    assert differences(before, fingerprint(canary)) == [], "the canary was touched"
    leaked = [p for p in fingerprint(canary) if p not in before]
    assert leaked == []
    # nothing the agent owned became root's, nothing gained a privilege
    for path, rec in fingerprint(proj).items():
        info = dict(rec)
        if info.get("mode", 0) & 0o6000:
            assert info["uid"] == AGENT_UID, path
    assert client.get_session(s.id).id == s.id  # the daemon answered throughout
