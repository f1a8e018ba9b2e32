"""The admission gate: at most ``limit`` holders, and waiters enter in arrival order."""

from __future__ import annotations

import threading
import time

import pytest
from worldline.daemon.capture.admission import FairGate


def _until(predicate, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "not within the time allowed"
        time.sleep(0.001)


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
        # one after another: each inside, or queued, before the next comes
        _until(lambda i=i: (len(order) if i < limit else limit + len(gate._waiters)) == i + 1)
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


def test_a_holder_that_outstays_the_patience_lets_the_next_one_in():
    """A long holder (a file of gigabytes) gives up its place after ``patience``; the
    others still take turns among themselves, and no place is lost or made."""
    gate = FairGate(1, patience=0.3)
    entered: dict[str, float] = {}
    left: dict[str, float] = {}
    release_long = threading.Event()
    start = time.monotonic()

    def holder(name: str, hold: threading.Event | float) -> None:
        with gate.admitted():
            entered[name] = time.monotonic() - start
            assert gate.counted <= 1
            if isinstance(hold, threading.Event):
                hold.wait(10)
            else:
                time.sleep(hold)
            left[name] = time.monotonic() - start

    long = threading.Thread(target=holder, args=("long", release_long))
    long.start()
    time.sleep(0.05)
    short = [threading.Thread(target=holder, args=(name, 0.05)) for name in ("b", "c")]
    for t in short:
        t.start()
        time.sleep(0.02)
    for t in short:
        t.join(5)
    assert "long" not in left  # still inside while the others came and went
    assert 0.28 <= entered["b"] < 1.2  # after the patience, not after the long holder
    assert entered["c"] >= left["b"] - 0.005  # b kept its turn: c waited for it
    assert gate.counted == 0
    release_long.set()
    long.join(5)
    assert gate.counted == 0  # the long holder's leaving frees no second place
    inside = threading.Event()
    blocker = threading.Event()
    first = threading.Thread(target=holder, args=("d", blocker))
    first.start()
    time.sleep(0.05)
    threading.Thread(target=lambda: (gate.admitted().__enter__(), inside.set())).start()
    assert not inside.wait(0.15)  # one place, taken by d: the next waits
    blocker.set()
    first.join(5)
    assert inside.wait(2)


def test_patience_must_be_positive():
    with pytest.raises(ValueError):
        FairGate(1, patience=0)


def test_a_local_commit_runs_in_the_turn_and_its_fsync_after_it(tmp_path):
    """On the embedded store a checkpoint's commit (Python work, SQLite) runs in its
    capture's turn, so that it never takes the interpreter lock from the next capture;
    its fsync, a wait, comes after the turn, and before the reply. A daemon in a child
    process, its store's commit and the write-ahead log's fsyncs watched."""
    import json

    from .conftest import run_python
    root, ws = tmp_path / "root", tmp_path / "ws"
    ws.mkdir()
    script = (
        "import json, os, time\n"
        "from worldline.client import Client\n"
        "from worldline.daemon.main import Daemon\n"
        f"root, ws = {str(root)!r}, {str(ws)!r}\n"
        "d = Daemon(root, f'unix://{root}/wl.sock')\n"
        "d.start()\n"
        "gate, store = d.world.admission, d.world.store\n"
        "log = os.path.join(root, 'meta.db-wal')\n"
        "events = []\n"
        "real_fsync, real_append = os.fsync, store.append_checkpoint\n"
        "def fsync(fd):\n"
        "    counted = gate.counted\n"
        "    real_fsync(fd)\n"
        "    if os.readlink(f'/proc/self/fd/{fd}') == log:\n"
        "        events.append(['fsync', counted, time.monotonic()])\n"
        "def append(*args, **kwargs):\n"
        "    events.append(['commit', gate.counted, time.monotonic()])\n"
        "    return real_append(*args, **kwargs)\n"
        "os.fsync, store.append_checkpoint = fsync, append\n"
        "out = []\n"
        "with Client(f'unix://{root}/wl.sock') as c:\n"
        "    s = c.create_session(ws)\n"
        "    s.checkpoint()  # the first after a start scans everything: no turn taken\n"
        "    for i in range(3):\n"
        "        open(os.path.join(ws, 'f'), 'w').write(str(i))\n"
        "        events.clear()\n"
        "        s.checkpoint()\n"
        "        answered = time.monotonic()\n"
        "        out.append([[kind, counted, at <= answered] for kind, counted, at in events])\n"
        "d.stop()\n"
        "print(json.dumps(out))\n")
    for events in json.loads(run_python(script, timeout=120)):
        # the commit in the turn (its holder counted), then one fsync of the log with
        # nobody in the turn, before the reply
        assert events == [["commit", 1, True], ["fsync", 0, True]], events
