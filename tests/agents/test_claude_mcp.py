"""`worldline mcp` as an MCP server of the real Claude Code (a project `.mcp.json`):
the model's calls of worldline's tools (checkpoint, record a tool call, request an
approval and wait for it, restore) take effect in the daemon."""

from __future__ import annotations

import json
import shutil
import threading
import time

from .claude import claude_env, run_claude, tool_results


def approve_when_asked(client, session_id: str, done: threading.Event) -> threading.Thread:
    """An operator, from another thread: approves the session's first pending approval."""
    def run() -> None:
        deadline = time.monotonic() + 60
        while not done.is_set() and time.monotonic() < deadline:
            pending = [a for a in client.list_approvals(session_id) if a.status == "pending"]
            if pending:
                client.decide_approval(pending[0].id, approve=True, reason="the test's yes")
                return
            time.sleep(0.1)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_claude_code_calls_the_worldline_mcp_tools(daemon, client, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("v1\n")
    session = client.create_session(str(ws))
    sid = session.id
    # A project's .mcp.json, as docs/clients.md "For MCP-speaking agents" has it. Print mode
    # loads project servers without the trust prompt; their tools still need
    # Claude Code's permission: --allowedTools mcp__worldline (the whole server). And
    # print mode connects MCP servers in the background: without "alwaysLoad" (or
    # MCP_CONNECTION_NONBLOCKING=0) a model as quick as this one calls the tools
    # before they exist ("No such tool available").
    (ws / ".mcp.json").write_text(json.dumps({"mcpServers": {"worldline": {
        "command": shutil.which("worldline") or "worldline",
        "args": ["mcp", "--address", daemon.address], "alwaysLoad": True}}}))
    script = [
        {"tool_use": {"id": "toolu_cp", "name": "mcp__worldline__checkpoint",
                      "input": {"session_id": sid, "label": "before b.txt",
                                "state": {"step": 1}}}},
        {"tool_use": {"id": "toolu_write", "name": "Write",
                      "input": {"file_path": str(ws / "b.txt"), "content": "new\n"}}},
        {"tool_use": {"id": "toolu_record", "name": "mcp__worldline__record_tool_call",
                      "input": {"session_id": sid, "name": "notes", "effect": "local",
                                "args": {"file": "b.txt"}, "idempotency_key": "notes-1"}}},
        {"tool_use": {"id": "toolu_ask", "name": "mcp__worldline__request_approval",
                      "input": {"session_id": sid, "tool": "deploy",
                                "args": {"env": "prod"}, "wait_seconds": 30}}},
        {"tool_use": {"id": "toolu_restore", "name": "mcp__worldline__restore",
                      "input": {"session_id": sid,
                                "checkpoint_id": {"$result": ["toolu_cp", "id"]}}}},
        {"text": "done"},
    ]
    done = threading.Event()
    operator = approve_when_asked(client, sid, done)
    try:
        run, result = run_claude("use worldline", script, ws, claude_env(tmp_path),
                                 "--allowedTools", "mcp__worldline,Write")
    finally:
        done.set()
        operator.join(10)
    assert result["is_error"] is False and result["permission_denials"] == []
    sent = tool_results(run)
    assert not any(r.get("is_error") for r in sent.values()), sent
    reply = {use_id: json.loads(r["content"] if isinstance(r["content"], str) else
                                r["content"][0]["text"]) for use_id, r in sent.items()
             if use_id != "toolu_write"}

    # checkpoint: in the session's history, with the model's state.
    cp = reply["toolu_cp"]
    assert client.show(cp["id"]).label == "before b.txt"
    assert client.show(cp["id"]).state == {"step": 1}
    # record_tool_call: in the ledger.
    [call] = client.tool_calls(sid)
    assert (call.name, call.effect, call.idempotency_key) == ("notes", "local", "notes-1")
    # request_approval: waited for the operator's decision and returned it.
    [approval] = client.list_approvals(sid)
    assert reply["toolu_ask"]["id"] == approval.id
    assert reply["toolu_ask"]["status"] == approval.status == "approved"
    assert approval.reason == "the test's yes"
    # restore: the file written after the checkpoint is gone, and the log says so.
    assert not (ws / "b.txt").exists() and (ws / "a.txt").read_text() == "v1\n"
    head = client.log(sid)[-1]
    assert head.kind == "restore" and head.restored_from == cp["id"]
    assert reply["toolu_restore"]["files_removed"] == ["b.txt"]
