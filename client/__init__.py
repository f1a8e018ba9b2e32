"""The worldline client: ``from worldline.client import Client``.

Every error is a ``WorldlineError`` subclass named after its gRPC status code; see
``worldline.client.errors`` for the whole tree.
"""

import importlib

from .errors import (
    Aborted,
    AlreadyExists,
    DataLoss,
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
    WorldlineError,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ._client import Client
    from .helpers import ApprovalDenied, AsyncClient, guarded, recorded, require_approval
    from .migrations import StateMigrationError, StateMigrations, StateVersionTooNew
    from .models import (
        Approval,
        AuditEvent,
        Checkpoint,
        CheckpointDetail,
        Diff,
        PathChange,
        PolicyDecision,
        RestoreResult,
        Session,
        SideEffect,
        Task,
        ToolCall,
    )

# The client, its models and helpers import grpc (about 70 ms for a new process); they
# load on first use, so `worldline hook`, which runs on every tool call, never pays it.
_LAZY = {"Client": "_client", "ApprovalDenied": "helpers", "AsyncClient": "helpers",
         "guarded": "helpers", "recorded": "helpers", "require_approval": "helpers",
         "StateMigrationError": "migrations", "StateMigrations": "migrations",
         "StateVersionTooNew": "migrations",
         **{name: "models" for name in (
             "Approval", "AuditEvent", "Checkpoint", "CheckpointDetail", "Diff",
             "PathChange", "PolicyDecision", "RestoreResult", "Session", "SideEffect", "Task",
             "ToolCall")}}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "Aborted",
    "AlreadyExists",
    "Approval",
    "ApprovalDenied",
    "AsyncClient",
    "AuditEvent",
    "Checkpoint",
    "CheckpointDetail",
    "Client",
    "DataLoss",
    "DeadlineExceeded",
    "Diff",
    "FailedPrecondition",
    "Internal",
    "InvalidArgument",
    "NotFound",
    "PathChange",
    "PermissionDenied",
    "PolicyDecision",
    "ResourceExhausted",
    "RestoreResult",
    "Session",
    "SideEffect",
    "StateMigrationError",
    "StateMigrations",
    "StateVersionTooNew",
    "Task",
    "ToolCall",
    "Unauthenticated",
    "Unavailable",
    "WorldlineError",
    "guarded",
    "recorded",
    "require_approval",
]
