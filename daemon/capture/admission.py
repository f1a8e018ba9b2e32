"""Admission: how many incremental checkpoints capture at once.

The daemon's Python work runs under one interpreter lock, so eight captures at once do
not finish sooner than one at a time: they take turns at that lock anyway, and every
system call a capture makes (a stat, a read, an fsync) hands the lock to another
capture and then waits to get it back (a lock convoy). Measured with the benchmark's
eight-session load on two cores (daemon CPU per checkpoint, checkpoints per second):
every capture admitted, 7.6 ms and 154/s; two at a time, 6.4 ms and 166/s; one at a
time, 5.0 ms and 198/s. So incremental captures take turns; on the embedded store the
commit's Python work is part of the turn and only its fsync overlaps the next capture
(less CPU a checkpoint than when the whole commit overlapped it, which took the lock
from the capture at each of its system calls); full scans, which spend their time in
system calls outside the lock, do not wait (world/checkpoint.py).

``FairGate`` admits ``limit`` holders and queues the rest in arrival order, handing a
freed place straight to the oldest waiter, so nobody is overtaken (the tail latency
of a plain semaphore, where a newcomer can take a place a waiter was woken for).

Taking turns is for short captures. One that holds its place longer than the gate's
``patience`` (a file of gigabytes to read, a slow disk) gives the place up and goes on
outside the count, so that the other sessions' checkpoints do not wait for all of it:
without that, a session storing a 1.5 GB file held every other session's one-file
checkpoint for the six seconds it took. The gate only spares the interpreter lock, so
admitting past a long holder is never wrong, only the convoy it was there to avoid.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Iterator


class FairGate:
    def __init__(self, limit: int, patience: float | None = None) -> None:
        """``patience``: seconds a holder keeps its place before giving it up (None:
        until it leaves)."""
        if limit < 1:
            raise ValueError("a gate admits at least one holder")
        if patience is not None and patience <= 0:
            raise ValueError("a gate's patience is positive")
        self._lock = threading.Lock()
        self._limit = limit
        self._patience = patience
        self._waiters: collections.deque[tuple[threading.Event, object]] = collections.deque()
        # each holder in the count, since when; the free places are the rest of limit
        self._since: dict[object, float] = {}

    @contextlib.contextmanager
    def admitted(self) -> Iterator[None]:
        me = object()
        with self._lock:
            if len(self._since) < self._limit and not self._waiters:
                self._since[me] = time.monotonic()
                turn = None
            else:
                turn = threading.Event()
                self._waiters.append((turn, me))
        if turn is not None:
            self._wait(turn)  # the place is ours once set: it was handed over, not freed
        try:
            yield
        finally:
            with self._lock:
                if self._since.pop(me, None) is not None:  # still in the count
                    self._hand_on()

    @property
    def counted(self) -> int:
        """Holders in the count (at most ``limit``; those that outstayed it are not)."""
        with self._lock:
            return len(self._since)

    def _wait(self, turn: threading.Event) -> None:
        if self._patience is None:
            turn.wait()
            return
        while True:
            with self._lock:
                now = time.monotonic()
                for holder, since in list(self._since.items()):
                    if now - since >= self._patience:  # outstayed: off the count
                        del self._since[holder]
                        self._hand_on()
                # until the first holder in the count outstays the patience
                timeout = min(self._since.values(), default=now) + self._patience - now
            if turn.wait(max(timeout, 0.001)):
                return

    def _hand_on(self) -> None:
        """A place was just freed (under the lock): to the oldest waiter, if any."""
        if self._waiters:
            turn, holder = self._waiters.popleft()
            self._since[holder] = time.monotonic()
            turn.set()
