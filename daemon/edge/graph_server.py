"""The gRPC edge of graphs: translation between messages and graph records only."""

from __future__ import annotations

import json

from worldline.v1 import worldline_pb2 as pb
from worldline.v1 import worldline_pb2_grpc as pb_grpc
from worldline.wire.errors import InvalidArgument

from ..graphs import Graphs
from ..storage.graph_checkpoints import GraphBlob, GraphCheckpoint, GraphQuery, GraphWrite, Typed
from ..validate import load_json


def _typed(v: pb.TypedValue) -> Typed:
    return Typed(v.type, v.data)


def _typed_pb(t: Typed) -> pb.TypedValue:
    return pb.TypedValue(type=t.type, data=t.data)


def graph_checkpoint_pb(cp: GraphCheckpoint) -> pb.GraphCheckpoint:
    return pb.GraphCheckpoint(
        thread_id=cp.thread_id, checkpoint_ns=cp.ns, checkpoint_id=cp.checkpoint_id,
        parent_id=cp.parent_id or "", checkpoint=_typed_pb(cp.checkpoint),
        metadata_json=cp.metadata_json, versions_json=json.dumps(cp.versions),
        world_checkpoint_id=cp.world_checkpoint_id or "", created_at=cp.created_at)


def graph_tuple_pb(found) -> pb.GraphTuple:
    cp, blobs, writes = found
    return pb.GraphTuple(
        checkpoint=graph_checkpoint_pb(cp),
        blobs=[pb.GraphBlob(channel=b.channel, version=b.version, value=_typed_pb(b.value))
               for b in blobs],
        writes=[pb.GraphWrite(task_id=w.task_id, idx=w.idx, channel=w.channel,
                              value=_typed_pb(w.value), task_path=w.task_path) for w in writes])


class GraphsServicer(pb_grpc.GraphsServicer):
    def __init__(self, graphs: Graphs) -> None:
        self.graphs = graphs

    def PutGraphCheckpoint(self, r, context):
        c = r.checkpoint
        versions = load_json(c.versions_json or "{}", "versions", dict, "a JSON object")
        cp = GraphCheckpoint(c.thread_id, c.checkpoint_ns, c.checkpoint_id, c.parent_id or None,
                             _typed(c.checkpoint), c.metadata_json or "{}", versions, None, "")
        blobs = [GraphBlob(c.thread_id, c.checkpoint_ns, b.channel, b.version, _typed(b.value))
                 for b in r.blobs]
        world_id, sid = self.graphs.put(cp, blobs, r.workspace, r.record_world)
        return pb.PutGraphCheckpointResponse(world_checkpoint_id=world_id, session_id=sid)

    def PutGraphWrites(self, r, context):
        self.graphs.put_writes(r.thread_id, r.checkpoint_ns, r.checkpoint_id, [
            GraphWrite(r.thread_id, r.checkpoint_ns, r.checkpoint_id, w.task_id, w.idx,
                       w.channel, _typed(w.value), w.task_path) for w in r.writes])
        return pb.PutGraphWritesResponse()

    def GetGraphCheckpoint(self, r, context):
        found = self.graphs.get(r.thread_id, r.checkpoint_ns, r.checkpoint_id)
        if found is None:
            return pb.GetGraphCheckpointResponse(found=False)
        return pb.GetGraphCheckpointResponse(found=True, tuple=graph_tuple_pb(found))

    def ListGraphCheckpoints(self, r, context):
        wanted = load_json(r.filter_json or "{}", "filter", dict, "a JSON object")
        after = None
        if r.HasField("after"):
            if not r.after.checkpoint_id:
                raise InvalidArgument("a page cursor needs a checkpoint id")
            after = (r.after.checkpoint_id, r.after.thread_id, r.after.checkpoint_ns)
        tuples, more = self.graphs.list(GraphQuery(
            thread_id=None if r.any_thread else r.thread_id,
            ns=None if r.any_namespace else r.checkpoint_ns,
            checkpoint_id=r.checkpoint_id or None, before_id=r.before_id or None,
            filter=wanted, limit=r.limit, after=after))
        return pb.ListGraphCheckpointsResponse(tuples=[graph_tuple_pb(t) for t in tuples],
                                               more=more)

    def DeleteGraphThread(self, r, context):
        return pb.DeleteGraphResponse(checkpoints_deleted=self.graphs.delete_thread(r.thread_id))

    def DeleteGraphRuns(self, r, context):
        return pb.DeleteGraphResponse(checkpoints_deleted=self.graphs.delete_runs(list(r.run_ids)))

    def PruneGraphThreads(self, r, context):
        return pb.DeleteGraphResponse(checkpoints_deleted=self.graphs.prune(
            list(r.thread_ids), r.strategy or "keep_latest"))

    def CopyGraphThread(self, r, context):
        sid, workspace = self.graphs.copy_thread(r.source_thread_id, r.target_thread_id)
        return pb.GraphThread(thread_id=r.target_thread_id, session_id=sid, workspace=workspace)

    def GetGraphThread(self, r, context):
        sid, workspace = self.graphs.thread(r.thread_id)
        return pb.GraphThread(thread_id=r.thread_id, session_id=sid, workspace=workspace)
