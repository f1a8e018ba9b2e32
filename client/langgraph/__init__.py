"""``WorldlineSaver``: a LangGraph checkpointer backed by the worldline daemon.

Each LangGraph thread is a worldline session. Every checkpoint of the thread's
root namespace also checkpoints the session's world (its workspace folder and
container), so a graph step can be restored or forked together with the files the
agent wrote; ``copy_thread`` forks the session. Channel values and writes are
serialized here, with the saver's serializer, and kept by the daemon as opaque
bytes.

    from worldline.langgraph import WorldlineSaver
    graph = builder.compile(checkpointer=WorldlineSaver(workspace="/path/to/repo"))

Both the blocking methods (``put``, ``get_tuple``, ``list``...) and the asyncio
ones (``aput``, ``aget_tuple``, ``alist``...) call the daemon directly: the async
ones over a ``grpc.aio`` channel, never through a thread pool.

``migrations`` (a ``StateMigrations`` or ``{from_version: function}``) upgrade the
graph's state (the root namespace's channel values) of checkpoints written in an
older schema when they are read; see docs/state-migrations.md.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

import grpc
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol
from worldline.client.channel import mapped, open_channel
from worldline.client.config import default_address
from worldline.client.migrations import SCHEMA_KEY, Migration, StateMigrations
from worldline.v1 import worldline_pb2 as pb
from worldline.v1 import worldline_pb2_grpc as pb_grpc

__all__ = ["WorldlineSaver"]

PAGE = 100
EMPTY = "empty"  # the type of a channel's blob when the channel holds no value

Workspace = str | Callable[[str], str | None] | None
# Marks the version of a channel's value that a migration made (``_upgrade``); the next
# ``put`` stores it.
MIGRATED = ".!"


class WorldlineSaver(BaseCheckpointSaver[str]):
    """A LangGraph ``BaseCheckpointSaver`` on the worldline daemon at ``address``
    (default: ``$WORLDLINE_ADDRESS`` or the default socket).

    ``workspace`` is the folder a new thread's session captures: a path, or a
    function of the thread id returning one; None (or a function returning None)
    gives each thread a new empty folder under the daemon's data root.

    ``migrations``: the schema of the graph's state. The root namespace's checkpoints
    are stored with its current version, and one written in an older version reads
    (``get_tuple``, ``list`` and their async twins) with its channel values upgraded,
    oldest step first: each step takes and returns the dict of channel values.
    The stored checkpoint is not changed; the next ``put`` stores the upgraded values."""

    def __init__(self, address: str | None = None, *, workspace: Workspace = None,
                 serde: SerializerProtocol | None = None, timeout: float = 60.0,
                 token: str | None = None, tls_ca: str | None = None,
                 migrations: StateMigrations | dict[int, Migration] | None = None) -> None:
        super().__init__(serde=serde)
        self.migrations = StateMigrations.of(migrations)
        self.address = address or default_address()
        self.timeout = timeout
        self._workspace = workspace
        self._token, self._tls_ca = token, tls_ca
        self._channel = open_channel(self.address, token, tls_ca)
        self._stub = pb_grpc.GraphsStub(self._channel)
        self._aio: tuple[asyncio.AbstractEventLoop, Any, pb_grpc.GraphsStub] | None = None

    # -- plumbing ------------------------------------------------------------------------
    def _call(self, method: str, request):
        try:
            return getattr(self._stub, method)(request, timeout=self.timeout)
        except grpc.RpcError as exc:
            raise mapped(exc, self.address) from None

    async def _acall(self, method: str, request):
        loop = asyncio.get_running_loop()
        if self._aio is None or self._aio[0] is not loop:
            channel = open_channel(self.address, self._token, self._tls_ca, aio=True)
            self._aio = (loop, channel, pb_grpc.GraphsStub(channel))
        try:
            return await getattr(self._aio[2], method)(request, timeout=self.timeout)
        except grpc.RpcError as exc:
            raise mapped(exc, self.address) from None

    def close(self) -> None:
        self._channel.close()

    async def aclose(self) -> None:
        if self._aio is not None:
            await self._aio[1].close()
            self._aio = None
        self.close()

    def __enter__(self) -> WorldlineSaver:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    async def __aenter__(self) -> WorldlineSaver:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    # -- versions ------------------------------------------------------------------------
    def get_next_version(self, current: str | int | None, channel: None = None) -> str:
        """Monotonic string versions, ``<counter>.<random>`` as LangGraph's own savers
        make them, so concurrent branches never collide."""
        if current is None:
            n = 0
        elif isinstance(current, int):
            n = current
        else:
            n = int(current.split(".")[0])
        return f"{n + 1:032}.{random.random():016}"

    # -- requests and replies ------------------------------------------------------------
    def _typed(self, value: Any) -> pb.TypedValue:
        type_, data = self.serde.dumps_typed(value)
        return pb.TypedValue(type=type_, data=data)

    def _value(self, typed: pb.TypedValue) -> Any:
        return self.serde.loads_typed((typed.type, typed.data))

    def _workspace_for(self, thread_id: str) -> str:
        ws = self._workspace(thread_id) if callable(self._workspace) else self._workspace
        return ws or ""

    def _put_request(self, config: RunnableConfig, checkpoint: Checkpoint,
                     metadata: CheckpointMetadata,
                     new_versions: ChannelVersions) -> pb.PutGraphCheckpointRequest:
        conf = config["configurable"]
        thread_id, ns = str(conf["thread_id"]), conf.get("checkpoint_ns", "")
        body = dict(checkpoint)
        values = body.pop("channel_values", None) or {}
        if self.migrations is not None and ns == "":
            body[SCHEMA_KEY] = self.migrations.current
        # Values a migration made (on the read this checkpoint comes from) are stored
        # with it though the graph did not write them: they are new to the daemon.
        migrated = {ch: v for ch, v in checkpoint["channel_versions"].items()
                    if ch in values and ch not in new_versions and MIGRATED in str(v)}
        blobs = [pb.GraphBlob(channel=ch, version=str(v),
                              value=self._typed(values[ch]) if ch in values
                              else pb.TypedValue(type=EMPTY))
                 for ch, v in {**new_versions, **migrated}.items()]
        versions = {ch: str(v) for ch, v in checkpoint["channel_versions"].items()}
        return pb.PutGraphCheckpointRequest(
            checkpoint=pb.GraphCheckpoint(
                thread_id=thread_id, checkpoint_ns=ns, checkpoint_id=checkpoint["id"],
                parent_id=conf.get("checkpoint_id") or "", checkpoint=self._typed(body),
                metadata_json=json.dumps(get_checkpoint_metadata(config, metadata),
                                         ensure_ascii=False, default=str),
                versions_json=json.dumps(versions)),
            blobs=blobs, workspace=self._workspace_for(thread_id), record_world=ns == "")

    @staticmethod
    def _stored(config: RunnableConfig, checkpoint: Checkpoint) -> RunnableConfig:
        conf = config["configurable"]
        return {"configurable": {"thread_id": conf["thread_id"],
                                 "checkpoint_ns": conf.get("checkpoint_ns", ""),
                                 "checkpoint_id": checkpoint["id"]}}

    def _writes_request(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                        task_id: str, task_path: str) -> pb.PutGraphWritesRequest:
        conf = config["configurable"]
        return pb.PutGraphWritesRequest(
            thread_id=str(conf["thread_id"]), checkpoint_ns=conf.get("checkpoint_ns", ""),
            checkpoint_id=conf["checkpoint_id"],
            writes=[pb.GraphWrite(task_id=task_id, idx=WRITES_IDX_MAP.get(channel, idx),
                                  channel=channel, value=self._typed(value),
                                  task_path=task_path)
                    for idx, (channel, value) in enumerate(writes)])

    @staticmethod
    def _get_request(config: RunnableConfig) -> pb.GetGraphCheckpointRequest:
        conf = config["configurable"]
        return pb.GetGraphCheckpointRequest(
            thread_id=str(conf["thread_id"]), checkpoint_ns=conf.get("checkpoint_ns", ""),
            checkpoint_id=get_checkpoint_id(config) or "")

    def _tuple(self, t: pb.GraphTuple) -> CheckpointTuple:
        c = t.checkpoint
        checkpoint = self._value(c.checkpoint)
        version = checkpoint.pop(SCHEMA_KEY, None)
        checkpoint["channel_values"] = {b.channel: self._value(b.value) for b in t.blobs
                                        if b.value.type != EMPTY}
        if self.migrations is not None and c.checkpoint_ns == "":
            self._upgrade(checkpoint, version, c.checkpoint_id)

        def conf(checkpoint_id: str) -> RunnableConfig:
            return {"configurable": {"thread_id": c.thread_id, "checkpoint_ns": c.checkpoint_ns,
                                     "checkpoint_id": checkpoint_id}}

        return CheckpointTuple(
            config=conf(c.checkpoint_id), checkpoint=checkpoint,
            metadata=json.loads(c.metadata_json),
            parent_config=conf(c.parent_id) if c.parent_id else None,
            pending_writes=[(w.task_id, w.channel, self._value(w.value)) for w in t.writes])

    def _upgrade(self, checkpoint: Checkpoint, version: int | None, checkpoint_id: str) -> None:
        """Bring the checkpoint's channel values to the current schema, in place. The
        channels a step dropped lose their versions, and each value it left gets a
        version of its own, so the next put stores the state as upgraded: the stored
        version with "!" after its counter (so it sorts below it, and no node that had
        read the stored one runs again), the schema and this checkpoint's id (a value
        made from another checkpoint's state, or for another schema, is another)."""
        m, before = self.migrations, checkpoint["channel_values"]
        state = dict(before) if version is None else {**before, m.key: version}
        after = m.upgrade(state, checkpoint_id)
        if after is state:
            return
        after.pop(m.key, None)
        versions = checkpoint["channel_versions"] = dict(checkpoint["channel_versions"])
        for ch in before.keys() - after.keys():
            versions.pop(ch, None)
        for ch in after:
            head, _, tail = str(versions.get(ch, "0" * 32)).partition(".")
            versions[ch] = f"{head}{MIGRATED}{tail}!{m.current}!{checkpoint_id}"
        checkpoint["channel_values"] = after

    @staticmethod
    def _list_request(config: RunnableConfig | None, filter: dict[str, Any] | None,
                      before: RunnableConfig | None) -> pb.ListGraphCheckpointsRequest:
        conf = (config or {}).get("configurable", {})
        ns = conf.get("checkpoint_ns")
        return pb.ListGraphCheckpointsRequest(
            any_thread="thread_id" not in conf, thread_id=str(conf.get("thread_id", "")),
            any_namespace=ns is None, checkpoint_ns=ns or "",
            checkpoint_id=(get_checkpoint_id(config) if config else None) or "",
            before_id=(get_checkpoint_id(before) if before else None) or "",
            filter_json=json.dumps(filter or {}, default=str))

    @staticmethod
    def _next_page(request: pb.ListGraphCheckpointsRequest, reply, limit: int | None,
                   returned: int) -> bool:
        """Point ``request`` at the page after ``reply``; False when the listing is done."""
        if not reply.more or not reply.tuples or (limit is not None and returned >= limit):
            return False
        last = reply.tuples[-1].checkpoint
        request.after.CopyFrom(pb.GraphCursor(checkpoint_id=last.checkpoint_id,
                                              thread_id=last.thread_id,
                                              checkpoint_ns=last.checkpoint_ns))
        return True

    @staticmethod
    def _page_size(limit: int | None, returned: int) -> int:
        return PAGE if limit is None else max(0, min(PAGE, limit - returned))

    # -- the blocking API ----------------------------------------------------------------
    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        self._call("PutGraphCheckpoint",
                   self._put_request(config, checkpoint, metadata, new_versions))
        return self._stored(config, checkpoint)

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                   task_id: str, task_path: str = "") -> None:
        self._call("PutGraphWrites", self._writes_request(config, writes, task_id, task_path))

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        reply = self._call("GetGraphCheckpoint", self._get_request(config))
        return self._tuple(reply.tuple) if reply.found else None

    def list(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
             before: RunnableConfig | None = None,
             limit: int | None = None) -> Iterator[CheckpointTuple]:
        request, returned = self._list_request(config, filter, before), 0
        while (size := self._page_size(limit, returned)) > 0:
            request.limit = size
            reply = self._call("ListGraphCheckpoints", request)
            for t in reply.tuples:
                yield self._tuple(t)
            returned += len(reply.tuples)
            if not self._next_page(request, reply, limit, returned):
                return

    def delete_thread(self, thread_id: str) -> None:
        self._call("DeleteGraphThread", pb.DeleteGraphThreadRequest(thread_id=str(thread_id)))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self._call("DeleteGraphRuns", pb.DeleteGraphRunsRequest(run_ids=[str(r) for r in run_ids]))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._call("CopyGraphThread", pb.CopyGraphThreadRequest(
            source_thread_id=str(source_thread_id), target_thread_id=str(target_thread_id)))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self._call("PruneGraphThreads", pb.PruneGraphThreadsRequest(
            thread_ids=[str(t) for t in thread_ids], strategy=strategy))

    # -- the asyncio API -----------------------------------------------------------------
    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint,
                   metadata: CheckpointMetadata, new_versions: ChannelVersions) -> RunnableConfig:
        await self._acall("PutGraphCheckpoint",
                          self._put_request(config, checkpoint, metadata, new_versions))
        return self._stored(config, checkpoint)

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                          task_id: str, task_path: str = "") -> None:
        await self._acall("PutGraphWrites",
                          self._writes_request(config, writes, task_id, task_path))

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        reply = await self._acall("GetGraphCheckpoint", self._get_request(config))
        return self._tuple(reply.tuple) if reply.found else None

    async def alist(self, config: RunnableConfig | None, *,
                    filter: dict[str, Any] | None = None, before: RunnableConfig | None = None,
                    limit: int | None = None) -> AsyncIterator[CheckpointTuple]:
        request, returned = self._list_request(config, filter, before), 0
        while (size := self._page_size(limit, returned)) > 0:
            request.limit = size
            reply = await self._acall("ListGraphCheckpoints", request)
            for t in reply.tuples:
                yield self._tuple(t)
            returned += len(reply.tuples)
            if not self._next_page(request, reply, limit, returned):
                return

    async def adelete_thread(self, thread_id: str) -> None:
        await self._acall("DeleteGraphThread",
                          pb.DeleteGraphThreadRequest(thread_id=str(thread_id)))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self._acall("DeleteGraphRuns",
                          pb.DeleteGraphRunsRequest(run_ids=[str(r) for r in run_ids]))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._acall("CopyGraphThread", pb.CopyGraphThreadRequest(
            source_thread_id=str(source_thread_id), target_thread_id=str(target_thread_id)))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await self._acall("PruneGraphThreads", pb.PruneGraphThreadsRequest(
            thread_ids=[str(t) for t in thread_ids], strategy=strategy))

    # -- the world behind a thread -------------------------------------------------------
    def thread_session(self, thread_id: str) -> tuple[str, str]:
        """(session id, workspace) of the thread's world, for the worldline client and CLI
        (``worldline log SESSION``, ``restore``, ``fork``)."""
        reply = self._call("GetGraphThread", pb.GetGraphThreadRequest(thread_id=str(thread_id)))
        return reply.session_id, reply.workspace

    def world_checkpoint(self, config: RunnableConfig) -> str | None:
        """The world checkpoint recorded with a graph checkpoint of the root namespace
        (None for subgraph namespaces): restore or fork it to bring back the files."""
        reply = self._call("GetGraphCheckpoint", self._get_request(config))
        return (reply.tuple.checkpoint.world_checkpoint_id or None) if reply.found else None
