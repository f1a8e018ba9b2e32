"""What the client hands back: plain dataclasses, each with ``to_dict()`` giving the
CLI's JSON (the keys of CONTRACT.md, plus more)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._client import Client


def _opt(text: str) -> str | None:
    return text or None


def _json(text: str) -> Any:
    return json.loads(text) if text else None


class _Record:
    def to_dict(self) -> dict:
        out = {}
        for f in fields(self):
            if f.name.startswith("_") or f.metadata.get("local"):
                continue
            value = getattr(self, f.name)
            if isinstance(value, _Record):
                value = value.to_dict()
            elif isinstance(value, list):
                value = [v.to_dict() if isinstance(v, _Record) else v for v in value]
            out[f.name] = value
        return out


@dataclass
class Checkpoint(_Record):
    id: str
    session_id: str
    seq: int
    parent_id: str | None
    label: str
    reasoning: str
    trace_id: str
    created_at: str
    kind: str
    restored_from: str | None
    tree: str
    bytes: int
    messages_added: int
    message_count: int
    acknowledged_side_effects: list[str]
    container: str | None  # digest of the container layer, if the session has a container
    pruned: bool  # retention let go of its files
    resume: dict | None = None  # where the agent's own conversation stood (hooks)
    # what it may lack or hold wrongly, in words (a transcript a hook could not read, a
    # gated call that ran anyway); empty for most
    warnings: list[str] = field(default_factory=list)

    @classmethod
    def from_pb(cls, m) -> Checkpoint:
        return cls(m.id, m.session_id, m.seq, _opt(m.parent_id), m.label, m.reasoning,
                   m.trace_id, m.created_at, m.kind, _opt(m.restored_from), m.tree, m.bytes,
                   m.messages_added, m.message_count, list(m.acknowledged_side_effects),
                   _opt(m.container), m.pruned, _json(m.resume_json), list(m.warnings))


@dataclass
class Task(_Record):
    id: str
    title: str
    parent: str | None
    status: str
    note: str
    updated_at: str

    @classmethod
    def from_pb(cls, m) -> Task:
        return cls(m.id, m.title, _opt(m.parent), m.status, m.note, m.updated_at)


@dataclass
class CheckpointDetail(Checkpoint):
    messages: list = field(default_factory=list)
    state: dict = field(default_factory=dict)
    tasks: list[Task] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # recorded, never recreated

    @classmethod
    def from_pb(cls, m) -> CheckpointDetail:
        base = Checkpoint.from_pb(m.checkpoint)
        return cls(**{f.name: getattr(base, f.name) for f in fields(Checkpoint)},
                   messages=_json(m.messages_json) or [], state=_json(m.state_json) or {},
                   tasks=[Task.from_pb(t) for t in m.tasks], skipped=list(m.skipped))


@dataclass
class SideEffect(_Record):
    tool_call_id: str
    tool: str
    args_summary: str
    created_at: str
    checkpoint_id: str
    effect: str
    gate: str | None = None  # "bypassed": a gated call that ran without an approval

    @classmethod
    def from_pb(cls, m) -> SideEffect:
        return cls(m.tool_call_id, m.tool, m.args_summary, m.created_at, m.checkpoint_id,
                   m.effect, _opt(m.gate))


@dataclass
class LayerRestore(_Record):
    """What a restore wrote and removed in one layer (the container's)."""

    files_written: list[str]
    files_removed: list[str]

    @classmethod
    def from_pb(cls, m) -> LayerRestore:
        return cls(sorted(list(m.added) + list(m.modified)), list(m.deleted))


@dataclass
class RestoreResult(_Record):
    """Paths are workspace-relative; one that is not UTF-8 arrives escaped
    (``worldline.client.paths.unescape`` gives its bytes back)."""

    checkpoint: Checkpoint | None
    restored_from: str
    files_written: list[str]
    files_removed: list[str]
    side_effects: list[SideEffect]
    dry_run: bool
    container: LayerRestore | None = None  # None when the session has no container
    warnings: list[str] = field(default_factory=list)
    # The checkpoint of the world just before the restore (label "before restore"),
    # None when it equalled the head; the paths that differed from the head (kept
    # there; a container's prefixed "container:"); the container's processes stopped.
    before: Checkpoint | None = None
    not_checkpointed: list[str] = field(default_factory=list)
    processes: list[str] = field(default_factory=list)
    # The restored state, upgraded by the client's migrations (None without them: read
    # it with ``show``); not part of the CLI's JSON.
    state: dict | None = field(default=None, metadata={"local": True})

    @classmethod
    def from_pb(cls, m) -> RestoreResult:
        return cls(Checkpoint.from_pb(m.checkpoint) if m.HasField("checkpoint") else None,
                   m.restored_from, list(m.files_written), list(m.files_removed),
                   [SideEffect.from_pb(s) for s in m.side_effects], m.dry_run,
                   LayerRestore.from_pb(m.container) if m.HasField("container") else None,
                   list(m.warnings),
                   Checkpoint.from_pb(m.before) if m.HasField("before") else None,
                   list(m.not_checkpointed), list(m.processes))


@dataclass
class PathChange(_Record):
    """A checkpoint that changed one path: ``change`` is added, modified or deleted;
    ``tool_calls``, the calls made since the checkpoint before it."""

    checkpoint: Checkpoint
    change: str
    tool_calls: list[ToolCall]
    patch: str = ""

    @classmethod
    def from_pb(cls, m) -> PathChange:
        return cls(Checkpoint.from_pb(m.checkpoint), m.change,
                   [ToolCall.from_pb(t) for t in m.tool_calls], m.patch)


@dataclass
class Diff(_Record):
    added: list[str]
    modified: list[str]
    deleted: list[str]
    patch: str = ""
    container: Diff | None = None  # the container layer's changes, when there is one

    @classmethod
    def from_pb(cls, m) -> Diff:
        box = m.container if m.HasField("container") else None
        return cls(list(m.added), list(m.modified), list(m.deleted), m.patch,
                   cls(list(box.added), list(box.modified), list(box.deleted))
                   if box is not None else None)


@dataclass
class ToolCall(_Record):
    id: str
    session_id: str
    name: str
    args: Any
    result: Any
    effect: str
    idempotency_key: str | None
    checkpoint_id: str
    created_at: str
    replayed: bool
    rule: str
    approval_id: str | None
    gate: str | None = None  # "bypassed": a gated call that ran without an approval

    @classmethod
    def from_pb(cls, m) -> ToolCall:
        return cls(m.id, m.session_id, m.name, _json(m.args_json), _json(m.result_json),
                   m.effect, _opt(m.idempotency_key), m.checkpoint_id, m.created_at, m.replayed,
                   m.rule, _opt(m.approval_id), _opt(m.gate))


@dataclass
class Approval(_Record):
    id: str
    session_id: str
    tool: str
    args: Any
    status: str
    checkpoint_id: str
    reason: str
    created_at: str
    decided_at: str | None
    expires_at: str

    @classmethod
    def from_pb(cls, m) -> Approval:
        return cls(m.id, m.session_id, m.tool, _json(m.args_json), m.status, m.checkpoint_id,
                   m.reason, m.created_at, _opt(m.decided_at), m.expires_at)


@dataclass
class PolicyDecision(_Record):
    effect: str
    rule: str
    requires_approval: bool
    approver: str = "caller"  # whose approval counts for the caller: "caller" or "owner"


@dataclass
class AuditEvent(_Record):
    seq: int
    kind: str
    session_id: str | None
    subject_id: str
    detail: dict
    created_at: str
    hash: str
    prev_hash: str

    @classmethod
    def from_pb(cls, m) -> AuditEvent:
        return cls(m.seq, m.kind, _opt(m.session_id), m.subject_id, _json(m.detail_json) or {},
                   m.created_at, m.hash, m.prev_hash)


@dataclass
class Session(_Record):
    """A session, with the agent-side calls bound to it."""

    id: str
    name: str
    workspace: str
    container: str | None
    head: str
    forked_from: str | None
    created_at: str
    needs_attention: str | None = None  # why an operator must look at it
    deleted_at: str | None = None  # its workspace was released; its history remains
    host: str | None = None  # the fleet host that holds it (None on a one-host data root)
    lease_expires: float = 0.0  # when that host's lease runs out (seconds since the epoch)
    released_to: str | None = None  # the host a move released it to
    _client: Client | None = field(default=None, repr=False, compare=False)
    # exclusions (gitignore patterns): the session's own, and (get_session only) those
    # of the .worldlineignore in its head checkpoint
    exclude: list[str] = field(default_factory=list)
    ignore_file: list[str] = field(default_factory=list)

    @classmethod
    def from_pb(cls, m, client: Client) -> Session:
        return cls(m.id, m.name, m.workspace, _opt(m.container), m.head, _opt(m.forked_from),
                   m.created_at, _opt(m.needs_attention), _opt(m.deleted_at), _opt(m.host),
                   m.lease_expires, _opt(m.released_to), client, list(m.exclude),
                   list(m.ignore_file))

    def checkpoint(self, label: str | None = None, reasoning: str | None = None,
                   messages: list | None = None, state: dict | None = None,
                   trace_id: str | None = None, expected_head: str | None = None,
                   warnings: list[str] | None = None) -> Checkpoint:
        cp = self._client.checkpoint(self.id, label=label, reasoning=reasoning,
                                     messages=messages, state=state, trace_id=trace_id,
                                     expected_head=expected_head, warnings=warnings)
        self.head = cp.id
        return cp

    def restore(self, checkpoint_id: str, acknowledge_side_effects: bool = False,
                dry_run: bool = False, from_other_session: bool = False,
                paths: list[str] | None = None) -> RestoreResult:
        result = self._client.restore(self.id, checkpoint_id,
                                      acknowledge_side_effects=acknowledge_side_effects,
                                      dry_run=dry_run, from_other_session=from_other_session,
                                      paths=paths)
        if result.checkpoint is not None:
            self.head = result.checkpoint.id
        return result

    def fork(self, checkpoint_id: str, workspace: str | None = None,
             name: str | None = None, volumes: str | None = None) -> Session:
        return self._client.fork(checkpoint_id, workspace=workspace, name=name,
                                 volumes=volumes)

    def log(self) -> list[Checkpoint]:
        return self._client.log(self.id)

    def record_tool_call(self, name: str, args: dict | None = None, effect: str | None = None,
                         result: Any = None, idempotency_key: str | None = None,
                         approval_id: str | None = None) -> ToolCall:
        return self._client.record_tool_call(self.id, name, args=args, effect=effect,
                                             result=result, idempotency_key=idempotency_key,
                                             approval_id=approval_id)

    def set_task(self, task_id: str, status: str, title: str | None = None,
                 parent: str | None = None, note: str | None = None) -> Task:
        return self._client.set_task(self.id, task_id, status, title=title, parent=parent,
                                     note=note)

    def tasks(self) -> tuple[list[Task], str | None]:
        return self._client.tasks(self.id)

    def request_approval(self, tool: str, args: dict | None = None,
                         ttl: float | None = None) -> Approval:
        return self._client.request_approval(self.id, tool, args=args, ttl=ttl)
