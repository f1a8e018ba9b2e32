"""A PostgreSQL database behind a connection pool (psycopg 3, psycopg_pool), with the
shape ``SqliteDatabase`` has: ``_tx()`` for one write transaction, ``_one`` and
``_all`` for reads, statements written with ``?`` placeholders.

Failures map to the domain's errors here, once: a server that cannot be reached (down,
restarting, every connection broken) is ``Unavailable``, so callers retry and the
daemon never needs a restart; a full disk is ``ResourceExhausted``; a transaction the
server rolled back (a deadlock, a serialization failure) is ``Aborted``. A connection a
server restart broke fails the one call that finds it so, and the pool replaces it.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from worldline.wire.errors import Aborted, ResourceExhausted, Unavailable

from .urls import redact

log = logging.getLogger(__name__)

try:
    import psycopg
    from psycopg_pool import ConnectionPool, PoolTimeout
    from psycopg_pool.base import AttemptWithBackoff
except ImportError:  # pragma: no cover - the fleet extra is not installed
    psycopg = None
    ConnectionPool = AttemptWithBackoff = object

RECONNECT_EVERY = 1.0  # seconds between two tries to connect while the server is away


class _Attempt(AttemptWithBackoff):
    """psycopg_pool's reconnection attempt, its delay kept at ``RECONNECT_EVERY``
    (the pool doubles it from 1 s after each failure: 1, 2, 4, 8, ... so a server away
    20 s was tried again up to 11 s after it was back; a first call succeeded 6.7 s
    after a restart in a probe)."""

    def update_delay(self, now: float) -> None:
        super().update_delay(now)
        self.delay = min(self.delay, RECONNECT_EVERY)


class _Pool(ConnectionPool):
    def _add_connection(self, attempt, growing: bool = False) -> None:
        super()._add_connection(attempt or _Attempt(timeout=self.reconnect_timeout),
                                growing=growing)

_PIPELINE = psycopg is not None and psycopg.Pipeline.is_supported()  # libpq 14 or later

# Advisory lock keys (one namespace of bigints shared by every worldline database).
LOCK_MIGRATIONS = 0x776C_0001
LOCK_AUDIT_CHAIN = 0x776C_0002
LOCK_GC = 0x776C_0003


@functools.lru_cache(maxsize=512)
def _pg(sql: str) -> str:
    return sql.replace("%", "%%").replace("?", "%s")


class _Connection:
    """A transaction's connection, taking ``?`` placeholders. In a pipelined
    transaction statements are sent without waiting for their results until one is
    read (or the commit); an error surfaces there."""

    def __init__(self, conn) -> None:
        self.conn = conn

    def execute(self, sql: str, args: tuple | list = ()):
        return self.conn.execute(_pg(sql), tuple(args))

    def executemany(self, sql: str, rows) -> None:
        rows = list(rows)
        if rows:
            with self.conn.cursor() as cur:
                cur.executemany(_pg(sql), rows)


def _mapped(exc: Exception, url: str) -> Exception:
    if isinstance(exc, psycopg.errors.DiskFull):
        return ResourceExhausted(f"no space left for metadata on PostgreSQL: {exc}")
    if getattr(exc, "sqlstate", None) in ("40001", "40P01"):  # serialization, deadlock
        return Aborted("the metadata store rolled this call's transaction back (it"
                       " conflicted with another); nothing of it was kept: try again"
                       f" ({str(exc).strip().splitlines()[0] if str(exc).strip() else exc})")
    return Unavailable(f"the metadata store (PostgreSQL at {url}) cannot be reached:"
                       f" {str(exc).strip().splitlines()[0] if str(exc).strip() else exc}")


class PostgresDatabase:
    def __init__(self, url: str, schema_name: str = "", pool_size: int = 8,
                 connect_timeout: float = 10.0) -> None:
        if psycopg is None:
            raise Unavailable("PostgreSQL needs psycopg and psycopg_pool: pip install"
                              " 'worldline[fleet]'")
        self.url = url
        self.path = redact(url)  # what logs name this database by
        # Connections are in autocommit: a read is one round trip, not three (BEGIN,
        # SELECT, COMMIT); a write transaction is explicit (``_tx``). They are not
        # checked before each use (a round trip more on every call): one a server
        # restart broke fails its call UNAVAILABLE once and the pool drops it
        # (psycopg_pool discards a connection returned broken).
        # A call waits for a connection up to ``connect_timeout`` (10 s), then fails
        # UNAVAILABLE; while the server is away the pool tries to connect again every
        # second (``_Attempt``), so the first call after it is back succeeds within
        # about a second.
        self.pool = _Pool(url, min_size=1, max_size=pool_size, open=False,
                          timeout=connect_timeout, name="worldline",
                          kwargs={"autocommit": True})
        self.pool.open(wait=False)
        self._checking = threading.Lock()

    def _connection(self):
        return self.pool.connection()

    def _failed(self, exc: Exception) -> Exception:
        """The error to raise for a call that failed to reach the server. A connection
        found broken (a server restart breaks every one the pool holds) has the pool
        test its other idle connections at once, on a thread of its own, so the calls
        that follow are not each failed by one more broken connection."""
        if isinstance(exc, psycopg.OperationalError) and self._checking.acquire(False):
            def check() -> None:
                try:
                    self.pool.check()
                except Exception:  # closed meanwhile, or the server away: nothing to do
                    log.debug("checking the pool's connections failed", exc_info=True)
                finally:
                    self._checking.release()
            threading.Thread(target=check, name="pool-check", daemon=True).start()
        return _mapped(exc, self.path)

    @contextmanager
    def _tx(self, pipelined: bool = False) -> Iterator[_Connection]:
        """One transaction: committed when the block ends, rolled back if it raises.
        ``pipelined``: in libpq's pipeline mode, where a statement whose result is not
        read costs no round trip of its own: the reads the block makes, then the rest
        with the COMMIT (a checkpoint's ten statements take two round trips). BEGIN and
        COMMIT are sent as statements of the pipeline: psycopg's ``transaction()``
        inside a pipeline syncs at its start and twice at its end, three round trips
        more."""
        try:
            with self._connection() as conn:
                if pipelined and _PIPELINE:
                    try:
                        with conn.pipeline():
                            conn.execute("BEGIN")
                            yield _Connection(conn)
                            conn.execute("COMMIT")  # its result, or an error, at the sync
                    except BaseException:
                        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                            try:
                                conn.rollback()
                            except psycopg.Error:  # broken: the pool drops it
                                pass
                        raise
                else:
                    with conn.transaction():
                        yield _Connection(conn)
        except (psycopg.OperationalError, PoolTimeout) as exc:
            raise self._failed(exc) from None

    @contextmanager
    def _read(self) -> Iterator[_Connection]:
        """A connection for one statement on its own (autocommit)."""
        try:
            with self._connection() as conn:
                yield _Connection(conn)
        except (psycopg.OperationalError, PoolTimeout) as exc:
            raise self._failed(exc) from None

    def _write_one(self, sql: str, args: tuple = ()) -> list:
        """One writing statement on its own (atomic by itself: one round trip)."""
        with self._read() as db:
            cur = db.execute(sql, args)
            return cur.fetchall() if cur.description else []

    def _one(self, sql: str, args: tuple = ()):
        with self._read() as db:
            return db.execute(sql, args).fetchone()

    def _all(self, sql: str, args: tuple = ()) -> list:
        with self._read() as db:
            return db.execute(sql, args).fetchall()

    @contextmanager
    def advisory_lock(self, key: int, wait: bool = True) -> Iterator[bool]:
        """A lock held by this daemon for the block, across the fleet (a session-level
        advisory lock on a connection kept for the block). Without ``wait``, yields
        False at once when another holds it."""
        try:
            with self._connection() as conn:
                if wait:
                    conn.execute("SELECT pg_advisory_lock(%s)", (key,))
                    got = True
                else:
                    got = conn.execute("SELECT pg_try_advisory_lock(%s)",
                                       (key,)).fetchone()[0]
                try:
                    yield got
                finally:
                    if got:
                        conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
        except (psycopg.OperationalError, PoolTimeout) as exc:
            raise self._failed(exc) from None

    def compact_wal(self, idle_seconds: float) -> bool:
        return False  # the server keeps its own write-ahead log

    def close(self) -> None:
        self.pool.close()
