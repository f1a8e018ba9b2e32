"""Each agent's hook payloads, read into one ``Event``, and its answers, written in the
agent's own schema.

The references these follow (read them before changing a shape):
- Claude Code: "Hooks reference" (code.claude.com/docs/en/hooks): every payload has
  ``session_id``, ``transcript_path`` (JSONL), ``cwd``, ``hook_event_name``; tool
  events add ``tool_name``, ``tool_input``, ``tool_use_id`` and, after the call,
  ``tool_response``. A PreToolUse answer is ``hookSpecificOutput.permissionDecision``
  (allow | deny | ask) with ``permissionDecisionReason`` (shown to the model on deny,
  to the person on ask).
- Codex: the same wire format (codex-rs/hooks/schema); but 0.171.0 honours only deny
  (and exit 2): allow and ask fail open and the call runs (support.py says, per
  version, what each client honours); ``transcript_path`` is the session's rollout
  JSONL (may be null).
- Gemini CLI: "Hooks reference" (geminicli.com/docs/hooks/reference): BeforeTool /
  AfterTool with ``tool_name``, ``tool_input``, ``tool_response``; BeforeAgent,
  AfterAgent, SessionStart; ``transcript_path`` is one JSON document. A BeforeTool
  answer is ``{"decision": "deny", "reason": ...}``; there is no "ask".
- Cursor: "Hooks" (cursor.com/docs/agent/hooks): ``conversation_id``,
  ``workspace_roots``; beforeShellExecution / beforeMCPExecution / preToolUse answer
  ``{"permission": "allow" | "deny" | "ask", "user_message", "agent_message"}``;
  afterShellExecution, afterMCPExecution, afterFileEdit, postToolUse after a call;
  beforeSubmitPrompt answers ``{"continue": true}``; stop.
- generic: worldline's own, for any harness (docs/hooks.md).
"""

from __future__ import annotations

import os

from .. import _json as json

AGENTS = ("claude-code", "codex", "gemini", "cursor", "generic")

# What an event asks of worldline.
START, PRE, POST, PROMPT, STOP, OTHER = "start", "pre", "post", "prompt", "stop", "other"

# The agent's event names, by what they mean.
_KINDS = {
    "claude-code": {"SessionStart": START, "PreToolUse": PRE, "PostToolUse": POST,
                    "UserPromptSubmit": PROMPT, "Stop": STOP, "SessionEnd": STOP},
    "codex": {"SessionStart": START, "PreToolUse": PRE, "PostToolUse": POST,
              "UserPromptSubmit": PROMPT, "Stop": STOP},
    "gemini": {"SessionStart": START, "BeforeTool": PRE, "AfterTool": POST,
               "BeforeAgent": PROMPT, "AfterAgent": STOP},
    "cursor": {"sessionStart": START, "preToolUse": PRE, "beforeShellExecution": PRE,
               "beforeMCPExecution": PRE, "postToolUse": POST, "afterShellExecution": POST,
               "afterMCPExecution": POST, "afterFileEdit": POST, "beforeSubmitPrompt": PROMPT,
               "stop": STOP},
    "generic": {"session_start": START, "pre_tool": PRE, "post_tool": POST, "prompt": PROMPT,
                "stop": STOP},
}

# The environment variable each agent sets to its project's root, when it does.
_PROJECT_DIR = {"claude-code": "CLAUDE_PROJECT_DIR", "gemini": "GEMINI_PROJECT_DIR",
                "cursor": "CURSOR_PROJECT_DIR"}


class PayloadError(ValueError):
    """The payload on stdin is not one this agent sends."""


class Event:
    """One hook event. (A plain class: dataclasses would cost the hook's start-up.)"""

    def __init__(self, agent: str, name: str, kind: str, session_id: str, cwd: str,
                 project: str, transcript: str | None) -> None:
        self.agent = agent
        self.name = name               # the agent's own event name
        self.kind = kind               # START, PRE, POST, PROMPT, STOP or OTHER
        self.session_id = session_id   # the agent's session (conversation) id
        self.cwd = cwd
        self.project = project         # the folder the agent works in, as it says
        self.transcript = transcript
        self.tool = ""
        self.tool_input: dict = {}
        self.tool_response = None
        self.tool_use_id = ""
        self.prompt = ""
        self.messages: list = []       # generic: messages given inline
        self.last_message = ""         # Claude Code's Stop: its reply, not yet in the transcript


def parse(agent: str, text: str, environ: dict[str, str] | None = None) -> Event:
    environ = os.environ if environ is None else environ
    try:
        payload = json.loads(text)
    except ValueError as exc:
        raise PayloadError(f"the {agent} hook payload is not JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise PayloadError(f"the {agent} hook payload is not a JSON object")
    name = payload.get("hook_event_name") or payload.get("event") or ""
    if not isinstance(name, str) or not name:
        raise PayloadError(f"the {agent} hook payload names no event (hook_event_name)")
    kind = _KINDS[agent].get(name, OTHER)
    session_id = payload.get("session_id") or payload.get("conversation_id") or ""
    if not isinstance(session_id, str) or not session_id:
        raise PayloadError(f"the {agent} hook payload has no session_id")
    roots = payload.get("workspace_roots") or []
    cwd = payload.get("cwd") or (roots[0] if roots else "") or os.getcwd()
    project = environ.get(_PROJECT_DIR.get(agent, ""), "") or (roots[0] if roots else "") \
        or cwd
    event = Event(agent, name, kind, session_id, str(cwd), str(project),
                  payload.get("transcript_path") or None)
    if agent == "cursor":
        _cursor_tool(event, payload)
    elif agent == "generic":
        tool = payload.get("tool") or {}
        event.tool, event.tool_input = tool.get("name", ""), tool.get("input")
        event.tool_response, event.tool_use_id = tool.get("response"), tool.get("id", "")
        event.messages = payload.get("messages") or []
        event.prompt = payload.get("prompt", "")
    else:
        event.tool = payload.get("tool_name") or ""
        event.tool_input = payload.get("tool_input")
        event.tool_response = payload.get("tool_response")
        event.tool_use_id = payload.get("tool_use_id") or ""
        event.prompt = payload.get("prompt") or ""
        last = payload.get("last_assistant_message")  # verified for Claude Code only
        event.last_message = last if agent == "claude-code" and isinstance(last, str) else ""
    if event.kind in (PRE, POST) and not event.tool:
        raise PayloadError(f"the {agent} {name} payload names no tool")
    if not isinstance(event.tool_input, dict):
        event.tool_input = {} if event.tool_input is None else {"input": event.tool_input}
    return event


def _cursor_tool(event: Event, payload: dict) -> None:
    """Cursor's tool events each carry their own fields."""
    name = event.name
    if name in ("beforeShellExecution", "afterShellExecution"):
        event.tool = "Shell"
        event.tool_input = {"command": payload.get("command", "")}
        event.tool_response = {"output": payload.get("output")} if "output" in payload else None
    elif name in ("beforeMCPExecution", "afterMCPExecution"):
        event.tool = f"mcp__{payload.get('tool_name', '')}"
        raw = payload.get("tool_input")
        if isinstance(raw, str):
            try:
                raw = json.loads(raw)
            except ValueError:
                raw = {"input": raw}
        event.tool_input = raw
        event.tool_response = payload.get("result_json")
    elif name == "afterFileEdit":
        event.tool = "Edit"
        event.tool_input = {"file_path": payload.get("file_path"),
                            "edits": payload.get("edits", [])}
    else:
        event.tool = payload.get("tool_name") or ""
        event.tool_input = payload.get("tool_input")
        event.tool_response = payload.get("tool_output") or payload.get("tool_response")
        event.tool_use_id = payload.get("tool_use_id") or ""
    event.prompt = payload.get("prompt") or ""


# -- answers ---------------------------------------------------------------------------
PASS, ALLOW, ASK, DENY = "pass", "allow", "ask", "deny"


def answer(event: Event, decision: str = PASS, reason: str = "") -> dict:
    """The agent's answer. PASS leaves the call to the agent's own permission rules
    (worldline never grants what the agent would otherwise ask about); ALLOW is given
    only when an operator approved the call; ASK puts it to the person at the agent;
    DENY refuses it, with ``reason`` for the model."""
    agent = event.agent
    if agent in ("claude-code", "codex"):
        if event.kind != PRE or decision == PASS:
            return {}
        return {"hookSpecificOutput": {"hookEventName": "PreToolUse",
                                       "permissionDecision": decision,
                                       "permissionDecisionReason": reason}}
    if agent == "gemini":
        if event.kind == PRE and decision == DENY:
            return {"decision": "deny", "reason": reason}
        return {}
    if agent == "cursor":
        if event.kind == PRE:
            permission = ALLOW if decision == PASS else decision
            out = {"permission": permission}
            if reason:
                out.update(user_message=reason, agent_message=reason)
            return out
        if event.name == "beforeSubmitPrompt":
            return {"continue": True}
        return {}
    out = {"decision": ALLOW if decision == PASS else decision}
    if reason:
        out["reason"] = reason
    return out
