"""Input validation at the edge of the domain: JSON payloads, texts and ids.

Everything a caller sends is checked here before anything changes, so bad input
gets INVALID_ARGUMENT (or RESOURCE_EXHAUSTED past a size limit) and leaves the
world as it was.
"""

from __future__ import annotations

import json

from worldline.client.errors import InvalidArgument, ResourceExhausted

from . import ids

MAX_STATE_BYTES = 16 << 20
MAX_MESSAGES_BYTES = 32 << 20
MAX_TEXT = 64 << 10  # labels, reasoning, names
EMPTY_STATE = b"{}"


def parse_messages(text: str) -> list[str]:
    """Validate a JSON list of messages; return each message as canonical JSON text."""
    if not text:
        return []
    if len(text) > MAX_MESSAGES_BYTES:
        raise ResourceExhausted(
            f"messages are {len(text)} bytes; the limit is {MAX_MESSAGES_BYTES}")
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise InvalidArgument(f"messages are not valid JSON: {exc}") from None
    if not isinstance(value, list):
        raise InvalidArgument("messages must be a JSON list of message objects")
    for i, msg in enumerate(value):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise InvalidArgument(f"message {i} must be an object with a string \"role\"")
    return [json.dumps(m, ensure_ascii=False, separators=(",", ":")) for m in value]


def parse_state(text: str) -> bytes | None:
    if not text:
        return None
    if len(text) > MAX_STATE_BYTES:
        raise ResourceExhausted(f"state is {len(text)} bytes; the limit is {MAX_STATE_BYTES}")
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise InvalidArgument(f"state is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidArgument("state must be one JSON object")
    return json.dumps(value, ensure_ascii=False, sort_keys=True,
                      separators=(",", ":")).encode("utf-8")


def check_text(what: str, value: str) -> str:
    if len(value) > MAX_TEXT:
        raise InvalidArgument(f"{what} is {len(value)} characters; the limit is {MAX_TEXT}")
    return value


def check_id(what: str, value: str) -> str:
    if not ids.is_id(value):
        raise InvalidArgument(f"{value!r} is not a valid {what} id")
    return value
