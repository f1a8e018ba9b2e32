"""Input validation at the edge of the domain: JSON payloads, texts and ids.

Everything a caller sends is checked here before anything changes, so bad input
gets INVALID_ARGUMENT (or RESOURCE_EXHAUSTED past a size limit) and leaves the
world as it was.
"""

from __future__ import annotations

import json
from typing import Any

from worldline.wire.errors import InvalidArgument, ResourceExhausted

from . import ids

MAX_STATE_BYTES = 16 << 20
MAX_MESSAGES_BYTES = 32 << 20
MAX_TEXT = 64 << 10  # labels, reasoning, names
MAX_RESUME_BYTES = 16 << 10
MAX_WARNINGS = 32  # a checkpoint's warnings (each a text, MAX_TEXT at most)
EMPTY_STATE = b"{}"


def load_json(text: str, what: str, kind: type, shape: str, limit: int | None = None) -> Any:
    """``text`` parsed as JSON: RESOURCE_EXHAUSTED past ``limit`` characters,
    INVALID_ARGUMENT when it does not parse or is not ``kind`` (described as ``shape``)."""
    if limit is not None and len(text) > limit:
        raise ResourceExhausted(f"{what}: {len(text)} bytes; the limit is {limit}")
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise InvalidArgument(f"{what}: not valid JSON: {exc}") from None
    if not isinstance(value, kind):
        raise InvalidArgument(f"{what} must be {shape}")
    return value


def parse_messages(text: str) -> list[str]:
    """Validate a JSON list of messages; return each message as canonical JSON text."""
    if not text:
        return []
    value = load_json(text, "messages", list, "a JSON list of message objects",
                      MAX_MESSAGES_BYTES)
    for i, msg in enumerate(value):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise InvalidArgument(f"message {i} must be an object with a string \"role\"")
    return [json.dumps(m, ensure_ascii=False, separators=(",", ":")) for m in value]


def parse_state(text: str) -> bytes | None:
    if not text:
        return None
    value = load_json(text, "state", dict, "one JSON object", MAX_STATE_BYTES)
    return json.dumps(value, ensure_ascii=False, sort_keys=True,
                      separators=(",", ":")).encode("utf-8")


def parse_resume(text: str) -> str | None:
    """A checkpoint's resume point: one JSON object (where the agent's own conversation
    stands), kept as canonical JSON; None when not given (the parent's is kept)."""
    if not text:
        return None
    value = load_json(text, "resume point", dict, "one JSON object", MAX_RESUME_BYTES)
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def check_text(what: str, value: str) -> str:
    if len(value) > MAX_TEXT:
        raise InvalidArgument(f"{what} is {len(value)} characters; the limit is {MAX_TEXT}")
    return value


def check_warnings(values) -> tuple[str, ...]:
    """A checkpoint's warnings as the caller gives them: each a non-empty text."""
    values = tuple(values)
    if len(values) > MAX_WARNINGS:
        raise InvalidArgument(f"{len(values)} warnings; a checkpoint holds {MAX_WARNINGS}"
                              " at most")
    for value in values:
        if not value.strip():
            raise InvalidArgument("a checkpoint's warning is empty")
        check_text("a warning", value)
    return values


def check_id(what: str, value: str) -> str:
    if not ids.is_id(value):
        raise InvalidArgument(f"{value!r} is not a valid {what} id")
    return value


def parse_args_json(text: str, what: str = "args") -> dict:
    """A tool call's arguments: a JSON object, or none (an empty text)."""
    return load_json(text, what, dict, "a JSON object") if text else {}
