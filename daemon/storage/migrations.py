"""Versioned schemas, applied once at start, the same way on every SQL backend.

A database records its ``schema_version`` in the table ``meta``. At start a backend
calls ``migrate``: a database with no version gets the latest schema whole (its
``create`` step) and the latest version; one with an older version gets each later
``Migration`` in order, in one transaction with the new version, so a crash leaves
the old version or the new one, never half; one with a newer version than this
worldline knows is refused (``FailedPrecondition``) rather than misread. Callers
hold the backend's migration lock around it (PostgreSQL: an advisory lock, so that
daemons starting together migrate once; SQLite: the data root's own lock).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from worldline.wire.errors import FailedPrecondition

META = "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)"


@dataclass(frozen=True)
class Migration:
    version: int  # the schema version this step brings the database to
    what: str  # one line: what changes, for the log
    run: Callable[[object], None]  # given the transaction's connection


def latest(migrations: tuple[Migration, ...]) -> int:
    return migrations[-1].version if migrations else 1


def migrate(tx, create: Callable[[object], None], migrations: tuple[Migration, ...],
            what: str) -> tuple[int | None, int]:
    """Bring the database behind ``tx`` (the backend's write-transaction context) to the
    latest version; return (the version found, or None for a new database; the version
    now)."""
    target = latest(migrations)
    with tx() as db:
        db.execute(META)
        row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if row is None:
            create(db)
            db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(target),))
            return None, target
        found = int(row[0])
        if found > target:
            raise FailedPrecondition(
                f"{what} has schema version {found}, made by a newer worldline; this one"
                f" knows versions up to {target}: upgrade worldline")
        for step in migrations:
            if step.version > found:
                step.run(db)
        if found != target:
            db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'",
                       (str(target),))
        return found, target
