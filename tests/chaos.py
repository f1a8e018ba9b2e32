"""Chaos for reliability tests and `make soak`: sessions under a load of checkpoints,
restores, forks and gc while the daemon is killed with SIGKILL now and then; then a
check that every acknowledged checkpoint still restores byte for byte."""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from worldline.client import Aborted, FailedPrecondition, Unavailable

from .conftest import DaemonProcess, tree_state


def fingerprint(ws: Path) -> str:
    """A digest of everything a restore must reproduce (kinds, modes, bytes, link
    targets): comparing digests is comparing byte for byte, without keeping every
    version of every file in memory for the length of a soak."""
    import hashlib
    return hashlib.sha256(repr(sorted(tree_state(ws).items())).encode()).hexdigest()


@dataclass
class ChaosReport:
    kills: int = 0
    ops: dict[str, int] = field(default_factory=dict)
    acknowledged: list[dict[str, str]] = field(default_factory=list)  # checkpoint -> fingerprint
    failures: list[BaseException] = field(default_factory=list)
    verified: int = 0
    pruned_skipped: int = 0
    fsck_problems: list[str] = field(default_factory=list)

    def count(self, op: str) -> None:
        self.ops[op] = self.ops.get(op, 0) + 1


def seed_workspace(ws: Path, files: int = 20) -> None:
    for i in range(files):
        p = ws / f"d{i % 4}" / f"f{i}.txt"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f"seed {i}\n" * (i + 1))


def _worker(d: DaemonProcess, n: int, ws: Path, sid: str, stop: threading.Event,
            report: ChaosReport, forks: bool, lock: threading.Lock) -> None:
    r = random.Random(n)
    mine = report.acknowledged[n]
    while not stop.is_set():
        try:
            with d.client() as c:
                while not stop.is_set():
                    for _ in range(r.randint(1, 3)):
                        p = ws / f"d{r.randrange(4)}" / f"f{r.randrange(30)}.txt"
                        p.parent.mkdir(parents=True, exist_ok=True)
                        p.write_text(f"{r.random()}\n" * r.randint(1, 50))
                    state = fingerprint(ws)
                    roll = r.random()
                    if mine and roll < 0.15:
                        target = _pick(r, mine)
                        res = c.restore(sid, target, acknowledge_side_effects=True)
                        with lock:
                            mine[res.checkpoint.id] = mine[target]
                            report.count("restore")
                    elif forks and mine and roll < 0.18:
                        c.fork(_pick(r, mine))
                        with lock:
                            report.count("fork")
                    else:
                        cp = c.checkpoint(sid)
                        with lock:
                            mine[cp.id] = state
                            report.count("checkpoint")
        except Aborted:
            time.sleep(0.05)  # a restore raced: try again
        except Unavailable:
            # The daemon is down. A restore it was applying is completed when it starts
            # again, so the workspace is not touched until it answers (an agent that
            # wrote meanwhile would race the restore it asked for).
            _wait_until_up(d, stop)
        except FailedPrecondition as exc:
            if "pruned" not in str(exc):  # a restore or fork of a checkpoint gc pruned
                report.failures.append(exc)
                return
            with lock:
                report.count("refused: pruned")
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            report.failures.append(exc)
            return


RECENT = 40  # below the soak's --keep-last 50


def _pick(r: random.Random, mine: dict[str, str]) -> str:
    """A checkpoint to restore or fork: mostly one of the last ``RECENT`` (which
    retention keeps, so the restore runs, and may race gc pruning it), now and then any."""
    ids = list(mine)
    return r.choice(ids[-RECENT:] if r.random() < 0.8 else ids)


def _wait_until_up(d: DaemonProcess, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            with d.client() as c:
                c.list_sessions()
            return
        except Unavailable:
            time.sleep(0.05)


def _collector(d: DaemonProcess, stop: threading.Event, report: ChaosReport,
               lock: threading.Lock, every: float) -> None:
    while not stop.wait(every):
        try:
            with d.client() as c:
                c.gc(keep_last=50)
            with lock:
                report.count("gc")
        except Unavailable:
            continue
        except BaseException as exc:  # noqa: BLE001
            report.failures.append(exc)
            return


def run(d: DaemonProcess, workspaces: list[Path], seconds: float, kill_every: tuple[float, float],
        rng: random.Random, forks: bool = False, gc_every: float = 0.0,
        verify_sample: int = 25) -> ChaosReport:
    report = ChaosReport(acknowledged=[{} for _ in workspaces])
    with d.client() as c:
        sessions = [c.create_session(str(ws)).id for ws in workspaces]
    stop, lock = threading.Event(), threading.Lock()
    threads = [threading.Thread(target=_worker, args=(d, n, ws, sid, stop, report, forks, lock))
               for n, (ws, sid) in enumerate(zip(workspaces, sessions, strict=True))]
    if gc_every:
        threads.append(threading.Thread(target=_collector, args=(d, stop, report, lock,
                                                                 gc_every)))
    for t in threads:
        t.start()
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline and not report.failures:
            time.sleep(min(rng.uniform(*kill_every), max(0.0, deadline - time.monotonic())))
            if time.monotonic() >= deadline:
                break
            d.kill()
            report.kills += 1
            d.start()
        time.sleep(0.3)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    if report.failures:
        return report
    with d.client() as c:
        fsck = c.fsck()
        report.fsck_problems = list(fsck["problems"]) + (
            [] if c.verify_audit()["ok"] else ["the audit chain is broken"])
        for n, sid in enumerate(sessions):
            pruned = {cp.id for cp in c.log(sid) if cp.pruned}
            picks = [(k, v) for k, v in report.acknowledged[n].items() if k not in pruned]
            report.pruned_skipped += len(report.acknowledged[n]) - len(picks)
            for cp_id, state in rng.sample(picks, min(verify_sample, len(picks))):
                c.restore(sid, cp_id, acknowledge_side_effects=True)
                if fingerprint(workspaces[n]) != state:
                    report.fsck_problems.append(f"checkpoint {cp_id} did not restore exactly")
                else:
                    report.verified += 1
    return report
