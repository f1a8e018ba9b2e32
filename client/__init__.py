"""The worldline client: ``from worldline.client import Client``.

Every error is a ``WorldlineError`` subclass named after its gRPC status code; see
``worldline.client.errors`` for the whole tree.
"""

from ._client import Client
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
from .helpers import ApprovalDenied, AsyncClient, guarded, recorded, require_approval
from .models import (
    Approval,
    AuditEvent,
    Checkpoint,
    CheckpointDetail,
    Diff,
    PolicyDecision,
    RestoreResult,
    Session,
    SideEffect,
    Task,
    ToolCall,
)

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
    "PermissionDenied",
    "PolicyDecision",
    "ResourceExhausted",
    "RestoreResult",
    "Session",
    "SideEffect",
    "Task",
    "ToolCall",
    "Unauthenticated",
    "Unavailable",
    "WorldlineError",
    "guarded",
    "recorded",
    "require_approval",
]
