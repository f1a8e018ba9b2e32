"""The CLI surface of CONTRACT.md: every command, its JSON keys, its exit codes."""

from __future__ import annotations

import json

import pytest

SESSION_KEYS = {"id", "workspace", "container", "head"}
CHECKPOINT_KEYS = {"id", "session_id", "seq", "parent_id", "label", "created_at"}


def test_every_command_prints_the_contract_keys(daemon, workspace, tmp_path):
    (workspace / "a.py").write_text("print(1)\n")
    s = daemon.cli_json("session", "create", "--workspace", str(workspace), "--name", "demo")
    assert SESSION_KEYS <= s.keys() and s["container"] is None and s["workspace"] == str(workspace)
    assert any(x["id"] == s["id"] for x in daemon.cli_json("session", "list"))
    assert daemon.cli_json("session", "show", s["id"])["id"] == s["id"]

    msgs = tmp_path / "m.json"
    msgs.write_text(json.dumps([{"role": "user", "content": "fix it", "name": "ann"}]))
    state = tmp_path / "s.json"
    state.write_text(json.dumps({"step": 1}))
    cp1 = daemon.cli_json("checkpoint", s["id"], "--label", "L1", "--reasoning", "why",
                          "--messages", str(msgs), "--state", str(state))
    assert CHECKPOINT_KEYS <= cp1.keys() and cp1["seq"] == 1 and cp1["label"] == "L1"
    assert cp1["parent_id"] == s["head"]

    (workspace / "a.py").write_text("print(2)\n")
    (workspace / "b.py").write_text("new\n")
    cp2 = daemon.cli_json("checkpoint", s["id"])
    log = daemon.cli_json("log", s["id"])
    assert [c["id"] for c in log] == [s["head"], cp1["id"], cp2["id"]]

    shown = daemon.cli_json("show", cp2["id"])
    assert CHECKPOINT_KEYS <= shown.keys()
    assert shown["messages"] == [{"role": "user", "content": "fix it", "name": "ann"}]
    assert shown["state"] == {"step": 1} and shown["tasks"] == []

    d = daemon.cli_json("diff", cp1["id"], cp2["id"])
    assert (d["added"], d["modified"], d["deleted"]) == (["b.py"], ["a.py"], [])

    r = daemon.cli_json("restore", s["id"], cp1["id"], "--dry-run")
    assert {"checkpoint", "restored_from", "files_written", "files_removed",
            "side_effects"} <= r.keys()
    r = daemon.cli_json("restore", s["id"], cp1["id"])
    assert r["restored_from"] == cp1["id"] and r["files_written"] == ["a.py"]
    assert r["files_removed"] == ["b.py"] and r["side_effects"] == []
    assert CHECKPOINT_KEYS <= r["checkpoint"].keys()
    assert daemon.cli_json("log", s["id"])[-1]["id"] == r["checkpoint"]["id"]

    fork_ws = tmp_path / "fork"
    f = daemon.cli_json("fork", cp2["id"], "--workspace", str(fork_ws))
    assert SESSION_KEYS <= f.keys() and f["forked_from"] == cp2["id"]
    assert (fork_ws / "b.py").read_text() == "new\n"

    t = daemon.cli_json("tool", s["id"], "bash", "--args", '{"command": "git push"}',
                        "--result", '{"ok": true}', "--idempotency-key", "k1")
    assert {"id", "name", "effect", "checkpoint_id"} <= t.keys()
    assert t["effect"] == "external_non_idempotent"
    assert t["checkpoint_id"] == r["checkpoint"]["id"]

    task = daemon.cli_json("task", s["id"], "T1", "--status", "in_progress", "--title", "Do")
    assert {"id", "status", "title"} <= task.keys()
    tasks = daemon.cli_json("tasks", s["id"])
    assert tasks["resume"] == "T1" and tasks["tasks"][0]["title"] == "Do"

    a = daemon.cli_json("approval", "request", s["id"], "deploy", "--args", '{"env": "prod"}')
    assert {"id", "status", "checkpoint_id", "tool"} <= a.keys() and a["status"] == "pending"
    assert [x["id"] for x in daemon.cli_json("approvals", "list", "--session", s["id"],
                                             "--status", "pending")] == [a["id"]]
    assert daemon.cli_json("approve", a["id"], "--reason", "fine")["status"] == "approved"
    a2 = daemon.cli_json("approval", "request", s["id"], "deploy")
    assert daemon.cli_json("deny", a2["id"], "--reason", "no")["status"] == "denied"

    restore_over_push = daemon.cli("restore", s["id"], cp1["id"], "--json", check=False)
    assert restore_over_push.returncode != 0
    assert restore_over_push.stderr.startswith("error: FAILED_PRECONDITION:")
    assert daemon.cli_json("restore", s["id"], cp1["id"], "--yes")["side_effects"][0]["tool"] \
        == "bash"

    fsck = daemon.cli_json("fsck")
    assert fsck["ok"] is True and fsck["problems"] == []
    gc = daemon.cli_json("gc", "--dry-run")
    assert {"blobs_removed", "bytes_freed"} <= gc.keys()
    assert daemon.cli_json("gc")["blobs_removed"] >= 0


@pytest.mark.parametrize("args, code", [
    (["show", "01M80D30HY604ZCTHPMFE3A3R0"], "NOT_FOUND"),
    (["show", "garbage"], "INVALID_ARGUMENT"),
    (["session", "show", "01M80D30HY604ZCTHPMFE3A3R0"], "NOT_FOUND"),
])
def test_errors_are_one_line_on_stderr(daemon, args, code):
    res = daemon.cli(*args, "--json", check=False)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 1
    assert len(lines) == 1 and lines[0].startswith(f"error: {code}: ")
    # Under --json stdout is still exactly one document: the error.
    assert json.loads(res.stdout) == {"error": {"code": code, "message": lines[0].split(
        ": ", 2)[2]}}
    res = daemon.cli(*args, check=False)
    assert res.returncode == 1 and res.stdout == ""


def test_invalid_json_files(daemon, workspace, tmp_path):
    s = daemon.cli_json("session", "create", "--workspace", str(workspace))
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    res = daemon.cli("checkpoint", s["id"], "--state", str(bad), check=False)
    assert res.returncode == 1 and res.stderr.startswith("error: INVALID_ARGUMENT:")
    res = daemon.cli("checkpoint", s["id"], "--messages", str(tmp_path / "missing"), check=False)
    assert res.returncode == 1 and res.stderr.startswith("error: INVALID_ARGUMENT:")


def test_json_flag_before_the_command(daemon):
    import subprocess

    from .conftest import WORLDLINE
    res = subprocess.run(WORLDLINE + ["--json", "--address", daemon.address, "session", "list"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and isinstance(json.loads(res.stdout), list)


def test_human_output_is_readable(daemon, workspace):
    s = daemon.cli_json("session", "create", "--workspace", str(workspace))
    out = daemon.cli("log", s["id"]).stdout
    assert "SEQ" in out and "initial" in out


def test_default_address_from_environment(daemon, workspace):
    import os
    import subprocess

    from .conftest import WORLDLINE
    env = {**os.environ, "WORLDLINE_ADDRESS": daemon.address}
    res = subprocess.run(WORLDLINE + ["session", "list", "--json"], capture_output=True,
                         text=True, timeout=60, env=env)
    assert res.returncode == 0
