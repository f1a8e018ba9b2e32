"""Defaults shared by the daemon and the client: the data root and the address."""

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


def unreachable(address: str, err: int | None) -> str:
    """What to tell a person whose client found no daemon at ``address``, by the errno of
    its connect: one line, with the advice that fits."""
    import errno as _e
    if err in (_e.EACCES, _e.EPERM):
        return (f"the worldline daemon at {address} does not let uid {os.getuid()} in:"
                f" its owner lets you with `worldline daemon --allow-uid {os.getuid()}`")
    if err in (_e.ENOENT, _e.ECONNREFUSED, _e.ENOTDIR):
        return (f"no worldline daemon listens at {address}: start one with"
                " `worldline daemon`, or point --address / $WORLDLINE_ADDRESS at yours")
    reason = f": {os.strerror(err)}" if err else ""
    return f"cannot reach the worldline daemon at {address}{reason}"


def connect_errno(path: str) -> int | None:
    """The errno a connect to the Unix socket ``path`` fails with; None if it connects."""
    import socket
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        return None
    except OSError as exc:
        return exc.errno
    finally:
        sock.close()
