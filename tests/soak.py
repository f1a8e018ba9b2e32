"""`make soak`: checkpoints, restores, forks and gc on several sessions for a while
(SOAK_MINUTES, default 20), the daemon killed with SIGKILL every 20-60 s; at the end
every acknowledged checkpoint that retention kept is restored and compared."""

from __future__ import annotations

import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

from . import chaos
from .conftest import DaemonProcess, unmount_below


def main() -> int:
    minutes = float(os.environ.get("SOAK_MINUTES", "20"))
    sessions = int(os.environ.get("SOAK_SESSIONS", "4"))
    seed = int(os.environ.get("SOAK_SEED", str(int(time.time()))))
    base = Path(tempfile.mkdtemp(prefix="wl-soak-"))
    print(f"soak: {minutes} min, {sessions} sessions, seed {seed}, in {base}", flush=True)
    d = DaemonProcess(base / "root", extra=["--gc-grace", "30"]).start()
    workspaces = []
    for n in range(sessions):
        ws = base / f"ws{n}"
        ws.mkdir()
        chaos.seed_workspace(ws, files=200)
        workspaces.append(ws)
    started = time.monotonic()
    try:
        report = chaos.run(d, workspaces, seconds=minutes * 60, kill_every=(20.0, 60.0),
                           rng=random.Random(seed), forks=True, gc_every=30.0,
                           verify_sample=200)
    finally:
        d.stop()
        unmount_below(base)
    elapsed = time.monotonic() - started
    acknowledged = sum(len(a) for a in report.acknowledged)
    print(f"soak: {elapsed / 60:.1f} min, {report.kills} kills, operations {report.ops}")
    print(f"soak: {acknowledged} checkpoints acknowledged; {report.verified} restored and"
          f" compared byte for byte; {report.pruned_skipped} pruned by retention (not checked)")
    problems = [repr(f) for f in report.failures] + report.fsck_problems
    for p in problems:
        print(f"soak: PROBLEM {p}")
    print(f"soak: {report.verified} passed, {len(problems)} failed")
    if not problems:
        shutil.rmtree(base, ignore_errors=True)
        print("soak: nothing was lost")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
