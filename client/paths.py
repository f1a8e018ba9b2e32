"""Paths on the wire, as the client names them: ``worldline.wire.paths``."""

from worldline.wire.paths import escape, to_bytes, unescape

__all__ = ["escape", "unescape", "to_bytes"]
