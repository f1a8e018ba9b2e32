"""What a hook remembers between calls of one agent session, on the agent's side.

One small JSON file per agent session under ``$WORLDLINE_HOOK_STATE`` (default
``$XDG_STATE_HOME/worldline/hooks``, else ``~/.local/state/worldline/hooks``): the
worldline session it is bound to, the transcript cursor, and the approvals requested
before tool calls that have not run yet. It is only a cache and a cursor: the daemon
holds the history. The file is locked (``flock``) while a hook uses it, so the hooks
of parallel tool calls take turns, and it is replaced by rename, so a killed hook
leaves the old or the new file, never half of one.
"""

from __future__ import annotations

import fcntl
import os
import zlib

from .. import _json as json


def state_dir() -> str:
    explicit = os.environ.get("WORLDLINE_HOOK_STATE")
    if explicit:
        return explicit
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"),
                                                            ".local", "state")
    return os.path.join(base, "worldline", "hooks")


def _name(agent: str, session_id: str) -> str:
    """A file name for the session: its id, kept to safe characters, and a checksum of
    the id as given (hashlib would cost every hook process milliseconds to import)."""
    safe = "".join(c if c.isascii() and (c.isalnum() or c in "_.-") else "_"
                   for c in session_id)[:96]
    return f"{agent}-{safe}-{zlib.crc32(session_id.encode()):08x}.json"


class held:
    """The state of one agent session, locked, as a dict; written back when the block
    ends without an exception. (A class: contextlib would cost start-up time.)"""

    def __init__(self, agent: str, session_id: str) -> None:
        folder = state_dir()
        os.makedirs(folder, mode=0o700, exist_ok=True)
        self.path = os.path.join(folder, _name(agent, session_id))

    def __enter__(self) -> dict:
        self.lock = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self.lock, fcntl.LOCK_EX)
        try:
            with open(self.path, encoding="utf-8") as f:
                state = json.loads(f.read())
        except (OSError, ValueError):
            state = {}
        self.state = state if isinstance(state, dict) else {}
        self.before = json.dumps(self.state, sort_keys=True)
        return self.state

    def __exit__(self, kind, exc, tb) -> None:
        try:
            if kind is None and json.dumps(self.state, sort_keys=True) != self.before:
                tmp = f"{self.path}.{os.getpid()}.tmp"
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
                with open(fd, "w", encoding="utf-8") as f:
                    f.write(json.dumps(self.state))
                os.replace(tmp, self.path)
        finally:
            os.close(self.lock)


def pending_key(tool: str, tool_input: dict, tool_use_id: str) -> str:
    """How a tool call is known between its pre and post hooks: the agent's id for it,
    or (Gemini gives none) its name and input."""
    if tool_use_id:
        return tool_use_id
    import hashlib
    body = json.dumps([tool, tool_input], sort_keys=True)
    return "call-" + hashlib.sha256(body.encode()).hexdigest()[:24]
