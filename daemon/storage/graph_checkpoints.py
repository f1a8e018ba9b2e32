"""The GraphStore contract: the checkpoints, channel values and pending writes of agent
frameworks that keep their own graph state (LangGraph), beside the world's records.
The daemon's Graphs service (graphs.py, edge/graph_server.py) is its one caller; the
client's LangGraph saver (worldline.langgraph) reaches it through that service.

- Terms: a *thread* holds graph checkpoints in *namespaces* ("" is the root); a
  checkpoint is known by (thread, namespace, checkpoint id). Its channel values are
  *blobs* keyed by (thread, namespace, channel, version) and shared by every
  checkpoint naming that version; *writes* are keyed by (thread, namespace,
  checkpoint id, task id, index). A thread is *bound* to one session, once.
- Values are opaque ``Typed`` bytes: the framework's serializer runs in the client.
- ``put_checkpoint`` replaces a checkpoint with the same key (frameworks re-put);
  blobs are inserted when absent. ``put_writes``: a write with a negative index (a
  special channel: error, interrupt) replaces the one with its key, any other is
  inserted only when absent, so a retried task never doubles its writes.
- Order: ``checkpoints`` lists newest first by (checkpoint id, thread, namespace);
  ``after`` resumes after a key of a previous page, ``before_id`` keeps ids lower
  than it, ``filter`` keeps checkpoints whose metadata has every key equal.
- Deleting checkpoints deletes their writes and every blob no remaining checkpoint
  of the same thread and namespace names.
- Errors: none of its own. Unknown keys read as nothing and delete nothing; binding
  a thread that is bound keeps the first binding and reports it.
- Lifecycle: a thread is bound to its session when first written (``bind_thread``);
  its checkpoints are deleted with their threads or runs, pruned to the newest of each
  namespace (``keep_latest``), or copied to a fork's thread (``copy_thread``). Each
  method is one transaction. The store is opened once by the daemon beside its
  ``Store`` (storage/config.py) and closed at its stop.

Implementations (graph_store.py): ``MemoryGraphStore`` (the reference),
``SqliteGraphStore`` and ``PostgresGraphStore`` (one ``SqlGraphStore`` of statements);
tests/test_graph_store_contract.py runs against each.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class Typed:
    type: str
    data: bytes


@dataclass(frozen=True)
class GraphCheckpoint:
    thread_id: str
    ns: str
    checkpoint_id: str
    parent_id: str | None
    checkpoint: Typed
    metadata_json: str
    versions: dict[str, str]
    world_checkpoint_id: str | None
    created_at: str

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.thread_id, self.ns, self.checkpoint_id)

    @property
    def order(self) -> tuple[str, str, str]:
        return (self.checkpoint_id, self.thread_id, self.ns)

    @property
    def metadata(self) -> dict:
        return json.loads(self.metadata_json)

    @property
    def run_id(self) -> str | None:
        run = self.metadata.get("run_id")
        return None if run is None else str(run)


@dataclass(frozen=True)
class GraphBlob:
    thread_id: str
    ns: str
    channel: str
    version: str
    value: Typed


@dataclass(frozen=True)
class GraphWrite:
    thread_id: str
    ns: str
    checkpoint_id: str
    task_id: str
    idx: int
    channel: str
    value: Typed
    task_path: str = ""


@dataclass(frozen=True)
class GraphQuery:
    thread_id: str | None = None  # None: every thread
    ns: str | None = None  # None: every namespace
    checkpoint_id: str | None = None
    before_id: str | None = None
    filter: dict = field(default_factory=dict)
    limit: int = 100
    after: tuple[str, str, str] | None = None  # (checkpoint id, thread, namespace)


def matches(metadata: dict, wanted: dict) -> bool:
    return all(k in metadata and metadata[k] == v for k, v in wanted.items())


class GraphStore(Protocol):
    """Graph checkpoints by thread; the module's docstring is the contract."""

    def bind_thread(self, thread_id: str, session_id: str) -> str:
        """Bind the thread to the session unless it is bound; returns its session."""
    def thread_session(self, thread_id: str) -> str | None: ...

    def put_checkpoint(self, cp: GraphCheckpoint, blobs: list[GraphBlob]) -> None: ...
    def put_writes(self, writes: list[GraphWrite]) -> None: ...

    def checkpoints(self, query: GraphQuery) -> list[GraphCheckpoint]: ...
    def blobs(self, thread_id: str, ns: str, versions: dict[str, str]) -> list[GraphBlob]: ...
    def writes(self, thread_id: str, ns: str, checkpoint_id: str) -> list[GraphWrite]: ...

    def delete_threads(self, thread_ids: Collection[str]) -> int:
        """Delete every checkpoint of these threads; returns how many."""
    def delete_runs(self, run_ids: Collection[str]) -> int:
        """Delete every checkpoint whose metadata ``run_id`` is one of these."""
    def keep_latest(self, thread_ids: Collection[str]) -> int:
        """Delete all but the newest checkpoint of each namespace of these threads."""
    def copy_thread(self, source: str, target: str) -> int:
        """Copy every checkpoint, blob and write of ``source`` into ``target``."""

    def close(self) -> None: ...
