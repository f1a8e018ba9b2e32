"""Metadata stores: sessions, checkpoints, conversation, tool calls, tasks,
approvals and the audit log.

Contract of every ``Store``:

- Terms: records are those of ``records.py``. A session's *head* is the id of its
  latest checkpoint. A checkpoint's *lineage* is the chain of parents from it back
  to the first checkpoint of the first session it descends from (forks included).
- Lifecycle: records are appended and never rewritten. The only updates are a
  session's head (``append_checkpoint``, compare-and-set), its working task list
  (``set_task``, and replaced whole by a restore) and an approval's status (once,
  from pending).
- Atomicity: every method is one transaction. ``append_checkpoint`` inserts the
  checkpoint, its messages and its audit events and moves the head, or does
  nothing. Audit events passed to a method are chained into the log in the same
  transaction.
- Errors: ``NotFound`` for unknown ids; ``Aborted`` when the head is not the one
  expected; ``FailedPrecondition`` when an approval is no longer pending;
  ``AlreadyExists`` for a duplicate id.

Implementations: ``SqliteStore`` (the embedded default), ``MemoryStore`` (the
reference and the store of tests); PostgreSQL fits the same shape. The contract
tests in tests/test_store_contract.py run against each.
"""

from __future__ import annotations

import threading
from collections.abc import Collection
from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace
from typing import Protocol

from worldline.client.errors import (
    Aborted,
    AlreadyExists,
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
from .blob_index import StoredObject


class Store(Protocol):
    # True when a commit writes only this host's disk, its one wait an fsync (which
    # ``sqlite_store.flushes_deferred`` can take later); False for a fleet's database,
    # whose every commit waits on the network.
    local: bool

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

    def renew_leases(self, host: str, until: float) -> int:
        """Extend the lease of every session ``host`` holds (and has not released) to
        ``until``; return how many."""

    def claim_session(self, session_id: str, host: str, expected_host: str, until: float,
                      now: float, **fields) -> Session:
        """Make ``host`` the session's holder with a lease until ``until`` (and set
        ``fields``: ``workspace``, ``container``, ``spec``, ``needs_attention``),
        provided it is still held by ``expected_host`` and that host's lease ran out
        before ``now`` or the session was released to ``host``: else ``Aborted``. Two
        hosts claiming one session: exactly one wins."""

    def announce_host(self, host: str, address: str, now: float) -> None:
        """Record where ``host`` answers (its advertised address, "" if none)."""

    def host_address(self, host: str) -> str:
        """The address ``host`` last announced, "" if none."""

    def publish_holds(self, host: str, checkpoint_ids: Collection[str], until: float,
                      now: float) -> None:
        """``host``'s holds become exactly ``checkpoint_ids``, each lasting until
        ``until`` (the checkpoints its restores and forks under way bring back,
        in_use.py); every host's holds that ran out before ``now`` are dropped."""

    def held_checkpoints(self, now: float) -> set[str]:
        """The checkpoints some host holds past ``now``: gc on any host of a fleet
        neither prunes them nor deletes what they name."""

    def release_session(self, session_id: str, host: str, to: str) -> Session:
        """``host`` lets go of the session for ``to`` (a host id, or "*" for any):
        its lease ends now. ``FailedPrecondition`` unless ``host`` holds it."""

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


def with_gates(store: Store, calls: list[ToolCall]) -> list[ToolCall]:
    """The calls, those recorded as gate bypasses marked so (``gate`` "bypassed"): the
    mark is their ``gate_bypassed`` audit event, one per call, kept in the audit log's
    hash chain rather than in a column of the call."""
    if not calls:
        return calls
    bypassed = {e.subject_id for session in {c.session_id for c in calls}
                for e in store.list_audit(session, "gate_bypassed")}
    return [replace(c, gate="bypassed") if c.id in bypassed else c for c in calls]


def calls_on_path(store: Store, head_id: str, since: str | None = None) -> list[ToolCall]:
    """Tool calls made on the way to ``head_id``: those whose checkpoint is in its
    lineage *and* that were made in the timeline leading to the head. A call follows
    checkpoint X in session S; when the lineage leaves X for a fork, S's later calls
    belong to S, not to the fork. With ``since``, only calls made after that
    checkpoint (``since`` itself included, as its calls came after it)."""
    lineage = store.lineage(head_id)
    behind = {cid for cid, _ in store.lineage(since)} - {since} if since else set()
    timeline = {}
    successor_session = lineage[0][1]
    for cid, session_id in lineage:
        timeline[cid] = successor_session
        successor_session = session_id
    ids = [cid for cid in timeline if cid not in behind]
    return [c for c in store.list_tool_calls(checkpoint_ids=ids)
            if c.session_id == timeline[c.checkpoint_id]]


CLAIMABLE_FIELDS = {"workspace", "container", "spec", "needs_attention"}


def check_claim_fields(fields: dict) -> None:
    unknown = set(fields) - CLAIMABLE_FIELDS
    if unknown:
        raise ValueError(f"session fields {sorted(unknown)} cannot change by a claim")


def claimable(holder: str, lease_expires: float, released_to: str | None, host: str,
              expected_host: str, now: float) -> bool:
    """Whether ``host`` may take a session held by ``holder`` (what claim_session's
    compare-and-set tests, in every store)."""
    if holder != expected_host:
        return False
    if released_to is not None:  # released for one host (or "*": any), whatever the clock
        return released_to in (host, "*")
    return lease_expires < now


def ordered_tasks(tasks: list[Task]) -> list[Task]:
    """Depth-first in creation order: each task followed by its subtasks."""
    children: dict[str | None, list[Task]] = {}
    ids = {t.id for t in tasks}
    for t in tasks:
        children.setdefault(t.parent if t.parent in ids else None, []).append(t)
    out: list[Task] = []

    def visit(parent: str | None) -> None:
        for t in children.get(parent, []):
            out.append(t)
            visit(t.id)

    visit(None)
    return out


class MemoryStore:
    """The reference store: plain dicts behind one lock."""

    local = True

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._sessions: dict[str, Session] = {}
        self._checkpoints: dict[str, Checkpoint] = {}
        self._messages: dict[str, list[str]] = {}
        self._tool_calls: dict[str, ToolCall] = {}
        self._tasks: dict[str, dict[str, Task]] = {}
        self._approvals: dict[str, Approval] = {}
        self._audit: list[AuditEvent] = []
        self._hosts: dict[str, str] = {}
        self._holds: dict[tuple[str, str], float] = {}  # (host, checkpoint id) -> until

    def create_session(self, session, first, tasks, events):
        with self._lock:
            if session.id in self._sessions or first.id in self._checkpoints:
                raise AlreadyExists(f"session {session.id} already exists")
            self._sessions[session.id] = replace(session, head=first.id)
            self._checkpoints[first.id] = first
            self._messages[first.id] = []
            self._tasks[session.id] = {t.id: t for t in tasks}
            self.append_audit(events)

    def get_session(self, session_id):
        with self._lock:
            try:
                return self._sessions[session_id]
            except KeyError:
                raise NotFound(f"session {session_id} does not exist") from None

    def list_sessions(self):
        with self._lock:
            return sorted(self._sessions.values(), key=lambda s: s.id)

    def update_session(self, session_id, **fields):
        unknown = set(fields) - {"container", "spec", "needs_attention", "deleted_at"}
        if unknown:
            raise ValueError(f"session fields {sorted(unknown)} cannot change")
        with self._lock:
            self._sessions[session_id] = replace(self.get_session(session_id), **fields)

    def renew_leases(self, host, until):
        with self._lock:
            held = [s for s in self._sessions.values()
                    if s.host == host and s.released_to is None]
            for s in held:
                self._sessions[s.id] = replace(s, lease_expires=until)
            return len(held)

    def claim_session(self, session_id, host, expected_host, until, now, **fields):
        check_claim_fields(fields)
        with self._lock:
            s = self.get_session(session_id)
            if not claimable(s.host, s.lease_expires, s.released_to, host, expected_host,
                             now):
                raise Aborted(f"session {session_id} is held by {s.host or 'this host'}"
                              f" (lease until {clock(s.lease_expires)}); it was not claimed")
            s = replace(s, host=host, lease_expires=until, released_to=None, **fields)
            self._sessions[session_id] = s
            return s

    def announce_host(self, host, address, now):
        with self._lock:
            self._hosts[host] = address

    def host_address(self, host):
        with self._lock:
            return self._hosts.get(host, "")

    def publish_holds(self, host, checkpoint_ids, until, now):
        with self._lock:
            self._holds = {k: t for k, t in self._holds.items() if k[0] != host and t >= now}
            self._holds.update({(host, cid): until for cid in checkpoint_ids})

    def held_checkpoints(self, now):
        with self._lock:
            return {cid for (_, cid), until in self._holds.items() if until > now}

    def release_session(self, session_id, host, to):
        with self._lock:
            s = self.get_session(session_id)
            if s.host != host:
                raise FailedPrecondition(f"session {session_id} is held by {s.host!r}, not"
                                         f" {host!r}")
            s = replace(s, released_to=to, lease_expires=0.0)
            self._sessions[session_id] = s
            return s

    def append_checkpoint(self, cp, messages, expected_head, tasks, events, objects=()):
        if objects:
            raise InvalidArgument("the memory store has no blob index: it serves no bucket")
        with self._lock:
            session = self.get_session(cp.session_id)
            if session.head != expected_head:
                raise Aborted(f"session {session.id} head moved to {session.head}"
                              f" (expected {expected_head})")
            if cp.id in self._checkpoints:
                raise AlreadyExists(f"checkpoint {cp.id} already exists")
            seq = max(c.seq for c in self._checkpoints.values()
                      if c.session_id == cp.session_id) + 1
            cp = replace(cp, seq=seq)
            self._checkpoints[cp.id] = cp
            self._messages[cp.id] = list(messages)
            self._sessions[session.id] = replace(session, head=cp.id)
            if tasks is not None:
                self._tasks[session.id] = {t.id: t for t in tasks}
            self.append_audit(events)
            return cp

    def get_checkpoint(self, checkpoint_id):
        with self._lock:
            try:
                return self._checkpoints[checkpoint_id]
            except KeyError:
                raise NotFound(f"checkpoint {checkpoint_id} does not exist") from None

    def list_checkpoints(self, session_id=None, limit=None, before_seq=None):
        with self._lock:
            if session_id is not None:
                self.get_session(session_id)
            cps = sorted((c for c in self._checkpoints.values()
                          if session_id is None or c.session_id == session_id),
                         key=lambda c: (c.session_id, c.seq))
            if before_seq is not None:
                cps = [c for c in cps if c.seq < before_seq]
            return cps[-limit:] if limit is not None and session_id is not None else cps

    def count_checkpoints(self, session_id):
        with self._lock:
            self.get_session(session_id)
            return sum(1 for c in self._checkpoints.values() if c.session_id == session_id)

    def prune_checkpoints(self, checkpoint_ids, events):
        with self._lock:
            for cid in checkpoint_ids:
                self._checkpoints[cid] = replace(self.get_checkpoint(cid), pruned=True)
            self.append_audit(events)

    def conversation(self, checkpoint_id):
        with self._lock:
            chain = []
            cp = self.get_checkpoint(checkpoint_id)
            while cp is not None:
                chain.append(cp.id)
                cp = self._checkpoints.get(cp.conversation_parent or "")
            out: list[str] = []
            for cid in reversed(chain):
                out.extend(self._messages[cid])
            return out

    def lineage(self, checkpoint_id):
        with self._lock:
            out = []
            cp = self.get_checkpoint(checkpoint_id)
            while cp is not None:
                out.append((cp.id, cp.session_id))
                cp = self._checkpoints.get(cp.parent_id or "")
            return out

    def add_tool_call(self, call, events):
        with self._lock:
            self.get_session(call.session_id)
            used = [c.id for c in self._tool_calls.values()
                    if call.approval_id and c.approval_id == call.approval_id]
            if used:
                raise FailedPrecondition(f"approval {call.approval_id} was already used by"
                                         f" tool call {used[0]}")
            self._tool_calls[call.id] = call
            self.append_audit(events)

    def list_tool_calls(self, session_id=None, checkpoint_ids=None):
        with self._lock:
            ids = set(checkpoint_ids) if checkpoint_ids is not None else None
            calls = [c for c in self._tool_calls.values()
                     if (session_id is None or c.session_id == session_id)
                     and (ids is None or c.checkpoint_id in ids)]
            return sorted(calls, key=lambda c: c.id)

    def set_task(self, session_id, task, events):
        with self._lock:
            self.get_session(session_id)
            self._tasks[session_id][task.id] = task  # dicts keep insertion order
            self.append_audit(events)

    def list_tasks(self, session_id):
        return self.get_session_and_tasks(session_id)[1]

    def get_session_and_tasks(self, session_id):
        with self._lock:
            return self.get_session(session_id), list(self._tasks[session_id].values())

    def add_approval(self, approval, events):
        with self._lock:
            self._approvals[approval.id] = approval
            self.append_audit(events)

    def get_approval(self, approval_id):
        with self._lock:
            try:
                return self._approvals[approval_id]
            except KeyError:
                raise NotFound(f"approval {approval_id} does not exist") from None

    def decide_approval(self, approval_id, status, reason, decided_at, events):
        with self._lock:
            current = self.get_approval(approval_id)
            if current.status != "pending":
                raise FailedPrecondition(f"approval {approval_id} is already {current.status}")
            decided = replace(current, status=status, reason=reason, decided_at=decided_at)
            self._approvals[approval_id] = decided
            self.append_audit(events)
            return decided

    def list_approvals(self, session_id=None, status=None):
        with self._lock:
            return sorted((a for a in self._approvals.values()
                           if (session_id is None or a.session_id == session_id)
                           and (status is None or a.status == status)), key=lambda a: a.id)

    @contextmanager
    def gc_lock(self):
        yield  # one process: its daemon's gc runs one at a time already

    def append_audit(self, events):
        with self._lock:
            for event in events:
                prev = self._audit[-1].hash if self._audit else GENESIS_HASH
                event = replace(event, seq=len(self._audit) + 1)
                self._audit.append(replace(event, prev_hash=prev, hash=chain_hash(prev, event)))

    def list_audit(self, session_id=None, kind=None, limit=0, since=None, after_seq=None):
        with self._lock:
            events = [e for e in self._audit
                      if (session_id is None or e.session_id == session_id)
                      and (kind is None or e.kind == kind)
                      and (since is None or e.created_at >= since)
                      and (after_seq is None or e.seq > after_seq)]
            return events[-limit:] if limit else events

    def sealed_problems(self):
        return []  # nothing sealed: the memory store keeps no data at rest

    def close(self):
        return None
