from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Session(_message.Message):
    __slots__ = ("id", "name", "workspace", "container", "head", "forked_from", "created_at", "needs_attention", "deleted_at", "host", "lease_expires", "released_to", "exclude", "ignore_file")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_FIELD_NUMBER: _ClassVar[int]
    HEAD_FIELD_NUMBER: _ClassVar[int]
    FORKED_FROM_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    NEEDS_ATTENTION_FIELD_NUMBER: _ClassVar[int]
    DELETED_AT_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRES_FIELD_NUMBER: _ClassVar[int]
    RELEASED_TO_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_FIELD_NUMBER: _ClassVar[int]
    IGNORE_FILE_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    workspace: str
    container: str
    head: str
    forked_from: str
    created_at: str
    needs_attention: str
    deleted_at: str
    host: str
    lease_expires: float
    released_to: str
    exclude: _containers.RepeatedScalarFieldContainer[str]
    ignore_file: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., workspace: _Optional[str] = ..., container: _Optional[str] = ..., head: _Optional[str] = ..., forked_from: _Optional[str] = ..., created_at: _Optional[str] = ..., needs_attention: _Optional[str] = ..., deleted_at: _Optional[str] = ..., host: _Optional[str] = ..., lease_expires: _Optional[float] = ..., released_to: _Optional[str] = ..., exclude: _Optional[_Iterable[str]] = ..., ignore_file: _Optional[_Iterable[str]] = ...) -> None: ...

class ResolveSessionRequest(_message.Message):
    __slots__ = ("session_id", "complete")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    complete: bool
    def __init__(self, session_id: _Optional[str] = ..., complete: _Optional[bool] = ...) -> None: ...

class CreateSessionRequest(_message.Message):
    __slots__ = ("workspace", "container", "name", "image", "mount", "exclude")
    WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    MOUNT_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_FIELD_NUMBER: _ClassVar[int]
    workspace: str
    container: str
    name: str
    image: str
    mount: str
    exclude: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, workspace: _Optional[str] = ..., container: _Optional[str] = ..., name: _Optional[str] = ..., image: _Optional[str] = ..., mount: _Optional[str] = ..., exclude: _Optional[_Iterable[str]] = ...) -> None: ...

class GetSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class DeleteSessionRequest(_message.Message):
    __slots__ = ("session_id", "keep_container")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    KEEP_CONTAINER_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    keep_container: bool
    def __init__(self, session_id: _Optional[str] = ..., keep_container: _Optional[bool] = ...) -> None: ...

class MoveSessionRequest(_message.Message):
    __slots__ = ("session_id", "to_host", "take_over", "workspace")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TO_HOST_FIELD_NUMBER: _ClassVar[int]
    TAKE_OVER_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    to_host: str
    take_over: bool
    workspace: str
    def __init__(self, session_id: _Optional[str] = ..., to_host: _Optional[str] = ..., take_over: _Optional[bool] = ..., workspace: _Optional[str] = ...) -> None: ...

class ListSessionsRequest(_message.Message):
    __slots__ = ("include_deleted", "workspace")
    INCLUDE_DELETED_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    include_deleted: bool
    workspace: str
    def __init__(self, include_deleted: _Optional[bool] = ..., workspace: _Optional[str] = ...) -> None: ...

class ListSessionsResponse(_message.Message):
    __slots__ = ("sessions",)
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    sessions: _containers.RepeatedCompositeFieldContainer[Session]
    def __init__(self, sessions: _Optional[_Iterable[_Union[Session, _Mapping]]] = ...) -> None: ...

class Checkpoint(_message.Message):
    __slots__ = ("id", "session_id", "seq", "parent_id", "label", "reasoning", "trace_id", "created_at", "kind", "restored_from", "tree", "bytes", "messages_added", "message_count", "acknowledged_side_effects", "container", "pruned", "resume_json", "warnings")
    ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    PARENT_ID_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    REASONING_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    RESTORED_FROM_FIELD_NUMBER: _ClassVar[int]
    TREE_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_ADDED_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_COUNT_FIELD_NUMBER: _ClassVar[int]
    ACKNOWLEDGED_SIDE_EFFECTS_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_FIELD_NUMBER: _ClassVar[int]
    PRUNED_FIELD_NUMBER: _ClassVar[int]
    RESUME_JSON_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    id: str
    session_id: str
    seq: int
    parent_id: str
    label: str
    reasoning: str
    trace_id: str
    created_at: str
    kind: str
    restored_from: str
    tree: str
    bytes: int
    messages_added: int
    message_count: int
    acknowledged_side_effects: _containers.RepeatedScalarFieldContainer[str]
    container: str
    pruned: bool
    resume_json: str
    warnings: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: _Optional[str] = ..., session_id: _Optional[str] = ..., seq: _Optional[int] = ..., parent_id: _Optional[str] = ..., label: _Optional[str] = ..., reasoning: _Optional[str] = ..., trace_id: _Optional[str] = ..., created_at: _Optional[str] = ..., kind: _Optional[str] = ..., restored_from: _Optional[str] = ..., tree: _Optional[str] = ..., bytes: _Optional[int] = ..., messages_added: _Optional[int] = ..., message_count: _Optional[int] = ..., acknowledged_side_effects: _Optional[_Iterable[str]] = ..., container: _Optional[str] = ..., pruned: _Optional[bool] = ..., resume_json: _Optional[str] = ..., warnings: _Optional[_Iterable[str]] = ...) -> None: ...

class CheckpointRequest(_message.Message):
    __slots__ = ("session_id", "label", "reasoning", "trace_id", "messages_json", "state_json", "expected_head", "resume_json", "warnings")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    REASONING_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_JSON_FIELD_NUMBER: _ClassVar[int]
    STATE_JSON_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_HEAD_FIELD_NUMBER: _ClassVar[int]
    RESUME_JSON_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    label: str
    reasoning: str
    trace_id: str
    messages_json: str
    state_json: str
    expected_head: str
    resume_json: str
    warnings: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, session_id: _Optional[str] = ..., label: _Optional[str] = ..., reasoning: _Optional[str] = ..., trace_id: _Optional[str] = ..., messages_json: _Optional[str] = ..., state_json: _Optional[str] = ..., expected_head: _Optional[str] = ..., resume_json: _Optional[str] = ..., warnings: _Optional[_Iterable[str]] = ...) -> None: ...

class GetCheckpointRequest(_message.Message):
    __slots__ = ("checkpoint_id",)
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: str
    def __init__(self, checkpoint_id: _Optional[str] = ...) -> None: ...

class CheckpointDetail(_message.Message):
    __slots__ = ("checkpoint", "messages_json", "state_json", "tasks", "skipped")
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_JSON_FIELD_NUMBER: _ClassVar[int]
    STATE_JSON_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    checkpoint: Checkpoint
    messages_json: str
    state_json: str
    tasks: _containers.RepeatedCompositeFieldContainer[Task]
    skipped: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, checkpoint: _Optional[_Union[Checkpoint, _Mapping]] = ..., messages_json: _Optional[str] = ..., state_json: _Optional[str] = ..., tasks: _Optional[_Iterable[_Union[Task, _Mapping]]] = ..., skipped: _Optional[_Iterable[str]] = ...) -> None: ...

class ListCheckpointsRequest(_message.Message):
    __slots__ = ("session_id", "limit", "before_seq")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    BEFORE_SEQ_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    limit: int
    before_seq: int
    def __init__(self, session_id: _Optional[str] = ..., limit: _Optional[int] = ..., before_seq: _Optional[int] = ...) -> None: ...

class ListCheckpointsResponse(_message.Message):
    __slots__ = ("checkpoints", "total")
    CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    checkpoints: _containers.RepeatedCompositeFieldContainer[Checkpoint]
    total: int
    def __init__(self, checkpoints: _Optional[_Iterable[_Union[Checkpoint, _Mapping]]] = ..., total: _Optional[int] = ...) -> None: ...

class DiffRequest(_message.Message):
    __slots__ = ("from_id", "to_id", "patch")
    FROM_ID_FIELD_NUMBER: _ClassVar[int]
    TO_ID_FIELD_NUMBER: _ClassVar[int]
    PATCH_FIELD_NUMBER: _ClassVar[int]
    from_id: str
    to_id: str
    patch: bool
    def __init__(self, from_id: _Optional[str] = ..., to_id: _Optional[str] = ..., patch: _Optional[bool] = ...) -> None: ...

class LayerChanges(_message.Message):
    __slots__ = ("added", "modified", "deleted")
    ADDED_FIELD_NUMBER: _ClassVar[int]
    MODIFIED_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    added: _containers.RepeatedScalarFieldContainer[str]
    modified: _containers.RepeatedScalarFieldContainer[str]
    deleted: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, added: _Optional[_Iterable[str]] = ..., modified: _Optional[_Iterable[str]] = ..., deleted: _Optional[_Iterable[str]] = ...) -> None: ...

class DiffResponse(_message.Message):
    __slots__ = ("added", "modified", "deleted", "patch", "container")
    ADDED_FIELD_NUMBER: _ClassVar[int]
    MODIFIED_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    PATCH_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_FIELD_NUMBER: _ClassVar[int]
    added: _containers.RepeatedScalarFieldContainer[str]
    modified: _containers.RepeatedScalarFieldContainer[str]
    deleted: _containers.RepeatedScalarFieldContainer[str]
    patch: str
    container: LayerChanges
    def __init__(self, added: _Optional[_Iterable[str]] = ..., modified: _Optional[_Iterable[str]] = ..., deleted: _Optional[_Iterable[str]] = ..., patch: _Optional[str] = ..., container: _Optional[_Union[LayerChanges, _Mapping]] = ...) -> None: ...

class SideEffect(_message.Message):
    __slots__ = ("tool_call_id", "tool", "args_summary", "created_at", "checkpoint_id", "effect", "gate")
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    ARGS_SUMMARY_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    EFFECT_FIELD_NUMBER: _ClassVar[int]
    GATE_FIELD_NUMBER: _ClassVar[int]
    tool_call_id: str
    tool: str
    args_summary: str
    created_at: str
    checkpoint_id: str
    effect: str
    gate: str
    def __init__(self, tool_call_id: _Optional[str] = ..., tool: _Optional[str] = ..., args_summary: _Optional[str] = ..., created_at: _Optional[str] = ..., checkpoint_id: _Optional[str] = ..., effect: _Optional[str] = ..., gate: _Optional[str] = ...) -> None: ...

class RestoreRequest(_message.Message):
    __slots__ = ("session_id", "checkpoint_id", "acknowledge_side_effects", "dry_run", "expected_head", "operation_id", "from_other_session", "paths")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    ACKNOWLEDGE_SIDE_EFFECTS_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_HEAD_FIELD_NUMBER: _ClassVar[int]
    OPERATION_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_OTHER_SESSION_FIELD_NUMBER: _ClassVar[int]
    PATHS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    checkpoint_id: str
    acknowledge_side_effects: bool
    dry_run: bool
    expected_head: str
    operation_id: str
    from_other_session: bool
    paths: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, session_id: _Optional[str] = ..., checkpoint_id: _Optional[str] = ..., acknowledge_side_effects: _Optional[bool] = ..., dry_run: _Optional[bool] = ..., expected_head: _Optional[str] = ..., operation_id: _Optional[str] = ..., from_other_session: _Optional[bool] = ..., paths: _Optional[_Iterable[str]] = ...) -> None: ...

class RestoreResponse(_message.Message):
    __slots__ = ("checkpoint", "restored_from", "files_written", "files_removed", "side_effects", "dry_run", "container", "warnings", "before", "not_checkpointed", "processes")
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    RESTORED_FROM_FIELD_NUMBER: _ClassVar[int]
    FILES_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    FILES_REMOVED_FIELD_NUMBER: _ClassVar[int]
    SIDE_EFFECTS_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    BEFORE_FIELD_NUMBER: _ClassVar[int]
    NOT_CHECKPOINTED_FIELD_NUMBER: _ClassVar[int]
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    checkpoint: Checkpoint
    restored_from: str
    files_written: _containers.RepeatedScalarFieldContainer[str]
    files_removed: _containers.RepeatedScalarFieldContainer[str]
    side_effects: _containers.RepeatedCompositeFieldContainer[SideEffect]
    dry_run: bool
    container: LayerChanges
    warnings: _containers.RepeatedScalarFieldContainer[str]
    before: Checkpoint
    not_checkpointed: _containers.RepeatedScalarFieldContainer[str]
    processes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, checkpoint: _Optional[_Union[Checkpoint, _Mapping]] = ..., restored_from: _Optional[str] = ..., files_written: _Optional[_Iterable[str]] = ..., files_removed: _Optional[_Iterable[str]] = ..., side_effects: _Optional[_Iterable[_Union[SideEffect, _Mapping]]] = ..., dry_run: _Optional[bool] = ..., container: _Optional[_Union[LayerChanges, _Mapping]] = ..., warnings: _Optional[_Iterable[str]] = ..., before: _Optional[_Union[Checkpoint, _Mapping]] = ..., not_checkpointed: _Optional[_Iterable[str]] = ..., processes: _Optional[_Iterable[str]] = ...) -> None: ...

class ForkRequest(_message.Message):
    __slots__ = ("checkpoint_id", "workspace", "name", "operation_id", "volumes")
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    OPERATION_ID_FIELD_NUMBER: _ClassVar[int]
    VOLUMES_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: str
    workspace: str
    name: str
    operation_id: str
    volumes: str
    def __init__(self, checkpoint_id: _Optional[str] = ..., workspace: _Optional[str] = ..., name: _Optional[str] = ..., operation_id: _Optional[str] = ..., volumes: _Optional[str] = ...) -> None: ...

class ExportImageRequest(_message.Message):
    __slots__ = ("checkpoint_id",)
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: str
    def __init__(self, checkpoint_id: _Optional[str] = ...) -> None: ...

class ExportImageResponse(_message.Message):
    __slots__ = ("image_id", "reference")
    IMAGE_ID_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_FIELD_NUMBER: _ClassVar[int]
    image_id: str
    reference: str
    def __init__(self, image_id: _Optional[str] = ..., reference: _Optional[str] = ...) -> None: ...

class ForkResponse(_message.Message):
    __slots__ = ("session", "side_effects")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    SIDE_EFFECTS_FIELD_NUMBER: _ClassVar[int]
    session: Session
    side_effects: _containers.RepeatedCompositeFieldContainer[SideEffect]
    def __init__(self, session: _Optional[_Union[Session, _Mapping]] = ..., side_effects: _Optional[_Iterable[_Union[SideEffect, _Mapping]]] = ...) -> None: ...

class ToolCall(_message.Message):
    __slots__ = ("id", "session_id", "name", "args_json", "result_json", "effect", "idempotency_key", "checkpoint_id", "created_at", "replayed", "rule", "approval_id", "gate")
    ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGS_JSON_FIELD_NUMBER: _ClassVar[int]
    RESULT_JSON_FIELD_NUMBER: _ClassVar[int]
    EFFECT_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    GATE_FIELD_NUMBER: _ClassVar[int]
    id: str
    session_id: str
    name: str
    args_json: str
    result_json: str
    effect: str
    idempotency_key: str
    checkpoint_id: str
    created_at: str
    replayed: bool
    rule: str
    approval_id: str
    gate: str
    def __init__(self, id: _Optional[str] = ..., session_id: _Optional[str] = ..., name: _Optional[str] = ..., args_json: _Optional[str] = ..., result_json: _Optional[str] = ..., effect: _Optional[str] = ..., idempotency_key: _Optional[str] = ..., checkpoint_id: _Optional[str] = ..., created_at: _Optional[str] = ..., replayed: _Optional[bool] = ..., rule: _Optional[str] = ..., approval_id: _Optional[str] = ..., gate: _Optional[str] = ...) -> None: ...

class RecordToolCallRequest(_message.Message):
    __slots__ = ("session_id", "name", "args_json", "result_json", "effect", "idempotency_key", "approval_id", "gate")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGS_JSON_FIELD_NUMBER: _ClassVar[int]
    RESULT_JSON_FIELD_NUMBER: _ClassVar[int]
    EFFECT_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    GATE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    name: str
    args_json: str
    result_json: str
    effect: str
    idempotency_key: str
    approval_id: str
    gate: str
    def __init__(self, session_id: _Optional[str] = ..., name: _Optional[str] = ..., args_json: _Optional[str] = ..., result_json: _Optional[str] = ..., effect: _Optional[str] = ..., idempotency_key: _Optional[str] = ..., approval_id: _Optional[str] = ..., gate: _Optional[str] = ...) -> None: ...

class ListToolCallsRequest(_message.Message):
    __slots__ = ("session_id", "checkpoint_ids")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_IDS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    checkpoint_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, session_id: _Optional[str] = ..., checkpoint_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ListToolCallsResponse(_message.Message):
    __slots__ = ("tool_calls",)
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    def __init__(self, tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ...) -> None: ...

class ExplainPolicyRequest(_message.Message):
    __slots__ = ("tool", "args_json")
    TOOL_FIELD_NUMBER: _ClassVar[int]
    ARGS_JSON_FIELD_NUMBER: _ClassVar[int]
    tool: str
    args_json: str
    def __init__(self, tool: _Optional[str] = ..., args_json: _Optional[str] = ...) -> None: ...

class PolicyDecision(_message.Message):
    __slots__ = ("effect", "rule", "requires_approval", "approver")
    EFFECT_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    REQUIRES_APPROVAL_FIELD_NUMBER: _ClassVar[int]
    APPROVER_FIELD_NUMBER: _ClassVar[int]
    effect: str
    rule: str
    requires_approval: bool
    approver: str
    def __init__(self, effect: _Optional[str] = ..., rule: _Optional[str] = ..., requires_approval: _Optional[bool] = ..., approver: _Optional[str] = ...) -> None: ...

class Task(_message.Message):
    __slots__ = ("id", "title", "parent", "status", "note", "updated_at")
    ID_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    id: str
    title: str
    parent: str
    status: str
    note: str
    updated_at: str
    def __init__(self, id: _Optional[str] = ..., title: _Optional[str] = ..., parent: _Optional[str] = ..., status: _Optional[str] = ..., note: _Optional[str] = ..., updated_at: _Optional[str] = ...) -> None: ...

class SetTaskRequest(_message.Message):
    __slots__ = ("session_id", "task_id", "status", "title", "parent", "note")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    task_id: str
    status: str
    title: str
    parent: str
    note: str
    def __init__(self, session_id: _Optional[str] = ..., task_id: _Optional[str] = ..., status: _Optional[str] = ..., title: _Optional[str] = ..., parent: _Optional[str] = ..., note: _Optional[str] = ...) -> None: ...

class ListTasksRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class ListTasksResponse(_message.Message):
    __slots__ = ("tasks", "resume")
    TASKS_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[Task]
    resume: str
    def __init__(self, tasks: _Optional[_Iterable[_Union[Task, _Mapping]]] = ..., resume: _Optional[str] = ...) -> None: ...

class Approval(_message.Message):
    __slots__ = ("id", "session_id", "tool", "args_json", "status", "checkpoint_id", "reason", "created_at", "decided_at", "expires_at")
    ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    ARGS_JSON_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    DECIDED_AT_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    id: str
    session_id: str
    tool: str
    args_json: str
    status: str
    checkpoint_id: str
    reason: str
    created_at: str
    decided_at: str
    expires_at: str
    def __init__(self, id: _Optional[str] = ..., session_id: _Optional[str] = ..., tool: _Optional[str] = ..., args_json: _Optional[str] = ..., status: _Optional[str] = ..., checkpoint_id: _Optional[str] = ..., reason: _Optional[str] = ..., created_at: _Optional[str] = ..., decided_at: _Optional[str] = ..., expires_at: _Optional[str] = ...) -> None: ...

class RequestApprovalRequest(_message.Message):
    __slots__ = ("session_id", "tool", "args_json", "ttl_seconds")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    ARGS_JSON_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    tool: str
    args_json: str
    ttl_seconds: float
    def __init__(self, session_id: _Optional[str] = ..., tool: _Optional[str] = ..., args_json: _Optional[str] = ..., ttl_seconds: _Optional[float] = ...) -> None: ...

class GetApprovalRequest(_message.Message):
    __slots__ = ("approval_id",)
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    approval_id: str
    def __init__(self, approval_id: _Optional[str] = ...) -> None: ...

class WaitApprovalRequest(_message.Message):
    __slots__ = ("approval_id", "timeout_seconds")
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    approval_id: str
    timeout_seconds: float
    def __init__(self, approval_id: _Optional[str] = ..., timeout_seconds: _Optional[float] = ...) -> None: ...

class ListApprovalsRequest(_message.Message):
    __slots__ = ("session_id", "status")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    status: str
    def __init__(self, session_id: _Optional[str] = ..., status: _Optional[str] = ...) -> None: ...

class ListApprovalsResponse(_message.Message):
    __slots__ = ("approvals",)
    APPROVALS_FIELD_NUMBER: _ClassVar[int]
    approvals: _containers.RepeatedCompositeFieldContainer[Approval]
    def __init__(self, approvals: _Optional[_Iterable[_Union[Approval, _Mapping]]] = ...) -> None: ...

class CancelApprovalRequest(_message.Message):
    __slots__ = ("approval_id", "reason")
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    approval_id: str
    reason: str
    def __init__(self, approval_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class DecideApprovalRequest(_message.Message):
    __slots__ = ("approval_id", "approve", "reason")
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    APPROVE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    approval_id: str
    approve: bool
    reason: str
    def __init__(self, approval_id: _Optional[str] = ..., approve: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class AuditEvent(_message.Message):
    __slots__ = ("seq", "kind", "session_id", "subject_id", "detail_json", "created_at", "hash", "prev_hash")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_ID_FIELD_NUMBER: _ClassVar[int]
    DETAIL_JSON_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    PREV_HASH_FIELD_NUMBER: _ClassVar[int]
    seq: int
    kind: str
    session_id: str
    subject_id: str
    detail_json: str
    created_at: str
    hash: str
    prev_hash: str
    def __init__(self, seq: _Optional[int] = ..., kind: _Optional[str] = ..., session_id: _Optional[str] = ..., subject_id: _Optional[str] = ..., detail_json: _Optional[str] = ..., created_at: _Optional[str] = ..., hash: _Optional[str] = ..., prev_hash: _Optional[str] = ...) -> None: ...

class ListAuditRequest(_message.Message):
    __slots__ = ("session_id", "kind", "limit")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    kind: str
    limit: int
    def __init__(self, session_id: _Optional[str] = ..., kind: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class ListAuditResponse(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[AuditEvent]
    def __init__(self, events: _Optional[_Iterable[_Union[AuditEvent, _Mapping]]] = ...) -> None: ...

class WaitAuditRequest(_message.Message):
    __slots__ = ("after_seq", "kinds", "session_id", "timeout_seconds")
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    KINDS_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    after_seq: int
    kinds: _containers.RepeatedScalarFieldContainer[str]
    session_id: str
    timeout_seconds: float
    def __init__(self, after_seq: _Optional[int] = ..., kinds: _Optional[_Iterable[str]] = ..., session_id: _Optional[str] = ..., timeout_seconds: _Optional[float] = ...) -> None: ...

class WaitAuditResponse(_message.Message):
    __slots__ = ("events", "last_seq")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[AuditEvent]
    last_seq: int
    def __init__(self, events: _Optional[_Iterable[_Union[AuditEvent, _Mapping]]] = ..., last_seq: _Optional[int] = ...) -> None: ...

class VerifyAuditRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class VerifyAuditResponse(_message.Message):
    __slots__ = ("ok", "events", "problems")
    OK_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    PROBLEMS_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    events: int
    problems: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, ok: _Optional[bool] = ..., events: _Optional[int] = ..., problems: _Optional[_Iterable[str]] = ...) -> None: ...

class FsckRequest(_message.Message):
    __slots__ = ("repair", "cached", "read_data_subset", "repair_from")
    REPAIR_FIELD_NUMBER: _ClassVar[int]
    CACHED_FIELD_NUMBER: _ClassVar[int]
    READ_DATA_SUBSET_FIELD_NUMBER: _ClassVar[int]
    REPAIR_FROM_FIELD_NUMBER: _ClassVar[int]
    repair: bool
    cached: bool
    read_data_subset: str
    repair_from: str
    def __init__(self, repair: _Optional[bool] = ..., cached: _Optional[bool] = ..., read_data_subset: _Optional[str] = ..., repair_from: _Optional[str] = ...) -> None: ...

class FsckFile(_message.Message):
    __slots__ = ("checkpoint_id", "path")
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: str
    path: str
    def __init__(self, checkpoint_id: _Optional[str] = ..., path: _Optional[str] = ...) -> None: ...

class FsckBlob(_message.Message):
    __slots__ = ("digest", "object", "state", "reason", "checkpoints", "files", "mended_to")
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    MENDED_TO_FIELD_NUMBER: _ClassVar[int]
    digest: str
    object: str
    state: str
    reason: str
    checkpoints: _containers.RepeatedScalarFieldContainer[str]
    files: _containers.RepeatedCompositeFieldContainer[FsckFile]
    mended_to: str
    def __init__(self, digest: _Optional[str] = ..., object: _Optional[str] = ..., state: _Optional[str] = ..., reason: _Optional[str] = ..., checkpoints: _Optional[_Iterable[str]] = ..., files: _Optional[_Iterable[_Union[FsckFile, _Mapping]]] = ..., mended_to: _Optional[str] = ...) -> None: ...

class FsckResponse(_message.Message):
    __slots__ = ("ok", "problems", "blobs_checked", "checkpoints_checked", "repaired", "source", "read_data_subset", "objects_checked", "objects_total", "bytes_read", "broken", "unchecked", "not_repaired")
    OK_FIELD_NUMBER: _ClassVar[int]
    PROBLEMS_FIELD_NUMBER: _ClassVar[int]
    BLOBS_CHECKED_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINTS_CHECKED_FIELD_NUMBER: _ClassVar[int]
    REPAIRED_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    READ_DATA_SUBSET_FIELD_NUMBER: _ClassVar[int]
    OBJECTS_CHECKED_FIELD_NUMBER: _ClassVar[int]
    OBJECTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    BYTES_READ_FIELD_NUMBER: _ClassVar[int]
    BROKEN_FIELD_NUMBER: _ClassVar[int]
    UNCHECKED_FIELD_NUMBER: _ClassVar[int]
    NOT_REPAIRED_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    problems: _containers.RepeatedScalarFieldContainer[str]
    blobs_checked: int
    checkpoints_checked: int
    repaired: _containers.RepeatedScalarFieldContainer[str]
    source: str
    read_data_subset: str
    objects_checked: int
    objects_total: int
    bytes_read: int
    broken: _containers.RepeatedCompositeFieldContainer[FsckBlob]
    unchecked: _containers.RepeatedScalarFieldContainer[str]
    not_repaired: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, ok: _Optional[bool] = ..., problems: _Optional[_Iterable[str]] = ..., blobs_checked: _Optional[int] = ..., checkpoints_checked: _Optional[int] = ..., repaired: _Optional[_Iterable[str]] = ..., source: _Optional[str] = ..., read_data_subset: _Optional[str] = ..., objects_checked: _Optional[int] = ..., objects_total: _Optional[int] = ..., bytes_read: _Optional[int] = ..., broken: _Optional[_Iterable[_Union[FsckBlob, _Mapping]]] = ..., unchecked: _Optional[_Iterable[str]] = ..., not_repaired: _Optional[_Iterable[str]] = ...) -> None: ...

class GcRequest(_message.Message):
    __slots__ = ("dry_run", "keep_last", "keep_labelled", "keep_newer_than_seconds", "operation_id")
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    KEEP_LAST_FIELD_NUMBER: _ClassVar[int]
    KEEP_LABELLED_FIELD_NUMBER: _ClassVar[int]
    KEEP_NEWER_THAN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    OPERATION_ID_FIELD_NUMBER: _ClassVar[int]
    dry_run: bool
    keep_last: int
    keep_labelled: bool
    keep_newer_than_seconds: float
    operation_id: str
    def __init__(self, dry_run: _Optional[bool] = ..., keep_last: _Optional[int] = ..., keep_labelled: _Optional[bool] = ..., keep_newer_than_seconds: _Optional[float] = ..., operation_id: _Optional[str] = ...) -> None: ...

class GcResponse(_message.Message):
    __slots__ = ("blobs_removed", "bytes_freed", "dry_run", "checkpoints_pruned", "images_removed", "views_removed")
    BLOBS_REMOVED_FIELD_NUMBER: _ClassVar[int]
    BYTES_FREED_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINTS_PRUNED_FIELD_NUMBER: _ClassVar[int]
    IMAGES_REMOVED_FIELD_NUMBER: _ClassVar[int]
    VIEWS_REMOVED_FIELD_NUMBER: _ClassVar[int]
    blobs_removed: int
    bytes_freed: int
    dry_run: bool
    checkpoints_pruned: int
    images_removed: int
    views_removed: int
    def __init__(self, blobs_removed: _Optional[int] = ..., bytes_freed: _Optional[int] = ..., dry_run: _Optional[bool] = ..., checkpoints_pruned: _Optional[int] = ..., images_removed: _Optional[int] = ..., views_removed: _Optional[int] = ...) -> None: ...

class GetProgressRequest(_message.Message):
    __slots__ = ("operation_id",)
    OPERATION_ID_FIELD_NUMBER: _ClassVar[int]
    operation_id: str
    def __init__(self, operation_id: _Optional[str] = ...) -> None: ...

class Progress(_message.Message):
    __slots__ = ("operation_id", "phase", "unit", "done", "total", "files", "finished")
    OPERATION_ID_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    UNIT_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    operation_id: str
    phase: str
    unit: str
    done: int
    total: int
    files: int
    finished: bool
    def __init__(self, operation_id: _Optional[str] = ..., phase: _Optional[str] = ..., unit: _Optional[str] = ..., done: _Optional[int] = ..., total: _Optional[int] = ..., files: _Optional[int] = ..., finished: _Optional[bool] = ...) -> None: ...

class TypedValue(_message.Message):
    __slots__ = ("type", "data")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    type: str
    data: bytes
    def __init__(self, type: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...

class GraphBlob(_message.Message):
    __slots__ = ("channel", "version", "value")
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    channel: str
    version: str
    value: TypedValue
    def __init__(self, channel: _Optional[str] = ..., version: _Optional[str] = ..., value: _Optional[_Union[TypedValue, _Mapping]] = ...) -> None: ...

class GraphWrite(_message.Message):
    __slots__ = ("task_id", "idx", "channel", "value", "task_path")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    IDX_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    TASK_PATH_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    idx: int
    channel: str
    value: TypedValue
    task_path: str
    def __init__(self, task_id: _Optional[str] = ..., idx: _Optional[int] = ..., channel: _Optional[str] = ..., value: _Optional[_Union[TypedValue, _Mapping]] = ..., task_path: _Optional[str] = ...) -> None: ...

class GraphCheckpoint(_message.Message):
    __slots__ = ("thread_id", "checkpoint_ns", "checkpoint_id", "parent_id", "checkpoint", "metadata_json", "versions_json", "world_checkpoint_id", "created_at")
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_NS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    METADATA_JSON_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_JSON_FIELD_NUMBER: _ClassVar[int]
    WORLD_CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    parent_id: str
    checkpoint: TypedValue
    metadata_json: str
    versions_json: str
    world_checkpoint_id: str
    created_at: str
    def __init__(self, thread_id: _Optional[str] = ..., checkpoint_ns: _Optional[str] = ..., checkpoint_id: _Optional[str] = ..., parent_id: _Optional[str] = ..., checkpoint: _Optional[_Union[TypedValue, _Mapping]] = ..., metadata_json: _Optional[str] = ..., versions_json: _Optional[str] = ..., world_checkpoint_id: _Optional[str] = ..., created_at: _Optional[str] = ...) -> None: ...

class GraphTuple(_message.Message):
    __slots__ = ("checkpoint", "blobs", "writes")
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    BLOBS_FIELD_NUMBER: _ClassVar[int]
    WRITES_FIELD_NUMBER: _ClassVar[int]
    checkpoint: GraphCheckpoint
    blobs: _containers.RepeatedCompositeFieldContainer[GraphBlob]
    writes: _containers.RepeatedCompositeFieldContainer[GraphWrite]
    def __init__(self, checkpoint: _Optional[_Union[GraphCheckpoint, _Mapping]] = ..., blobs: _Optional[_Iterable[_Union[GraphBlob, _Mapping]]] = ..., writes: _Optional[_Iterable[_Union[GraphWrite, _Mapping]]] = ...) -> None: ...

class PutGraphCheckpointRequest(_message.Message):
    __slots__ = ("checkpoint", "blobs", "workspace", "record_world")
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    BLOBS_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    RECORD_WORLD_FIELD_NUMBER: _ClassVar[int]
    checkpoint: GraphCheckpoint
    blobs: _containers.RepeatedCompositeFieldContainer[GraphBlob]
    workspace: str
    record_world: bool
    def __init__(self, checkpoint: _Optional[_Union[GraphCheckpoint, _Mapping]] = ..., blobs: _Optional[_Iterable[_Union[GraphBlob, _Mapping]]] = ..., workspace: _Optional[str] = ..., record_world: _Optional[bool] = ...) -> None: ...

class PutGraphCheckpointResponse(_message.Message):
    __slots__ = ("world_checkpoint_id", "session_id")
    WORLD_CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    world_checkpoint_id: str
    session_id: str
    def __init__(self, world_checkpoint_id: _Optional[str] = ..., session_id: _Optional[str] = ...) -> None: ...

class PutGraphWritesRequest(_message.Message):
    __slots__ = ("thread_id", "checkpoint_ns", "checkpoint_id", "writes")
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_NS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    WRITES_FIELD_NUMBER: _ClassVar[int]
    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    writes: _containers.RepeatedCompositeFieldContainer[GraphWrite]
    def __init__(self, thread_id: _Optional[str] = ..., checkpoint_ns: _Optional[str] = ..., checkpoint_id: _Optional[str] = ..., writes: _Optional[_Iterable[_Union[GraphWrite, _Mapping]]] = ...) -> None: ...

class PutGraphWritesResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetGraphCheckpointRequest(_message.Message):
    __slots__ = ("thread_id", "checkpoint_ns", "checkpoint_id")
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_NS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    def __init__(self, thread_id: _Optional[str] = ..., checkpoint_ns: _Optional[str] = ..., checkpoint_id: _Optional[str] = ...) -> None: ...

class GetGraphCheckpointResponse(_message.Message):
    __slots__ = ("found", "tuple")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    TUPLE_FIELD_NUMBER: _ClassVar[int]
    found: bool
    tuple: GraphTuple
    def __init__(self, found: _Optional[bool] = ..., tuple: _Optional[_Union[GraphTuple, _Mapping]] = ...) -> None: ...

class GraphCursor(_message.Message):
    __slots__ = ("checkpoint_id", "thread_id", "checkpoint_ns")
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_NS_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: str
    thread_id: str
    checkpoint_ns: str
    def __init__(self, checkpoint_id: _Optional[str] = ..., thread_id: _Optional[str] = ..., checkpoint_ns: _Optional[str] = ...) -> None: ...

class ListGraphCheckpointsRequest(_message.Message):
    __slots__ = ("any_thread", "thread_id", "any_namespace", "checkpoint_ns", "checkpoint_id", "before_id", "filter_json", "limit", "after")
    ANY_THREAD_FIELD_NUMBER: _ClassVar[int]
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    ANY_NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_NS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    BEFORE_ID_FIELD_NUMBER: _ClassVar[int]
    FILTER_JSON_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    any_thread: bool
    thread_id: str
    any_namespace: bool
    checkpoint_ns: str
    checkpoint_id: str
    before_id: str
    filter_json: str
    limit: int
    after: GraphCursor
    def __init__(self, any_thread: _Optional[bool] = ..., thread_id: _Optional[str] = ..., any_namespace: _Optional[bool] = ..., checkpoint_ns: _Optional[str] = ..., checkpoint_id: _Optional[str] = ..., before_id: _Optional[str] = ..., filter_json: _Optional[str] = ..., limit: _Optional[int] = ..., after: _Optional[_Union[GraphCursor, _Mapping]] = ...) -> None: ...

class ListGraphCheckpointsResponse(_message.Message):
    __slots__ = ("tuples", "more")
    TUPLES_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    tuples: _containers.RepeatedCompositeFieldContainer[GraphTuple]
    more: bool
    def __init__(self, tuples: _Optional[_Iterable[_Union[GraphTuple, _Mapping]]] = ..., more: _Optional[bool] = ...) -> None: ...

class DeleteGraphThreadRequest(_message.Message):
    __slots__ = ("thread_id",)
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    thread_id: str
    def __init__(self, thread_id: _Optional[str] = ...) -> None: ...

class DeleteGraphRunsRequest(_message.Message):
    __slots__ = ("run_ids",)
    RUN_IDS_FIELD_NUMBER: _ClassVar[int]
    run_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, run_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class PruneGraphThreadsRequest(_message.Message):
    __slots__ = ("thread_ids", "strategy")
    THREAD_IDS_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    thread_ids: _containers.RepeatedScalarFieldContainer[str]
    strategy: str
    def __init__(self, thread_ids: _Optional[_Iterable[str]] = ..., strategy: _Optional[str] = ...) -> None: ...

class DeleteGraphResponse(_message.Message):
    __slots__ = ("checkpoints_deleted",)
    CHECKPOINTS_DELETED_FIELD_NUMBER: _ClassVar[int]
    checkpoints_deleted: int
    def __init__(self, checkpoints_deleted: _Optional[int] = ...) -> None: ...

class CopyGraphThreadRequest(_message.Message):
    __slots__ = ("source_thread_id", "target_thread_id")
    SOURCE_THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    source_thread_id: str
    target_thread_id: str
    def __init__(self, source_thread_id: _Optional[str] = ..., target_thread_id: _Optional[str] = ...) -> None: ...

class GetGraphThreadRequest(_message.Message):
    __slots__ = ("thread_id",)
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    thread_id: str
    def __init__(self, thread_id: _Optional[str] = ...) -> None: ...

class GraphThread(_message.Message):
    __slots__ = ("thread_id", "session_id", "workspace")
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    thread_id: str
    session_id: str
    workspace: str
    def __init__(self, thread_id: _Optional[str] = ..., session_id: _Optional[str] = ..., workspace: _Optional[str] = ...) -> None: ...

class PathHistoryRequest(_message.Message):
    __slots__ = ("session_id", "path", "patch")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    PATCH_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    path: str
    patch: bool
    def __init__(self, session_id: _Optional[str] = ..., path: _Optional[str] = ..., patch: _Optional[bool] = ...) -> None: ...

class PathChange(_message.Message):
    __slots__ = ("checkpoint", "change", "tool_calls", "patch")
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    CHANGE_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    PATCH_FIELD_NUMBER: _ClassVar[int]
    checkpoint: Checkpoint
    change: str
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    patch: str
    def __init__(self, checkpoint: _Optional[_Union[Checkpoint, _Mapping]] = ..., change: _Optional[str] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ..., patch: _Optional[str] = ...) -> None: ...

class PathHistoryResponse(_message.Message):
    __slots__ = ("changes",)
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    changes: _containers.RepeatedCompositeFieldContainer[PathChange]
    def __init__(self, changes: _Optional[_Iterable[_Union[PathChange, _Mapping]]] = ...) -> None: ...

class ReadFileRequest(_message.Message):
    __slots__ = ("checkpoint_id", "path", "offset", "length")
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: str
    path: str
    offset: int
    length: int
    def __init__(self, checkpoint_id: _Optional[str] = ..., path: _Optional[str] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class ReadFileResponse(_message.Message):
    __slots__ = ("data", "size", "kind")
    DATA_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    size: int
    kind: str
    def __init__(self, data: _Optional[bytes] = ..., size: _Optional[int] = ..., kind: _Optional[str] = ...) -> None: ...

class ResolveIdRequest(_message.Message):
    __slots__ = ("text", "kind", "session_id")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    text: str
    kind: str
    session_id: str
    def __init__(self, text: _Optional[str] = ..., kind: _Optional[str] = ..., session_id: _Optional[str] = ...) -> None: ...

class ResolveIdResponse(_message.Message):
    __slots__ = ("id", "kind")
    ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    id: str
    kind: str
    def __init__(self, id: _Optional[str] = ..., kind: _Optional[str] = ...) -> None: ...
