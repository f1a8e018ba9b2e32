"""The ``Store`` contract over SQL, written once for SQLite and PostgreSQL.

``SqlStore`` holds every statement; a backend mixes it with its database class,
which provides ``_tx()`` (one write transaction: a connection whose ``execute`` and
``executemany`` take ``?`` placeholders), ``_one`` and ``_all`` (reads), and these
dialect hooks:

- ``FOR_UPDATE``: the row lock a compare-and-set reads under (PostgreSQL: ``FOR
  UPDATE``; SQLite: nothing, its write transactions are already serial);
- ``IN_LIST``: a test of a column against one parameter holding a list;
- ``integrity_errors``: what a unique or key violation raises;
- ``_lock_chain(db)``: serialises writers of the audit chain (the chain stays one
  chain with several daemons writing; SQLite: its write lock already does);
- ``sealed``: the store's ``sealed.Columns``: with a data key, the columns holding
  what the agent controls are sealed as they are written and opened as they are read
  (the list: docs/encryption-metadata.md); without one, values pass as they are.
"""

from __future__ import annotations

import base64
import json
from contextlib import contextmanager
from dataclasses import replace

from worldline.wire.errors import (
    Aborted,
    AlreadyExists,
    DataLoss,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
)

from ..ids import clock
from ..records import (
    GENESIS_HASH,
    Approval,
    AuditEvent,
    Checkpoint,
    Session,
    Task,
    ToolCall,
    chain_hash,
)
from .leases import check_claim_fields
from .sealed import Columns

_SESSION_COLS = ("id, name, workspace, container, head, forked_from, created_at, spec,"
                 " needs_attention, deleted_at, host, lease_expires, released_to")
_SESSION_N = len(_SESSION_COLS.split(","))
_SESSION_COLS_OF_S = ", ".join(f"s.{c.strip()}" for c in _SESSION_COLS.split(","))
_MUTABLE_SESSION_FIELDS = {"container", "spec", "needs_attention", "deleted_at"}
_CP_COLS = ("id, session_id, seq, parent_id, kind, created_at, tree, bytes, state_digest,"
            " tasks_digest, conversation_parent, messages_added, message_count, label,"
            " reasoning, trace_id, restored_from, container, acknowledged, pruned, resume,"
            " warnings")
_CP_N = len(_CP_COLS.split(","))
_KEY_CHECK = b"worldline metadata store"  # meta.sealed: this, sealed (SqlStore._bind_key)


def digest_in(digest: str | None) -> bytes | str | None:
    """A SHA-256 digest as the database keeps it: its 32 bytes (half the hex text).
    Anything that is not 64 hex digits is kept as it is."""
    if digest is None or len(digest) not in (0, 64):
        return digest
    try:
        return bytes.fromhex(digest)
    except ValueError:
        return digest


def digest_out(value) -> str | None:
    """The hex text of a digest the database gives back (bytes, or text as written)."""
    return bytes(value).hex() if isinstance(value, (bytes, memoryview)) else value


def _cp(row, sealed: Columns) -> Checkpoint:
    (id_, session_id, seq, parent_id, kind, created_at, tree, size, state_digest, tasks_digest,
     conversation_parent, messages_added, message_count, label, reasoning, trace_id,
     restored_from, container, acknowledged, pruned, resume, warnings) = row
    if sealed.key is None:
        warnings = json.loads(warnings) if warnings else ()
    else:  # the four texts, sealed as one (_cp_row)
        label, reasoning, resume, warnings = json.loads(
            sealed.open_text(label, "checkpoints", "label", id_))
    return Checkpoint(id_, session_id, seq, parent_id, kind, created_at, digest_out(tree), size,
                      digest_out(state_digest), digest_out(tasks_digest), conversation_parent,
                      messages_added, message_count, label, reasoning, trace_id, restored_from,
                      digest_out(container), acknowledged=tuple(json.loads(acknowledged)),
                      pruned=bool(pruned), resume=resume, warnings=tuple(warnings))


def _cp_row(cp: Checkpoint, sealed: Columns) -> tuple:
    if sealed.key is None:
        label, reasoning, resume = cp.label, cp.reasoning, cp.resume
        warnings = json.dumps(list(cp.warnings)) if cp.warnings else ""
    else:
        # The label, reasoning, resume point and warnings sealed as one value (a JSON
        # array) in the label's column, the other three '': a checkpoint costs one seal
        # and each read of it one open (a session's history is read whole).
        label = sealed.seal_text(json.dumps([cp.label, cp.reasoning, cp.resume,
                                             list(cp.warnings)]), "checkpoints", "label", cp.id)
        reasoning = resume = warnings = ""
    return (cp.id, cp.session_id, cp.seq, cp.parent_id, cp.kind, cp.created_at,
            digest_in(cp.tree), cp.bytes, digest_in(cp.state_digest),
            digest_in(cp.tasks_digest), cp.conversation_parent, cp.messages_added,
            cp.message_count, label, reasoning, cp.trace_id, cp.restored_from,
            digest_in(cp.container), json.dumps(list(cp.acknowledged)), int(cp.pruned),
            resume, warnings)


def _event(row, sealed: Columns) -> AuditEvent:
    seq, kind, session_id, subject_id, detail, created_at, prev_hash, hash_ = row
    if sealed.key is None:
        detail, prev_hash, hash_ = json.loads(detail), digest_out(prev_hash), digest_out(hash_)
    else:
        detail, prev_hash, hash_ = _sealed_link(seq, detail, sealed)
    return AuditEvent(kind, session_id, subject_id, detail, created_at, seq, prev_hash, hash_)


def _audit_row(event: AuditEvent, prev: str, digest: str, sealed: Columns) -> tuple:
    if sealed.key is None:
        detail, prev_hash, hash_ = (json.dumps(event.detail, sort_keys=True),
                                    digest_in(prev), digest_in(digest))
    else:
        # The detail and the event's two links sealed as one value, the hash columns
        # empty: a chain hash is SHA-256 of the event in the clear, which would let
        # whoever holds the store confirm a guess of a detail.
        detail = sealed.seal_text(json.dumps([event.detail, prev, digest], sort_keys=True),
                                  "audit", "detail", event.seq)
        prev_hash = hash_ = b""
    return (event.seq, event.kind, event.session_id, event.subject_id, detail,
            event.created_at, prev_hash, hash_)


def _sealed_link(seq: int, detail, sealed: Columns) -> tuple[dict, str, str]:
    """(detail, previous hash, hash) of the audit event ``seq`` written with a key."""
    return tuple(json.loads(sealed.open_text(detail, "audit", "detail", seq)))


def _approval_row(a: Approval, sealed: Columns) -> tuple:
    return (a.id, a.session_id, a.tool, sealed.seal_text(a.args_json, "approvals", "args_json",
                                                         a.id),
            a.status, a.checkpoint_id, a.created_at, a.expires_at, a.reason, a.decided_at)


def _approval(row, sealed: Columns) -> Approval:
    id_, session_id, tool, args_json, *rest = row
    return Approval(id_, session_id, tool,
                    sealed.open_text(args_json, "approvals", "args_json", id_), *rest)


def _tool_call_row(call: ToolCall, sealed: Columns) -> tuple:
    args, result, key = call.args_json, call.result_json, call.idempotency_key
    if sealed.key is not None:
        # The arguments, result and idempotency key sealed as one value (a JSON array)
        # in the arguments' column, the other two NULL: a call costs one seal, and each
        # read of it one open (an idempotency key is matched over every call on a path).
        args = sealed.seal_text(json.dumps([args, result, key]), "tool_calls", "args_json",
                                call.id)
        result = key = None
    return (call.id, call.session_id, call.name, args, result, call.effect, key,
            call.checkpoint_id, call.created_at, call.rule, call.approval_id)


def _tool_call(row, sealed: Columns) -> ToolCall:
    id_, session_id, name, args, result, effect, key, *rest = row
    if sealed.key is not None:
        args, result, key = json.loads(sealed.open_text(args, "tool_calls", "args_json", id_))
    return ToolCall(id_, session_id, name, args, result, effect, key, *rest)


def _task_row(session_id: str, position: int, t: Task, sealed: Columns) -> tuple:
    title, note = t.title, t.note
    if sealed.key is not None:  # both as one value in the title's column, the note ''
        title = sealed.seal_text(json.dumps([title, note]), "tasks", "title", session_id, t.id)
        note = ""
    return (session_id, t.id, position, title, t.parent, t.status, note, t.updated_at)


def _task(session_id: str, row, sealed: Columns) -> Task:
    id_, title, parent, status, note, updated_at = row
    if sealed.key is not None:
        title, note = json.loads(sealed.open_text(title, "tasks", "title", session_id, id_))
    return Task(id_, title, parent, status, note, updated_at)


class SqlStore:
    FOR_UPDATE = ""
    IN_LIST = "{column} IN (SELECT value FROM json_each(?))"
    integrity_errors: tuple[type[Exception], ...] = ()
    sealed = Columns()  # a backend given a data key sets its own

    def _lock_chain(self, db) -> None:
        """Hold the audit chain's tail until this transaction ends."""

    @contextmanager
    def gc_lock(self):
        yield  # SQLite: one data root, one daemon (its lock file)

    def _bind_key(self) -> None:
        """Check at open that the store is opened as it was made: a store made with a
        data key records a value sealed with it (``meta.sealed``), which the key given
        must open (else ``InvalidArgument``: a wrong key, nothing read); one made
        without a key and already holding records takes no key (its records are in the
        clear), and a sealed one is not opened without its key (``FailedPrecondition``
        both). A store refused is closed."""
        try:
            self._check_key()
        except BaseException:
            self.close()
            raise

    def sealed_problems(self) -> list[str]:
        """Every sealed value read and its tag checked (fsck): a line for each that does
        not open; none without a key."""
        if self.sealed.key is None:
            return []
        sealed, problems = self.sealed, []
        for sql, read in (
                (f"SELECT {_CP_COLS} FROM checkpoints", lambda r: _cp(r, sealed)),
                ("SELECT body, checkpoint_id, idx FROM messages",
                 lambda r: sealed.open_text(r[0], "messages", "body", r[1], r[2])),
                ("SELECT * FROM tool_calls", lambda r: _tool_call(r, sealed)),
                ("SELECT session_id, id, title, parent, status, note, updated_at FROM tasks",
                 lambda r: _task(r[0], r[1:], sealed)),
                ("SELECT * FROM approvals", lambda r: _approval(r, sealed)),
                ("SELECT * FROM audit", lambda r: _event(r, sealed))):
            for row in self._all(sql):
                try:
                    read(row)
                except DataLoss as exc:
                    problems.append(exc.message)
        return problems

    def _check_key(self) -> None:
        key = self.sealed.key
        row = self._one("SELECT value FROM meta WHERE key = 'sealed'", ())
        if row is None and key is None:
            return
        if row is None:
            with self._tx() as db:
                if db.execute("SELECT 1 FROM sessions UNION ALL SELECT 1 FROM audit"
                              " LIMIT 1").fetchone() is not None:
                    raise FailedPrecondition(
                        f"the metadata store {self.path} holds records written without a"
                        " data key: it cannot be opened with one")
                check = base64.b64encode(key.seal_meta(_KEY_CHECK, _KEY_CHECK)).decode()
                db.execute("INSERT INTO meta VALUES ('sealed', ?) ON CONFLICT (key)"
                           " DO NOTHING", (check,))
            row = self._one("SELECT value FROM meta WHERE key = 'sealed'", ())
        if key is None:
            raise FailedPrecondition(f"the metadata store {self.path} is encrypted: start"
                                     " the daemon with its encryption key")
        try:
            key.open_meta(base64.b64decode(row[0]), _KEY_CHECK)
        except (DataLoss, ValueError):
            raise InvalidArgument(f"the encryption key does not open the metadata store"
                                  f" {self.path} (a wrong key); nothing was read") from None

    @staticmethod
    def _list_arg(values: list[str]):
        return json.dumps(values)

    # -- sessions ------------------------------------------------------------------
    def create_session(self, session, first, tasks, events):
        with self._tx() as db:
            try:
                db.execute(f"INSERT INTO sessions ({_SESSION_COLS}) VALUES"
                           " (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                           (session.id, session.name, session.workspace, session.container,
                            first.id, session.forked_from, session.created_at, session.spec,
                            session.needs_attention, session.deleted_at, session.host,
                            session.lease_expires, session.released_to))
                db.execute(f"INSERT INTO checkpoints ({_CP_COLS}) VALUES"
                           f" ({', '.join('?' * _CP_N)})", _cp_row(first, self.sealed))
            except self.integrity_errors:
                raise AlreadyExists(f"session {session.id} already exists") from None
            self._replace_tasks(db, session.id, tasks)
            self._append_audit(db, events)

    def get_session(self, session_id):
        row = self._one(f"SELECT {_SESSION_COLS} FROM sessions WHERE id = ?", (session_id,))
        if row is None:
            raise NotFound(f"session {session_id} does not exist")
        return Session(*row)

    def get_session_and_tasks(self, session_id):
        # One statement: no row at all, no such session; a session with no task, one
        # row whose task columns are NULL.
        rows = self._all(f"SELECT {_SESSION_COLS_OF_S}, t.id, t.title, t.parent, t.status,"
                         " t.note, t.updated_at FROM sessions s"
                         " LEFT JOIN tasks t ON t.session_id = s.id WHERE s.id = ?"
                         " ORDER BY t.position", (session_id,))
        if not rows:
            raise NotFound(f"session {session_id} does not exist")
        n = _SESSION_N  # the session's columns, then the task's
        return Session(*rows[0][:n]), [_task(session_id, r[n:], self.sealed) for r in rows
                                       if r[n] is not None]

    def list_sessions(self):
        return [Session(*r) for r in self._all(
            f"SELECT {_SESSION_COLS} FROM sessions ORDER BY id")]

    def update_session(self, session_id, **fields):
        unknown = set(fields) - _MUTABLE_SESSION_FIELDS
        if unknown:
            raise ValueError(f"session fields {sorted(unknown)} cannot change")
        with self._tx() as db:
            cur = db.execute(f"UPDATE sessions SET {', '.join(f'{k} = ?' for k in fields)}"
                             " WHERE id = ?", (*fields.values(), session_id))
            if cur.rowcount == 0:
                raise NotFound(f"session {session_id} does not exist")

    # -- the fleet's leases ------------------------------------------------------------
    def renew_leases(self, host, until):
        with self._tx() as db:
            return db.execute("UPDATE sessions SET lease_expires = ? WHERE host = ? AND"
                              " released_to IS NULL", (until, host)).rowcount

    def claim_session(self, session_id, host, expected_host, until, now, **fields):
        check_claim_fields(fields)
        sets = "".join(f", {k} = ?" for k in fields)
        with self._tx() as db:
            cur = db.execute(
                f"UPDATE sessions SET host = ?, lease_expires = ?, released_to = NULL{sets}"
                " WHERE id = ? AND host = ? AND ((released_to IS NULL AND lease_expires < ?)"
                " OR released_to IN (?, '*'))",
                (host, until, *fields.values(), session_id, expected_host, now, host))
            if cur.rowcount != 1:
                row = db.execute("SELECT host, lease_expires FROM sessions WHERE id = ?",
                                 (session_id,)).fetchone()
                if row is None:
                    raise NotFound(f"session {session_id} does not exist")
                raise Aborted(f"session {session_id} is held by {row[0] or 'this host'}"
                              f" (lease until {clock(row[1])}); it was not claimed")
        return self.get_session(session_id)

    def announce_host(self, host, address, now):
        with self._tx() as db:
            db.execute("INSERT INTO hosts VALUES (?, ?, ?) ON CONFLICT (host) DO UPDATE SET"
                       " address = excluded.address, seen_at = excluded.seen_at",
                       (host, address, now))

    def host_address(self, host):
        row = self._one("SELECT address FROM hosts WHERE host = ?", (host,))
        return row[0] if row else ""

    def publish_holds(self, host, checkpoint_ids, until, now):
        with self._tx() as db:
            db.execute("DELETE FROM holds WHERE host = ? OR expires < ?", (host, now))
            db.executemany("INSERT INTO holds VALUES (?, ?, ?)",
                           [(host, cid, until) for cid in set(checkpoint_ids)])

    def held_checkpoints(self, now):
        return {r[0] for r in self._all("SELECT DISTINCT checkpoint_id FROM holds"
                                        " WHERE expires > ?", (now,))}

    def release_session(self, session_id, host, to):
        with self._tx() as db:
            cur = db.execute("UPDATE sessions SET released_to = ?, lease_expires = 0"
                             " WHERE id = ? AND host = ?", (to, session_id, host))
            if cur.rowcount != 1:
                row = db.execute("SELECT host FROM sessions WHERE id = ?",
                                 (session_id,)).fetchone()
                if row is None:
                    raise NotFound(f"session {session_id} does not exist")
                raise FailedPrecondition(f"session {session_id} is held by {row[0]!r}, not"
                                         f" {host!r}")
        return self.get_session(session_id)

    # -- checkpoints -----------------------------------------------------------------
    def append_checkpoint(self, cp, messages, expected_head, tasks, events, objects=()):
        # Pipelined (PostgreSQL): two round trips, the reads and the commit. The audit
        # chain's lock and its last link are asked for in the same round trip as the
        # head (after the session's row lock, the order every writer takes them in).
        # The next seq is read with the head, under its lock: a checkpoint committed
        # meanwhile by another daemon moved the head too (only this method moves it,
        # always to a new id), so a seq read from a snapshot that predates it is never
        # used. A duplicate id surfaces at a later round trip or the commit; in this
        # transaction only the checkpoint's id can collide (its messages are keyed by
        # it; index rows insert-or-skip, the audit chain is locked, tasks are a
        # checkpoint's own list), so any key violation is that one.
        try:
            with self._tx(pipelined=True) as db:
                head = db.execute(
                    "SELECT head, (SELECT MAX(seq) + 1 FROM checkpoints WHERE session_id = ?)"
                    " FROM sessions WHERE id = ?" + self.FOR_UPDATE,
                    (cp.session_id, cp.session_id))
                chain = self._chain_end(db) if events else None
                row = head.fetchone()
                if row is None:
                    raise NotFound(f"session {cp.session_id} does not exist")
                if row[0] != expected_head:
                    raise Aborted(f"session {cp.session_id} head moved to {row[0]}"
                                  f" (expected {expected_head})")
                cp = replace(cp, seq=row[1])
                if objects:
                    self.add_objects(db, objects)  # the blob index (BlobIndexSql)
                db.execute(f"INSERT INTO checkpoints ({_CP_COLS}) VALUES"
                           f" ({', '.join('?' * _CP_N)})", _cp_row(cp, self.sealed))
                db.executemany("INSERT INTO messages VALUES (?, ?, ?)",
                               self._message_rows(cp.id, messages))
                db.execute("UPDATE sessions SET head = ? WHERE id = ?", (cp.id, cp.session_id))
                if tasks is not None:
                    self._replace_tasks(db, cp.session_id, tasks)
                self._append_audit(db, events, chain)
        except self.integrity_errors:
            raise AlreadyExists(f"checkpoint {cp.id} already exists") from None
        return cp

    def get_checkpoint(self, checkpoint_id):
        row = self._one(f"SELECT {_CP_COLS} FROM checkpoints WHERE id = ?", (checkpoint_id,))
        if row is None:
            raise NotFound(f"checkpoint {checkpoint_id} does not exist")
        return _cp(row, self.sealed)

    def list_checkpoints(self, session_id=None, limit=None, before_seq=None):
        if session_id is None:
            rows = self._all(f"SELECT {_CP_COLS} FROM checkpoints ORDER BY session_id, seq")
        elif limit is None and before_seq is None:
            self.get_session(session_id)
            rows = self._all(f"SELECT {_CP_COLS} FROM checkpoints WHERE session_id = ?"
                             " ORDER BY seq", (session_id,))
        else:
            self.get_session(session_id)
            sql, args = f"SELECT {_CP_COLS} FROM checkpoints WHERE session_id = ?", [session_id]
            if before_seq is not None:
                sql += " AND seq < ?"
                args.append(before_seq)
            sql += " ORDER BY seq DESC"
            if limit is not None:
                sql += " LIMIT ?"
                args.append(limit)
            rows = self._all(sql, tuple(args))[::-1]
        return [_cp(r, self.sealed) for r in rows]

    def count_checkpoints(self, session_id):
        self.get_session(session_id)
        return self._all("SELECT count(*) FROM checkpoints WHERE session_id = ?",
                         (session_id,))[0][0]

    def prune_checkpoints(self, checkpoint_ids, events):
        with self._tx() as db:
            db.executemany("UPDATE checkpoints SET pruned = 1 WHERE id = ?",
                           [(cid,) for cid in checkpoint_ids])
            self._append_audit(db, events)

    def conversation(self, checkpoint_id):
        self.get_checkpoint(checkpoint_id)
        rows = self._all(
            "WITH RECURSIVE chain(id, depth) AS ("
            " SELECT ?, 0 UNION ALL"
            " SELECT c.conversation_parent, chain.depth + 1 FROM checkpoints c"
            " JOIN chain ON c.id = chain.id WHERE c.conversation_parent IS NOT NULL)"
            " SELECT m.body, m.checkpoint_id, m.idx FROM chain"
            " JOIN messages m ON m.checkpoint_id = chain.id"
            " ORDER BY chain.depth DESC, m.idx", (checkpoint_id,))
        if self.sealed.key is None:
            return [r[0] for r in rows]
        out = []
        for body, cid, idx in rows:  # each checkpoint's messages, one sealed array
            out.extend(json.loads(self.sealed.open_text(body, "messages", "body", cid, idx)))
        return out

    def _message_rows(self, checkpoint_id: str, messages: list[str]) -> list[tuple]:
        """The ``messages`` rows of a checkpoint: one a message; with a data key, one
        for them all (row 0: a JSON array of the messages, sealed), so a conversation
        read back costs an open a checkpoint, not a message."""
        if self.sealed.key is None:
            return [(checkpoint_id, i, m) for i, m in enumerate(messages)]
        if not messages:
            return []
        return [(checkpoint_id, 0, self.sealed.seal_text(json.dumps(list(messages)),
                                                         "messages", "body", checkpoint_id, 0))]

    def lineage(self, checkpoint_id):
        self.get_checkpoint(checkpoint_id)
        rows = self._all(
            "WITH RECURSIVE chain(id, depth) AS ("
            " SELECT ?, 0 UNION ALL"
            " SELECT c.parent_id, chain.depth + 1 FROM checkpoints c"
            " JOIN chain ON c.id = chain.id WHERE c.parent_id IS NOT NULL)"
            " SELECT chain.id, c.session_id FROM chain JOIN checkpoints c ON c.id = chain.id"
            " ORDER BY depth", (checkpoint_id,))
        return [(r[0], r[1]) for r in rows]

    # -- tool calls -------------------------------------------------------------------
    def add_tool_call(self, call, events):
        with self._tx() as db:
            if call.approval_id:  # the approval's row serialises the calls citing it
                db.execute("SELECT id FROM approvals WHERE id = ?" + self.FOR_UPDATE,
                           (call.approval_id,))
                used = db.execute("SELECT id FROM tool_calls WHERE approval_id = ?",
                                  (call.approval_id,)).fetchone()
                if used is not None:
                    raise FailedPrecondition(f"approval {call.approval_id} was already used"
                                             f" by tool call {used[0]}")
            db.execute("INSERT INTO tool_calls VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       _tool_call_row(call, self.sealed))
            self._append_audit(db, events)

    def list_tool_calls(self, session_id=None, checkpoint_ids=None):
        sql, args = "SELECT * FROM tool_calls WHERE 1=1", []
        if session_id is not None:
            sql += " AND session_id = ?"
            args.append(session_id)
        if checkpoint_ids is not None:
            ids = list(checkpoint_ids)
            if not ids:
                return []
            sql += " AND " + self.IN_LIST.format(column="checkpoint_id")
            args.append(self._list_arg(ids))
        return [_tool_call(r, self.sealed)
                for r in self._all(sql + " ORDER BY id", tuple(args))]

    # -- tasks ---------------------------------------------------------------------------
    def set_task(self, session_id, task, events):
        with self._tx() as db:
            if db.execute("SELECT 1 FROM sessions WHERE id = ?" + self.FOR_UPDATE,
                          (session_id,)).fetchone() is None:
                raise NotFound(f"session {session_id} does not exist")
            (pos,) = db.execute("SELECT COALESCE(MAX(position), 0) + 1 FROM tasks"
                                " WHERE session_id = ?", (session_id,)).fetchone()
            db.execute(
                "INSERT INTO tasks VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (session_id, id)"
                " DO UPDATE SET title = excluded.title, parent = excluded.parent,"
                " status = excluded.status, note = excluded.note, updated_at = excluded.updated_at",
                _task_row(session_id, pos, task, self.sealed))
            self._append_audit(db, events)

    def list_tasks(self, session_id):
        return self.get_session_and_tasks(session_id)[1]

    def _replace_tasks(self, db, session_id: str, tasks: list[Task]) -> None:
        db.execute("DELETE FROM tasks WHERE session_id = ?", (session_id,))
        db.executemany("INSERT INTO tasks VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                       [_task_row(session_id, i, t, self.sealed)
                        for i, t in enumerate(tasks, 1)])

    # -- approvals ---------------------------------------------------------------------------
    def add_approval(self, approval, events):
        with self._tx() as db:
            db.execute("INSERT INTO approvals VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       _approval_row(approval, self.sealed))
            self._append_audit(db, events)

    def get_approval(self, approval_id):
        row = self._one("SELECT * FROM approvals WHERE id = ?", (approval_id,))
        if row is None:
            raise NotFound(f"approval {approval_id} does not exist")
        return _approval(row, self.sealed)

    def decide_approval(self, approval_id, status, reason, decided_at, events):
        with self._tx() as db:
            cur = db.execute("UPDATE approvals SET status = ?, reason = ?, decided_at = ?"
                             " WHERE id = ? AND status = 'pending'",
                             (status, reason, decided_at, approval_id))
            if cur.rowcount != 1:
                row = db.execute("SELECT status FROM approvals WHERE id = ?",
                                 (approval_id,)).fetchone()
                if row is None:
                    raise NotFound(f"approval {approval_id} does not exist")
                raise FailedPrecondition(f"approval {approval_id} is already {row[0]}")
            self._append_audit(db, events)
            return _approval(db.execute("SELECT * FROM approvals WHERE id = ?",
                                        (approval_id,)).fetchone(), self.sealed)

    def list_approvals(self, session_id=None, status=None):
        sql, args = "SELECT * FROM approvals WHERE 1=1", []
        if session_id is not None:
            sql += " AND session_id = ?"
            args.append(session_id)
        if status is not None:
            sql += " AND status = ?"
            args.append(status)
        return [_approval(r, self.sealed)
                for r in self._all(sql + " ORDER BY id", tuple(args))]

    # -- audit -------------------------------------------------------------------------------
    def append_audit(self, events):
        with self._tx() as db:
            self._append_audit(db, events)

    def _chain_end(self, db):
        """The audit chain locked for this transaction, and its last link asked for: a
        cursor, whose row a pipelined transaction reads with the next round trip."""
        self._lock_chain(db)
        return db.execute("SELECT seq, hash, detail FROM audit ORDER BY seq DESC LIMIT 1")

    def _append_audit(self, db, events: list[AuditEvent], chain=None) -> None:
        """Append ``events`` to the chain (``chain``: ``_chain_end``'s cursor, when the
        caller asked for it earlier in this transaction)."""
        if not events:
            return
        row = (chain if chain is not None else self._chain_end(db)).fetchone()
        if row is None:
            seq, prev = 0, GENESIS_HASH
        elif self.sealed.key is None:
            seq, prev = row[0], digest_out(row[1])
        else:
            seq, prev = row[0], _sealed_link(row[0], row[2], self.sealed)[2]
        for event in events:
            seq += 1
            event = replace(event, seq=seq)
            digest = chain_hash(prev, event)
            db.execute("INSERT INTO audit VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                       _audit_row(event, prev, digest, self.sealed))
            prev = digest

    def list_audit(self, session_id=None, kind=None, limit=0, since=None, after_seq=None):
        sql, args = "SELECT * FROM audit WHERE 1=1", []
        if since is not None:  # ids.now's fixed-width form sorts as the times do
            sql += " AND created_at >= ?"
            args.append(since)
        if after_seq is not None:
            sql += " AND seq > ?"
            args.append(after_seq)
        if session_id is not None:
            sql += " AND session_id = ?"
            args.append(session_id)
        if kind is not None:
            sql += " AND kind = ?"
            args.append(kind)
        if limit:  # the newest, read alone (--notify's start asks for the last one)
            rows = self._all(sql + " ORDER BY seq DESC LIMIT ?", (*args, limit))[::-1]
        else:
            rows = self._all(sql + " ORDER BY seq", tuple(args))
        return [_event(r, self.sealed) for r in rows]

