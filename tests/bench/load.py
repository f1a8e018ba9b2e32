"""The throughput case: 8 worker processes, one session each, checkpointing for a
fixed time, while the parent measures how fast `session list` answers."""

from __future__ import annotations

import multiprocessing as mp
import random
import time
from pathlib import Path


def _worker(address: str, session_id: str, workspace: str, django: str, seconds: float,
            start_at: float, out) -> None:
    from worldline.client import Client

    from .trees import edit, pick_files
    rng = random.Random(hash(session_id) & 0xFFFF)
    pick_files(Path(django), rng)  # list the tree once, before the clock starts
    latencies = []
    with Client(address) as client:
        while time.time() < start_at:
            time.sleep(0.001)
        deadline = time.monotonic() + seconds
        i = 0
        while time.monotonic() < deadline:
            edit(Path(workspace), pick_files(Path(django), rng), f"load {i}")
            t = time.perf_counter()
            client.checkpoint(session_id)
            latencies.append(time.perf_counter() - t)
            i += 1
    out.put(latencies)


def run(address: str, sessions: list[str], workspaces: list[str], seconds: float,
        django: str) -> dict:
    from worldline.client import Client
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    start_at = time.time() + 3.0
    procs = [ctx.Process(target=_worker, args=(address, s, w, django, seconds, start_at, out))
             for s, w in zip(sessions, workspaces, strict=True)]
    for p in procs:
        p.start()
    list_latencies = []
    with Client(address) as client:
        while time.time() < start_at:
            time.sleep(0.01)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t = time.perf_counter()
            client.list_sessions()
            list_latencies.append(time.perf_counter() - t)
            time.sleep(0.25)
    latencies = []
    for _ in procs:
        latencies.extend(out.get(timeout=60))
    for p in procs:
        p.join(30)
    xs = sorted(latencies)
    return {"count": len(xs), "seconds": seconds, "latencies": xs,
            "p99": xs[min(len(xs) - 1, int(len(xs) * 0.99))] if xs else 0.0,
            "list_latencies": list_latencies}
