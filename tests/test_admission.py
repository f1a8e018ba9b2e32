"""The admission gate: at most ``limit`` holders, and waiters enter in arrival order."""

from __future__ import annotations

import threading
import time

import pytest
from worldline.daemon.capture.admission import FairGate


@pytest.mark.parametrize("limit", [1, 2])
def test_admits_in_arrival_order_and_never_more_than_the_limit(limit):
    gate = FairGate(limit)
    inside, most, order = [0], [0], []
    lock = threading.Lock()
    release = threading.Event()

    def holder(i: int) -> None:
        with gate.admitted():
            with lock:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
                order.append(i)
            release.wait(5)
            with lock:
                inside[0] -= 1

    threads = []
    for i in range(8):
        t = threading.Thread(target=holder, args=(i,))
        t.start()
        threads.append(t)
        time.sleep(0.02)  # arrive one after another
    assert order == list(range(limit))  # the first ones inside, the rest queued
    release.set()
    for t in threads:
        t.join(5)
    assert most[0] == limit and sorted(order) == list(range(8))
    if limit == 1:  # one at a time: the order they entered in is the order they came in
        assert order == list(range(8))


def test_a_failing_holder_hands_its_place_on():
    gate = FairGate(1)
    with pytest.raises(RuntimeError):
        with gate.admitted():
            raise RuntimeError("boom")
    done = threading.Event()
    threading.Thread(target=lambda: (gate.admitted().__enter__(), done.set())).start()
    assert done.wait(2)


def test_limit_must_admit_someone():
    with pytest.raises(ValueError):
        FairGate(0)
