"""What one caller may hold of the daemon's edge: connections, buffered bytes, calls.

Every peer of the gateway and of the gRPC relay is known by its uid (SO_PEERCRED;
callers.py). The daemon's owner (root, or the daemon's own uid) is trusted; an allowed
user (``--allow-uid``) may be an agent that means harm. So each pool below is shared
so that no allowed user can keep the owner out: the allowed users together hold at
most ``total - reserve`` of it, each at most ``per_uid``, and the owner may take all
that is free. With 1,030 idle connections from an agent, the owner's checkpoint and
every hook of the owner's still get through (tests/test_gateway_limits.py).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

# The gRPC server's worker threads (main.py), and those of the server apart that the
# relay's peers reach (the allowed users'): the owner's calls never wait for theirs.
GRPC_WORKERS = 32
RELAY_WORKERS = 16
MAX_STREAMS = 100  # a gRPC connection's calls at once (grpc.max_concurrent_streams)
MAX_DEPTH = 32  # nesting of a JSON request: a real one is 3 deep (envelope, request, map)


@dataclass(frozen=True)
class EdgeLimits:
    """The daemon's flags for its edge (SECURITY.md, Limits)."""

    max_connections: int = 1024  # the gateway's, open at once (a thread each)
    owner_connections: int = 64  # of those, none but the owner's may use
    connections_per_uid: int = 64  # an allowed user's, on the gateway and on the relay
    idle_seconds: float = 60.0  # a connection that sends nothing for this long is closed
    max_line: int = 8 << 20  # one JSON request line, in bytes
    buffer_bytes: int = 256 << 20  # the gateway's requests, buffered, all connections
    calls_per_uid: int = 8  # an allowed user's gRPC calls under way at once (relayed)

    def connections(self) -> Quota:
        return Quota("connections", self.max_connections, self.connections_per_uid,
                     self.owner_connections)

    def buffers(self) -> Quota:
        """Bytes: an allowed user's requests hold at most half, the owner's the rest."""
        return Quota("bytes of requests", self.buffer_bytes, self.buffer_bytes // 2,
                     self.buffer_bytes - self.buffer_bytes // 2)

    def calls(self) -> Quota:
        """The relay's server's workers: each allowed user's share of them."""
        return Quota("gRPC calls", RELAY_WORKERS, self.calls_per_uid, 0)


class Quota:
    """``total`` units of something, shared: the owner (uid None) takes any that are
    free; allowed users together at most ``total - reserve``, each at most
    ``per_uid``."""

    def __init__(self, what: str, total: int, per_uid: int, reserve: int) -> None:
        self.what, self.total = what, total
        self.others_max = max(0, total - reserve)
        self.per_uid = min(per_uid, self.others_max)
        self.used = self.others = 0
        self.by_uid: dict[int, int] = {}
        self._changed = threading.Condition()

    def room(self, uid: int | None) -> int:
        """The most ``uid`` could ever hold at once."""
        return self.total if uid is None else self.per_uid

    def take(self, uid: int | None, n: int, wait: float = 0.0) -> bool:
        """Take ``n`` for ``uid``, waiting up to ``wait`` seconds for room; whether it
        was taken."""
        deadline = time.monotonic() + wait
        with self._changed:
            while not self._fits(uid, n):
                left = deadline - time.monotonic()
                if left <= 0 or n > self.room(uid):
                    return False
                self._changed.wait(left)
            self.used += n
            if uid is not None:
                self.others += n
                self.by_uid[uid] = self.by_uid.get(uid, 0) + n
            return True

    def give(self, uid: int | None, n: int) -> None:
        if n <= 0:
            return
        with self._changed:
            self.used -= n
            if uid is not None:
                self.others -= n
                left = self.by_uid.pop(uid) - n
                if left:
                    self.by_uid[uid] = left
            self._changed.notify_all()

    def held(self, uid: int | None) -> int:
        with self._changed:
            return self.used if uid is None else self.by_uid.get(uid, 0)

    def _fits(self, uid: int | None, n: int) -> bool:
        if self.used + n > self.total:
            return False
        return uid is None or (self.others + n <= self.others_max
                               and self.by_uid.get(uid, 0) + n <= self.per_uid)

    def refusal(self, uid: int | None) -> str:
        """Why ``uid`` was refused, naming nothing of anyone else's."""
        if uid is None:
            return f"the daemon's {self.total} {self.what} are all in use"
        return (f"uid {uid} holds its share of the daemon's {self.what} ({self.per_uid}),"
                f" or allowed users hold theirs together; try again later")
