"""Bad input gets a clear error with the right status, and changes nothing."""

from __future__ import annotations

import json
import os
import subprocess

import grpc
import pytest
from worldline.client import (
    Aborted,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
)
from worldline.client.errors import DataLoss
from worldline.daemon import ids
from worldline.daemon.capture.trees import decode
from worldline.v1 import worldline_pb2 as pb
from worldline.v1 import worldline_pb2_grpc as pb_grpc

from .conftest import WORLDLINE


def test_unknown_and_malformed_ids(client, workspace):
    s = client.create_session(str(workspace))
    with pytest.raises(NotFound):
        client.get_session(ids.new_id())
    with pytest.raises(NotFound):
        client.show(ids.new_id())
    with pytest.raises(NotFound):
        s.restore(ids.new_id())
    with pytest.raises(NotFound):
        client.diff(s.head, ids.new_id())
    with pytest.raises(NotFound):
        client.fork(ids.new_id())
    for bad in ("", "not-an-id", "../../etc", "0" * 200):
        with pytest.raises(InvalidArgument):
            client.show(bad)
        with pytest.raises(InvalidArgument):
            client.get_session(bad)


def test_invalid_json_changes_nothing(client, workspace):
    s = client.create_session(str(workspace))
    head = client.get_session(s.id).head
    for state in ("{not json", "[1, 2]", '"a string"'):
        with pytest.raises(InvalidArgument):
            client.checkpoint_raw(s.id, state_json=state)
    for messages in ("nope", '{"role": "user"}', '[{"content": "no role"}]', "[1]"):
        with pytest.raises(InvalidArgument):
            client.checkpoint_raw(s.id, messages_json=messages)
    with pytest.raises(InvalidArgument):
        client.record_tool_call_raw(s.id, "bash", args_json="{oops")
    assert client.get_session(s.id).head == head
    assert len(s.log()) == 1


def test_oversized_state_is_refused(client, workspace):
    s = client.create_session(str(workspace))
    huge = json.dumps({"blob": "x" * (17 << 20)})
    with pytest.raises(ResourceExhausted):
        client.checkpoint_raw(s.id, state_json=huge)
    too_big_for_the_wire = json.dumps({"blob": "x" * (65 << 20)})
    with pytest.raises(ResourceExhausted):
        client.checkpoint_raw(s.id, state_json=too_big_for_the_wire)
    assert len(s.log()) == 1


def test_workspace_paths_are_checked(daemon, client, workspace, tmp_path, monkeypatch):
    from worldline.v1 import worldline_pb2 as pb
    with pytest.raises(InvalidArgument):  # the daemon has no working folder to resolve it
        client._call("CreateSession", pb.CreateSessionRequest(workspace="relative/path"))
    monkeypatch.chdir(tmp_path)  # the client resolves it against the caller's
    with pytest.raises(NotFound, match=str(tmp_path / "relative" / "path")):
        client.create_session("relative/path")
    with pytest.raises(NotFound):
        client.create_session(str(tmp_path / "missing"))
    with pytest.raises(InvalidArgument):
        client.create_session(str(daemon.root))  # the data root itself
    with pytest.raises(InvalidArgument):
        client.create_session(str(daemon.root.parent))  # a folder holding the data root
    with pytest.raises(InvalidArgument):
        client.create_session("/")
    link = tmp_path / "link-to-ws"
    os.symlink(workspace, link)
    with pytest.raises(InvalidArgument):
        client.create_session(str(link))
    s = client.create_session(str(workspace))
    with pytest.raises(InvalidArgument):
        client._call("Fork", pb.ForkRequest(checkpoint_id=s.head, workspace="relative"))
    with pytest.raises(InvalidArgument):
        s.fork(s.head, workspace=str(daemon.root / "blobs"))


def test_expected_head_compare_and_set(client, workspace):
    s = client.create_session(str(workspace))
    first = s.head
    s.checkpoint()
    with pytest.raises(Aborted):
        client.checkpoint(s.id, expected_head=first)
    with pytest.raises(Aborted):
        client.restore(s.id, first, expected_head=first)


def test_hostile_tree_names_are_refused():
    for name in ("..", ".", "", "a/b", "x\0y"):
        data = json.dumps([[name, "f", 420, "0" * 64, 0]]).encode()
        with pytest.raises(DataLoss):
            decode(data)


def test_unknown_task_status_and_effect(client, workspace):
    s = client.create_session(str(workspace))
    with pytest.raises(InvalidArgument):
        s.set_task("t", "done")
    with pytest.raises(InvalidArgument):
        s.record_tool_call("bash", effect="dangerous")
    with pytest.raises(InvalidArgument):
        s.set_task("child", "pending", parent="no-such-task")


def test_second_daemon_refuses_to_start(daemon):
    res = subprocess.run(WORLDLINE + ["daemon", "--root", str(daemon.root)],
                         capture_output=True, text=True, timeout=30)
    assert res.returncode != 0
    assert "another worldline daemon" in res.stderr
    with daemon.client() as c:  # the first one still serves
        c.list_sessions()


def test_second_daemon_on_same_socket_other_root(daemon, tmp_path):
    res = subprocess.run(WORLDLINE + ["daemon", "--root", str(tmp_path / "other"),
                                      "--listen", daemon.address],
                         capture_output=True, text=True, timeout=30)
    assert res.returncode != 0 and "another worldline daemon" in res.stderr
    with daemon.client() as c:
        c.list_sessions()


def test_unreachable_daemon_is_unavailable(tmp_path):
    from worldline.client import Client, Unavailable
    with Client(f"unix://{tmp_path}/nothing.sock", timeout=3) as c, pytest.raises(Unavailable):
        c.list_sessions()


def test_socket_is_owner_only(daemon):
    sock = daemon.root / "worldline.sock"
    assert oct(sock.stat().st_mode & 0o777) == oct(0o600)
    assert oct(daemon.root.stat().st_mode & 0o777) == oct(0o700)


def test_health_and_reflection(daemon):
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
    with grpc.insecure_channel(daemon.address) as ch:
        reply = health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service="worldline.v1.Worldline"), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        responses = stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5)
        names = {s.name for r in responses for s in r.list_services_response.service}
        assert "worldline.v1.Worldline" in names


def test_raw_grpc_status_codes(daemon):
    with grpc.insecure_channel(daemon.address) as ch:
        stub = pb_grpc.WorldlineStub(ch)
        with pytest.raises(grpc.RpcError) as err:
            stub.GetSession(pb.GetSessionRequest(session_id=ids.new_id()), timeout=5)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.RpcError) as err:
            stub.CreateCheckpoint(pb.CheckpointRequest(session_id="bad"), timeout=5)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_sigterm_stops_cleanly(fresh_daemon):
    fresh_daemon.start()
    assert fresh_daemon.stop() == 0
    assert not (fresh_daemon.root / "worldline.sock").exists()
    fresh_daemon.start()  # and a restart serves the same history
    with fresh_daemon.client() as c:
        assert c.list_sessions() == []


def test_history_survives_restart(fresh_daemon, workspace):
    fresh_daemon.start()
    with fresh_daemon.client() as c:
        s = c.create_session(str(workspace))
        (workspace / "f").write_text("v1")
        cp = s.checkpoint(messages=[{"role": "user", "content": "hi"}])
    fresh_daemon.kill()
    fresh_daemon.start()
    with fresh_daemon.client() as c:
        (workspace / "f").write_text("v2")
        c.restore(s.id, cp.id)
        assert (workspace / "f").read_text() == "v1"
        assert c.show(cp.id).messages == [{"role": "user", "content": "hi"}]
        assert c.fsck()["ok"]


def test_failed_precondition_is_importable():
    assert FailedPrecondition.code == "FAILED_PRECONDITION"
