"""The session lock: every operation that changes a session's world runs under its
workspace's lock, after any restore a crash or a failure left half-done is completed.

``locked`` is how an operation begins: the session and its task list read again under
the lock, the restore its journal names completed first (or set aside for an operator
when the layers changed since: a journal is never applied over work written after
it), then the session checked live, held by this host, and at the head the caller
expects.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

from worldline.wire.errors import Aborted, FailedPrecondition, NotFound, WorldlineError

from .. import ids
from ..capture.trees import entry_at, entry_key
from ..records import AuditEvent, Checkpoint, Session, Task, tasks_from_json
from ..validate import check_id
from .core import Core
from .hold import ContainerHold
from .journal import journalled
from .plan import Plans, bases, restore_diff

log = logging.getLogger(__name__)


class SessionLock:
    def __init__(self, core: Core, hold: ContainerHold, plans: Plans) -> None:
        self.core = core
        self.hold = hold
        self.plans = plans

    @contextlib.contextmanager
    def locked(self, session_id: str, expected_head: str = ""
               ) -> Iterator[tuple[Session, list[Task]]]:
        """The session and its task list, read again (together: one round trip on a
        fleet's store) under its workspace's lock, after any restore a failure left
        half-done was completed; ABORTED when its head is not ``expected_head``."""
        if expected_head:
            check_id("checkpoint", expected_head)
        check_id("session", session_id)
        core = self.core
        # The lock is the workspace's: known from the last call (a read less on the hot
        # path), checked under the lock, and looked up again if a take-over moved it.
        workspace = core.workspace_of.get(session_id) or core.session(session_id).workspace
        lock = core.lock(workspace)
        lock.acquire()
        try:
            session, tasks = self.pending(session_id)
            if session.workspace != workspace:
                lock.release()
                lock = core.lock(session.workspace)
                lock.acquire()
                session, tasks = self.pending(session_id)
            core.workspace_of[session_id] = session.workspace
            if session.deleted_at:
                raise FailedPrecondition(f"session {session_id} was deleted at"
                                         f" {session.deleted_at}: its history can be read,"
                                         " diffed and forked, not changed")
            core.check_held(session)
            if expected_head and expected_head != session.head:
                raise Aborted(f"session {session_id} head is {session.head}, not {expected_head}")
            yield session, tasks
        finally:
            lock.release()

    def pending(self, session_id: str) -> tuple[Session, list[Task]]:
        """A restore of this session that failed midway is completed before anything else
        happens to the session, if nothing changed since (the caller holds the lock);
        a session that needs attention takes no operation that changes its world.
        Returns the session and its task list as they now are."""
        entry = self.core.journal.get(session_id)
        if entry is not None:
            log.warning("session %s: %s", session_id, self.finish(entry))
        session, tasks = self.core.store.get_session_and_tasks(check_id("session", session_id))
        if session.needs_attention:
            raise FailedPrecondition(f"session {session_id} needs attention:"
                                     f" {session.needs_attention}")
        return session, tasks

    def finish(self, entry: dict) -> str:
        """Complete a restore its journal says was begun (the caller holds the lock), but
        only if every layer is still as the restore left it: each path it was to change
        either as it was or as it was to be, and nothing else changed. Otherwise the
        entry is set aside and the session marked as needing attention: a journal is
        never applied over work written after it."""
        core = self.core
        sid, fields = entry["session"], entry["checkpoint"]
        try:
            core.store.get_checkpoint(fields["id"])
            core.journal.remove(sid)
            return f"restore of session {sid} to {entry['target']} had completed"
        except NotFound:
            pass
        session = core.store.get_session(sid)
        head = core.store.get_checkpoint(entry["head"])
        journalled(entry)  # an entry that cannot be read fails here, before anything is
        try:
            with self.hold.paused(session) as mapped:  # paused (and set aside by recovery)
                problem = self._changed_since(session, head, entry, mapped)
        except WorldlineError as exc:
            problem = exc.message
        if problem:
            return self.set_aside(session, entry, problem)
        for layer in core.layers(session):  # a file written aside, never renamed
            for path in layer.snap.remove_leftovers():
                log.warning("session %s: removed %s, left by the interrupted restore",
                            sid, os.path.join(layer.path, path))
        self.complete(session, head, entry)
        self.hold.release("stopped", session.id)
        return f"completed the interrupted restore of session {sid} to {entry['target']}"

    def complete(self, session: Session, head: Checkpoint, entry: dict) -> None:
        """Bring the layers to the journalled restore's target and append its checkpoint
        after ``head`` (the caller holds the lock, and has decided the entry is to be
        applied)."""
        core = self.core
        target = journalled(entry)
        self.plans.apply(session, head, target, entry)
        tasks = tasks_from_json(core.blobs.read_bytes(target.tasks_digest))
        core.store.append_checkpoint(target, [], entry["head"], tasks, [AuditEvent(
            "restore.completed", session.id, target.id, {"target": entry["target"]},
            ids.now())])
        core.journal.remove(session.id)

    def _changed_since(self, session: Session, head: Checkpoint, entry: dict,
                       mapped: dict[str, frozenset[str]]) -> str:
        """Why the layers are not as the interrupted restore left them ("" if they are)."""
        trees = self.core.trees
        planned = {p["kind"]: p for p in entry.get("layers", [])}
        layers = self.core.layers(session)
        if len(planned) != len(layers) or any(x.kind not in planned for x in layers):
            return "the session's layers are not the ones the restore began with"
        target = journalled(entry)
        for layer, base, want in zip(layers, bases(head), bases(target), strict=False):
            paths = planned[layer.kind]["paths"]
            current, _ = layer.capture(base, persist=False, consume=False, mapped=mapped)
            left = restore_diff(trees, layer, current, want)
            for path in left.added + left.modified + left.deleted:
                have = entry_at(trees, current.root, path, current.trees)
                if have is not None and have.is_folder:
                    continue  # folders take their times and modes last: any is fine
                # As it was, or as it will be yet still to be linked to its hard-link
                # group (the restore links a group's other names last of all).
                if path not in paths or entry_key(have) not in paths[path]:
                    return (f"{layer.kind} path {path} changed after the restore was"
                            " interrupted")
        return ""

    def set_aside(self, session: Session, entry: dict, reason: str) -> str:
        """Keep the journal's entry for an operator (``World.resolve``) and mark the
        session as needing attention; a line for the report."""
        core = self.core
        why = (f"an interrupted restore to {entry['target']} was not completed: {reason};"
               " resolve with `worldline session resolve`")
        core.journal.set_aside(session.id)
        core.store.update_session(session.id, needs_attention=why)
        core.store.append_audit([AuditEvent("restore.set_aside", session.id, entry["target"],
                                            {"reason": reason}, ids.now())])
        return f"session {session.id} needs attention: {why}"
