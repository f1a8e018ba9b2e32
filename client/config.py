"""Defaults shared by the daemon and the client: the data root and the address."""

from __future__ import annotations

import os


def default_root() -> str:
    root = os.environ.get("WORLDLINE_ROOT")
    if root:
        return os.path.abspath(root)
    return os.path.join(os.path.expanduser("~"), ".local", "share", "worldline")


def default_address(root: str | None = None) -> str:
    if root is None:
        address = os.environ.get("WORLDLINE_ADDRESS")
        if address:
            return address
        root = default_root()
    return "unix://" + os.path.join(os.path.abspath(root), "worldline.sock")


def unix_path(address: str) -> str | None:
    """The socket path of a ``unix:///abs/path`` address; None for ``host:port``."""
    if address.startswith("unix://"):
        return address[len("unix://"):]
    if address.startswith("unix:"):
        return address[len("unix:"):]
    return None
