"""The session core: what every operation of the World shares.

It holds the parts the World coordinates (the metadata store, the blob store, the
stat cache, the change monitor, the container engine, the fork views), this data
root's identity, and what this process remembers between calls: a lock per
workspace, each session's workspace and last head. It answers the questions every
operation asks first: which session, which checkpoint, whether this host holds the
session, and what its layers are.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import replace

from worldline.wire.errors import FailedPrecondition, WorldlineError

from ..capture.containers import LABEL_MANAGED, LABEL_ROOT, LABEL_SESSION, Engine
from ..capture.exclude import key_in, patterns_of
from ..capture.layers import CONTAINER, WORKSPACE, Layer
from ..capture.limits import Limits
from ..capture.snapshot import WorkspaceSnapshotter
from ..capture.statcache import StatCache
from ..capture.tracker import ChangeMonitor
from ..capture.trees import EMPTY_TREE, TreeReader
from ..capture.views import Views
from ..in_use import InUse
from ..records import Checkpoint, Session
from ..root_id import root_id
from ..session_spec import SessionSpec
from ..storage.blob_store import BlobStore
from ..storage.metadata_store import Store
from ..validate import EMPTY_STATE, check_id
from .folders import clock, open_layer_root, root_identity
from .journal import RestoreJournal

log = logging.getLogger(__name__)


class Core:
    def __init__(self, root: str, store: Store, blobs: BlobStore, stat_cache: StatCache,
                 monitor: ChangeMonitor | None, engine: Engine | None, views: Views | None,
                 limits: Limits, host: str, lease_seconds: float, key=None) -> None:
        self.root = os.path.realpath(root)
        # The fleet (fleet.py): this daemon's host id ("" on a data root of one host)
        # and how long a lease it holds on its sessions lasts without renewal.
        self.host = host
        self.lease_seconds = lease_seconds
        self.limits = limits
        self.store = store
        self.blobs = blobs
        self.trees = TreeReader(blobs)
        self.stat_cache = stat_cache
        self.monitor = monitor
        self.engine = engine
        self.views = views
        self.fork_root = os.path.join(self.root, "workspaces")
        # (``key``: the data key of a keyed data root, which seals the journal's entries)
        self.journal = RestoreJournal(os.path.join(self.root, "journal"), key)
        # restores' and forks' targets, kept from gc (in_use.py); on a fleet, from every
        # host's gc
        self.in_use = InUse(None if store.local else self.publish_holds,
                            also=self.journal.targets)
        # containers paused (Engine.frozen) or stopped (Engine.stop) while the daemon
        # reads or restores them, by session: what a killed daemon left so is undone at
        # its next start (hold.py)
        self.marks = {kind: os.path.join(self.root, kind) for kind in ("paused", "stopped")}
        for folder in self.marks.values():
            os.makedirs(folder, mode=0o700, exist_ok=True)
        self.root_id, self.copy_of = root_id(self.root)
        # A workspace's lock lives while a call holds or waits for it: a daemon that
        # serves thousands of forks over months keeps none of their locks.
        self._locks: weakref.WeakValueDictionary[str, threading.Lock] = (
            weakref.WeakValueDictionary())
        self.guard = threading.Lock()  # the locks' table, and the warnings' (checkpoint.py)
        # Session id -> workspace as last read, and -> its last checkpoint made here:
        # dropped when the session is deleted or handed to another host (forget).
        self.workspace_of: dict[str, str] = {}
        self.heads: dict[str, Checkpoint] = {}
        # Session id -> warnings its next checkpoint carries (checkpoint.py)
        self.warnings: dict[str, list[str]] = {}
        self.empty_tree = blobs.put_bytes(EMPTY_TREE)
        self.empty_state = blobs.put_bytes(EMPTY_STATE)
        blobs.sync()

    # -- sessions and checkpoints ---------------------------------------------------------
    def lock(self, workspace: str) -> threading.Lock:
        """The lock of a workspace: every operation that reads or changes a session's
        world holds it, so a capture never races a restore (session_lock.py takes it
        for an operation on a session)."""
        with self.guard:
            lock = self._locks.get(workspace)
            if lock is None:
                lock = self._locks[workspace] = threading.Lock()
            return lock

    def session(self, session_id: str) -> Session:
        return self.store.get_session(check_id("session", session_id))

    def checkpoint_record(self, checkpoint_id: str) -> Checkpoint:
        return self.store.get_checkpoint(check_id("checkpoint", checkpoint_id))

    def usable(self, checkpoint_id: str) -> Checkpoint:
        """A checkpoint whose world can still be brought back (not pruned by retention)."""
        cp = self.checkpoint_record(checkpoint_id)
        if cp.pruned:
            raise FailedPrecondition(f"checkpoint {cp.id} was pruned by retention: its"
                                     " conversation and state remain, its files do not")
        return cp

    def forget(self, session_id: str) -> None:
        """Drop what this process remembers of a session it no longer serves (deleted,
        or handed to another host): the next call reads the session again."""
        self.heads.pop(session_id, None)
        self.workspace_of.pop(session_id, None)
        with self.guard:
            self.warnings.pop(session_id, None)

    def exclusions(self, session: Session) -> tuple[list[str], list[str]]:
        """What the session excludes (exclude.py): its own patterns, and those of the
        .worldlineignore its head checkpoint holds (as the next capture reads it, unless
        the agent changed it since)."""
        mine = SessionSpec.parse(session.spec).patterns
        try:
            key = key_in(self.trees, self.store.get_checkpoint(session.head).tree)
            text = self.blobs.read_bytes(key) if key is not None else b""
        except WorldlineError as exc:  # a blob unreadable: the rest is still shown
            log.warning("session %s: its .worldlineignore is not readable: %s", session.id,
                        exc.message)
            text = b""
        return mine, patterns_of(text.decode("utf-8", "surrogateescape"))

    # -- holds: which host serves a session -----------------------------------------------
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
            f" {clock(session.lease_expires)}): send its checkpoints, restores and tool"
            f" calls there, or take it over here once that host is gone or has released it"
            f" (`worldline session move {session.id} --take-over`)")

    def publish_holds(self, held: set[str]) -> None:
        """This host's holds in the fleet's store, for one lease (in_use.py)."""
        now = time.time()
        self.store.publish_holds(self.host, held, now + self.lease_seconds, now)

    def lease(self) -> float:
        """When a lease taken now runs out (0: a data root of one host has none)."""
        return time.time() + self.lease_seconds if self.host else 0.0

    # -- durability -----------------------------------------------------------------------
    def flush_later(self) -> contextlib.AbstractContextManager[Callable[[], None]] | None:
        """A block within which a commit returns before it is durable, and the callable
        that makes it so (Store.flush_later); None when a commit waits on the network
        (a fleet's database, or a bucket's uploads in ``BlobStore.committing``)."""
        return self.store.flush_later() if self.blobs.local else None

    # -- layers ---------------------------------------------------------------------------
    def require_engine(self) -> Engine:
        if self.engine is None:
            raise FailedPrecondition("this daemon runs without a Docker engine")
        return self.engine

    def labels(self, session_id: str) -> dict[str, str]:
        """The labels of a container worldline makes for the session (recovery removes
        one whose session was never recorded)."""
        return {LABEL_MANAGED: "true", LABEL_ROOT: self.root_id, LABEL_SESSION: session_id}

    def layer(self, kind: str, path: str, identity: list | None = None,
              track: bool = True, merged: str | None = None,
              exclude: list[str] | None = None) -> Layer:
        """A layer of ``kind`` over the folder ``path``, opened only if it is the folder
        ``identity`` names; ``track``: with the folder's change tracker (its changes
        since the last capture, so a capture reads only those)."""
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
        spec = SessionSpec.parse(session.spec)
        out = [self.layer(WORKSPACE, session.workspace, spec.root(WORKSPACE),
                          exclude=spec.exclude)]
        if spec.agent:  # an allowed user's session: the owner's reserve is not its
            out[0].snap.limits = replace(self.limits, owner_reserve=self.limits.min_free_bytes)
        if session.container:
            upper, merged = self.require_engine().layer_dirs(session.container)
            out.append(self.layer(CONTAINER, upper, spec.root(CONTAINER), merged=merged))
        return out

    def recorded_spec(self, session: Session, layers: list[Layer],
                      container_spec: dict | None = None) -> str:
        """The session's spec with each layer root's identity, and the container's
        creation spec when given: the text to record with the session."""
        spec = replace(SessionSpec.parse(session.spec),
                       roots={layer.kind: root_identity(layer) for layer in layers})
        if container_spec is not None:  # with the folder its bind mounts refer to
            spec = replace(spec, container=container_spec, workspace=session.workspace)
        return spec.to_json()
