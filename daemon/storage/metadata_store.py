"""The Store contract: the world's records (sessions, checkpoints, conversation, tool
calls, tasks, approvals and the audit log) and the compare-and-set that moves a
session's head.

Terms
- Records are those of ``records.py``. A session's *head* is the id of its latest
  checkpoint. A checkpoint's *lineage* is the chain of parents from it back to the
  first checkpoint of the first session it descends from (forks included).
- The *audit log* is one sequence of events for the whole store, each chained to the
  one before by hash (``records.chain_hash``): a rewritten or dropped event breaks the
  chain (``worldline fsck``).

Lifecycle
- Records are appended and never rewritten. The only updates are a session's head
  (``append_checkpoint``, compare-and-set), its mutable fields (``update_session``:
  container, spec, needs_attention, deleted_at), its working task list (``set_task``,
  and replaced whole by a checkpoint that carries one), an approval's status (once,
  from pending), a checkpoint's pruned mark (``prune_checkpoints``), and the fleet's
  leases (``LeaseStore``, leases.py).
- A checkpoint's blobs are durable before its record is appended (BlobStore.sync):
  a record never names a blob that a crash could lose.
- The store is opened once by the daemon (storage/config.py), shared by every thread,
  and closed at its stop (``close``).

Guarantees
- Atomicity: every method is one transaction. ``append_checkpoint`` inserts the
  checkpoint, its messages, its tasks, its audit events and the index rows of its
  bucket objects, and moves the head, or does nothing. Audit events passed to a
  method are chained into the log in the same transaction.
- Durability: a method that returned is durable; on a ``local`` store a checkpoint's
  commit may return before its fsync within ``sqlite_store.flushes_deferred``, whose
  flush the caller takes before it acknowledges anything.
- Errors: ``NotFound`` for unknown ids; ``Aborted`` when the head is not the one
  expected, and for a claim or gc lock another host won; ``FailedPrecondition`` when
  an approval is no longer pending or was used; ``AlreadyExists`` for a duplicate id;
  ``Unavailable`` when a fleet's database cannot be reached (callers retry).

Implementations: ``MemoryStore`` (the reference, store.py), ``SqliteStore`` (the
embedded default, sqlite_store.py) and ``PostgresStore`` (a fleet's, postgres_store.py),
the two SQL ones sharing their statements (sql_store.py); tests/test_store_contract.py
holds every one to this contract.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from contextlib import AbstractContextManager
from typing import Protocol

from ..records import Approval, AuditEvent, Checkpoint, Session, Task, ToolCall
from .blob_index import StoredObject
from .leases import LeaseStore


class Store(LeaseStore, Protocol):
    """The world's records; the module's docstring is the contract."""

    # True when a commit writes only this host's disk, its one wait an fsync (which
    # ``flush_later`` can take later); False for a fleet's database,
    # whose every commit waits on the network.
    local: bool

    def flush_later(self) -> AbstractContextManager[Callable[[], None]] | None:
        """A block within which this thread's commits return before they are durable,
        yielding the callable that makes them so: called after the block, before
        anything is acknowledged (a checkpoint's commit is then CPU work in its capture's
        turn, its fsync after). None when a commit waits on the network, which no block
        can move out of the way."""

    def create_session(self, session: Session, first: Checkpoint, tasks: list[Task],
                       events: list[AuditEvent]) -> None: ...
    def get_session(self, session_id: str) -> Session: ...
    def get_session_and_tasks(self, session_id: str) -> tuple[Session, list[Task]]:
        """The session and its working task list, read together (one statement: a
        checkpoint's reads of both cost one round trip on a fleet's store)."""
    def list_sessions(self) -> list[Session]: ...

    def update_session(self, session_id: str, **fields) -> None:
        """Change a session's mutable fields (``container``, ``spec``,
        ``needs_attention``, ``deleted_at``); its head moves only by
        ``append_checkpoint``, its host only by ``claim_session``."""

    def append_checkpoint(self, cp: Checkpoint, messages: list[str], expected_head: str,
                          tasks: list[Task] | None, events: list[AuditEvent],
                          objects: list[StoredObject] = ()) -> Checkpoint:
        """Insert ``cp`` (its ``seq`` assigned here) and move its session's head to it,
        provided the head is still ``expected_head``; with ``tasks``, the session's
        working task list becomes exactly those. ``objects`` (the bucket objects holding
        the checkpoint's new blobs, ``BlobStore.committing``) go into the blob index in
        the same transaction; a store with no blob index takes none."""

    def get_checkpoint(self, checkpoint_id: str) -> Checkpoint: ...
    def list_checkpoints(self, session_id: str | None = None, limit: int | None = None,
                         before_seq: int | None = None) -> list[Checkpoint]:
        """Checkpoints oldest first (all sessions' by session, then seq); of one session,
        with ``limit`` and ``before_seq``, only its newest ``limit`` with a seq below
        ``before_seq`` (a page of a long history, still oldest first)."""
    def count_checkpoints(self, session_id: str) -> int: ...
    def prune_checkpoints(self, checkpoint_ids: list[str], events: list[AuditEvent]) -> None:
        """Mark checkpoints pruned: their records stay (lineage, conversation, audit),
        their trees are no longer kept by garbage collection."""

    def conversation(self, checkpoint_id: str) -> list[str]:
        """Every message (JSON text) of the conversation as of the checkpoint, in order."""
    def lineage(self, checkpoint_id: str) -> list[tuple[str, str]]:
        """(checkpoint id, session id) from this one back through its parents, newest first."""

    def add_tool_call(self, call: ToolCall, events: list[AuditEvent]) -> None:
        """Record a tool call; one citing an approval another call already cited is
        FAILED_PRECONDITION (an approval is used up by the call it allowed)."""
    def list_tool_calls(self, session_id: str | None = None,
                        checkpoint_ids: Collection[str] | None = None) -> list[ToolCall]: ...

    def set_task(self, session_id: str, task: Task, events: list[AuditEvent]) -> None: ...
    def list_tasks(self, session_id: str) -> list[Task]:
        """The working task list, in order of creation."""

    def add_approval(self, approval: Approval, events: list[AuditEvent]) -> None: ...
    def get_approval(self, approval_id: str) -> Approval: ...
    def decide_approval(self, approval_id: str, status: str, reason: str, decided_at: str,
                        events: list[AuditEvent]) -> Approval: ...
    def list_approvals(self, session_id: str | None = None,
                       status: str | None = None) -> list[Approval]: ...

    def append_audit(self, events: list[AuditEvent]) -> None: ...

    def gc_lock(self) -> AbstractContextManager[None]:
        """Held while garbage collection runs: one collector at a time across every
        daemon sharing the store (``Aborted`` at once if another holds it)."""
    def list_audit(self, session_id: str | None = None, kind: str | None = None,
                   limit: int = 0, since: str | None = None,
                   after_seq: int | None = None) -> list[AuditEvent]:
        """The audit log in order; ``since`` (ids.now's form): only events recorded at
        or after that time; ``after_seq``: only events after that one in the log (an
        event's time is taken before its transaction, and on a fleet by another host's
        clock: a later seq may carry an earlier time)."""

    def sealed_problems(self) -> list[str]:
        """With a data key (sealed.py): every sealed value read and its tag checked, a
        line for each that does not open (fsck); none without a key."""

    def close(self) -> None: ...
