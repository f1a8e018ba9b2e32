"""Measure a big file's checkpoints, stored bytes and restores, beside restic's.

    .venv/bin/python bench/bigfile.py [--size-mib 1024] [--rounds 5] [--work DIR]

A file of random bytes in a workspace: a first checkpoint, then rounds of one byte
changed at a random offset, then 4 KiB inserted in the middle, each checkpointed by a
daemon and backed up by `restic backup` (restic 0.14's defaults) of the same folder;
then the previous version restored by each. Then a 100 MB SQLite database updated by
`sqlite3` (a few rows a round). Bytes stored: the blob store's (pack rows and blob
files) for worldline, the repository's for restic. docs/big-files.md has the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.conftest import DaemonProcess, pack_of  # noqa: E402

MiB = 1 << 20


def stored(root: Path) -> int:
    """Bytes of the blob store: the pack's rows and the blob files."""
    blobs = root / "blobs"
    files = sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(blobs)
                if len(os.path.basename(d)) == 2 for n in names)
    db = sqlite3.connect(f"file:{pack_of(blobs)}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT coalesce(sum(length(data)), 0) FROM objects").fetchone()[0]
    finally:
        db.close()
    return files + rows


def du(path: Path) -> int:
    return int(subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True,
                              check=True).stdout.split()[0])


class Restic:
    def __init__(self, repo: Path) -> None:
        self.repo = repo
        self.env = {**os.environ, "RESTIC_REPOSITORY": str(repo), "RESTIC_PASSWORD": "bench",
                    "RESTIC_CACHE_DIR": str(repo.parent / "restic-cache")}
        subprocess.run(["restic", "init", "-q"], env=self.env, check=True)

    def backup(self, folder: Path) -> tuple[float, int, str]:
        before = du(self.repo)
        t = time.perf_counter()
        out = subprocess.run(["restic", "backup", "-q", "--json", str(folder)], env=self.env,
                             check=True, capture_output=True, text=True).stdout
        took = time.perf_counter() - t
        snap = [json.loads(li) for li in out.splitlines() if '"summary"' in li][-1]
        return took, du(self.repo) - before, snap["snapshot_id"]

    def restore(self, snapshot: str, target: Path) -> float:
        shutil.rmtree(target, ignore_errors=True)
        t = time.perf_counter()
        subprocess.run(["restic", "restore", "-q", snapshot, "--target", str(target)],
                       env=self.env, check=True)
        return time.perf_counter() - t


def drop_nothing() -> None:
    os.sync()


def round_of(session, d: DaemonProcess, restic: Restic, ws: Path) -> dict:
    drop_nothing()
    before = stored(d.root)
    t = time.perf_counter()
    cp = session.checkpoint()
    took = time.perf_counter() - t
    wl = stored(d.root) - before
    r_took, r_bytes, snap = restic.backup(ws)
    return {"checkpoint_s": round(took, 3), "stored": wl, "restic_s": round(r_took, 3),
            "restic_stored": r_bytes, "cp": cp.id, "snap": snap}


def bigfile(work: Path, size: int, rounds: int) -> dict:
    ws = work / "ws"
    ws.mkdir(parents=True)
    big = ws / "big.bin"
    rng = random.Random(61)
    with open(big, "wb") as f:
        for _ in range(size // (64 * MiB)):
            f.write(os.urandom(64 * MiB))
    d = DaemonProcess(work / "root").start()
    restic = Restic(work / "restic")
    out: dict = {"size": size}
    try:
        with d.client() as c:
            s = c.create_session(str(ws))
            out["first"] = round_of(s, d, restic, ws)
            out["byte"] = []
            for _ in range(rounds):
                with open(big, "r+b") as f:
                    at = rng.randrange(size)
                    f.seek(at)
                    old = f.read(1)
                    f.seek(at)
                    f.write(bytes([old[0] ^ 0xFF]))
                out["byte"].append(round_of(s, d, restic, ws))
            data = big.read_bytes()
            mid = size // 2
            big.write_bytes(data[:mid] + os.urandom(4096) + data[mid:])
            del data
            out["insert"] = round_of(s, d, restic, ws)
            previous = out["byte"][-1]
            t = time.perf_counter()
            s.restore(previous["cp"])
            out["restore_s"] = round(time.perf_counter() - t, 3)
            out["restic_restore_s"] = round(restic.restore(previous["snap"],
                                                           work / "restic-target"), 3)
            out["data_root_du"] = du(d.root)
            out["restic_repo_du"] = du(restic.repo)
    finally:
        d.stop()
    return out


def sqlite_case(work: Path, rounds: int) -> dict:
    ws = work / "db-ws"
    ws.mkdir(parents=True)
    db = ws / "app.db"
    subprocess.run(["sqlite3", str(db)], check=True, text=True, input=(
        "CREATE TABLE t (id INTEGER PRIMARY KEY, v BLOB);"
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100000)"
        " INSERT INTO t SELECT i, randomblob(1000) FROM n;"))
    d = DaemonProcess(work / "db-root").start()
    restic = Restic(work / "db-restic")
    out: dict = {"size": db.stat().st_size, "rounds": []}
    rng = random.Random(3)
    try:
        with d.client() as c:
            s = c.create_session(str(ws))
            out["first"] = round_of(s, d, restic, ws)
            for _ in range(rounds):
                ids = ",".join(str(rng.randrange(1, 100001)) for _ in range(3))
                subprocess.run(["sqlite3", str(db)], check=True, text=True, input=(
                    f"UPDATE t SET v = randomblob(1000) WHERE id IN ({ids});"
                    f"INSERT INTO t (v) VALUES (randomblob(200));"))
                out["rounds"].append(round_of(s, d, restic, ws))
    finally:
        d.stop()
    return out


def summary(rows: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in rows)
            for k in ("checkpoint_s", "stored", "restic_s", "restic_stored")}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--work", default="/tmp/bigfile-bench")
    ap.add_argument("--only", choices=("bigfile", "sqlite"), default=None)
    args = ap.parse_args()
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    result = {}
    if args.only in (None, "bigfile"):
        big = bigfile(work, args.size_mib * MiB, args.rounds)
        big["byte_median"] = summary(big["byte"])
        result["bigfile"] = big
    if args.only in (None, "sqlite"):
        sq = sqlite_case(work, args.rounds)
        sq["median"] = summary(sq["rounds"])
        result["sqlite"] = sq
    print(json.dumps(result, indent=1))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
