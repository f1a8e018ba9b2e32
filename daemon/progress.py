"""Progress of long operations (restore, fork, gc), for the callers that ask.

A call that carries an operation id runs with it as the *current operation*: the
edge enters ``Progress.run(op_id)`` around the call, and the domain reports through
``begin(phase, total)`` and ``advance(n)`` without knowing whether anyone listens
(with no current operation both do nothing). A client polls ``Progress.get`` from
another call while the first runs; a finished operation is remembered for a while,
so the last poll sees it complete, then forgotten.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass

from worldline.wire.errors import AlreadyExists, InvalidArgument, NotFound

KEEP_SECONDS = 120.0
_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


@dataclass
class Operation:
    id: str
    phase: str = "starting"
    unit: str = ""
    done: int = 0
    total: int = 0
    files: int = 0
    finished: bool = False
    ended_at: float = 0.0

    def snapshot(self) -> Operation:
        return Operation(self.id, self.phase, self.unit, self.done, self.total, self.files,
                         self.finished, self.ended_at)


_current: ContextVar[Operation | None] = ContextVar("worldline_operation", default=None)


def begin(phase: str, total: int, unit: str = "bytes") -> None:
    """The current operation enters ``phase``, with ``total`` units to do."""
    op = _current.get()
    if op is not None:
        op.phase, op.unit, op.done, op.total = phase, unit, 0, max(0, total)


def advance(n: int = 1, files: int = 0) -> None:
    op = _current.get()
    if op is not None:
        op.done += n
        op.files += files


class Progress:
    def __init__(self, keep_seconds: float = KEEP_SECONDS) -> None:
        self.keep_seconds = keep_seconds
        self._ops: dict[str, Operation] = {}
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def run(self, op_id: str) -> Iterator[None]:
        """Make ``op_id`` the current operation of this call ("" tracks nothing)."""
        if not op_id:
            yield
            return
        if not _ID.match(op_id):
            raise InvalidArgument("an operation id is 1 to 64 letters, digits, '.', '_' or '-'")
        op = Operation(op_id)
        with self._lock:
            self._forget_old()
            if op_id in self._ops:
                raise AlreadyExists(f"operation {op_id} is already known")
            self._ops[op_id] = op
        token = _current.set(op)
        try:
            yield
        finally:
            _current.reset(token)
            op.finished, op.ended_at = True, time.monotonic()

    def get(self, op_id: str) -> Operation:
        with self._lock:
            op = self._ops.get(op_id)
        if op is None:
            raise NotFound(f"operation {op_id} is not running (or finished long ago)")
        return op.snapshot()

    def _forget_old(self) -> None:
        cutoff = time.monotonic() - self.keep_seconds
        for op_id in [k for k, op in self._ops.items() if op.finished and op.ended_at < cutoff]:
            del self._ops[op_id]
