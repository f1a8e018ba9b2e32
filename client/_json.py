"""JSON for the commands that start on every tool call, without importing ``json``.

``import json`` pulls in ``re`` (and with it ``enum``, ``functools``, ``collections``):
about 13 ms of a hook process's start on these machines, a sixth of its budget. The
standard library's C accelerator ``_json`` does the real work for ``json`` too; this
module drives it directly, with the same results as ``json.loads`` and
``json.dumps(..., ensure_ascii=False, separators=(",", ":"))``. Where ``_json`` is
missing (another Python), it is ``json`` itself.
"""

from __future__ import annotations

try:
    import _json
except ImportError:  # pragma: no cover - CPython always has it
    _json = None

_CONSTANTS = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}


class _Context:
    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = _CONSTANTS.__getitem__
    memo: dict = {}


def _no_default(value):
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


if _json is not None:
    _scan = _json.make_scanner(_Context())
    _encode = _json.make_encoder(None, _no_default, _json.encode_basestring, None, ":", ",",
                                 False, False, True)
    _encode_sorted = _json.make_encoder(None, _no_default, _json.encode_basestring, None, ":",
                                        ",", True, False, True)
_SPACE = " \t\n\r"


def loads(text: str | bytes):
    """``json.loads``; ValueError (json.JSONDecodeError) when it is not JSON."""
    if isinstance(text, (bytes, bytearray)):
        text = text.decode("utf-8")
    if _json is None:
        import json
        return json.loads(text)
    start = len(text) - len(text.lstrip(_SPACE))
    try:
        value, end = _scan(text, start)
    except StopIteration:
        import json
        return json.loads(text)  # raises the usual error, with its position
    if text[end:].strip(_SPACE):
        import json
        return json.loads(text)
    _Context.memo.clear()
    return value


def dumps(value, sort_keys: bool = False) -> str:
    """``json.dumps(value, ensure_ascii=False, separators=(",", ":"))``."""
    if _json is None:
        import json
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"),
                          sort_keys=sort_keys)
    if isinstance(value, str):
        return _json.encode_basestring(value)
    return "".join((_encode_sorted if sort_keys else _encode)(value, 0))
