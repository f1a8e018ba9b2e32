"""The Anthropic Messages API, scripted: what Claude Code calls, answered from the script.

A turn is one assistant message: ``{"text": "..."}``, ``{"tool_use": {"name": "Write",
"input": {...}}}`` (with an optional ``"id"``), or both (``text`` first), or
``{"tool_uses": [{...}, ...]}`` for several calls in one message. The script's turns
answer the *conversation's* requests (those that offer the model tools); Claude Code's
side requests (a quota probe with ``max_tokens`` 1, a title or a summary asked of the
small model without tools) get a short canned text and take no turn. Past the script's
end the conversation's requests get ``{"text": "done"}``.

A value of a tool call's input may be ``{"$result": [TOOL_USE_ID, KEY, ...]}``: the
value at KEY... of the JSON that an earlier call (given that ``"id"`` in the script)
returned, read from the tool results the request carries (a checkpoint's id, say,
that a later restore names).

Served: ``POST /v1/messages`` (JSON, or SSE with ``"stream": true``: message_start,
content_block_start / delta / stop for each block, message_delta with the stop reason,
message_stop), ``POST /v1/messages/count_tokens``, ``GET /v1/models`` and
``GET /v1/models/ID``.
"""

from __future__ import annotations

import itertools
import json

from . import ScriptedHandler

MODEL = "claude-sonnet-4-5"
_ids = itertools.count(1)


def is_conversation(body: dict) -> bool:
    """A request of the conversation (which takes a turn of the script), not a side
    request: it offers tools and wants more than a token."""
    return bool(body.get("tools")) and (body.get("max_tokens") or 0) > 1


def tool_results(body: dict) -> dict[str, str]:
    """The text of each tool result in the request's messages, by tool-use id."""
    out = {}
    for message in body.get("messages") or []:
        content = message.get("content")
        for block in content if isinstance(content, list) else []:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                value = block.get("content")
                if isinstance(value, list):
                    value = "".join(b.get("text", "") for b in value if isinstance(b, dict))
                out[block.get("tool_use_id", "")] = value if isinstance(value, str) else ""
    return out


def _filled(value, results: dict[str, str]):
    if isinstance(value, dict) and set(value) == {"$result"}:
        use_id, *keys = value["$result"]
        found = json.loads(results[use_id])
        for key in keys:
            found = found[key]
        return found
    if isinstance(value, dict):
        return {k: _filled(v, results) for k, v in value.items()}
    if isinstance(value, list):
        return [_filled(v, results) for v in value]
    return value


def blocks(turn: dict, body: dict | None = None) -> list[dict]:
    """The content blocks of one scripted turn (``body``: the request it answers)."""
    out = []
    if turn.get("text"):
        out.append({"type": "text", "text": turn["text"]})
    uses = list(turn.get("tool_uses") or []) + ([turn["tool_use"]] if turn.get("tool_use")
                                                else [])
    for use in uses:
        out.append({"type": "tool_use", "id": use.get("id") or f"toolu_{next(_ids):04d}",
                    "name": use["name"],
                    "input": _filled(use.get("input") or {}, tool_results(body or {}))})
    return out or [{"type": "text", "text": ""}]


class Handler(ScriptedHandler):
    def handle_request(self) -> None:
        path = self.path.split("?", 1)[0]
        body = self.body_json if isinstance(self.body_json, dict) else {}
        if self.command == "GET" and path.startswith("/v1/models"):
            model = {"type": "model", "id": MODEL, "display_name": "Scripted",
                     "created_at": "2025-01-01T00:00:00Z"}
            if path == "/v1/models":
                self.send_json({"data": [model], "has_more": False, "first_id": MODEL,
                                "last_id": MODEL})
            else:
                self.send_json({**model, "id": path.rsplit("/", 1)[1]})
        elif path == "/v1/messages/count_tokens":
            self.send_json({"input_tokens": 100})
        elif path == "/v1/messages":
            if is_conversation(body):
                turn = self.next_turn()
                content = blocks(turn if turn is not None else {"text": "done"}, body)
            else:
                content = [{"type": "text", "text": "ok"}]
            self.answer(body, content)
        else:
            self.send_json({"type": "error", "error": {
                "type": "not_found_error", "message": f"not scripted: {path}"}}, status=404)

    def answer(self, body: dict, content: list[dict]) -> None:
        stop = "tool_use" if any(b["type"] == "tool_use" for b in content) else "end_turn"
        usage = {"input_tokens": 100, "output_tokens": 10, "cache_creation_input_tokens": 0,
                 "cache_read_input_tokens": 0}
        message = {"id": f"msg_{next(_ids):04d}", "type": "message", "role": "assistant",
                   "model": body.get("model") or MODEL, "content": content,
                   "stop_reason": stop, "stop_sequence": None, "usage": usage}
        if not body.get("stream"):
            self.send_json(message)
            return
        events = [("message_start", {"type": "message_start", "message": {
            **message, "content": [], "stop_reason": None,
            "usage": {**usage, "output_tokens": 1}}})]
        for index, block in enumerate(content):
            if block["type"] == "text":
                start = {"type": "text", "text": ""}
                delta = {"type": "text_delta", "text": block["text"]}
            else:
                start = {**block, "input": {}}
                delta = {"type": "input_json_delta",
                         "partial_json": json.dumps(block["input"])}
            events += [
                ("content_block_start", {"type": "content_block_start", "index": index,
                                         "content_block": start}),
                ("content_block_delta", {"type": "content_block_delta", "index": index,
                                         "delta": delta}),
                ("content_block_stop", {"type": "content_block_stop", "index": index})]
        events += [("message_delta", {"type": "message_delta",
                                      "delta": {"stop_reason": stop, "stop_sequence": None},
                                      "usage": {"output_tokens": 10}}),
                   ("message_stop", {"type": "message_stop"})]
        self.send_sse(events)
