"""The real Claude Code (the pinned version), set up with `worldline init claude-code`,
driven headless against the scripted Anthropic server, with a real daemon: its own
Write tool and a Bash edit are recorded and checkpointed with the conversation, a
`git push` is refused by the gate and never runs, rewind is exact and its resume
command resumes the very conversation."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest
from worldline.client.hooks.transcripts import reply_text

from ..conftest import tree_state
from . import CLAUDE_CODE, agent_bin
from .claude import WORLDLINE, claude_env, conversation, run_claude, tool_results, worldline

PUSH = "git push origin HEAD:refs/heads/main"


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args],
                          cwd=cwd, capture_output=True, text=True, check=True).stdout


def project(tmp_path: Path, daemon, *init_args: str) -> tuple[Path, Path]:
    """A git repository with a local bare origin, and worldline's hooks in its
    .claude/settings.local.json, written by `worldline init claude-code`."""
    origin, ws = tmp_path / "origin.git", tmp_path / "ws"
    git(tmp_path, "init", "-q", "--bare", str(origin))
    ws.mkdir()
    (ws / "b.txt").write_text("base\n")
    git(ws, "init", "-q")
    git(ws, "add", "b.txt")
    git(ws, "commit", "-q", "-m", "base")
    git(ws, "remote", "add", "origin", str(origin))
    # with the pinned program on PATH, as a person who runs it has it: init reads its
    # version and writes the approval mode that version honours
    path = f"{agent_bin('claude-code', CLAUDE_CODE).parent}{os.pathsep}{os.environ['PATH']}"
    init = subprocess.run(WORLDLINE + ["init", "claude-code", "--project", str(ws),
                                       "--address", daemon.address, *init_args,
                                       "--json"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": path})
    assert init.returncode == 0, init.stderr
    return ws, origin


def uses(messages: list[dict]) -> list[str]:
    """The tool-use ids of the assistant entries among a checkpoint's messages."""
    return [block["id"] for m in messages if m.get("type") == "assistant"
            for block in m["message"]["content"] if block.get("type") == "tool_use"]


def results(messages: list[dict]) -> dict[str, dict]:
    return {block["tool_use_id"]: block for m in messages if m.get("type") == "user"
            and isinstance(m["message"]["content"], list)
            for block in m["message"]["content"] if block.get("type") == "tool_result"}


# Claude Code itself lets every Bash call run in both modes: what stops the push is
# worldline's gate, nothing else. As root, --dangerously-skip-permissions is refused
# unless IS_SANDBOX=1 says the machine is a sandbox.
MODES = {"allowed tools": ([], ["--permission-mode", "acceptEdits",
                                "--allowedTools", "Bash,Write"]),
         "bypass permissions": (["IS_SANDBOX"], ["--dangerously-skip-permissions"])}


@pytest.mark.parametrize("mode", list(MODES))
def test_claude_code_with_the_hooks_end_to_end(mode, daemon, client, tmp_path):
    ws, origin = project(tmp_path, daemon)
    session = client.create_session(str(ws))
    before = tree_state(ws)
    sandbox, flags = MODES[mode]
    env = {**claude_env(tmp_path), **{name: "1" for name in sandbox}}
    script = [
        {"tool_use": {"id": "toolu_write", "name": "Write",
                      "input": {"file_path": str(ws / "a.txt"), "content": "hello\n"}}},
        {"tool_use": {"id": "toolu_edit", "name": "Bash",
                      "input": {"command": "printf 'more\\n' >> b.txt",
                                "description": "append to b.txt"}}},
        {"tool_use": {"id": "toolu_push", "name": "Bash",
                      "input": {"command": PUSH, "description": "push"}}},
        {"text": "all done"},
    ]
    run, result = run_claude("write a.txt, extend b.txt, push", script, ws, env, *flags)
    assert result["is_error"] is False and result["result"] == "all done"
    assert (ws / "a.txt").read_bytes() == b"hello\n"
    assert (ws / "b.txt").read_bytes() == b"base\nmore\n"

    # The push did not run: origin has no ref, Claude Code reports the call refused,
    # and the model was told why, with the approval to ask for.
    assert git(origin, "for-each-ref") == ""
    assert [d["tool_use_id"] for d in result["permission_denials"]] == ["toolu_push"]
    sent = tool_results(run)
    assert sent["toolu_push"]["is_error"] is True
    assert "worldline approve" in str(sent["toolu_push"]["content"])
    assert not sent["toolu_write"].get("is_error") and not sent["toolu_edit"]["is_error"]

    # Nobody approved it: the request is withdrawn, and only the two calls that ran
    # are in the ledger.
    approvals = client.list_approvals(session.id)
    assert [(a.tool, a.args["command"], a.status) for a in approvals] == [
        ("Bash", PUSH, "denied")]
    calls = client.tool_calls(session.id)
    assert [(c.name, c.idempotency_key) for c in calls] == [
        ("Write", "toolu_write"), ("Bash", "toolu_edit")]
    assert all(not c.approval_id for c in calls)

    # Each checkpoint holds the conversation up to it.
    log = {cp.label: cp for cp in client.log(session.id)}
    write_cp = log["Write: a.txt"]
    edit_cp = log["Bash: printf 'more\\n' >> b.txt"]
    asked_cp = client.show(approvals[0].checkpoint_id)
    stop_cp, end_cp = log["stop"], log["session end"]
    assert uses(client.show(write_cp.id).messages) == ["toolu_write"]
    edit_messages = client.show(edit_cp.id).messages
    assert uses(edit_messages) == ["toolu_write", "toolu_edit"]
    assert list(results(edit_messages)) == ["toolu_write"]
    assert uses(asked_cp.messages) == ["toolu_write", "toolu_edit"]
    # Claude Code writes its transcript in batches, and its last reply only after the
    # Stop hook: the Stop checkpoint holds what was written (and the reply, from the
    # payload's last_assistant_message), the session's end all of it, each entry once.
    stop_messages = client.show(stop_cp.id).messages
    end_messages = client.show(end_cp.id).messages
    assert end_messages[:len(stop_messages)] == stop_messages
    assert uses(end_messages) == ["toolu_write", "toolu_edit", "toolu_push"]
    refused = results(end_messages)["toolu_push"]
    assert refused["is_error"] is True and "worldline approve" in str(refused["content"])
    for messages in (stop_messages, end_messages):
        replies = [m for m in messages if m["role"] == "assistant"]
        assert reply_text(replies[-1]) == "all done"
        assert [reply_text(m) for m in replies].count("all done") == 1
    prompt = [m for m in stop_messages if m.get("type") == "user"][0]
    assert prompt["message"]["content"] == "write a.txt, extend b.txt, push"
    # `worldline show --json` prints the same conversation.
    shown = worldline("show", write_cp.id, "--address", daemon.address)
    assert uses(shown["messages"]) == ["toolu_write"]

    # Rewind to the Write: the files as they were then, byte for byte, and the command
    # that resumes the conversation there names Claude Code's session.
    r = worldline("rewind", "--to", write_cp.id, "--address", daemon.address, cwd=ws)
    assert (ws / "a.txt").read_bytes() == b"hello\n"
    assert (ws / "b.txt").read_bytes() == b"base\n"
    at = client.show(write_cp.id).resume["resume_entry"]
    assert r["resume_command"] == (f"claude --resume {result['session_id']}"
                                   f" --resume-session-at {at}")
    assert [m["uuid"] for m in client.show(write_cp.id).messages
            if m.get("type") == "assistant"][-1] == at

    # Back to before the run: the workspace exactly as it was, .git included.
    first = client.log(session.id)[0]
    worldline("rewind", "--to", first.id, "--address", daemon.address, cwd=ws)
    assert tree_state(ws) == before

    # The resume command works: Claude Code resumes its session at the Write.
    resumed, _ = run_claude("go on", [{"text": "resumed"}], ws, env,
                            *r["resume_command"].split()[1:],
                            "--permission-mode", "acceptEdits")
    history = conversation(resumed)[-1]["messages"]
    ids = [b.get("id") for m in history if m["role"] == "assistant"
           for b in m["content"] if isinstance(b, dict)]
    assert "toolu_write" in ids and "toolu_edit" not in ids and "toolu_push" not in ids


def test_a_push_refused_headless_goes_through_once_an_operator_approves(daemon, client,
                                                                        tmp_path):
    """--approval deny: the model is told the approval's id; the approval stays pending
    after the run (it was left to an operator), and the retry after `worldline approve`
    runs the push, recorded with that approval."""
    ws, origin = project(tmp_path, daemon, "--approval", "deny")
    session = client.create_session(str(ws))
    env = claude_env(tmp_path)
    push = {"tool_use": {"id": "toolu_push", "name": "Bash",
                         "input": {"command": PUSH, "description": "push"}}}
    run, result = run_claude("push", [push, {"text": "refused"}], ws, env,
                             "--allowedTools", "Bash")
    assert git(origin, "for-each-ref") == ""
    [approval] = client.list_approvals(session.id)
    assert approval.status == "pending"
    assert f"worldline approve {approval.id}" in tool_results(run)["toolu_push"]["content"]

    subprocess.run(WORLDLINE + ["approve", approval.id, "--address", daemon.address],
                   check=True, capture_output=True, timeout=60)
    retry = {"tool_use": {**push["tool_use"], "id": "toolu_retry"}}
    run_claude("approved: push again", [retry, {"text": "pushed"}], ws, env,
               "--resume", result["session_id"], "--allowedTools", "Bash")
    assert "refs/heads/main" in git(origin, "for-each-ref")
    pushed = [c for c in client.tool_calls(session.id) if c.idempotency_key == "toolu_retry"]
    assert [c.approval_id for c in pushed] == [approval.id]
    assert client.get_approval(approval.id).status == "approved"


# -- the transcript as Claude Code 2.1.197 writes it (one of its runs above, recorded) ---
RECORDED = Path(__file__).parent / "fixtures" / "claude-code-2.1.197.jsonl"


def hook(daemon, tmp_path: Path, payload: dict) -> subprocess.CompletedProcess:
    out = subprocess.run(WORLDLINE + ["hook", "claude-code", "--address", daemon.address],
                         input=json.dumps(payload), capture_output=True, text=True,
                         timeout=60, env={**os.environ,
                                          "WORLDLINE_HOOK_STATE": str(tmp_path / "state")})
    assert out.returncode == 0 and json.loads(out.stdout) == {}, out.stderr
    return out


def test_the_last_reply_is_recorded_once_whenever_the_transcript_has_it(daemon, client,
                                                                       tmp_path):
    lines = RECORDED.read_text().splitlines(keepends=True)
    final = [i for i, line in enumerate(lines) if json.loads(line)["type"] == "assistant"][-1]
    final_uuid = json.loads(lines[final])["uuid"]
    ws = tmp_path / "ws"
    ws.mkdir()
    transcript = tmp_path / "t.jsonl"
    transcript.write_text("".join(lines[:final]))  # at Stop: the reply not written yet
    session = client.create_session(str(ws))
    base = {"session_id": "5785f4b7", "transcript_path": str(transcript), "cwd": str(ws)}
    hook(daemon, tmp_path, {**base, "hook_event_name": "SessionStart", "source": "startup"})
    hook(daemon, tmp_path, {**base, "hook_event_name": "Stop", "stop_hook_active": False,
                            "last_assistant_message": "all done"})
    stop = client.show(client.log(session.id)[-1].id)
    assert stop.messages[-1] == {"role": "assistant", "type": "last_assistant_message",
                                 "content": "all done"}
    assert stop.messages[:-1] == [
        {"role": e.get("message", {}).get("role") or e["type"], **e}
        for e in map(json.loads, lines[:final])]

    with open(transcript, "a") as f:  # Claude Code writes it after the hook
        f.write("".join(lines[final:]))
    hook(daemon, tmp_path, {**base, "hook_event_name": "UserPromptSubmit", "prompt": "more"})
    after = client.show(client.log(session.id)[-1].id)
    assert [reply_text(m) for m in after.messages if m["role"] == "assistant"].count(
        "all done") == 1
    assert len(after.messages) == len(lines)  # every entry once, the reply as the stand-in
    assert after.resume["resume_entry"] == final_uuid  # resumable at the real entry


def test_the_last_reply_after_its_thinking_entry_is_recorded_once(daemon, client, tmp_path):
    """Claude Code writes a reply's thinking and its text as entries of their own: the
    stand-in recorded at Stop matches the text entry, not the first one of the reply."""
    lines = RECORDED.read_text().splitlines(keepends=True)
    final = [i for i, line in enumerate(lines) if json.loads(line)["type"] == "assistant"][-1]
    thinking = json.loads(lines[final])
    thinking["uuid"] = thinking["uuid"][:-4] + "beef"
    thinking["message"] = {**thinking["message"],
                           "content": [{"type": "thinking", "thinking": "all is done"}]}
    lines.insert(final, json.dumps(thinking) + "\n")
    ws = tmp_path / "ws"
    ws.mkdir()
    transcript = tmp_path / "t.jsonl"
    transcript.write_text("".join(lines[:final]))  # at Stop: neither entry written yet
    session = client.create_session(str(ws))
    base = {"session_id": "5785f4b8", "transcript_path": str(transcript), "cwd": str(ws)}
    hook(daemon, tmp_path, {**base, "hook_event_name": "SessionStart", "source": "startup"})
    hook(daemon, tmp_path, {**base, "hook_event_name": "Stop", "stop_hook_active": False,
                            "last_assistant_message": "all done"})
    with open(transcript, "a") as f:
        f.write("".join(lines[final:]))
    hook(daemon, tmp_path, {**base, "hook_event_name": "UserPromptSubmit", "prompt": "more"})
    after = client.show(client.log(session.id)[-1].id)
    assert [reply_text(m) for m in after.messages if m["role"] == "assistant"].count(
        "all done") == 1
    assert len(after.messages) == len(lines)  # the thinking entry kept, the text once


def test_a_transcript_that_cannot_be_read_is_said_so(daemon, client, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    session = client.create_session(str(ws))
    unreadable = tmp_path / "t.jsonl"
    unreadable.mkdir()  # open() fails, even for root
    base = {"session_id": "unreadable-1", "transcript_path": str(unreadable),
            "cwd": str(ws)}
    out = hook(daemon, tmp_path, {**base, "hook_event_name": "UserPromptSubmit",
                                  "prompt": "hi"})
    assert f"transcript {unreadable} could not be read" in out.stderr
    first = client.show(client.log(session.id)[-1].id)
    assert first.messages == [] and any("could not be read" in w for w in first.warnings)
    unreadable.rmdir()
    unreadable.write_text(RECORDED.read_text())  # readable again: nothing was skipped
    hook(daemon, tmp_path, {**base, "hook_event_name": "Stop"})
    assert len(client.show(client.log(session.id)[-1].id).messages) == len(
        RECORDED.read_text().splitlines())


def test_after_a_call_the_hook_waits_for_the_entry_that_asked_for_it(daemon, client,
                                                                     tmp_path):
    """Claude Code writes its transcript every 100 ms: the PostToolUse hook may start
    before the assistant entry with the call is written, and waits for it."""
    lines = RECORDED.read_text().splitlines(keepends=True)
    asks = [i for i, line in enumerate(lines) if '"id":"toolu_0001"' in line
            and json.loads(line)["type"] == "assistant"][0]
    ws = tmp_path / "ws"
    ws.mkdir()
    transcript = tmp_path / "t.jsonl"
    transcript.write_text("".join(lines[:asks]))
    session = client.create_session(str(ws))
    base = {"session_id": "waits-1", "transcript_path": str(transcript), "cwd": str(ws)}
    hook(daemon, tmp_path, {**base, "hook_event_name": "SessionStart", "source": "startup"})

    def written_late() -> None:
        time.sleep(0.25)
        with open(transcript, "a") as f:
            f.write(lines[asks])
    writer = threading.Thread(target=written_late)
    writer.start()
    hook(daemon, tmp_path, {**base, "hook_event_name": "PostToolUse", "tool_name": "Write",
                            "tool_input": {"file_path": str(ws / "a.txt"),
                                           "content": "hello\n"},
                            "tool_use_id": "toolu_0001", "tool_response": {"type": "create"}})
    writer.join()
    assert uses(client.show(client.log(session.id)[-1].id).messages) == ["toolu_0001"]
