"""The container hold: a session's container paused while its world is read, stopped
while it is restored, made again when it was removed, and started with its bind of
the workspace checked.

A container the daemon pauses or stops is marked (a file per session under the data
root, ``paused/`` or ``stopped/``), so what a killed daemon left so is undone at its
next start (``release_left``). The engine resolves a bind mount's source path at each
start, following symlinks: a container whose bind shows another folder than the
session's workspace is stopped at once, never left running.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import replace
from typing import NoReturn

from worldline.wire.errors import FailedPrecondition, NotFound, WorldlineError

from .. import ids
from ..capture import mappings
from ..capture.containers import bind_identity_of
from ..capture.layers import CONTAINER, WORKSPACE
from ..faults import crash_point
from ..records import AuditEvent, Session
from ..session_spec import SessionSpec
from .core import Core
from .folders import folder_identity, shows_another

log = logging.getLogger(__name__)


class ContainerHold:
    def __init__(self, core: Core) -> None:
        self.core = core

    def mark(self, kind: str, session_id: str) -> str:
        """The file that says the session's container is held ``kind`` ("paused" or
        "stopped") by this daemon (Engine.frozen, Engine.stop)."""
        return os.path.join(self.core.marks[kind], session_id)

    # -- while the world is read, or restored ---------------------------------------------
    @contextlib.contextmanager
    def paused(self, session: Session) -> Iterator[dict[str, frozenset[str]]]:
        """The container paused (if it runs) while its world is read. Callers that go on
        without a removed container pass the session without it (checkpoint, dry run).
        Yields, by layer kind, the files its processes map shared and writable
        (mappings.py): a capture reads them whatever their stat says."""
        if not session.container:
            yield {}
            return
        roots = SessionSpec.parse(session.spec).roots or {}
        with self.core.require_engine().frozen(session.container,
                                               mark=self.mark("paused", session.id)) as attrs:
            crash_point("capture.paused")
            if not shows_another(roots.get(WORKSPACE),
                                 bind_identity_of(attrs, session.workspace)):
                yield self._mapped(session, attrs, roots)
                return
        # Started by someone else (a restart policy, `docker restart`) after a folder
        # above the workspace was swapped for a symlink: it holds another folder there.
        self.stop_bound_elsewhere(session.container, session.workspace)

    def _mapped(self, session: Session, attrs: dict, roots: dict
                ) -> dict[str, frozenset[str]]:
        """``roots``: the layers' identities recorded in the session's spec."""
        try:
            dev = (roots[WORKSPACE][0] if WORKSPACE in roots
                   else os.stat(session.workspace).st_dev)
            work, box = mappings.of_container(attrs, session.workspace, dev)
        except OSError as exc:  # /proc unreadable: the captures go on without them
            log.warning("session %s: the container's mapped files could not be read: %s",
                        session.id, exc)
            return {}
        return {WORKSPACE: work, CONTAINER: box}

    @contextlib.contextmanager
    def stopped(self, session: Session) -> Iterator[None]:
        """The container stopped while the block restores its world, then started again
        if it was running (its bind checked). A start refused keeps the mark: the
        daemon's next start starts it."""
        mark = self.mark("stopped", session.id)
        was_running = (self.core.require_engine().stop(session.container, mark=mark)
                       if session.container else False)
        try:
            yield
        finally:
            if was_running:
                self.core.require_engine().start(session.container)
                try:
                    self.check_bind(session.container, session.workspace)
                finally:
                    os.unlink(mark)

    def processes(self, session: Session) -> list[str]:
        """The processes a restore of the session stops: its container's, if it runs."""
        return (self.core.require_engine().processes(session.container)
                if session.container else [])

    # -- a daemon's holds undone -----------------------------------------------------------
    def release(self, kind: str, session_id: str) -> str | None:
        """Unpause ("paused") or start again ("stopped") the session's container if a
        daemon that died, or a restore cut short, left it so (its mark says); a line
        for the report, or None. A session that needs attention keeps its container
        stopped until an operator resolves it. An engine that does not answer, or a
        container that cannot be started, is logged and keeps the mark for the next
        start: it never stops this one, nor undoes a restore that is done."""
        mark = self.mark(kind, session_id)
        if not os.path.exists(mark) or (kind == "stopped"
                                        and self._needs_attention(session_id)):
            return None
        try:
            engine = self.core.require_engine()
            container = (engine.unpause_marked(mark) if kind == "paused"
                         else engine.start_marked(mark))
        except (WorldlineError, OSError) as exc:
            log.warning("container of session %s, %s when the daemon stopped: left as it"
                        " is for now: %s", session_id, kind, getattr(exc, "message", exc))
            return None
        if container is None:
            return None
        if kind == "stopped":
            try:
                self.check_bind(container, self.core.store.get_session(session_id).workspace)
            except WorldlineError as exc:
                return f"container {container} of session {session_id}: {exc.message}"
        return (f"{'unpaused' if kind == 'paused' else 'started'} container {container}"
                f" of session {session_id}, which the daemon's last run had {kind}")

    def release_left(self, kind: str) -> list[str]:
        """At start: ``release`` every container a mark of ``kind`` names (the stopped
        ones once the restores a crash interrupted are completed)."""
        return [line for name in sorted(os.listdir(self.core.marks[kind]))
                if (line := self.release(kind, name)) is not None]

    def _needs_attention(self, session_id: str) -> bool:
        try:
            return bool(self.core.store.get_session(session_id).needs_attention)
        except NotFound:
            return False  # never recorded: its container is not worldline's to hold

    # -- a container removed, made again ---------------------------------------------------
    def gone(self, session: Session) -> bool:
        """Whether the session's container was removed behind worldline's back."""
        return bool(session.container) and not self.core.require_engine().exists(
            session.container)

    def revive(self, session: Session) -> bool:
        """Make a removed container again, identically, from the spec recorded with the
        session (its name, configuration and mounts); its layer is then restored like
        any other. Returns whether it had to."""
        if not self.gone(session):
            return False
        core = self.core
        spec = SessionSpec.parse(session.spec).container
        if not spec:
            raise FailedPrecondition(
                f"container {session.container} of session {session.id} is gone, and the"
                " session (made before 0.4) has no recorded spec to make it again")
        core.require_engine().create_from_spec(spec, session.container, session.workspace,
                                               session.workspace, core.labels(session.id),
                                               volumes="share")
        layers = core.layers(replace(session, spec="{}"))
        core.store.update_session(session.id, spec=core.recorded_spec(session, layers))
        core.store.append_audit([AuditEvent("container.recreate", session.id,
                                            session.container, {}, ids.now())])
        return True

    def container_spec(self, session: Session) -> dict:
        """The container's creation spec: as recorded with the session (so a container
        removed since can be made again), else as the engine shows it now."""
        spec = SessionSpec.parse(session.spec).container
        if spec:
            return spec
        if not session.container:
            raise FailedPrecondition(f"session {session.id} has no container")
        return self.core.require_engine().creation_spec(session.container)

    # -- starts, and the bind they show ----------------------------------------------------
    def start(self, container: str, workspace: str) -> None:
        """Start a session's container, then ``check_bind``."""
        self.core.require_engine().start(container)
        self.check_bind(container, workspace)

    def check_bind(self, container: str, workspace: str) -> None:
        """A running container that binds ``workspace`` must show there the folder that
        path names through no symlink. If a folder above it was swapped for a symlink,
        the container would hold the symlink's target: it is stopped at once
        (FAILED_PRECONDITION), never left running."""
        seen = self.core.require_engine().bind_identity(container, workspace)
        if seen is None:
            return
        try:
            want = folder_identity(WORKSPACE, workspace)
        except WorldlineError:
            want = None
        if seen != want:
            self.stop_bound_elsewhere(container, workspace)

    def container_started(self, container: str, session_id: str) -> None:
        """A container of this data root was started, by anyone (containers.StartWatch):
        if it binds its session's workspace and shows there another folder than the one
        recorded for the session (a start by a restart policy or an operator after a
        folder above the workspace was swapped for a symlink), it is stopped now, not at
        the session's next checkpoint."""
        core = self.core
        try:
            session = core.store.get_session(session_id)
        except NotFound:
            return  # a fork's container before its session is recorded: its start checks
        if session.deleted_at or not session.container or not core.held_here(session):
            return
        want = SessionSpec.parse(session.spec).root(WORKSPACE)
        if not shows_another(want, core.require_engine().bind_identity(container,
                                                                       session.workspace)):
            return
        try:
            self.stop_bound_elsewhere(container, session.workspace)
        except FailedPrecondition as exc:  # no caller to answer: the log says it
            log.warning("session %s, as its container started: %s", session.id, exc.message)

    def stop_bound_elsewhere(self, container: str, workspace: str) -> NoReturn:
        """Stop a container whose bind of ``workspace`` shows another folder, at once."""
        self.core.require_engine().stop(container, timeout=0)
        raise FailedPrecondition(
            f"container {container} was stopped: its bind mount of {workspace} shows"
            " another folder than the session's workspace (a folder on the way swapped for"
            " a symlink, or the container started before the workspace was there); start"
            " it again once the workspace is as it was")
