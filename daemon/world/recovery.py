"""Recovery: at start, what a killed daemon left is undone or completed; and an
operator's decision on a session set aside for attention (``resolve``).
"""

from __future__ import annotations

import logging
import os
import shutil

from worldline.wire.errors import FailedPrecondition, NotFound

from .. import ids
from ..capture.containers import LABEL_ROOT, LABEL_SESSION
from ..records import AuditEvent, Session
from .core import Core
from .hold import ContainerHold
from .session_lock import SessionLock

log = logging.getLogger(__name__)

# How a session of a copied data root says why it waits (needs_attention): the
# original's world, until an operator resolves it here (_leave_to_the_original).
COPIED = "this data root is a copy of the one at"


class Recovery:
    def __init__(self, core: Core, hold: ContainerHold, lock: SessionLock) -> None:
        self.core = core
        self.hold = hold
        self.lock = lock

    def recover(self) -> list[str]:
        """At start: unpause the containers a killed daemon left paused, complete every
        restore a crash interrupted and start again the containers it left stopped, and
        remove containers that worldline made for sessions that were never recorded.
        Returns a report."""
        core = self.core
        report = self._leave_to_the_original() if core.copy_of else []
        report += self.hold.release_left("paused")
        for entry in core.journal.entries():
            try:  # nothing a journal holds may stop the daemon from serving the others
                session = core.store.get_session(entry["session"])
                with core.lock(session.workspace):
                    report.append(self.lock.finish(entry))
            except Exception as exc:
                log.exception("recovery of session %s", entry.get("session"))
                try:
                    session = core.store.get_session(entry["session"])
                    report.append(self.lock.set_aside(session, entry, f"{exc}"))
                except Exception:
                    core.journal.set_aside(str(entry.get("session")))
                    report.append(f"set aside the journal of {entry.get('session')}: {exc}")
        report += self.hold.release_left("stopped")
        known = {s.id for s in core.store.list_sessions()}
        report += self._remove_unrecorded_forks(known)
        if core.engine is not None and core.engine.ping():
            for c in core.engine.containers_labelled(LABEL_ROOT, core.root_id):
                if c.get("Labels", {}).get(LABEL_SESSION) not in known:
                    core.engine.remove(c["Id"])
                    report.append(f"removed orphaned container {c['Names'][0].lstrip('/')}")
        for line in report:
            log.warning("recovery: %s", line)
        return report

    def _remove_unrecorded_forks(self, known: set[str]) -> list[str]:
        """The folders (and overlay views) of forks that died before they were recorded."""
        views = self.core.views
        report = []
        for folder in (self.core.fork_root, views.forks if views else None):
            if folder is None or not os.path.isdir(folder):
                continue
            for name in os.listdir(folder):
                path = os.path.join(folder, name)
                if ids.is_id(name) and name not in known:
                    if views is not None:
                        try:
                            spec = views.read_spec(name)
                        except ValueError as exc:  # its workspace is unknown: left
                            spec = None
                            report.append(f"{exc}: the fork's mount, if any, is left")
                        if spec is not None:
                            views.unmount(spec["workspace"])
                        if os.path.ismount(path):
                            views.unmount(path)
                    shutil.rmtree(path, ignore_errors=True)
                    report.append(f"removed the unrecorded fork {path}")
        return report

    def _leave_to_the_original(self) -> list[str]:
        """At the start that found this data root a copy of the one at ``copy_of``
        (root_id.py): the sessions, restores under way and held containers it recorded
        are the original's, which goes on with them. No restore is completed here (each
        journal is set aside), no container is started or unpaused (their marks are
        dropped: the original's daemon releases them), and, with the embedded store (a
        fleet's is shared: its sessions' records are their holders'), every session
        waits for an operator's ``resolve --abandon`` before this root checkpoints or
        restores its world, whatever it waited for before. Its history stays readable,
        diffable and forkable. The audit log says so of each: ``session.copied`` (naming
        the restore that was under way, if any) and ``restore.set_aside`` for each
        restore set aside here."""
        core = self.core
        report = []
        aside_here: set[str] = set()
        for entry in core.journal.entries():
            core.journal.set_aside(str(entry.get("session")))
            aside_here.add(str(entry.get("session")))
            report.append(f"set aside the journal of a restore of session"
                          f" {entry.get('session')} to {entry.get('target')}: not completed"
                          f" here, where its workspace is the original's")
        for kind, folder in core.marks.items():
            for name in sorted(os.listdir(folder)):
                os.unlink(os.path.join(folder, name))
                report.append(f"left the container of session {name} {kind}, as the"
                              f" original's daemon at {core.copy_of} holds it")
        if not core.store.local:
            return report
        for session in core.store.list_sessions():
            if not session.deleted_at:
                report.append(self._wait_for_operator(session, aside_here))
        return report

    def _wait_for_operator(self, session: Session, aside_here: set[str]) -> str:
        """A session of a copied data root set to wait for ``resolve --abandon``."""
        core = self.core
        aside = core.journal.get_set_aside(session.id)
        world, them, as_they_are = (("workspace and container are", "them", "they are")
                                    if session.container else ("workspace is", "it", "it is"))
        restore = (f" (a restore to {aside.get('target')} was under way: it is not"
                   " completed here)" if isinstance(aside, dict) else "")
        before = (f" (before the copy: {session.needs_attention})"
                  if session.needs_attention else "")
        core.store.update_session(session.id, needs_attention=(
            f"{COPIED} {core.copy_of}, where this session goes on: its {world} the"
            f" original's{restore}; `worldline session resolve {session.id} --abandon`"
            f" makes {them} this root's, as {as_they_are}, once the original no longer"
            f" uses them{before}"))
        detail = {"original": core.copy_of}
        events = []
        if isinstance(aside, dict):
            detail["restore"] = str(aside.get("target"))
        if isinstance(aside, dict) and session.id in aside_here:
            events.append(AuditEvent(
                "restore.set_aside", session.id, detail["restore"],
                {"reason": f"this data root is a copy of the one at {core.copy_of}, whose"
                           " daemon completes the restore"}, ids.now()))
        events.append(AuditEvent("session.copied", session.id, session.id, detail,
                                 ids.now()))
        core.store.append_audit(events)
        return f"session {session.id} waits for an operator: this root is a copy of {core.copy_of}"

    def resolve(self, session_id: str, complete: bool) -> Session:
        """An operator's decision on a session that needs attention: complete the restore
        that was set aside (the layers brought to its target, whatever they hold now), or
        abandon it (the layers stay as they are; the next checkpoint records them). A
        session of a copied data root (_leave_to_the_original) can only be abandoned:
        its workspace and container become this root's as they now are, and any
        restore set aside with it is dropped."""
        core = self.core
        session = core.session(session_id)
        with core.lock(session.workspace):
            entry = core.journal.get_set_aside(session_id)
            copied = (session.needs_attention or "").startswith(COPIED)
            if (entry is None and not copied) or not session.needs_attention:
                raise FailedPrecondition(f"session {session_id} does not need attention")
            if copied and complete:  # its workspace may be the original's: left as it is
                raise FailedPrecondition(
                    f"session {session_id} waits because this data root is a copy:"
                    " `--abandon` makes its world this root's as it is (a restore after"
                    " that brings back any checkpoint)")
            if complete:
                try:
                    core.store.get_checkpoint(entry["checkpoint"]["id"])
                except NotFound:
                    self.lock.complete(session, core.store.get_checkpoint(entry["head"]),
                                       entry)
                core.journal.remove(session_id)
            for layer in core.layers(session):
                if layer.tracker is not None:
                    layer.tracker.invalidate("an operator resolved the session")
            core.journal.drop_set_aside(session_id)
            core.store.update_session(session_id, needs_attention=None)
            self.hold.release("stopped", session.id)  # running again if a restore stopped it
            core.store.append_audit([AuditEvent(
                "session.resolve", session_id, session_id,
                {"action": "complete" if complete else "abandon"}, ids.now())])
        return core.session(session_id)
