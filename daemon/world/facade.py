"""The World: what the edge, the gates, the graphs, the fleet and maintenance call.

Each operation lives in a module of its own around the session core (core.py), and
this class only puts them together and hands each call to its module:

========================  ===============================================================
core.py                   the parts, this root's identity, locks, holds, layers
session_lock.py           the session lock, which first completes a pending restore
hold.py                   the container paused, stopped, made again, started (its bind)
journal.py                the restore journal: its entries and their file
plan.py                   a restore's plan and its application to the layers
sessions.py               sessions made, listed, deleted; one folder, one session
checkpoint.py             the checkpoint's hot path
restore.py                a restore, and the checkpoint of the world it replaces
fork.py                   a fork, and its overlay view mounted again
recovery.py               what a killed daemon left, and an operator's ``resolve``
reads.py                  views, diffs, one path's history, side effects
images.py                 a checkpoint's container as an image
folders.py                layer roots reached through no symlink, checked by identity
========================  ===============================================================
"""

from __future__ import annotations

import contextlib
import threading

from .. import history
from ..capture.containers import Engine
from ..capture.layers import Layer
from ..capture.limits import Limits
from ..capture.statcache import StatCache
from ..capture.tracker import ChangeMonitor
from ..capture.trees import Diff
from ..capture.views import Views
from ..owners import Agent
from ..records import Checkpoint, Session, Task, ToolCall
from ..storage.blob_store import BlobStore
from ..storage.metadata_store import Store
from . import images
from .checkpoint import Checkpoints
from .core import Core
from .fork import ForkResult, Forks
from .hold import ContainerHold
from .plan import Plans
from .reads import CheckpointView, Reads, side_effects_since
from .recovery import Recovery
from .restore import RestoreResult, Restores
from .session_lock import SessionLock
from .sessions import Sessions


class World:
    def __init__(self, root: str, store: Store, blobs: BlobStore, stat_cache: StatCache,
                 monitor: ChangeMonitor | None = None, engine: Engine | None = None,
                 views: Views | None = None, limits: Limits | None = None,
                 host: str = "", lease_seconds: float = 30.0, key=None) -> None:
        core = self.core = Core(root, store, blobs, stat_cache, monitor, engine, views,
                                limits or Limits(), host, lease_seconds, key)
        hold = self._hold = ContainerHold(core)
        plans = Plans(core, hold)
        lock = self._lock = SessionLock(core, hold, plans)
        self._sessions = Sessions(core, hold, lock)
        self._checkpoints = Checkpoints(core, hold, lock)
        self._restores = Restores(core, hold, plans, lock)
        self._forks = Forks(core, hold, self._sessions)
        self._recovery = Recovery(core, hold, lock)
        self._reads = Reads(core)
        # The parts and this root's identity, as the rest of the daemon reads them.
        self.root, self.host, self.lease_seconds = core.root, core.host, core.lease_seconds
        self.limits, self.store, self.blobs, self.trees = (core.limits, core.store,
                                                           core.blobs, core.trees)
        self.stat_cache, self.monitor, self.engine, self.views = (
            core.stat_cache, core.monitor, core.engine, core.views)
        self.fork_root, self.journal, self.in_use, self.marks = (
            core.fork_root, core.journal, core.in_use, core.marks)
        self.root_id, self.copy_of = core.root_id, core.copy_of
        self.empty_tree, self.empty_state = core.empty_tree, core.empty_state
        self.admission = self._checkpoints.admission

    # -- sessions (sessions.py, core.py) ---------------------------------------------------
    def create_session(self, workspace: str, container: str | None = None, name: str = "",
                       image: str = "", mount: str = "", *, session_id: str = "",
                       agent: Agent | None = None, exclude=()) -> Session:
        return self._sessions.create(workspace, container, name, image, mount,
                                     session_id=session_id, agent=agent, exclude=exclude)

    def create_session_in_own_folder(self, name: str) -> Session:
        return self._sessions.create_in_own_folder(name)

    def delete_session(self, session_id: str, keep_container: bool = False) -> Session:
        return self._sessions.delete(session_id, keep_container)

    def sessions(self, include_deleted: bool = False, workspace: str = "") -> list[Session]:
        return self._sessions.list(include_deleted, workspace)

    def session(self, session_id: str) -> Session:
        return self.core.session(session_id)

    def exclusions(self, session: Session) -> tuple[list[str], list[str]]:
        return self.core.exclusions(session)

    def forget(self, session_id: str) -> None:
        self.core.forget(session_id)

    def check_workspace(self, path: str, *, must_be_empty: bool, moving: str = "",
                        agent: Agent | None = None) -> str:
        return self._sessions.check_workspace(path, must_be_empty=must_be_empty,
                                              moving=moving, agent=agent)

    # -- the session core (core.py, session_lock.py) ---------------------------------------
    def lock(self, workspace: str) -> threading.Lock:
        return self.core.lock(workspace)

    def session_locked(self, session_id: str, expected_head: str = ""
                       ) -> contextlib.AbstractContextManager[tuple[Session, list[Task]]]:
        """The session and its task list under its workspace's lock (SessionLock.locked)."""
        return self._lock.locked(session_id, expected_head)

    def held_here(self, session: Session) -> bool:
        return self.core.held_here(session)

    def check_held(self, session: Session) -> None:
        self.core.check_held(session)

    def layers(self, session: Session) -> list[Layer]:
        return self.core.layers(session)

    def layer(self, kind: str, path: str, identity: list | None = None,
              track: bool = True) -> Layer:
        return self.core.layer(kind, path, identity, track)

    def recorded_spec(self, session: Session, layers: list[Layer],
                      container_spec: dict | None = None) -> str:
        return self.core.recorded_spec(session, layers, container_spec)

    def checkpoint_record(self, checkpoint_id: str) -> Checkpoint:
        return self.core.checkpoint_record(checkpoint_id)

    def usable(self, checkpoint_id: str) -> Checkpoint:
        return self.core.usable(checkpoint_id)

    # -- checkpoints (checkpoint.py) -------------------------------------------------------
    def checkpoint(self, session_id: str, *, label: str = "", reasoning: str = "",
                   trace_id: str = "", messages_json: str = "", state_json: str = "",
                   expected_head: str = "", resume_json: str = "",
                   warnings: tuple[str, ...] | list[str] = ()) -> Checkpoint:
        return self._checkpoints.checkpoint(
            session_id, label=label, reasoning=reasoning, trace_id=trace_id,
            messages_json=messages_json, state_json=state_json, expected_head=expected_head,
            resume_json=resume_json, warnings=warnings)

    def warn_next_checkpoint(self, session_id: str, text: str) -> None:
        self._checkpoints.warn_next(session_id, text)

    # -- restores (restore.py, recovery.py) ------------------------------------------------
    def restore(self, session_id: str, checkpoint_id: str, *, acknowledge: bool = False,
                dry_run: bool = False, expected_head: str = "",
                from_other_session: bool = False, paths: list[str] | None = None
                ) -> RestoreResult:
        return self._restores.restore(
            session_id, checkpoint_id, acknowledge=acknowledge, dry_run=dry_run,
            expected_head=expected_head, from_other_session=from_other_session, paths=paths)

    def resolve(self, session_id: str, complete: bool) -> Session:
        return self._recovery.resolve(session_id, complete)

    def recover(self) -> list[str]:
        return self._recovery.recover()

    # -- forks (fork.py) -------------------------------------------------------------------
    def fork(self, checkpoint_id: str, workspace: str = "", name: str = "",
             volumes: str = "", agent: Agent | None = None) -> ForkResult:
        return self._forks.fork(checkpoint_id, workspace, name, volumes, agent)

    def fork_origin(self, session_id: str) -> tuple[str, str] | None:
        return self._forks.origin(session_id)

    def fork_remounted(self, session_id: str, identity: list[int]) -> None:
        self._forks.remounted(session_id, identity)

    # -- containers (hold.py, images.py) ---------------------------------------------------
    def require_engine(self) -> Engine:
        return self.core.require_engine()

    def labels(self, session_id: str) -> dict[str, str]:
        return self.core.labels(session_id)

    def container_spec(self, session: Session) -> dict:
        return self._hold.container_spec(session)

    def start_container(self, container: str, workspace: str) -> None:
        self._hold.start(container, workspace)

    def container_started(self, container: str, session_id: str) -> None:
        self._hold.container_started(container, session_id)

    def export_image(self, checkpoint_id: str) -> tuple[str, str]:
        return images.export_image(self.core, self._hold, checkpoint_id)

    # -- reads (reads.py) ------------------------------------------------------------------
    def view(self, checkpoint_id: str) -> CheckpointView:
        return self._reads.view(checkpoint_id)

    def diff(self, from_id: str, to_id: str, patch: bool = False
             ) -> tuple[Diff, Diff | None, str]:
        return self._reads.diff(from_id, to_id, patch)

    def path_history(self, session_id: str, path: str, patch: bool = False
                     ) -> list[history.PathChange]:
        return self._reads.path_history(session_id, path, patch)

    def read_file(self, checkpoint_id: str, path: str, offset: int = 0, length: int = 0
                  ) -> tuple[bytes, int, str]:
        return self._reads.read_file(checkpoint_id, path, offset, length)

    def side_effects_since(self, head_id: str, target_id: str) -> list[ToolCall]:
        return side_effects_since(self.store, head_id, target_id)
