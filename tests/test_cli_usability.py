"""The CLI as its users found it (0.5): version, inline JSON, relative paths, bare
socket paths, session delete, audit arguments, pruned checkpoints in the log, the
approval id printed at once, gc's dry run in English."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from worldline.client import FailedPrecondition, InvalidArgument

from .conftest import WORLDLINE


def test_version(daemon):
    from importlib.metadata import version
    res = daemon.cli("--version")
    assert res.stdout.strip() == f"worldline {version('worldline')}"


def test_state_and_messages_inline_or_in_a_file(daemon, workspace, tmp_path):
    s = daemon.cli_json("session", "create", "--workspace", str(workspace))
    cp = daemon.cli_json("checkpoint", s["id"], "--state", '{"step": 1}',
                         "--messages", '[{"role": "user", "content": "hi"}]')
    shown = daemon.cli_json("show", cp["id"])
    assert shown["state"] == {"step": 1} and shown["messages"][0]["content"] == "hi"
    f = tmp_path / "state.json"
    f.write_text('{"step": 2}')
    cp = daemon.cli_json("checkpoint", s["id"], "--state", str(f))
    assert daemon.cli_json("show", cp["id"])["state"] == {"step": 2}


def test_relative_paths_are_the_callers(daemon, tmp_path):
    (tmp_path / "rel-ws").mkdir()
    res = subprocess.run(WORLDLINE + ["session", "create", "--workspace", "rel-ws", "--json",
                                      "--address", daemon.address],
                         capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["workspace"] == str(tmp_path / "rel-ws")
    with daemon.client() as c:
        old = os.getcwd()
        os.chdir(tmp_path)
        try:
            assert c.list_sessions(workspace="rel-ws")[0].workspace == str(tmp_path / "rel-ws")
        finally:
            os.chdir(old)


def test_address_may_be_a_bare_socket_path(daemon):
    path = daemon.address[len("unix://"):]
    res = subprocess.run(WORLDLINE + ["session", "list", "--json", "--address", path],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    env = {**os.environ, "WORLDLINE_ADDRESS": path}
    res = subprocess.run(WORLDLINE + ["session", "list", "--json"], capture_output=True,
                         text=True, env=env, timeout=60)
    assert res.returncode == 0, res.stderr


def test_session_delete_keeps_history_and_releases_the_workspace(daemon, client, workspace):
    (workspace / "f").write_text("1")
    s = client.create_session(str(workspace))
    cp = s.checkpoint(label="kept")
    a = s.request_approval("deploy")
    deleted = daemon.cli_json("session", "delete", s.id)
    assert deleted["deleted_at"]
    assert s.id not in [x["id"] for x in daemon.cli_json("session", "list")]
    assert s.id in [x["id"] for x in daemon.cli_json("session", "list", "--all")]
    assert client.get_approval(a.id).status == "denied"  # withdrawn
    # History stays readable and forkable; the session takes no new checkpoint.
    assert [c.label for c in client.log(s.id)][-2] == "kept"
    assert client.show(cp.id).label == "kept"
    with pytest.raises(FailedPrecondition):
        s.checkpoint()
    fork = client.fork(cp.id)
    assert (Path(fork.workspace) / "f").read_text() == "1"
    # The folder is free for a new session; the file is untouched.
    again = client.create_session(str(workspace))
    assert again.id != s.id and (workspace / "f").read_text() == "1"
    audit = client.audit(session_id=s.id, kind="session.delete")
    assert len(audit) == 1


def test_audit_refuses_a_negative_limit_and_an_unknown_kind(daemon, client):
    for args in (["audit", "--limit", "-1"], ["audit", "--kind", "nonsense"]):
        res = daemon.cli(*args, check=False)
        assert res.returncode == 1 and res.stderr.startswith("error: INVALID_ARGUMENT:")
    with pytest.raises(InvalidArgument):
        client.audit(kind="nonsense")
    assert daemon.cli_json("audit", "--kind", "checkpoint", "--limit", "1") is not None


def test_log_marks_pruned_checkpoints(daemon, client, workspace):
    s = client.create_session(str(workspace))
    for i in range(3):
        (workspace / "f").write_text(str(i))
        s.checkpoint(label=f"c{i}")
    daemon.cli("gc", "--keep-last", "1")
    text = daemon.cli("log", s.id).stdout
    assert "[pruned]" in text
    assert any(c["pruned"] for c in daemon.cli_json("log", s.id))


def test_approval_wait_prints_the_id_and_the_command_at_once(daemon, client, workspace):
    s = client.create_session(str(workspace))
    proc = subprocess.Popen(WORLDLINE + ["approval", "request", s.id, "deploy", "--wait", "20",
                                         "--address", daemon.address],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = proc.stderr.readline()  # before any decision
    assert "worldline approve " in first
    approval_id = first.split("approval ", 1)[1].split()[0]
    assert client.get_approval(approval_id).status == "pending"
    client.decide_approval(approval_id, approve=True, reason="ok")
    assert proc.wait(timeout=30) == 0


def test_gc_dry_run_reads_as_english(daemon):
    text = daemon.cli("gc", "--dry-run").stdout
    assert text.startswith("would prune ") and "would remove" in text and "would free" in text


def test_list_sessions_by_workspace(daemon, client, workspace, tmp_path):
    s = client.create_session(str(workspace))
    (workspace / "sub").mkdir()
    assert [x.id for x in client.list_sessions(workspace=str(workspace / "sub"))] == [s.id]
    assert client.list_sessions(workspace=str(tmp_path / "elsewhere")) == []
