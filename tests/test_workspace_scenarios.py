"""Scenarios through a real daemon over its Unix socket: what a restore brings back,
what a fork keeps apart, what a diff reports."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest

from .conftest import stored_blobs, tree_state


def build_tree(ws: Path) -> None:
    (ws / "src/pkg").mkdir(parents=True)
    (ws / "src/pkg/__init__.py").write_text("")
    (ws / "src/pkg/mod.py").write_text("def f():\n    return 1\n")
    (ws / "run.sh").write_text("#!/bin/sh\necho run\n")
    os.chmod(ws / "run.sh", 0o755)
    (ws / "secret").write_text("owner only\n")
    os.chmod(ws / "secret", 0o600)
    os.symlink("src/pkg/mod.py", ws / "rel-link")
    os.symlink("/etc/hostname", ws / "outside-link")
    os.symlink("/nonexistent/target", ws / "dangling-link")
    os.symlink("src", ws / "dir-link")
    (ws / "empty/nested-empty").mkdir(parents=True)
    os.chmod(ws / "empty", 0o711)
    (ws / "日本語 name ✓.txt").write_text("unicode\n")
    (ws / "name with\nnewline").write_text("newline\n")
    (ws / "swap").write_text("I am a file\n")


def test_round_trip_fidelity(client, workspace):
    build_tree(workspace)
    s = client.create_session(str(workspace))
    cp = s.checkpoint(label="pristine")
    before = tree_state(workspace)
    # wreck it: contents, modes, links, folders, a file replaced by a folder
    (workspace / "src/pkg/mod.py").write_text("broken\n")
    os.chmod(workspace / "run.sh", 0o644)
    os.unlink(workspace / "rel-link")
    os.symlink("elsewhere", workspace / "rel-link")
    shutil.rmtree(workspace / "empty")
    os.unlink(workspace / "swap")
    (workspace / "swap").mkdir()
    (workspace / "swap/child").write_text("x")
    (workspace / "junk").mkdir()
    (workspace / "junk/file").write_text("junk")
    s.checkpoint(label="wrecked")
    result = s.restore(cp.id)
    assert tree_state(workspace) == before
    assert "junk/file" in result.files_removed
    assert "src/pkg/mod.py" in result.files_written
    assert result.checkpoint.kind == "restore" and result.checkpoint.restored_from == cp.id
    # ... and back to the wrecked state, then forward again: history kept every version
    log = s.log()
    wrecked = next(c for c in log if c.label == "wrecked")
    s.restore(wrecked.id)
    assert (workspace / "swap/child").read_text() == "x"
    s.restore(cp.id)
    assert tree_state(workspace) == before


def test_file_replaced_by_folder_and_back(client, workspace):
    (workspace / "x").write_text("file")
    s = client.create_session(str(workspace))
    a = s.checkpoint()
    os.unlink(workspace / "x")
    (workspace / "x/y").mkdir(parents=True)
    (workspace / "x/y/z").write_text("deep")
    b = s.checkpoint()
    s.restore(a.id)
    assert (workspace / "x").read_text() == "file"
    s.restore(b.id)
    assert (workspace / "x/y/z").read_text() == "deep"


def test_large_binary_file(client, workspace):
    data = random.Random(7).randbytes(50 << 20)
    (workspace / "big.bin").write_bytes(data)
    s = client.create_session(str(workspace))
    cp = s.checkpoint()
    (workspace / "big.bin").write_bytes(b"truncated")
    s.restore(cp.id)
    assert (workspace / "big.bin").read_bytes() == data


def test_restore_after_heavy_corruption(client, workspace):
    rng = random.Random(3)
    for i in range(300):
        p = workspace / f"d{i % 17}" / f"e{i % 5}" / f"f{i}.txt"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(rng.randbytes(rng.randint(0, 5000)))
    s = client.create_session(str(workspace))
    cp = s.checkpoint()
    before = tree_state(workspace)
    for i, p in enumerate(sorted(workspace.rglob("*.txt"))):
        if i % 3 == 0:
            p.unlink()
        elif i % 3 == 1:
            p.write_bytes(b"corrupted")
    shutil.rmtree(workspace / "d3")
    (workspace / "d4").rename(workspace / "renamed")
    os.symlink("/", workspace / "d5/e0/root-link")
    s.restore(cp.id)
    assert tree_state(workspace) == before


def test_restore_never_writes_through_a_symlinked_folder(client, workspace, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (workspace / "sub").mkdir()
    (workspace / "sub/f.txt").write_text("inside")
    s = client.create_session(str(workspace))
    cp = s.checkpoint()
    shutil.rmtree(workspace / "sub")
    os.symlink(outside, workspace / "sub")  # a folder swapped for a symlink to outside
    s.restore(cp.id)
    assert list(outside.iterdir()) == []
    assert not (workspace / "sub").is_symlink()
    assert (workspace / "sub/f.txt").read_text() == "inside"


def test_dry_run_changes_nothing(client, workspace):
    (workspace / "a").write_text("1")
    s = client.create_session(str(workspace))
    cp = s.checkpoint()
    (workspace / "a").write_text("2")
    (workspace / "b").write_text("new")
    head_before = client.get_session(s.id).head
    r = s.restore(cp.id, dry_run=True)
    assert r.dry_run and r.checkpoint is None
    assert r.files_written == ["a"] and r.files_removed == ["b"]
    assert (workspace / "a").read_text() == "2" and (workspace / "b").exists()
    assert client.get_session(s.id).head == head_before


def test_fork_isolation(client, workspace, tmp_path):
    build_tree(workspace)
    s = client.create_session(str(workspace))
    cp = s.checkpoint(messages=[{"role": "user", "content": "build it"}], state={"plan": "A"})
    s.set_task("t1", "completed", title="first")
    s.set_task("t2", "pending", title="second")
    cp2 = s.checkpoint()
    fork_ws = tmp_path / "fork"
    f = s.fork(cp2.id, workspace=str(fork_ws))
    assert f.forked_from == cp2.id and f.workspace == str(fork_ws)
    assert tree_state(fork_ws) == tree_state(workspace)
    # a write in one never shows in the other
    (fork_ws / "src/pkg/mod.py").write_text("fork edit\n")
    (workspace / "only-parent").write_text("p")
    assert (workspace / "src/pkg/mod.py").read_text() == "def f():\n    return 1\n"
    assert not (fork_ws / "only-parent").exists()
    fcp = f.checkpoint()
    d = client.diff(cp2.id, fcp.id)
    assert d.modified == ["src/pkg/mod.py"] and d.added == [] and d.deleted == []
    shown = client.show(client.get_session(f.id).head)
    assert shown.messages == [{"role": "user", "content": "build it"}]
    assert shown.state == {"plan": "A"}
    tasks, resume = f.tasks()
    assert [t.id for t in tasks] == ["t1", "t2"] and resume == "t2"
    # a default fork lands under the data root
    g = client.fork(cp.id)
    assert Path(g.workspace).is_dir() and g.workspace != str(workspace)


def test_fork_refuses_non_empty_target(client, workspace, tmp_path):
    from worldline.client import FailedPrecondition
    s = client.create_session(str(workspace))
    target = tmp_path / "busy"
    target.mkdir()
    (target / "x").write_text("mine")
    with pytest.raises(FailedPrecondition):
        s.fork(s.head, workspace=str(target))
    assert (target / "x").read_text() == "mine"


def test_diff_accuracy(client, workspace):
    (workspace / "keep").write_text("same")
    (workspace / "mod").write_text("before\n")
    (workspace / "gone").write_text("bye")
    (workspace / "emptydir").mkdir()
    (workspace / "mode.sh").write_text("x")
    s = client.create_session(str(workspace))
    a = s.checkpoint()
    (workspace / "mod").write_text("after\n")
    os.unlink(workspace / "gone")
    (workspace / "new/deeper").mkdir(parents=True)
    (workspace / "new/deeper/file").write_text("n")
    os.rmdir(workspace / "emptydir")
    os.chmod(workspace / "mode.sh", 0o755)
    os.symlink("keep", workspace / "ln")
    b = s.checkpoint()
    d = client.diff(a.id, b.id)
    assert d.added == ["ln", "new/deeper/file"]
    assert d.modified == ["mod", "mode.sh"]
    assert d.deleted == ["emptydir", "gone"]
    back = client.diff(b.id, a.id)
    assert (back.added, back.deleted) == (d.deleted, d.added)
    patch = client.diff(a.id, b.id, patch=True).patch
    assert "-before\n+after\n" in patch and "--- a/gone" in patch


def test_conversation_and_state_as_of_each_checkpoint(client, workspace):
    s = client.create_session(str(workspace))
    a = s.checkpoint(messages=[{"role": "user", "content": "one"}], state={"n": 1})
    b = s.checkpoint(messages=[{"role": "assistant", "content": "two", "tool_calls": []}])
    c = s.checkpoint(messages=[{"role": "user", "content": "three"}], state={"n": 3})
    assert [m["content"] for m in client.show(c.id).messages] == ["one", "two", "three"]
    assert client.show(b.id).state == {"n": 1}  # state carried forward when not given
    r = s.restore(a.id)
    shown = client.show(r.checkpoint.id)
    assert [m["content"] for m in shown.messages] == ["one"] and shown.state == {"n": 1}
    d = s.checkpoint(messages=[{"role": "user", "content": "four"}])
    assert [m["content"] for m in client.show(d.id).messages] == ["one", "four"]
    assert [c.seq for c in s.log()] == [0, 1, 2, 3, 4, 5]


def test_identical_content_is_stored_once(daemon, client, workspace, tmp_path):
    count = lambda: stored_blobs(daemon.root)
    payload = os.urandom(1 << 20)
    (workspace / "a.bin").write_bytes(payload)
    s = client.create_session(str(workspace))
    n0 = count()
    other = tmp_path / "other"
    other.mkdir()
    (other / "copy.bin").write_bytes(payload)
    client.create_session(str(other)).checkpoint()
    s.checkpoint()
    assert count() - n0 <= 4  # a root tree or two and task lists; never the 1 MiB again


def test_fifo_is_skipped_not_opened(client, workspace):
    os.mkfifo(workspace / "pipe")
    (workspace / "f").write_text("ok")
    s = client.create_session(str(workspace))
    cp = s.checkpoint()  # would hang forever if the FIFO were opened
    (workspace / "f").write_text("changed")
    s.restore(cp.id)
    assert (workspace / "f").read_text() == "ok"


def test_restore_over_hard_links_made_since_the_last_checkpoint(client, workspace):
    """The restore's look at the workspace as it is now (never stored) names hard-link
    groups no checkpoint has: they are read from that look, not from the blob store."""
    (workspace / "a.txt").write_text("a\n")
    s = client.create_session(str(workspace))
    first = s.checkpoint()
    os.link(workspace / "a.txt", workspace / "b.txt")
    (workspace / "c.txt").write_text("c\n")
    os.link(workspace / "c.txt", workspace / "d.txt")
    dry = s.restore(first.id, dry_run=True)
    assert sorted(dry.files_removed) == ["b.txt", "c.txt", "d.txt"]
    s.restore(first.id)
    assert sorted(p.name for p in workspace.iterdir()) == ["a.txt"]
    assert os.stat(workspace / "a.txt").st_nlink == 1
