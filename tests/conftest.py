"""Shared fixtures: a real daemon process over a real Unix socket, real files."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from worldline.client import Client

from .fidelity import AGENT_UID

WORLDLINE = [sys.executable, "-m", "worldline.client.cli"]


def run_python(script: str, timeout: float) -> str:
    """Run ``script`` in a fresh interpreter (a daemon started in-process there, whose
    insides it can then look at); its standard output, once it has exited 0."""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=timeout, env={**os.environ, "WORLDLINE_LOG_LEVEL": "WARNING"})
    assert out.returncode == 0, out.stderr
    return out.stdout


_STARTED: list["DaemonProcess"] = []


class DaemonProcess:
    """A ``worldline daemon`` child process with its own data root. Every one started
    in a test session is killed at its end, even if the test that started it failed
    before it could stop it."""

    def __init__(self, root: Path, extra: list[str] | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.root = root
        self.address = f"unix://{root}/worldline.sock"
        self.extra = extra or []
        self.env = {**os.environ, "WORLDLINE_LOG_LEVEL": "WARNING", **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.log = root.parent / f"{root.name}.log"

    def start(self, wait: bool = True) -> DaemonProcess:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                WORLDLINE + ["daemon", "--root", str(self.root), *self.extra],
                stdout=subprocess.DEVNULL, stderr=log, env=self.env)
        _STARTED.append(self)
        if wait:
            self.wait_serving()
        return self

    def wait_serving(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited {self.proc.returncode}: {self.log.read_text()}")
            try:
                if self.health(timeout=1) == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.05)
        raise RuntimeError("daemon did not start serving in time")

    def health(self, timeout: float = 5.0) -> int:
        """The health service's status for the whole daemon (health_pb2's enum)."""
        with grpc.insecure_channel(self.address) as ch:
            return health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=timeout).status

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:  # its threads' stacks into its log, then fail
            self.proc.send_signal(signal.SIGABRT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:  # stopped, or deaf even to that
                self.proc.kill()
                self.proc.wait()
            self.proc = None
            raise AssertionError(f"the daemon did not stop within {timeout:.0f} s after"
                                 f" signal {sig}; its log, with every thread's stack:\n"
                                 f"{self.log.read_text()[-6000:]}") from None
        self.proc = None
        return code

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def client(self) -> Client:
        return Client(self.address)

    def cli(self, *args: str, check: bool = True, input: str | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess:
        res = subprocess.run(WORLDLINE + list(args) + ["--address", self.address],
                             capture_output=True, text=True, input=input, timeout=timeout,
                             env=self.env)
        if check and res.returncode != 0:
            raise AssertionError(f"worldline {' '.join(args)} exited {res.returncode}:"
                                 f" {res.stderr}")
        return res

    def cli_json(self, *args: str):
        return json.loads(self.cli(*args, "--json").stdout)


@pytest.fixture
def tmpfs():
    """``tmpfs(path, size, mode=None)`` mounts a file system of its own at ``path``
    (made): a disk to fill, or to remount read-only. Each is detached after the test
    (after its own ``finally``, which stops its daemon)."""
    mounted: list[Path] = []

    def mount(path: Path, size: str, mode: str | None = None) -> Path:
        path.mkdir(exist_ok=True)
        options = f"size={size}" + (f",mode={mode}" if mode else "")
        subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                       check=True)
        mounted.append(path)
        return path
    yield mount
    for path in reversed(mounted):
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def unmount_below(folder: Path) -> None:
    """Overlay forks outlive their daemon by design; tests and the bench detach theirs."""
    prefix = str(folder.resolve()) + "/"
    with open("/proc/mounts") as f:
        points = [line.split()[1].encode().decode("unicode_escape") for line in f]
    for point in sorted((p for p in points if p.startswith(prefix)), reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)


@pytest.fixture(scope="session", autouse=True)
def _no_daemon_outlives_the_tests():
    yield
    for d in _STARTED:
        if d.proc is not None and d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait(10)


@pytest.fixture(scope="session")
def base_tmp():
    path = Path(tempfile.mkdtemp(prefix="wl-test-"))
    yield path
    unmount_below(path)
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def _detach_forks(tmp_path):
    yield
    unmount_below(tmp_path)


@pytest.fixture(autouse=True)
def _umask_kept():
    """A test that changes the process's umask (a daemon started in this process sets
    0o077: start one in a fresh interpreter, ``run_python``) fails here, and the umask
    is put back, rather than later tests failing on the modes they make."""
    before = os.umask(0o022)
    os.umask(before)
    yield
    after = os.umask(before)
    assert after == before, f"the test left the umask {after:#o} (was {before:#o})"


@pytest.fixture(scope="session")
def daemon(base_tmp):
    d = DaemonProcess(base_tmp / "shared-root").start()
    yield d
    assert d.stop() == 0


@pytest.fixture
def fresh_daemon(tmp_path):
    d = DaemonProcess(tmp_path / "root")
    yield d
    if d.proc is not None:
        d.stop(signal.SIGKILL)


@pytest.fixture
def client(daemon):
    with daemon.client() as c:
        yield c


@pytest.fixture
def places(tmp_path) -> tuple[Path, Path]:
    """The random walks' agent workspace (uid 1000's) and a canary folder outside it,
    of root's but open to all (test_agent_walk)."""
    os.chmod(tmp_path, 0o755)
    ws = tmp_path / "ws"
    ws.mkdir()
    os.chown(ws, AGENT_UID, AGENT_UID)
    canary = tmp_path / "canary"
    canary.mkdir()
    (canary / "keep.txt").write_text("keep\n")
    os.chmod(canary, 0o777)  # the agent could write here, so a restore acting for it
    # on a symlink into the canary would show
    return ws, canary


@pytest.fixture
def agent_home(tmp_path) -> Path:
    """agent/proj/ws: the agent (uid 1000) owns everything from agent/ down, so it can
    swap any folder above its workspace (test_hostile, test_containers)."""
    home = tmp_path / "agent"
    ws = home / "proj" / "ws"
    ws.mkdir(parents=True)
    for p in (home, home / "proj", ws):
        os.chown(p, AGENT_UID, AGENT_UID)
    os.chmod(tmp_path, 0o755)
    return home


@pytest.fixture
def workspace(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


ONLY_FIRST = "only the first checkpoint holds this\n" * 50


def only_the_first_holds(client, ws: Path):
    """A new session over ``ws`` whose first checkpoint alone names a blob (f.txt holding
    ``ONLY_FIRST``), two checkpoints of other contents after it: (session, first)."""
    session = client.create_session(str(ws))
    (ws / "f.txt").write_text(ONLY_FIRST)
    first = session.checkpoint()
    for i in range(2):
        (ws / "f.txt").write_text(f"version {i}\n")
        session.checkpoint()
    return session, first


def tree_state(root: Path) -> dict:
    """Everything a restore must reproduce: kind, mode, bytes or link target."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            st = p.lstat()
            if p.is_symlink():
                out[rel] = ("symlink", os.readlink(p))
            elif p.is_dir():
                out[rel] = ("dir", st.st_mode & 0o7777)
            else:
                out[rel] = ("file", st.st_mode & 0o7777, p.read_bytes())
    return out


def pack_of(blob_root: Path) -> Path:
    """The SQLite file holding the pack of the blob store at ``blob_root``: its own
    ``pack.db``, or (a data root from 0.7.7 on) the ``meta.db`` beside it."""
    from worldline.daemon.storage.config import pack_file
    own = blob_root / "pack.db"
    return own if own.exists() else Path(pack_file(str(blob_root.parent)))


def stored_blobs(root: Path) -> int:
    """How many blobs a data root holds: files, and rows of the pack."""
    import sqlite3
    blobs = root / "blobs"
    files = sum(len(names) for folder, _, names in os.walk(blobs)
                if len(os.path.basename(folder)) == 2)
    db = sqlite3.connect(f"file:{pack_of(blobs)}?mode=ro", uri=True)
    try:
        return files + db.execute("SELECT count(*) FROM objects").fetchone()[0]
    finally:
        db.close()


def corrupt_blob(blob_root: Path, digest: str, data: bytes) -> None:
    """Bit rot: replace the stored bytes of a blob, a file or a row of the pack, in the
    blob store at ``blob_root`` (a data root's ``blobs`` folder)."""
    import sqlite3
    path = blob_root / digest[:2] / digest[2:]
    if path.exists():
        os.chmod(path, 0o644)
        path.write_bytes(data)
        return
    db = sqlite3.connect(pack_of(blob_root))
    try:
        with db:
            n = db.execute("UPDATE objects SET kind = 0, data = ?, size = ? WHERE digest = ?",
                           (data, len(data), bytes.fromhex(digest))).rowcount
        assert n == 1, f"blob {digest} is not stored"
    finally:
        db.close()


@pytest.fixture
def containers():
    """Names of containers a test made; each is removed when the test ends."""
    made: list[str] = []
    yield made
    for name in made:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)


def beside(call, then, after: float):
    """``call()`` on a thread of its own, and ``then()`` here ``after`` seconds into it
    (a fault point holds the call open meanwhile): what ``call`` returned, or the
    exception it raised, raised here once ``then`` has returned."""
    result: dict = {}

    def run() -> None:
        try:
            result["done"] = call()
        except BaseException as exc:  # noqa: BLE001 -- raised in the caller's thread
            result["error"] = exc
    worker = threading.Thread(target=run)
    worker.start()
    time.sleep(after)
    then()
    worker.join(60)
    if "error" in result:
        raise result["error"]
    return result["done"]


def run_together(targets) -> None:
    """Each of ``targets`` (callables) on a thread of its own, all started before any
    is joined; returns once every one has returned."""
    threads = [threading.Thread(target=t) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


# -- the fleet's services: PostgreSQL and an S3 emulator -------------------------------
@pytest.fixture(scope="session")
def pg_cluster():
    from tests.services import PostgresCluster
    cluster = PostgresCluster().start()
    yield cluster
    cluster.remove()


@pytest.fixture
def postgres_url(pg_cluster) -> str:
    """A new, empty database of the session's cluster."""
    return pg_cluster.new_database()


@pytest.fixture(scope="session")
def s3_server():
    from tests.services import S3Emulator
    server = S3Emulator().start()
    saved = {k: os.environ.get(k) for k in server.env}
    os.environ.update(server.env)
    yield server
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    server.stop()


@pytest.fixture(params=["sqlite", "postgres"])
def index(request, tmp_path):
    """A bucket's blob index, in either SQL store (the fleet's is PostgreSQL)."""
    if request.param == "postgres":
        from worldline.daemon.storage.postgres_store import PostgresStore
        store = PostgresStore(request.getfixturevalue("postgres_url"))
    else:
        from worldline.daemon.storage.sqlite_store import SqliteStore
        store = SqliteStore(str(tmp_path / "meta.db"))
    yield store
    store.close()
