"""The data root and the daemon's address, and their defaults: where the daemon listens
and the client looks for it."""

from __future__ import annotations

import os


def default_root() -> str:
    root = os.environ.get("WORLDLINE_ROOT")
    if root:
        return os.path.abspath(root)
    return os.path.join(os.path.expanduser("~"), ".local", "share", "worldline")


def normalize_address(address: str) -> str:
    """``unix:///abs/path`` or ``host:port`` as given; a bare socket path (``/abs/path``,
    ``./rel/path``) becomes ``unix://`` and its absolute path."""
    if address.startswith(("/", "./", "../")):
        return "unix://" + os.path.abspath(address)
    return address


def default_address(root: str | None = None) -> str:
    if root is None:
        address = os.environ.get("WORLDLINE_ADDRESS")
        if address:
            return normalize_address(address)
        root = default_root()
    return "unix://" + os.path.join(os.path.abspath(root), "worldline.sock")


def unix_path(address: str) -> str | None:
    """The socket path of a ``unix:///abs/path`` address; None for ``host:port``."""
    if address.startswith("unix://"):
        return address[len("unix://"):]
    if address.startswith("unix:"):
        return address[len("unix:"):]
    return None
