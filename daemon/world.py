"""The World: checkpoint, restore and fork a session's whole world at once.

A session's world is its conversation, agent state, task list and layers: the
workspace and, when it has one, its container's writable layer (``layers.py``).
The World coordinates the snapshotters, the blob store, the metadata store and the
container engine; it never talks gRPC. Every operation on a session holds its
workspace's lock, so a capture never races a restore. History only grows: restore
and fork append a checkpoint and never rewrite one.
"""

from __future__ import annotations

import contextlib
import difflib
import errno
import json
import logging
import os
import shutil
import stat
import threading
import time
import weakref
from dataclasses import dataclass, field, replace
from typing import Iterator, NoReturn

from worldline.client.errors import (
    Aborted,
    AlreadyExists,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    WorldlineError,
)
from worldline.client.paths import escape

from . import history, ids, owners, progress
from .capture import chunks, mappings
from .capture.admission import FairGate
from .capture.apply import CHANGED
from .capture.containers import (
    DEFAULT_MOUNT,
    LABEL_CHECKPOINT,
    LABEL_MANAGED,
    LABEL_ROOT,
    LABEL_SESSION,
    Engine,
    bind_identity_of,
    extra_mounts,
)
from .capture.exclude import check_patterns, covers, key_in, patterns_of
from .capture.layers import CONTAINER, WORKSPACE, Layer, RestoreJournal
from .capture.limits import Limits
from .capture.resolve import identity_of, make_folder, open_folder
from .capture.snapshot import Capture, WorkspaceSnapshotter
from .capture.tracker import ChangeMonitor
from .capture.trees import (
    BLOCK,
    CHAR,
    EMPTY_TREE,
    FILE,
    MAPPED,
    SOCKET,
    Diff,
    Entry,
    TreeReader,
    diff,
    entry_at,
    entry_key,
)
from .capture.views import Views
from .faults import crash_point
from .in_use import InUse
from .observe import ADMISSION_TURN, ADMISSION_TURN_CPU, ADMISSION_WAIT
from .owners import Agent
from .records import (
    AuditEvent,
    Checkpoint,
    Session,
    Task,
    ToolCall,
    tasks_from_json,
    tasks_to_json,
)
from .root_id import root_id
from .storage.blobs import BlobStore, digest_of
from .storage.durable import out_of_space
from .storage.sqlite_store import flushes_deferred
from .storage.statcache import StatCache
from .storage.store import Store, calls_on_path, with_gates
from .validate import (
    EMPTY_STATE,
    check_id,
    check_text,
    check_warnings,
    parse_messages,
    parse_resume,
    parse_state,
)

log = logging.getLogger(__name__)

# How a session of a copied data root says why it waits (needs_attention): the
# original's world, until an operator resolves it here (_leave_to_the_original).
_COPIED = "this data root is a copy of the one at"

# The label of the checkpoint a restore takes of the world just before it changes it,
# when the world differs from the head (World._checkpoint_before).
BEFORE_RESTORE = "before restore"

# Seconds an incremental capture keeps its turn at the admission gate; a longer one (a
# file of gigabytes) goes on beside the next, which would otherwise wait for all of it.
# The eight-session load's captures hold it 4 ms (p99 10 ms).
TURN_SECONDS = 0.25


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


@dataclass
class LayerPlan:
    """What a restore will do to one layer (``World._plan``)."""

    layer: Layer
    current: Capture
    seen: object  # the tracker's changes the capture looked at (None without a tracker)
    want: str
    changes: Diff
    size: int
    unsaved: str = ""  # why ``current`` was not stored (a persisting plan: a limit)
    size_after: int | None = None  # a restore of some paths: the bytes of ``want``

    def journal(self) -> dict:
        """Each path to change, as it is and as it will be (entry_key), for the journal."""
        paths = {}
        trees = self.layer.snap.trees
        for path in self.changes.added + self.changes.modified + self.changes.deleted:
            paths[path] = [entry_key(entry_at(trees, self.current.root, path,
                                              self.current.trees)),
                           entry_key(entry_at(trees, self.want, path))]
        return {"kind": self.layer.kind, "path": self.layer.path, "paths": paths}


@dataclass
class ForkResult:
    session: Session
    side_effects: list[ToolCall] = field(default_factory=list)


@dataclass
class CheckpointView:
    checkpoint: Checkpoint
    messages: list
    state: dict
    tasks: list[Task]
    skipped: list[str] = field(default_factory=list)  # recorded, never recreated


class World:
    def __init__(self, root: str, store: Store, blobs: BlobStore, stat_cache: StatCache,
                 monitor: ChangeMonitor | None = None, engine: Engine | None = None,
                 views: Views | None = None, limits: Limits | None = None,
                 host: str = "", lease_seconds: float = 30.0) -> None:
        self.root = os.path.realpath(root)
        # The fleet (fleet.py): this daemon's host id ("" on a data root of one host)
        # and how long a lease it holds on its sessions lasts without renewal.
        self.host = host
        self.lease_seconds = lease_seconds
        self.limits = limits or Limits()
        # incremental captures take turns, a long one for its first TURN_SECONDS only
        self.admission = FairGate(1, patience=TURN_SECONDS)  # (admission.py)
        self.store = store
        self.blobs = blobs
        self.trees = TreeReader(blobs)
        self.stat_cache = stat_cache
        self.monitor = monitor
        self.engine = engine
        self.views = views
        self.fork_root = os.path.join(self.root, "workspaces")
        self.journal = RestoreJournal(os.path.join(self.root, "journal"))
        # restores' and forks' targets, kept from gc (in_use.py); on a fleet, from every
        # host's gc
        self.in_use = InUse(None if store.local else self._publish_holds,
                            also=self.journal.targets)
        # containers paused (Engine.frozen) or stopped (Engine.stop) while the daemon
        # reads or restores them, by session: what a killed daemon left so is undone at
        # its next start (recover)
        self.marks = {kind: os.path.join(self.root, kind) for kind in ("paused", "stopped")}
        for folder in self.marks.values():
            os.makedirs(folder, mode=0o700, exist_ok=True)
        self.root_id, self.copy_of = root_id(self.root)
        # A workspace's lock lives while a call holds or waits for it: a daemon that
        # serves thousands of forks over months keeps none of their locks.
        self._locks: weakref.WeakValueDictionary[str, threading.Lock] = (
            weakref.WeakValueDictionary())
        # Session id -> workspace as last read, and -> its last checkpoint made here:
        # dropped when the session is deleted or handed to another host.
        self._workspace_of: dict[str, str] = {}
        self._heads: dict[str, Checkpoint] = {}
        # Session id -> warnings its next checkpoint carries (warn_next_checkpoint)
        self._warnings: dict[str, list[str]] = {}
        self._locks_guard = threading.Lock()
        self.empty_tree = blobs.put_bytes(EMPTY_TREE)
        self.empty_state = blobs.put_bytes(EMPTY_STATE)
        blobs.sync()

    # -- helpers -------------------------------------------------------------------------
    def lock(self, workspace: str) -> threading.Lock:
        with self._locks_guard:
            lock = self._locks.get(workspace)
            if lock is None:
                lock = self._locks[workspace] = threading.Lock()
            return lock

    def session(self, session_id: str) -> Session:
        return self.store.get_session(check_id("session", session_id))

    def exclusions(self, session: Session) -> tuple[list[str], list[str]]:
        """What the session excludes (exclude.py): its own patterns, and those of the
        .worldlineignore its head checkpoint holds (as the next capture reads it, unless
        the agent changed it since)."""
        mine = _exclude_of(session).get("exclude", [])
        try:
            key = key_in(self.trees, self.store.get_checkpoint(session.head).tree)
            text = self.blobs.read_bytes(key) if key is not None else b""
        except WorldlineError as exc:  # a blob unreadable: the rest is still shown
            log.warning("session %s: its .worldlineignore is not readable: %s", session.id,
                        exc.message)
            text = b""
        return mine, patterns_of(text.decode("utf-8", "surrogateescape"))

    def sessions(self, include_deleted: bool = False, workspace: str = "") -> list[Session]:
        """Sessions, deleted ones only when asked; with ``workspace`` (an absolute path),
        only the live session whose workspace is that folder or holds it."""
        if workspace and not os.path.isabs(workspace):
            raise InvalidArgument(f"workspace {workspace!r} must be an absolute path")
        found = [s for s in self.store.list_sessions() if include_deleted or not s.deleted_at]
        if workspace:
            real = os.path.realpath(workspace)
            found = [s for s in found if _contains(s.workspace, real)
                     or _contains(s.workspace, workspace)]
        return found

    def checkpoint_record(self, checkpoint_id: str) -> Checkpoint:
        return self.store.get_checkpoint(check_id("checkpoint", checkpoint_id))

    def usable(self, checkpoint_id: str) -> Checkpoint:
        """A checkpoint whose world can still be brought back (not pruned by retention)."""
        cp = self.checkpoint_record(checkpoint_id)
        if cp.pruned:
            raise FailedPrecondition(f"checkpoint {cp.id} was pruned by retention: its"
                                     " conversation and state remain, its files do not")
        return cp

    @contextlib.contextmanager
    def _session_locked(self, session_id: str, expected_head: str = ""
                        ) -> Iterator[tuple[Session, list[Task]]]:
        """The session and its task list, read again (together: one round trip on a
        fleet's store) under its workspace's lock, after any restore a failure left
        half-done was completed; ABORTED when its head is not ``expected_head``."""
        if expected_head:
            check_id("checkpoint", expected_head)
        check_id("session", session_id)
        # The lock is the workspace's: known from the last call (a read less on the hot
        # path), checked under the lock, and looked up again if a take-over moved it.
        workspace = self._workspace_of.get(session_id) or self.session(session_id).workspace
        lock = self.lock(workspace)
        lock.acquire()
        try:
            session, tasks = self._pending_restore(session_id)
            if session.workspace != workspace:
                lock.release()
                lock = self.lock(session.workspace)
                lock.acquire()
                session, tasks = self._pending_restore(session_id)
            self._workspace_of[session_id] = session.workspace
            if session.deleted_at:
                raise FailedPrecondition(f"session {session_id} was deleted at"
                                         f" {session.deleted_at}: its history can be read,"
                                         " diffed and forked, not changed")
            self.check_held(session)
            if expected_head and expected_head != session.head:
                raise Aborted(f"session {session_id} head is {session.head}, not {expected_head}")
            yield session, tasks
        finally:
            lock.release()

    def held_here(self, session: Session) -> bool:
        """Whether this host holds the session (a session of a one-host data root, with
        no host, is held by whichever daemon serves that root)."""
        return session.host in ("", self.host) and not (
            session.released_to and session.host == self.host and self.host)

    def check_held(self, session: Session) -> None:
        """FAILED_PRECONDITION naming the holder unless this host holds the session: its
        workspace and container are on that host, and only it changes them."""
        if self.held_here(session):
            return
        if session.host == self.host:
            raise FailedPrecondition(
                f"session {session.id} was released to {session.released_to} by this host:"
                f" take it over there (`worldline session move {session.id} --take-over`)")
        address = self.store.host_address(session.host)
        raise FailedPrecondition(
            f"session {session.id} is held by host {session.host}"
            f"{f' at {address}' if address else ''} (lease until"
            f" {_clock(session.lease_expires)}): send its checkpoints, restores and tool"
            f" calls there, or take it over here once that host is gone or has released it"
            f" (`worldline session move {session.id} --take-over`)")

    def _publish_holds(self, held: set[str]) -> None:
        """This host's holds in the fleet's store, for one lease (in_use.py)."""
        now = time.time()
        self.store.publish_holds(self.host, held, now + self.lease_seconds, now)

    def _lease(self) -> float:
        return time.time() + self.lease_seconds if self.host else 0.0

    def _engine(self) -> Engine:
        if self.engine is None:
            raise FailedPrecondition("this daemon runs without a Docker engine")
        return self.engine

    def _layer(self, kind: str, path: str, identity: list | None = None,
               track: bool = True, merged: str | None = None,
               exclude: list[str] | None = None) -> Layer:
        tracker = self.monitor.tracker(path) if self.monitor is not None and track else None
        if tracker is not None and merged is not None:
            tracker.mirror_at(merged)  # overlayfs names some changes only there (mirror.py)
        snap = WorkspaceSnapshotter(path, self.blobs, self.trees, self.stat_cache, tracker,
                                    overlay=kind == CONTAINER, limits=self.limits,
                                    data_root=self.root)
        snap.opener = lambda: open_layer_root(kind, path, identity)
        if kind == WORKSPACE:  # exclusions (exclude.py): the workspace's only
            snap.exclude = tuple(exclude or ())
        return Layer(kind, path, snap, tracker)

    def layers(self, session: Session) -> list[Layer]:
        """The session's layers: its workspace, then its container's writable layer. Each
        root is opened only if it is still the folder the session was created on (the
        identity recorded in its spec), so a moved folder or a parent swapped for a
        symlink is refused, never followed."""
        spec = json.loads(session.spec or "{}")
        roots = spec.get("roots", {})
        out = [self._layer(WORKSPACE, session.workspace, roots.get(WORKSPACE),
                           exclude=spec.get("exclude"))]
        if owners.agent_of(session.spec) is not None:  # the owner's reserve is not its
            out[0].snap.limits = replace(self.limits, owner_reserve=self.limits.min_free_bytes)
        if session.container:
            upper, merged = self._engine().layer_dirs(session.container)
            out.append(self._layer(CONTAINER, upper, roots.get(CONTAINER), merged=merged))
        return out

    def _spec(self, session: Session, layers: list[Layer], container_spec=None) -> str:
        """The session's spec: each layer root's identity, the container's creation spec."""
        spec = json.loads(session.spec or "{}")
        spec["roots"] = {layer.kind: _root_identity(layer) for layer in layers}
        if container_spec is not None:
            spec["container"] = container_spec
            spec["workspace"] = session.workspace  # the folder its bind mounts refer to
        return json.dumps(spec, sort_keys=True)

    def _container_gone(self, session: Session) -> bool:
        """Whether the session's container was removed behind worldline's back."""
        return bool(session.container) and not self._engine().exists(session.container)

    def _revive(self, session: Session) -> bool:
        """Make a removed container again, identically, from the spec recorded with the
        session (its name, configuration and mounts); its layer is then restored like
        any other. Returns whether it had to."""
        if not self._container_gone(session):
            return False
        spec = json.loads(session.spec or "{}").get("container")
        if not spec:
            raise FailedPrecondition(
                f"container {session.container} of session {session.id} is gone, and the"
                " session (made before 0.4) has no recorded spec to make it again")
        self._engine().create_from_spec(spec, session.container, session.workspace,
                                        session.workspace, self._labels(session.id),
                                        volumes="share")
        layers = self.layers(replace(session, spec="{}"))
        self.store.update_session(session.id, spec=self._spec(session, layers))
        self.store.append_audit([AuditEvent("container.recreate", session.id,
                                            session.container, {}, ids.now())])
        return True

    @contextlib.contextmanager
    def _paused(self, session: Session) -> Iterator[dict[str, frozenset[str]]]:
        """The container paused (if it runs) while its world is read. Callers that go on
        without a removed container pass the session without it (checkpoint, dry run).
        Yields, by layer kind, the files its processes map shared and writable
        (mappings.py): a capture reads them whatever their stat says."""
        if not session.container:
            yield {}
            return
        roots = json.loads(session.spec or "{}").get("roots", {})
        want = roots.get(WORKSPACE)
        with self._engine().frozen(session.container,
                                   mark=self._mark("paused", session.id)) as attrs:
            crash_point("capture.paused")
            if not _shows_another(want, bind_identity_of(attrs, session.workspace)):
                yield self._mapped(session, attrs, roots)
                return
        # Started by someone else (a restart policy, `docker restart`) after a folder
        # above the workspace was swapped for a symlink: it holds another folder there.
        self._stop_bound_elsewhere(session.container, session.workspace)

    def _mapped(self, session: Session, attrs: dict, roots: dict
                ) -> dict[str, frozenset[str]]:
        """``roots``: the layers' identities recorded in the session's spec."""
        try:
            dev = (roots[WORKSPACE][0] if WORKSPACE in roots
                   else os.stat(session.workspace).st_dev)
            work, box = mappings.of_container(attrs, session.workspace, dev)
        except OSError as exc:  # /proc unreadable: the captures go on as before 0.7.21
            log.warning("session %s: the container's mapped files could not be read: %s",
                        session.id, exc)
            return {}
        return {WORKSPACE: work, CONTAINER: box}

    @staticmethod
    def _bases(cp: Checkpoint) -> list[str | None]:
        return [cp.tree, cp.container]

    def _check_workspace(self, path: str, *, must_be_empty: bool, moving: str = "",
                         agent: Agent | None = None) -> str:
        """The real path of ``path``, a folder a session may have; ``moving``: the session
        that is to move there (its own workspace, the folder of a take-over it left
        unfinished, is no overlap). ``agent``: an allowed user asks, who is told that
        the folder is not available, never whose it is or where the daemon's are."""
        if not path or not os.path.isabs(path):
            raise InvalidArgument(f"workspace {path!r} must be an absolute path")
        if os.path.lexists(path) and not os.path.isdir(path):
            raise InvalidArgument(f"workspace {path} is not a folder")
        if os.path.islink(path):
            raise InvalidArgument(f"workspace {path} is a symlink; give the folder itself")
        real = os.path.realpath(path)
        if real == "/":
            raise InvalidArgument("the file system root cannot be a workspace")
        inside_forks = real.startswith(self.fork_root + os.sep)
        if not inside_forks and (_contains(real, self.root) or _contains(self.root, real)):
            if agent is not None:
                raise InvalidArgument(_not_available(path, agent))
            raise InvalidArgument(f"workspace {real} overlaps the data root {self.root}")
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
        for other in self.store.list_sessions():
            if other.deleted_at or other.host not in ("", self.host) or other.id == moving:
                continue  # its workspace was released, or is another host's folder
            if _contains(other.workspace, real) or _contains(real, other.workspace):
                if agent is not None and not owners.made_by(other.spec, agent):
                    raise FailedPrecondition(_not_available(given or real, agent))
                if other.workspace == real:
                    raise AlreadyExists(f"workspace {real} is already the workspace of"
                                        f" session {other.id}")
                raise FailedPrecondition(
                    f"workspace {real} overlaps the workspace {other.workspace} of session"
                    f" {other.id}")
        engine_root = self.engine.data_root() if self.engine is not None else None
        if engine_root and (_contains(real, engine_root) or _contains(engine_root, real)):
            if agent is not None:
                raise InvalidArgument(_not_available(given or real, agent))
            raise InvalidArgument(f"workspace {real} overlaps the Docker engine's data root"
                                  f" {engine_root}")

    # -- sessions ------------------------------------------------------------------------
    def create_session(self, workspace: str, container: str | None = None, name: str = "",
                       image: str = "", mount: str = "", *, session_id: str = "",
                       agent: Agent | None = None, exclude=()) -> Session:
        """``agent``: the allowed user (owners.py) whose session it is, over a folder of
        its own; None: the daemon owner's. ``exclude``: gitignore patterns of workspace
        paths never captured nor restored (exclude.py), kept in the session's spec."""
        exclude = check_patterns(exclude)
        path = self._check_workspace(workspace, must_be_empty=False, agent=agent)
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
            engine = self._engine()
            created_container = container_name = f"worldline-{sid.lower()}"
            engine.create_from_image(image, container_name, path, mount or DEFAULT_MOUNT,
                                     self._labels(sid))
            try:
                self._start_container(container_name, path)
            except BaseException:
                engine.remove(container_name)
                raise
        elif container:
            container_name = self._engine().inspect(container)["Name"].lstrip("/")
        else:
            container_name = None
        container_spec = (self._engine().creation_spec(container_name) if container_name
                          else None)
        session = Session(sid, name or os.path.basename(path), path, container_name, "", None,
                          ids.now(), host=self.host, lease_expires=self._lease(),
                          spec=owners.with_agent(json.dumps(
                              {"roots": roots} | ({"exclude": exclude} if exclude else {})),
                              agent))
        try:
            with self.lock(path):
                layers = self.layers(session)
                with self._paused(session) as mapped:
                    captures = [layer.capture(None, mapped=mapped)[0] for layer in layers]
                if agent is not None:
                    owners.check_entries(self.trees, None, captures[0].root, agent)
                tasks_digest = self.blobs.put_bytes(tasks_to_json([]))
                self.blobs.sync()
                first = Checkpoint(ids.new_id(), sid, 0, None, "initial", ids.now(),
                                   captures[0].root, captures[0].bytes, self.empty_state,
                                   tasks_digest, None, 0, 0, label="session created",
                                   container=captures[1].root if len(captures) > 1 else None)
                session = replace(session, head=first.id,
                                  spec=self._spec(session, layers, container_spec))
                self.store.create_session(session, first, [], [
                    AuditEvent("session.create", sid, sid,
                               {"workspace": path, "container": container_name}
                               | ({"agent_uid": agent.uid} if agent else {}), ids.now()),
                    AuditEvent("checkpoint", sid, first.id, {"seq": 0, "tree": first.tree},
                               ids.now())])
                for layer, capture in zip(layers, captures, strict=True):
                    layer.committed(capture)
        except BaseException:
            if created_container:
                self._engine().remove(created_container)
            raise
        return self.store.get_session(sid)

    def delete_session(self, session_id: str, keep_container: bool = False) -> Session:
        """Release a session's workspace and container: its history (checkpoints,
        conversation, tool calls, approvals, audit) is kept and can still be read, diffed
        and forked, and the folder may become another session's. Its container is
        stopped (unless ``keep_container``), never removed; a fork's overlay view is
        unmounted and not mounted again at a start (its upper layer, what the fork
        wrote, stays under the data root). No file is changed. (Gates.delete_session,
        which the servicer calls, also withdraws the session's pending approvals.)"""
        with self._session_locked(session_id) as (session, _):
            if self.monitor is not None:
                self.monitor.release(session.workspace)
            self.store.update_session(session_id, deleted_at=ids.now())
            self.store.append_audit([AuditEvent(
                "session.delete", session_id, session_id,
                {"workspace": session.workspace, "container": session.container,
                 "container_kept": bool(session.container and keep_container)}, ids.now())])
            self.forget(session_id)
            if self.views is not None and session.forked_from:
                self.views.release(session_id, session.workspace)
            if session.container and not keep_container and self.engine is not None:
                try:
                    self.engine.stop(session.container, timeout=5)
                except NotFound:
                    pass  # removed already
                except WorldlineError as exc:  # the engine away: said, the delete stands
                    log.warning("session %s deleted, but its container %s was not stopped:"
                                " %s", session_id, session.container, exc)
        return self.session(session_id)

    def forget(self, session_id: str) -> None:
        """Drop what this process remembers of a session it no longer serves (deleted,
        or handed to another host): the next call reads the session again."""
        self._heads.pop(session_id, None)
        self._workspace_of.pop(session_id, None)
        with self._locks_guard:
            self._warnings.pop(session_id, None)

    def create_session_in_own_folder(self, name: str) -> Session:
        """A session whose workspace is a new empty folder under the data root (named by
        the session id, so a crash before it is recorded leaves nothing recovery keeps)."""
        sid = ids.new_id()
        path = os.path.join(self.fork_root, sid)
        os.makedirs(path, mode=0o755)
        try:
            return self.create_session(path, name=name, session_id=sid)
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise

    # -- checkpoints ---------------------------------------------------------------------
    def warn_next_checkpoint(self, session_id: str, text: str) -> None:
        """A warning the session's next checkpoint carries (its ``warnings``, beside the
        caller's): what the daemon saw happen between checkpoints, e.g. a gated call that
        ran anyway. Held in this daemon's memory until that checkpoint is committed."""
        check_warnings([text])
        with self._locks_guard:
            self._warnings.setdefault(session_id, []).append(text)

    def _queued_warnings(self, session_id: str, given: tuple[str, ...] = ()
                         ) -> tuple[str, ...]:
        """The daemon's warnings for the session's next checkpoint, taken (after the
        caller's ``given``); given back by ``_requeue_warnings`` when it fails."""
        with self._locks_guard:
            return given + tuple(self._warnings.pop(session_id, ()))

    def _requeue_warnings(self, session_id: str, taken: tuple[str, ...],
                          given: tuple[str, ...]) -> None:
        mine = list(taken[len(given):])
        if mine:
            with self._locks_guard:
                self._warnings[session_id] = mine + self._warnings.get(session_id, [])

    def checkpoint(self, session_id: str, *, label: str = "", reasoning: str = "",
                   trace_id: str = "", messages_json: str = "", state_json: str = "",
                   expected_head: str = "", resume_json: str = "",
                   warnings: tuple[str, ...] | list[str] = ()) -> Checkpoint:
        """``warnings``: what the caller knows this checkpoint lacks (a transcript it
        could not read); the daemon's queued ones (warn_next_checkpoint) follow them."""
        warnings = check_warnings(warnings)
        messages = parse_messages(messages_json)
        state = parse_state(state_json)
        resume = parse_resume(resume_json)
        for what, text in (("label", label), ("reasoning", reasoning), ("trace id", trace_id)):
            check_text(what, text)
        with self._session_locked(session_id, expected_head) as (session, tasks):
            head = self._heads.get(session_id)
            if head is None or head.id != session.head:  # another call or host moved it
                head = self.store.get_checkpoint(session.head)
            if self._container_gone(session):
                # The workspace goes on being checkpointed; the container layer last
                # captured is carried forward, so a restore or fork can make it again.
                session = replace(session, container=None)
                log.warning("session %s: container gone; checkpointing the workspace and"
                            " carrying its last layer forward", session.id)
            layers = self.layers(session)
            all_warnings = self._queued_warnings(session_id, warnings)
            try:
                return self._checkpoint(session, head, layers, messages, state, tasks, label,
                                        reasoning, trace_id, resume, all_warnings)
            except BaseException:
                self._requeue_warnings(session_id, all_warnings, warnings)
                raise

    @contextlib.contextmanager
    def _admitted(self, layers: list[Layer], head: Checkpoint) -> Iterator[None]:
        """Incremental captures take turns (admission.py), and a local commit's Python
        work with them; its fsync overlaps the next capture. A full scan, which spends
        its time in system calls outside the interpreter lock, is not made to wait, nor
        makes the others wait behind it."""
        if any(layer.scans_everything(base)
               for layer, base in zip(layers, self._bases(head), strict=False)):
            yield
            return
        asked = time.perf_counter()
        with self.admission.admitted():
            began, cpu = time.perf_counter(), time.thread_time()
            ADMISSION_WAIT.observe(began - asked)
            try:
                crash_point("checkpoint.admitted")  # a long capture, held open by tests
                yield
            finally:
                ADMISSION_TURN_CPU.inc(time.thread_time() - cpu)
                ADMISSION_TURN.observe(time.perf_counter() - began)

    def _checkpoint(self, session: Session, head: Checkpoint, layers: list[Layer],
                    messages: list, state: bytes | None, task_list: list[Task], label: str,
                    reasoning: str, trace_id: str, resume: str | None = None,
                    warnings: tuple[str, ...] = ()) -> Checkpoint:
        """``task_list``: the session's, read with it under the lock (a change to it
        racing this checkpoint lands in this one or the next, as with the files).

        A commit that writes only this host's disk (the embedded store and blobs) is
        Python work but for its fsync: it runs in the capture's turn (_admitted), and
        its fsync after the turn, beside the next capture. Until 0.7.9 commits ran
        beside the next capture and took the interpreter lock from it at each of its
        system calls: the eight-session load, the two alternated 8 times, used 4.1 ms
        of daemon CPU a checkpoint (median) against 4.7, less in 7 pairs of 8 (README,
        throughput). A fleet's commit waits on the network (a PUT, PostgreSQL's round
        trips): never in the turn."""
        taken: list[tuple[Layer, Capture, object]] = []
        try:
            if self.store.local and self.blobs.local:
                with flushes_deferred() as flush, self._admitted(layers, head):
                    captured = self._capture(session, head, layers, taken, state,
                                             task_list)
                    cp = self._commit(session, head, captured, messages, label, reasoning,
                                      trace_id, resume, warnings)
                crash_point("checkpoint.before_flush")
                flush()
            else:
                with self._admitted(layers, head):
                    captured = self._capture(session, head, layers, taken, state,
                                             task_list)
                cp = self._commit(session, head, captured, messages, label, reasoning,
                                  trace_id, resume, warnings)
        except BaseException:
            for layer, _, changes in taken:
                layer.give_back(changes)
            raise
        crash_point("checkpoint.after_commit")
        self._heads[session.id] = cp  # the next checkpoint starts from it (what it reads
        # of a record, its trees and digests, never changes)
        for layer, capture, _ in taken:
            layer.committed(capture)
            for warning in capture.warnings:
                log.warning("session %s %s: %s", session.id, layer.kind, warning)
        return cp

    def _capture(self, session: Session, head: Checkpoint, layers: list[Layer],
                 taken: list, state: bytes | None, task_list: list[Task]
                 ) -> tuple[list[Capture], str, str]:
        """Capture each layer (appending to ``taken`` what a failure gives back) and put
        the state and task list: (captures, state digest, tasks digest)."""
        with self._paused(session) as mapped:
            for layer, base in zip(layers, self._bases(head), strict=False):
                capture, changes = layer.capture(base, mapped=mapped)
                taken.append((layer, capture, changes))
        agent = owners.agent_of(session.spec)
        if agent is not None:  # its own files only (owners.py)
            owners.check_entries(self.trees, head.tree, taken[0][1].root, agent)
        state_digest = (self.blobs.put_bytes(state, base=head.state_digest)
                        if state is not None else head.state_digest)
        tasks = tasks_to_json(task_list)
        # Unchanged since the head (the usual case): its blob is the head's, kept as the
        # state's is, with no put (a question to the pack) for it.
        tasks_digest = (head.tasks_digest if digest_of(tasks) == head.tasks_digest
                        else self.blobs.put_bytes(tasks, base=head.tasks_digest))
        return [c for _, c, _ in taken], state_digest, tasks_digest

    def _commit(self, session: Session, head: Checkpoint,
                captured: tuple[list[Capture], str, str], messages: list, label: str,
                reasoning: str, trace_id: str, resume: str | None,
                warnings: tuple[str, ...] = ()) -> Checkpoint:
        captures, state_digest, tasks_digest = captured
        with self.blobs.committing() as objects:  # the bucket's, indexed in the commit
            crash_point("checkpoint.after_blobs")
            cp = Checkpoint(ids.new_id(), session.id, 0, head.id, "checkpoint", ids.now(),
                            captures[0].root, captures[0].bytes, state_digest, tasks_digest,
                            head.id, len(messages), head.message_count + len(messages),
                            label=label, reasoning=reasoning, trace_id=trace_id,
                            container=captures[1].root if len(captures) > 1
                            else head.container,  # a container gone: its last layer
                            resume=head.resume if resume is None else resume,
                            warnings=warnings)
            return self.store.append_checkpoint(cp, messages, head.id, None, [
                AuditEvent("checkpoint", session.id, cp.id,
                           _checkpoint_detail(cp, label, len(messages)), ids.now())],
                objects)

    def view(self, checkpoint_id: str) -> CheckpointView:
        cp = self.checkpoint_record(checkpoint_id)
        messages = [json.loads(m) for m in self.store.conversation(cp.id)]
        state = json.loads(self.blobs.read_bytes(cp.state_digest))
        tasks = tasks_from_json(self.blobs.read_bytes(cp.tasks_digest))
        skipped = []
        if not cp.pruned:
            skipped = self._skipped(cp.tree, WORKSPACE) + (
                [f"container:{p}" for p in self._skipped(cp.container, CONTAINER)]
                if cp.container else [])
        return CheckpointView(cp, messages, state, tasks, skipped)

    def _skipped(self, root: str, kind: str) -> list[str]:
        """Entries a restore does not recreate: sockets; device nodes outside a container."""
        never = (SOCKET,) if kind == CONTAINER else (SOCKET, CHAR, BLOCK)
        return [path for path, e in self.trees.walk(root) if e.kind in never]

    # -- side effects --------------------------------------------------------------------
    def side_effects_since(self, head_id: str, target_id: str) -> list[ToolCall]:
        """Non-idempotent tool calls recorded after ``target_id`` on the way to
        ``head_id``, and gate bypasses (gated calls that ran without an approval)."""
        calls = with_gates(self.store, calls_on_path(self.store, head_id, since=target_id))
        return [c for c in calls if c.effect == "external_non_idempotent" or c.gate]

    # -- restore -------------------------------------------------------------------------
    def restore(self, session_id: str, checkpoint_id: str, *, acknowledge: bool = False,
                dry_run: bool = False, expected_head: str = "",
                from_other_session: bool = False, paths: list[str] | None = None
                ) -> RestoreResult:
        """``paths``: only those workspace paths (history.Graft), the rest of the world,
        the conversation and the tasks as they are; no side effect is passed."""
        paths = sorted({history.check_path(p) for p in paths or ()})
        with self.in_use.holding(checkpoint_id):  # kept from gc until it is committed
            return self._restore(session_id, checkpoint_id, acknowledge, dry_run,
                                 expected_head, from_other_session, paths)

    def _restore(self, session_id: str, checkpoint_id: str, acknowledge: bool,
                 dry_run: bool, expected_head: str, from_other_session: bool,
                 paths: list[str]) -> RestoreResult:
        target = self.usable(checkpoint_id)
        with self._session_locked(session_id, expected_head) as (session, tasks_now):
            self._check_lineage(session, target, from_other_session)
            if session.container and target.container is None:
                raise FailedPrecondition(f"checkpoint {target.id} has no container layer to"
                                         f" restore into container {session.container}")
            effects = [] if paths else self.side_effects_since(session.head, target.id)
            head = self.store.get_checkpoint(session.head)
            if dry_run:
                shown = replace(session, container=None) if self._container_gone(
                    session) else session
                processes = self._processes(shown)
                with self._paused(shown) as mapped:
                    plans = self._plan(shown, head, target, mapped, paths=paths)
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
            entry = {"session": session_id, "target": target.id, "head": session.head,
                     "checkpoint": cp.__dict__ | {"acknowledged": list(cp.acknowledged)}}
            revived = self._revive(session)
            if revived:
                session = self.session(session_id)
            processes = [] if revived else self._processes(session)
            kept: dict = {}

            def keep_the_world(plans: list[LayerPlan]) -> None:
                """Before anything changes: the world as it is, as a checkpoint."""
                kept["before"] = self._checkpoint_before(session, head, tasks_now, plans,
                                                         revived, entry)
                if paths:  # the tree made of the world and the paths, stored and durable
                    self.blobs.sync()
                    entry["checkpoint"].update(
                        tree=plans[0].want, bytes=plans[0].size_after,
                        container=plans[1].want if len(plans) > 1 else None,
                        tasks_digest=(kept["before"] or head).tasks_digest)

            try:
                plans, warnings = self._apply(session, head, target, entry, keep_the_world,
                                              paths)
            except (WorldlineError, OSError) as exc:
                raise self._restore_failed(session, target, exc) from exc
            before = kept.get("before")
            cp = replace(cp, **{k: entry["checkpoint"][k] for k in (
                "id", "parent_id", "created_at", "tree", "bytes", "container",
                "tasks_digest")})
            warnings += [f"the world before the restore was not checkpointed: {p.unsaved}"
                         for p in plans if p.unsaved]
            if revived:
                self._start_container(session.container, session.workspace)
                warnings.append(f"container {session.container} was gone: made again from"
                                " its recorded spec")
            crash_point("restore.before_commit")
            tasks = (None if paths
                     else tasks_from_json(self.blobs.read_bytes(target.tasks_digest)))
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
            cp = self.store.append_checkpoint(cp, [], entry["head"], tasks, events)
            self.journal.remove(session_id)
        return replace(self._result(cp, target, plans, effects, warnings), before=before,
                       not_checkpointed=self._not_checkpointed(
                           head, plans[:1] if revived else plans),  # a new layer: nothing
                       processes=processes)

    def _processes(self, session: Session) -> list[str]:
        """The processes a restore of the session stops: its container's, if it runs."""
        return self._engine().processes(session.container) if session.container else []

    def _not_checkpointed(self, head: Checkpoint, plans: list[LayerPlan]) -> list[str]:
        """The paths where the world differs from the head (a container's prefixed
        "container:"): what a restore would lose were it not checkpointed first."""
        out = []
        for plan, base in zip(plans, self._bases(head), strict=False):
            changes = diff(self.trees, base or self.empty_tree, plan.current.root,
                           plan.current.trees)
            prefix = "container:" if plan.layer.kind == CONTAINER else ""
            out += [prefix + p for p in sorted(changes.added + changes.modified
                                               + changes.deleted)]
        return out

    def _checkpoint_before(self, session: Session, head: Checkpoint, tasks: list[Task],
                           plans: list[LayerPlan], revived: bool, entry: dict
                           ) -> Checkpoint | None:
        """The world as the restore's plan captured it (stored: ``_plan(persist=True)``),
        committed as a checkpoint of its own (BEFORE_RESTORE) after the head, when it
        differs from the head, before the journal is written and anything changes; the
        journal's entry then follows it. A crash after it leaves it in the history, the
        world untouched. None when the world equals the head, or when a layer could not
        be stored (a limit: the restore says so in its warnings). A container made
        again (``revived``) carries the head's layer: its fresh one is nothing lost."""
        roots = [p.current.root for p in plans]
        if revived and len(roots) > 1:
            roots[1] = head.container
        tasks_json = tasks_to_json(tasks)
        bases = self._bases(head)[:len(roots)]
        if roots == bases and digest_of(tasks_json) == head.tasks_digest:
            return None
        if any(p.unsaved for p in plans):
            return None
        tasks_digest = (head.tasks_digest if digest_of(tasks_json) == head.tasks_digest
                        else self.blobs.put_bytes(tasks_json, base=head.tasks_digest))
        cp = Checkpoint(ids.new_id(), session.id, 0, head.id, "checkpoint", ids.now(),
                        roots[0], plans[0].current.bytes, head.state_digest, tasks_digest,
                        head.id, 0, head.message_count, label=BEFORE_RESTORE,
                        container=roots[1] if len(roots) > 1 else head.container,
                        resume=head.resume)
        with self.blobs.committing() as objects:
            cp = self.store.append_checkpoint(cp, [], head.id, None, [AuditEvent(
                "checkpoint", session.id, cp.id,
                _checkpoint_detail(cp, BEFORE_RESTORE, 0) | {"restore": entry["target"]},
                ids.now())], objects)
        self._heads[session.id] = cp
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
        reason = exc.message if isinstance(exc, WorldlineError) else f"{exc}"
        if self.journal.get(session.id) is None:
            return exc  # refused before it changed anything
        try:
            for layer in self.layers(session):
                if layer.tracker is not None:
                    layer.tracker.invalidate(f"a restore to {target.id} failed part-way")
        except WorldlineError as other:  # the journal stays: completed or set aside later
            log.warning("session %s: the failed restore's journal is kept: %s", session.id,
                        other.message)
            return exc
        self.journal.remove(session.id)
        try:
            self.store.append_audit([AuditEvent("restore.failed", session.id, target.id,
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
        if target.id in {cid for cid, _ in self.store.lineage(session.head)}:
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

    def _plan(self, session: Session, head: Checkpoint, target: Checkpoint,
              mapped: dict[str, frozenset[str]] | None = None, persist: bool = False,
              paths: list[str] | None = None) -> list[LayerPlan]:
        """What a restore will change in each layer, checked before anything changes:
        every layer opened by identity, every blob it will write verified (a corrupt one
        fails the restore with DATA_LOSS), the current state captured (with ``persist``,
        stored, for the checkpoint taken before the restore; a layer a limit keeps from
        being stored is captured again without, and its plan says why: ``unsaved``).
        ``mapped``: of a paused container (a dry run); a restore stops the container
        first. ``paths``: only those of the workspace are brought to the target; every
        other path of every layer stays as it is."""
        plans = []
        agent = owners.agent_of(session.spec)
        for layer, base, want in zip(self.layers(session), self._bases(head),
                                     self._bases(target), strict=False):
            unsaved = ""
            try:
                current, seen = layer.capture(base, persist=persist, consume=False,
                                              mapped=mapped)
            except ResourceExhausted as exc:
                if not persist:
                    raise
                unsaved = exc.message
                current, seen = layer.capture(base, persist=False, consume=False,
                                              mapped=mapped)
            size_after = None
            if paths and unsaved:  # the restore's checkpoint would name files never stored
                raise ResourceExhausted(f"{unsaved}: a restore of some paths keeps the rest"
                                        " of the world, which must be stored first")
            if paths and layer.kind == WORKSPACE:
                graft = history.Graft(self.trees, self.blobs, current.trees, persist)
                want, size_after = graft.apply(current.root, target.tree, paths)
                current = replace(current, trees=graft.trees)
            elif paths:
                want = current.root
            if agent is not None:  # it writes and removes only its user's own files,
                # and writes back none its user could not make (a tree recorded before
                # 0.7.26 may hold one)
                owners.check_entries(self.trees, base, current.root, agent, current.trees,
                                     "nothing was restored")
                if want is not None:
                    owners.check_entries(self.trees, current.root, want, agent,
                                         current.trees, "nothing was restored")
            changes = _restore_diff(self.trees, layer, current, want)
            size = 0
            for path in changes.added + changes.modified:
                entry = entry_at(self.trees, want, path, current.trees)
                if entry is not None and entry.has_content:
                    self.blobs.verify(entry.ref)
                    if entry.kind in MAPPED:  # less the chunks the file there holds
                        have = entry_at(self.trees, current.root, path, current.trees)
                        for piece in chunks.needed(self.blobs, entry.ref, have):
                            self.blobs.verify(piece)
                    size += entry.size if entry.kind == FILE else 0
            plans.append(LayerPlan(layer, current, seen, want, changes, size, unsaved,
                                   size_after))
        return plans

    def _apply(self, session: Session, head: Checkpoint, target: Checkpoint,
               entry: dict, before=None, paths: list[str] | None = None
               ) -> tuple[list[LayerPlan], list[str]]:
        """Bring every layer to the target: the container stopped meanwhile, then started
        again if it was running. The plan is made (and may fail) before the journal is
        written, so a restore refused up front leaves no journal; the journal names
        every path the restore will change, in each layer, as it was and as it will be,
        so a restart can tell whether the layers are still as the restore left them.
        ``before(plans)``, given by a new restore: called once the plan is made (its
        capture stored), before the journal (_checkpoint_before)."""
        stopped = self._mark("stopped", session.id)
        was_running = (self._engine().stop(session.container, mark=stopped)
                       if session.container else False)
        try:
            crash_point("restore.stopped")
            plans = self._plan(session, head, target, persist=before is not None,
                               paths=paths)
            if before is not None:
                before(plans)
            crash_point("restore.planned")
            self.journal.write(entry | {"layers": [p.journal() for p in plans]})
            crash_point("restore.after_journal")
            warnings: list[str] = []
            for plan in plans:
                progress.begin(f"restore: {plan.layer.kind}", plan.size)
                warnings += [f"{plan.layer.kind}: {w}" if plan.layer.kind == CONTAINER else w
                             for w in plan.layer.snap.apply(plan.current, plan.want)]
                if plan.seen is not None and not plan.seen.full and (
                        plan.layer.snap.restore_exclusions(plan.current, plan.want) is None):
                    # (under exclusions the layer is the target but for what they left
                    # as it was: the next capture scans it all)
                    plan.layer.now_equals(plan.want)
                crash_point("restore.between_layers")
            return plans, warnings
        finally:
            if was_running:
                self._engine().start(session.container)  # refused: the mark stays, and
                try:  # the next start starts it
                    self._check_bind(session.container, session.workspace)
                finally:
                    os.unlink(stopped)

    def _finish_restore(self, entry: dict) -> str:
        """Complete a restore its journal says was begun (the caller holds the lock), but
        only if every layer is still as the restore left it: each path it was to change
        either as it was or as it was to be, and nothing else changed. Otherwise the
        entry is set aside and the session marked as needing attention: a journal is
        never applied over work written after it."""
        sid, fields = entry["session"], entry["checkpoint"]
        try:
            self.store.get_checkpoint(fields["id"])
            self.journal.remove(sid)
            return f"restore of session {sid} to {entry['target']} had completed"
        except NotFound:
            pass
        session = self.store.get_session(sid)
        head = self.store.get_checkpoint(entry["head"])
        target = _journalled(entry)
        try:
            with self._paused(session) as mapped:
                problem = self._changed_since(session, head, entry, mapped)
        except WorldlineError as exc:
            problem = exc.message
        if problem:
            return self._set_aside(session, entry, problem)
        for layer in self.layers(session):  # a file written aside, never renamed
            for path in layer.snap.remove_leftovers():
                log.warning("session %s: removed %s, left by the interrupted restore",
                            sid, os.path.join(layer.path, path))
        self._apply(session, head, target, entry)
        tasks = tasks_from_json(self.blobs.read_bytes(target.tasks_digest))
        self.store.append_checkpoint(target, [], entry["head"], tasks, [AuditEvent(
            "restore.completed", sid, target.id, {"target": entry["target"]}, ids.now())])
        self.journal.remove(sid)
        self._release("stopped", session.id)
        return f"completed the interrupted restore of session {sid} to {entry['target']}"

    def _changed_since(self, session: Session, head: Checkpoint, entry: dict,
                       mapped: dict[str, frozenset[str]]) -> str:
        """Why the layers are not as the interrupted restore left them ("" if they are)."""
        planned = {p["kind"]: p for p in entry.get("layers", [])}
        layers = self.layers(session)
        if len(planned) != len(layers) or any(x.kind not in planned for x in layers):
            return "the session's layers are not the ones the restore began with"
        target = _journalled(entry)
        for layer, base, want in zip(layers, self._bases(head), self._bases(target),
                                     strict=False):
            paths = planned[layer.kind]["paths"]
            current, _ = layer.capture(base, persist=False, consume=False, mapped=mapped)
            left = _restore_diff(self.trees, layer, current, want)
            for path in left.added + left.modified + left.deleted:
                have = entry_at(self.trees, current.root, path, current.trees)
                if have is not None and have.is_folder:
                    continue  # folders take their times and modes last: any is fine
                # As it was, or as it will be yet still to be linked to its hard-link
                # group (the restore links a group's other names last of all).
                if path not in paths or entry_key(have) not in paths[path]:
                    return (f"{layer.kind} path {path} changed after the restore was"
                            " interrupted")
        return ""

    def _needs_attention(self, session_id: str) -> bool:
        try:
            return bool(self.store.get_session(session_id).needs_attention)
        except NotFound:
            return False  # never recorded: its container is not worldline's to hold

    def _mark(self, kind: str, session_id: str) -> str:
        """The file that says the session's container is held ``kind`` ("paused" or
        "stopped") by this daemon (Engine.frozen, Engine.stop)."""
        return os.path.join(self.marks[kind], session_id)

    def _release(self, kind: str, session_id: str) -> str | None:
        """Unpause ("paused") or start again ("stopped") the session's container if a
        daemon that died, or a restore cut short, left it so (its mark says); a line
        for the report, or None. A session that needs attention keeps its container
        stopped until an operator resolves it. An engine that does not answer, or a
        container that cannot be started, is logged and keeps the mark for the next
        start: it never stops this one, nor undoes a restore that is done."""
        mark = self._mark(kind, session_id)
        if not os.path.exists(mark) or (kind == "stopped"
                                        and self._needs_attention(session_id)):
            return None
        try:
            container = (self._engine().unpause_marked(mark) if kind == "paused"
                         else self._engine().start_marked(mark))
        except (WorldlineError, OSError) as exc:
            log.warning("container of session %s, %s when the daemon stopped: left as it"
                        " is for now: %s", session_id, kind, getattr(exc, "message", exc))
            return None
        if container is None:
            return None
        if kind == "stopped":
            try:
                self._check_bind(container, self.store.get_session(session_id).workspace)
            except WorldlineError as exc:
                return f"container {container} of session {session_id}: {exc.message}"
        return (f"{'unpaused' if kind == 'paused' else 'started'} container {container}"
                f" of session {session_id}, which the daemon's last run had {kind}")

    def _release_left(self, kind: str) -> list[str]:
        """At start: ``_release`` every container a mark of ``kind`` names (the stopped
        ones once the restores a crash interrupted are completed)."""
        return [line for name in sorted(os.listdir(self.marks[kind]))
                if (line := self._release(kind, name)) is not None]

    def _set_aside(self, session: Session, entry: dict, reason: str) -> str:
        why = (f"an interrupted restore to {entry['target']} was not completed: {reason};"
               " resolve with `worldline session resolve`")
        self.journal.set_aside(session.id)
        self.store.update_session(session.id, needs_attention=why)
        self.store.append_audit([AuditEvent("restore.set_aside", session.id, entry["target"],
                                            {"reason": reason}, ids.now())])
        return f"session {session.id} needs attention: {why}"

    def resolve(self, session_id: str, complete: bool) -> Session:
        """An operator's decision on a session that needs attention: complete the restore
        that was set aside (the layers brought to its target, whatever they hold now), or
        abandon it (the layers stay as they are; the next checkpoint records them). A
        session of a copied data root (_leave_to_the_original) can only be abandoned:
        its workspace and container become this root's as they now are, and any
        restore set aside with it is dropped."""
        session = self.session(session_id)
        with self.lock(session.workspace):
            entry = self.journal.get_set_aside(session_id)
            copied = (session.needs_attention or "").startswith(_COPIED)
            if (entry is None and not copied) or not session.needs_attention:
                raise FailedPrecondition(f"session {session_id} does not need attention")
            if copied and complete:  # its workspace may be the original's: left as it is
                raise FailedPrecondition(
                    f"session {session_id} waits because this data root is a copy:"
                    " `--abandon` makes its world this root's as it is (a restore after"
                    " that brings back any checkpoint)")
            if complete:
                try:
                    self.store.get_checkpoint(entry["checkpoint"]["id"])
                except NotFound:
                    head = self.store.get_checkpoint(entry["head"])
                    cp = _journalled(entry)
                    self._apply(session, head, cp, entry)
                    tasks = tasks_from_json(self.blobs.read_bytes(cp.tasks_digest))
                    self.store.append_checkpoint(cp, [], entry["head"], tasks, [AuditEvent(
                        "restore.completed", session_id, cp.id, {"target": entry["target"]},
                        ids.now())])
                self.journal.remove(session_id)
            for layer in self.layers(session):
                if layer.tracker is not None:
                    layer.tracker.invalidate("an operator resolved the session")
            self.journal.drop_set_aside(session_id)
            self.store.update_session(session_id, needs_attention=None)
            self._release("stopped", session.id)  # running again if a restore stopped it
            self.store.append_audit([AuditEvent(
                "session.resolve", session_id, session_id,
                {"action": "complete" if complete else "abandon"}, ids.now())])
        return self.session(session_id)

    def _pending_restore(self, session_id: str) -> tuple[Session, list[Task]]:
        """A restore of this session that failed midway is completed before anything else
        happens to the session, if nothing changed since (the caller holds the lock);
        a session that needs attention takes no operation that changes its world.
        Returns the session and its task list as they now are."""
        entry = self.journal.get(session_id)
        if entry is not None:
            log.warning("session %s: %s", session_id, self._finish_restore(entry))
        session, tasks = self.store.get_session_and_tasks(check_id("session", session_id))
        if session.needs_attention:
            raise FailedPrecondition(f"session {session_id} needs attention:"
                                     f" {session.needs_attention}")
        return session, tasks

    # -- fork ----------------------------------------------------------------------------
    def fork(self, checkpoint_id: str, workspace: str = "", name: str = "",
             volumes: str = "", agent: Agent | None = None) -> ForkResult:
        """``agent``: the allowed user forking its own checkpoint into a new folder in a
        folder of its own (the fork is its session); None: the daemon owner."""
        with self.in_use.holding(checkpoint_id):  # kept from gc until it is recorded
            return self._fork(checkpoint_id, workspace, name, volumes, agent)

    def _fork(self, checkpoint_id: str, workspace: str, name: str, volumes: str,
              agent: Agent | None) -> ForkResult:
        source = self.usable(checkpoint_id)
        if agent is not None and source.container is not None:
            raise PermissionDenied("a checkpoint with a container layer is forked by the"
                                   f" daemon's owner, not by an allowed user ({agent})")
        if agent is not None and not workspace:
            raise PermissionDenied(f"an allowed user ({agent}) forks into a folder of its"
                                   " own: give the fork's workspace")
        parent = self.store.get_session(source.session_id)
        check_text("name", name)
        if volumes not in ("", "share", "empty"):
            raise InvalidArgument(f"--volumes is share or empty, not {volumes!r}")
        if source.container is not None:
            spec = self._container_spec(parent)
            foreign = extra_mounts(spec, parent.workspace)
            if foreign and not volumes:
                raise FailedPrecondition(
                    f"the container of session {parent.id} mounts {', '.join(foreign)}"
                    " besides the workspace: they are not part of the world; fork with"
                    " --volumes share (mount them as they are) or --volumes empty (fresh"
                    " empty volumes)")
        sid = ids.new_id()
        path = self._check_workspace(workspace or os.path.join(self.fork_root, sid),
                                     must_be_empty=True, agent=agent)
        if agent is not None:
            owners.check_folder(agent, os.path.dirname(path), "the folder above")
            owners.check_entries(self.trees, None, source.tree, agent,
                                 doing="nothing was forked")
        checked = _existing_identity(path)
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
            session = Session(sid, name or self._fork_name(parent.name), path, container, "",
                              source.id, ids.now(), host=self.host,
                              lease_expires=self._lease(),
                              spec=owners.with_agent(json.dumps(
                                  {"roots": roots} | _exclude_of(parent)), agent))
            with self.lock(path):
                layers = self.layers(session)
                mounted = (self.views is not None and self.views.enabled
                           and self._mount_fork(sid, path, source.tree, source.bytes))
                for layer, want in zip(layers, self._bases(source), strict=False):
                    if layer.kind == WORKSPACE and mounted:
                        continue  # nothing watched yet: the first checkpoint scans it
                    if layer.tracker is not None:
                        layer.tracker.prepare()  # we know what we write: no scan needed
                    # The fork's workspace was checked empty; a new container's layer
                    # already holds the mount points the engine made: look, never assume.
                    current = (Capture(self.empty_tree, 0) if layer.kind == WORKSPACE
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
                session = replace(session, head=first.id, spec=self._spec(
                    session, layers,
                    self._engine().creation_spec(container) if container else None))
                tasks = tasks_from_json(self.blobs.read_bytes(source.tasks_digest))
                self.store.create_session(session, first, tasks, [
                    AuditEvent("fork", sid, first.id, {"source": source.id, "workspace": path,
                                                        "container": container}, ids.now())])
                for layer, want in zip(layers, self._bases(source), strict=False):
                    if not (layer.kind == WORKSPACE and mounted):
                        layer.now_equals(want)
            if container:
                self._start_container(container, path)
        except BaseException:
            if container:
                self._engine().remove(container)
            if self.views is not None and os.path.ismount(path):
                self.views.unmount(path)
                shutil.rmtree(os.path.join(self.views.forks, sid), ignore_errors=True)
            if created:
                remove_folder(path, roots[WORKSPACE])
            raise
        effects = self.side_effects_since(parent.head, source.id)
        return ForkResult(self.store.get_session(sid), effects)

    def _start_container(self, container: str, workspace: str) -> None:
        """Start a session's container, then ``_check_bind``."""
        self._engine().start(container)
        self._check_bind(container, workspace)

    def _check_bind(self, container: str, workspace: str) -> None:
        """The engine resolves a bind mount's source path at each start, following
        symlinks: a running container that binds ``workspace`` must show there the folder
        that path names through no symlink. If a folder above it was swapped for a
        symlink, the container would hold the symlink's target: it is stopped at once
        (FAILED_PRECONDITION), never left running."""
        seen = self._engine().bind_identity(container, workspace)
        if seen is None:
            return
        try:
            want = folder_identity(WORKSPACE, workspace)
        except WorldlineError:
            want = None
        if seen != want:
            self._stop_bound_elsewhere(container, workspace)

    def container_started(self, container: str, session_id: str) -> None:
        """A container of this data root was started, by anyone (containers.StartWatch):
        if it binds its session's workspace and shows there another folder than the one
        recorded for the session (a start by a restart policy or an operator after a
        folder above the workspace was swapped for a symlink), it is stopped now, not at
        the session's next checkpoint."""
        try:
            session = self.store.get_session(session_id)
        except NotFound:
            return  # a fork's container before its session is recorded: its start checks
        if session.deleted_at or not session.container or not self.held_here(session):
            return
        want = json.loads(session.spec or "{}").get("roots", {}).get(WORKSPACE)
        if not _shows_another(want, self._engine().bind_identity(container, session.workspace)):
            return
        try:
            self._stop_bound_elsewhere(container, session.workspace)
        except FailedPrecondition as exc:  # no caller to answer: the log says it
            log.warning("session %s, as its container started: %s", session.id, exc.message)

    def _stop_bound_elsewhere(self, container: str, workspace: str) -> NoReturn:
        """Stop a container whose bind of ``workspace`` shows another folder, at once."""
        self._engine().stop(container, timeout=0)
        raise FailedPrecondition(
            f"container {container} was stopped: its bind mount of {workspace} shows"
            " another folder than the session's workspace (a folder on the way swapped for"
            " a symlink, or the container started before the workspace was there); start"
            " it again once the workspace is as it was")

    def _fork_name(self, base: str) -> str:
        """``BASE-fork-N``, N the first number no session's name has taken."""
        taken = {s.name for s in self.store.list_sessions()}
        n = 1
        while f"{base}-fork-{n}" in taken:
            n += 1
        return f"{base}-fork-{n}"

    def fork_origin(self, session_id: str) -> tuple[str, str] | None:
        """(workspace, tree it was forked from) of a recorded fork; None for a session
        that is not recorded here, or not a fork (views.py rebuilds a mount from it)."""
        try:
            session = self.store.get_session(session_id)
            if not session.forked_from:
                return None
            return session.workspace, self.store.get_checkpoint(session.forked_from).tree
        except NotFound:
            return None

    def fork_remounted(self, session_id: str, identity: list[int]) -> None:
        """A fork's overlay was mounted again at start (views.py): its workspace is the
        new mount's root, checked as the layer's identity from now on (a new mount has
        a new device number). A session this host does not hold is left as it is."""
        try:
            session = self.store.get_session(session_id)
        except NotFound:
            return
        spec = json.loads(session.spec or "{}")
        roots = spec.setdefault("roots", {})
        if session.host != self.host or roots.get(WORKSPACE) == identity:
            return
        roots[WORKSPACE] = identity
        self.store.update_session(session_id, spec=json.dumps(spec, sort_keys=True))

    def _labels(self, session_id: str) -> dict[str, str]:
        return {LABEL_MANAGED: "true", LABEL_ROOT: self.root_id, LABEL_SESSION: session_id}

    def _mount_fork(self, sid: str, path: str, tree: str, size: int) -> bool:
        """Mount the fork's workspace as an overlay; False (then it is copied) if refused."""
        try:
            self.views.mount_fork(sid, path, tree, size)
            return True
        except OSError as exc:
            log.warning("fork %s: overlay mount refused (%s); copying instead", sid, exc)
            shutil.rmtree(os.path.join(self.views.forks, sid), ignore_errors=True)
            return False

    def _container_spec(self, session: Session) -> dict:
        """The container's creation spec: as recorded with the session (so a container
        removed since can be made again), else as the engine shows it now."""
        spec = json.loads(session.spec or "{}").get("container")
        if spec:
            return spec
        if not session.container:
            raise FailedPrecondition(f"session {session.id} has no container")
        return self._engine().creation_spec(session.container)

    def _fork_container(self, parent: Session, sid: str, workspace: str, volumes: str) -> str:
        engine = self._engine()
        spec = self._container_spec(parent)
        base = parent.container or f"worldline-{parent.id.lower()}"
        name = f"{base}-fork-{sid[-8:].lower()}"
        engine.create_from_spec(spec, name, parent.workspace, workspace, self._labels(sid),
                                volumes)
        return name

    # -- images --------------------------------------------------------------------------
    def export_image(self, checkpoint_id: str) -> tuple[str, str]:
        """A runnable image of the checkpoint's container: (image id, reference). Looked
        up by label first, so a retry after a timed-out commit never makes a duplicate."""
        cp = self.usable(checkpoint_id)
        if cp.container is None:
            raise FailedPrecondition(f"checkpoint {cp.id} has no container layer")
        engine = self._engine()
        reference = f"worldline/{cp.session_id.lower()}:{cp.id.lower()}"
        for image in engine.images_labelled(LABEL_CHECKPOINT, cp.id):
            if (image.get("Labels") or {}).get(LABEL_ROOT) == self.root_id:
                return image["Id"], reference
        session = self.store.get_session(cp.session_id)
        spec = self._container_spec(session)
        temp = f"worldline-export-{cp.id.lower()}"
        engine.remove(temp)  # a leftover of an interrupted export
        engine.create_from_spec(spec, temp, session.workspace, session.workspace,
                                self._labels(session.id), volumes="share")
        try:
            layer = self._layer(CONTAINER, engine.upper_dir(temp), track=False)
            layer.snap.apply(layer.snap.capture(persist=False), cp.container)
            repo, tag = reference.split(":")
            image_id = engine.commit(temp, repo, tag, {**self._labels(session.id),
                                                       LABEL_CHECKPOINT: cp.id})
        finally:
            engine.remove(temp)
        self.store.append_audit([AuditEvent("image.export", session.id, cp.id,
                                            {"image": image_id}, ids.now())])
        return image_id, reference

    # -- recovery ------------------------------------------------------------------------
    def recover(self) -> list[str]:
        """At start: unpause the containers a killed daemon left paused, complete every
        restore a crash interrupted and start again the containers it left stopped, and
        remove containers that worldline made for sessions that were never recorded.
        Returns a report."""
        report = self._leave_to_the_original() if self.copy_of else []
        report += self._release_left("paused")
        for entry in self.journal.entries():
            try:  # nothing a journal holds may stop the daemon from serving the others
                session = self.store.get_session(entry["session"])
                with self.lock(session.workspace):
                    report.append(self._finish_restore(entry))
            except Exception as exc:
                log.exception("recovery of session %s", entry.get("session"))
                try:
                    session = self.store.get_session(entry["session"])
                    report.append(self._set_aside(session, entry, f"{exc}"))
                except Exception:
                    self.journal.set_aside(str(entry.get("session")))
                    report.append(f"set aside the journal of {entry.get('session')}: {exc}")
        report += self._release_left("stopped")
        known = {s.id for s in self.store.list_sessions()}
        for folder in (self.fork_root, self.views.forks if self.views else None):
            if folder is None or not os.path.isdir(folder):
                continue
            for name in os.listdir(folder):  # a fork that died before it was recorded
                path = os.path.join(folder, name)
                if ids.is_id(name) and name not in known:
                    if self.views is not None:
                        try:
                            spec = self.views.read_spec(name)
                        except ValueError as exc:  # its workspace is unknown: left
                            spec = None
                            report.append(f"{exc}: the fork's mount, if any, is left")
                        if spec is not None:
                            self.views.unmount(spec["workspace"])
                        if os.path.ismount(path):
                            self.views.unmount(path)
                    shutil.rmtree(path, ignore_errors=True)
                    report.append(f"removed the unrecorded fork {path}")
        if self.engine is not None and self.engine.ping():
            for c in self.engine.containers_labelled(LABEL_ROOT, self.root_id):
                if c.get("Labels", {}).get(LABEL_SESSION) not in known:
                    self.engine.remove(c["Id"])
                    report.append(f"removed orphaned container {c['Names'][0].lstrip('/')}")
        for line in report:
            log.warning("recovery: %s", line)
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
        report = []
        aside_here: set[str] = set()
        for entry in self.journal.entries():
            self.journal.set_aside(str(entry.get("session")))
            aside_here.add(str(entry.get("session")))
            report.append(f"set aside the journal of a restore of session"
                          f" {entry.get('session')} to {entry.get('target')}: not completed"
                          f" here, where its workspace is the original's")
        for kind, folder in self.marks.items():
            for name in sorted(os.listdir(folder)):
                os.unlink(os.path.join(folder, name))
                report.append(f"left the container of session {name} {kind}, as the"
                              f" original's daemon at {self.copy_of} holds it")
        if not self.store.local:
            return report
        for session in self.store.list_sessions():
            if session.deleted_at:
                continue
            aside = self.journal.get_set_aside(session.id)
            world, them, as_they_are = (("workspace and container are", "them", "they are")
                                        if session.container else ("workspace is", "it",
                                                                   "it is"))
            restore = (f" (a restore to {aside.get('target')} was under way: it is not"
                       " completed here)" if isinstance(aside, dict) else "")
            before = (f" (before the copy: {session.needs_attention})"
                      if session.needs_attention else "")
            self.store.update_session(session.id, needs_attention=(
                f"{_COPIED} {self.copy_of}, where this session goes on: its {world} the"
                f" original's{restore}; `worldline session resolve {session.id} --abandon`"
                f" makes {them} this root's, as {as_they_are}, once the original no longer"
                f" uses them{before}"))
            detail = {"original": self.copy_of}
            events = []
            if isinstance(aside, dict):
                detail["restore"] = str(aside.get("target"))
            if isinstance(aside, dict) and session.id in aside_here:
                events.append(AuditEvent(
                    "restore.set_aside", session.id, detail["restore"],
                    {"reason": f"this data root is a copy of the one at {self.copy_of}, whose"
                               " daemon completes the restore"}, ids.now()))
            events.append(AuditEvent("session.copied", session.id, session.id, detail,
                                     ids.now()))
            self.store.append_audit(events)
            report.append(f"session {session.id} waits for an operator: this root is a"
                          f" copy of {self.copy_of}")
        return report

    # -- diff ----------------------------------------------------------------------------
    def diff(self, from_id: str, to_id: str, patch: bool = False
             ) -> tuple[Diff, Diff | None, str]:
        """The workspace's changes, the container layer's (None when neither checkpoint has
        one; an absent layer counts as empty), and a patch of the workspace's text files."""
        a, b = self.usable(from_id), self.usable(to_id)
        changes = diff(self.trees, a.tree, b.tree)
        box = None
        if a.container is not None or b.container is not None:
            box = diff(self.trees, a.container or self.empty_tree, b.container or self.empty_tree)
        if not patch:
            return changes, box, ""
        parts = []
        for path in sorted(changes.added + changes.modified + changes.deleted):
            parts.append(self._patch(path, entry_at(self.trees, a.tree, path),
                                     entry_at(self.trees, b.tree, path)))
        return changes, box, "".join(parts)

    # -- one path -----------------------------------------------------------------------
    def path_history(self, session_id: str, path: str, patch: bool = False
                     ) -> list[history.PathChange]:
        """The checkpoints of the session's lineage (its forks' ancestry included) that
        changed ``path``, newest first, each with the tool calls made since the one
        before it (history.changes_of). A rename is a deletion of one path and an
        addition of another: each path's history shows its own."""
        session = self.session(session_id)
        path = history.check_path(path)
        mine = {cp.id: cp for cp in self.store.list_checkpoints(session.id)}
        chain = [mine.get(cid) or self.store.get_checkpoint(cid)
                 for cid, _ in self.store.lineage(session.head)]
        calls: dict[str, list[ToolCall]] = {}
        for call in calls_on_path(self.store, session.head):
            calls.setdefault(call.checkpoint_id, []).append(call)
        return history.changes_of(self.trees, path, chain, calls,
                                  (lambda old, new: self._patch(path, old, new))
                                  if patch else None)

    def read_file(self, checkpoint_id: str, path: str, offset: int = 0, length: int = 0
                  ) -> tuple[bytes, int, str]:
        """(bytes, whole size, kind) of the file or symlink at ``path`` as of the
        checkpoint; a slice from ``offset`` (history.READ_LIMIT at most)."""
        cp = self.usable(checkpoint_id)
        path = history.check_path(path)
        entry = history.PathLookup(self.trees, path).entry(cp.tree, strict=True)
        if entry is None:
            raise NotFound(f"checkpoint {cp.id} has no {path}")
        data, size = history.read_entry(self.blobs, entry, path, offset, length)
        return data, size, "symlink" if entry.kind == "symlink" else "file"

    def _patch(self, path: str, old: Entry | None, new: Entry | None) -> str:
        path = escape(path)
        return history.metadata_change(path, old, new) + self._text_patch(path, old, new)

    def _text_patch(self, path: str, old: Entry | None, new: Entry | None) -> str:
        if old is not None and new is not None and (old.kind, old.ref) == (new.kind, new.ref):
            return ""  # the same bytes: what changed is said by metadata_change
        if any(e is not None and e.kind in MAPPED for e in (old, new)):
            return history.binary_patch(self.blobs, path, old, new)
        texts = []
        for entry in (old, new):
            if entry is None or entry.kind != FILE:
                texts.append([])
                continue
            data = self.blobs.read_bytes(entry.ref)
            if b"\0" in data[:8192] or len(data) > (2 << 20):
                return f"Binary files a/{path} and b/{path} differ\n"
            try:
                texts.append(data.decode("utf-8").splitlines(keepends=True))
            except UnicodeDecodeError:
                return f"Binary files a/{path} and b/{path} differ\n"
        lines = difflib.unified_diff(texts[0], texts[1],
                                     "/dev/null" if old is None else f"a/{path}",
                                     "/dev/null" if new is None else f"b/{path}")
        return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
                       for line in lines)


def _restore_diff(trees: TreeReader, layer: Layer, current: Capture, want: str) -> Diff:
    """What a restore from ``current`` to ``want`` changes: the paths that differ less
    those its exclusions leave as they are (exclude.py)."""
    changes = diff(trees, current.root, want, current.trees)
    excluded = layer.snap.restore_exclusions(current, want)
    if excluded is None:
        return changes

    def kept(paths: list[str], root: str) -> list[str]:
        out = []
        for path in paths:
            entry = entry_at(trees, root, path, current.trees)
            if not covers(excluded, path, entry is not None and entry.is_folder):
                out.append(path)
        return out
    return Diff(kept(changes.added, want), kept(changes.modified, want),
                kept(changes.deleted, current.root))


def _exclude_of(session: Session) -> dict:
    """The session's --exclude patterns as its spec keeps them ({} if none)."""
    exclude = json.loads(session.spec or "{}").get("exclude")
    return {"exclude": exclude} if exclude else {}


def _journalled(entry: dict) -> Checkpoint:
    """The checkpoint a journalled restore appends: its trees are the ones the layers
    are brought to (the target's, or for a restore of some paths, the world with
    them), and its task list the session's after it."""
    fields = entry["checkpoint"]
    return Checkpoint(**{**fields, "acknowledged": tuple(fields["acknowledged"])})


def _checkpoint_detail(cp: Checkpoint, label: str | None, messages: int) -> dict:
    """A checkpoint's audit detail: its tree, and what is not the default (an audit row
    per checkpoint is a large share of the metadata: no container, no label and no
    messages, the usual case, are said by their absence)."""
    detail: dict = {"tree": cp.tree}
    if cp.container:
        detail["container"] = cp.container
    if label:
        detail["label"] = label
    if messages:
        detail["messages"] = messages
    if cp.warnings:
        detail["warnings"] = list(cp.warnings)
    return detail


def folder_identity(kind: str, path: str) -> list[int]:
    """(st_dev, st_ino) of a layer's root folder, reached through no symlink: the
    identity its session checks it against (``open_layer_root``). A symlink on the way
    is FAILED_PRECONDITION."""
    try:
        return identity_of(open_folder(path))
    except FileNotFoundError:
        raise NotFound(f"{_what(kind)} {path} does not exist") from None
    except OSError as exc:
        raise symlink_refused(kind, path, exc) from None


def _existing_identity(path: str) -> list[int] | None:
    """(st_dev, st_ino) of the folder at ``path`` reached through no symlink; None if
    there is none (or it cannot be reached so)."""
    try:
        return identity_of(open_folder(path))
    except OSError:
        return None


def _shows_another(want: list[int] | None, seen: list[int] | None) -> bool:
    """Whether a container's bind of the workspace (``seen``: bind_identity_of) shows
    another folder than the one recorded for the session (``want``); not when either
    is unknown (nothing recorded yet, or no bind, or not running)."""
    return want is not None and seen is not None and seen != want


def _what(kind: str) -> str:
    return "workspace" if kind == WORKSPACE else "container layer"


def symlink_refused(kind: str, path: str, exc: OSError) -> Exception:
    """What an OSError met reaching a layer's folder through no symlink means: a symlink
    (or a file) on the way is FAILED_PRECONDITION; anything else is itself."""
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return FailedPrecondition(f"{_what(kind)} {path}: a folder on the way is a symlink"
                                  " (swapped for one?); nothing was read or written")
    return exc


def _root_identity(layer: Layer) -> list[int]:
    """The identity a layer's root is checked against: a workspace's through no symlink
    (the agent may own folders above it); a container layer's as the engine names it
    (its folders are the engine's, and its data root may be reached through a symlink
    of the operator's)."""
    if layer.kind == WORKSPACE:
        return folder_identity(WORKSPACE, layer.path)
    st = os.lstat(layer.path)
    return [st.st_dev, st.st_ino]


def remove_folder(path: str, identity: list[int] | None = None) -> None:
    """Remove the folder ``path`` (one a failed fork or take-over made), from its parent
    reached through no symlink (one there now: nothing is removed). ``identity``: the
    (st_dev, st_ino) it was made with; another folder there now (swapped in by an agent
    that writes the parent) is left alone, and what is removed is emptied through the
    descriptor checked."""
    try:
        parent = open_folder(os.path.dirname(path))
    except OSError:
        return
    name = os.path.basename(path)
    try:
        if identity is None:
            shutil.rmtree(name, ignore_errors=True, dir_fd=parent)
            return
        try:
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                         dir_fd=parent)
        except OSError:
            return
        try:
            if identity_of(os.dup(fd)) != list(identity):
                log.warning("%s is no longer the folder made there: left as it is", path)
                return
            for child in os.listdir(fd):  # (rmtree opens what it is given: a FIFO
                with contextlib.suppress(OSError):  # would block it)
                    if stat.S_ISDIR(os.stat(child, dir_fd=fd, follow_symlinks=False).st_mode):
                        shutil.rmtree(child, ignore_errors=True, dir_fd=fd)
                    else:
                        os.unlink(child, dir_fd=fd)
        finally:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.rmdir(name, dir_fd=parent)
    finally:
        os.close(parent)


def open_layer_root(kind: str, path: str, identity: list | None) -> int:
    """A descriptor of a layer's root folder, refused (FAILED_PRECONDITION, nothing read
    or written) when the path no longer leads to the folder whose identity
    (st_dev, st_ino) was recorded: moved, deleted, or a parent swapped for a symlink."""
    what = "workspace" if kind == WORKSPACE else "container layer"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise FailedPrecondition(f"{what} {path} does not exist") from None
    except NotADirectoryError:
        raise FailedPrecondition(f"{what} {path} is not a folder") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise FailedPrecondition(f"{what} {path} has been replaced by a symlink") from None
        raise
    if identity is not None:
        st = os.fstat(fd)
        if [st.st_dev, st.st_ino] != list(identity):
            os.close(fd)
            raise FailedPrecondition(
                f"{what} {path} is no longer the folder this session was created on (it was"
                " moved or replaced, or a folder above it was swapped for a symlink):"
                " nothing was read or written")
    return fd


def _not_available(path: str, agent: Agent) -> str:
    """What an allowed user is told of a folder that is another's (a session's it cannot
    see, the daemon's data): that it is not available, naming nothing of anyone else."""
    return f"workspace {path} is not available to an allowed user ({agent})"


def _contains(outer: str, inner: str) -> bool:
    return inner == outer or inner.startswith(outer.rstrip(os.sep) + os.sep)


def _clock(seconds: float) -> str:
    """A lease's end as UTC time, for messages."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))
