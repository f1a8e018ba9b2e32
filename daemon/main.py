"""``worldline daemon``: run the daemon in the foreground until SIGTERM or SIGINT.

Start-up order: take the data root's lock (a second daemon on the same root or
socket refuses to start), open the stores, clear temporaries a crash left, load
the policy (a malformed policy file stops the start), then bind the socket
owner-only in an owner-only folder and serve.
"""

from __future__ import annotations

import errno
import faulthandler
import fcntl
import gc
import logging
import os
import resource
import shutil
import signal
import sqlite3
import sys
import threading
import time
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from worldline.v1 import worldline_pb2 as pb
from worldline.v1 import worldline_pb2_grpc as pb_grpc
from worldline.wire.address import default_address, default_root, unix_path
from worldline.wire.errors import Aborted, InvalidArgument, WorldlineError
from worldline.wire.frames import MAX_MESSAGE
from worldline.wire.policy import Policy

from .capture import walk
from .capture.containers import Engine, StartWatch
from .capture.limits import Limits
from .capture.statcache import StatCache
from .capture.tracker import ChangeMonitor
from .capture.trees import TreeReader, files_named
from .capture.views import Views
from .edge.auth import PeerRelay, TokenInterceptor, read_token
from .edge.callers import Rules
from .edge.gateway import SUFFIX as GATEWAY_SUFFIX
from .edge.gateway import Gateway
from .edge.graph_server import GraphsServicer
from .edge.limits import GRPC_WORKERS, MAX_STREAMS, RELAY_WORKERS, EdgeLimits
from .edge.metrics import MetricsInterceptor
from .edge.server import ErrorInterceptor, WorldlineServicer
from .fleet import Leases
from .gates import Gates
from .graphs import Graphs
from .notify import Notifier
from .observe import ACTIVITY, PENDING_APPROVALS, JsonFormatter, watch_gc
from .storage import reserve
from .storage.config import StorageConfig
from .storage.repack import Repacker
from .storage.sqlite_store import left_open
from .world import World

log = logging.getLogger("worldline.daemon")

SERVICE = pb.DESCRIPTOR.services_by_name["Worldline"].full_name
GRAPHS_SERVICE = pb.DESCRIPTOR.services_by_name["Graphs"].full_name
WAL_IDLE_SECONDS = 1.0
REPACK_IDLE_SECONDS = 2.0  # no checkpoint for this long: the idle repack may run
REPACK_STEP_SECONDS = 0.8  # then works in slices this long, between housekeeping
CONSOLIDATE_REST = 10.0  # no call for this long: a fleet host rewrites its bucket packs
CONSOLIDATE_EVERY = 10.0  # seconds between looks for them while it rests
FLUSH_RETRY = 10.0  # seconds before a host tries again to move its staged blobs
STOP_MOVE_SECONDS = 5.0  # a stopping host waits this long, at most, to move them
RELAYED_SUFFIX = ".agents"  # the relay's peers' gRPC server, the daemon's uid's alone
GC_YOUNG = 20_000  # allocations between young collections of the cycle collector (start)


class StartupError(Exception):
    """The daemon cannot start; the message says why and what to do."""


def _lock(path: str, what: str) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            holder = ""
            try:
                with open(path) as f:
                    holder = f.read().strip()
            except OSError:
                pass
            pid = f" (pid {holder})" if holder else ""
            raise StartupError(f"another worldline daemon{pid} already holds {what}") from None
        raise
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    return fd


def _listen_private(server: grpc.Server, path: str) -> None:
    """``server`` on a Unix socket at ``path`` that only the daemon's uid may reach."""
    if os.path.lexists(path):
        os.unlink(path)  # stale: we hold the lock, so no daemon serves it
    old_umask = os.umask(0o177)
    try:
        server.add_insecure_port(f"unix://{path}")
    except RuntimeError as exc:
        raise StartupError(f"cannot listen on unix://{path}: {exc}") from None
    finally:
        os.umask(old_umask)
    os.chmod(path, 0o600)


def _raise_open_files() -> None:
    """The soft limit of open descriptors as high as the hard one allows (up to 65,536):
    the gateway's and the relay's connections take one or two each (limits.py), on
    top of the stores' and the change tracker's."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


class Daemon:
    def __init__(self, root: str, listen: str, policy_path: str | None = None,
                 track: bool = True, max_watches: int = 1 << 20,
                 overlay_forks: bool = True, tls_cert: str | None = None,
                 tls_key: str | None = None, token_file: str | None = None,
                 allow_uids: set[int] | None = None, gc_grace: float = 600.0,
                 metrics_listen: str | None = None, limits: Limits | None = None,
                 storage: StorageConfig | None = None, *,
                 approvals_by_owner: bool = False, notify: str | None = None,
                 console: str | None = None, edge: EdgeLimits | None = None) -> None:
        self.root = os.path.abspath(root)
        self.edge = edge or EdgeLimits()
        self.notify, self.notifier = notify, None
        self.console, self.console_proc = console, None
        self.approvals_by_owner = approvals_by_owner
        self.storage = storage or StorageConfig()
        self.leases: Leases | None = None
        self.watch: StartWatch | None = None
        self._housekeeping: threading.Thread | None = None
        self._next_consolidate = 0.0  # monotonic: when a fleet host next looks (at rest)
        self._next_flush = 0.0  # monotonic: when it may next move its staged blobs
        self.limits = limits or Limits()
        self.metrics_listen = metrics_listen
        self.gc_grace = gc_grace
        self.tls_cert, self.tls_key, self.token_file = tls_cert, tls_key, token_file
        self.allow_uids = allow_uids or set()
        self.token: str | None = None
        self.relay: PeerRelay | None = None
        self.relayed: grpc.Server | None = None  # the relay's peers' server
        self.gateway: Gateway | None = None
        self.overlay_forks = overlay_forks
        self.listen = listen
        self.policy_path = policy_path
        self.track = track
        self.max_watches = max_watches
        self.stopping = threading.Event()
        self._locks: list[int] = []
        self.server: grpc.Server | None = None

    def _check_socket_path(self, socket_path: str) -> None:
        if not os.path.isabs(socket_path):
            raise StartupError(f"socket path {socket_path!r} must be absolute")
        if len(os.fsencode(socket_path + ".shared")) > 107:
            raise StartupError(f"socket path {socket_path} is longer than 100 bytes")
        os.makedirs(os.path.dirname(socket_path), mode=0o700, exist_ok=True)
        # Always lock the socket itself too: a daemon on another root must not take it over.
        self._locks.append(_lock(socket_path + ".lock", f"socket {socket_path}"))

    def _check_tcp_security(self) -> None:
        if not (self.tls_cert and self.tls_key and self.token_file):
            raise StartupError(
                f"listening on TCP ({self.listen}) needs TLS and a bearer token: give"
                " --tls-cert, --tls-key and --token-file (or listen on unix:///path)")
        try:
            self.token = read_token(self.token_file)
            with open(self.tls_cert, "rb") as f:
                cert = f.read()
            with open(self.tls_key, "rb") as f:
                key = f.read()
        except (OSError, ValueError) as exc:
            raise StartupError(f"cannot use the TLS files or token: {exc}") from None
        self.credentials = grpc.ssl_server_credentials([(key, cert)])

    def start(self) -> None:
        if self.edge.idle_seconds <= 0:
            raise StartupError("--idle-seconds must be more than 0")
        _raise_open_files()
        os.umask(0o077)  # everything the daemon writes under its root is owner-only
        os.makedirs(self.root, mode=0o700, exist_ok=True)
        os.chmod(self.root, 0o700)
        self._locks.append(_lock(os.path.join(self.root, "daemon.lock"), f"data root {self.root}"))
        socket_path = unix_path(self.listen)
        if socket_path is None:
            self._check_tcp_security()
        else:
            self._check_socket_path(socket_path)
        policy = Policy.load(self.policy_path) if self.policy_path else Policy()
        freed = reserve.settle(self.root)  # a full disk: room to start (reserve.py)
        if freed:
            log.warning("%s", freed)

        # the data key first: a missing or wrong key stops the start with nothing read
        self.data_key = self.storage.open_data_key(self.root)
        self.store = self.storage.open_store(self.root, key=self.data_key)
        self.blobs = self.storage.open_blobs(self.root, self.store, self.data_key)
        renamed, removed = getattr(self.blobs, "cache", self.blobs).recover()
        if renamed or removed:
            log.warning("blob recovery: finished %d interrupted rename(s), removed %d"
                        " incomplete temporary file(s)", renamed, removed)
        self.stat_cache = StatCache(os.path.join(self.root, "index.db"), self.data_key)
        self.repacker = Repacker(getattr(self.blobs, "cache", self.blobs), files_named)
        self.monitor = ChangeMonitor(self.max_watches) if self.track else None
        # the sync cookies older versions left in the data root (none are made now)
        shutil.rmtree(os.path.join(self.root, "cookies"), ignore_errors=True)
        self.engine = Engine(os.environ.get("DOCKER_HOST") or None)
        views = Views(self.root, self.blobs, TreeReader(self.blobs), self.stat_cache)
        if not self.overlay_forks:
            views.enabled = False
        self.world = World(self.root, self.store, self.blobs, self.stat_cache, self.monitor,
                           self.engine, views, self.limits, host=self.storage.host_id,
                           key=self.data_key)
        for line in views.remount_all(self.world.fork_origin, self.world.fork_remounted):
            log.warning("forks: %s", line)
        self.world.recover()
        if self.world.host:
            self.world.lease_seconds = self.storage.lease_seconds
            self.leases = Leases(self.world, every=self.storage.lease_seconds / 3)
            self.leases.start(self.storage.advertise or (
                self.listen if unix_path(self.listen) is None else ""))
        self.gates = Gates(self.world, policy)
        self.graph_store = self.storage.open_graph_store(self.root, key=self.data_key)

        # what an --allow-uid caller may call
        rules = Rules(self.world, self.gates, self.approvals_by_owner)
        servicer = WorldlineServicer(self.world, self.gates, self.gc_grace)
        graphs = GraphsServicer(Graphs(self.world, self.graph_store))
        self.health = health.HealthServicer()
        tokens = [TokenInterceptor(self.token)] if self.token else []
        server = self._grpc_server(servicer, graphs, tokens + [
            MetricsInterceptor(), ErrorInterceptor(rules)], GRPC_WORKERS, MAX_MESSAGE)
        self.socket_path = socket_path
        if socket_path is None:
            try:
                server.add_secure_port(self.listen, self.credentials)
            except RuntimeError as exc:
                raise StartupError(f"cannot listen on {self.listen}: {exc}") from None
        else:
            _listen_private(server, socket_path)
            if self.allow_uids:
                # The relay's peers are served apart, by workers and a message size of
                # their own (limits.py): the owner's calls never wait for theirs.
                relayed = socket_path + RELAYED_SUFFIX
                self.relayed = self._grpc_server(servicer, graphs, [
                    MetricsInterceptor(), ErrorInterceptor(rules, self.edge.calls())],
                    RELAY_WORKERS, self.edge.max_line)
                _listen_private(self.relayed, relayed)
                self.relayed.start()
                self.relay = PeerRelay(socket_path + ".shared", relayed, self.allow_uids,
                                       self.edge.connections())
                os.chmod(os.path.dirname(socket_path), 0o711)  # others may reach .shared
        server.start()
        self.server = server
        if socket_path is not None:
            self.gateway = Gateway(socket_path + GATEWAY_SUFFIX, servicer, self.allow_uids,
                                   rules, self.edge)
        if self.metrics_listen:
            self._serve_metrics()
        if self.notify:
            try:
                self.notifier = Notifier(self.store, self.notify)
            except ValueError as exc:
                raise StartupError(str(exc)) from None
            self.notifier.start()
        if self.console:
            self._serve_console()
        self._watch_health()
        # A session's container started by anyone else is checked as it starts (its
        # bind of the workspace), not only at the session's next checkpoint.
        self.watch = StartWatch(self.engine, self.world.root_id,
                                self.world.container_started).start()
        log.info("worldline daemon %d serving %s (data root %s; store %s, blobs %s%s)",
                 os.getpid(), self.listen, self.root, self.storage.shown_store,
                 self.storage.blobs, f", host {self.world.host}" if self.world.host else "")
        if walk.walk_native is None:
            log.warning("the native walker (worldline.daemon.capture._walk) is not built: full"
                        " scans use its Python twin, several times slower (see README, Set-up)")
        # The objects made while starting (modules, the server, the stores) live as long
        # as the daemon: move them out of the cycle collector's sight, or every collection
        # that a large scan's allocations trigger traverses them all again. Last, so that
        # nothing imported while starting is left out (a module imported after it, such
        # as psycopg for a log line, adds thousands of objects to every full collection).
        gc.freeze()
        # A young collection every 20,000 allocations instead of 700: a checkpoint makes
        # a few thousand objects, nearly none of them in cycles, and each collection
        # stops every call. Under the eight-session load (tests/bench/load.py) the
        # slowest calls are faster so, and the daemon's memory is the same.
        gc.set_threshold(GC_YOUNG, *gc.get_threshold()[1:])
        watch_gc()  # worldline_gc_pause_seconds

    def _grpc_server(self, servicer: WorldlineServicer, graphs: GraphsServicer,
                     interceptors: list, workers: int, receive: int) -> grpc.Server:
        """A gRPC server of every service, with ``workers`` threads, taking messages of
        up to ``receive`` bytes."""
        idle_ms = int(self.edge.idle_seconds * 1000)
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rpc"),
            interceptors=interceptors,
            options=[("grpc.max_receive_message_length", receive),
                     ("grpc.max_send_message_length", MAX_MESSAGE),
                     ("grpc.so_reuseport", 0),
                     # a connection's calls at once (a client's threads share one;
                     # past the workers they wait, each within its stream's window;
                     # a client's first burst past it, before it knows, is UNAVAILABLE)
                     ("grpc.max_concurrent_streams", MAX_STREAMS),
                     # a connection with no call for --idle-seconds is closed (GOAWAY:
                     # a channel connects again at its next call), and a peer that
                     # stops answering pings is let go
                     ("grpc.max_connection_idle_ms", idle_ms),
                     ("grpc.keepalive_time_ms", max(idle_ms, 10_000)),
                     ("grpc.keepalive_timeout_ms", 20_000)])
        pb_grpc.add_WorldlineServicer_to_server(servicer, server)
        pb_grpc.add_GraphsServicer_to_server(graphs, server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection((SERVICE, GRAPHS_SERVICE, reflection.SERVICE_NAME,
                                             health.SERVICE_NAME), server)
        return server

    def _serve_metrics(self) -> None:
        from prometheus_client import start_http_server
        host, _, port = self.metrics_listen.rpartition(":")
        try:
            start_http_server(int(port), addr=host or "127.0.0.1")
        except (OSError, ValueError) as exc:
            raise StartupError(f"cannot serve metrics on {self.metrics_listen}: {exc}") from None
        log.info("metrics at http://%s/metrics", self.metrics_listen)

    def _watch_health(self) -> None:
        """SERVING while the store answers and takes writes and, when any session has a
        container, the Docker engine answers too; NOT_SERVING otherwise. Checked every 2
        seconds. The same thread empties the write-ahead logs once the daemon is idle."""
        serving = health_pb2.HealthCheckResponse.SERVING
        not_serving = health_pb2.HealthCheckResponse.NOT_SERVING

        def check() -> None:
            try:
                sessions = self.store.list_sessions()
                PENDING_APPROVALS.set(len(self.store.list_approvals(status="pending")))
                ok = not any(s.container for s in sessions) or self.engine.ping()
            except Exception:
                log.exception("health check failed")
                ok = False
            ok = ok and broken() is None
            for name in ("", SERVICE, GRAPHS_SERVICE):
                self.health.set(name, serving if ok else not_serving)

        def broken() -> str | None:
            """Why an embedded store takes no more writes (a flush of its files failed:
            wal.py), or None."""
            for db in (self.blobs, self.graph_store, self.store):
                reason = getattr(db, "broken", lambda: None)()
                if reason is not None:
                    return reason
            return None

        # One compaction per file: a data root may keep the pack in meta.db (config.pack_file).
        files = {db.path: db for db in (self.blobs.pack, self.graph_store, self.store)}

        def housekeep() -> None:
            for db in files.values():
                try:
                    db.compact_wal(WAL_IDLE_SECONDS)
                except Exception:
                    log.exception("compacting the write-ahead log of %s failed", db.path)
            try:
                self.stat_cache.write_behind()
                self.stat_cache.compact(WAL_IDLE_SECONDS)
            except Exception:
                log.exception("writing or compacting the stat cache failed")
            try:
                reserve.renew(self.root)
            except OSError:
                log.exception("making the data root's reserve again failed")
            try:
                self.repacker.run(REPACK_STEP_SECONDS, self._idle_for_repack)
            except Exception:
                log.exception("the idle repack failed")
            try:
                self._consolidate_bucket()
            except Exception:
                log.exception("rewriting this host's packs in the bucket failed")
                self._next_consolidate = time.monotonic() + CONSOLIDATE_EVERY
            self._flush_staged()

        def loop() -> None:
            while not self.stopping.wait(WAL_IDLE_SECONDS):
                if broken() is None:  # else no background writes either (health says why)
                    housekeep()
                if time.monotonic() >= self._next_health:
                    self._next_health = time.monotonic() + 2.0
                    check()

        check()
        self._next_health = time.monotonic() + 2.0
        self._housekeeping = threading.Thread(target=loop, name="housekeeping", daemon=True)
        self._housekeeping.start()

    def _consolidate_bucket(self) -> None:
        """A fleet host at rest rewrites its small pack objects in the bucket into one,
        with deltas (S3BlobStore.consolidate), a group per pass while it stays idle;
        under the store's gc lock, so one host of the fleet rewrites at a time."""
        consolidate = getattr(self.blobs, "consolidate", None)
        if (consolidate is None or time.monotonic() < self._next_consolidate
                or ACTIVITY.quiet_for() < CONSOLIDATE_REST or not self._idle_for_repack()):
            return
        started = time.monotonic()
        try:
            with self.store.gc_lock():
                done, before, after = consolidate(self._idle_for_repack)
        except Aborted:  # another host collects or rewrites: later
            done = 0
        if done:
            log.info("rewrote %d pack objects of %d bytes in the bucket as one of %d bytes"
                     " in %.1f s", done, before, after, time.monotonic() - started)
        else:
            self._next_consolidate = time.monotonic() + CONSOLIDATE_EVERY

    def _flush_staged(self) -> None:
        """A fleet host moves the blobs its checkpoints staged in the metadata store to
        the bucket once they are due (S3BlobStore.flush_staged), busy or not; after a
        failure (the bucket away) it tries again ``FLUSH_RETRY`` seconds later, the
        checkpoints staging meanwhile."""
        flush = getattr(self.blobs, "flush_staged", None)
        if flush is None or time.monotonic() < self._next_flush:
            return
        started = time.monotonic()
        try:
            moved, nbytes = flush()
        except Exception as exc:
            log.warning("moving this host's staged blobs to the bucket failed (%s); trying"
                        " again in %.0f s", exc, FLUSH_RETRY)
            self._next_flush = time.monotonic() + FLUSH_RETRY
            return
        if moved:
            log.info("moved %d staged objects to the bucket (%d bytes) in %.2f s",
                     moved, nbytes, time.monotonic() - started)

    def _move_staged_at_stop(self) -> None:
        """A fleet host that stops moves what its checkpoints staged to the bucket, so a
        host that is gone leaves nothing in the metadata store for gc to move. It waits
        at most ``STOP_MOVE_SECONDS`` (a bucket away must not hold up the stop): what is
        left stays staged, readable by every host, for its next start or gc to move."""
        staged = getattr(self.blobs, "staged", None)
        if staged is None or not staged()[0]:
            return

        def move() -> None:
            try:
                moved, nbytes = self.blobs.flush_staged(due_only=False)
                log.info("moved %d staged objects to the bucket at stop (%d bytes)", moved,
                         nbytes)
            except Exception as exc:  # the store may close under it: the next start's
                log.warning("moving this host's staged blobs at stop failed: %s", exc)

        mover = threading.Thread(target=move, name="stop-move", daemon=True)
        mover.start()
        mover.join(STOP_MOVE_SECONDS)

    def _idle_for_repack(self) -> bool:
        """No call for a while, and none now; nothing committed to the pack lately."""
        return (not self.stopping.is_set() and ACTIVITY.quiet_for() >= REPACK_IDLE_SECONDS
                and time.monotonic() - self.repacker.pack.last_commit >= REPACK_IDLE_SECONDS)

    def _serve_console(self) -> None:
        """The console as a child process of the CLI's (`worldline console`), talking to
        this daemon over its socket as the daemon's user; its URL, which holds its
        token, logged and kept in <root>/console.url (0600)."""
        import subprocess
        import sys
        self.console_proc = subprocess.Popen(
            [sys.executable, "-m", "worldline.client.cli", "--address", self.listen,
             "console", "--listen", self.console], stdout=subprocess.PIPE, text=True)
        url = self.console_proc.stdout.readline().strip()
        if not url:
            raise StartupError(f"the console could not serve on {self.console}")
        path = os.path.join(self.root, "console.url")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), 0o600)  # (one left from before keeps its mode else)
            f.write(url + "\n")
        # The URL holds the token of a console with the daemon's own rights: the log
        # (read by more people than root, often) names the file that holds it, alone.
        log.warning("console: %s (its URL, with the token, in %s)",
                    url.split("?", 1)[0], path)

    def stop(self, grace: float = 10.0) -> None:
        if self.server is None:
            return
        self.stopping.set()
        self.gates.close()  # its long polls (WaitAudit) answer now
        if self.notifier is not None:
            self.notifier.stop()
        if self.console_proc is not None:
            self.console_proc.terminate()
            try:
                self.console_proc.wait(timeout=10)
            except Exception:  # noqa: BLE001 -- a console that will not go is killed
                self.console_proc.kill()
        self.health.enter_graceful_shutdown()
        if self.gateway is not None:
            self.gateway.close()
        self.server.stop(grace).wait()
        self.server = None
        if self.relayed is not None:
            self.relayed.stop(grace).wait()
        if self.monitor is not None:
            self.monitor.close()
        if self._housekeeping is not None:
            self._housekeeping.join(timeout=5.0)  # its repack step ends before the stores close
        if self.watch is not None:
            self.watch.close()
        if self.leases is not None:
            self.leases.stop()
            try:  # this host serves no more: its sessions may be taken over at once
                self.store.renew_leases(self.world.host, time.time())
            except WorldlineError as exc:
                log.warning("ending the leases of host %s failed: %s", self.world.host, exc)
        self._move_staged_at_stop()
        self.store.close()
        self.blobs.close()
        self.graph_store.close()
        try:
            self.stat_cache.compact()  # the next start loads one snapshot, no log
        except Exception:
            log.exception("compacting the stat cache failed")
        self.stat_cache.close()
        if self.relay is not None:
            self.relay.close()
        if self.socket_path is not None:
            for path in (self.socket_path, self.socket_path + RELAYED_SUFFIX):
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
        for fd in self._locks:
            os.close(fd)
        log.info("worldline daemon stopped")


def _configure_logging(json_lines: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_lines else logging.Formatter(
        "%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=os.environ.get("WORLDLINE_LOG_LEVEL", "INFO"),
                        handlers=[handler], force=True)


def run(root: str | None, listen: str | None, policy_path: str | None = None,
        track: bool = True, max_watches: int = 1 << 20, overlay_forks: bool = True,
        tls_cert: str | None = None, tls_key: str | None = None, token_file: str | None = None,
        allow_uids: set[int] | None = None, gc_grace: float = 600.0,
        metrics_listen: str | None = None, log_format: str = "text",
        limits: Limits | None = None, storage: StorageConfig | None = None, *,
        approvals_by_owner: bool = False, notify: str | None = None,
        console: str | None = None, edge: EdgeLimits | None = None) -> int:
    _configure_logging(log_format == "json")
    # A fatal signal (a crash in a C extension, SIGABRT from a supervisor or a test that
    # gave up waiting) prints every thread's Python stack to stderr, for the operator.
    faulthandler.enable()
    root = root or default_root()
    listen = listen or os.environ.get("WORLDLINE_ADDRESS") or default_address(root)
    policy_path = policy_path or os.environ.get("WORLDLINE_POLICY") or None
    daemon = Daemon(root, listen, policy_path, track, max_watches, overlay_forks, tls_cert,
                    tls_key, token_file, allow_uids, gc_grace, metrics_listen, limits, storage,
                    approvals_by_owner=approvals_by_owner, notify=notify, console=console,
                    edge=edge)
    # A stop signal wakes the main thread through a pipe it reads, written by the
    # interpreter's C-level handler (set_wakeup_fd) on whichever thread the kernel
    # delivered the signal to. Not by a Python handler: those run on the main thread
    # only once it wakes, and a SIGTERM delivered to one of gRPC's threads left it
    # asleep in read() for good (test_11, on a loaded machine). Nor by setting a
    # threading.Event: that deadlocked when the signal landed while the main thread
    # held the Event's lock in wait().
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    os.set_blocking(wake_r, True)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)  # handled: the wake-up byte is the message
    try:
        daemon.start()
    except (StartupError, WorldlineError) as exc:
        message = exc.message if isinstance(exc, WorldlineError) else str(exc)
        print(f"error: {message}", file=sys.stderr)
        return 1
    except (OSError, sqlite3.Error) as exc:  # a read-only data root, say: its reason alone
        log.debug("start failed", exc_info=True)
        print(f"error: the daemon cannot start over {daemon.root}: {exc}", file=sys.stderr)
        return 1
    print(f"worldline daemon listening on {listen}", file=sys.stderr, flush=True)
    os.read(wake_r, 1)
    daemon.stop(grace=5.0)
    broken = left_open()
    if broken:
        # A normal exit would close their connections, and SQLite's last close copies a
        # log into its file, hole and all (sqlite_store.SqliteDatabase.close).
        log.error("left as they are, for the next start to recover up to the last"
                  " acknowledged write: the write-ahead logs of %s (an fsync of each"
                  " failed)", ", ".join(broken))
        logging.shutdown()
        sys.stderr.flush()
        os._exit(0)
    return 0


def command(args) -> int:
    """``worldline daemon``: the CLI's parsed arguments (client/cli.py's parser) as the
    daemon's settings, and the daemon run in the foreground. The client's one entry into
    the daemon: the CLI imports this module, and nothing else of the daemon, to start it.
    A setting that does not hold raises a ``WorldlineError`` before anything starts."""
    limits = Limits(args.max_file_bytes, args.max_file_size, args.max_checkpoint_bytes,
                    args.min_free_bytes, args.max_entries)
    storage = StorageConfig.resolve(args.store, args.blobs, args.host_id,
                                    args.cache_bytes, args.lease_seconds, args.advertise,
                                    args.encryption_key)
    return run(args.root, args.listen, args.policy, not args.no_tracker, args.max_watches,
               not args.copy_forks, args.tls_cert, args.tls_key, args.token_file,
               set(args.allow_uid), args.gc_grace, args.metrics_listen, args.log_format,
               limits, storage, approvals_by_owner=args.approvals_by == "owner",
               notify=args.notify, console=args.console,
               edge=EdgeLimits(args.max_connections, args.owner_connections,
                               args.connections_per_uid, args.idle_seconds,
                               args.gateway_max_line, args.gateway_buffer_bytes,
                               args.calls_per_uid))


def key_command(args) -> int:
    """``worldline key rotate``: on the keyring itself (storage/keyring.py), no daemon
    call: the data key is re-wrapped with the new key, nothing else rewritten. Prints
    the new key's id; a setting that does not hold raises a ``WorldlineError``."""
    from .storage.keyring import rotate

    storage = StorageConfig.resolve(args.store, args.blobs, encryption_key=args.encryption_key)
    if not storage.encryption_key:
        raise InvalidArgument("give the key in use: --encryption-key FILE")
    new_id = rotate(os.path.abspath(args.root or default_root()), storage.store,
                    storage.blobs, storage.encryption_key, args.new_key)
    print(f"the data key is wrapped with the new key (id {new_id}); start the daemon with it")
    return 0
