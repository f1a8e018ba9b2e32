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
from .test_agent_users import place  # noqa: F401 -- a fixture
from .test_fleet import fleet  # noqa: F401 -- a fixture


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


# -- 2. a file's history and recovery --------------------------------------------------
def test_log_path_finds_exactly_the_checkpoints_that_changed_a_file(daemon, client,
                                                                      workspace):
    """50 tool calls, each followed by a checkpoint, that write, delete and rename
    f.txt among others: `log --path f.txt` names exactly the checkpoints where f.txt
    differs from the one before, newest first, each with the call that made it."""
    (workspace / "f.txt").write_text("v0\n")
    s = client.create_session(str(workspace))
    want: list[tuple[str, str, str]] = []  # (checkpoint, change, tool call), oldest first
    want.append((s.head, "added", ""))
    present = True
    for n in range(1, 51):
        op = ["write", "other", "delete", "rename-in", "touch-same", "rename-out"][n % 6]
        f, g = workspace / "f.txt", workspace / "g.txt"
        call = s.record_tool_call("Bash", args={"command": f"step {n}: {op}"})
        change = ""
        if op == "write":
            change = "modified" if present else "added"
            f.write_text(f"v{n}\n")
        elif op == "other":
            (workspace / f"other{n}.txt").write_text("x")
        elif op == "delete" and present:
            f.unlink()
            change = "deleted"
        elif op == "rename-in":  # g.txt becomes f.txt
            g.write_text(f"from g {n}\n")
            os.rename(g, f)
            change = "modified" if present else "added"
        elif op == "touch-same" and present:
            f.write_text(f.read_text())  # the same bytes: a new time only
        elif op == "rename-out" and present:
            os.rename(f, g)
            change = "deleted"
        present = f.exists()
        cp = s.checkpoint()
        if change:
            want.append((cp.id, change, call.id))
    got = daemon.cli_json("log", s.id, "--path", "f.txt")
    assert [(c["checkpoint"]["id"], c["change"]) for c in got] == \
        [(cp, change) for cp, change, _ in reversed(want)]
    assert [[t["id"] for t in c["tool_calls"]] for c in got[:-1]] == \
        [[call] for _, _, call in reversed(want[1:])]
    text = daemon.cli("log", s.id, "--path", "f.txt", "--patch").stdout
    assert f"{want[-1][2]}  Bash step " in text
    assert "+++ b/f.txt" in text and "+++ /dev/null" in text
    # g.txt's own history: each rename shows there as an addition and a deletion
    assert {c["change"] for c in daemon.cli_json("log", s.id, "--path", "g.txt")} == \
        {"added", "deleted"}
    assert daemon.cli_json("log", s.id, "--path", "nowhere.txt") == []


def test_cat_prints_a_files_exact_bytes_as_of_a_checkpoint(daemon, client, workspace):
    blob = bytes(range(256)) * 300 + b"\0\r\n\xff"
    (workspace / "bin.dat").write_bytes(blob)
    (workspace / "t.txt").write_text("text without a newline")
    os.symlink("t.txt", workspace / "link")
    s = client.create_session(str(workspace))
    first = s.head
    (workspace / "bin.dat").write_bytes(b"later")
    s.checkpoint()
    res = subprocess.run(WORLDLINE + ["cat", first, "bin.dat", "--address", daemon.address],
                         capture_output=True, timeout=60)
    assert res.returncode == 0 and res.stdout == blob
    assert daemon.cli("cat", first, "t.txt").stdout == "text without a newline"
    assert daemon.cli("cat", first, "link").stdout == "t.txt"
    import base64
    doc = daemon.cli_json("cat", first, "bin.dat")
    assert base64.b64decode(doc["base64"]) == blob and doc["size"] == len(blob)
    assert client.read_file(s.head, "bin.dat") == b"later"
    assert fails(daemon, "cat", first, "missing.txt") == "NOT_FOUND"
    assert fails(daemon, "cat", first, "link/x") == "INVALID_ARGUMENT"


def test_a_restore_of_two_paths_leaves_a_third_edit_alone(daemon, client, workspace):
    for name in ("a.txt", "b.txt", "c.txt"):
        (workspace / name).write_text(f"{name} 1\n")
    (workspace / "sub").mkdir()
    (workspace / "sub" / "d.txt").write_text("d 1\n")
    s = client.create_session(str(workspace))
    good = s.head
    for name in ("a.txt", "c.txt"):
        (workspace / name).write_text(f"{name} 2, broken\n")
    (workspace / "sub" / "d.txt").unlink()
    (workspace / "b.txt").write_text("b.txt 2, good\n")
    s.checkpoint(messages=[{"role": "user", "content": "go"}])
    (workspace / "new.txt").write_text("not checkpointed\n")  # the third edit, unsaved
    edited = tree_state(workspace)

    dry = daemon.cli_json("restore", s.id, good, "--path", "a.txt", "--path", "sub/d.txt",
                          "--dry-run")
    assert dry["files_written"] == ["a.txt", "sub/d.txt"] and dry["files_removed"] == []
    assert dry["not_checkpointed"] == ["new.txt"] and tree_state(workspace) == edited

    r = daemon.cli_json("restore", s.id, good, "--path", "a.txt", "--path", "sub/d.txt")
    assert r["files_written"] == ["a.txt", "sub/d.txt"] and r["files_removed"] == []
    assert (workspace / "a.txt").read_text() == "a.txt 1\n"
    assert (workspace / "sub" / "d.txt").read_text() == "d 1\n"
    assert (workspace / "b.txt").read_text() == "b.txt 2, good\n"
    assert (workspace / "c.txt").read_text() == "c.txt 2, broken\n"
    assert (workspace / "new.txt").read_text() == "not checkpointed\n"
    cp = daemon.cli_json("show", r["checkpoint"]["id"])
    assert cp["kind"] == "restore" and len(cp["messages"]) == 1  # the conversation stays
    assert r["before"]["label"] == "before restore"
    # the restore's checkpoint is the world as it now is: a full restore to it changes
    # nothing, and the one before it gives every edit back
    assert daemon.cli_json("restore", s.id, r["checkpoint"]["id"], "--dry-run")[
        "files_written"] == []
    daemon.cli("restore", s.id, r["before"]["id"])
    assert tree_state(workspace) == edited
    # a path in neither is an error, nothing changed
    assert fails(daemon, "restore", s.id, good, "--path", "nowhere.txt") == "NOT_FOUND"


@pytest.mark.parametrize("path", ["../x", "/etc/passwd", "lnk/inside.txt", "sub/../a.txt",
                                  "", "./a.txt"])
def test_hostile_paths_are_refused_and_change_nothing(daemon, client, workspace, tmp_path,
                                                      path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "inside.txt").write_text("outside\n")
    (workspace / "a.txt").write_text("a\n")
    (workspace / "lnk").mkdir()
    (workspace / "lnk" / "inside.txt").write_text("in the checkpoint\n")
    s = client.create_session(str(workspace))
    first = s.head
    os.rename(workspace / "lnk", workspace / "was-lnk")
    os.symlink(outside, workspace / "lnk")  # the path now passes through a symlink
    swapped = s.checkpoint().id
    (workspace / "a.txt").write_text("edited\n")
    state, outside_state = tree_state(workspace), tree_state(outside)
    log = daemon.cli_json("log", s.id)
    for args in (["restore", s.id, first, "--path", path],
                 ["restore", s.id, first, "--path", path, "--dry-run"],
                 ["cat", first if path != "lnk/inside.txt" else swapped, path],
                 ["log", s.id, "--path", path]):
        if args[0] == "log" and path in ("lnk/inside.txt", ""):
            continue  # a history counts it as absent where it passes through a symlink;
            # `log --path ""` is the whole log
        assert fails(daemon, *args) == "INVALID_ARGUMENT", args
    assert tree_state(workspace) == state and tree_state(outside) == outside_state
    assert daemon.cli_json("log", s.id) == log


# -- 3. ids a person can type ----------------------------------------------------------
def test_prefixes_session_at_n_and_head_resolve_and_ambiguity_is_an_error(daemon, client,
                                                                           workspace):
    (workspace / "a.txt").write_text("0\n")
    s = client.create_session(str(workspace))
    cps = [s.head]
    for n in range(1, 4):
        (workspace / "a.txt").write_text(f"{n}\n")
        cps.append(s.checkpoint(label=f"cp {n}").id)
    here = str(workspace)

    def show(ref: str, *extra: str, cwd: str | None = None) -> dict:
        res = subprocess.run(WORLDLINE + ["show", ref, *extra, "--json", "--address",
                                          daemon.address], capture_output=True, text=True,
                             timeout=60, env=daemon.env, cwd=cwd)
        assert res.returncode == 0, res.stderr
        return json.loads(res.stdout)

    assert show("HEAD", cwd=here)["id"] == cps[3]
    assert show("head~2", cwd=here)["id"] == cps[1]
    assert show("HEAD~1", "--session", s.id[:12])["id"] == cps[2]
    assert show(f"{s.id}@2")["id"] == cps[2]
    assert show(f"{s.id[:14].lower()}@0")["id"] == cps[0]
    assert show(cps[1][:20].lower())["id"] == cps[1]  # any case
    # wherever an id goes: a restore by prefixes, a diff by HEAD forms, cat by SESSION@N
    r = daemon.cli_json("restore", s.id[:16], cps[1][:20])
    assert r["restored_from"] == cps[1] and (workspace / "a.txt").read_text() == "1\n"
    res = subprocess.run(WORLDLINE + ["diff", "HEAD~2", "HEAD", "--json", "--address",
                                      daemon.address], capture_output=True, text=True,
                         cwd=here, timeout=60)
    assert json.loads(res.stdout)["modified"] == ["a.txt"], res.stderr
    assert daemon.cli("cat", f"{s.id}@3", "a.txt").stdout == "3\n"
    # the ids of one session's checkpoints share their first characters (time): too
    # short a prefix is ambiguous, and the error names the candidates
    common = os.path.commonprefix(cps)
    res = subprocess.run(WORLDLINE + ["show", common, "--address", daemon.address],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and "INVALID_ARGUMENT" in res.stderr
    assert all(cp in res.stderr for cp in cps)
    assert fails(daemon, "show", "HEAD~99", "--session", s.id) == "NOT_FOUND"
    assert fails(daemon, "show", f"{s.id}@99") == "NOT_FOUND"
    assert fails(daemon, "show", "7ZZZZZZZ") == "NOT_FOUND"
    assert fails(daemon, "show", "nope") == "INVALID_ARGUMENT"  # no id starts so
    assert fails(daemon, "show", "01") == "INVALID_ARGUMENT"  # too short to mean one
    assert fails(daemon, "show", "HEAD", cwd="/") == "NOT_FOUND"  # no session here
    assert client.resolve_id(s.id[:15], "session") == s.id
    # HEAD~N goes back along parents: the restore's parent is the head it replaced
    assert client.resolve_id("HEAD~1", session=s.id) == cps[3]
    assert client.resolve_id("HEAD~4", session=s.id) == cps[0]


# -- 4. rewind counts tool calls --------------------------------------------------------
def test_rewind_after_a_stop_undoes_the_last_tool_call(daemon, client, workspace, tmp_path):
    from .test_hooks import Agent, session_of
    agent = Agent("claude-code", daemon, workspace, tmp_path)
    fixture, uses = agent.payload, iter(range(100))  # each call its own tool use id
    agent.payload = lambda event: fixture(event).replace("toolu_01ABC", f"toolu_{next(uses)}")
    agent.file.write_text("v1\n")
    agent.run("start")
    agent.say("user", "change it")
    agent.run("prompt")
    agent.run("pre_edit")
    agent.file.write_text("v2\n")
    agent.run("post_edit")
    agent.file.write_text("v3\n")
    agent.run("post_edit")
    agent.say("assistant", "done")
    agent.run("stop")
    s = session_of(client, workspace)
    assert client.log(s.id)[-1].label == "stop"

    def rewind(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(WORLDLINE + ["rewind", "--address", daemon.address, *args],
                              capture_output=True, text=True, cwd=workspace, timeout=60)
    res = rewind("--json")
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    assert agent.file.read_text() == "v2\n"  # the last Write undone, not the stop
    assert d["target"]["label"] == "Write: app.py"
    assert [u["label"] for u in d["undone"]] == ["Write: app.py"]
    assert [t["name"] for t in d["undone"][0]["tool_calls"]] == ["Write"]
    text = rewind("--dry-run").stdout  # from the restore: v2 -> v1
    assert "undoes #2 Write " in text and "app.py (" in text, text
    res = rewind("--steps", "2")
    assert res.returncode == 1 and "INVALID_ARGUMENT" in res.stderr  # only one call left
    rewind()
    assert agent.file.read_text() == "v1\n"


def test_mcp_has_the_same_history_recovery_and_ids(daemon, client, workspace):
    import anyio

    from .test_mcp import mcp_session
    (workspace / "a.txt").write_text("a1\n")
    (workspace / "b.txt").write_text("b1\n")
    s = client.create_session(str(workspace))
    first = s.head
    (workspace / "a.txt").write_text("a2\n")
    (workspace / "b.txt").write_text("b2\n")
    s.checkpoint(label="both")
    (workspace / "c.txt").write_text("not checkpointed\n")

    async def scenario():
        async with mcp_session(daemon) as session:
            await session.initialize()

            async def call(name, **args):
                result = await session.call_tool(name, args)
                assert not result.is_error, result.content
                return result.structured_content

            history = (await call("path_history", session_id=s.id[:16], path="a.txt"))
            assert [c["change"] for c in history["result"]] == ["modified", "added"]
            got = await call("read_file", checkpoint_id=f"{s.id}@0", path="a.txt")
            assert got["text"] == "a1\n"
            r = await call("restore", session_id=s.id[:16], checkpoint_id="HEAD~1",
                           paths=["a.txt"])
            assert r["restored_from"] == first and r["files_written"] == ["a.txt"]
            assert r["before"]["label"] == "before restore"
            assert r["not_checkpointed"] == ["c.txt"]
            bad = await session.call_tool("read_file", {"checkpoint_id": first,
                                                        "path": "../etc/passwd"})
            assert bad.is_error and "INVALID_ARGUMENT" in bad.content[0].text
            bad = await session.call_tool("log", {"session_id": s.id[:3]})
            assert bad.is_error and "INVALID_ARGUMENT" in bad.content[0].text  # too short

    anyio.run(scenario)
    assert (workspace / "a.txt").read_text() == "a1\n"
    assert (workspace / "b.txt").read_text() == "b2\n"
    assert (workspace / "c.txt").read_text() == "not checkpointed\n"


# -- 5. plain text that answers ---------------------------------------------------------
def test_plain_text_says_what_a_person_needs(daemon, client, workspace):
    (workspace / "a.txt").write_text("1\n")
    s = client.create_session(str(workspace))
    first = s.head
    call = s.record_tool_call("Bash", args={"command": "npm test -- --watch=false"})
    (workspace / "b.txt").write_text("new\n")
    (workspace / "a.txt").unlink()
    made = s.checkpoint(label="Bash: npm test")
    tools = daemon.cli("tools", s.id).stdout
    assert call.id in tools and "npm test -- --watch=false" in tools and "#1" in tools
    log = daemon.cli("log", s.id).stdout
    assert "1: Bash npm test" in log and made.id in log
    dry = daemon.cli("restore", s.id, first, "--dry-run").stdout
    assert "  W a.txt" in dry and "  D b.txt" in dry
    assert fails(daemon, "approval", "request", s.id, "deploy", "--ttl", "0") == \
        "INVALID_ARGUMENT"
    ap = daemon.cli_json("approval", "request", s.id, "deploy", "--args", '{"env": "prod"}')
    shown = daemon.cli("approvals", "show", ap["id"][:22]).stdout
    assert '"env": "prod"' in shown and "expires_at: " in shown and ap["id"] in shown
    assert daemon.cli_json("approvals", "show", ap["id"])["args"] == {"env": "prod"}
    daemon.cli("deny", ap["id"][:22], "--reason", "not now")
    assert client.get_approval(ap["id"]).status == "denied"


def test_a_world_past_a_limit_is_restored_and_the_restore_says_it_was_not_kept(tmp_path):
    """The world as it was could not be stored (past --max-entries): the restore goes on,
    as before 0.8, and its warnings say that world was not kept; a restore of some paths,
    which keeps the rest of that world in its own checkpoint, is refused instead."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("a\n")
    d = DaemonProcess(tmp_path / "r", extra=["--max-entries", "20"]).start()
    try:
        sid = session_on(d, ws)
        first = d.cli_json("session", "show", sid)["head"]
        for n in range(30):
            (ws / f"f{n}.txt").write_text(f"{n}\n")
        assert fails(d, "restore", sid, first, "--path", "a.txt") == "RESOURCE_EXHAUSTED"
        r = d.cli_json("restore", sid, first)
        assert r["before"] is None and len(r["not_checkpointed"]) == 30
        assert any("not checkpointed" in w for w in r["warnings"]), r["warnings"]
        assert sorted(os.listdir(ws)) == ["a.txt"]
    finally:
        d.stop()


def test_a_restore_of_some_paths_killed_midway_is_completed_as_planned(tmp_path):
    """Killed once its journal is written: the next start completes the restore of those
    paths only (the journal names the tree made of the world and them), the third edit
    and the rest of the world as they were."""
    ws = tmp_path / "ws"
    ws.mkdir()
    for name in ("a.txt", "b.txt", "c.txt"):
        (ws / name).write_text(f"{name} 1\n")
    d = DaemonProcess(tmp_path / "r", env={"WORLDLINE_FAULTS": "restore.after_journal"})
    d.start()
    sid = session_on(d, ws)
    first = d.cli_json("session", "show", sid)["head"]
    for name in ("a.txt", "b.txt", "c.txt"):
        (ws / name).write_text(f"{name} 2\n")
    checkpoint(d, sid)
    (ws / "c.txt").write_text("c.txt 3, not checkpointed\n")
    assert d.cli("restore", sid, first, "--path", "a.txt", check=False).returncode != 0
    assert d.proc.wait(15) == -signal.SIGKILL
    d.proc = None
    d.env.pop("WORLDLINE_FAULTS")
    d.start()
    try:
        assert (ws / "a.txt").read_text() == "a.txt 1\n"
        assert (ws / "b.txt").read_text() == "b.txt 2\n"
        assert (ws / "c.txt").read_text() == "c.txt 3, not checkpointed\n"
        log = d.cli_json("log", sid)
        assert [c["label"] for c in log[-2:]] == ["before restore",
                                                  f"restore of a.txt from {first}"]
        assert d.cli_json("restore", sid, log[-1]["id"], "--dry-run")["files_written"] == []
        assert d.cli_json("fsck")["ok"]
    finally:
        d.stop()


def _agent_resolves(address: str, ws: str, other: str) -> dict:
    """As uid 1000: its own session's prefix resolves; the owner's session is not there
    for it, by prefix or as the session of a HEAD."""
    from worldline.client import Client
    with Client(address) as c:
        mine = c.create_session(ws)
        out = {"own": c.resolve_id(mine.id[:20].lower(), "session") == mine.id,
               "own head": c.resolve_id("HEAD", session=mine.id[:20]) == mine.head}
        for what, call in (("other", lambda: c.resolve_id(other[:20], "session")),
                           ("other head", lambda: c.resolve_id("HEAD", session=other[:20]))):
            try:
                call()
                out[what] = "ok"
            except Exception as exc:  # noqa: BLE001 -- the name is compared
                out[what] = type(exc).__name__
        return out


def test_an_allowed_user_resolves_only_its_own_ids(place):  # noqa: F811 -- the fixture
    from .fidelity import in_fresh_child_as
    d, home, canary = place
    with d.client() as owner:
        theirs = owner.create_session(str(canary))
    got = in_fresh_child_as(AGENT_UID, _agent_resolves, d.address, str(home / "ws"),
                            theirs.id)
    assert got == {"own": True, "own head": True, "other": "NotFound",
                   "other head": "NotFound"}, got


def test_show_diff_approvals_and_audit_say_what_they_hold(daemon, client, workspace):
    (workspace / "run.sh").write_text("echo hi\n")
    s = client.create_session(str(workspace))
    first = s.head
    os.chmod(workspace / "run.sh", 0o755)  # a chmod alone
    cp = s.checkpoint(messages=[{"role": "user", "content": "make it executable"},
                                {"role": "assistant", "content": "done:\nchmod +x run.sh"}])
    patch = daemon.cli("diff", first, cp.id, "--patch").stdout
    assert "metadata of run.sh" in patch and "new mode" in patch and "755" in patch
    shown = daemon.cli("show", cp.id).stdout
    assert "user: make it executable" in shown and "chmod +x run.sh" in shown
    ap = daemon.cli_json("approval", "request", s.id, "deploy", "--args", '{"env": "prod"}',
                         "--ttl", "60")
    listed = daemon.cli("approvals", "list", "--session", s.id).stdout
    assert '{"env": "prod"}' in listed and ap["expires_at"][:19] in listed
    audit = daemon.cli("audit", "--session", s.id, "--kind", "checkpoint").stdout
    assert f'"tree": "{cp.tree}"' in audit


def test_gc_says_why_pruned_checkpoints_free_nothing_yet(fresh_daemon, workspace):
    d = fresh_daemon.start()
    sid = session_on(d, workspace)
    for n in range(3):
        (workspace / "f.txt").write_text(f"{n}\n" * 1000)
        checkpoint(d, sid)
    doc = d.cli_json("gc", "--keep-last", "1", "--dry-run")
    assert doc["checkpoints_pruned"] >= 2 and doc["bytes_freed"] == 0
    assert "--gc-grace" in d.cli("gc", "--keep-last", "1", "--dry-run").stdout


def test_a_fleets_restore_keeps_the_world_before_it_in_the_bucket(fleet, tmp_path):  # noqa: F811
    """On PostgreSQL and S3 the checkpoint of the world before a restore is committed
    with its objects indexed, like any other: another host reads it back exactly."""
    a, b = fleet.host("a"), fleet.host("b")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "f.txt").write_text("one\n")
    sid = session_on(a, ws)
    first = a.cli_json("session", "show", sid)["head"]
    (ws / "f.txt").write_text("two, not checkpointed\n" * 500)
    r = a.cli_json("restore", sid, first)
    assert r["not_checkpointed"] == ["f.txt"]
    assert b.cli("cat", r["before"]["id"], "f.txt").stdout == "two, not checkpointed\n" * 500
    assert b.cli_json("fsck")["ok"]
    a.cli("restore", sid, r["before"]["id"][:20])
    assert (ws / "f.txt").read_text() == "two, not checkpointed\n" * 500
