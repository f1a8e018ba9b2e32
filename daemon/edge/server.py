"""The gRPC edge: servicers that only translate, and the one error interceptor.

Servicers turn requests into calls on the World and Gates and records into
messages; they hold no logic and catch nothing. ``ErrorInterceptor`` is the only
place where exceptions become statuses: a ``WorldlineError`` travels as its own
code, a full disk as RESOURCE_EXHAUSTED, anything else as INTERNAL (logged with
its traceback, never shown to the caller).
"""

from __future__ import annotations

import json
import logging

import grpc
from worldline.v1 import worldline_pb2 as pb
from worldline.v1 import worldline_pb2_grpc as pb_grpc
from worldline.wire.errors import InvalidArgument, WorldlineError
from worldline.wire.paths import escape

from .. import fleet, maintenance, typed_ids
from ..gates import Gates
from ..observe import CHECKPOINTS
from ..progress import Progress
from ..records import Approval, AuditEvent, Checkpoint, Session, Task, ToolCall
from ..session_spec import SessionSpec
from ..storage.durable import out_of_space
from ..world import World
from . import callers
from .callers import Rules
from .limits import Quota

WORLDLINE = pb.DESCRIPTOR.services_by_name["Worldline"].full_name
HEALTH = "grpc.health.v1.Health"

log = logging.getLogger(__name__)


def status_of(exc: Exception, method: str) -> tuple[str, str]:
    """The gRPC status name and message an exception travels as: a ``WorldlineError``
    as its own code, a full disk as RESOURCE_EXHAUSTED, anything else as INTERNAL
    (logged with its traceback, never shown to the caller)."""
    if isinstance(exc, WorldlineError):
        return exc.code, exc.message
    if isinstance(exc, OSError):
        if out_of_space(exc):
            return "RESOURCE_EXHAUSTED", f"no space left on device: {exc.filename or ''}".strip()
        log.error("%s failed", method, exc_info=exc)
        return "INTERNAL", f"{method} failed: {exc.strerror}"
    log.error("%s failed", method, exc_info=exc)
    return "INTERNAL", f"{method} failed; see the daemon log"


class ErrorInterceptor(grpc.ServerInterceptor):
    """Every failure becomes a status; with ``rules``, the caller (callers.py) is known
    for the call, and an agent user's calls are checked and their replies filtered;
    with ``calls``, an agent user's calls under way at once are its share of the
    server's workers (limits.py), RESOURCE_EXHAUSTED past it."""

    def __init__(self, rules: Rules | None = None, calls: Quota | None = None) -> None:
        self.rules = rules
        self.calls = calls

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        inner, method = handler.unary_unary, handler_call_details.method
        service, _, name = method.lstrip("/").partition("/")
        rules, calls = self.rules, self.calls

        def guarded(request, context):
            caller = callers.agent_of_peer(context.peer())
            key = None if caller is None else caller.uid
            if calls is not None and not calls.take(key, 1):
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, calls.refusal(key))
            token = callers.CALLER.set(caller)
            try:
                if rules is not None and service != HEALTH:  # LangGraph's: no rule, owner's
                    rules.check(name if service == WORLDLINE else method, request)
                reply = inner(request, context)
                return reply if rules is None else rules.shown(name, reply)
            except Exception as exc:  # noqa: BLE001 -- every failure becomes a status
                code, message = status_of(exc, method)
            finally:
                callers.CALLER.reset(token)
                if calls is not None:
                    calls.give(key, 1)
            context.abort(grpc.StatusCode[code], message)

        return grpc.unary_unary_rpc_method_handler(
            guarded, request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer)


def session_pb(s: Session) -> pb.Session:
    return pb.Session(id=s.id, name=s.name, workspace=s.workspace, container=s.container or "",
                      head=s.head, forked_from=s.forked_from or "", created_at=s.created_at,
                      needs_attention=s.needs_attention or "", deleted_at=s.deleted_at or "",
                      host=s.host, lease_expires=s.lease_expires,
                      released_to=s.released_to or "",
                      exclude=SessionSpec.parse(s.spec).patterns)


def paths_pb(paths: list[str]) -> list[str]:
    return [escape(p) for p in paths]


def layer_changes_pb(changes) -> pb.LayerChanges | None:
    if changes is None:
        return None
    return pb.LayerChanges(added=paths_pb(changes.added), modified=paths_pb(changes.modified),
                           deleted=paths_pb(changes.deleted))


def checkpoint_pb(c: Checkpoint) -> pb.Checkpoint:
    return pb.Checkpoint(
        id=c.id, session_id=c.session_id, seq=c.seq, parent_id=c.parent_id or "", label=c.label,
        reasoning=c.reasoning, trace_id=c.trace_id, created_at=c.created_at, kind=c.kind,
        restored_from=c.restored_from or "", tree=c.tree, bytes=c.bytes,
        messages_added=c.messages_added, message_count=c.message_count,
        acknowledged_side_effects=list(c.acknowledged), container=c.container or "",
        pruned=c.pruned, resume_json=c.resume, warnings=c.warnings)


def tool_call_pb(t: ToolCall) -> pb.ToolCall:
    return pb.ToolCall(
        id=t.id, session_id=t.session_id, name=t.name, args_json=t.args_json,
        result_json=t.result_json or "", effect=t.effect, idempotency_key=t.idempotency_key or "",
        checkpoint_id=t.checkpoint_id, created_at=t.created_at, replayed=t.replayed, rule=t.rule,
        approval_id=t.approval_id or "", gate=t.gate)


def side_effect_pb(t: ToolCall) -> pb.SideEffect:
    summary = t.args_json if len(t.args_json) <= 200 else t.args_json[:197] + "..."
    return pb.SideEffect(tool_call_id=t.id, tool=t.name, args_summary=summary,
                         created_at=t.created_at, checkpoint_id=t.checkpoint_id, effect=t.effect,
                         gate=t.gate)


def task_pb(t: Task) -> pb.Task:
    return pb.Task(id=t.id, title=t.title, parent=t.parent or "", status=t.status, note=t.note,
                   updated_at=t.updated_at)


def approval_pb(a: Approval) -> pb.Approval:
    return pb.Approval(id=a.id, session_id=a.session_id, tool=a.tool, args_json=a.args_json,
                       status=a.status, checkpoint_id=a.checkpoint_id, reason=a.reason,
                       created_at=a.created_at, decided_at=a.decided_at or "",
                       expires_at=a.expires_at)


def audit_pb(e: AuditEvent) -> pb.AuditEvent:
    return pb.AuditEvent(seq=e.seq, kind=e.kind, session_id=e.session_id or "",
                         subject_id=e.subject_id, detail_json=json.dumps(e.detail, sort_keys=True),
                         created_at=e.created_at, hash=e.hash, prev_hash=e.prev_hash)


class WorldlineServicer(pb_grpc.WorldlineServicer):
    def __init__(self, world: World, gates: Gates,
                 gc_grace: float = maintenance.GC_GRACE_SECONDS,
                 progress: Progress | None = None) -> None:
        self.world = world
        self.gates = gates
        self.gc_grace = gc_grace
        self.progress = progress or Progress()

    # sessions
    def CreateSession(self, r, context):
        return session_pb(self.world.create_session(r.workspace, r.container or None, r.name,
                                                    r.image, r.mount,
                                                    agent=callers.CALLER.get(),
                                                    exclude=list(r.exclude)))

    def GetSession(self, r, context):
        session = self.world.session(r.session_id)
        m = session_pb(session)
        m.ignore_file.extend(self.world.exclusions(session)[1])
        return m

    def ListSessions(self, r, context):
        return pb.ListSessionsResponse(sessions=[session_pb(s) for s in self.world.sessions(
            include_deleted=r.include_deleted, workspace=r.workspace)])

    def ResolveSession(self, r, context):
        return session_pb(self.world.resolve(r.session_id, r.complete))

    def DeleteSession(self, r, context):
        return session_pb(self.gates.delete_session(r.session_id, r.keep_container))

    def MoveSession(self, r, context):
        if r.take_over == bool(r.to_host):
            raise InvalidArgument("give either a host to release the session to, or"
                                  " take_over (to take it over on this host)")
        if r.take_over:
            return session_pb(fleet.take_over(self.world, r.session_id, r.workspace))
        return session_pb(fleet.release(self.world, r.session_id, r.to_host))

    # checkpoints
    def CreateCheckpoint(self, r, context):
        cp = self.world.checkpoint(
            r.session_id, label=r.label, reasoning=r.reasoning, trace_id=r.trace_id,
            messages_json=r.messages_json, state_json=r.state_json,
            expected_head=r.expected_head, resume_json=r.resume_json,
            warnings=tuple(r.warnings))
        CHECKPOINTS.labels("checkpoint").inc()
        return checkpoint_pb(cp)

    def GetCheckpoint(self, r, context):
        view = self.world.view(r.checkpoint_id)
        return pb.CheckpointDetail(
            checkpoint=checkpoint_pb(view.checkpoint),
            messages_json=json.dumps(view.messages, ensure_ascii=False),
            state_json=json.dumps(view.state, ensure_ascii=False),
            tasks=[task_pb(t) for t in view.tasks], skipped=paths_pb(view.skipped))

    def ListCheckpoints(self, r, context):
        self.world.session(r.session_id)
        store = self.world.store
        if not r.limit and not r.before_seq:
            cps = store.list_checkpoints(r.session_id)
            return pb.ListCheckpointsResponse(checkpoints=[checkpoint_pb(c) for c in cps],
                                              total=len(cps))
        if r.before_seq < 0 or r.limit < 0:
            raise InvalidArgument("limit is how many checkpoints (0: all) and before_seq a"
                                  " checkpoint's seq (0: no bound); neither is negative")
        cps = store.list_checkpoints(r.session_id, limit=r.limit or None,
                                     before_seq=r.before_seq or None)
        return pb.ListCheckpointsResponse(checkpoints=[checkpoint_pb(c) for c in cps],
                                          total=store.count_checkpoints(r.session_id))

    def Diff(self, r, context):
        changes, box, patch = self.world.diff(r.from_id, r.to_id, r.patch)
        return pb.DiffResponse(added=paths_pb(changes.added),
                               modified=paths_pb(changes.modified),
                               deleted=paths_pb(changes.deleted), patch=patch,
                               container=layer_changes_pb(box))

    def Restore(self, r, context):
        with self.progress.run(r.operation_id):
            result = self.world.restore(r.session_id, r.checkpoint_id,
                                        acknowledge=r.acknowledge_side_effects,
                                        dry_run=r.dry_run, expected_head=r.expected_head,
                                        from_other_session=r.from_other_session,
                                        paths=list(r.paths))
        if not result.dry_run:
            CHECKPOINTS.labels("restore").inc()
        return pb.RestoreResponse(
            checkpoint=checkpoint_pb(result.checkpoint) if result.checkpoint else None,
            restored_from=result.restored_from, files_written=paths_pb(result.files_written),
            files_removed=paths_pb(result.files_removed),
            side_effects=[side_effect_pb(c) for c in result.side_effects],
            dry_run=result.dry_run, container=layer_changes_pb(result.container),
            warnings=[escape(w) for w in result.warnings],
            before=checkpoint_pb(result.before) if result.before else None,
            not_checkpointed=paths_pb(result.not_checkpointed),
            processes=[escape(p) for p in result.processes])

    def PathHistory(self, r, context):
        return pb.PathHistoryResponse(changes=[
            pb.PathChange(checkpoint=checkpoint_pb(c.checkpoint), change=c.change,
                          tool_calls=[tool_call_pb(t) for t in c.tool_calls], patch=c.patch)
            for c in self.world.path_history(r.session_id, r.path, r.patch)])

    def ResolveId(self, r, context):
        caller = callers.CALLER.get()
        visible = ((lambda sid: callers.belongs(self.world.session(sid).spec, caller))
                   if caller is not None else (lambda _: True))
        found, kind = typed_ids.resolve(self.world.store, r.text, r.kind, r.session_id,
                                        visible)
        return pb.ResolveIdResponse(id=found, kind=kind)

    def ReadFile(self, r, context):
        data, size, kind = self.world.read_file(r.checkpoint_id, r.path, r.offset, r.length)
        return pb.ReadFileResponse(data=data, size=size, kind=kind)

    def Fork(self, r, context):
        with self.progress.run(r.operation_id):
            result = self.world.fork(r.checkpoint_id, r.workspace, r.name, r.volumes,
                                     agent=callers.CALLER.get())
        return pb.ForkResponse(session=session_pb(result.session),
                               side_effects=[side_effect_pb(c) for c in result.side_effects])

    def ExportImage(self, r, context):
        image_id, reference = self.world.export_image(r.checkpoint_id)
        return pb.ExportImageResponse(image_id=image_id, reference=reference)

    # tool calls and policy
    def RecordToolCall(self, r, context):
        return tool_call_pb(self.gates.record_tool_call(
            r.session_id, r.name, args_json=r.args_json, result_json=r.result_json,
            effect=r.effect, idempotency_key=r.idempotency_key, approval_id=r.approval_id,
            gate=r.gate))

    def ListToolCalls(self, r, context):
        return pb.ListToolCallsResponse(tool_calls=[
            tool_call_pb(c) for c in self.gates.tool_calls(
                r.session_id, checkpoint_ids=list(r.checkpoint_ids) or None)])

    def ExplainPolicy(self, r, context):
        d = self.gates.explain(r.tool, r.args_json)
        return pb.PolicyDecision(effect=d.effect, rule=d.rule,
                                 requires_approval=d.requires_approval,
                                 approver="caller")  # an agent user's: Rules.shown

    # tasks
    def SetTask(self, r, context):
        return task_pb(self.gates.set_task(r.session_id, r.task_id, r.status, r.title, r.parent,
                                           r.note))

    def ListTasks(self, r, context):
        tasks, resume = self.gates.tasks(r.session_id)
        return pb.ListTasksResponse(tasks=[task_pb(t) for t in tasks], resume=resume or "")

    # approvals
    def RequestApproval(self, r, context):
        return approval_pb(self.gates.request_approval(r.session_id, r.tool, r.args_json,
                                                       r.ttl_seconds))

    def GetApproval(self, r, context):
        return approval_pb(self.gates.get_approval(r.approval_id))

    def WaitApproval(self, r, context):
        return approval_pb(self.gates.wait(r.approval_id, _patience(r.timeout_seconds,
                                                                    context)))

    def ListApprovals(self, r, context):
        return pb.ListApprovalsResponse(approvals=[
            approval_pb(a) for a in self.gates.list_approvals(r.session_id, r.status)])

    def DecideApproval(self, r, context):
        return approval_pb(self.gates.decide(r.approval_id, r.approve, r.reason))

    def CancelApproval(self, r, context):
        return approval_pb(self.gates.cancel(r.approval_id, r.reason))

    # audit and maintenance
    def ListAudit(self, r, context):
        events = self.gates.audit(r.session_id, r.kind, r.limit)
        return pb.ListAuditResponse(events=[audit_pb(e) for e in events])

    def WaitAudit(self, r, context):
        events, last = self.gates.wait_audit(r.after_seq, list(r.kinds), r.session_id,
                                             _patience(r.timeout_seconds, context))
        return pb.WaitAuditResponse(events=[audit_pb(e) for e in events], last_seq=last)

    def VerifyAudit(self, r, context):
        count, problems = maintenance.verify_audit(self.world)
        return pb.VerifyAuditResponse(ok=not problems, events=count, problems=problems)

    def Fsck(self, r, context):
        report = maintenance.fsck(self.world, repair=r.repair, cached=r.cached,
                                  subset=r.read_data_subset, repair_from=r.repair_from)
        return pb.FsckResponse(
            ok=report.ok, problems=report.problems, blobs_checked=report.blobs_checked,
            checkpoints_checked=report.checkpoints_checked, repaired=report.repaired,
            source=report.source, read_data_subset=report.subset,
            objects_checked=report.objects_checked, objects_total=report.objects_total,
            bytes_read=report.bytes_read, unchecked=report.unchecked,
            not_repaired=report.not_repaired, broken=[pb.FsckBlob(
                digest=b.digest, object=b.object, state=b.state, reason=b.reason,
                checkpoints=b.checkpoints, mended_to=b.mended_to,
                files=[pb.FsckFile(checkpoint_id=c, path=p) for c, p in b.files])
                for b in report.broken])

    def Gc(self, r, context):
        if r.keep_last < 0 or r.keep_newer_than_seconds < 0:
            raise InvalidArgument("retention values must not be negative")
        with self.progress.run(r.operation_id):
            report = maintenance.gc(self.world, dry_run=r.dry_run, policy=maintenance.Retention(
                r.keep_last, r.keep_labelled, r.keep_newer_than_seconds), grace=self.gc_grace)
        return pb.GcResponse(dry_run=r.dry_run, **report.__dict__)

    def GetProgress(self, r, context):
        op = self.progress.get(r.operation_id)
        return pb.Progress(operation_id=op.id, phase=op.phase, unit=op.unit, done=op.done,
                           total=op.total, files=op.files, finished=op.finished)


def _patience(timeout: float, context) -> float:
    """How long a waiting call may wait: ``timeout``, ended half a second before the
    call's deadline (so that it answers, rather than the deadline passing)."""
    remaining = context.time_remaining()
    return timeout if remaining is None else min(timeout, max(remaining - 0.5, 0))
