"""The container-checkpoint case: a session whose container holds django in its
writable layer; a 3-file edit inside the container, then a checkpoint, beside a
`docker commit` of the same container."""

from __future__ import annotations

import random
import subprocess
import time

IMAGE = "worldline/busybox:latest"


def _docker(*args: str) -> str:
    return subprocess.run(["docker", *args], check=True, capture_output=True,
                          text=True).stdout


def case(bench):
    from .run import ROUNDS, WARMUP, Case, stat
    from .trees import pick_files
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        return Case("container-checkpoint", "checkpoint of a container holding django", None,
                    {}, None, "", "median ≤ 0.05 × docker commit", None,
                    "skipped: no Docker engine answers (make docker starts one)")
    ws = bench.run_dir / "container-ws"
    ws.mkdir()
    session = bench.client.create_session(str(ws), image=IMAGE)
    name = session.container
    try:
        _docker("cp", str(bench.django), f"{name}:/work/django")
        session.checkpoint()  # the first capture reads the whole layer once
        rng = random.Random(11)
        wl, commit = [], []
        rounds = max(5, ROUNDS // 3)
        for i in range(WARMUP + rounds):
            files = pick_files(bench.django, rng)
            script = "; ".join(f"echo '# c{i}' >> '/work/django/{f}'" for f in files)
            _docker("exec", name, "sh", "-c", script)
            t = time.perf_counter()
            session.checkpoint()
            t_wl = time.perf_counter() - t
            t = time.perf_counter()
            _docker("commit", name, f"wl-bench-commit:{i}")
            t_commit = time.perf_counter() - t
            _docker("rmi", f"wl-bench-commit:{i}")
            if i >= WARMUP:
                wl.append(t_wl)
                commit.append(t_commit)
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)
    wl_s, commit_s = stat(wl), stat(commit)
    ratio = wl_s.median / commit_s.median
    return Case("container-checkpoint", "checkpoint after a 3-file edit inside a container"
                " holding django in its writable layer (paused while read)", wl_s,
                {"docker commit": commit_s}, round(ratio, 4), "worldline / docker commit",
                "median ≤ 0.05 × docker commit", ratio <= 0.05)
