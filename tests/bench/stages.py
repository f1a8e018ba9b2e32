"""`make stages`: where a checkpoint's time goes, stage by stage. A developer's tool
beside `make bench`, not one of its cases: the bench says how fast, this says where.

It starts the daemon in this process (the real one, on a real socket, with a real
client), wraps the methods a checkpoint passes through in timers, and reports for
each the median time it took per checkpoint (inclusive of what it calls; a method
that calls itself counts once, at its outermost call; a context manager, its entry
and exit without the block it holds). Only time spent on the thread
answering the checkpoint counts. The workloads:

- ``history``: flask-400's replay, as history-400 runs it (``../shared/bench-data``);
- ``idle``: that replay, then checkpoints with nothing changed, each after 15 ms idle
  (history-400's "checkpoint with nothing to capture");
- ``edits``: 3 files appended to in a generated tree of small files, as each of the
  throughput case's sessions does (no download; the smoke test runs it).

``--sql`` also times each SQL statement of the embedded store and the pack.
The timers cost a few microseconds a call: compare stages with each other, and a
build with another under the same tool, not with `make bench`'s figures.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from worldline.client import Client
from worldline.daemon.capture import tree_scan
from worldline.daemon.capture.layers import Layer
from worldline.daemon.capture.snapshot import WorkspaceSnapshotter
from worldline.daemon.capture.tracker import WorkspaceTracker
from worldline.daemon.main import Daemon
from worldline.daemon.storage.blobs import LocalBlobStore
from worldline.daemon.storage.sqlite_store import SqliteDatabase, SqliteStore
from worldline.daemon.world.checkpoint import Checkpoints
from worldline.daemon.world.core import Core
from worldline.daemon.world.session_lock import SessionLock

from .history import Replay, source
from .trees import edit, wide_tree

# (owner, method, the stage's name): what a checkpoint passes through, outermost first
STAGES: list[tuple[object, str, str]] = [
    (Checkpoints, "checkpoint", "checkpoint (the daemon's whole answer but the wire)"),
    (SessionLock, "locked", "session lock and read, its release"),
    (Core, "layers", "layers"),
    (Checkpoints, "_admitted", "admission gate: the wait for a turn, its end"),
    (Checkpoints, "_capture", "capture (all layers, state, tasks)"),
    (WorkspaceTracker, "prepare", "  tracker barrier and changes"),
    (WorkspaceSnapshotter, "capture", "  workspace capture"),
    (tree_scan, "update_dir", "    folders updated"),
    (WorkspaceSnapshotter, "_read_file", "    files read and put"),
    (LocalBlobStore, "put_bytes", "    puts (files and trees)"),
    (Checkpoints, "_commit", "commit"),
    (LocalBlobStore, "sync", "  pack rows' transaction"),
    (SqliteStore, "append_checkpoint", "  checkpoint's transaction"),
    (SqliteDatabase, "_flush", "fsync of the log"),
    (Layer, "committed", "stat cache and tracker told"),
]
WHOLE = STAGES[0][2]


class Timers:
    """Per checkpoint, the time each stage took on the thread answering it."""

    def __init__(self) -> None:
        self._local = threading.local()
        self.current: dict[str, float] = {}
        self.per_checkpoint: dict[str, list[float]] = {}
        self._undo: list[tuple[object, str, object]] = []

    def _depth(self) -> dict[str, int]:
        if not hasattr(self._local, "depth"):
            self._local.depth = {}
        return self._local.depth

    def _add(self, name: str, took: float) -> None:
        if self._depth().get(WHOLE) or name == WHOLE:
            self.current[name] = self.current.get(name, 0.0) + took

    def wrap(self, owner: object, attr: str, name: str) -> None:
        func = owner.__dict__[attr]  # a plain function: a method or a context manager
        timers = self
        if _is_context_manager(func):  # its entry and exit, not the block it holds
            @functools.wraps(func)
            @contextlib.contextmanager
            def wrapper(*args, **kwargs) -> Iterator:
                started = time.perf_counter()
                manager = func(*args, **kwargs)
                value = manager.__enter__()
                entered = time.perf_counter()
                try:
                    yield value
                except BaseException:
                    if not manager.__exit__(*sys.exc_info()):
                        raise
                else:
                    left = time.perf_counter()
                    manager.__exit__(None, None, None)
                    timers._add(name, entered - started + time.perf_counter() - left)
        else:
            @functools.wraps(func)
            def wrapper(*args, **kwargs):
                with timers._outermost(name):
                    return func(*args, **kwargs)
        setattr(owner, attr, wrapper)
        self._undo.append((owner, attr, func))

    @contextlib.contextmanager
    def _outermost(self, name: str) -> Iterator[None]:
        depth = self._depth()
        depth[name] = depth.get(name, 0) + 1
        started = time.perf_counter()
        try:
            yield
        finally:
            depth[name] -= 1
            if depth[name] == 0:
                self._add(name, time.perf_counter() - started)

    def end_checkpoint(self) -> None:
        for name, took in self.current.items():
            self.per_checkpoint.setdefault(name, []).append(took)
        self.current = {}

    def undo(self) -> None:
        for owner, attr, original in reversed(self._undo):
            setattr(owner, attr, original)
        self._undo = []


def _is_context_manager(func: Callable) -> bool:
    """A ``@contextlib.contextmanager`` function: its wrapper keeps the generator."""
    wrapped = getattr(func, "__wrapped__", None)
    return wrapped is not None and wrapped.__code__.co_flags & 0x20 != 0  # CO_GENERATOR


class _TimedConnection:
    """A SQLite connection whose statements are timed (``--sql``)."""

    def __init__(self, connection, timers: Timers) -> None:
        self.__dict__["_connection"], self.__dict__["_timers"] = connection, timers

    def __getattr__(self, name: str):
        return getattr(self._connection, name)

    def __setattr__(self, name: str, value) -> None:
        setattr(self._connection, name, value)

    def _timed(self, method: str, sql: str, *args):
        started = time.perf_counter()
        try:
            return getattr(self._connection, method)(sql, *args)
        finally:
            self._timers._add("sql: " + " ".join(sql.split())[:60],
                              time.perf_counter() - started)

    def execute(self, sql: str, *args):
        return self._timed("execute", sql, *args)

    def executemany(self, sql: str, *args):
        return self._timed("executemany", sql, *args)


def _history(cache: Path, work: Path) -> tuple[Path, Callable[[int], None], int]:
    repo, commits = source(cache)
    replay = Replay(repo, work / "ws", work / "index")
    replay.first(commits[0])

    def step(i: int) -> None:
        replay.step(commits[i], commits[i + 1])
    return work / "ws", step, len(commits) - 1


def _edits(cache: Path, work: Path, files: int) -> tuple[Path, Callable[[int], None], int]:
    tree = wide_tree(cache, files=files, seed=7)
    ws = work / "ws"
    shutil.copytree(tree, ws, symlinks=True)
    names = sorted(str(p.relative_to(ws)) for p in ws.rglob("*") if p.is_file())
    rng = random.Random(7)

    def step(i: int) -> None:
        edit(ws, rng.sample(names, 3), f"stages {i}")
    return ws, step, 1 << 30


def run(mode: str, checkpoints: int | None, cache: Path, sql: bool = False,
        files: int = 2000) -> dict[str, list[float]]:
    """Per stage, its time in each measured checkpoint (seconds); "client" is the whole
    call as the client saw it."""
    work = Path(tempfile.mkdtemp(prefix="worldline-stages-"))
    timers = Timers()
    daemon = None
    try:
        ws, step, steps = (_edits(cache, work, files) if mode == "edits"
                           else _history(cache, work))
        daemon = Daemon(str(work / "data"), f"unix://{work}/stages.sock")
        daemon.start()
        for owner, attr, name in STAGES:
            timers.wrap(owner, attr, name)
        if sql:
            for holder in (daemon.world.store, daemon.world.blobs.pack):
                holder._db = _TimedConnection(holder._db, timers)
        client_times: list[float] = []
        with Client(f"unix://{work}/stages.sock") as client:
            session = client.create_session(str(ws))
            warm = steps if mode == "idle" else min(20, steps)
            for i in range(warm):  # the replay itself is the warm-up of "idle"
                step(i)
                session.checkpoint()
            timers.current = {}
            todo = checkpoints or (steps - warm if mode == "history" else 100)
            for i in range(warm, warm + todo):
                if mode == "idle":
                    time.sleep(0.015)
                elif i >= steps:
                    break
                else:
                    step(i)
                started = time.perf_counter()
                session.checkpoint()
                client_times.append(time.perf_counter() - started)
                timers.end_checkpoint()
        return {"client": client_times, **timers.per_checkpoint}
    finally:
        timers.undo()
        if daemon is not None:
            daemon.stop()
        shutil.rmtree(work, ignore_errors=True)


def report(results: dict[str, list[float]]) -> str:
    count = len(results["client"])
    lines = [f"{count} checkpoints; medians in ms (a stage absent from a checkpoint"
             " counts 0 there)",
             f"{statistics.median(results['client']) * 1000:8.3f}  the call, as the"
             " client saw it"]
    order = [name for _, _, name in STAGES] + sorted(
        k for k in results if k.startswith("sql: "))
    for name in order:
        xs = results.get(name, []) + [0.0] * (count - len(results.get(name, [])))
        if any(xs):
            lines.append(f"{statistics.median(xs) * 1000:8.3f}  {name}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", nargs="?", default="history",
                        choices=["history", "idle", "edits"])
    parser.add_argument("--checkpoints", type=int, default=None)
    parser.add_argument("--sql", action="store_true", help="time each SQL statement too")
    parser.add_argument("--cache", type=Path,
                        default=Path(__file__).resolve().parents[2] / "bench" / "work" / "cache")
    args = parser.parse_args(argv)
    args.cache.mkdir(parents=True, exist_ok=True)
    print(report(run(args.mode, args.checkpoints, args.cache, args.sql)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
