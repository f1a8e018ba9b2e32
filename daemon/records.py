"""The records of worldline's history. Records are append-only; the only mutable
things are a session's head (compare-and-set), its working task list, and an
approval's status (pending → approved | denied | expired, once)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, fields

TASK_STATUSES = ("pending", "in_progress", "completed", "failed", "skipped")
APPROVAL_STATUSES = ("pending", "approved", "denied", "expired")
CHECKPOINT_KINDS = ("initial", "checkpoint", "restore", "fork")
AUDIT_KINDS = ("session.create", "session.delete", "session.resolve", "session.copied",
               "checkpoint", "restore",
               "restore.completed", "restore.set_aside", "restore.failed",
               "side_effects.acknowledge", "fork",
               "container.recreate", "image.export", "tool_call", "tool_call.replay", "task",
               "approval.request", "approval.approved", "approval.denied", "approval.expired",
               "gate_bypassed",
               "retention.prune", "gc", "graph.thread_deleted", "graph.runs_deleted",
               "graph.pruned", "graph.thread_copied")


@dataclass(frozen=True)
class Session:
    id: str
    name: str
    workspace: str
    container: str | None
    head: str
    forked_from: str | None
    created_at: str
    # What the session's world is made of, recorded when it is created (JSON): each
    # layer root's identity (st_dev, st_ino) and the container's creation spec.
    spec: str = "{}"
    needs_attention: str | None = None  # why an operator must look at it, or None
    # When the session was deleted (its history kept, its workspace released), or None.
    deleted_at: str | None = None
    # The fleet: the host that holds the session ("" on a data root of one host), until
    # when its lease runs (seconds since the epoch; renewed while the host runs), and
    # the host it was released to by a move, or None.
    host: str = ""
    lease_expires: float = 0.0
    released_to: str | None = None


@dataclass(frozen=True)
class Checkpoint:
    id: str
    session_id: str
    seq: int
    parent_id: str | None
    kind: str
    created_at: str
    tree: str  # digest of the workspace's root tree
    bytes: int
    state_digest: str  # blob holding the agent state (JSON object)
    tasks_digest: str  # blob holding the task list as of this checkpoint
    conversation_parent: str | None  # checkpoint whose conversation precedes this one's
    messages_added: int
    message_count: int
    label: str = ""
    reasoning: str = ""
    trace_id: str = ""
    restored_from: str | None = None
    container: str | None = None  # digest of the container snapshot, if any
    acknowledged: tuple[str, ...] = ()  # tool call ids acknowledged by this restore
    pruned: bool = False  # retention let go of its trees; the record itself stays
    # Where the agent's own conversation stood (canonical JSON object, "" when not
    # told): the agent, its session id, its transcript and the last entry recorded,
    # so a restore can say where to resume the agent. Restores and forks carry their
    # target's.
    resume: str = ""
    # What the checkpoint may lack or say wrongly, in words: the caller's (a transcript
    # the hook could not read) and the daemon's (World.warn_next_checkpoint).
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class ToolCall:
    id: str
    session_id: str
    name: str
    args_json: str
    result_json: str | None
    effect: str
    idempotency_key: str | None
    checkpoint_id: str
    created_at: str
    rule: str = ""
    approval_id: str | None = None
    replayed: bool = False
    gate: str = ""  # "bypassed": from its gate_bypassed audit event, not a column


@dataclass(frozen=True)
class Task:
    id: str
    title: str
    parent: str | None
    status: str
    note: str
    updated_at: str


@dataclass(frozen=True)
class Approval:
    id: str
    session_id: str
    tool: str
    args_json: str
    status: str
    checkpoint_id: str
    created_at: str
    expires_at: str
    reason: str = ""
    decided_at: str | None = None


@dataclass(frozen=True)
class AuditEvent:
    """One line of the audit log. ``seq``, ``prev_hash`` and ``hash`` are set by the store."""

    kind: str
    session_id: str | None
    subject_id: str
    detail: dict = field(default_factory=dict)
    created_at: str = ""
    seq: int = 0
    prev_hash: str = ""
    hash: str = ""


GENESIS_HASH = "0" * 64


def chain_hash(prev_hash: str, event: AuditEvent) -> str:
    """The hash of an audit event, chained to the one before it."""
    body = {f.name: getattr(event, f.name) for f in fields(event)
            if f.name not in ("hash", "prev_hash")}  # asdict would deep-copy the detail
    payload = prev_hash + json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def tasks_to_json(tasks: list[Task]) -> bytes:
    return json.dumps([{f.name: getattr(t, f.name) for f in fields(t)} for t in tasks],
                      sort_keys=True,
                      separators=(",", ":")).encode("utf-8")


def tasks_from_json(data: bytes) -> list[Task]:
    return [Task(**row) for row in json.loads(data)]
