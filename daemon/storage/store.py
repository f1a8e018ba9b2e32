"""The reference metadata store, ``MemoryStore`` (a dict per record kind, one lock), and
the reads every caller of a ``Store`` shares (``with_gates``, ``calls_on_path``,
``ordered_tasks``). The contract is ``Store`` in metadata_store.py, its fleet leases
``LeaseStore`` in leases.py.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import replace

from worldline.wire.errors import (
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
from .leases import check_claim_fields, claimable
from .metadata_store import Store


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

    def flush_later(self) -> AbstractContextManager[Callable[[], None]]:
        return nullcontext(lambda: None)  # nothing to make durable

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
