"""Admission: how many incremental checkpoints capture at once.

The daemon's Python work runs under one interpreter lock, so eight captures at once do
not finish sooner than one at a time: they take turns at that lock anyway, and every
system call a capture makes (a stat, a read, an fsync) hands the lock to another
capture and then waits to get it back (a lock convoy). Measured with the benchmark's
eight-session load on two cores (daemon CPU per checkpoint, checkpoints per second):
every capture admitted, 7.6 ms and 154/s; two at a time, 6.4 ms and 166/s; one at a
time, 5.0 ms and 198/s. So incremental captures take turns, while the commit of one
(an fsync, SQLite) overlaps the next capture; full scans, which spend their time in
system calls outside the lock, do not wait (world.py).

``FairGate`` admits ``limit`` holders and queues the rest in arrival order, handing a
freed place straight to the oldest waiter, so nobody is overtaken (the tail latency
of a plain semaphore, where a newcomer can take a place a waiter was woken for).
"""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Iterator


class FairGate:
    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("a gate admits at least one holder")
        self._lock = threading.Lock()
        self._free = limit
        self._waiters: collections.deque[threading.Event] = collections.deque()

    @contextlib.contextmanager
    def admitted(self) -> Iterator[None]:
        with self._lock:
            if self._free and not self._waiters:
                self._free -= 1
                turn = None
            else:
                turn = threading.Event()
                self._waiters.append(turn)
        if turn is not None:
            turn.wait()  # the place is ours once set: it was handed over, not freed
        try:
            yield
        finally:
            with self._lock:
                if self._waiters:
                    self._waiters.popleft().set()
                else:
                    self._free += 1
