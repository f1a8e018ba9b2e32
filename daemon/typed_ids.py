"""Ids a person can type: the full id an operator meant, from

- a full id (26 characters, any case);
- a unique prefix of one (at least MIN_PREFIX characters, any case);
- ``SESSION@N``: the checkpoint of sequence number N of a session (SESSION itself a
  full id or a unique prefix);
- ``HEAD`` and ``HEAD~N``: the head of a session (given apart: the CLI's and MCP's
  session of the current folder, or ``--session``), and its Nth parent back.

An ambiguous prefix is INVALID_ARGUMENT naming the candidates (at most SHOWN); one
that names nothing is NOT_FOUND. ``kind`` (session, checkpoint, approval, tool_call;
empty: any) narrows where a prefix is looked for; ``visible(session_id)`` hides what
the caller may not see (an allowed user sees its own sessions' only).

Prefixes are looked for in the store's lists (a scan: fine for an operator's command;
an indexed prefix query would serve a store of millions of checkpoints better).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from worldline.wire.errors import InvalidArgument, NotFound

from .storage.metadata_store import Store

KINDS = ("session", "checkpoint", "approval", "tool_call")
MIN_PREFIX = 4
SHOWN = 10
_HEAD = re.compile(r"^HEAD(?:~(\d+))?$", re.IGNORECASE)
_AT = re.compile(r"^([0-9A-Za-z]+)@(\d+)$")
# a ULID's start: its first character is 0-7 (its time), the rest of its alphabet
_PREFIX = re.compile(r"^[0-7][0-9A-HJKMNP-TV-Z]{0,25}$", re.IGNORECASE)


def resolve(store: Store, text: str, kind: str = "", session_id: str = "",
            visible: Callable[[str], bool] = lambda _: True) -> tuple[str, str]:
    """(full id, its kind) for what an operator typed."""
    if kind and kind not in KINDS:
        raise InvalidArgument(f"kind {kind!r} is not one of {', '.join(KINDS)}")
    text = (text or "").strip()
    head = _HEAD.match(text)
    at = _AT.match(text)
    if (head or at) and kind not in ("", "checkpoint"):
        raise InvalidArgument(f"{text!r} names a checkpoint, not a {kind}")
    if head:
        if not session_id:
            raise InvalidArgument(f"{text!r} needs a session: run it in a session's"
                                  " workspace, or give --session")
        sid, _ = resolve(store, session_id, "session", visible=visible)
        return _back(store, store.get_session(sid).head, int(head[1] or 0), text), "checkpoint"
    if at:
        sid, _ = resolve(store, at[1], "session", visible=visible)
        seq = int(at[2])
        for cp in store.list_checkpoints(sid):
            if cp.seq == seq:
                return cp.id, "checkpoint"
        raise NotFound(f"session {sid} has no checkpoint {seq}")
    if not _PREFIX.match(text):
        raise InvalidArgument(f"{text!r} is not an id, a prefix of one, SESSION@N, HEAD or"
                              " HEAD~N")
    text = text.upper()
    if len(text) < MIN_PREFIX:
        raise InvalidArgument(f"{text!r} is too short: give at least {MIN_PREFIX}"
                              " characters of an id")
    found = [(i, k) for k, i in _candidates(store, text, kind, visible)]
    exact = [(i, k) for i, k in found if i == text]
    if len(exact) == 1 or (exact and len({k for _, k in exact}) == 1):
        return exact[0]
    if len(found) == 1:
        return found[0]
    if not found:
        what = kind.replace("_", " ") if kind else "session, checkpoint, approval or tool call"
        raise NotFound(f"no {what} id starts with {text}")
    shown = ", ".join(f"{k.replace('_', ' ')} {i}" for i, k in sorted(found)[:SHOWN])
    more = f" and {len(found) - SHOWN} more" if len(found) > SHOWN else ""
    raise InvalidArgument(f"{text} is ambiguous: {len(found)} ids start with it ({shown}"
                          f"{more}); give more characters")


def _candidates(store: Store, prefix: str, kind: str, visible: Callable[[str], bool]):
    """(kind, id) of everything whose id starts with ``prefix``."""
    lists = {"session": (store.list_sessions, lambda s: s.id),
             "checkpoint": (store.list_checkpoints, lambda c: c.session_id),
             "approval": (store.list_approvals, lambda a: a.session_id),
             "tool_call": (store.list_tool_calls, lambda t: t.session_id)}
    for name, (listed, session_of) in lists.items():
        if kind in ("", name):
            yield from ((name, x.id) for x in listed()
                        if x.id.startswith(prefix) and visible(session_of(x)))


def _back(store: Store, checkpoint_id: str, steps: int, text: str) -> str:
    """The checkpoint ``steps`` parents back from ``checkpoint_id``."""
    for _ in range(steps):
        parent = store.get_checkpoint(checkpoint_id).parent_id
        if not parent:
            raise NotFound(f"{text}: the history holds fewer than {steps} checkpoint(s)"
                           " before the head")
        checkpoint_id = parent
    return checkpoint_id
