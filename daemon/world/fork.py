"""A fork: a new session whose world is a checkpoint's, in a folder of its own (an
overlay view of the checkpoint's tree when the views allow it, a copy otherwise), with
a container made from the source session's recorded spec when it had one.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass, field, replace

from worldline.wire.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
)

from .. import ids, owners, progress
from ..capture.containers import extra_mounts
from ..capture.layers import WORKSPACE
from ..capture.resolve import identity_of, make_folder
from ..capture.snapshotter import Capture
from ..faults import crash_point
from ..owners import Agent
from ..records import AuditEvent, Checkpoint, Session, ToolCall, tasks_from_json
from ..session_spec import SessionSpec
from ..validate import check_text
from .core import Core
from .folders import existing_identity, remove_folder, symlink_refused
from .hold import ContainerHold
from .plan import bases
from .reads import side_effects_since
from .sessions import Sessions

log = logging.getLogger(__name__)


@dataclass
class ForkResult:
    session: Session
    side_effects: list[ToolCall] = field(default_factory=list)


class Forks:
    def __init__(self, core: Core, hold: ContainerHold, sessions: Sessions) -> None:
        self.core = core
        self.hold = hold
        self.sessions = sessions

    def fork(self, checkpoint_id: str, workspace: str = "", name: str = "",
             volumes: str = "", agent: Agent | None = None) -> ForkResult:
        """``agent``: the allowed user forking its own checkpoint into a new folder in a
        folder of its own (the fork is its session); None: the daemon owner."""
        with self.core.in_use.holding(checkpoint_id):  # kept from gc until it is recorded
            return self._fork(checkpoint_id, workspace, name, volumes, agent)

    def _fork(self, checkpoint_id: str, workspace: str, name: str, volumes: str,
              agent: Agent | None) -> ForkResult:
        core, hold = self.core, self.hold
        source = core.usable(checkpoint_id)
        if agent is not None and source.container is not None:
            raise PermissionDenied("a checkpoint with a container layer is forked by the"
                                   f" daemon's owner, not by an allowed user ({agent})")
        if agent is not None and not workspace:
            raise PermissionDenied(f"an allowed user ({agent}) forks into a folder of its"
                                   " own: give the fork's workspace")
        parent = core.store.get_session(source.session_id)
        check_text("name", name)
        if volumes not in ("", "share", "empty"):
            raise InvalidArgument(f"--volumes is share or empty, not {volumes!r}")
        if source.container is not None:
            spec = hold.container_spec(parent)
            foreign = extra_mounts(spec, parent.workspace)
            if foreign and not volumes:
                raise FailedPrecondition(
                    f"the container of session {parent.id} mounts {', '.join(foreign)}"
                    " besides the workspace: they are not part of the world; fork with"
                    " --volumes share (mount them as they are) or --volumes empty (fresh"
                    " empty volumes)")
        sid = ids.new_id()
        path = self.sessions.check_workspace(workspace or os.path.join(core.fork_root, sid),
                                             must_be_empty=True, agent=agent)
        if agent is not None:
            owners.check_folder(agent, os.path.dirname(path), "the folder above")
            owners.check_entries(core.trees, None, source.tree, agent,
                                 doing="nothing was forked")
        checked = existing_identity(path)
        crash_point("fork.checked")
        try:  # made and opened through no symlink; every write below checks it is still it
            fd, created = make_folder(path)
        except OSError as exc:
            raise symlink_refused(WORKSPACE, path, exc) from None
        roots = {WORKSPACE: identity_of(fd)}
        if not created and roots[WORKSPACE] != checked:  # another folder put there since
            raise FailedPrecondition(f"{path} changed while the fork was made (a folder was"
                                     " put there): nothing was forked")
        container = None
        try:
            if source.container is not None:
                container = self._fork_container(parent, sid, path, volumes)
            spec = SessionSpec(roots=roots, exclude=SessionSpec.parse(parent.spec).exclude
                               or None, agent=[agent.uid, agent.gid] if agent else None)
            session = Session(sid, name or self._fork_name(parent.name), path, container, "",
                              source.id, ids.now(), host=core.host,
                              lease_expires=core.lease(), spec=spec.to_json())
            with core.lock(path):
                layers = core.layers(session)
                mounted = (core.views is not None and core.views.enabled
                           and self._mount_fork(sid, path, source.tree, source.bytes))
                for layer, want in zip(layers, bases(source), strict=False):
                    if layer.kind == WORKSPACE and mounted:
                        continue  # nothing watched yet: the first checkpoint scans it
                    if layer.tracker is not None:
                        layer.tracker.prepare()  # we know what we write: no scan needed
                    # The fork's workspace was checked empty; a new container's layer
                    # already holds the mount points the engine made: look, never assume.
                    current = (Capture(core.empty_tree, 0) if layer.kind == WORKSPACE
                               else layer.snap.capture(persist=False))
                    progress.begin(f"fork: {layer.kind}",
                                   source.bytes if layer.kind == WORKSPACE else 0)
                    layer.snap.apply(current, want, watch_new=True)
                crash_point("fork.mid")  # the workspace made, the fork not yet recorded
                first = Checkpoint(ids.new_id(), sid, 0, source.id, "fork", ids.now(),
                                   source.tree, source.bytes, source.state_digest,
                                   source.tasks_digest, source.id, 0, source.message_count,
                                   label=f"fork of {source.id}", container=source.container,
                                   resume=source.resume)
                session = replace(session, head=first.id, spec=core.recorded_spec(
                    session, layers,
                    core.require_engine().creation_spec(container) if container else None))
                tasks = tasks_from_json(core.blobs.read_bytes(source.tasks_digest))
                core.store.create_session(session, first, tasks, [
                    AuditEvent("fork", sid, first.id, {"source": source.id, "workspace": path,
                                                        "container": container}, ids.now())])
                for layer, want in zip(layers, bases(source), strict=False):
                    if not (layer.kind == WORKSPACE and mounted):
                        layer.now_equals(want)
            if container:
                hold.start(container, path)
        except BaseException:
            if container:
                core.require_engine().remove(container)
            if core.views is not None and os.path.ismount(path):
                core.views.unmount(path)
                shutil.rmtree(os.path.join(core.views.forks, sid), ignore_errors=True)
            if created:
                remove_folder(path, roots[WORKSPACE])
            raise
        effects = side_effects_since(core.store, parent.head, source.id)
        return ForkResult(core.store.get_session(sid), effects)

    def _fork_name(self, base: str) -> str:
        """``BASE-fork-N``, N the first number no session's name has taken."""
        taken = {s.name for s in self.core.store.list_sessions()}
        n = 1
        while f"{base}-fork-{n}" in taken:
            n += 1
        return f"{base}-fork-{n}"

    def _mount_fork(self, sid: str, path: str, tree: str, size: int) -> bool:
        """Mount the fork's workspace as an overlay; False (then it is copied) if refused."""
        views = self.core.views
        try:
            views.mount_fork(sid, path, tree, size)
            return True
        except OSError as exc:
            log.warning("fork %s: overlay mount refused (%s); copying instead", sid, exc)
            shutil.rmtree(os.path.join(views.forks, sid), ignore_errors=True)
            return False

    def _fork_container(self, parent: Session, sid: str, workspace: str, volumes: str) -> str:
        engine = self.core.require_engine()
        spec = self.hold.container_spec(parent)
        base = parent.container or f"worldline-{parent.id.lower()}"
        name = f"{base}-fork-{sid[-8:].lower()}"
        engine.create_from_spec(spec, name, parent.workspace, workspace,
                                self.core.labels(sid), volumes)
        return name

    # -- a fork's overlay view, mounted again at start (views.py) -------------------------
    def origin(self, session_id: str) -> tuple[str, str] | None:
        """(workspace, tree it was forked from) of a recorded fork; None for a session
        that is not recorded here, or not a fork (views.py rebuilds a mount from it)."""
        store = self.core.store
        try:
            session = store.get_session(session_id)
            if not session.forked_from:
                return None
            return session.workspace, store.get_checkpoint(session.forked_from).tree
        except NotFound:
            return None

    def remounted(self, session_id: str, identity: list[int]) -> None:
        """A fork's overlay was mounted again at start (views.py): its workspace is the
        new mount's root, checked as the layer's identity from now on (a new mount has
        a new device number). A session this host does not hold is left as it is."""
        store = self.core.store
        try:
            session = store.get_session(session_id)
        except NotFound:
            return
        spec = SessionSpec.parse(session.spec)
        if session.host != self.core.host or spec.root(WORKSPACE) == identity:
            return
        roots = {**(spec.roots or {}), WORKSPACE: identity}
        store.update_session(session_id, spec=replace(spec, roots=roots).to_json())
