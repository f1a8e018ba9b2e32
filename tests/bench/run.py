"""`make bench`: the cases of ../shared/BENCH.md, each beside its peers in the same run.

Prints a table and writes bench/results.json (median and p90 per case, the peers,
the ratios, the machine and the git revision). Peers that are missing are installed
with apt when we are root, or skipped with the reason said.

Environment: BENCH_ROUNDS (timed rounds per case, default 30), BENCH_DIR (work
folder, default bench/work), BENCH_DOCKER_COMMITS (docker commits for storage-100,
default 100), BENCH_STORAGE_ROUNDS (rounds of storage-100, default 3), BENCH_ONLY
(comma-separated case names), BENCH_BIGFILE_MB (the bigfile case's file, default
1024), BENCH_DATA (the folder holding flask-400.bundle, default ../shared/bench-data
beside the project's folder).
"""

from __future__ import annotations

import json
import os
import platform
import random
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from worldline.client import Client
from worldline.daemon.storage.config import pack_file

from ..conftest import DaemonProcess, unmount_below
from . import peers
from .trees import (
    copy_tree,
    django_tree,
    du_bytes,
    du_files,
    edit,
    growth_by_file,
    pick_files,
    wide_tree,
)

REPO = Path(__file__).resolve().parents[2]
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "30"))
STORAGE_ROUNDS = int(os.environ.get("BENCH_STORAGE_ROUNDS", "3"))
WARMUP = 3


def repack_done(root: Path) -> bool:
    """The daemon's idle repack has looked at every row of its pack and given back every
    free page (read from the pack itself, read-only)."""
    db = sqlite3.connect(f"file:{pack_file(str(root))}?mode=ro", uri=True)
    try:
        last = db.execute("SELECT max(id) FROM objects").fetchone()[0] or 0
        mark = db.execute("SELECT value FROM marks WHERE name = 'repacked'").fetchone()
        free = db.execute("PRAGMA freelist_count").fetchone()[0]
        return (mark[0] if mark else 0) >= last and free == 0
    finally:
        db.close()


def settle(root: Path | None = None, patience: float = 300.0) -> None:
    """Storage is measured with the daemon idle: its idle repack done (when ``root``, its
    data root, is given), then the SQLite write-ahead logs moved into the databases and
    truncated (main.WAL_IDLE_SECONDS), so no side counts a log at its high-water mark."""
    from worldline.daemon.main import WAL_IDLE_SECONDS
    deadline = time.monotonic() + patience
    while root is not None and not repack_done(root) and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(WAL_IDLE_SECONDS * 2.5)
    os.sync()


@dataclass
class Stat:
    median: float
    p90: float
    n: int
    unit: str = "ms"


@dataclass
class Case:
    name: str
    measured: str
    worldline: Stat | None
    peers: dict[str, Stat] = field(default_factory=dict)
    ratio: float | None = None
    ratio_of: str = ""
    target: str = ""
    ok: bool | None = None
    note: str = ""
    seconds: float | None = None  # the case's wall time, its set-up included


def stat(samples: list[float], unit: str = "ms", scale: float = 1000.0) -> Stat:
    xs = sorted(x * scale for x in samples)
    return Stat(round(statistics.median(xs), 3), round(xs[min(len(xs) - 1, int(len(xs) * 0.9))], 3),
                len(xs), unit)


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


class Bench:
    def __init__(self, work: Path) -> None:
        self.work = work
        unmount_below(work)
        shutil.rmtree(work / "run", ignore_errors=True)
        (work / "run").mkdir(parents=True)
        self.run_dir = work / "run"
        self.cache = work / "cache"
        self.django = django_tree(self.cache)
        from ..services import free_port
        self.metrics = f"127.0.0.1:{free_port()}"  # the throughput case reads its waits
        self.daemon = DaemonProcess(self.run_dir / "data",
                                    extra=["--metrics-listen", self.metrics]).start()
        self.client = Client(self.daemon.address)
        self.cases: list[Case] = []
        self.by_name: dict[str, Case] = {}

    def add(self, case: Case) -> Case:
        self.cases.append(case)
        self.by_name[case.name] = case
        print(f"  {case.name}: worldline {case.worldline}  peers {case.peers}  "
              f"ratio {case.ratio}  {'ok' if case.ok else 'MISSED' if case.ok is False else ''}"
              f" {case.note}", flush=True)
        return case

    def copy(self, name: str, src: Path | None = None) -> Path:
        return copy_tree(src or self.django, self.run_dir / name)

    # -- checkpoint-small and checkpoint-flat --------------------------------------------
    def checkpoint_case(self, name: str, tree: Path, against: str | None) -> Case:
        ws, repo = self.copy(f"{name}-wl", tree), self.copy(f"{name}-git", tree)
        peers.git_init(repo)
        session = self.client.create_session(str(ws))
        rng = random.Random(42)
        wl, git = [], []
        for i in range(WARMUP + ROUNDS):
            files = pick_files(tree, rng)
            # Untimed, before each side's edit: neither side's first flush pays for the
            # other's writes (nor, in the first round, for the setup's). git's commit
            # leaves its index and objects unsynced (9 MB of index on the wide tree), and
            # the next fsync of worldline's log wrote them out (ext4 without a journal):
            # a checkpoint on the wide tree took 23 ms after git's commit, 8.9 ms after a
            # sync (README, Benchmark).
            os.sync()
            edit(ws, files, f"{name} {i}")
            t_wl = timed(session.checkpoint)
            os.sync()
            edit(repo, files, f"{name} {i}")
            t_git = timed(lambda i=i: peers.git_commit(repo, f"{name} {i}"))
            if i >= WARMUP:
                wl.append(t_wl)
                git.append(t_git)
        self.session_small = session if against is None else getattr(self, "session_small", None)
        self.ws_small, self.repo_small = (ws, repo) if against is None else (
            self.ws_small, self.repo_small)
        wl_s, git_s = stat(wl), stat(git)
        if against is None:
            ratio = wl_s.median / git_s.median
            return self.add(Case(name, "session.checkpoint() after a 3-file edit", wl_s,
                                 {"git add -A && git commit": git_s}, round(ratio, 4),
                                 "worldline / git", "median ≤ 0.10 × git", ratio <= 0.10))
        base = self.by_name[against].worldline
        ratio = wl_s.median / base.median
        return self.add(Case(name, "the same on the 100,000-file wide tree", wl_s,
                             {"git add -A && git commit (wide)": git_s,
                              "worldline on django": base}, round(ratio, 4),
                             "wide / django", "median ≤ 1.5 × checkpoint-small",
                             ratio <= 1.5))

    # -- checkpoint-rescan ---------------------------------------------------------------
    def rescan_case(self) -> Case:
        rounds = max(5, ROUNDS // 3)
        rng = random.Random(7)
        wl, git = [], []
        for i in range(rounds):
            self.client.close()
            self.daemon.stop()
            self.daemon.start()
            self.client = Client(self.daemon.address)
            files = pick_files(self.django, rng)
            edit(self.ws_small, files, f"rescan {i}")
            edit(self.repo_small, files, f"rescan {i}")
            wl.append(timed(lambda: self.client.checkpoint(self.session_small.id)))
            git.append(timed(lambda: peers.run(["git", "status", "--porcelain"],
                                               self.repo_small)))
            peers.git_commit(self.repo_small, f"rescan {i}")
        self.session_small = self.client.get_session(self.session_small.id)  # the new client
        wl_s, git_s = stat(wl), stat(git)
        ratio = wl_s.median / git_s.median
        return self.add(Case("checkpoint-rescan", "first checkpoint after a daemon restart",
                             wl_s, {"git status": git_s}, round(ratio, 4), "worldline / git",
                             "≤ 1.5 × git status", ratio <= 1.5))

    # -- restore-small -------------------------------------------------------------------
    def restore_case(self) -> Case:
        s = self.session_small
        rng = random.Random(9)
        wl, git = [], []
        for i in range(WARMUP + ROUNDS):
            before = s.checkpoint()
            files = pick_files(self.django, rng)
            edit(self.ws_small, files, f"restore {i}")
            s.checkpoint()
            t_wl = timed(lambda before=before: s.restore(before.id))
            edit(self.repo_small, files, f"restore {i}")
            peers.git_commit(self.repo_small, f"restore {i}")
            t_git = timed(lambda: peers.run(["git", "checkout", "HEAD~1", "--", "."],
                                            self.repo_small))
            peers.git_commit(self.repo_small, f"restored {i}")
            if i >= WARMUP:
                wl.append(t_wl)
                git.append(t_git)
        wl_s, git_s = stat(wl), stat(git)
        ratio = wl_s.median / git_s.median
        return self.add(Case("restore-small", "restore to the checkpoint before the last 3 edits",
                             wl_s, {"git checkout HEAD~1 -- .": git_s}, round(ratio, 4),
                             "worldline / git", "median ≤ 0.25 × git", ratio <= 0.25))

    # -- fork ----------------------------------------------------------------------------
    def fork_case(self) -> Case:
        cp = self.session_small.checkpoint()
        rounds = max(3, ROUNDS // 6)
        wl, cp_a = [], []
        first_s = None
        for i in range(rounds + 1):
            target = self.run_dir / f"fork-{i}"
            t_wl = timed(lambda t=target, c=cp: self.client.fork(c.id, workspace=str(t)))
            dst = self.run_dir / f"cp-{i}"
            t_cp = timed(lambda d=dst: peers.run(["cp", "-a", str(self.ws_small), str(d)]))
            shutil.rmtree(dst)
            if i:
                wl.append(t_wl)
                cp_a.append(t_cp)
            else:
                first_s = stat([t_wl])
            # each fork a new checkpoint of the lineage (3 more edits): a fresh delta
            edit(self.ws_small, pick_files(self.django, random.Random(i)), f"fork {i}")
            cp = self.session_small.checkpoint()
        wl_s, cp_s = stat(wl), stat(cp_a)
        ratio = wl_s.median / cp_s.median
        from worldline.daemon.capture.views import overlay_permitted
        overlay = overlay_permitted()
        target, bound = ("median ≤ 0.05 × cp -a (overlay mounts permitted)", 0.05) if overlay \
            else ("median ≤ 0.5 × cp -a", 0.5)
        return self.add(Case("fork", "fork of a django checkpoint into a new workspace", wl_s,
                             {"cp -a": cp_s, "first fork (builds the view)": first_s},
                             round(ratio, 4), "worldline / cp -a", target, ratio <= bound,
                             "overlay mount over a read-only view" if overlay else
                             "copy from the blob store"))

    # -- storage-100 ---------------------------------------------------------------------
    def storage_round(self, n: int) -> tuple[int, int, str]:
        """One round: 100 checkpoints of 3-file edits on a fresh copy, and the same edits
        committed to git. (worldline's growth, git's growth, where worldline's went)."""
        ws, repo = self.copy(f"storage-wl-{n}"), self.copy(f"storage-git-{n}")
        peers.git_init(repo)
        peers.run(["git", "gc", "-q"], repo)
        session = self.client.create_session(str(ws))
        # The first checkpoint, as git's first commit (git_init), comes before the
        # measure: it records the whole tree, and its stat cache rows for the new copy
        # are the peer of git's index, which the objects folder does not count either.
        session.checkpoint()
        settle(self.daemon.root)
        files_before = du_files(self.daemon.root)
        git_before = du_bytes(repo / ".git" / "objects")
        rng = random.Random(100 + n)
        for i in range(100):
            files = pick_files(self.django, rng)
            edit(ws, files, f"storage {i}")
            session.checkpoint()
            edit(repo, files, f"storage {i}")
            peers.git_commit(repo, f"storage {i}")
        peers.run(["git", "gc", "-q"], repo)
        settle(self.daemon.root)
        files_after = du_files(self.daemon.root)
        wl_growth = sum(files_after.values()) - sum(files_before.values())
        git_growth = du_bytes(repo / ".git" / "objects") - git_before
        return wl_growth, git_growth, growth_by_file(files_before, files_after)

    def storage_case(self) -> Case:
        """Bytes grow by whole pages (4 KiB) of SQLite b-trees, and the idle repack may
        run between checkpoints or after: one round of 100 varies by a few pages. The
        case is the median of STORAGE_ROUNDS rounds, each round's ratio in the note."""
        rounds = sorted((self.storage_round(n) for n in range(STORAGE_ROUNDS)),
                        key=lambda r: r[0] / max(r[1], 1))
        wl_growth, git_growth, where = rounds[len(rounds) // 2]
        ratios = ", ".join(f"{w / max(g, 1):.2f}" for w, g, _ in rounds)
        where = f"rounds {ratios}; the median round grew: {where}"
        if len(rounds) > 1:
            where += f"; the largest: {rounds[-1][2]}"
        case = Case("storage-100", "bytes added to the data root by 100 checkpoints",
                    stat([float(w) for w, _, _ in rounds], "bytes", 1.0),
                    {"git objects after git gc": stat([float(g) for _, g, _ in rounds],
                                                      "bytes", 1.0)},
                    round(wl_growth / max(git_growth, 1), 2), "worldline / git",
                    "≤ 2 × git's growth; ≤ 0.01 × docker commit ×100")
        case.ok = wl_growth <= 2 * git_growth
        docker = peers.docker_commit_growth(self.django, self.run_dir)
        if isinstance(docker, str):
            case.note = f"{where}; docker peer skipped: {docker}"
        else:
            growth, commits = docker
            per_100 = growth * 100 // commits
            case.peers[f"docker commit ×{commits}" + (" (scaled to 100)" if commits != 100
                                                      else "")] = Stat(per_100, per_100, commits,
                                                                       "bytes")
            case.ok = case.ok and wl_growth <= 0.01 * per_100
            case.note = f"{where}; worldline / docker = {wl_growth / max(per_100, 1):.2g}"
        return self.add(case)

    # -- throughput ----------------------------------------------------------------------
    def throughput_case(self) -> Case:
        from . import load
        copies = [self.copy(f"load-{i}") for i in range(8)]
        sessions = [self.client.create_session(str(p)).id for p in copies]
        os.sync()
        from .metrics import scrape
        before = scrape(self.metrics)
        result = load.run(self.daemon.address, sessions, [str(p) for p in copies],
                          seconds=10.0, django=str(self.django),
                          daemon_pid=self.daemon.proc.pid)
        after = scrape(self.metrics)
        waits = (f"{load.turns(before, after, result['seconds'])};"
                 f" {load.gc_pauses(before, after)}; {load.fsyncs(before, after)}")
        lat = stat(result["latencies"])
        rate = result["count"] / result["seconds"]
        listing = stat(result["list_latencies"])
        case = Case("throughput", "8 sessions checkpointing concurrently for 10 s",
                    Stat(round(rate, 1), lat.p90, result["count"], "checkpoints/s"),
                    {"checkpoint latency": lat,
                     "p99 latency": Stat(round(result["p99"] * 1000, 3),
                                         round(result["p99"] * 1000, 3), result["count"]),
                     "session list during the load": listing},
                    None, "", "≥ 150 checkpoints/s, p99 ≤ 50 ms; session list ≤ 100 ms",
                    rate >= 150 and result["p99"] <= 0.050 and listing.p90 <= 100)
        if result["cpu"]:
            case.note = _cpu(result["cpu"]) + " during the load"
        case.note += ("; " if case.note else "") + waits
        halves = load.two_daemons(self.run_dir, self.copy, str(self.django), 10.0)
        if halves["count"]:
            rate2, p99 = halves["count"] / halves["seconds"], round(halves["p99"] * 1000, 3)
            case.peers["two daemons, four sessions each: checkpoints/s"] = Stat(
                round(rate2, 1), round(rate2, 1), halves["count"], "checkpoints/s")
            case.peers["two daemons, four sessions each: p99 latency"] = Stat(
                p99, p99, halves["count"])
            case.note += (f"; the same load on two daemons with a data root each (context:"
                          f" the bound of captures on both cores) {rate2:.1f}/s, p99"
                          f" {p99:.1f} ms, {_cpu(halves['cpu'], ',')}")
        return self.add(case)

    # -- checkpoint-sparse ---------------------------------------------------------------
    def sparse_case(self) -> Case:
        """A 20 GiB sparse file with 4 KiB of data added to the django workspace: the
        checkpoint's time beyond checkpoint-small's, the bytes it stores, and a restore
        that gives it back sparse."""
        s, ws = self.session_small, self.ws_small
        rounds = max(3, ROUNDS // 6)
        times, stored = [], []
        rng = random.Random(20)
        for i in range(rounds):
            settle(self.daemon.root)
            before = du_bytes(self.daemon.root)
            path = ws / f"disk-{i}.img"
            with open(path, "wb") as f:
                f.truncate(20 << 30)
                f.seek(rng.randrange(0, (20 << 30) - 4096))
                f.write(os.urandom(4096))
            times.append(timed(s.checkpoint))
            settle(self.daemon.root)
            stored.append(du_bytes(self.daemon.root) - before)
        cp = s.checkpoint()
        for i in range(rounds):
            os.unlink(ws / f"disk-{i}.img")
        s.restore(cp.id)
        st = os.stat(ws / "disk-0.img")
        sparse = st.st_size == 20 << 30 and st.st_blocks * 512 <= 1 << 20
        for i in range(rounds):
            os.unlink(ws / f"disk-{i}.img")
        s.checkpoint()
        wl_s = stat(times)
        base = self.by_name["checkpoint-small"].worldline
        extra_ms = wl_s.median - base.median
        worst = max(stored)
        ok = extra_ms <= 1000 and worst <= 1 << 20 and sparse
        return self.add(Case("checkpoint-sparse", "checkpoint after adding a 20 GiB sparse file"
                             " holding 4 KiB of data", wl_s,
                             {"checkpoint-small": base,
                              "bytes stored (most of any round)": Stat(worst, worst,
                                                                       len(stored), "bytes")},
                             round(extra_ms, 3), "extra ms over checkpoint-small",
                             "≤ 1 s extra; ≤ 1 MiB stored; restored sparse", ok,
                             f"restored: {st.st_blocks * 512} bytes allocated of"
                             f" {st.st_size >> 30} GiB"))

    # -- container-checkpoint ------------------------------------------------------------
    def hook_case(self) -> Case:
        from . import hook
        return self.add(hook.case(self))

    def history_case(self) -> Case:
        from . import history
        return self.add(history.case(self))

    def fleet_case(self) -> Case:
        from . import fleet
        return self.add(fleet.case(self))

    def console_case(self) -> Case:
        from . import console
        return self.add(console.case(self))

    def bigfile_case(self) -> Case:
        from . import bigfile
        return self.add(bigfile.case(self))

    def encrypted_case(self) -> Case:
        from . import encrypted
        return self.add(encrypted.case(self))

    def container_case(self) -> Case:
        from . import container
        return self.add(container.case(self))

    # -- context peers -------------------------------------------------------------------
    def context_case(self) -> Case:
        results = peers.context_peers(self.django, self.run_dir, rounds=max(3, ROUNDS // 6))
        return self.add(Case("context", "incremental backup of a 3-file edit (not a target)",
                             self.by_name["checkpoint-small"].worldline, results))

    def close(self) -> None:
        self.client.close()
        self.daemon.stop()
        unmount_below(self.work)


def _runs_on_shared_libpython() -> bool:
    """Whether this interpreter runs on a shared libpython (mapped into the process), as
    a default pyenv build does. Debian's links it into the executable, though its
    sysconfig says Py_ENABLE_SHARED (it ships the shared library too)."""
    try:
        with open("/proc/self/maps") as f:
            return any("/libpython" in line for line in f)
    except OSError:
        return bool(sysconfig.get_config_var("Py_ENABLE_SHARED"))


def machine() -> dict:
    mem = 0
    try:
        with open("/proc/meminfo") as f:
            mem = int(f.readline().split()[1]) * 1024
    except OSError:
        pass
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        pass
    return {"platform": platform.platform(), "python": platform.python_version(),
            "python_executable": os.path.realpath(sys.executable),
            "python_shared_libpython": _runs_on_shared_libpython(),
            "cpus": os.cpu_count(), "cpu": cpu, "memory_bytes": mem}


def revision() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True,
                               text=True).stdout.strip()
        return rev + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _cpu(cpu: dict, between: str = ";") -> str:
    """A load's CPU, as its case's note says it: the daemon's a checkpoint, the idle."""
    return (f"daemon CPU {cpu['daemon_ms_per_checkpoint']:.2f} ms per checkpoint{between}"
            f" the machine {cpu['machine_idle']:.0%} idle")


def fmt(s: Stat | None) -> str:
    if s is None:
        return "-"
    if s.unit == "bytes":
        return f"{s.median / 1e6:,.2f} MB"
    if s.unit not in ("ms", "checkpoints/s"):
        return f"{s.median:,.2f} {s.unit} (p90 {s.p90:,.2f})"
    if s.unit == "checkpoints/s":
        return f"{s.median:,.1f}/s"
    return f"{s.median:,.2f} ms (p90 {s.p90:,.2f})"


def table(cases: list[Case]) -> str:
    rows = ["| case | worldline | peers (same run) | ratio | target | met |",
            "|---|---|---|---|---|---|"]
    for c in cases:
        peers_txt = "<br>".join(f"{k}: {fmt(v)}" for k, v in c.peers.items()) or "-"
        ratio = f"{c.ratio:.3f} ({c.ratio_of})" if c.ratio is not None else "-"
        met = {True: "yes", False: "**no**", None: "-"}[c.ok]
        note = f" — {c.note}" if c.note else ""
        rows.append(f"| {c.name} | {fmt(c.worldline)} | {peers_txt} | {ratio} | {c.target}{note}"
                    f" | {met} |")
    return "\n".join(rows)


def main() -> int:
    work = Path(os.environ.get("BENCH_DIR", REPO / "bench" / "work"))
    only = {x for x in os.environ.get("BENCH_ONLY", "").split(",") if x}
    missing = peers.ensure_installed()
    bench = Bench(work)
    started = time.time()
    plan = [
        ("checkpoint-small", lambda: bench.checkpoint_case("checkpoint-small", bench.django, None)),
        ("checkpoint-flat", lambda: bench.checkpoint_case("checkpoint-flat",
                                                          wide_tree(bench.cache),
                                                          "checkpoint-small")),
        ("checkpoint-rescan", bench.rescan_case),
        ("restore-small", bench.restore_case),
        ("fork", bench.fork_case),
        ("checkpoint-sparse", bench.sparse_case),
        ("hook", bench.hook_case),
        ("container-checkpoint", bench.container_case),
        ("storage-100", bench.storage_case),
        ("throughput", bench.throughput_case),
        ("history-400", bench.history_case),
        ("fleet", bench.fleet_case),
        ("bigfile", bench.bigfile_case),
        ("encrypted", bench.encrypted_case),
        ("console", bench.console_case),
        ("context", bench.context_case),
    ]
    needs = {"checkpoint-flat": "checkpoint-small", "checkpoint-rescan": "checkpoint-small",
             "restore-small": "checkpoint-small", "fork": "checkpoint-small",
             "checkpoint-sparse": "checkpoint-small", "context": "checkpoint-small"}
    try:
        for name, fn in plan:
            if only and name not in only and not any(needs.get(o) == name for o in only):
                continue
            print(f"case {name} ...", flush=True)
            began, count = time.monotonic(), len(bench.cases)
            try:
                fn()
            except Exception as exc:  # one broken case must not lose the others' figures
                bench.add(Case(name, "", None, {}, None, "", "", False,
                               f"the case failed: {type(exc).__name__}: {exc}"[:300]))
            took = round(time.monotonic() - began, 1)
            for case in bench.cases[count:]:
                case.seconds = took
            print(f"  ({name} took {took:.0f} s)", flush=True)
    finally:
        bench.close()
    date = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started))
    rev = revision()
    cases = [{**asdict(c), "date": date, "git_revision": rev, "rounds": ROUNDS}
             for c in bench.cases]
    results = REPO / "bench" / "results.json"
    if only and results.exists():
        # A partial run keeps the other cases of the last file, each with its own date and
        # revision, so the file always holds the figures the README's table shows.
        old = json.loads(results.read_text())
        ran = {c["name"] for c in cases}
        kept = [{"date": old.get("date"), "git_revision": old.get("git_revision"),
                 "rounds": old.get("rounds"), **c}
                for c in old.get("cases", []) if c["name"] not in ran]
        order = [name for name, _ in plan]
        cases = sorted(kept + cases, key=lambda c: order.index(c["name"])
                       if c["name"] in order else len(order))
    out = {"date": date, "git_revision": rev, "machine": machine(), "rounds": ROUNDS,
           "skipped_peers": missing, "cases": cases}
    print()
    print(table(bench.cases))  # first: a figure that will not serialize loses no table
    results.parent.mkdir(exist_ok=True)
    results.write_text(json.dumps(out, indent=2, default=str) + "\n")
    if missing:
        print("\nskipped peers: " + "; ".join(f"{k}: {v}" for k, v in missing.items()))
    print(f"\nwritten: {results}")
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(main())
