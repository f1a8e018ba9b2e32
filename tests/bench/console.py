"""The console case: the server time of the pages an operator opens first, on a data
root of realistic size (BENCH.md: sessions and a timeline ≤ 300 ms, a diff ≤ 1 s).

Server time is the console's own ``Server-Timing`` header (the daemon's calls and the
rendering), read from a real `worldline console` process over HTTP."""

from __future__ import annotations

import random
import shutil
import statistics
import subprocess
import urllib.parse
import urllib.request

from ..conftest import WORLDLINE, DaemonProcess, unmount_below
from .trees import copy_tree, edit, pick_files

SESSIONS = 1000
CHECKPOINTS = 10_000
CHANGED = 300
ROUNDS = 15


def _server_ms(base: str, token: str, path: str) -> float:
    request = urllib.request.Request(base + path,
                                     headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=120) as r:
        r.read()
        assert r.status == 200, (path, r.status)
        timing = r.headers["Server-Timing"]
    return float(timing.split("dur=")[1])


def case(bench):
    from .run import Case, Stat

    root = bench.run_dir / "console-data"
    spaces = bench.run_dir / "console-ws"
    shutil.rmtree(spaces, ignore_errors=True)
    spaces.mkdir()
    daemon = DaemonProcess(root).start()
    console = None
    try:
        with daemon.client() as c:
            for i in range(SESSIONS - 2):
                ws = spaces / f"s{i:04d}"
                ws.mkdir()
                c.create_session(str(ws), name=f"session-{i}")
            long_ws = spaces / "long"
            long_ws.mkdir()
            long = c.create_session(str(long_ws), name="ten-thousand")
            for i in range(CHECKPOINTS - 1):
                (long_ws / "f.txt").write_text(f"{i}\n")
                c.record_tool_call(long.id, "Bash", {"command": f"echo {i} > f.txt"})
                c.checkpoint(long.id)
            django = copy_tree(bench.django, bench.run_dir / "console-django")
            big = c.create_session(str(django), name="django")
            before = c.checkpoint(big.id)
            edit(django, pick_files(django, random.Random(60), count=CHANGED), "console")
            after = c.checkpoint(big.id)
        log = bench.run_dir / "console.log"
        with open(log, "ab") as err:
            console = subprocess.Popen([*WORLDLINE, "--address", daemon.address, "console"],
                                       stdout=subprocess.PIPE, stderr=err, text=True)
        url = urllib.parse.urlsplit(console.stdout.readline().strip())
        base, token = f"{url.scheme}://{url.netloc}", urllib.parse.parse_qs(url.query)["token"][0]
        pages = {"sessions": "/", "timeline": f"/s/{long.id}",
                 "diff": f"/diff?from={before.id}&to={after.id}"}
        times: dict[str, list[float]] = {k: [] for k in pages}
        for _ in range(2):  # warm: the daemon's caches, the templates compiled
            for path in pages.values():
                _server_ms(base, token, path)
        for _ in range(ROUNDS):
            for name, path in pages.items():
                times[name].append(_server_ms(base, token, path))
    finally:
        if console is not None:
            console.terminate()
            console.wait(timeout=30)
        daemon.stop()
        unmount_below(bench.run_dir / "console-data")
    stats = {k: Stat(round(statistics.median(v), 1), round(sorted(v)[int(len(v) * 0.9)], 1),
                     len(v)) for k, v in times.items()}
    limits = {"sessions": 300.0, "timeline": 300.0, "diff": 1000.0}
    ok = all(stats[k].median <= limits[k] for k in limits)
    worst = max(limits, key=lambda k: stats[k].median / limits[k])
    note = "; ".join(f"{k} {stats[k].median:.0f} ms (≤ {limits[k]:.0f})" for k in limits)
    return Case("console", f"server time: sessions page ({SESSIONS} sessions), timeline"
                f" ({CHECKPOINTS} checkpoints), diff ({CHANGED} files of django)",
                stats[worst], {f"{k} page": v for k, v in stats.items()},
                round(stats[worst].median / limits[worst], 3), f"{worst} / its limit",
                "sessions, timeline ≤ 300 ms; diff ≤ 1 s (median)", ok, note)

