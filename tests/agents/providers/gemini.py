"""The Gemini API as Gemini CLI calls it, scripted.

Gemini CLI 0.61.0 takes its endpoint from ``GOOGLE_GEMINI_BASE_URL`` (which also makes
its auth type "gateway"; the key is ``GEMINI_API_KEY``) and speaks the Gemini API's
REST form, ``/v1beta/models/MODEL:ACTION``:

- ``:streamGenerateContent?alt=sse``: the conversation's turns. Each takes the script's
  next turn and answers it as server-sent events, one ``GenerateContentResponse`` a
  ``data:`` line: ``candidates[0].content.parts`` (text, then each function call),
  the last chunk with ``finishReason`` and ``usageMetadata``.
- ``:generateContent``: the same, unstreamed. Gemini CLI also asks it questions of its
  own (is the model's turn over, a summary of the session): a request that asks for
  JSON (``generationConfig.responseMimeType``) is one of those, answered without
  taking a turn, so a script holds only the conversation.
- ``:countTokens``: a count from the request's size.

A turn: ``{"text": "..."}``, ``{"calls": [{"name": TOOL, "args": {...}}]}``, or both
(text first). Past the script's end every turn is ``{"text": "(the script is over)"}``.
"""

from __future__ import annotations

import json

from . import ScriptedHandler

OVER = {"text": "(the script is over)"}
# Gemini CLI's own questions, by what their JSON schema asks for.
_ANSWERS = {
    "next_speaker": {"reasoning": "the scripted turn is complete", "next_speaker": "user"},
    "model_choice": {"reasoning": "scripted", "model_choice": "flash"},
}


def _usage(prompt: int, output: int) -> dict:
    return {"promptTokenCount": prompt, "candidatesTokenCount": output,
            "totalTokenCount": prompt + output}


def parts(turn: dict) -> list[dict]:
    """The model's parts for one scripted turn."""
    out = []
    if turn.get("text"):
        out.append({"text": turn["text"]})
    for call in turn.get("calls", []):
        out.append({"functionCall": {"name": call["name"], "args": call.get("args", {})}})
    return out or [{"text": ""}]


def response(content_parts: list[dict], finish: bool, prompt_tokens: int = 10) -> dict:
    candidate: dict = {"content": {"role": "model", "parts": content_parts}, "index": 0}
    chunk: dict = {"candidates": [candidate], "modelVersion": "scripted"}
    if finish:
        candidate["finishReason"] = "STOP"
        chunk["usageMetadata"] = _usage(prompt_tokens, 5)
    return chunk


class Handler(ScriptedHandler):
    def handle_request(self) -> None:
        path = self.path.split("?", 1)[0]
        action = path.rsplit(":", 1)[-1] if ":" in path else ""
        body = self.body_json if isinstance(self.body_json, dict) else {}
        if self.command != "POST" or not action:
            self.send_json({"error": {"code": 404, "message": f"not scripted: {self.path}",
                                      "status": "NOT_FOUND"}}, status=404)
            return
        if action == "countTokens":
            self.send_json({"totalTokens": max(1, len(json.dumps(body)) // 4)})
            return
        if action == "generateContent" and _asks_json(body):
            self.send_json(response([{"text": json.dumps(_own_answer(body))}], True))
            return
        if action not in ("generateContent", "streamGenerateContent"):
            self.send_json({"error": {"code": 404, "message": f"not scripted: {action}",
                                      "status": "NOT_FOUND"}}, status=404)
            return
        turn = self.next_turn() or OVER
        content = parts(turn)
        if action == "generateContent":
            self.send_json(response(content, True))
            return
        # streamed: the text in two chunks (as a model streams it), then the calls and
        # the finish reason
        chunks = []
        text = [p for p in content if "text" in p]
        calls = [p for p in content if "functionCall" in p]
        if text and text[0]["text"]:
            words = text[0]["text"]
            half = len(words) // 2
            chunks.append(response([{"text": words[:half]}], False))
            chunks.append(response([{"text": words[half:]}], not calls))
        if calls or not chunks:
            chunks.append(response(calls or [{"text": ""}], True))
        self.send_sse([(None, c) for c in chunks])


def _asks_json(body: dict) -> bool:
    config = body.get("generationConfig") or {}
    return config.get("responseMimeType") == "application/json"


def _own_answer(body: dict) -> dict:
    config = body.get("generationConfig") or {}
    schema = json.dumps(config.get("responseJsonSchema") or config.get("responseSchema")
                        or {})
    for key, answer in _ANSWERS.items():
        if key in schema:
            return answer
    return {}
