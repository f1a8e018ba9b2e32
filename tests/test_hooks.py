"""`worldline hook AGENT` and `worldline init AGENT`: each agent's documented payloads
(tests/fixtures/hooks) through the real CLI against a real daemon."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from worldline.client import _json
from worldline.client.hooks import agents, run, transcripts

from .conftest import WORLDLINE
from .fidelity import in_child_as

FIXTURES = Path(__file__).parent / "fixtures" / "hooks"
AGENTS = ["claude-code", "codex", "gemini", "cursor", "generic"]


class Agent:
    """One agent session in a workspace: fills the fixtures in, runs the hook, and
    appends to the agent's transcript the way that agent writes it."""

    def __init__(self, name: str, daemon, workspace: Path, tmp: Path, extra=()) -> None:
        self.name, self.daemon, self.workspace = name, daemon, workspace
        self.session = f"{name}-sess-{time.monotonic_ns()}"
        suffix = ".json" if name == "gemini" else ".jsonl"
        self.transcript = tmp / f"transcript{suffix}"
        self.entries: list[dict] = []
        self.extra = list(extra)
        self.env = {**os.environ, "WORLDLINE_HOOK_STATE": str(tmp / "hook-state")}
        self.file = workspace / "app.py"

    def say(self, role: str, text: str) -> dict:
        n = len(self.entries)
        if self.name == "claude-code":
            entry = {"type": role, "uuid": f"uuid-{n}", "sessionId": self.session,
                     "message": {"role": role, "content": text}}
        elif self.name == "codex":
            entry = {"timestamp": "2026-11-23T10:00:00Z", "type": "response_item",
                     "payload": {"type": "message", "role": role,
                                 "content": [{"type": "input_text", "text": text}]}}
        elif self.name == "gemini":
            entry = {"id": f"msg-{n}", "timestamp": "2026-11-23T10:00:00Z",
                     "type": "gemini" if role == "assistant" else "user", "content": text}
        else:
            entry = {"role": role, "text": text, "id": f"c-{n}"}
        self.entries.append(entry)
        if self.name == "gemini":
            self.transcript.write_text(json.dumps({"sessionId": self.session,
                                                   "messages": self.entries}))
        elif self.name != "generic":
            with open(self.transcript, "a") as f:
                f.write(json.dumps(entry) + "\n")
        return entry

    def payload(self, event: str) -> str:
        text = (FIXTURES / self.name / f"{event}.json").read_text()
        for key, value in (("{session}", self.session), ("{cwd}", str(self.workspace)),
                           ("{transcript}", str(self.transcript)), ("{file}", str(self.file))):
            text = text.replace(key, value)
        return text

    def run(self, event: str, *extra: str, address: str | None = None,
            check: bool = True) -> tuple[dict, subprocess.CompletedProcess]:
        res = subprocess.run(
            WORLDLINE + ["hook", self.name, "--address", address or self.daemon.address,
                         *self.extra, *extra],
            input=self.payload(event), capture_output=True, text=True, env=self.env,
            timeout=60)
        assert res.returncode == 0, res.stderr
        out = json.loads(res.stdout)
        return out, res

    def popen(self, event: str, *extra: str) -> subprocess.Popen:
        proc = subprocess.Popen(
            WORLDLINE + ["hook", self.name, "--address", self.daemon.address, *self.extra,
                         *extra], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env=self.env)
        proc.stdin.write(self.payload(event))
        proc.stdin.close()
        return proc


def finish(proc: subprocess.Popen) -> dict:
    out = proc.stdout.read()
    assert proc.wait(timeout=60) == 0, proc.stderr.read()
    return json.loads(out)


def session_of(client, workspace: Path):
    found = client.list_sessions(workspace=str(workspace))
    assert len(found) == 1
    return found[0]


def decision(agent: str, out: dict) -> str:
    """What an answer decides, read back in the agent's own schema."""
    if agent in ("claude-code", "codex"):
        return out.get("hookSpecificOutput", {}).get("permissionDecision", "pass")
    if agent == "gemini":
        return out.get("decision", "pass")
    if agent == "cursor":
        return out.get("permission", "pass")
    return out.get("decision", "pass")


def reason(agent: str, out: dict) -> str:
    return (out.get("hookSpecificOutput", {}).get("permissionDecisionReason")
            or out.get("reason") or out.get("agent_message") or "")


@pytest.mark.parametrize("name", AGENTS)
def test_a_session_of_tool_calls_builds_the_world_history(name, daemon, client, workspace,
                                                          tmp_path):
    agent = Agent(name, daemon, workspace, tmp_path)
    agent.file.write_text("broken\n")
    assert agent.run("start")[0] == ({} if name != "generic" else {"decision": "allow"})
    s = session_of(client, workspace)
    agent.say("user", "Fix the failing test")
    out, _ = agent.run("prompt")
    assert out == ({"continue": True} if name == "cursor" else
                   {"decision": "allow"} if name == "generic" else {})
    out, _ = agent.run("pre_edit")
    assert decision(name, out) in ("pass", "allow")  # not gated: the agent's rules decide
    agent.file.write_text("fixed\n")
    agent.say("assistant", "I fixed app.py")
    agent.run("post_edit")
    agent.say("assistant", "All done")
    agent.run("stop")

    log = client.log(s.id)
    assert [cp.kind for cp in log] == ["initial", "checkpoint", "checkpoint", "checkpoint"]
    prompt_cp, edit_cp, stop_cp = log[1:]
    assert prompt_cp.label.startswith("prompt: Fix the failing test")
    calls = client.tool_calls(s.id)
    assert len(calls) == 1 and calls[0].effect == "local"
    assert calls[0].checkpoint_id == prompt_cp.id  # the head it followed
    if name in ("claude-code", "codex", "generic"):
        assert calls[0].idempotency_key  # the agent's tool-use id
    # The edit checkpoint holds the edited file; the one before holds the old bytes.
    assert client.diff(prompt_cp.id, edit_cp.id).modified == ["app.py"]
    # The conversation is the transcript, entry for entry, in order.
    messages = client.show(stop_cp.id).messages
    if name == "generic":
        assert [m["content"] for m in messages] == ["Fix the failing test", "wrote the fix"]
    else:
        assert len(messages) == 3
        assert [m["role"] for m in messages] == ["user", "assistant", "assistant"]
        assert stop_cp.resume["transcript"] == str(agent.transcript)
        assert stop_cp.resume["entries"] == 3
        assert stop_cp.resume["session_id"] == agent.session
    # Nothing is read twice: another stop with no new entries adds no message.
    agent.run("stop")
    assert client.log(s.id)[-1].messages_added == 0


@pytest.mark.parametrize("name", AGENTS)
def test_a_gated_command_gets_the_agents_deny_or_ask(name, daemon, client, workspace, tmp_path):
    agent = Agent(name, daemon, workspace, tmp_path)
    agent.run("start")
    s = session_of(client, workspace)
    out, _ = agent.run("pre_push")
    pending = client.list_approvals(s.id, "pending")
    assert len(pending) == 1
    approval = pending[0]
    assert client.log(s.id)[-1].id == approval.checkpoint_id  # checkpointed first
    refused = name in ("gemini", "codex")  # no "ask" honoured (client/hooks/support.py)
    if refused:  # refused with the id and the approve command
        assert decision(name, out) == "deny"
        assert f"worldline approve {approval.id}" in reason(name, out)
    else:
        assert decision(name, out) == "ask"
        assert approval.id in reason(name, out)
    # Asked again (the agent retried): the same approval, not a second one.
    agent.run("pre_push")
    assert len(client.list_approvals(s.id)) == 1
    if refused:
        client.decide_approval(approval.id, approve=True, reason="ok")
        out, _ = agent.run("pre_push")  # the retry after approval goes through
        assert decision(name, out) == "pass"
    # It ran (the person said yes, or the operator approved): recorded, citing it.
    agent.run("post_push")
    calls = [c for c in client.tool_calls(s.id) if c.effect == "external_non_idempotent"]
    assert len(calls) == 1 and calls[0].approval_id == approval.id
    assert client.get_approval(approval.id).status == "approved"


def test_an_operator_approves_while_the_hook_waits(daemon, workspace, tmp_path):
    agent = Agent("claude-code", daemon, workspace, tmp_path, ["--approval", "wait",
                                                                "--wait", "30"])
    agent.run("start")
    sid = session_of(daemon.client(), workspace).id
    proc = agent.popen("pre_push")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        pending = daemon.cli_json("approvals", "list", "--status", "pending", "--session", sid)
        if pending:
            break
        time.sleep(0.1)
    assert proc.poll() is None  # still waiting for the operator
    daemon.cli("approve", pending[0]["id"], "--reason", "go ahead")
    out = finish(proc)
    assert decision("claude-code", out) == "allow"
    agent.run("post_push")
    calls = daemon.cli_json("tools", sid)
    assert [c["approval_id"] for c in calls] == [pending[0]["id"]]


def test_an_operator_denies_while_the_hook_waits(daemon, workspace, tmp_path):
    agent = Agent("codex", daemon, workspace, tmp_path, ["--approval", "wait", "--wait", "30"])
    agent.run("start")
    sid = session_of(daemon.client(), workspace).id
    proc = agent.popen("pre_push")
    deadline = time.monotonic() + 20
    pending = []
    while not pending and time.monotonic() < deadline:
        pending = daemon.cli_json("approvals", "list", "--status", "pending", "--session", sid)
        time.sleep(0.1)
    daemon.cli("deny", pending[0]["id"], "--reason", "not on a Friday")
    out = finish(proc)
    assert decision("codex", out) == "deny"
    assert "not on a Friday" in reason("codex", out)  # fed back to the model


def test_an_unanswered_wait_denies_with_the_approve_command(daemon, workspace, tmp_path):
    agent = Agent("claude-code", daemon, workspace, tmp_path, ["--approval", "wait",
                                                                "--wait", "0.5"])
    out, _ = agent.run("pre_push")
    assert decision("claude-code", out) == "deny"
    assert "worldline approve " in reason("claude-code", out)


@pytest.mark.parametrize("name", AGENTS)
def test_the_daemon_down_fails_open_after_and_closed_for_gated_calls(name, daemon, workspace,
                                                                   tmp_path):
    agent = Agent(name, daemon, workspace, tmp_path)
    gone = f"unix://{tmp_path}/no-daemon.sock"
    out, res = agent.run("post_edit", address=gone)
    assert decision(name, out) in ("pass", "allow")
    assert "fail open" in res.stderr
    out, res = agent.run("pre_edit", address=gone)
    assert decision(name, out) in ("pass", "allow")
    out, res = agent.run("pre_push", address=gone)
    assert decision(name, out) == "deny"
    assert "fail closed" in res.stderr
    out, _ = agent.run("pre_push", "--unavailable", "open", address=gone)
    assert decision(name, out) in ("pass", "allow")
    out, _ = agent.run("post_edit", "--unavailable", "closed", address=gone)
    assert decision(name, out) in ("pass", "allow")  # after the call there is nothing to block


def test_a_bad_payload_is_answered_and_named(daemon, tmp_path):
    res = subprocess.run(WORLDLINE + ["hook", "claude-code", "--address", daemon.address],
                         input="not json", capture_output=True, text=True, timeout=30)
    assert res.returncode == 0 and json.loads(res.stdout) == {}
    assert "not JSON" in res.stderr
    res = subprocess.run(WORLDLINE + ["hook", "nope"], input="{}", capture_output=True,
                         text=True, timeout=30)
    assert res.returncode != 0 and "first argument" in res.stderr


def test_rewind_restores_and_says_where_to_resume(daemon, client, workspace, tmp_path):
    agent = Agent("claude-code", daemon, workspace, tmp_path)
    agent.file.write_text("v1\n")
    agent.run("start")
    agent.say("user", "change it")
    agent.say("assistant", "changing")
    agent.run("pre_edit")
    agent.file.write_text("v2\n")
    agent.run("post_edit")
    agent.say("assistant", "changed again")
    agent.file.write_text("v3\n")
    agent.run("post_edit")
    res = subprocess.run(WORLDLINE + ["rewind", "--address", daemon.address, "--json"],
                         capture_output=True, text=True, cwd=workspace, timeout=60)
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    assert agent.file.read_text() == "v2\n"
    assert d["files_written"] == ["app.py"]
    assert d["resume_command"] == f"claude --resume {agent.session} --resume-session-at uuid-1"
    log = client.log(session_of(client, workspace).id)
    assert log[-1].kind == "restore" and log[-1].resume == client.show(d["restored_from"]).resume
    assert log[1].label == "Write: app.py"
    res = subprocess.run(WORLDLINE + ["rewind", "--address", daemon.address, "--steps", "99"],
                         capture_output=True, text=True, cwd=workspace, timeout=60)
    assert res.returncode == 1 and "INVALID_ARGUMENT" in res.stderr
    res = subprocess.run(WORLDLINE + ["rewind", "--address", daemon.address],
                         capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert res.returncode == 1 and "NOT_FOUND" in res.stderr


def test_a_deleted_session_is_replaced_on_the_next_event(daemon, client, workspace, tmp_path):
    agent = Agent("claude-code", daemon, workspace, tmp_path)
    agent.run("start")
    first = session_of(client, workspace)
    client.delete_session(first.id)
    agent.run("stop")
    second = session_of(client, workspace)
    assert second.id != first.id and len(client.log(second.id)) == 2


# -- transcripts --------------------------------------------------------------------------
def test_a_line_still_being_written_waits(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"uuid": "a", "type": "user"}\n{"uuid": "b", "ty')
    msgs, cur, _ = transcripts.read_new("claude-code", str(path), transcripts.Cursor())
    assert [m["uuid"] for m in msgs] == ["a"] and cur.entries == 1
    with open(path, "a") as f:
        f.write('pe": "assistant"}\n')
    msgs, cur, _ = transcripts.read_new("claude-code", str(path), cur)
    assert [m["uuid"] for m in msgs] == ["b"] and cur.resume_entry == "b"


def test_a_resumed_transcript_does_not_repeat_what_was_recorded(tmp_path):
    """A conversation resumed at an entry copies the history into a new transcript."""
    new = tmp_path / "resumed.jsonl"
    new.write_text("".join(json.dumps({"uuid": u, "type": "user"}) + "\n"
                           for u in ("a", "b", "c")))
    msgs, _, _ = transcripts.read_new("claude-code", str(new),
                                   transcripts.Cursor(str(tmp_path / "old.jsonl"), 99, 2, "b"),
                                   skip_through="b")
    assert [m["uuid"] for m in msgs] == ["c"]


def test_gemini_reads_the_messages_added_to_its_document(tmp_path):
    """Up to 0.38: one JSON document, rewritten whole."""
    path = tmp_path / "chat.json"
    path.write_text(json.dumps({"messages": [{"id": "1", "type": "user", "content": "hi"}]}))
    msgs, cur, warnings = transcripts.read_new("gemini", str(path), transcripts.Cursor())
    assert [m["id"] for m in msgs] == ["1"] and warnings == []
    path.write_text(json.dumps({"messages": [{"id": "1", "type": "user", "content": "hi"},
                                             {"id": "2", "type": "gemini", "content": "yo"}]}))
    msgs, cur, _ = transcripts.read_new("gemini", str(path), cur, final=False)
    assert msgs == []  # the model's turn may still gain its tool calls
    msgs, cur, _ = transcripts.read_new("gemini", str(path), cur)
    assert msgs == [{"role": "assistant", "id": "2", "type": "gemini", "content": "yo"}]
    path.write_text('{"messages": [{"id": "1", "type": "us')  # caught mid-rewrite
    msgs, after, warnings = transcripts.read_new("gemini", str(path), cur)
    assert msgs == [] and after.entries == cur.entries and len(warnings) == 1


def _gemini_jsonl(path: Path, *records: dict) -> None:
    with open(path, "a") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")


def test_gemini_jsonl_is_read_as_gemini_cli_reads_it(tmp_path):
    """0.39 and later: a header, messages written again whole when they change, $set
    updates (one of them replacing the list), $rewindTo; each message once, as last
    written, where it first came; the model's turn recorded once it is whole."""
    path = tmp_path / "session-x.jsonl"
    _gemini_jsonl(path, {"sessionId": "s", "projectHash": "h", "startTime": "t"},
                  {"$set": {"messages": [{"id": "ctx", "type": "user", "content": "setup",
                                          "timestamp": "2026-01-01T00:00:00Z"}]}},
                  {"id": "u1", "type": "user", "content": [{"text": "write it"}],
                   "timestamp": "2026-01-01T00:00:01Z"},
                  {"$set": {"lastUpdated": "t2"}},
                  {"id": "g1", "type": "gemini", "content": "I will.",
                   "timestamp": "2026-01-01T00:00:02Z"})
    msgs, cur, warnings = transcripts.read_new("gemini", str(path), transcripts.Cursor(),
                                               final=False)
    assert [m["id"] for m in msgs] == ["ctx", "u1"] and warnings == []  # g1 is in flight
    assert 0 < cur.offset < path.stat().st_size  # the next read starts after u1's line
    _gemini_jsonl(path, {"id": "g1", "type": "gemini", "content": "I will.",
                         "timestamp": "2026-01-01T00:00:02Z",
                         "toolCalls": [{"id": "c1", "name": "write_file"}]},
                  {"id": "u2", "type": "user", "content": [{"functionResponse": {}}],
                   "timestamp": "2026-01-01T00:00:03Z"},
                  {"id": "g2", "type": "gemini", "content": "",
                   "timestamp": "2026-01-01T00:00:04Z"})
    msgs, cur, _ = transcripts.read_new("gemini", str(path), cur, final=False)
    assert [(m["id"], m["role"]) for m in msgs] == [("g1", "assistant"), ("u2", "user")]
    assert msgs[0]["toolCalls"][0]["name"] == "write_file"  # as last written
    _gemini_jsonl(path, {"id": "g2", "type": "gemini", "content": "done",
                         "timestamp": "2026-01-01T00:00:04Z"})
    msgs, cur, _ = transcripts.read_new("gemini", str(path), cur)  # the turn is over
    assert [(m["id"], m["content"]) for m in msgs] == [("g2", "done")]
    assert (cur.entries, cur.entry) == (5, "g2")
    # /rewind drops g1 and every later message; what comes after is new
    _gemini_jsonl(path, {"$rewindTo": "g1"}, {"id": "u3", "type": "user", "content": "again",
                                              "timestamp": "2026-01-01T00:00:05Z"})
    msgs, cur, warnings = transcripts.read_new("gemini", str(path), cur)
    assert [m["id"] for m in msgs] == ["u3"] and len(warnings) == 1 and "g2" in warnings[0]
    _gemini_jsonl(path, {"id": "g3", "type": "gemini", "content": "ok",
                         "timestamp": "2026-01-01T00:00:06Z"})
    msgs, cur, warnings = transcripts.read_new("gemini", str(path), cur)
    assert [m["id"] for m in msgs] == ["g3"] and warnings == []
    # its history replaced whole (as at a compression), the ids kept: only the new one
    kept = [json.loads(line) for line in path.read_text().splitlines()]
    kept = {r["id"]: r for r in kept if "id" in r}
    _gemini_jsonl(path, {"$set": {"messages": [kept["u1"], kept["u3"], kept["g3"], {
        "id": "u4", "type": "user", "content": "more", "timestamp": "2026-01-01T00:00:07Z"}]}})
    msgs, cur, warnings = transcripts.read_new("gemini", str(path), cur)
    assert [m["id"] for m in msgs] == ["u4"] and warnings == []


def test_a_transcript_that_cannot_be_read_is_said(tmp_path):
    for agent in ("gemini", "claude-code"):
        missing = tmp_path / f"{agent}-gone.jsonl"
        msgs, cur, warnings = transcripts.read_new(agent, str(missing), transcripts.Cursor())
        assert msgs == [] and len(warnings) == 1 and str(missing) in warnings[0]
        assert transcripts.read_new(agent, str(missing), transcripts.Cursor(),
                                    missing_ok=True)[2] == []  # not made yet: no loss
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text("this is not JSON\n")
    msgs, _, warnings = transcripts.read_new("gemini", str(garbage), transcripts.Cursor())
    assert msgs == [] and len(warnings) == 1
    msgs, _, warnings = transcripts.read_new("claude-code", str(garbage), transcripts.Cursor())
    assert msgs == [{"role": "event", "unparsed": "this is not JSON"}] and len(warnings) == 1


def test_a_transcript_the_hook_cannot_read_is_a_warning_on_the_checkpoint(daemon, client,
                                                                         workspace, tmp_path):
    """Never an empty conversation recorded as if whole: the checkpoint says what it
    lacks (`show --json` and the client), and the hook says it on stderr."""
    agent = Agent("gemini", daemon, workspace, tmp_path)
    agent.run("start")
    agent.say("user", "hello")
    agent.run("prompt")
    agent.transcript.write_text("the agent's session, in no format Gemini CLI writes\n")
    _, res = agent.run("stop")
    assert "warning:" in res.stderr and str(agent.transcript) in res.stderr
    sid = session_of(client, workspace).id
    first, last = [cp for cp in client.log(sid) if cp.kind == "checkpoint"]
    assert first.warnings == [] and client.show(first.id).messages
    assert len(last.warnings) == 1 and str(agent.transcript) in last.warnings[0]
    shown = subprocess.run(WORLDLINE + ["show", last.id, "--json", "--address",
                                        daemon.address], capture_output=True, text=True)
    assert json.loads(shown.stdout)["warnings"] == last.warnings
    plain = subprocess.run(WORLDLINE + ["show", last.id, "--address", daemon.address],
                           capture_output=True, text=True).stdout
    assert f"warning: {last.warnings[0]}" in plain


def test_payloads_the_agents_do_not_send_are_refused():
    with pytest.raises(agents.PayloadError):
        agents.parse("claude-code", '{"hook_event_name": "PreToolUse"}')  # no session
    with pytest.raises(agents.PayloadError):
        agents.parse("claude-code", '{"hook_event_name": "PreToolUse", "session_id": "s"}')
    assert agents.parse("codex", '{"hook_event_name": "Odd", "session_id": "s"}').kind == "other"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner), max_leaves=20)


@given(json_values)
def test_the_hooks_json_is_the_standard_librarys(value):
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    assert _json.dumps(value) == text
    assert _json.dumps(value, sort_keys=True) == json.dumps(
        value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    assert _json.loads(text) == json.loads(text)
    assert _json.loads(f"  {text}\n") == json.loads(text)


def test_the_hooks_json_refuses_what_json_refuses():
    for bad in ("", "{", "[1,]", "1 2", "{'a': 1}"):
        with pytest.raises(ValueError):
            _json.loads(bad)


def test_the_hook_process_imports_neither_grpc_nor_json(daemon, workspace, tmp_path):
    """The hook's start-up cost is its users' latency on every tool call."""
    code = ("import sys; sys.argv = ['worldline', 'hook', 'claude-code', '--help'];"
            " from worldline.client.entry import main\n"
            "try: main()\nexcept SystemExit: pass\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in"
            " ('grpc', 'json', 'argparse', 'google', 're', 'typing')))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.stdout.strip().splitlines()[-1] == "[]", res.stdout


# -- init ---------------------------------------------------------------------------------
def init(project: Path, agent: str, *args: str) -> dict:
    res = subprocess.run(WORLDLINE + ["init", agent, "--project", str(project), "--json",
                                      "--command", "worldline hook " + agent, *args],
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


@pytest.mark.parametrize("name", ["claude-code", "codex", "gemini", "cursor"])
def test_init_merges_idempotently_and_removes_cleanly(name, tmp_path):
    from worldline.client.hooks.settings import EVENTS, settings_path
    settings = Path(settings_path(name, False, str(tmp_path)))  # claude-code's: the local one
    # missing
    d = init(tmp_path, name)
    assert d["changed"] and d["backup"] is None
    doc = json.loads(settings.read_text())
    assert set(doc["hooks"]) == set(EVENTS[name])
    # again: nothing changes, nothing is added twice
    assert not init(tmp_path, name)["changed"]
    assert json.loads(settings.read_text()) == doc
    # removed: the file holds no hooks of ours
    d = init(tmp_path, name, "--remove")
    assert d["changed"] and d["backup"]
    assert "worldline hook" not in settings.read_text()


@pytest.mark.parametrize("name", ["claude-code", "codex", "gemini", "cursor"])
def test_init_keeps_the_users_settings_and_hooks(name, tmp_path):
    from worldline.client.hooks.settings import settings_path
    settings = Path(settings_path(name, False, str(tmp_path)))
    settings.parent.mkdir(parents=True)
    theirs = {"command": "./format.sh"} if name == "cursor" else {
        "matcher": "Edit", "hooks": [{"type": "command", "command": "./format.sh"}]}
    event = "afterFileEdit" if name == "cursor" else (
        "AfterTool" if name == "gemini" else "PostToolUse")
    original = {"model": "their-model", "permissions": {"allow": ["Bash(ls:*)"]},
                "hooks": {event: [theirs], "Notification": [theirs]}}
    if name == "cursor":
        original["version"] = 1
    settings.write_text(json.dumps(original, indent=2))
    before = settings.read_text()
    d = init(tmp_path, name, "--dry-run")
    assert d["changed"] and "+" in d["diff"] and settings.read_text() == before
    d = init(tmp_path, name)
    assert Path(d["backup"]).read_text() == before
    doc = json.loads(settings.read_text())
    assert doc["model"] == "their-model" and doc["permissions"] == original["permissions"]
    assert doc["hooks"][event][0] == theirs and doc["hooks"]["Notification"] == [theirs]
    assert len(doc["hooks"][event]) == 2
    init(tmp_path, name, "--remove")
    assert json.loads(settings.read_text()) == original


def test_init_refuses_a_settings_file_that_is_not_json(tmp_path):
    settings = tmp_path / ".claude" / "settings.local.json"
    settings.parent.mkdir()
    settings.write_text("{ not json")
    res = subprocess.run(WORLDLINE + ["init", "claude-code", "--project", str(tmp_path)],
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 1 and "FAILED_PRECONDITION" in res.stderr
    assert settings.read_text() == "{ not json"


def test_init_claude_code_writes_the_local_file_and_shared_only_when_asked(tmp_path):
    """`init claude-code` writes the project's uncommitted .claude/settings.local.json
    (its command names this machine's worldline); --shared the committed settings.json,
    and each run says when the other file holds worldline's hooks too."""
    local = tmp_path / ".claude" / "settings.local.json"
    shared = tmp_path / ".claude" / "settings.json"
    d = init(tmp_path, "claude-code")
    assert d["path"] == str(local) and d["also"] is None
    assert "worldline hook" in local.read_text() and not shared.exists()
    d = init(tmp_path, "claude-code", "--shared")
    assert d["path"] == str(shared) and d["also"] == str(local)
    assert "worldline hook" in shared.read_text()
    res = subprocess.run(WORLDLINE + ["init", "claude-code", "--project", str(tmp_path),
                                      "--remove"], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    assert "worldline hook" not in local.read_text()
    assert f"in {shared} too" in res.stdout and "--shared --remove" in res.stdout


def test_init_trusts_only_for_gemini_and_only_the_folder_named(tmp_path):
    home = tmp_path / "home"
    env = {**os.environ, "HOME": str(home)}
    res = subprocess.run(WORLDLINE + ["init", "codex", "--project", str(tmp_path), "--trust"],
                         capture_output=True, text=True, timeout=30, env=env)
    assert res.returncode == 1 and "INVALID_ARGUMENT" in res.stderr
    assert not (tmp_path / ".codex").exists()
    (home / ".gemini").mkdir(parents=True)
    rules = home / ".gemini" / "trustedFolders.json"
    rules.write_text(json.dumps({"/elsewhere": "DO_NOT_TRUST"}))
    res = subprocess.run(WORLDLINE + ["init", "gemini", "--project", str(tmp_path), "--json",
                                      "--trust", "--dry-run"],
                         capture_output=True, text=True, timeout=30, env=env)
    assert json.loads(res.stdout)["trust"]["trusted"] is False  # a dry run trusts nothing
    res = subprocess.run(WORLDLINE + ["init", "gemini", "--project", str(tmp_path), "--json",
                                      "--trust"],
                         capture_output=True, text=True, timeout=30, env=env)
    assert json.loads(res.stdout)["trust"]["trusted"] is True
    assert json.loads(rules.read_text()) == {"/elsewhere": "DO_NOT_TRUST",
                                             str(tmp_path.resolve()): "TRUST_FOLDER"}


def test_init_empty_file_and_user_scope(tmp_path):
    settings = tmp_path / ".gemini" / "settings.json"
    settings.parent.mkdir()
    settings.write_text("")
    assert init(tmp_path, "gemini")["changed"]
    home = tmp_path / "home"
    home.mkdir()
    res = subprocess.run(WORLDLINE + ["init", "codex", "--user", "--json"], capture_output=True,
                         text=True, env={**os.environ, "HOME": str(home)}, timeout=30)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["path"] == str(home / ".codex" / "hooks.json")
    hook = json.loads((home / ".codex" / "hooks.json").read_text())["hooks"]["PreToolUse"]
    assert "hook codex" in hook[0]["hooks"][0]["command"]


def gateway_call_as(uid: int, socket_path: str, method: str, request: dict) -> dict | str:
    """In a child running as ``uid``: one JSON line to the gateway, its answer back."""
    def call():
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(10)
                s.connect(socket_path)
                s.sendall(json.dumps({"method": method, "request": request}).encode()
                          + b"\n")
                answer = s.makefile("rb").readline()
            return json.loads(answer) if answer else "refused"
        except OSError as exc:
            return f"refused {exc.__class__.__name__}"
    return in_child_as(uid, call)


@pytest.mark.skipif(os.geteuid() != 0, reason="switching uids needs root")
def test_the_gateway_admits_only_allowed_uids(tmp_path_factory):
    """The hook runs as the agent's user (uid 1000): with --allow-uid 1000 its calls go
    through the JSON gateway; any other uid is refused; without --allow-uid the
    gateway's socket is owner-only like the gRPC one."""
    import shutil
    import tempfile

    from .conftest import DaemonProcess
    base = Path(tempfile.mkdtemp(prefix="wl-gw-"))
    os.chmod(base, 0o711)
    d = DaemonProcess(base / "root", extra=["--allow-uid", "1000"]).start()
    try:
        sock = str(base / "root" / "worldline.sock.json")
        assert oct(os.stat(sock).st_mode & 0o777) == oct(0o666)  # peers are checked instead
        ws = base / "agent-ws"
        ws.mkdir()
        os.chown(ws, 1000, 1000)
        answer = gateway_call_as(1000, sock, "CreateSession", {"workspace": str(ws)})
        assert answer["response"]["workspace"] == str(ws), answer
        sid = answer["response"]["id"]
        answer = gateway_call_as(1000, sock, "CreateCheckpoint", {"session_id": sid})
        assert answer["response"]["seq"] == 1, answer
        assert str(gateway_call_as(65534, sock, "ListSessions", {})).startswith("refused")
        assert "error" in gateway_call_as(1000, sock, "NoSuchCall", {})
        with d.client() as c:
            assert len(c.log(sid)) == 2
    finally:
        d.stop()
        shutil.rmtree(base, ignore_errors=True)
    private = DaemonProcess(tmp_path_factory.mktemp("gw") / "root").start()
    try:
        mode = (private.root / "worldline.sock.json").stat().st_mode & 0o777
        assert oct(mode) == oct(0o600)
    finally:
        private.stop()


def test_a_transcript_gone_while_the_hook_waits_for_its_entry_is_one_warning(
        daemon, client, workspace, tmp_path):
    """Claude Code's hook waits for its call's transcript entry; a transcript it cannot
    read is said once on the checkpoint, and the hook does not wait on it."""
    agent = Agent("claude-code", daemon, workspace, tmp_path)
    agent.run("start")
    entry = agent.say("user", "edit it")
    entry["version"] = "2.1.197"  # Claude Code's own entries name their version
    agent.transcript.write_text(json.dumps(entry) + "\n")
    agent.run("prompt")
    agent.transcript.unlink()
    started = time.monotonic()
    _, res = agent.run("post_edit")
    assert time.monotonic() - started < run.WAIT_ENTRY + 2.0
    last = [cp for cp in client.log(session_of(client, workspace).id)
            if cp.kind == "checkpoint"][-1]
    assert len(last.warnings) == 1 and str(agent.transcript) in last.warnings[0]
