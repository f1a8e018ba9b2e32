"""The Python client: one method per daemon call, errors raised as WorldlineError."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from typing import Any

from worldline.v1 import worldline_pb2 as pb

from .config import default_address, normalize_address
from .migrations import Migration, StateMigrations
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
from .transport import open_transport

Migrations = StateMigrations | dict[int, Migration] | None
_FULL_ID = re.compile(r"^[0-9A-HJKMNP-TV-Z]{26}$")


def _dumps(value: Any) -> str:
    return "" if value is None else json.dumps(value, ensure_ascii=False)


class Client:
    """A connection to the worldline daemon. ``address`` is ``unix:///abs/path`` or
    ``host:port``; None means ``$WORLDLINE_ADDRESS`` or the default socket."""

    def __init__(self, address: str | None = None, timeout: float = 120.0,
                 token: str | None = None, tls_ca: str | None = None,
                 transport: str = "auto", migrations: Migrations = None) -> None:
        """On TCP (``host:port``) the channel is TLS, trusting ``tls_ca`` (a PEM file;
        default ``$WORLDLINE_TLS_CA``, else the system's roots), and every call carries
        the bearer ``token`` (default ``$WORLDLINE_TOKEN``). On a Unix socket the calls
        go as frames to the daemon's gateway (gRPC when it has none); ``transport``
        ("grpc" or "frames") forces one (client/transport.py).

        ``migrations`` (a ``StateMigrations``, or ``{from_version: function}``) is the
        schema of the agent's checkpoint state: states written by this client are
        marked with its current version, and older ones are upgraded when read
        (``show``, and the state a restore returns); docs/state-migrations.md."""
        self.migrations = migrations
        self.address = normalize_address(address) if address else default_address()
        self.timeout = timeout
        self._transport = open_transport(self.address, token, tls_ca, transport)

    @property
    def migrations(self) -> StateMigrations | None:
        return self._migrations

    @migrations.setter
    def migrations(self, migrations: Migrations) -> None:
        self._migrations = StateMigrations.of(migrations)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._transport.close()

    def _call(self, method: str, request, timeout: float | None = None):
        return self._transport.call(method, request, timeout or self.timeout)

    # ids
    def resolve_id(self, text: str, kind: str = "", session: str | None = None) -> str:
        """The full id meant by ``text``: a full id, a unique prefix of one (any case),
        ``SESSION@N`` (checkpoint N of a session), ``HEAD`` or ``HEAD~N`` (of
        ``session``, default the one whose workspace holds the current folder).
        ``kind``: session, checkpoint, approval or tool_call (empty: any). An ambiguous
        prefix is InvalidArgument naming the candidates. A full id is returned as it
        is, with no call."""
        if _FULL_ID.match(text or ""):
            return text
        if text.strip().upper().startswith("HEAD") and not session:
            session = self.session_here().id
        return self._call("ResolveId", pb.ResolveIdRequest(
            text=text, kind=kind, session_id=session or "")).id

    def session_here(self, folder: str | None = None) -> Session:
        """The live session whose workspace is ``folder`` (default: the current folder)
        or holds it; NotFound when none does."""
        here = os.path.abspath(folder or os.getcwd())
        found = self.list_sessions(workspace=here)
        if not found:
            from .errors import NotFound
            raise NotFound(f"no session's workspace holds {here}: run it in the workspace,"
                           " or give --session")
        return found[0]

    # sessions
    def create_session(self, workspace: str, container: str | None = None,
                       name: str | None = None, image: str | None = None,
                       mount: str | None = None, exist_ok: bool = False,
                       exclude: list[str] | None = None) -> Session:
        """A session on ``workspace`` (a relative path is resolved against the caller's
        working folder); with ``container``, that existing container is part
        of its world; with ``image``, the daemon starts a container from it with the
        workspace bind-mounted at ``mount`` (default /workspace). ``exclude``:
        gitignore patterns of workspace paths never captured nor restored (besides
        those of the workspace's .worldlineignore). A session of the caller's over that
        folder already is AlreadyExists (naming it); ``exist_ok``: that session is
        returned instead, as it is (whatever its container or exclusions)."""
        from .errors import AlreadyExists
        try:
            m = self._call("CreateSession", pb.CreateSessionRequest(
                workspace=os.path.abspath(workspace) if workspace else "",
                container=container or "", name=name or "",
                image=image or "", mount=mount or "", exclude=list(exclude or ())))
        except AlreadyExists:
            if not exist_ok:
                raise
            here = os.path.realpath(workspace)
            found = [s for s in self.list_sessions(workspace=here) if s.workspace == here]
            if not found:  # deleted meanwhile: a new one
                return self.create_session(workspace, container, name, image, mount,
                                           exclude=exclude)
            return found[0]
        return Session.from_pb(m, self)

    def get_session(self, session_id: str) -> Session:
        return Session.from_pb(self._call("GetSession", pb.GetSessionRequest(
            session_id=session_id)), self)

    def list_sessions(self, include_deleted: bool = False,
                      workspace: str | None = None) -> list[Session]:
        """Sessions (deleted ones only with ``include_deleted``); with ``workspace``, the
        session whose workspace is that folder or holds it (relative paths are the
        caller's: resolved against its working folder)."""
        return [Session.from_pb(s, self) for s in self._call("ListSessions", pb.ListSessionsRequest(
            include_deleted=include_deleted,
            workspace=os.path.abspath(workspace) if workspace else "")).sessions]

    def delete_session(self, session_id: str, keep_container: bool = False) -> Session:
        """Release the session's workspace and container; its history is kept (and can
        be read, diffed and forked) and the folder may become another session's. Its
        container is stopped (``keep_container``: left running) and a fork's overlay
        view unmounted."""
        return Session.from_pb(self._call("DeleteSession", pb.DeleteSessionRequest(
            session_id=session_id, keep_container=keep_container)), self)

    def move_session(self, session_id: str, to_host: str = "", take_over: bool = False,
                     workspace: str | None = None) -> Session:
        """The fleet: release a session this daemon's host holds for ``to_host`` ("*":
        any host), or take it over on this daemon's host (``take_over``), rebuilding its
        workspace (at ``workspace``, default its path) and container from its head."""
        return Session.from_pb(self._call("MoveSession", pb.MoveSessionRequest(
            session_id=session_id, to_host=to_host, take_over=take_over,
            workspace=os.path.abspath(workspace) if workspace else "")), self)

    # checkpoints
    def checkpoint(self, session_id: str, label: str | None = None, reasoning: str | None = None,
                   messages: list | None = None, state: dict | None = None,
                   trace_id: str | None = None, expected_head: str | None = None,
                   warnings: list[str] | None = None) -> Checkpoint:
        """``warnings``: what this checkpoint lacks that the caller knows of, in words
        (kept with it: ``CheckpointDetail.warnings``)."""
        return Checkpoint.from_pb(self._call("CreateCheckpoint", pb.CheckpointRequest(
            session_id=session_id, label=label or "", reasoning=reasoning or "",
            trace_id=trace_id or "", messages_json=_dumps(messages) if messages else "",
            state_json=_dumps(self._stamped(state)), expected_head=expected_head or "",
            warnings=warnings or [])))

    def checkpoint_raw(self, session_id: str, messages_json: str = "", state_json: str = "",
                       **kw) -> Checkpoint:
        """As ``checkpoint`` with messages and state as JSON text, validated by the daemon."""
        return Checkpoint.from_pb(self._call("CreateCheckpoint", pb.CheckpointRequest(
            session_id=session_id, messages_json=messages_json, state_json=state_json,
            label=kw.get("label") or "", reasoning=kw.get("reasoning") or "",
            trace_id=kw.get("trace_id") or "", expected_head=kw.get("expected_head") or "",
            warnings=kw.get("warnings") or [])))

    def show(self, checkpoint_id: str) -> CheckpointDetail:
        """With migrations, ``state`` is upgraded to their current version (the stored
        state is not changed): StateMigrationError, StateVersionTooNew when it cannot be."""
        detail = CheckpointDetail.from_pb(self._call("GetCheckpoint", pb.GetCheckpointRequest(
            checkpoint_id=checkpoint_id)))
        if self.migrations is not None:
            detail.state = self.migrations.upgrade(detail.state, detail.id)
        return detail

    def _stamped(self, state: dict | None) -> dict | None:
        return state if self.migrations is None or state is None else self.migrations.stamp(state)

    def log(self, session_id: str) -> list[Checkpoint]:
        return [Checkpoint.from_pb(c) for c in self._call("ListCheckpoints",
                pb.ListCheckpointsRequest(session_id=session_id)).checkpoints]

    def log_page(self, session_id: str, limit: int,
                 before_seq: int | None = None) -> tuple[list[Checkpoint], int]:
        """A page of a long history: the newest ``limit`` checkpoints with a seq below
        ``before_seq`` (None: the newest of all), oldest first, and how many the
        session has in all."""
        m = self._call("ListCheckpoints", pb.ListCheckpointsRequest(
            session_id=session_id, limit=limit, before_seq=before_seq or 0))
        return [Checkpoint.from_pb(c) for c in m.checkpoints], m.total

    def diff(self, from_id: str, to_id: str, patch: bool = False) -> Diff:
        return Diff.from_pb(self._call("Diff", pb.DiffRequest(from_id=from_id, to_id=to_id,
                                                              patch=patch)))

    def restore(self, session_id: str, checkpoint_id: str, acknowledge_side_effects: bool = False,
                dry_run: bool = False, expected_head: str | None = None,
                operation_id: str | None = None,
                from_other_session: bool = False,
                paths: list[str] | None = None) -> RestoreResult:
        """With ``operation_id``, ``progress(operation_id)`` follows it from another thread.
        A checkpoint of another session's history restores only with
        ``from_other_session``. ``paths``: only those workspace-relative paths (the rest
        of the world, the conversation and the tasks stay as they are). Either way the
        world as it was is kept first as a checkpoint (``RestoreResult.before``) when
        it differs from the head.

        With migrations, the checkpoint's state is read and upgraded first (a state
        this client cannot read restores nothing: StateMigrationError), and the
        result's ``state`` is the upgraded state the session has from then on."""
        state = self.show(checkpoint_id).state if self.migrations is not None else None
        result = RestoreResult.from_pb(self._call("Restore", pb.RestoreRequest(
            session_id=session_id, checkpoint_id=checkpoint_id,
            acknowledge_side_effects=acknowledge_side_effects, dry_run=dry_run,
            expected_head=expected_head or "", operation_id=operation_id or "",
            from_other_session=from_other_session, paths=list(paths or ()))))
        result.state = state
        return result

    def path_history(self, session_id: str, path: str, patch: bool = False
                     ) -> list[PathChange]:
        """The checkpoints of the session's history that changed ``path`` (relative to
        the workspace), newest first, each with the tool calls made since the one
        before it. A rename shows as the deletion of one path and the addition of
        another."""
        return [PathChange.from_pb(c) for c in self._call("PathHistory", pb.PathHistoryRequest(
            session_id=session_id, path=path, patch=patch)).changes]

    def read_file(self, checkpoint_id: str, path: str) -> bytes:
        """The bytes of the file at ``path`` as of the checkpoint (a symlink: its
        target), read in slices of at most 32 MiB."""
        out, offset = bytearray(), 0
        while True:
            m = self._call("ReadFile", pb.ReadFileRequest(checkpoint_id=checkpoint_id,
                                                          path=path, offset=offset))
            out += m.data
            offset += len(m.data)
            if offset >= m.size or not m.data:
                return bytes(out)

    def resolve_session(self, session_id: str, complete: bool) -> Session:
        """An operator's decision on a session that needs attention: complete the
        interrupted restore that was set aside, or abandon it."""
        return Session.from_pb(self._call("ResolveSession", pb.ResolveSessionRequest(
            session_id=session_id, complete=complete)), self)

    def fork(self, checkpoint_id: str, workspace: str | None = None,
             name: str | None = None, operation_id: str | None = None,
             volumes: str | None = None) -> Session:
        """``volumes``: "share" or "empty" for a container with mounts besides the
        workspace (refused otherwise)."""
        m = self._call("Fork", pb.ForkRequest(checkpoint_id=checkpoint_id,
                                              workspace=os.path.abspath(workspace)
                                              if workspace else "", name=name or "",
                                              operation_id=operation_id or "",
                                              volumes=volumes or ""))
        session = Session.from_pb(m.session, self)
        session.side_effects = [SideEffect.from_pb(s) for s in m.side_effects]
        return session

    def progress(self, operation_id: str) -> dict:
        """How far the restore, fork or gc given ``operation_id`` has come: phase, unit,
        done, total (0 when unknown), files written, finished."""
        m = self._call("GetProgress", pb.GetProgressRequest(operation_id=operation_id))
        return {"operation_id": m.operation_id, "phase": m.phase, "unit": m.unit,
                "done": m.done, "total": m.total, "files": m.files, "finished": m.finished}

    def export_image(self, checkpoint_id: str) -> tuple[str, str]:
        """A runnable image of the checkpoint's container: (image id, reference)."""
        m = self._call("ExportImage", pb.ExportImageRequest(checkpoint_id=checkpoint_id),
                       timeout=1800)
        return m.image_id, m.reference

    # tool calls and policy
    def record_tool_call(self, session_id: str, name: str, args: dict | None = None,
                         effect: str | None = None, result: Any = None,
                         idempotency_key: str | None = None,
                         approval_id: str | None = None) -> ToolCall:
        return self.record_tool_call_raw(session_id, name, _dumps(args), _dumps(result),
                                         effect, idempotency_key, approval_id)

    def record_tool_call_raw(self, session_id: str, name: str, args_json: str = "",
                             result_json: str = "", effect: str | None = None,
                             idempotency_key: str | None = None,
                             approval_id: str | None = None) -> ToolCall:
        return ToolCall.from_pb(self._call("RecordToolCall", pb.RecordToolCallRequest(
            session_id=session_id, name=name, args_json=args_json, result_json=result_json,
            effect=effect or "", idempotency_key=idempotency_key or "",
            approval_id=approval_id or "")))

    def tool_calls(self, session_id: str,
                   after: list[str] | None = None) -> list[ToolCall]:
        """The session's tool calls; with ``after``, only those recorded while one of
        these checkpoints was the head (the calls that led to the next checkpoint)."""
        return [ToolCall.from_pb(t) for t in self._call("ListToolCalls", pb.ListToolCallsRequest(
            session_id=session_id, checkpoint_ids=after or [])).tool_calls]

    def explain_policy(self, tool: str, args_json: str = "") -> PolicyDecision:
        m = self._call("ExplainPolicy", pb.ExplainPolicyRequest(tool=tool, args_json=args_json))
        return PolicyDecision(m.effect, m.rule, m.requires_approval,
                              m.approver or "caller")  # empty from an older daemon

    # tasks
    def set_task(self, session_id: str, task_id: str, status: str, title: str | None = None,
                 parent: str | None = None, note: str | None = None) -> Task:
        return Task.from_pb(self._call("SetTask", pb.SetTaskRequest(
            session_id=session_id, task_id=task_id, status=status, title=title or "",
            parent=parent or "", note=note or "")))

    def tasks(self, session_id: str) -> tuple[list[Task], str | None]:
        m = self._call("ListTasks", pb.ListTasksRequest(session_id=session_id))
        return [Task.from_pb(t) for t in m.tasks], m.resume or None

    # approvals
    def request_approval(self, session_id: str, tool: str, args: dict | None = None,
                         ttl: float | None = None, args_json: str | None = None) -> Approval:
        """``ttl``: seconds before it expires (None: the daemon's default, an hour); 0 or
        less is InvalidArgument (it never meant "no expiry")."""
        if ttl is not None and ttl <= 0:
            from .errors import InvalidArgument
            raise InvalidArgument(f"ttl must be more than 0 seconds (got {ttl:g}); leave it"
                                  " out for the default of an hour")
        return Approval.from_pb(self._call("RequestApproval", pb.RequestApprovalRequest(
            session_id=session_id, tool=tool,
            args_json=args_json if args_json is not None else _dumps(args),
            ttl_seconds=ttl or 0.0)))

    def get_approval(self, approval_id: str) -> Approval:
        return Approval.from_pb(self._call("GetApproval", pb.GetApprovalRequest(
            approval_id=approval_id)))

    def wait_approval(self, approval_id: str, timeout: float = 30.0) -> Approval:
        """Wait until the approval is decided or expires; after ``timeout`` seconds it is
        returned still pending."""
        return Approval.from_pb(self._call("WaitApproval", pb.WaitApprovalRequest(
            approval_id=approval_id, timeout_seconds=timeout), timeout=timeout + 30.0))

    def list_approvals(self, session_id: str | None = None,
                       status: str | None = None) -> list[Approval]:
        return [Approval.from_pb(a) for a in self._call("ListApprovals", pb.ListApprovalsRequest(
            session_id=session_id or "", status=status or "")).approvals]

    def cancel_approval(self, approval_id: str, reason: str = "") -> Approval:
        """Withdraw a pending approval this agent requested (it becomes denied)."""
        return Approval.from_pb(self._call("CancelApproval", pb.CancelApprovalRequest(
            approval_id=approval_id, reason=reason)))

    def decide_approval(self, approval_id: str, approve: bool = True, reason: str = "") -> Approval:
        return Approval.from_pb(self._call("DecideApproval", pb.DecideApprovalRequest(
            approval_id=approval_id, approve=approve, reason=reason)))

    # audit and maintenance
    def audit(self, session_id: str | None = None, kind: str | None = None,
              limit: int = 0) -> list[AuditEvent]:
        return [AuditEvent.from_pb(e) for e in self._call("ListAudit", pb.ListAuditRequest(
            session_id=session_id or "", kind=kind or "", limit=limit)).events]

    def wait_audit(self, after_seq: int = -1, kinds: list[str] | None = None,
                   session_id: str | None = None,
                   timeout: float = 30.0) -> tuple[list[AuditEvent], int]:
        """The audit events after ``after_seq`` (of ``kinds``, of ``session_id``) as soon
        as there is one, else none after ``timeout`` seconds (at most 60); and the seq to
        ask after next. ``after_seq`` -1: no events, the log's end. An allowed user gets
        its own sessions' events only."""
        m = self._call("WaitAudit", pb.WaitAuditRequest(
            after_seq=after_seq, kinds=kinds or [], session_id=session_id or "",
            timeout_seconds=timeout), timeout=timeout + 30.0)
        return [AuditEvent.from_pb(e) for e in m.events], m.last_seq

    def watch_audit(self, after_seq: int | None = None, kinds: list[str] | None = None,
                    session_id: str | None = None,
                    until: float | None = None) -> Iterator[AuditEvent]:
        """Each audit event as it is appended (after ``after_seq``; None: from now on),
        one long poll after another: a generator that ends only when ``until`` (a
        ``time.monotonic()`` instant) passes, else when the caller stops reading."""
        if after_seq is None:
            after_seq = self.wait_audit(-1)[1]
        while until is None or time.monotonic() < until:
            wait = 30.0 if until is None else max(0.0, min(30.0, until - time.monotonic()))
            events, after_seq = self.wait_audit(after_seq, kinds, session_id, timeout=wait)
            yield from events

    def verify_audit(self) -> dict:
        m = self._call("VerifyAudit", pb.VerifyAuditRequest())
        return {"ok": m.ok, "events": m.events, "problems": list(m.problems)}

    def fsck(self, repair: bool = False, cached: bool = False, read_data_subset: str = "",
             repair_from: str = "") -> dict:
        """Check the history. On a fleet every object is read from the bucket, unless
        ``cached`` (the quick check, through this host's cache); ``read_data_subset``:
        ``"N%"`` or ``"n/m"`` of the objects; ``repair`` mends the bucket from good
        copies this host holds (its cache, and the data root ``repair_from``)."""
        m = self._call("Fsck", pb.FsckRequest(repair=repair, cached=cached,
                                              read_data_subset=read_data_subset,
                                              repair_from=repair_from), timeout=3600)
        return {"ok": m.ok, "problems": list(m.problems), "blobs_checked": m.blobs_checked,
                "checkpoints_checked": m.checkpoints_checked, "repaired": list(m.repaired),
                "source": m.source, "read_data_subset": m.read_data_subset,
                "objects_checked": m.objects_checked, "objects_total": m.objects_total,
                "bytes_read": m.bytes_read, "unchecked": list(m.unchecked),
                "not_repaired": list(m.not_repaired), "broken": [
                    {"digest": b.digest, "object": b.object, "state": b.state,
                     "reason": b.reason, "checkpoints": list(b.checkpoints),
                     "files": [{"checkpoint_id": f.checkpoint_id, "path": f.path}
                               for f in b.files], "mended_to": b.mended_to}
                    for b in m.broken]}

    def gc(self, dry_run: bool = False, keep_last: int = 0, keep_labelled: bool = False,
           keep_newer_than: float = 0.0, operation_id: str | None = None) -> dict:
        """Remove what no checkpoint needs; with a retention policy (keep the last N per
        session, the labelled ones, those newer than a number of seconds), prune the
        checkpoints it does not keep first."""
        m = self._call("Gc", pb.GcRequest(dry_run=dry_run, keep_last=keep_last,
                                          keep_labelled=keep_labelled,
                                          keep_newer_than_seconds=keep_newer_than,
                                          operation_id=operation_id or ""),
                       timeout=3600)
        return {"blobs_removed": m.blobs_removed, "bytes_freed": m.bytes_freed,
                "checkpoints_pruned": m.checkpoints_pruned, "images_removed": m.images_removed,
                "views_removed": m.views_removed, "dry_run": m.dry_run}
