"""The error tree of worldline, as the client names it: ``worldline.client.NotFound`` is
``worldline.wire.errors.NotFound``, the one class both sides raise and catch (see
``worldline.wire.errors`` for the tree and what each code means)."""

from worldline.wire.errors import (
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
    error_for_code,
)

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
