"""The OpenAI Responses API, as Codex uses it: ``POST /v1/responses`` with
``stream: true``, answered with server-sent events.

A turn (one model response) is a dict with any of:

- ``"text"``: the assistant's message;
- ``"calls"``: a list of function calls ``{"name", "arguments"}`` (``arguments`` an
  object, sent as its JSON text) or the shorthands ``{"shell": COMMAND}`` (Codex's
  ``exec_command`` tool) and ``{"patch": PATCH}`` (an ``apply_patch`` envelope that
  the model sends through the shell tool, as models do).

Each call gets the id ``call_<server>_<turn>_<n>`` (``<server>`` this server's process
id: a conversation resumed by a later run keeps its ids apart, as the real API does).
Past the script's end the model answers "done". ``GET .../models`` answers an empty
list. Codex 0.171.0 sends, for a model it has no metadata of, the tools
``exec_command`` (``{"cmd": ...}``), ``write_stdin``, ``view_image``, goals and
sub-agents, and no ``apply_patch`` tool: its model applies patches through the shell.
"""

from __future__ import annotations

import json
import os

from . import ScriptedHandler

SHELL_TOOL = "exec_command"


def call_item(turn: int, n: int, call: dict) -> dict:
    if "shell" in call:
        name, arguments = SHELL_TOOL, {"cmd": call["shell"]}
    elif "patch" in call:
        name, arguments = SHELL_TOOL, {"cmd": "apply_patch <<'EOF'\n" + call["patch"]
                                       + "\nEOF\n"}
    else:
        name, arguments = call["name"], call["arguments"]
    tag = f"{os.getpid()}_{turn}_{n}"
    return {"type": "function_call", "id": f"fc_{tag}", "status": "completed",
            "call_id": f"call_{tag}", "name": name, "arguments": json.dumps(arguments)}


def response_events(turn_no: int, turn: dict) -> list[tuple[str, dict]]:
    rid = f"resp_{turn_no}"
    items = []
    if turn.get("text"):
        items.append({"type": "message", "id": f"msg_{turn_no}", "status": "completed",
                      "role": "assistant",
                      "content": [{"type": "output_text", "text": turn["text"],
                                   "annotations": []}]})
    items += [call_item(turn_no, n, call) for n, call in enumerate(turn.get("calls", []))]
    base = {"id": rid, "object": "response", "created_at": 0, "model": "scripted",
            "status": "in_progress", "output": []}
    events = [("response.created", {"type": "response.created", "response": base})]
    for i, item in enumerate(items):
        events.append(("response.output_item.added", {
            "type": "response.output_item.added", "output_index": i, "item": item}))
        events.append(("response.output_item.done", {
            "type": "response.output_item.done", "output_index": i, "item": item}))
    usage = {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0},
             "output_tokens": 5, "output_tokens_details": {"reasoning_tokens": 0},
             "total_tokens": 15}
    events.append(("response.completed", {
        "type": "response.completed",
        "response": {**base, "status": "completed", "output": items, "usage": usage}}))
    return events


class Handler(ScriptedHandler):
    def handle_request(self) -> None:
        path = self.path.split("?")[0]
        if self.command == "GET" and path.endswith("/models"):
            self.send_json({"object": "list", "data": [], "models": []})
            return
        if self.command == "POST" and path.endswith("/responses"):
            turn = self.next_turn()
            with self.server.lock:
                number = self.server.turn
            self.send_sse(response_events(number, turn if turn is not None
                                          else {"text": "done"}))
            return
        self.send_json({"error": {"message": f"not scripted: {self.command} {path}"}},
                       status=404)
