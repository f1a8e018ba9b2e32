"""Agent-side helpers: the after-every-tool-call habit in one line.

    @recorded(session)                       # record the call, then checkpoint the world
    def run_tests(path): ...

    with guarded(session, label="refactor"):  # checkpoint; restore if the block raises
        rewrite_everything()

    approval = require_approval(session, "deploy", {"env": "prod"})  # blocks; raises if denied
    session.record_tool_call("deploy", {"env": "prod"}, approval_id=approval.id)

    async with AsyncClient() as client: ...  # every Client call, awaitable
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import json
from typing import Any, Callable, Iterator

from ._client import Client
from .errors import DeadlineExceeded, PermissionDenied
from .models import Approval, Checkpoint, Session


class ApprovalDenied(PermissionDenied):
    """An operator denied the approval; ``approval.reason`` says why."""

    def __init__(self, approval: Approval) -> None:
        super().__init__(f"approval {approval.id} for {approval.tool!r} was denied:"
                         f" {approval.reason}")
        self.approval = approval


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


def recorded(session: Session, name: str | None = None, effect: str | None = None,
             checkpoint: bool = True) -> Callable:
    """Decorate a tool function: each call is recorded as a tool call (arguments and
    result; the policy decides the effect unless given) and followed by a checkpoint.
    A call that raises is recorded with its error, checkpointed, and the error
    re-raised: the world it left is part of the history."""
    def decorate(fn: Callable) -> Callable:
        tool = name or fn.__name__
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            bound = signature.bind_partial(*args, **kwargs)
            call_args = {k: _jsonable(v) for k, v in bound.arguments.items()}
            try:
                result = fn(*args, **kwargs)
            except Exception as exc:
                session.record_tool_call(tool, call_args, effect=effect,
                                         result={"error": f"{type(exc).__name__}: {exc}"})
                if checkpoint:
                    session.checkpoint(label=f"after {tool} (failed)")
                raise
            session.record_tool_call(tool, call_args, effect=effect, result=_jsonable(result))
            if checkpoint:
                session.checkpoint(label=f"after {tool}")
            return result
        return wrapper
    return decorate


@contextlib.contextmanager
def guarded(session: Session, label: str | None = None,
            acknowledge_side_effects: bool = False) -> Iterator[Checkpoint]:
    """Checkpoint before a risky block; if the block raises, restore the whole world to
    that checkpoint and re-raise. A restore that side effects forbid (and that was not
    told to acknowledge them) leaves the world as the block left it, and its error is
    attached to the block's as a note."""
    before = session.checkpoint(label=label or "before a guarded block")
    try:
        yield before
    except BaseException as exc:
        try:
            session.restore(before.id, acknowledge_side_effects=acknowledge_side_effects)
        except Exception as restore_error:
            exc.add_note(f"worldline could not restore {before.id}: {restore_error}")
        raise


def require_approval(session: Session, tool: str, args: dict | None = None,
                     timeout: float = 300.0) -> Approval:
    """Checkpoint and ask an operator for approval, blocking until they decide. Returns
    the approved approval; raises ApprovalDenied, or DeadlineExceeded when it expired
    or the wait timed out."""
    approval = session.request_approval(tool, args)
    decided = session._client.wait_approval(approval.id, timeout=timeout)
    if decided.status == "approved":
        return decided
    if decided.status == "denied":
        raise ApprovalDenied(decided)
    raise DeadlineExceeded(f"approval {decided.id} for {tool!r} is {decided.status}:"
                           " no operator decided in time")


class _Async:
    """Every call of the wrapped object runs in a worker thread and is awaited; sessions
    it returns are wrapped the same way, plain values are returned as they are."""

    def __init__(self, target: Any) -> None:
        self._target = target

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if not callable(value):
            return value

        @functools.wraps(value)
        async def call(*args, **kwargs):
            result = await asyncio.to_thread(value, *args, **kwargs)
            return _Async(result) if isinstance(result, Session) else result
        return call


class AsyncClient(_Async):
    """The asyncio client: ``await client.create_session(...)``, ``await s.checkpoint()``."""

    def __init__(self, address: str | None = None, **kwargs: Any) -> None:
        super().__init__(Client(address, **kwargs))

    @property
    def migrations(self) -> Any:
        """The client's state migrations (docs/state-migrations.md); may be set."""
        return self._target.migrations

    @migrations.setter
    def migrations(self, migrations: Any) -> None:
        self._target.migrations = migrations

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        self._target.close()
