"""Identifiers and timestamps.

Ids are ULIDs: 26 Crockford base-32 characters, a 48-bit millisecond time then 80
random bits, so they sort by creation time. Within one process they are strictly
increasing even inside one millisecond.
"""

from __future__ import annotations

import datetime as _dt
import os
import re
import threading
import time

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_ULID_RE = re.compile(r"^[0-9A-HJKMNP-TV-Z]{26}$")
_lock = threading.Lock()
_last = 0


def new_id() -> str:
    """A new ULID, greater than every id this process made before."""
    global _last
    with _lock:
        value = (time.time_ns() // 1_000_000) << 80 | int.from_bytes(os.urandom(10), "big")
        if value <= _last:
            value = _last + 1
        _last = value
    chars = []
    for _ in range(26):
        chars.append(_ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(chars))


def is_id(text: str) -> bool:
    return bool(_ULID_RE.match(text))


def now() -> str:
    """The current time, RFC 3339 in UTC with microseconds."""
    return _text(_dt.datetime.now(_dt.UTC))


def time_at(seconds: float) -> str:
    """``seconds`` since the epoch, written as ``now`` writes times (fixed width, so
    they sort as text)."""
    return _text(_dt.datetime.fromtimestamp(seconds, _dt.UTC))


def clock(seconds: float) -> str:
    """A moment (a lease's end) as UTC time to the second, for messages."""
    return _dt.datetime.fromtimestamp(seconds, _dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _text(when: _dt.datetime) -> str:
    return when.isoformat(timespec="microseconds").replace("+00:00", "Z")


def parse_time(text: str) -> _dt.datetime:
    return _dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
