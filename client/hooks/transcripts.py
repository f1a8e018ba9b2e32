"""Reading an agent's own transcript: the entries appended since the last checkpoint.

The hook reads the transcript itself, with the permissions of the agent's user; the
daemon (root) never opens a file a hook names. Claude Code, Codex and Cursor append
one JSON object a line; Gemini CLI rewrites one JSON document whose ``messages``
grow. A ``Cursor`` is where the last read stopped: a byte offset in a JSONL file (only
whole lines are read: a line still being written waits for the next hook), the number
of entries read, and the last entry's id.
"""

from __future__ import annotations

import os

from .. import _json as json

MAX_ENTRY = 1 << 20  # an entry larger than this is recorded by its id and size only


class Unreadable(Exception):
    """The transcript is there but cannot be read: the checkpoint records none of its
    messages and says why, rather than an empty conversation as if it were whole."""


class Cursor:
    FIELDS = ("path", "offset", "entries", "entry", "resume_entry")

    def __init__(self, path: str = "", offset: int = 0, entries: int = 0, entry: str = "",
                 resume_entry: str = "") -> None:
        self.path = path
        self.offset = offset        # bytes consumed (JSONL)
        self.entries = entries      # entries consumed
        self.entry = entry          # id of the last entry consumed
        self.resume_entry = resume_entry  # the last entry a conversation can resume at

    @classmethod
    def from_dict(cls, d: dict) -> Cursor:
        return cls(**{k: v for k, v in d.items() if k in cls.FIELDS})

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.FIELDS}

    def as_dict(self) -> dict:
        return {"transcript": self.path, "offset": self.offset, "entries": self.entries,
                "entry": self.entry, "resume_entry": self.resume_entry}


def read_new(agent: str, path: str, cursor: Cursor, skip_through: str = "") -> tuple[
        list[dict], Cursor]:
    """The messages appended to ``path`` since ``cursor`` and the cursor after them.
    ``skip_through``: on a transcript read for the first time, entries up to and
    including this id are already recorded (a conversation resumed from an earlier
    one copies its history) and are skipped."""
    if cursor.path != path:
        cursor = Cursor(path)
    else:
        skip_through = ""
    if agent == "gemini":
        entries, after = _json_document(path, cursor)
    else:
        entries, after = _jsonl(path, cursor)
    if skip_through and any(_entry_id(e) == skip_through for e in entries):
        while entries and _entry_id(entries[0]) != skip_through:
            entries.pop(0)
        entries.pop(0)
    messages = []
    for entry in entries:
        messages.append(_message(agent, entry))
        after.entry = _entry_id(entry) or after.entry
        if _resumable(agent, entry):
            after.resume_entry = _entry_id(entry)
    return messages, after


def _jsonl(path: str, cursor: Cursor) -> tuple[list[dict], Cursor]:
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < cursor.offset:  # rewritten from the start: read it again
                cursor = Cursor(path)
            f.seek(cursor.offset)
            data = f.read()
    except FileNotFoundError:  # not written yet (Claude Code: not before the first reply)
        return [], cursor
    except OSError as exc:
        raise Unreadable(f"cannot read the transcript {path}: {exc.strerror}") from None
    end = data.rfind(b"\n") + 1
    entries = []
    for line in data[:end].splitlines():
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError:
            value = {"unparsed": line[:MAX_ENTRY].decode("utf-8", "replace")}
        entries.append(value if isinstance(value, dict) else {"value": value})
    return entries, Cursor(path, cursor.offset + end, cursor.entries + len(entries),
                           cursor.entry, cursor.resume_entry)


def _json_document(path: str, cursor: Cursor) -> tuple[list[dict], Cursor]:
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read())
    except (OSError, ValueError):
        return [], cursor  # missing, or caught mid-rewrite: the next hook reads it
    messages = doc.get("messages") if isinstance(doc, dict) else doc
    if not isinstance(messages, list):
        return [], cursor
    start = cursor.entries if cursor.entries <= len(messages) else 0
    new = [m if isinstance(m, dict) else {"value": m} for m in messages[start:]]
    return new, Cursor(path, 0, start + len(new), cursor.entry, cursor.resume_entry)


def _entry_id(entry: dict) -> str:
    for key in ("uuid", "id"):
        value = entry.get(key)
        if isinstance(value, str) and value:
            return value
    return ""


def _resumable(agent: str, entry: dict) -> bool:
    """Claude Code resumes a conversation at an assistant message's uuid
    (``--resume-session-at``)."""
    return entry.get("type") == "assistant" if agent == "claude-code" else bool(
        _entry_id(entry))


def _role(agent: str, entry: dict) -> str:
    message = entry.get("message")
    if isinstance(message, dict) and isinstance(message.get("role"), str):
        return message["role"]  # Claude Code
    payload = entry.get("payload")
    if isinstance(payload, dict):  # Codex: {"type": "response_item", "payload": {...}}
        return payload.get("role") or payload.get("type") or entry.get("type") or "event"
    if agent == "gemini":
        kind = entry.get("type", "")
        return {"gemini": "assistant", "model": "assistant"}.get(kind, kind or "event")
    role = entry.get("role") or entry.get("type")
    return role if isinstance(role, str) and role else "event"


def _message(agent: str, entry: dict) -> dict:
    """The entry as a message of the checkpoint: the entry itself, with a ``role``."""
    text = json.dumps(entry)
    if len(text) > MAX_ENTRY:
        return {"role": _role(agent, entry), "id": _entry_id(entry),
                "truncated": True, "bytes": len(text)}
    return {"role": _role(agent, entry), **{k: v for k, v in entry.items() if k != "role"}}


def last_reply(messages: list[dict], text: str) -> dict | None:
    """A stand-in for the reply an agent announced (Claude Code's Stop payload has
    ``last_assistant_message``) but has not written to its transcript yet; None when the
    messages already end with it."""
    for m in reversed(messages):
        if m.get("role") == "assistant":
            if reply_text(m) == text:
                return None
            break
    return {"role": "assistant", "type": "last_assistant_message", "content": text}


def reply_text(entry: dict) -> str:
    """The text of an assistant entry (Claude Code: ``message.content``'s text blocks)."""
    message = entry.get("message")
    content = message.get("content") if isinstance(message, dict) else entry.get("content")
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content or [] if isinstance(b, dict)
                   and b.get("type") == "text")


def tool_uses(messages: list[dict]) -> list[str]:
    """The tool-use ids of the calls that Claude Code entries ask for."""
    out = []
    for m in messages:
        message = m.get("message")
        content = message.get("content") if isinstance(message, dict) else None
        for block in content if isinstance(content, list) else ():
            if isinstance(block, dict) and block.get("type") == "tool_use":
                out.append(block.get("id", ""))
    return out
