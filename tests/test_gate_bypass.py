"""A gate the agent walks through is recorded as what it is: a gate bypass, never an
approval. Codex 0.171.0's behaviour as payloads (tests/fixtures/hooks/codex): it
ignores ``ask`` (and ``allow``) from a PreToolUse hook and runs the call, and it
fires no PostToolUse for an ``apply_patch`` sent through its shell tool. The real
Codex is driven in tests/agents/test_codex.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request

import pytest
from worldline.client import InvalidArgument
from worldline.client.lite import connect

from .conftest import WORLDLINE, DaemonProcess
from .test_hooks import Agent, decision, reason, session_of


@pytest.fixture
def metered(tmp_path):
    """A daemon of its own, its metrics served: (the daemon, the metrics URL)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    d = DaemonProcess(tmp_path / "root", extra=["--metrics-listen", f"127.0.0.1:{port}"])
    d.start()
    yield d, f"http://127.0.0.1:{port}/metrics"
    assert d.stop() == 0


def bypasses(url: str) -> float:
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    line = next(li for li in text.splitlines()
                if li.startswith("worldline_gate_bypasses_total "))
    return float(line.split()[1])


def audit(client, sid: str, kind: str) -> list:
    return [e for e in client.audit(sid) if e.kind == kind]


@pytest.mark.parametrize("forced_ask", [False, True], ids=["refused", "ask-forced"])
def test_a_gated_call_codex_runs_anyway_is_a_bypass_never_an_approval(
        forced_ask, metered, workspace, tmp_path):
    daemon, metrics = metered
    extra = ["--approval", "ask"] if forced_ask else []
    agent = Agent("codex", daemon, workspace, tmp_path, extra)
    if forced_ask:  # as a hook that still answered "ask" to Codex did
        agent.env["WORLDLINE_HOOK_UNCHECKED"] = "1"
    client = daemon.client()
    agent.run("start")
    sid = session_of(client, workspace).id
    out, _ = agent.run("pre_push")
    [approval] = client.list_approvals(sid, "pending")
    if forced_ask:
        assert decision("codex", out) == "ask"
    else:  # Codex honours deny: refused, the model told the id and how to approve it
        assert decision("codex", out) == "deny"
        assert f"worldline approve {approval.id}" in reason("codex", out)
    # Codex ran it anyway: its PostToolUse arrives.
    _, res = agent.run("post_push")
    assert "gate bypassed" in res.stderr
    [call] = [c for c in client.tool_calls(sid) if c.name == "Bash"]
    assert call.gate == "bypassed" and call.approval_id is None
    assert call.idempotency_key == "call_push1"
    # No approval: the one the gate asked for is still pending, and nobody approved.
    assert client.get_approval(approval.id).status == "pending"
    assert audit(client, sid, "approval.approved") == []
    [event] = audit(client, sid, "gate_bypassed")
    assert event.subject_id == call.id and event.detail["approval"] == approval.id
    assert bypasses(metrics) == 1.0
    # The JSON of the call says so, and a restore to before it lists it.
    listed = daemon.cli_json("tools", sid)
    assert [c["gate"] for c in listed] == ["bypassed"]
    before = client.log(sid)[-2]  # the checkpoint the call followed
    assert before.id == call.checkpoint_id
    result = client.restore(sid, before.id, dry_run=True)
    assert [(e.tool_call_id, e.gate) for e in result.side_effects] == [(call.id, "bypassed")]
    # The operator may still approve the call: the retry then goes through, citing it.
    client.decide_approval(approval.id, approve=True, reason="deploy it")
    out, _ = agent.run("pre_push")
    # Codex ignores allow: the hook passes the call to Codex's own rules (unchecked, as
    # configured: allow)
    assert decision("codex", out) == ("allow" if forced_ask else "pass")
    client.close()


def test_a_person_s_yes_at_a_client_that_honours_ask_is_an_approval(daemon, client,
                                                                      workspace, tmp_path):
    agent = Agent("claude-code", daemon, workspace, tmp_path,
                  ["--approval", "ask", "--client-version", "2.1.197"])
    agent.run("start")
    sid = session_of(client, workspace).id
    out, _ = agent.run("pre_push")
    assert decision("claude-code", out) == "ask"
    agent.run("post_push")  # the person said yes
    [call] = [c for c in client.tool_calls(sid) if c.name == "Bash"]
    assert call.gate is None and call.approval_id
    assert client.get_approval(call.approval_id).status == "approved"
    assert audit(client, sid, "gate_bypassed") == []


@pytest.mark.parametrize("agent_name, version, wanted, answered", [
    ("codex", "0.171.0", "ask", "deny"),
    ("codex", "", "", "deny"),  # no version given: Codex as worldline last knew it
    ("codex", "unknown", "wait", "deny"),  # (an unanswered wait refuses)
    ("claude-code", "2.1.197", "ask", "ask"),
    ("claude-code", "unknown", "ask", "deny"),  # `init` could not read its version
    ("claude-code", "9.1.0", "ask", "deny"),  # a version worldline does not know
])
def test_the_hook_answers_only_what_the_client_version_honours(
        agent_name, version, wanted, answered, daemon, client, workspace, tmp_path):
    extra = [*(["--approval", wanted] if wanted else []),
             *(["--client-version", version] if version else []),
             *(["--wait", "0"] if wanted == "wait" else [])]
    agent = Agent(agent_name, daemon, workspace, tmp_path, extra)
    agent.run("start")
    out, _ = agent.run("pre_push")
    assert decision(agent_name, out) == answered
    if answered == "deny":
        [approval] = client.list_approvals(session_of(client, workspace).id, "pending")
        assert f"worldline approve {approval.id}" in reason(agent_name, out)


def test_a_call_that_fires_no_after_event_is_recorded_with_its_changes(daemon, client,
                                                                       workspace, tmp_path):
    agent = Agent("codex", daemon, workspace, tmp_path)
    agent.run("start")
    sid = session_of(client, workspace).id
    agent.say("user", "add patched.txt")
    agent.run("prompt")
    out, _ = agent.run("pre_patch")
    assert decision("codex", out) == "pass"
    (workspace / "patched.txt").write_text("patched\n")  # Codex applies it: no PostToolUse
    agent.say("assistant", "done")
    agent.run("stop")
    prompt_cp, patch_cp, stop_cp = client.log(sid)[-3:]
    assert patch_cp.label.startswith("Bash: apply_patch") and \
        patch_cp.label.endswith("(no after-tool event)")
    assert client.diff(prompt_cp.id, patch_cp.id).added == ["patched.txt"]
    assert client.diff(patch_cp.id, stop_cp.id).added == []  # the stop changed nothing
    [call] = client.tool_calls(sid)
    assert call.idempotency_key == "call_patch1" and call.checkpoint_id == prompt_cp.id
    assert call.args["command"].startswith("apply_patch")
    # The conversation is in the checkpoints, each entry once.
    assert [m["role"] for m in client.show(stop_cp.id).messages] == ["user", "assistant"]


def test_a_gate_of_another_kind_is_refused(daemon, client, workspace):
    s = client.create_session(str(workspace))
    with connect(daemon.address) as lite, pytest.raises(InvalidArgument):
        lite.call("RecordToolCall", {"session_id": s.id, "name": "Bash",
                                     "args_json": "{}", "gate": "waved-through"})
    assert client.tool_calls(s.id) == []


def test_init_with_no_client_found_writes_a_mode_that_fails_closed(tmp_path):
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + ":/usr/bin:/bin"}
    res = subprocess.run(WORLDLINE + ["init", "claude-code", "--project", str(tmp_path),
                                      "--approval", "ask", "--json"],
                         capture_output=True, text=True, env=env, timeout=30)
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    assert d["client"]["version"] == "unknown" and d["client"]["approval"] == "deny"
    hooks = json.loads((tmp_path / ".claude" / "settings.local.json").read_text())["hooks"]
    command = hooks["PreToolUse"][0]["hooks"][0]["command"]
    assert command.endswith("hook claude-code --approval deny --client-version unknown")


def test_a_bypass_of_a_local_call_is_still_among_a_restore_s_side_effects(tmp_path, workspace):
    """A policy rule may gate a call whose effect is local: a restore lists it only
    because it bypassed the gate."""
    policy = tmp_path / "policy.toml"
    policy.write_text('[[command]]\nmatch = "make release*"\neffect = "local"\n'
                      'require_approval = true\n')
    d = DaemonProcess(tmp_path / "root", extra=["--policy", str(policy)]).start()
    try:
        with d.client() as client:
            s = client.create_session(str(workspace))
            first = client.checkpoint(s.id)
            args = json.dumps({"command": "make release"})
            with connect(d.address) as lite:
                call = lite.call("RecordToolCall", {"session_id": s.id, "name": "Bash",
                                                    "args_json": args, "gate": "bypassed"})
                plain = lite.call("RecordToolCall", {"session_id": s.id, "name": "Bash",
                                                     "args_json": json.dumps(
                                                         {"command": "make test"})})
            assert call["effect"] == "local" and call["gate"] == "bypassed"
            assert plain["gate"] == ""
            client.checkpoint(s.id)
            result = client.restore(s.id, first.id, dry_run=True)
            assert [(e.tool_call_id, e.gate) for e in result.side_effects] == [
                (call["id"], "bypassed")]
    finally:
        assert d.stop() == 0


def test_a_bypass_is_a_warning_on_the_next_checkpoint_only(daemon, workspace):
    from worldline.v1 import worldline_pb2 as pb
    with daemon.client() as c:
        s = c.create_session(str(workspace))
        call = c._call("RecordToolCall", pb.RecordToolCallRequest(
            session_id=s.id, name="Bash", args_json='{"command": "git push"}',
            gate="bypassed"))
        first = c.show(c.checkpoint(s.id).id)
        assert [w for w in first.warnings if call.id in w and "gate bypassed" in w]
        assert c.show(c.checkpoint(s.id).id).warnings == []
