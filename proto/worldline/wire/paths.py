"""Paths on the wire: every file name survives as a proto string.

A file name is any bytes but '/' and NUL; proto strings must be UTF-8. A path that is
valid UTF-8 and holds no backslash is sent as it is; any other is escaped: each
backslash as two, and each byte that is not part of valid UTF-8 as ``\\xNN``. In
Python, names that are not UTF-8 are ``str`` with surrogate escapes (``os.fsdecode``).
"""

from __future__ import annotations

import re

__all__ = ["escape", "unescape", "to_bytes"]

_ESCAPED = re.compile(r"\\(\\|x[0-9a-f]{2})")


def escape(path: str) -> str:
    """A path (``os.fsdecode`` form) as it travels in a proto string."""
    if "\\" not in path:
        try:
            path.encode("utf-8")
            return path
        except UnicodeEncodeError:
            pass
    out = []
    for ch in path:
        if ch == "\\":
            out.append("\\\\")
        elif 0xDC80 <= ord(ch) <= 0xDCFF:  # a byte that was not UTF-8
            out.append(f"\\x{ord(ch) - 0xDC00:02x}")
        else:
            out.append(ch)
    return "".join(out)


def unescape(path: str) -> str:
    """The ``os.fsdecode`` form of a path received in a proto string."""
    if "\\" not in path:
        return path
    return _ESCAPED.sub(lambda m: "\\" if m.group(1) == "\\"
                        else chr(0xDC00 + int(m.group(1)[1:], 16)), path)


def to_bytes(path: str) -> bytes:
    """The file system bytes of a path received in a proto string."""
    return unescape(path).encode("utf-8", "surrogateescape")
