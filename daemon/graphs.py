"""Graphs: a framework's graph checkpoints kept beside the world they ran in.

A LangGraph thread is bound to a worldline session at its first checkpoint (its
workspace given by the client, or a new folder under the data root). Each graph
checkpoint of the thread's root namespace also records a world checkpoint of that
session, so the files and container can be restored or forked to any graph step;
subgraph namespaces are steps inside a root step and record graph state only.
Copying a thread forks its session. Deleting a thread, its runs or pruning it
removes graph records only: the world's history stays, as everywhere in worldline,
until retention and gc decide otherwise; every deletion is in the audit log.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import replace

from worldline.wire.errors import AlreadyExists, InvalidArgument, NotFound

from . import ids
from .records import AuditEvent
from .storage.graph_checkpoints import (
    GraphBlob,
    GraphCheckpoint,
    GraphQuery,
    GraphStore,
    GraphWrite,
)
from .validate import MAX_TEXT, check_text, load_json
from .world import World

PAGE = 100
STRATEGIES = ("keep_latest", "delete")


def _check_key(thread_id: str, ns: str, checkpoint_id: str = "", need_id: bool = False) -> None:
    if not thread_id:
        raise InvalidArgument("a thread id is required")
    if need_id and not checkpoint_id:
        raise InvalidArgument("a checkpoint id is required")
    for what, text in (("thread id", thread_id), ("checkpoint namespace", ns),
                       ("checkpoint id", checkpoint_id)):
        check_text(what, text)
        if "\0" in text:
            raise InvalidArgument(f"the {what} holds a NUL character")


class Graphs:
    def __init__(self, world: World, store: GraphStore) -> None:
        self.world = world
        self.store = store
        self._bind_lock = threading.Lock()

    # -- threads -------------------------------------------------------------------------
    def thread(self, thread_id: str) -> tuple[str, str]:
        """(session id, workspace) of a bound thread."""
        _check_key(thread_id, "")
        sid = self.store.thread_session(thread_id)
        if sid is None:
            raise NotFound(f"thread {thread_id} has no checkpoints")
        return sid, self.world.store.get_session(sid).workspace

    def _session_for(self, thread_id: str, workspace: str) -> str:
        sid = self.store.thread_session(thread_id)
        if sid is not None:
            return sid
        with self._bind_lock:  # one session per thread, even when its first puts race
            sid = self.store.thread_session(thread_id)
            if sid is not None:
                return sid
            name = f"langgraph thread {thread_id}"[:MAX_TEXT]
            session = (self.world.create_session(workspace, name=name) if workspace
                       else self.world.create_session_in_own_folder(name))
            return self.store.bind_thread(thread_id, session.id)

    # -- checkpoints and writes ----------------------------------------------------------
    def put(self, cp: GraphCheckpoint, blobs: list[GraphBlob], workspace: str,
            record_world: bool) -> tuple[str, str]:
        """Store a graph checkpoint; returns (world checkpoint id or "", session id)."""
        _check_key(cp.thread_id, cp.ns, cp.checkpoint_id, need_id=True)
        metadata = load_json(cp.metadata_json or "{}", "metadata", dict, "a JSON object")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in cp.versions.items()):
            raise InvalidArgument("versions must map channel names to version strings")
        for b in blobs:
            if (b.thread_id, b.ns) != (cp.thread_id, cp.ns):
                raise InvalidArgument("a blob belongs to another thread or namespace")
        sid = self._session_for(cp.thread_id, workspace)
        world_id = None
        if record_world:
            step = metadata.get("step", "")
            world_id = self.world.checkpoint(
                sid, label=check_text("label", f"langgraph step {step}"[:200]),
                trace_id=cp.checkpoint_id[:200]).id
        self.store.put_checkpoint(replace(cp, world_checkpoint_id=world_id,
                                          created_at=ids.now()), blobs)
        return world_id or "", sid

    def put_writes(self, thread_id: str, ns: str, checkpoint_id: str,
                   writes: list[GraphWrite]) -> None:
        _check_key(thread_id, ns, checkpoint_id, need_id=True)
        for w in writes:
            if (w.thread_id, w.ns, w.checkpoint_id) != (thread_id, ns, checkpoint_id):
                raise InvalidArgument("a write belongs to another checkpoint")
            check_text("task id", w.task_id)
        self.store.put_writes(writes)

    def get(self, thread_id: str, ns: str, checkpoint_id: str = ""):
        """The tuple (checkpoint, blobs, writes), or None."""
        _check_key(thread_id, ns, checkpoint_id)
        found = self.store.checkpoints(GraphQuery(thread_id, ns, checkpoint_id or None, limit=1))
        return self._tuple(found[0]) if found else None

    def list(self, query: GraphQuery) -> tuple[list, bool]:
        """A page of tuples and whether another may follow."""
        if query.thread_id is not None:
            _check_key(query.thread_id, query.ns or "")
        if not 0 <= query.limit <= PAGE:
            raise InvalidArgument(f"a page holds at most {PAGE} checkpoints")
        query = replace(query, limit=query.limit or PAGE)
        found = self.store.checkpoints(query)
        return [self._tuple(cp) for cp in found], len(found) == query.limit

    def _tuple(self, cp: GraphCheckpoint):
        return (cp, self.store.blobs(cp.thread_id, cp.ns, cp.versions),
                self.store.writes(cp.thread_id, cp.ns, cp.checkpoint_id))

    # -- deletion and copies -------------------------------------------------------------
    def delete_thread(self, thread_id: str) -> int:
        _check_key(thread_id, "")
        n = self.store.delete_threads([thread_id])
        self._audit("graph.thread_deleted", thread_id, {"checkpoints": n})
        return n

    def delete_runs(self, run_ids: Sequence[str]) -> int:
        for run in run_ids:
            check_text("run id", run)
        n = self.store.delete_runs(run_ids) if run_ids else 0
        if n:
            self._audit("graph.runs_deleted", "", {"runs": list(run_ids), "checkpoints": n})
        return n

    def prune(self, thread_ids: Sequence[str], strategy: str) -> int:
        if strategy not in STRATEGIES:
            raise InvalidArgument(f"strategy {strategy!r}: use one of {', '.join(STRATEGIES)}")
        for thread in thread_ids:
            _check_key(thread, "")
        if not thread_ids:
            return 0
        n = (self.store.keep_latest(thread_ids) if strategy == "keep_latest"
             else self.store.delete_threads(thread_ids))
        self._audit("graph.pruned", "", {"threads": list(thread_ids), "strategy": strategy,
                                         "checkpoints": n})
        return n

    def copy_thread(self, source: str, target: str) -> tuple[str, str]:
        """Fork the source thread's session and copy its graph records; returns the
        target's (session id, workspace)."""
        _check_key(source, "")
        _check_key(target, "")
        sid = self.store.thread_session(source)
        if sid is None:
            raise NotFound(f"thread {source} has no checkpoints")
        with self._bind_lock:
            if self.store.thread_session(target) is not None:
                raise AlreadyExists(f"thread {target} already exists")
            head = self.world.store.get_session(sid).head
            fork = self.world.fork(head, name=f"langgraph thread {target}"[:MAX_TEXT])
            self.store.bind_thread(target, fork.session.id)
        n = self.store.copy_thread(source, target)
        self._audit("graph.thread_copied", source, {"target": target, "checkpoints": n,
                                                    "session": fork.session.id})
        return fork.session.id, fork.session.workspace

    def _audit(self, kind: str, subject: str, detail: dict) -> None:
        sid = self.store.thread_session(subject) if subject else None
        self.world.store.append_audit([AuditEvent(kind, sid, subject or "-",
                                                  json.loads(json.dumps(detail)), ids.now())])
