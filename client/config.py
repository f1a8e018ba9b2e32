"""The client's side of the address: the shared defaults (``worldline.wire.address``)
and what to tell a person whose client found no daemon there."""

from __future__ import annotations

import os

from worldline.wire.address import default_address, default_root, normalize_address, unix_path

__all__ = ["connect_errno", "default_address", "default_root", "normalize_address",
           "unix_path", "unreachable"]


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
