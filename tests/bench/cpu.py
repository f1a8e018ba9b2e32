"""The daemon's own CPU per checkpoint, with nothing else on the path.

    .venv/bin/python -m tests.bench.cpu [CHECKPOINTS]

An in-process World (no socket, no client) over a copy of Django 5.2.8: a 3-file edit,
then a checkpoint, CHECKPOINTS times (default 300) after 20 to warm up. Prints the
medians of the checkpoint's wall time and of its thread's CPU time. It compares what
`make bench` cannot separate from the machine's noise: two builds of the daemon, or
two interpreters (run it with each venv's python, alternating; README, Set-up).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from worldline.daemon.main import Daemon

from .run import REPO, machine
from .trees import copy_tree, django_tree, edit, pick_files


def measure(checkpoints: int, work: Path) -> dict:
    django = django_tree(work / "cache")
    tmp = Path(tempfile.mkdtemp(prefix="cpu-", dir=work))
    daemon = None
    try:
        ws = copy_tree(django, tmp / "ws")
        daemon = Daemon(str(tmp / "root"), f"unix://{tmp}/root/wl.sock")
        daemon.start()
        world = daemon.world
        session = world.create_session(str(ws))
        rng = random.Random(1)
        for i in range(20):
            edit(ws, pick_files(django, rng), f"warm {i}")
            world.checkpoint(session.id)
        wall, cpu = [], []
        for i in range(checkpoints):
            edit(ws, pick_files(django, rng), f"edit {i}")
            t, c = time.perf_counter(), time.thread_time()
            world.checkpoint(session.id)
            cpu.append(time.thread_time() - c)
            wall.append(time.perf_counter() - t)
        interpreter = {k: v for k, v in machine().items() if k.startswith("python")}
        return {**interpreter, "checkpoints": checkpoints,
                "wall_ms": round(statistics.median(wall) * 1e3, 3),
                "thread_cpu_ms": round(statistics.median(cpu) * 1e3, 3)}
    finally:
        if daemon is not None:
            daemon.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    print(json.dumps(measure(n, Path(os.environ.get("BENCH_DIR", REPO / "bench" / "work")))))
