"""A restore: the session's world brought back to a checkpoint, appended as a new
checkpoint after the head (history only grows).

In order: the target checked usable and in the session's lineage, the session locked
(session_lock.py), the side effects it passes acknowledged, a removed container made
again (hold.py); then, with the container stopped (plan.py), the plan made and the
world as it is kept as a checkpoint of its own when it differs from the head
(``BEFORE_RESTORE``), the journal written (journal.py), each layer brought to the
target, and the restore's checkpoint appended, which ends the journal.
"""

from __future__ import annotations

import errno
import logging
from dataclasses import dataclass, field, replace

from worldline.wire.errors import (
    FailedPrecondition,
    Internal,
    ResourceExhausted,
    WorldlineError,
)

from .. import history, ids
from ..capture.apply import CHANGED
from ..capture.layers import CONTAINER
from ..capture.trees import Diff, diff
from ..faults import crash_point
from ..records import (
    AuditEvent,
    Checkpoint,
    Session,
    Task,
    ToolCall,
    tasks_from_json,
    tasks_to_json,
)
from ..storage.durable import out_of_space
from .checkpoint import checkpoint_detail
from .core import Core
from .hold import ContainerHold
from .journal import new_entry
from .plan import LayerPlan, Plans, bases
from .reads import side_effects_since
from .session_lock import SessionLock

log = logging.getLogger(__name__)

# The label of the checkpoint a restore takes of the world just before it changes it,
# when the world differs from the head (Restores._checkpoint_before).
BEFORE_RESTORE = "before restore"


@dataclass
class RestoreResult:
    checkpoint: Checkpoint | None
    restored_from: str
    files_written: list[str]
    files_removed: list[str]
    side_effects: list[ToolCall]
    dry_run: bool = False
    container: Diff | None = None  # the container layer's changes, when it has one
    warnings: list[str] = field(default_factory=list)
    # The world as it was just before (BEFORE_RESTORE), when it differed from the head;
    # the paths that differed (a container's prefixed "container:"); the container's
    # processes the restore stopped (a dry run: would stop), "PID COMMAND" each.
    before: Checkpoint | None = None
    not_checkpointed: list[str] = field(default_factory=list)
    processes: list[str] = field(default_factory=list)


class Restores:
    def __init__(self, core: Core, hold: ContainerHold, plans: Plans,
                 lock: SessionLock) -> None:
        self.core = core
        self.hold = hold
        self.plans = plans
        self.lock = lock

    def restore(self, session_id: str, checkpoint_id: str, *, acknowledge: bool = False,
                dry_run: bool = False, expected_head: str = "",
                from_other_session: bool = False, paths: list[str] | None = None
                ) -> RestoreResult:
        """``paths``: only those workspace paths (history.Graft), the rest of the world,
        the conversation and the tasks as they are; no side effect is passed."""
        paths = sorted({history.check_path(p) for p in paths or ()})
        with self.core.in_use.holding(checkpoint_id):  # kept from gc until it is committed
            return self._restore(session_id, checkpoint_id, acknowledge, dry_run,
                                 expected_head, from_other_session, paths)

    def _restore(self, session_id: str, checkpoint_id: str, acknowledge: bool,
                 dry_run: bool, expected_head: str, from_other_session: bool,
                 paths: list[str]) -> RestoreResult:
        core, hold = self.core, self.hold
        target = core.usable(checkpoint_id)
        with self.lock.locked(session_id, expected_head) as (session, tasks_now):
            self._check_lineage(session, target, from_other_session)
            if session.container and target.container is None:
                raise FailedPrecondition(f"checkpoint {target.id} has no container layer to"
                                         f" restore into container {session.container}")
            effects = [] if paths else side_effects_since(core.store, session.head,
                                                          target.id)
            head = core.store.get_checkpoint(session.head)
            if dry_run:
                shown = replace(session, container=None) if hold.gone(session) else session
                processes = hold.processes(shown)
                with hold.paused(shown) as mapped:
                    plans = self.plans.plan(shown, head, target, mapped, paths=paths)
                return replace(self._result(None, target, plans, effects, [], dry_run=True),
                               not_checkpointed=self._not_checkpointed(head, plans),
                               processes=processes)
            if effects and not acknowledge:
                names = ", ".join(f"{c.name} ({c.id})" for c in effects)
                raise FailedPrecondition(
                    f"restoring to {target.id} passes {len(effects)} non-idempotent side"
                    f" effect(s) no restore can undo: {names}; acknowledge them to proceed"
                    " (--yes)")
            cp = Checkpoint(ids.new_id(), session_id, 0, session.head, "restore", ids.now(),
                            target.tree, target.bytes, target.state_digest, target.tasks_digest,
                            target.id, 0, target.message_count, label=f"restore of {target.id}",
                            restored_from=target.id, acknowledged=tuple(c.id for c in effects),
                            container=target.container if session.container else None,
                            resume=target.resume)
            if paths:  # files only: the conversation, state and tasks stay the head's
                cp = replace(cp, state_digest=head.state_digest,
                             tasks_digest=head.tasks_digest, conversation_parent=head.id,
                             message_count=head.message_count, resume=head.resume,
                             label=f"restore of {', '.join(paths)[:200]} from {target.id}")
            entry = new_entry(session_id, target.id, session.head, cp)
            revived = hold.revive(session)
            if revived:
                session = core.session(session_id)
            processes = [] if revived else hold.processes(session)
            kept: dict = {}

            def keep_the_world(plans: list[LayerPlan]) -> None:
                """Before anything changes: the world as it is, as a checkpoint."""
                kept["before"] = self._checkpoint_before(session, head, tasks_now, plans,
                                                         revived, entry)
                if paths:  # the tree made of the world and the paths, stored and durable
                    core.blobs.sync()
                    entry["checkpoint"].update(
                        tree=plans[0].want, bytes=plans[0].size_after,
                        container=plans[1].want if len(plans) > 1 else None,
                        tasks_digest=(kept["before"] or head).tasks_digest)

            try:
                plans, warnings = self.plans.apply(session, head, target, entry,
                                                   keep_the_world, paths)
            except (WorldlineError, OSError) as exc:
                raise self._restore_failed(session, target, exc) from exc
            before = kept.get("before")
            cp = replace(cp, **{k: entry["checkpoint"][k] for k in (
                "id", "parent_id", "created_at", "tree", "bytes", "container",
                "tasks_digest")})
            warnings += [f"the world before the restore was not checkpointed: {p.unsaved}"
                         for p in plans if p.unsaved]
            if revived:
                hold.start(session.container, session.workspace)
                warnings.append(f"container {session.container} was gone: made again from"
                                " its recorded spec")
            crash_point("restore.before_commit")
            tasks = (None if paths
                     else tasks_from_json(core.blobs.read_bytes(target.tasks_digest)))
            written = sum(len(p.changes.added) + len(p.changes.modified) for p in plans)
            detail = {"target": target.id, "written": written,
                      "removed": sum(len(p.changes.deleted) for p in plans)}
            if paths:
                detail["paths"] = paths
            left = [w[:-len(CHANGED) - 2] for w in warnings if w.endswith(CHANGED)]
            if left:  # changed under the restore (an agent racing it): left as they were
                detail["left_alone"] = left[:100]
            events = [AuditEvent("restore", session_id, cp.id, detail, ids.now())]
            if effects:
                events.append(AuditEvent("side_effects.acknowledge", session_id, cp.id,
                                         {"tool_calls": [c.id for c in effects]}, ids.now()))
            cp = core.store.append_checkpoint(cp, [], entry["head"], tasks, events)
            core.journal.remove(session_id)
        return replace(self._result(cp, target, plans, effects, warnings), before=before,
                       not_checkpointed=self._not_checkpointed(
                           head, plans[:1] if revived else plans),  # a new layer: nothing
                       processes=processes)

    def _not_checkpointed(self, head: Checkpoint, plans: list[LayerPlan]) -> list[str]:
        """The paths where the world differs from the head (a container's prefixed
        "container:"): what a restore would lose were it not checkpointed first."""
        out = []
        for plan, base in zip(plans, bases(head), strict=False):
            changes = diff(self.core.trees, base or self.core.empty_tree, plan.current.root,
                           plan.current.trees)
            prefix = "container:" if plan.layer.kind == CONTAINER else ""
            out += [prefix + p for p in sorted(changes.added + changes.modified
                                               + changes.deleted)]
        return out

    def _checkpoint_before(self, session: Session, head: Checkpoint, tasks: list[Task],
                           plans: list[LayerPlan], revived: bool, entry: dict
                           ) -> Checkpoint | None:
        """The world as the restore's plan captured it (stored: ``Plans.plan(persist=
        True)``), committed as a checkpoint of its own (BEFORE_RESTORE) after the head,
        when it differs from the head, before the journal is written and anything
        changes; the journal's entry then follows it. A crash after it leaves it in the
        history, the world untouched. None when the world equals the head, or when a
        layer could not be stored (a limit: the restore says so in its warnings). A
        container made again (``revived``) carries the head's layer: its fresh one is
        nothing lost."""
        core = self.core
        roots = [p.current.root for p in plans]
        if revived and len(roots) > 1:
            roots[1] = head.container
        tasks_json = tasks_to_json(tasks)
        same_tasks = core.blobs.address(tasks_json) == head.tasks_digest
        if roots == bases(head)[:len(roots)] and same_tasks:
            return None
        if any(p.unsaved for p in plans):
            return None
        tasks_digest = (head.tasks_digest if same_tasks
                        else core.blobs.put_bytes(tasks_json, base=head.tasks_digest))
        cp = Checkpoint(ids.new_id(), session.id, 0, head.id, "checkpoint", ids.now(),
                        roots[0], plans[0].current.bytes, head.state_digest, tasks_digest,
                        head.id, 0, head.message_count, label=BEFORE_RESTORE,
                        container=roots[1] if len(roots) > 1 else head.container,
                        resume=head.resume)
        with core.blobs.committing() as objects:
            cp = core.store.append_checkpoint(cp, [], head.id, None, [AuditEvent(
                "checkpoint", session.id, cp.id,
                checkpoint_detail(cp, BEFORE_RESTORE, 0) | {"restore": entry["target"]},
                ids.now())], objects)
        core.heads[session.id] = cp
        entry["head"] = cp.id  # the restore's checkpoint follows it, and is newer
        entry["checkpoint"].update(parent_id=cp.id, id=ids.new_id(), created_at=ids.now())
        return cp

    def _restore_failed(self, session: Session, target: Checkpoint,
                        exc: WorldlineError | OSError) -> Exception:
        """A restore that failed part-way with an error this daemon saw (a full disk, a
        folder that kept changing under it) leaves no journal: left for the next call,
        it would set the session aside for an operator as soon as the agent wrote
        anything. The layers keep what it wrote (each path as it was or as the target
        has it), and each layer's next capture reads every file, so the next checkpoint
        records exactly that; no checkpoint changes, and the restore can be run again.
        (A crash leaves its journal: that restore is completed, or set aside.) Returns
        the error to raise, which says so."""
        core = self.core
        reason = exc.message if isinstance(exc, WorldlineError) else f"{exc}"
        if core.journal.get(session.id) is None:
            return exc  # refused before it changed anything
        try:
            for layer in core.layers(session):
                if layer.tracker is not None:
                    layer.tracker.invalidate(f"a restore to {target.id} failed part-way")
        except WorldlineError as other:  # the journal stays: completed or set aside later
            log.warning("session %s: the failed restore's journal is kept: %s", session.id,
                        other.message)
            return exc
        core.journal.remove(session.id)
        try:
            core.store.append_audit([AuditEvent("restore.failed", session.id, target.id,
                                                {"reason": reason}, ids.now())])
        except WorldlineError as audit:
            log.warning("session %s: the failed restore's audit event: %s", session.id, audit)
        said = (f"{reason}; the restore to {target.id} stopped part-way: each path it was to"
                " change is as it was or as the checkpoint has it, every checkpoint is as"
                " it was, and the next checkpoint records the folder as it is; restore again"
                " once that is fixed")
        log.warning("session %s: %s", session.id, said)
        if isinstance(exc, WorldlineError):
            return type(exc)(said)
        if out_of_space(exc):
            return ResourceExhausted(said)
        return FailedPrecondition(said) if exc.errno == errno.EROFS else Internal(said)

    def _check_lineage(self, session: Session, target: Checkpoint, explicit: bool) -> None:
        """A checkpoint of another session's history restores here only when asked."""
        if explicit or target.session_id == session.id:
            return
        if target.id in {cid for cid, _ in self.core.store.lineage(session.head)}:
            return  # a fork's ancestry is its own
        raise FailedPrecondition(
            f"checkpoint {target.id} belongs to session {target.session_id}, outside the"
            f" lineage of session {session.id}; restore it here only on purpose"
            " (--from-other-session)")

    @staticmethod
    def _result(cp, target: Checkpoint, plans: list[LayerPlan], effects, warnings,
                dry_run: bool = False) -> RestoreResult:
        work = plans[0].changes
        box = next((p.changes for p in plans if p.layer.kind == CONTAINER), None)
        return RestoreResult(cp, target.id, sorted(work.added + work.modified), work.deleted,
                             effects, dry_run, box, warnings)
