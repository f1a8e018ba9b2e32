"""Sealed columns: what the agent said and did, encrypted in the metadata stores when
the daemon has a data key (crypto.py).

With a ``DataKey``, each value of a column that holds agent-controlled content (the
conversation, tool arguments and results, checkpoint labels, task text, approval
arguments, audit details, graph checkpoints) is sealed with the key's ``meta`` subkey
(AES-256-GCM). Its *context*, the associated data, names the table, the column and
the row's key, so a value moved to another row or column does not open: reading it
is ``DataLoss``, as is a value written in the clear where a sealed one belongs, or
one sealed with another key. No query filters on a sealed column (ids, times,
statuses, kinds and sizes stay in the clear: docs/encryption-metadata.md lists both).

Without a key every value passes as it is: the same schema, the same bytes as a store
that never heard of keys.

A sealed text value is kept as its bytes where the database takes bytes in a text
column (SQLite: a BLOB in a TEXT column), as base64 text where it does not
(PostgreSQL: ``as_text``). A bytes column (BLOB, BYTEA) keeps the sealed bytes.
"""

from __future__ import annotations

import base64
import binascii
import threading

from worldline.wire.errors import DataLoss

from .crypto import DataKey


def context(table: str, column: str, row: tuple) -> bytes:
    """The associated data of one value: its table and column (names of this code),
    then the parts of the row's key, each prefixed by its length, so that no two
    places share a context whatever the keys hold."""
    out = f"{table}\0{column}"
    for part in row:
        part = str(part)
        out += f"\0{len(part)}:{part}"
    return out.encode()


# Texts opened are kept (``Columns.open_text``), up to this many bytes in all: a
# history, a log, the console's timeline, a conversation read the same records again
# and again.
MEMO_BYTES = 32 << 20
# A longer value is opened at each read rather than push out many shorter ones.
MEMO_VALUE = 16 << 10


class Columns:
    """Seals and opens the values of sealed columns (identity without a key).

    What ``open_text`` opened is kept by the value as stored and its place (table,
    column, row key): the same bytes in the same place open to the same text, so a
    read of them again needs no second check of their tag; a value changed, moved or
    planted is other bytes or another place, and is opened (and checked) anew. The
    texts kept are in the clear in the daemon's memory, as every value it reads is
    (encryption at rest keeps the disk, the bucket and backups, not a running host)."""

    __slots__ = ("_memo", "_memo_bytes", "_memo_lock", "as_text", "key")

    def __init__(self, key: DataKey | None = None, as_text: bool = False) -> None:
        self.key = key
        self.as_text = as_text
        self._memo: dict[tuple, str] = {}
        self._memo_bytes = 0
        self._memo_lock = threading.Lock()

    def seal_text(self, value: str | None, table: str, column: str, *row):
        """``value`` as its column keeps it; None stays NULL."""
        if self.key is None or value is None:
            return value
        sealed = self.key.seal_meta(value.encode("utf-8"), context(table, column, row))
        return base64.b64encode(sealed).decode("ascii") if self.as_text else sealed

    def open_text(self, value, table: str, column: str, *row) -> str | None:
        if self.key is None or value is None:
            return value
        if isinstance(value, memoryview):
            value = bytes(value)
        place = (value, table, column, row) if len(value) <= MEMO_VALUE else None
        text = self._memo.get(place) if place is not None else None
        if text is None:
            text = self._open_text(value, table, column, row)
            if place is not None:
                self._keep(place, text)
        return text

    def _keep(self, place: tuple, text: str) -> None:
        with self._memo_lock:
            if place in self._memo:
                return
            self._memo[place] = text
            self._memo_bytes += len(place[0]) + len(text)
            while self._memo_bytes > MEMO_BYTES:  # the oldest go
                old = next(iter(self._memo))
                self._memo_bytes -= len(old[0]) + len(self._memo.pop(old))

    def _open_text(self, value, table: str, column: str, row: tuple) -> str:
        if self.as_text:
            try:
                raw = base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError, TypeError):
                raise _clear(table, column, row) from None
        elif isinstance(value, bytes):
            raw = value
        else:
            raise _clear(table, column, row)
        return self._open(raw, table, column, row).decode("utf-8")

    def seal_bytes(self, value: bytes, table: str, column: str, *row) -> bytes:
        if self.key is None:
            return value
        return self.key.seal_meta(bytes(value), context(table, column, row))

    def open_bytes(self, value, table: str, column: str, *row) -> bytes:
        if self.key is None:
            return bytes(value)
        return self._open(bytes(value), table, column, row)

    def _open(self, raw: bytes, table: str, column: str, row: tuple) -> bytes:
        try:
            return self.key.open_meta(raw, context(table, column, row))
        except DataLoss as exc:
            raise DataLoss(f"{table}.{column} of row {'/'.join(map(str, row))}:"
                           f" {exc.message}") from None


def _clear(table: str, column: str, row: tuple) -> DataLoss:
    return DataLoss(f"{table}.{column} of row {'/'.join(map(str, row))} is not sealed"
                    " (written without the data key, or altered)")
