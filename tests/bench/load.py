"""The throughput case: 8 worker processes, one session each, checkpointing for a
fixed time, while the parent measures how fast `session list` answers."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import time
from pathlib import Path

from .metrics import grown


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


def _cpu(pid: int) -> tuple[float, float, float]:
    """(the process's CPU seconds, the machine's busy and idle CPU seconds) so far."""
    tick = os.sysconf("SC_CLK_TCK")
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    with open("/proc/stat") as f:
        machine = [int(x) for x in f.readline().split()[1:]]
    idle = machine[3] + machine[4]  # idle, iowait
    return ((int(fields[11]) + int(fields[12])) / tick, (sum(machine[:8]) - idle) / tick,
            idle / tick)


def _cpus(pids: list[int]) -> tuple[float, float, float] | None:
    """As ``_cpu``, the processes' CPU summed; None without a process."""
    if not pids:
        return None
    each = [_cpu(pid) for pid in pids]
    return sum(c[0] for c in each), each[0][1], each[0][2]


def run(address: str, sessions: list[str], workspaces: list[str], seconds: float,
        django: str, daemon_pid: int | None = None) -> dict:
    """The load on one daemon at ``address``: a worker per session."""
    return run_on([(address, s, w) for s, w in zip(sessions, workspaces, strict=True)],
                  seconds, django, [daemon_pid] if daemon_pid else [])


def run_on(targets: list[tuple[str, str, str]], seconds: float, django: str,
           daemon_pids: list[int]) -> dict:
    """A worker per (daemon's address, session, workspace); the parent lists the first
    daemon's sessions meanwhile. ``cpu``: the daemons' CPU together, per checkpoint."""
    from worldline.client import Client
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    start_at = time.time() + 3.0
    procs = [ctx.Process(target=_worker, args=(a, s, w, django, seconds, start_at, out))
             for a, s, w in targets]
    address = targets[0][0]
    for p in procs:
        p.start()
    list_latencies = []
    with Client(address) as client:
        while time.time() < start_at:
            time.sleep(0.01)
        end = time.monotonic() + seconds
        before = _cpus(daemon_pids)
        while time.monotonic() < end:
            t = time.perf_counter()
            client.list_sessions()
            list_latencies.append(time.perf_counter() - t)
            time.sleep(0.25)
    after = _cpus(daemon_pids)
    latencies = []
    for _ in procs:
        latencies.extend(out.get(timeout=60))
    for p in procs:
        p.join(30)
    xs = sorted(latencies)
    cpu = None
    if before and after and xs:
        daemon, busy, idle = (b - a for a, b in zip(before, after, strict=True))
        cpu = {"daemon_ms_per_checkpoint": daemon * 1000 / len(xs),
               "machine_idle": idle / max(busy + idle, 1e-9)}
    return {"count": len(xs), "seconds": seconds, "latencies": xs, "cpu": cpu,
            "p99": xs[min(len(xs) - 1, int(len(xs) * 0.99))] if xs else 0.0,
            "list_latencies": list_latencies}


def gc_pauses(before: dict[str, float], after: dict[str, float]) -> str:
    """The daemon's cycle-collector pauses between two scrapes of its metrics
    (worldline_gc_pause_seconds): how many, their total, and the bucket of the longest."""
    count, total, longest, _ = grown(before, after, "worldline_gc_pause_seconds")
    if not count:
        return "no GC pause during the load"
    return (f"{count:.0f} GC pauses during the load, {total * 1000:.0f} ms in all, the"
            f" longest ≤ {longest * 1000:g} ms")


def fsyncs(before: dict[str, float], after: dict[str, float], over: float = 0.025) -> str:
    """The metadata store's fsyncs between two scrapes (worldline_metadata_fsync_seconds),
    which every acknowledged checkpoint waits for: how many, how many took longer than
    ``over`` (a bucket bound), and the bucket of the longest; and the copies of its
    write-ahead log into the file (worldline_wal_copy_seconds), beside them."""
    count, total, longest, above = grown(before, after, "worldline_metadata_fsync_seconds",
                                         over)
    copies, _, copy_longest, _ = grown(before, after, "worldline_wal_copy_seconds")
    if not count:
        return "no metadata fsync during the load"
    return (f"{count:.0f} metadata fsyncs during the load (mean"
            f" {total / count * 1000:.2f} ms), {above:.0f} over {over * 1000:g} ms, the"
            f" longest ≤ {longest * 1000:g} ms; the log copied into the file"
            f" {copies:.0f} times, the longest ≤ {copy_longest * 1000:g} ms")


def turns(before: dict[str, float], after: dict[str, float], seconds: float) -> str:
    """The admission gate between two scrapes ``seconds`` apart (capture/admission.py):
    how many turns, the share of the time one was held, a turn's mean length and the
    CPU its thread used in it (the rest it waited: for the interpreter lock, or the
    disk), and a checkpoint's mean wait for its turn."""
    count, held, _, _ = grown(before, after, "worldline_admission_turn_seconds")
    if not count:
        return "no turn at the admission gate during the load"
    _, waited, _, _ = grown(before, after, "worldline_admission_wait_seconds")
    name = "worldline_admission_turn_cpu_seconds_total"
    cpu = after.get(name, 0.0) - before.get(name, 0.0)
    return (f"{count:.0f} turns at the admission gate, one held {held / seconds:.0%} of"
            f" the load, a turn {held / count * 1000:.2f} ms ({cpu / count * 1000:.2f} ms"
            f" of its thread's CPU), a checkpoint's wait for one {waited / count * 1000:.2f}"
            " ms")


def two_daemons(run_dir: Path, copy, django: str, seconds: float) -> dict:
    """The same load on two daemons, each on a data root of its own with four of the
    eight sessions: no cache, lock or interpreter shared between the halves. Context,
    not a target: the bound on what captures in two processes could give on this
    machine, where the daemon's captures take turns on one interpreter lock."""
    from worldline.client import Client

    from ..conftest import DaemonProcess
    daemons = [DaemonProcess(run_dir / f"load-half-{k}").start() for k in range(2)]
    try:
        targets = []
        for i in range(8):
            daemon, ws = daemons[i % 2], copy(f"load-half-ws-{i}")
            with Client(daemon.address) as client:
                targets.append((daemon.address, client.create_session(str(ws)).id, str(ws)))
        os.sync()
        return run_on(targets, seconds, django, [d.proc.pid for d in daemons])
    finally:
        for d in daemons:
            d.stop()
