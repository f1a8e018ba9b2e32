"""Tool calls, tasks and approval gates: what the agent did, is doing, and may do.

- The ledger records every tool call with its effect (stated, or decided by the
  policy) and the head checkpoint it followed. A call whose idempotency key was
  already recorded in the session's lineage (before a restore included) is not
  recorded again: the first call comes back with ``replayed=True``.
- Tasks are the session's working task list; every checkpoint captures them.
- Approval gates: a request checkpoints the world, then waits for an operator's
  decision or the deadline. A tool the policy gates cannot be recorded without an
  approved approval for it in the same session, except as what it is: a gate bypass
  (``gate="bypassed"``), a gated call that ran though the gate refused it or could
  not ask (its agent ignored the answer). A bypass is never an approval: it has an
  audit event of its own (``gate_bypassed``), a metric, and it is among a restore's
  side effects.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import time
from dataclasses import replace

from worldline.wire.errors import FailedPrecondition, InvalidArgument
from worldline.wire.policy import EFFECTS, Decision, Policy

from . import ids
from .observe import GATE_BYPASSES
from .records import (
    APPROVAL_STATUSES,
    AUDIT_KINDS,
    TASK_STATUSES,
    Approval,
    AuditEvent,
    Task,
    ToolCall,
)
from .storage.store import calls_on_path, ordered_tasks, with_gates
from .validate import check_id, check_text, load_json, parse_args_json
from .world import World

DEFAULT_APPROVAL_TTL = 3600.0
MAX_APPROVAL_TTL = 7 * 24 * 3600.0
MAX_WAIT = 3600.0
MAX_AUDIT_WAIT = 60.0   # one WaitAudit call's longest wait (a follower calls again)
AUDIT_POLL = 0.2        # seconds between two reads of the log while a WaitAudit waits
AUDIT_BATCH = 1000      # events in one WaitAudit answer, at most (the next call has more)
log = logging.getLogger("worldline.gates")
BYPASSED = "bypassed"


class Gates:
    def __init__(self, world: World, policy: Policy) -> None:
        self.world = world
        self.store = world.store
        self.policy = policy
        self._decided = threading.Condition()
        self.closing = threading.Event()  # the daemon stops: long polls answer at once

    def close(self) -> None:
        """The daemon stops: a WaitAudit under way answers now, with what it has."""
        self.closing.set()
        with self._decided:
            self._decided.notify_all()

    # -- tool calls ------------------------------------------------------------------
    def explain(self, tool: str, args_json: str) -> Decision:
        return self.policy.classify(check_text("tool", tool), parse_args_json(args_json))

    def record_tool_call(self, session_id: str, name: str, *, args_json: str = "",
                         result_json: str = "", effect: str = "", idempotency_key: str = "",
                         approval_id: str = "", gate: str = "") -> ToolCall:
        """Record a call. ``gate="bypassed"``: a gated call that ran without an approval
        (``approval_id`` then names the approval the gate asked for, if any: it is
        cited by the audit event, not by the call, and stays as it is)."""
        if not name:
            raise InvalidArgument("a tool call needs a tool name")
        if gate not in ("", BYPASSED):
            raise InvalidArgument(f"gate {gate!r} is not one of \"\", {BYPASSED!r}")
        check_text("tool name", name)
        check_text("idempotency key", idempotency_key)
        args = parse_args_json(args_json)
        if result_json:
            load_json(result_json, "result", object, "JSON")
        if effect and effect not in EFFECTS:
            raise InvalidArgument(f"effect {effect!r} is not one of {', '.join(EFFECTS)}")
        decision = self.policy.classify(name, args)
        rule = decision.rule if not effect else "stated by the caller"
        effect = effect or decision.effect
        session = self.world.session(session_id)
        self.world.check_held(session)
        if idempotency_key:
            for call in calls_on_path(self.store, session.head):
                if call.idempotency_key == idempotency_key:
                    if call.name != name or _canonical(call.args_json) != _canonical(args):
                        # not a replay: a call of its own, that a replay would hide
                        raise FailedPrecondition(
                            f"idempotency key {idempotency_key!r} was recorded for another"
                            f" call ({call.name}, other arguments): give this call a key of"
                            " its own")
                    self.store.append_audit([AuditEvent(
                        "tool_call.replay", session_id, call.id,
                        {"idempotency_key": idempotency_key}, ids.now())])
                    return replace(with_gates(self.store, [call])[0], replayed=True)
        asked_for = ""
        if gate:
            if approval_id:
                asked = self.get_approval(check_id("approval", approval_id))
                if asked.session_id != session.id:
                    raise FailedPrecondition(f"approval {approval_id} is not of this session")
                asked_for = asked.id
            approval_id = ""
        elif decision.requires_approval or approval_id:
            self._check_approved(session_id, name, approval_id, args)
        call = ToolCall(ids.new_id(), session_id, name,
                        json.dumps(args, ensure_ascii=False, sort_keys=True),
                        result_json or None, effect, idempotency_key or None, session.head,
                        ids.now(), rule, approval_id or None, gate=gate)
        events = [AuditEvent("tool_call", session_id, call.id,
                             {"tool": name, "effect": effect, "checkpoint": session.head},
                             ids.now())]
        if gate:
            events.append(AuditEvent("gate_bypassed", session_id, call.id, {
                "tool": name, "effect": effect, "rule": rule, "checkpoint": session.head,
                "approval": asked_for or None}, ids.now()))
        self.store.add_tool_call(call, events)
        if gate:
            GATE_BYPASSES.inc()
            self.world.warn_next_checkpoint(session_id, (
                f"gate bypassed: tool call {call.id} ({name}, {effect}) ran without an"
                f" approval{f'; approval {asked_for} was not granted' if asked_for else ''}"))
        return call

    def tool_calls(self, session_id: str,
                   checkpoint_ids: list[str] | None = None) -> list[ToolCall]:
        """The session's calls (with ``checkpoint_ids``, those that followed these
        heads), gate bypasses marked."""
        session = self.world.session(session_id)
        return with_gates(self.store, self.store.list_tool_calls(
            session_id=session.id, checkpoint_ids=checkpoint_ids))

    def _check_approved(self, session_id: str, tool: str, approval_id: str,
                        args: dict) -> None:
        if not approval_id:
            raise FailedPrecondition(
                f"tool {tool!r} requires an approved approval: request one with"
                f" `worldline approval request {session_id} {tool}` and pass its id")
        approval = self.get_approval(check_id("approval", approval_id))
        if approval.session_id != session_id or approval.tool != tool:
            raise FailedPrecondition(f"approval {approval_id} is not for {tool!r} in this session")
        if _canonical(approval.args_json) != _canonical(args):  # what was approved, only
            raise FailedPrecondition(f"approval {approval_id} is for {tool!r} with other"
                                     " arguments than these")
        if approval.status != "approved":
            raise FailedPrecondition(f"approval {approval_id} is {approval.status}, not approved")
        # It is used up when the call is recorded: the store refuses a second call citing
        # it, in the same transaction (two calls racing with one approval: one wins).

    # -- tasks ---------------------------------------------------------------------------
    def set_task(self, session_id: str, task_id: str, status: str, title: str = "",
                 parent: str = "", note: str = "") -> Task:
        if not task_id:
            raise InvalidArgument("a task needs an id")
        if status not in TASK_STATUSES:
            raise InvalidArgument(
                f"task status {status!r} is not one of {', '.join(TASK_STATUSES)}")
        for what, text in (("task id", task_id), ("title", title), ("parent", parent),
                           ("note", note)):
            check_text(what, text)
        existing = {t.id: t for t in self.store.list_tasks(self.world.session(session_id).id)}
        if parent and parent not in existing:
            raise InvalidArgument(f"parent task {parent!r} does not exist in this session")
        if parent == task_id:
            raise InvalidArgument("a task cannot be its own parent")
        old = existing.get(task_id)
        task = Task(task_id, title or (old.title if old else task_id),
                    parent or (old.parent if old else None), status,
                    note or (old.note if old else ""), ids.now())
        self.store.set_task(session_id, task, [AuditEvent(
            "task", session_id, task_id, {"status": status}, ids.now())])
        return task

    def tasks(self, session_id: str) -> tuple[list[Task], str | None]:
        tasks = ordered_tasks(self.store.list_tasks(self.world.session(session_id).id))
        resume = next((t.id for t in tasks if t.status not in ("completed", "skipped")), None)
        return tasks, resume

    # -- sessions and the audit log --------------------------------------------------------
    def delete_session(self, session_id: str, keep_container: bool = False):
        """Release the session's workspace (World.delete_session) and withdraw its
        pending approvals: nothing can be recorded against them any more."""
        session = self.world.delete_session(session_id, keep_container)
        for approval in self.store.list_approvals(session_id, "pending"):
            try:
                self.decide(approval.id, False, "withdrawn: its session was deleted")
            except FailedPrecondition:
                pass  # decided meanwhile
        return session

    def audit(self, session_id: str = "", kind: str = "", limit: int = 0) -> list[AuditEvent]:
        if limit < 0:
            raise InvalidArgument(f"limit must not be negative (got {limit})")
        if kind and kind not in AUDIT_KINDS:
            raise InvalidArgument(f"audit kind {kind!r} is not one of {', '.join(AUDIT_KINDS)}")
        if session_id:
            self.world.session(session_id)
        return self.store.list_audit(session_id or None, kind or None, limit)

    def wait_audit(self, after_seq: int, kinds: list[str], session_id: str = "",
                   timeout: float = 30.0) -> tuple[list[AuditEvent], int]:
        """The events after ``after_seq`` (of ``kinds``, of ``session_id``), as soon as
        there is one, else none once ``timeout`` passed; and the seq to follow from.
        ``after_seq`` -1: no events, the log's end (where a follower starts). The log is
        read every AUDIT_POLL seconds (on a fleet other hosts append to it too) and at
        once when an approval is requested or decided here."""
        unknown = [k for k in kinds if k not in AUDIT_KINDS]
        if unknown:
            raise InvalidArgument(f"audit kind {unknown[0]!r} is not one of"
                                  f" {', '.join(AUDIT_KINDS)}")
        if after_seq < -1:
            raise InvalidArgument(f"after_seq must be -1 or more (got {after_seq})")
        if session_id:
            self.world.session(session_id)
        if after_seq == -1:
            last = self.store.list_audit(limit=1)
            return [], last[-1].seq if last else 0
        deadline = time.monotonic() + min(max(timeout, 0.0), MAX_AUDIT_WAIT)
        while True:
            events = self.store.list_audit(session_id or None,
                                           after_seq=after_seq)[:AUDIT_BATCH]
            if events:
                after_seq = events[-1].seq
            wanted = [e for e in events if not kinds or e.kind in kinds]
            remaining = deadline - time.monotonic()
            if wanted or remaining <= 0 or self.closing.is_set():
                return wanted, after_seq
            with self._decided:
                self._decided.wait(min(remaining, AUDIT_POLL))

    # -- approvals -------------------------------------------------------------------------
    def request_approval(self, session_id: str, tool: str, args_json: str = "",
                         ttl: float = 0.0) -> Approval:
        if not tool:
            raise InvalidArgument("an approval needs a tool name")
        args = parse_args_json(args_json)
        if ttl < 0 or ttl > MAX_APPROVAL_TTL:
            raise InvalidArgument(f"ttl must be between 0 and {MAX_APPROVAL_TTL} seconds")
        cp = self.world.checkpoint(session_id, label=f"approval requested: {tool}")
        created = dt.datetime.now(dt.UTC)
        expires = created + dt.timedelta(seconds=ttl or DEFAULT_APPROVAL_TTL)
        approval = Approval(ids.new_id(), session_id, tool, json.dumps(args, sort_keys=True),
                            "pending", cp.id, _fmt(created), _fmt(expires))
        self.store.add_approval(approval, [AuditEvent(
            "approval.request", session_id, approval.id,
            {"tool": tool, "checkpoint": cp.id, "expires_at": approval.expires_at}, ids.now())])
        with self._decided:
            self._decided.notify_all()
        log.info("approval %s requested for %r in session %s (expires %s): `worldline"
                 " approve %s` or `worldline deny %s --reason ...`", approval.id, tool,
                 session_id, approval.expires_at, approval.id, approval.id)
        return approval

    def get_approval(self, approval_id: str) -> Approval:
        return self._expire_if_due(self.store.get_approval(check_id("approval", approval_id)))

    def list_approvals(self, session_id: str = "", status: str = "") -> list[Approval]:
        if status and status not in APPROVAL_STATUSES:
            raise InvalidArgument(f"approval status {status!r} is not one of"
                                  f" {', '.join(APPROVAL_STATUSES)}")
        if session_id:
            self.world.session(session_id)
        for approval in self.store.list_approvals(session_id or None, "pending"):
            self._expire_if_due(approval)
        return self.store.list_approvals(session_id or None, status or None)

    def cancel(self, approval_id: str, reason: str = "") -> Approval:
        """The requester withdraws a pending approval: it is denied, saying so."""
        check_text("reason", reason)
        return self.decide(approval_id, False,
                           f"cancelled by its requester{': ' + reason if reason else ''}")

    def decide(self, approval_id: str, approve: bool, reason: str = "") -> Approval:
        check_text("reason", reason)
        if not approve and not reason.strip():
            raise InvalidArgument("a denial needs a reason")
        approval = self.get_approval(approval_id)
        if approval.status != "pending":
            raise FailedPrecondition(f"approval {approval_id} is already {approval.status}")
        status = "approved" if approve else "denied"
        decided = self.store.decide_approval(approval_id, status, reason, ids.now(), [AuditEvent(
            f"approval.{status}", approval.session_id, approval_id, {"reason": reason},
            ids.now())])
        with self._decided:
            self._decided.notify_all()
        return decided

    def wait(self, approval_id: str, timeout: float) -> Approval:
        """Block until the approval is decided or expires, or ``timeout`` passes."""
        timeout = min(max(timeout, 0.0), MAX_WAIT)
        deadline = time.monotonic() + timeout
        while True:
            approval = self.get_approval(approval_id)
            remaining = deadline - time.monotonic()
            if approval.status != "pending" or remaining <= 0:
                return approval
            until_expiry = (_parse(approval.expires_at) - dt.datetime.now(dt.UTC)
                            ).total_seconds()
            with self._decided:
                self._decided.wait(max(0.01, min(remaining, until_expiry + 0.01, 1.0)))

    def _expire_if_due(self, approval: Approval) -> Approval:
        if approval.status != "pending":
            return approval
        if _parse(approval.expires_at) > dt.datetime.now(dt.UTC):
            return approval
        try:
            expired = self.store.decide_approval(approval.id, "expired", "deadline passed",
                                                 ids.now(), [AuditEvent(
                                                     "approval.expired", approval.session_id,
                                                     approval.id, {}, ids.now())])
        except FailedPrecondition:
            return self.store.get_approval(approval.id)
        with self._decided:
            self._decided.notify_all()
        return expired


def _canonical(args: dict | str) -> str:
    """Arguments (a dict, or their JSON as stored) in one form, to compare."""
    return json.dumps(json.loads(args or "{}") if isinstance(args, str) else args,
                      sort_keys=True)


def _fmt(t: dt.datetime) -> str:
    return t.isoformat(timespec="microseconds").replace("+00:00", "Z")


def _parse(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))

