"""An operator's questions, from the CLI as a person types it (issue 58): a restore
that loses nothing (the world as it was is checkpointed first), a file's history and
its bytes as of a checkpoint, a restore of a few paths, ids a person can type, and a
rewind that counts tool calls."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from .conftest import WORLDLINE, DaemonProcess, tree_state
from .fidelity import AGENT_UID, as_agent


def fails(daemon, *args: str, cwd: str | None = None) -> str:
    """The error code a command fails with (its --json error document)."""
    res = subprocess.run(WORLDLINE + list(args) + ["--address", daemon.address, "--json"],
                         capture_output=True, text=True, timeout=60, env=daemon.env, cwd=cwd)
    assert res.returncode != 0, res.stdout
    return json.loads(res.stdout)["error"]["code"]


def session_on(daemon, ws: Path) -> str:
    return daemon.cli_json("session", "create", "--workspace", str(ws))["id"]


def checkpoint(daemon, sid: str, label: str = "") -> dict:
    return daemon.cli_json("checkpoint", sid, *(["--label", label] if label else []))


# -- 1. nothing is lost by a restore ---------------------------------------------------
def test_an_uncheckpointed_edit_survives_a_restore_and_comes_back(daemon, workspace):
    (workspace / "notes.txt").write_text("line 1\n")
    sid = session_on(daemon, workspace)
    first = daemon.cli_json("session", "show", sid)["head"]
    (workspace / "notes.txt").write_text("line 1\nline 2\n")
    second = checkpoint(daemon, sid)["id"]
    with open(workspace / "notes.txt", "a") as f:
        f.write("line 3, never checkpointed\n")
    (workspace / "new.bin").write_bytes(b"\0\1\2")
    edited = tree_state(workspace)

    dry = daemon.cli_json("restore", sid, first, "--dry-run")
    assert dry["before"] is None and dry["not_checkpointed"] == ["new.bin", "notes.txt"]
    text = daemon.cli("restore", sid, first, "--dry-run").stdout
    assert "new.bin" in text and "notes.txt" in text and "before restore" in text
    log = daemon.cli_json("log", sid)
    assert [c["id"] for c in log][-1] == second and len(log) == 2  # captured nothing
    assert tree_state(workspace) == edited

    r = daemon.cli_json("restore", sid, first)
    before = r["before"]
    assert before["label"] == "before restore" and before["parent_id"] == second
    assert r["checkpoint"]["parent_id"] == before["id"]
    assert r["not_checkpointed"] == ["new.bin", "notes.txt"]
    assert (workspace / "notes.txt").read_text() == "line 1\n"
    assert not (workspace / "new.bin").exists()
    log = daemon.cli_json("log", sid)
    assert [c["id"] for c in log][-2:] == [before["id"], r["checkpoint"]["id"]]
    assert log[-2]["seq"] < log[-1]["seq"] and before["id"] < r["checkpoint"]["id"]

    undo = daemon.cli("restore", sid, before["id"]).stdout
    assert tree_state(workspace) == edited
    # the world equalled the head (the restore): nothing new to keep
    assert "NOT kept" not in undo and "kept as checkpoint" not in undo
    assert daemon.cli_json("log", sid)[-1]["kind"] == "restore"
    assert daemon.cli_json("log", sid)[-2]["label"] != "before restore"


def test_a_restore_of_a_world_equal_to_its_head_takes_no_checkpoint(daemon, workspace):
    (workspace / "a.txt").write_text("a\n")
    sid = session_on(daemon, workspace)
    first = daemon.cli_json("session", "show", sid)["head"]
    (workspace / "a.txt").write_text("b\n")
    checkpoint(daemon, sid)
    r = daemon.cli_json("restore", sid, first)
    assert r["before"] is None and r["not_checkpointed"] == []
    assert [c["kind"] for c in daemon.cli_json("log", sid)] == ["initial", "checkpoint",
                                                                 "restore"]


def test_a_restore_killed_after_the_world_was_kept_loses_nothing(tmp_path):
    """A kill once the world as it was is committed (and the journal not yet written,
    or written): every acknowledged checkpoint, the kept one included, restores byte
    for byte."""
    for n, point in enumerate(("restore.planned", "restore.after_journal")):
        ws = tmp_path / f"ws{n}"
        ws.mkdir()
        (ws / "f.txt").write_text("one\n")
        d = DaemonProcess(tmp_path / f"r{n}", env={"WORLDLINE_FAULTS": point}).start()
        sid = session_on(d, ws)
        first = d.cli_json("session", "show", sid)["head"]
        (ws / "f.txt").write_text("two, not checkpointed\n")
        edited = tree_state(ws)
        assert d.cli("restore", sid, first, check=False).returncode != 0
        assert d.proc.wait(15) == -signal.SIGKILL
        d.proc = None
        d.env.pop("WORLDLINE_FAULTS")
        d.start()
        try:
            log = d.cli_json("log", sid)
            kept = [c for c in log if c["label"] == "before restore"]
            assert len(kept) == 1, log
            if point == "restore.after_journal":  # completed at the start
                assert log[-1]["kind"] == "restore" and log[-1]["parent_id"] == kept[0]["id"]
            d.cli("restore", sid, kept[0]["id"])
            assert tree_state(ws) == edited
            d.cli("restore", sid, first)
            assert (ws / "f.txt").read_text() == "one\n"
            assert d.cli_json("fsck")["ok"]
        finally:
            d.stop()


def test_a_container_restore_names_the_processes_it_stops(daemon, workspace, containers):
    from .test_containers import IMAGE, sh
    s = daemon.cli_json("session", "create", "--workspace", str(workspace), "--image", IMAGE)
    containers.append(s["container"])
    first = s["head"]
    sh(s["container"], "echo kept > /srv.txt")
    subprocess.run(["docker", "exec", "-d", s["container"], "sleep", "1000"], check=True)
    dry = daemon.cli_json("restore", s["id"], first, "--dry-run")
    assert any(p.endswith("sleep 1000") for p in dry["processes"]), dry["processes"]
    assert dry["not_checkpointed"] == ["container:srv.txt"]
    assert "sleep 1000" in daemon.cli("restore", s["id"], first, "--dry-run").stdout
    r = daemon.cli_json("restore", s["id"], first)
    assert any(p.endswith("sleep 1000") for p in r["processes"])
    assert r["before"]["container"] and r["not_checkpointed"] == ["container:srv.txt"]
    assert "sleep 1000" not in sh(s["container"], "ps")
    daemon.cli("restore", s["id"], r["before"]["id"])
    assert sh(s["container"], "cat /srv.txt") == "kept\n"


def test_the_world_kept_before_a_restore_is_uid_1000s_as_it_was(daemon, places):
    ws, _ = places
    as_agent("echo one > a.txt && mkdir src && echo code > src/m.py", ws)
    sid = session_on(daemon, ws)
    first = daemon.cli_json("session", "show", sid)["head"]
    as_agent("echo two >> a.txt && chmod 600 src/m.py && ln -s a.txt link && mkdir -p d/e",
             ws)
    edited = tree_state(ws)
    owners = {p: (os.lstat(ws / p).st_uid, os.lstat(ws / p).st_gid) for p in edited}
    r = daemon.cli_json("restore", sid, first)
    assert r["not_checkpointed"] == ["a.txt", "d/e", "link", "src/m.py"]
    daemon.cli("restore", sid, r["before"]["id"])
    assert tree_state(ws) == edited
    assert {p: (os.lstat(ws / p).st_uid, os.lstat(ws / p).st_gid) for p in edited} == owners
    assert set(owners.values()) == {(AGENT_UID, AGENT_UID)}
