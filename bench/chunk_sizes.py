"""The average chunk size against what a small change stores, and rows per GiB.

    .venv/bin/python bench/chunk_sizes.py [--mib 256] [--speed]

For each average (min a quarter, max four times): a file of random bytes with one
byte changed (five offsets) and with 4 KiB inserted in the middle, and a 100 MB SQLite
database with 3 rows updated and one inserted by `sqlite3` (five rounds): the bytes of
the new chunks as the pack stores them (zstd where it gains), the map's new pages, and
the chunks per GiB (rows of the pack, entries of the map). In-process, through the
same chunker and map code as a checkpoint (chunks.capture into a MemoryBlobStore).
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from worldline.daemon.capture import chunks  # noqa: E402
from worldline.daemon.storage.blobs import MemoryBlobStore  # noqa: E402
from worldline.daemon.storage.packs import compress_whole  # noqa: E402


def use(avg: int) -> None:
    chunks.AVG, chunks.MIN, chunks.MAX = avg, avg // 4, avg * 4
    chunks.BITS = avg.bit_length() - 1


def capture(path: Path, store: MemoryBlobStore, previous: str | None) -> str:
    fd = os.open(path, os.O_RDONLY)
    try:
        return chunks.capture(fd, os.fstat(fd).st_size, store, True, True, previous,
                              previous)
    finally:
        os.close(fd)


def added(store: MemoryBlobStore, before: set[str]) -> int:
    """Bytes the new blobs take as whole rows of the pack (pages as deltas would take
    less: this is an upper bound)."""
    return sum(len(compress_whole(store._blobs[d])[1]) for d in store._blobs
               if d not in before)


def change(path: Path, avg: int, edit, rounds: int) -> tuple[int, int]:
    """(median bytes stored per edit, chunks)."""
    use(avg)
    store = MemoryBlobStore()
    ref = capture(path, store, None)
    n = len(chunks.read_map(store, ref)[1])
    out = []
    for i in range(rounds):
        edit(path, i)
        before = set(store._blobs)
        ref = capture(path, store, ref)
        out.append(added(store, before))
    out.sort()
    return out[len(out) // 2], n


def speed(mib: int) -> None:
    """CPU time of the chunker and of each hash over ``mib`` MiB of random bytes."""
    import hashlib
    import time

    from blake3 import blake3
    from worldline.daemon._codec import cdc_cuts
    data = os.urandom(mib << 20)
    view = memoryview(data)

    def best(fn) -> float:
        out = []
        for _ in range(3):
            t = time.process_time()
            fn()
            out.append(time.process_time() - t)
        return len(data) / min(out) / 1e9
    ends = cdc_cuts(data, chunks.MIN, chunks.AVG, chunks.MAX, chunks.BITS, True)
    pairs = list(zip([0] + ends[:-1], ends, strict=True))
    cut = best(lambda: cdc_cuts(data, chunks.MIN, chunks.AVG, chunks.MAX, chunks.BITS,
                                True))
    sha = best(lambda: [hashlib.sha256(view[a:b]).digest() for a, b in pairs])
    b3 = best(lambda: [blake3(view[a:b]).digest() for a, b in pairs])
    print(f"cdc_cuts {cut:.2f} GB/s; SHA-256 {sha:.2f} GB/s; BLAKE3 {b3:.2f} GB/s"
          " (CPU time, one thread, 64 KiB chunks)")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--speed", action="store_true", help="only the hashing speeds")
    args = ap.parse_args()
    if args.speed:
        speed(args.mib)
        return 0
    work = Path(tempfile.mkdtemp(prefix="chunk-sizes-"))
    rng = random.Random(61)
    big, db = work / "big.bin", work / "app.db"
    size = args.mib << 20
    subprocess.run(["sqlite3", str(db)], check=True, text=True, input=(
        "CREATE TABLE t (id INTEGER PRIMARY KEY, v BLOB);"
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100000)"
        " INSERT INTO t SELECT i, randomblob(1000) FROM n;"))
    db_bytes = db.read_bytes()

    def one_byte(path: Path, i: int) -> None:
        with open(path, "r+b") as f:
            f.seek(rng.randrange(size))
            f.write(os.urandom(1))

    def insertion(path: Path, i: int) -> None:
        data = path.read_bytes()
        path.write_bytes(data[:size // 2] + os.urandom(4096) + data[size // 2:])

    def rows(path: Path, i: int) -> None:
        ids = ",".join(str(rng.randrange(1, 100001)) for _ in range(3))
        subprocess.run(["sqlite3", str(path)], check=True, text=True, input=(
            f"UPDATE t SET v = randomblob(1000) WHERE id IN ({ids});"
            "INSERT INTO t (v) VALUES (randomblob(200));"))

    base = os.urandom(size)
    print("avg KiB | one byte (KiB) | 4 KiB insertion (KiB) | SQLite round (KiB)"
          " | chunks per GiB")
    for avg in (16 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10):
        with open(big, "wb") as f:
            f.write(base)
        byte, n = change(big, avg, one_byte, args.rounds)
        with open(big, "wb") as f:
            f.write(base)
        ins, _ = change(big, avg, insertion, 1)
        db.write_bytes(db_bytes)
        sq, _ = change(db, avg, rows, args.rounds)
        print(f"{avg >> 10} | {byte / 1024:.0f} | {ins / 1024:.0f} | {sq / 1024:.0f}"
              f" | {n * (1 << 30) // size}")
    for p in (big, db):
        p.unlink()
    work.rmdir()
    return 0


if __name__ == "__main__":
    sys.exit(main())
