"""Agent-side helpers and the asyncio client, through a real daemon."""

from __future__ import annotations

import asyncio
import threading

import pytest
from worldline.client import (
    ApprovalDenied,
    AsyncClient,
    DeadlineExceeded,
    guarded,
    recorded,
    require_approval,
)


def test_recorded_records_then_checkpoints(client, workspace):
    s = client.create_session(str(workspace))

    @recorded(s)
    def write_file(path: str, text: str) -> dict:
        (workspace / path).write_text(text)
        return {"bytes": len(text)}

    @recorded(s, name="shell")
    def explode(command: str) -> None:
        (workspace / "half-done").write_text("partial")
        raise RuntimeError("boom")

    assert write_file("a.txt", "hello") == {"bytes": 5}
    with pytest.raises(RuntimeError):
        explode("make")
    calls = client.tool_calls(s.id)
    assert [(c.name, c.args) for c in calls] == [
        ("write_file", {"path": "a.txt", "text": "hello"}), ("shell", {"command": "make"})]
    assert calls[0].result == {"bytes": 5} and "boom" in calls[1].result["error"]
    log = s.log()
    assert [cp.label for cp in log[-2:]] == ["after write_file", "after shell (failed)"]
    assert client.diff(log[0].id, log[-1].id).added == ["a.txt", "half-done"]


def test_guarded_restores_on_error(client, workspace):
    (workspace / "keep.txt").write_text("original")
    s = client.create_session(str(workspace))
    with pytest.raises(ValueError):
        with guarded(s, label="risky"):
            (workspace / "keep.txt").write_text("mangled")
            (workspace / "junk").write_text("junk")
            raise ValueError("the refactor went wrong")
    assert (workspace / "keep.txt").read_text() == "original"
    assert not (workspace / "junk").exists()
    with guarded(s):  # no error: nothing restored
        (workspace / "keep.txt").write_text("improved")
    assert (workspace / "keep.txt").read_text() == "improved"


def test_guarded_respects_side_effects(client, workspace):
    s = client.create_session(str(workspace))
    with pytest.raises(KeyError) as err:
        with guarded(s):
            (workspace / "f").write_text("x")
            s.record_tool_call("send_email", {"to": "ops"})
            raise KeyError("later failure")
    assert any("could not restore" in n for n in err.value.__notes__)
    assert (workspace / "f").exists()  # left as the block left it


def test_require_approval(client, workspace):
    s = client.create_session(str(workspace))
    threading.Timer(0.3, lambda: client.decide_approval(
        client.list_approvals(session_id=s.id, status="pending")[0].id, True, "go")).start()
    assert require_approval(s, "deploy", {"env": "prod"}, timeout=20).status == "approved"
    threading.Timer(0.3, lambda: client.decide_approval(
        client.list_approvals(session_id=s.id, status="pending")[0].id, False,
        "not today")).start()
    with pytest.raises(ApprovalDenied) as denied:
        require_approval(s, "deploy", timeout=20)
    assert denied.value.approval.reason == "not today"
    with pytest.raises(DeadlineExceeded):
        require_approval(s, "deploy", timeout=0.3)


def test_async_client(daemon, workspace):
    async def scenario():
        async with AsyncClient(daemon.address) as c:
            s = await c.create_session(str(workspace))
            (workspace / "x").write_text("1")
            cps = await asyncio.gather(*[c.checkpoint(s.id, label=f"{i}") for i in range(4)])
            assert len({cp.id for cp in cps}) == 4
            (workspace / "x").write_text("2")
            await s.checkpoint()
            await s.restore(cps[0].id)
            return [cp.kind for cp in await s.log()]

    kinds = asyncio.run(scenario())
    assert kinds[-1] == "restore" and kinds.count("checkpoint") == 5
