"""Reading an agent's own transcript: the entries appended since the last checkpoint.

The hook reads the transcript itself, with the permissions of the agent's user; the
daemon (root) never opens a file a hook names. Claude Code, Codex and Cursor append
one JSON object a line. Gemini CLI writes its session two ways, both read here:

- 0.39.0 and later (``session-*.jsonl``, chatRecordingService.ts): a header line
  (``sessionId``, ``projectHash``, ``startTime``, ``lastUpdated``, ``kind``), then
  message lines (``id``, ``timestamp``, ``type``: user | gemini | info | error | warning,
  ``content``, ``toolCalls``, ``tokens``, ...), a message that changes written again
  whole under the same ``id``; ``{"$set": {...}}`` lines update the header, and one
  whose ``$set`` holds ``messages`` replaces the whole list; ``{"$rewindTo": ID}``
  drops that message and every later one. Read as Gemini CLI reads it (its
  loadConversationRecord): each message once, as last written, where it first came.
- up to 0.38: one JSON document, rewritten whole, whose ``messages`` grow.

Gemini CLI changes only its last message after writing it (the model's turn gains its
tool calls, their results and its token counts once the calls ran), so until the turn
is over (``final``) the last message, when it is the model's, waits for the next
checkpoint: each message is recorded once, as it ended up.

A ``Cursor`` is where the last read stopped: a byte offset in a JSONL file (only whole
lines are read: a line still being written waits for the next hook), the number of
entries read, and the last entry's id. What could not be read is said in ``warnings``
(the checkpoint carries them): never an empty conversation recorded as if whole.
"""

from __future__ import annotations

import os

from .. import _json as json

MAX_ENTRY = 1 << 20  # an entry larger than this is recorded by its id and size only


class Cursor:
    FIELDS = ("path", "offset", "entries", "entry", "resume_entry", "at")

    def __init__(self, path: str = "", offset: int = 0, entries: int = 0, entry: str = "",
                 resume_entry: str = "", at: str = "") -> None:
        self.path = path
        self.offset = offset        # bytes consumed (JSONL)
        self.entries = entries      # entries consumed
        self.entry = entry          # id of the last entry consumed
        self.resume_entry = resume_entry  # the last entry a conversation can resume at
        self.at = at                # Gemini CLI: the last entry's timestamp

    @classmethod
    def from_dict(cls, d: dict) -> Cursor:
        return cls(**{k: v for k, v in d.items() if k in cls.FIELDS})

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.FIELDS}

    def as_dict(self) -> dict:
        return {"transcript": self.path, "offset": self.offset, "entries": self.entries,
                "entry": self.entry, "resume_entry": self.resume_entry}


def read_new(agent: str, path: str, cursor: Cursor, skip_through: str = "", *,
             final: bool = True, missing_ok: bool = False
             ) -> tuple[list[dict], Cursor, list[str]]:
    """The messages appended to ``path`` since ``cursor``, the cursor after them, and
    warnings (what could not be read, in words).
    ``skip_through``: on a transcript read for the first time, entries up to and
    including this id are already recorded (a conversation resumed from an earlier
    one copies its history) and are skipped. ``final``: the agent's turn is over (no
    message of it changes any more). ``missing_ok``: a transcript not made yet is no
    loss (Gemini CLI up to 0.38 makes it at its first message, after BeforeAgent)."""
    if cursor.path != path:
        cursor = Cursor(path)
    else:
        skip_through = ""
    warnings: list[str] = []
    if missing_ok and not os.path.exists(path):
        return [], cursor, warnings
    if agent == "gemini":
        entries, after = _gemini(path, cursor, final, warnings)
    else:
        entries, after = _jsonl(path, cursor, warnings)
    if skip_through and any(_entry_id(e) == skip_through for e in entries):
        while entries and _entry_id(entries[0]) != skip_through:
            entries.pop(0)
        entries.pop(0)
    messages = []
    for entry in entries:
        messages.append(_message(agent, entry))
        after.entry = _entry_id(entry) or after.entry
        if agent == "gemini" and isinstance(entry.get("timestamp"), str):
            after.at = entry["timestamp"]
        if _resumable(agent, entry):
            after.resume_entry = _entry_id(entry)
    return messages, after, warnings


def _read(path: str, offset: int, warnings: list[str]) -> tuple[bytes, int] | None:
    """The file's bytes from ``offset`` and that offset (0 when the file is shorter:
    rewritten from the start), or None with a warning."""
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size < offset:
                offset = 0
            f.seek(offset)
            return f.read(), offset
    except OSError as exc:
        warnings.append(f"the agent's transcript {path} could not be read"
                        f" ({exc.strerror or exc}): this checkpoint lacks the conversation"
                        f" since the last one; the next checkpoint reads it again")
        return None


def _lines(data: bytes, path: str, warnings: list[str]) -> tuple[list, int]:
    """The JSON values of the whole lines of ``data`` (a line still being written waits)
    and the bytes they took; a line that is not JSON is said in a warning."""
    end = data.rfind(b"\n") + 1
    values, bad = [], 0
    for line in data[:end].splitlines():
        if not line.strip():
            continue
        try:
            values.append(json.loads(line))
        except ValueError:
            bad += 1
            values.append({"unparsed": line[:MAX_ENTRY].decode("utf-8", "replace")})
    if bad:
        warnings.append(f"{bad} line(s) of the agent's transcript {path} are not JSON:"
                        f" recorded as they are, unparsed")
    return values, end


def _jsonl(path: str, cursor: Cursor, warnings: list[str]) -> tuple[list[dict], Cursor]:
    read = _read(path, cursor.offset, warnings)
    if read is None:
        return [], cursor
    data, offset = read
    if offset != cursor.offset:  # rewritten from the start: read it again
        cursor = Cursor(path)
    values, end = _lines(data, path, warnings)
    entries = [v if isinstance(v, dict) else {"value": v} for v in values]
    return entries, Cursor(path, cursor.offset + end, cursor.entries + len(entries),
                           cursor.entry, cursor.resume_entry)


def _gemini(path: str, cursor: Cursor, final: bool, warnings: list[str]) -> tuple[
        list[dict], Cursor]:
    """Gemini CLI's session, either format: the messages after the last one recorded.
    JSONL is read from just after the line that last wrote that message (Gemini CLI
    changes only its last message: nothing before it changes), unless a rewind or a
    list replaced since makes it read the file whole; one JSON document is read whole."""
    if cursor.offset and cursor.entry:
        read = _read(path, cursor.offset, warnings)
        if read is None:
            return [], cursor
        if read[1] == cursor.offset:
            tail = _gemini_jsonl(read[0], read[1], path, warnings, only_appended=True)
            if tail is not None:
                messages, ends = tail
                messages = [m for m in messages if _entry_id(m) != cursor.entry]
                return _gemini_taken(messages, 0, ends, cursor, final, path)
    read = _read(path, 0, warnings)
    if read is None:
        return [], cursor
    parsed = _gemini_messages(read[0], path, warnings)
    if parsed is None:
        return [], cursor
    messages, ends = parsed
    ids = [_entry_id(m) for m in messages]
    start = min(cursor.entries, len(messages))
    if cursor.entry:
        if cursor.entry in ids:
            start = ids.index(cursor.entry) + 1
        else:  # the messages written after the last one recorded are the new ones
            start = next((i for i, m in enumerate(messages)
                          if str(m.get("timestamp", "")) > cursor.at), len(messages)) \
                if cursor.at else start
            warnings.append(f"Gemini CLI rewrote its conversation in {path} since the last"
                            f" checkpoint (/rewind, or its history compressed): message"
                            f" {cursor.entry}, recorded before, is no longer in it; the"
                            f" messages written since are recorded after it")
    before = messages[start - 1] if start else {}  # the last one recorded so far
    return _gemini_taken(messages, start, ends, Cursor(
        path, ends.get(_entry_id(before), 0), start, _entry_id(before), cursor.resume_entry,
        str(before.get("timestamp", "")) or cursor.at), final, path)


def _gemini_taken(messages: list[dict], start: int, ends: dict[str, int], cursor: Cursor,
                  final: bool, path: str) -> tuple[list[dict], Cursor]:
    """``messages[start:]`` but the model's turn still being written, and the cursor
    after them (``cursor.entries``: those recorded before ``messages[start]``)."""
    end = len(messages)
    if not final and end > start and messages[-1].get("type") == "gemini":
        end -= 1  # the model's turn, still being written: recorded once it is whole
    new = messages[start:end]
    if not new:
        return [], cursor
    anchor = new[-1]  # the last message recorded, from now on
    return new, Cursor(path, ends.get(_entry_id(anchor), 0), cursor.entries + len(new),
                       _entry_id(anchor), cursor.resume_entry,
                       str(anchor.get("timestamp", "")))


def _gemini_messages(data: bytes, path: str, warnings: list[str]) -> tuple[
        list[dict], dict[str, int]] | None:
    """The conversation as Gemini CLI would load it, and where each message's last
    write ends (JSONL); None (with a warning) when the file is neither of its formats."""
    if not data.strip():
        return [], {}  # made, nothing written yet
    try:
        doc = json.loads(data)
    except ValueError:
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("messages"), list):  # up to 0.38
        return _fold(doc["messages"]), {}
    found = _gemini_jsonl(data, 0, path, warnings)
    if found is None:
        what = "one JSON document nor JSON lines" if doc is None else "a session"
        warnings.append(f"the agent's transcript {path} is neither {what} of Gemini CLI:"
                        f" this checkpoint lacks the conversation")
    return found


def _gemini_jsonl(data: bytes, base: int, path: str, warnings: list[str],
                  only_appended: bool = False) -> tuple[list[dict], dict[str, int]] | None:
    """The whole lines of ``data`` (the file's from byte ``base``) folded: each message
    once, as last written, where it first came, and the file offset where its last
    write ends. None when no line is JSON, or (``only_appended``) when a line rewinds
    or replaces the list (what came before ``base`` changed)."""
    order: dict[str, dict] = {}
    ends: dict[str, int] = {}
    at, bad, good = base, 0, 0
    for line in data[:data.rfind(b"\n") + 1].splitlines(keepends=True):
        at += len(line)
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            bad += 1
            continue
        if not isinstance(record, dict):
            bad += 1
            continue
        good += 1
        rewind, update = record.get("$rewindTo"), record.get("$set")
        replaced = isinstance(update, dict) and isinstance(update.get("messages"), list)
        if only_appended and (isinstance(rewind, str) or replaced):
            return None
        if isinstance(rewind, str):  # that message and every later one go
            keys = list(order)
            order = {k: order[k] for k in keys[:keys.index(rewind)]} if rewind in order \
                else {}
        elif isinstance(record.get("id"), str):
            order[record["id"]] = record
            ends[record["id"]] = at
        elif replaced:
            order = _by_id(update["messages"])
            ends = dict.fromkeys(order, at)
    if not good and not only_appended:
        return None
    if bad:
        warnings.append(f"{bad} line(s) of the agent's transcript {path} are not JSON:"
                        f" skipped, as Gemini CLI skips them")
    return list(order.values()), ends


def _fold(messages: list) -> list[dict]:
    """Each message once, as last written, where it first came."""
    return list(_by_id(messages).values())


def _by_id(messages: list) -> dict[str, dict]:
    order: dict[str, dict] = {}
    for i, m in enumerate(messages):
        m = m if isinstance(m, dict) else {"value": m}
        order[m["id"] if isinstance(m.get("id"), str) else f"#{i}"] = m
    return order


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
