"""The real services the fleet tests use, made and removed by the test session:
a throwaway PostgreSQL cluster (``initdb`` in a temporary folder, ``pg_ctl`` on a
Unix socket, no TCP) and moto's S3 server (an emulator) on loopback; and a relay to
a real service's Unix socket that a test can slow down or cut."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid


def _pg_bin() -> str:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(p.split("/")[4]))
    if not found:
        raise RuntimeError("no PostgreSQL server binaries: run deploy/ensure-postgres.sh")
    return os.path.dirname(found[-1])


class PostgresCluster:
    """A cluster owned by the ``postgres`` system user (initdb refuses root), trusting
    local connections, listening only on a socket in its own folder. Tests run it with
    ``fsync=off`` (nothing here must survive a power cut); the benchmark with
    ``fsync=True``, as a real server runs, so a commit costs what it costs there."""

    def __init__(self, fsync: bool = False) -> None:
        self.fsync = fsync
        self.bin = _pg_bin()
        self.user = pwd.getpwnam("postgres")
        self.dir = tempfile.mkdtemp(prefix="worldline-pg-")
        os.chown(self.dir, self.user.pw_uid, self.user.pw_gid)
        self.data = os.path.join(self.dir, "data")
        self.log = os.path.join(self.dir, "server.log")

    def _as_postgres(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["setpriv", f"--reuid={self.user.pw_uid}", f"--regid={self.user.pw_gid}",
             "--clear-groups", *args], check=check, capture_output=True, text=True,
            cwd=self.dir)

    def start(self) -> PostgresCluster:
        if not os.path.exists(self.data):
            self._as_postgres(f"{self.bin}/initdb", "-D", self.data, "-U", "postgres",
                              "--auth=trust", "-E", "UTF8", "--no-sync")
        self._as_postgres(
            f"{self.bin}/pg_ctl", "-D", self.data, "-l", self.log, "-w", "-t", "60", "-o",
            f"-c listen_addresses='' -c unix_socket_directories='{self.dir}'"
            f" -c fsync={'on' if self.fsync else 'off'} -c max_connections=200", "start")
        return self

    def stop(self, mode: str = "fast") -> None:
        self._as_postgres(f"{self.bin}/pg_ctl", "-D", self.data, "-m", mode, "-w", "stop",
                          check=False)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@/{database}?host={self.dir}"

    def new_database(self) -> str:
        import psycopg
        name = "wl_" + uuid.uuid4().hex[:12]
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def remove(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Emulator:
    """moto's server mode on loopback, in a process of its own: an S3 emulator, not a
    real S3 server. Not a thread of the caller's: the bench times calls from this
    process, and an emulator sharing its interpreter would hold the interpreter lock
    while the timed thread has its answer (up to the 5 ms switch interval), as no
    real bucket can."""

    def __init__(self) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.env = {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "testing",
                    "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                    "AWS_ALLOW_HTTP": "true"}
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 30.0) -> S3Emulator:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto's server exited {self.proc.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("moto's server did not start listening in time")

    def client(self):
        import boto3
        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id="testing", aws_secret_access_key="testing")

    def new_bucket(self) -> str:
        name = "wl-" + uuid.uuid4().hex[:12]
        self.client().create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str) -> list[str]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


class UnixRelay:
    """A Unix-socket relay from ``path`` to the real service at ``target``. It can hold
    what clients send for ``delay`` seconds (answers pass at once: a call then takes
    about ``delay`` times the round trips it makes; ``delay`` may change at any time,
    e.g. once a daemon has started), and ``cut()`` closes every connection and refuses
    new ones, as a dead or unreachable service would, until ``restore()``."""

    def __init__(self, path, target, delay: float = 0.0) -> None:
        self.target, self.delay = str(target), delay
        self.conns: list[socket.socket] = []
        self.up = True
        self.listener = socket.socket(socket.AF_UNIX)
        self.listener.bind(str(path))
        self.listener.listen(16)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.up:
                client.close()
                continue
            service = socket.socket(socket.AF_UNIX)
            service.connect(self.target)
            self.conns += [client, service]
            for src, dst, delay in ((client, service, lambda: self.delay),
                                    (service, client, None)):
                threading.Thread(target=self._pump, args=(src, dst, delay),
                                 daemon=True).start()

    @staticmethod
    def _pump(src, dst, delay) -> None:
        """Copy ``src`` to ``dst``; with ``delay`` (a function), each chunk that many
        seconds after it came (in order, by a thread of its own); close both at the
        end."""
        held: list = []
        ready = threading.Condition()

        def send(chunk: bytes) -> None:
            try:
                dst.sendall(chunk)
            except OSError:
                pass

        def sender() -> None:
            while True:
                with ready:
                    while not held:
                        ready.wait()
                    due, chunk = held.pop(0)
                if chunk is None:
                    return
                time.sleep(max(0.0, due - time.monotonic()))
                send(chunk)

        later = threading.Thread(target=sender, daemon=True) if delay else None
        if later is not None:
            later.start()
        try:
            while True:
                try:
                    chunk = src.recv(65536)
                except OSError:
                    chunk = b""
                if later is None:
                    if not chunk:
                        return
                    send(chunk)
                    continue
                with ready:
                    held.append((time.monotonic() + delay(), chunk or None))
                    ready.notify()
                if not chunk:
                    later.join()
                    return
        finally:
            for s in (src, dst):
                try:
                    s.close()
                except OSError:
                    pass

    def cut(self) -> None:
        self.up = False
        for s in self.conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.conns.clear()

    def restore(self) -> None:
        self.up = True

    def close(self) -> None:
        self.cut()
        self.listener.close()
