"""The bigfile case: a workspace holding a 1 GiB incompressible file (seeded, made once
into the cache), beside a restic repository of the same folder.

Per round one byte is changed at a random offset; then `session.checkpoint()` and
`restic backup` of the same folder are each timed (after an os.sync(), so neither pays
for the other's writeback), and the bytes each side stored are measured once the
daemon is idle. Once, 4 KiB are inserted in the middle of the file (every later byte
shifts), checkpointed and backed up the same way. Then the previous version (before
the insertion) is restored: worldline in place (`session.restore`), restic into an
empty folder (`restic restore --target`: restic 0.14 rewrites whole files in any
case), each writing the whole 1 GiB file back.

Also a 100 MB SQLite database of random rows in a workspace of its own: per round a
few rows updated by the `sqlite3` program (Python's sqlite3 in a child process where
it is missing), a checkpoint, and the bytes stored (restic's backup of it beside it,
for context).

Bytes stored by worldline: the growth of everything under its data root (`blobs/`,
`meta.db`, which holds the pack's rows, and its write-ahead log) in allocated blocks,
read once the daemon has settled (idle repack done, logs truncated; run.settle).
restic's: the growth of its repository folder, and its own `data_added`. The case has
a daemon and a data root of its own, so no other case's writes are counted.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from ..conftest import DaemonProcess
from .trees import du_bytes, du_files, growth_by_file

MIB = 1 << 20
SIZE = int(os.environ.get("BENCH_BIGFILE_MB", "1024")) * MIB
SQLITE_SIZE = 100 * 1000 * 1000
INSERT = 4096
ROW = 1000  # bytes of random payload per SQLite row
UPDATED_ROWS = 5  # rows a SQLite round updates
RESTIC_ENV = {**os.environ, "RESTIC_PASSWORD": "bench"}


def random_file(cache: Path, size: int = SIZE, seed: int = 61) -> Path:
    """``size`` seeded random bytes, made once into ``cache``."""
    target = cache / f"bigfile-{size // MIB}M-{seed}.bin"
    if target.exists():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    part = target.with_suffix(".part")
    with open(part, "wb") as f:
        for _ in range(size // (16 * MIB)):
            f.write(rng.randbytes(16 * MIB))
        f.write(rng.randbytes(size % (16 * MIB)))
    os.replace(part, target)
    return target


def sqlite_file(cache: Path, size: int = SQLITE_SIZE, seed: int = 62) -> Path:
    """A SQLite database of rows of random payload, ``size`` bytes, made once."""
    target = cache / f"bigfile-sqlite-{size // 1000000}M-{seed}.db"
    if target.exists():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    part = target.with_suffix(".part")
    part.unlink(missing_ok=True)
    rng = random.Random(seed)
    db = sqlite3.connect(part)
    try:
        db.execute("CREATE TABLE rows (id INTEGER PRIMARY KEY, payload BLOB NOT NULL)")
        with db:
            db.executemany("INSERT INTO rows (payload) VALUES (?)",
                           ((rng.randbytes(ROW),) for _ in range(size // (ROW + 40))))
    finally:
        db.close()
    os.replace(part, target)
    return target


def sqlite_rows(db: Path) -> int:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return con.execute("SELECT max(id) FROM rows").fetchone()[0]
    finally:
        con.close()


def update_rows(db: Path, ids: list[int]) -> None:
    """A few rows given new random payloads, by another process (the `sqlite3`
    program, or Python's sqlite3 where it is not installed)."""
    sql = (f"UPDATE rows SET payload = randomblob({ROW}) WHERE id IN"
           f" ({', '.join(map(str, ids))});")
    if shutil.which("sqlite3"):
        cmd = ["sqlite3", str(db), sql]
    else:
        cmd = [sys.executable, "-c", "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]);"
               " c.execute(sys.argv[2]); c.commit(); c.close()", str(db), sql]
    subprocess.run(cmd, check=True, capture_output=True)


def change_byte(path: Path, rng: random.Random) -> None:
    """One byte at a random offset made different, in place."""
    with open(path, "r+b") as f:
        f.seek(0, os.SEEK_END)
        offset = rng.randrange(f.tell())
        f.seek(offset)
        old = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([(old + 1 + rng.randrange(255)) % 256]))


def insert_middle(path: Path, data: bytes, block: int = 16 * MIB) -> None:
    """``data`` inserted at the middle of the file, in place: the second half moved up
    by len(data), back to front, then ``data`` written into the gap."""
    size = path.stat().st_size
    middle = size // 2
    with open(path, "r+b") as f:
        end = size
        while end > middle:
            start = max(middle, end - block)
            f.seek(start)
            chunk = f.read(end - start)
            f.seek(start + len(data))
            f.write(chunk)
            end = start
        f.seek(middle)
        f.write(data)


def sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


class Restic:
    """A restic repository with its cache in the work folder."""

    def __init__(self, repo: Path, cache: Path) -> None:
        self.repo, self.cache = repo, cache
        self.base = ["restic", "--repo", str(repo), "--cache-dir", str(cache)]

    def init(self) -> None:
        shutil.rmtree(self.repo, ignore_errors=True)
        subprocess.run(self.base + ["init", "-q"], env=RESTIC_ENV, check=True,
                       capture_output=True)

    def backup(self, folder: Path) -> tuple[float, dict]:
        """(seconds the whole `restic backup` took, its JSON summary)."""
        t = time.perf_counter()
        out = subprocess.run(self.base + ["backup", "--json", "--host", "bench", str(folder)],
                             env=RESTIC_ENV, check=True, capture_output=True, text=True).stdout
        took = time.perf_counter() - t
        summary = next(json.loads(line) for line in reversed(out.splitlines())
                       if '"summary"' in line)
        return took, summary

    def restore(self, snapshot: str, target: Path) -> float:
        t = time.perf_counter()
        subprocess.run(self.base + ["restore", snapshot, "--target", str(target)],
                       env=RESTIC_ENV, check=True, capture_output=True)
        return time.perf_counter() - t

    def size(self) -> int:
        return du_bytes(self.repo)


def case(bench):
    from .run import ROUNDS, Case, Stat, settle, stat, timed

    started = time.monotonic()
    what = f"session.checkpoint() after one byte changed in a {SIZE // MIB} MiB random file"
    target = ("checkpoint median ≤ 0.5 × restic backup; stored ≤ 1 MiB per one-byte change,"
              " ≤ 2 MiB per insertion, ≤ 1 MiB per SQLite round; restore ≤ 1 × restic restore")
    if shutil.which("restic") is None:  # its peer: the run's skipped_peers says why
        return Case("bigfile", what, None, {}, None, "", target, None,
                    "skipped: restic (the peer) is not installed")
    # Each round reads the whole GiB on both sides (restic's backup takes seconds), and
    # each restore writes it: 6 rounds and 2 restores at the default 30.
    rounds = max(3, ROUNDS // 5)
    restores = max(1, min(2, ROUNDS // 15))
    run = bench.run_dir.resolve()  # restic restores under the absolute path
    t = time.monotonic()
    source, db_source = random_file(bench.cache), sqlite_file(bench.cache)
    made = time.monotonic() - t
    ws, ws_sql = run / "bigfile-ws", run / "bigfile-sqlite-ws"
    for folder in (ws, ws_sql):
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
    big, db = ws / "data.bin", ws_sql / "rows.db"
    shutil.copyfile(source, big)
    shutil.copyfile(db_source, db)
    root = run / "bigfile-data"
    shutil.rmtree(root, ignore_errors=True)
    restic = Restic(run / "bigfile-restic", run / "bigfile-restic-cache")
    daemon = DaemonProcess(root).start()
    try:
        with daemon.client() as client:
            # The first checkpoint and the first backup record the whole file: untimed.
            t = time.monotonic()
            session, session_sql = (client.create_session(str(ws)),
                                    client.create_session(str(ws_sql)))
            session.checkpoint()
            session_sql.checkpoint()
            wl_first = time.monotonic() - t
            t = time.monotonic()
            restic.init()
            restic.backup(ws)
            restic.backup(ws_sql)
            restic_first = time.monotonic() - t

            def measured(session, folder: Path, change) -> tuple:
                """After ``change``: (checkpoint s, backup s, worldline's bytes stored,
                restic's repository growth, its data_added, where worldline's went,
                the backup's summary)."""
                settle(root)
                wl_before, restic_before = du_files(root), restic.size()
                change()
                os.sync()
                t_wl = timed(session.checkpoint)
                os.sync()
                t_restic, summary = restic.backup(folder)
                settle(root)
                wl_after = du_files(root)
                return (t_wl, t_restic, sum(wl_after.values()) - sum(wl_before.values()),
                        restic.size() - restic_before, summary["data_added"],
                        growth_by_file(wl_before, wl_after), summary)

            rng = random.Random(61)
            byte_rounds = [measured(session, ws, lambda: change_byte(big, rng))
                           for _ in range(rounds)]
            before_insert = session.head
            snapshot_before = byte_rounds[-1][6]["snapshot_id"]
            want = sha256(big)
            inserted = measured(session, ws, lambda: insert_middle(big, rng.randbytes(INSERT)))
            after_insert = session.head

            # the previous version restored: worldline in place, restic into an empty folder
            wl_restore, restic_restore, wrong = [], [], []
            for i in range(restores):
                os.sync()
                wl_restore.append(timed(lambda: session.restore(before_insert)))
                if i == 0 and sha256(big) != want:
                    wrong.append("worldline")
                session.restore(after_insert)
                into = run / f"bigfile-restic-restore-{i}"
                os.sync()
                restic_restore.append(restic.restore(snapshot_before, into))
                if i == 0 and sha256(into / big.relative_to("/")) != want:
                    wrong.append("restic")
                shutil.rmtree(into)

            rows = sqlite_rows(db)
            sql_rounds = [measured(session_sql, ws_sql, lambda: update_rows(
                db, rng.sample(range(1, rows + 1), UPDATED_ROWS))) for _ in range(rounds)]
    finally:
        daemon.stop()
        # some GiB of data root and repository: not left for the next case's disk
        for path in (root, restic.repo, restic.cache, ws, ws_sql):
            shutil.rmtree(path, ignore_errors=True)

    wl_s, restic_s = stat([r[0] for r in byte_rounds]), stat([r[1] for r in byte_rounds])
    stored = stat([r[2] for r in byte_rounds], "bytes", 1.0)
    restic_grew = stat([r[3] for r in byte_rounds], "bytes", 1.0)
    restic_added = stat([r[4] for r in byte_rounds], "bytes", 1.0)
    sql_stored = stat([r[2] for r in sql_rounds], "bytes", 1.0)
    sql_restic = stat([r[3] for r in sql_rounds], "bytes", 1.0)
    sql_ck = stat([r[0] for r in sql_rounds])
    wl_rs, restic_rs = stat(wl_restore), stat(restic_restore)
    ratio = wl_s.median / restic_s.median
    restore_ratio = wl_rs.median / restic_rs.median
    checks = {
        f"checkpoint {ratio:.2f} × restic backup (≤ 0.5)": ratio <= 0.5,
        f"stored per one-byte change {stored.median / MIB:.2f} MiB (≤ 1 MiB)":
            stored.median <= MIB,
        f"per 4 KiB insertion {inserted[2] / MIB:.2f} MiB (≤ 2 MiB)": inserted[2] <= 2 * MIB,
        f"per SQLite round {sql_stored.median / MIB:.2f} MiB (≤ 1 MiB)":
            sql_stored.median <= MIB,
        f"restore {restore_ratio:.2f} × restic restore (≤ 1)": restore_ratio <= 1.0,
        "restored files equal the previous version" + (
            "" if not wrong else f": {', '.join(wrong)} DIFFER"): not wrong,
    }
    note = ("; ".join(f"{k} {'ok' if v else 'MISSED'}" for k, v in checks.items())
            + f". {rounds} rounds of a one-byte change in a {SIZE / MIB:.0f} MiB random file,"
            f" {restores} restores, {rounds} SQLite rounds of {UPDATED_ROWS} rows updated in a"
            f" {db_source.stat().st_size / 1e6:.0f} MB database."
            f" Stored: the growth of the whole data root (blobs/, meta.db with the pack's"
            f" rows, its WAL) in allocated blocks once the daemon settled; most of any"
            f" one-byte round {max(r[2] for r in byte_rounds) / MIB:.2f} MiB, the last"
            f" one grew: {byte_rounds[-1][5]}; the insertion: {inserted[5]}."
            f" restic's stored: its repository's growth ({restic_grew.median / MIB:.2f} MiB"
            f" a one-byte round, {inserted[3] / MIB:.2f} MiB the insertion; its data_added"
            f" {restic_added.median / MIB:.2f} and {inserted[4] / MIB:.2f} MiB)."
            f" Restore: worldline in place over the file with the insertion, restic into an"
            f" empty folder, each writing the whole file (restic 0.14 rewrites whole"
            f" files); both read checked once by SHA-256."
            f" Untimed set-up: the first checkpoints {wl_first:.1f} s, restic init and first"
            f" backups {restic_first:.1f} s, cached inputs made in {made:.1f} s; the case"
            f" took {time.monotonic() - started:.0f} s. Shared 2-core machine: noisy.")
    return Case("bigfile", what, wl_s,
                {"restic backup of the same change": restic_s,
                 "worldline: stored per one-byte change": stored,
                 "restic: repository growth per one-byte change": restic_grew,
                 "worldline: checkpoint after 4 KiB inserted in the middle":
                     stat([inserted[0]]),
                 "restic: backup after the insertion": stat([inserted[1]]),
                 "worldline: stored per 4 KiB insertion": Stat(inserted[2], inserted[2], 1,
                                                               "bytes"),
                 "restic: repository growth per insertion": Stat(inserted[3], inserted[3], 1,
                                                                 "bytes"),
                 "worldline: restore of the previous version, in place": wl_rs,
                 "restic restore of it into an empty folder": restic_rs,
                 "worldline: checkpoint after a SQLite round": sql_ck,
                 "worldline: stored per SQLite round": sql_stored,
                 "restic: repository growth per SQLite round": sql_restic},
                round(ratio, 4), "worldline / restic backup", target, all(checks.values()),
                note)
