"""Sessions: made over a folder (with a container attached, or started from an
image), listed, deleted; and the rule that one folder belongs to one session.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import replace

from worldline.wire.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    WorldlineError,
)

from .. import ids, owners
from ..capture.containers import DEFAULT_MOUNT
from ..capture.exclude import check_patterns
from ..capture.layers import WORKSPACE
from ..faults import crash_point
from ..owners import Agent
from ..records import AuditEvent, Checkpoint, Session, tasks_to_json
from ..session_spec import SessionSpec
from ..validate import check_text
from .core import Core
from .folders import contains, folder_identity, not_available
from .hold import ContainerHold
from .session_lock import SessionLock

log = logging.getLogger(__name__)


class Sessions:
    def __init__(self, core: Core, hold: ContainerHold, lock: SessionLock) -> None:
        self.core = core
        self.hold = hold
        self.lock = lock

    def create(self, workspace: str, container: str | None = None, name: str = "",
               image: str = "", mount: str = "", *, session_id: str = "",
               agent: Agent | None = None, exclude=()) -> Session:
        """``agent``: the allowed user (owners.py) whose session it is, over a folder of
        its own; None: the daemon owner's. ``exclude``: gitignore patterns of workspace
        paths never captured nor restored (exclude.py), kept in the session's spec."""
        core = self.core
        exclude = check_patterns(exclude)
        path = self.check_workspace(workspace, must_be_empty=False, agent=agent)
        crash_point("session.checked")
        # The folder as its path names it now, through no symlink: every capture and
        # restore checks it is still that folder, the first capture below included.
        roots = {WORKSPACE: folder_identity(WORKSPACE, path)}
        if agent is not None:
            if image or container:
                raise PermissionDenied(f"an allowed user ({agent}) makes sessions without"
                                       " containers: a container is the daemon owner's to"
                                       " make or attach")
            owners.check_folder(agent, path, identity=roots[WORKSPACE])
        check_text("name", name)
        if image and container:
            raise InvalidArgument("give a container to attach or an image to start, not both")
        sid = session_id or ids.new_id()
        created_container = None
        if image:
            engine = core.require_engine()
            created_container = container_name = f"worldline-{sid.lower()}"
            engine.create_from_image(image, container_name, path, mount or DEFAULT_MOUNT,
                                     core.labels(sid))
            try:
                self.hold.start(container_name, path)
            except BaseException:
                engine.remove(container_name)
                raise
        elif container:
            container_name = core.require_engine().inspect(container)["Name"].lstrip("/")
        else:
            container_name = None
        container_spec = (core.require_engine().creation_spec(container_name)
                          if container_name else None)
        spec = SessionSpec(roots=roots, exclude=exclude or None,
                           agent=[agent.uid, agent.gid] if agent else None)
        session = Session(sid, name or os.path.basename(path), path, container_name, "", None,
                          ids.now(), host=core.host, lease_expires=core.lease(),
                          spec=spec.to_json())
        try:
            with core.lock(path):
                layers = core.layers(session)
                with self.hold.paused(session) as mapped:
                    captures = [layer.capture(None, mapped=mapped)[0] for layer in layers]
                if agent is not None:
                    owners.check_entries(core.trees, None, captures[0].root, agent)
                tasks_digest = core.blobs.put_bytes(tasks_to_json([]))
                core.blobs.sync()
                first = Checkpoint(ids.new_id(), sid, 0, None, "initial", ids.now(),
                                   captures[0].root, captures[0].bytes, core.empty_state,
                                   tasks_digest, None, 0, 0, label="session created",
                                   container=captures[1].root if len(captures) > 1 else None)
                session = replace(session, head=first.id,
                                  spec=core.recorded_spec(session, layers, container_spec))
                core.store.create_session(session, first, [], [
                    AuditEvent("session.create", sid, sid,
                               {"workspace": path, "container": container_name}
                               | ({"agent_uid": agent.uid} if agent else {}), ids.now()),
                    AuditEvent("checkpoint", sid, first.id, {"seq": 0, "tree": first.tree},
                               ids.now())])
                for layer, capture in zip(layers, captures, strict=True):
                    layer.committed(capture)
        except BaseException:
            if created_container:
                core.require_engine().remove(created_container)
            raise
        return core.store.get_session(sid)

    def create_in_own_folder(self, name: str) -> Session:
        """A session whose workspace is a new empty folder under the data root (named by
        the session id, so a crash before it is recorded leaves nothing recovery keeps)."""
        sid = ids.new_id()
        path = os.path.join(self.core.fork_root, sid)
        os.makedirs(path, mode=0o755)
        try:
            return self.create(path, name=name, session_id=sid)
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise

    def delete(self, session_id: str, keep_container: bool = False) -> Session:
        """Release a session's workspace and container: its history (checkpoints,
        conversation, tool calls, approvals, audit) is kept and can still be read, diffed
        and forked, and the folder may become another session's. Its container is
        stopped (unless ``keep_container``), never removed; a fork's overlay view is
        unmounted and not mounted again at a start (its upper layer, what the fork
        wrote, stays under the data root). No file is changed. (Gates.delete_session,
        which the servicer calls, also withdraws the session's pending approvals.)"""
        core = self.core
        with self.lock.locked(session_id) as (session, _):
            if core.monitor is not None:
                core.monitor.release(session.workspace)
            core.store.update_session(session_id, deleted_at=ids.now())
            core.store.append_audit([AuditEvent(
                "session.delete", session_id, session_id,
                {"workspace": session.workspace, "container": session.container,
                 "container_kept": bool(session.container and keep_container)}, ids.now())])
            core.forget(session_id)
            if core.views is not None and session.forked_from:
                core.views.release(session_id, session.workspace)
            if session.container and not keep_container and core.engine is not None:
                try:
                    core.engine.stop(session.container, timeout=5)
                except NotFound:
                    pass  # removed already
                except WorldlineError as exc:  # the engine away: said, the delete stands
                    log.warning("session %s deleted, but its container %s was not stopped:"
                                " %s", session_id, session.container, exc)
        return core.session(session_id)

    def list(self, include_deleted: bool = False, workspace: str = "") -> list[Session]:
        """Sessions, deleted ones only when asked; with ``workspace`` (an absolute path),
        only the live session whose workspace is that folder or holds it."""
        if workspace and not os.path.isabs(workspace):
            raise InvalidArgument(f"workspace {workspace!r} must be an absolute path")
        found = [s for s in self.core.store.list_sessions()
                 if include_deleted or not s.deleted_at]
        if workspace:
            real = os.path.realpath(workspace)
            found = [s for s in found if contains(s.workspace, real)
                     or contains(s.workspace, workspace)]
        return found

    # -- one folder, one session ----------------------------------------------------------
    def check_workspace(self, path: str, *, must_be_empty: bool, moving: str = "",
                        agent: Agent | None = None) -> str:
        """The real path of ``path``, a folder a session may have; ``moving``: the session
        that is to move there (its own workspace, the folder of a take-over it left
        unfinished, is no overlap). ``agent``: an allowed user asks, who is told that
        the folder is not available, never whose it is or where the daemon's are."""
        root = self.core.root
        if not path or not os.path.isabs(path):
            raise InvalidArgument(f"workspace {path!r} must be an absolute path")
        if os.path.lexists(path) and not os.path.isdir(path):
            raise InvalidArgument(f"workspace {path} is not a folder")
        if os.path.islink(path):
            raise InvalidArgument(f"workspace {path} is a symlink; give the folder itself")
        real = os.path.realpath(path)
        if real == "/":
            raise InvalidArgument("the file system root cannot be a workspace")
        inside_forks = real.startswith(self.core.fork_root + os.sep)
        if not inside_forks and (contains(real, root) or contains(root, real)):
            if agent is not None:
                raise InvalidArgument(not_available(path, agent))
            raise InvalidArgument(f"workspace {real} overlaps the data root {root}")
        self._check_overlap(real, moving, agent, path)
        if must_be_empty and os.path.isdir(real) and os.listdir(real):
            raise FailedPrecondition(f"workspace {real} is not empty")
        if not must_be_empty and not os.path.isdir(real):
            raise NotFound(f"workspace {real} does not exist")
        return real

    def _check_overlap(self, real: str, moving: str = "", agent: Agent | None = None,
                       given: str = "") -> None:
        """One folder belongs to one session: a workspace may not equal, contain or lie
        inside another session's workspace (one inotify watch has one owner, and two
        sessions restoring one folder would destroy each other's work), nor the engine's
        data root. An allowed user (``agent``) is told of its own sessions only. The
        caller's own session over that very folder is ALREADY_EXISTS, naming it (the
        client's ``create_session(..., exist_ok=True)`` takes it)."""
        core = self.core
        for other in core.store.list_sessions():
            if other.deleted_at or other.host not in ("", core.host) or other.id == moving:
                continue  # its workspace was released, or is another host's folder
            if contains(other.workspace, real) or contains(real, other.workspace):
                if agent is not None and not owners.made_by(other.spec, agent):
                    raise FailedPrecondition(not_available(given or real, agent))
                if other.workspace == real:
                    raise AlreadyExists(f"workspace {real} is already the workspace of"
                                        f" session {other.id}")
                raise FailedPrecondition(
                    f"workspace {real} overlaps the workspace {other.workspace} of session"
                    f" {other.id}")
        engine_root = core.engine.data_root() if core.engine is not None else None
        if engine_root and (contains(real, engine_root) or contains(engine_root, real)):
            if agent is not None:
                raise InvalidArgument(not_available(given or real, agent))
            raise InvalidArgument(f"workspace {real} overlaps the Docker engine's data root"
                                  f" {engine_root}")
