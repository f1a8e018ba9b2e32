"""The one error vocabulary of worldline, shared by the daemon and the client.

Every error names the gRPC status code it travels as. The daemon's domain raises
these classes and never imports grpc; one server interceptor turns them into
statuses, and the client turns statuses back into the same classes, so a caller
catches ``worldline.client.NotFound`` (the same class, re-exported) whichever side
raised it::

    WorldlineError                 base; .code is the gRPC status name
    ├── InvalidArgument            bad input: malformed ids, JSON, paths, statuses
    ├── NotFound                   an id that names nothing
    ├── AlreadyExists              a session for a workspace that has one, ...
    ├── FailedPrecondition         a restore over unacknowledged side effects, ...
    ├── Aborted                    a lost compare-and-set on a session's head
    ├── ResourceExhausted          disk full, messages over the size limits
    ├── PermissionDenied           a caller or path that is not allowed
    ├── Unauthenticated            a missing or wrong bearer token
    ├── DeadlineExceeded           a wait that ran out
    ├── Unavailable                the daemon or the Docker engine is unreachable
    ├── DataLoss                   a blob whose bytes no longer match its digest
    └── Internal                   a bug: anything else
"""

from __future__ import annotations

__all__ = [
    "Aborted",
    "AlreadyExists",
    "DataLoss",
    "DeadlineExceeded",
    "FailedPrecondition",
    "Internal",
    "InvalidArgument",
    "NotFound",
    "PermissionDenied",
    "ResourceExhausted",
    "Unauthenticated",
    "Unavailable",
    "WorldlineError",
    "error_for_code",
]


class WorldlineError(Exception):
    """Base of every worldline error; ``code`` is a gRPC status code name."""

    code = "UNKNOWN"

    def __init__(self, message: str = "") -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class InvalidArgument(WorldlineError):
    code = "INVALID_ARGUMENT"


class NotFound(WorldlineError):
    code = "NOT_FOUND"


class AlreadyExists(WorldlineError):
    code = "ALREADY_EXISTS"


class FailedPrecondition(WorldlineError):
    code = "FAILED_PRECONDITION"


class Aborted(WorldlineError):
    code = "ABORTED"


class ResourceExhausted(WorldlineError):
    code = "RESOURCE_EXHAUSTED"


class PermissionDenied(WorldlineError):
    code = "PERMISSION_DENIED"


class Unauthenticated(WorldlineError):
    code = "UNAUTHENTICATED"


class DeadlineExceeded(WorldlineError):
    code = "DEADLINE_EXCEEDED"


class Unavailable(WorldlineError):
    code = "UNAVAILABLE"


class DataLoss(WorldlineError):
    code = "DATA_LOSS"


class Internal(WorldlineError):
    code = "INTERNAL"


_BY_CODE = {
    cls.code: cls
    for cls in (
        InvalidArgument, NotFound, AlreadyExists, FailedPrecondition, Aborted,
        ResourceExhausted, PermissionDenied, Unauthenticated, DeadlineExceeded,
        Unavailable, DataLoss, Internal,
    )
}


def error_for_code(code_name: str, message: str) -> WorldlineError:
    """The error class for a gRPC status name; unknown codes become the base class."""
    cls = _BY_CODE.get(code_name)
    if cls is None:
        err = WorldlineError(message)
        err.code = code_name
        return err
    return cls(message)
