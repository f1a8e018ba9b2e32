"""Side effects, replay safety, approval gates, tasks and the audit log, through a
real daemon."""

from __future__ import annotations

import subprocess
import threading
import time

import pytest
from worldline.client import FailedPrecondition, InvalidArgument

from .conftest import WORLDLINE, DaemonProcess

POLICY = """
[[tool]]
match = "deploy"
effect = "external_non_idempotent"
require_approval = true

[[command]]
match = "git push*"
effect = "external_non_idempotent"
require_approval = true
"""


@pytest.fixture
def gated(tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    d = DaemonProcess(tmp_path / "root", extra=["--policy", str(policy)]).start()
    yield d
    d.stop()


def test_restore_over_side_effects_needs_acknowledgement(client, workspace):
    (workspace / "f").write_text("v1")
    s = client.create_session(str(workspace))
    cp = s.checkpoint()
    read = s.record_tool_call("read_file", {"path": "f"})
    push = s.record_tool_call("bash", {"command": "git push origin main"})
    assert (read.effect, push.effect) == ("read_only", "external_non_idempotent")
    assert push.checkpoint_id == cp.id
    (workspace / "f").write_text("v2")
    s.checkpoint()
    dry = s.restore(cp.id, dry_run=True)
    assert [e.tool_call_id for e in dry.side_effects] == [push.id]
    with pytest.raises(FailedPrecondition):
        s.restore(cp.id)
    assert (workspace / "f").read_text() == "v2"  # refused: nothing changed
    r = s.restore(cp.id, acknowledge_side_effects=True)
    assert (workspace / "f").read_text() == "v1"
    assert r.checkpoint.acknowledged_side_effects == [push.id]
    kinds = [e.kind for e in client.audit(session_id=s.id)]
    assert "side_effects.acknowledge" in kinds
    # a side effect before the target is not reported
    assert s.restore(s.log()[-1].id).side_effects == []


def test_fork_reports_side_effects_after_the_fork_point(client, workspace):
    s = client.create_session(str(workspace))
    cp = s.checkpoint()
    s.record_tool_call("send_email", {"to": "boss"})
    f = s.fork(cp.id)
    assert [e.tool for e in f.side_effects] == ["send_email"]


def test_replay_by_idempotency_key_after_restore(client, workspace):
    s = client.create_session(str(workspace))
    cp = s.checkpoint()
    first = s.record_tool_call("charge_card", {"amount": 10}, result={"charge": "ch_1"},
                               idempotency_key="order-42")
    assert not first.replayed
    s.checkpoint()
    s.restore(cp.id, acknowledge_side_effects=True)
    again = s.record_tool_call("charge_card", {"amount": 10}, idempotency_key="order-42")
    assert again.replayed and again.id == first.id and again.result == {"charge": "ch_1"}
    assert len(client.tool_calls(s.id)) == 1
    # another session's keys are its own
    other = client.fork(cp.id)
    assert not other.record_tool_call("charge_card", idempotency_key="order-42").replayed


def test_tasks_resume_point_and_restore(client, workspace):
    s = client.create_session(str(workspace))
    s.set_task("plan", "completed", title="Plan")
    s.set_task("impl", "in_progress", title="Implement")
    s.set_task("impl.a", "completed", title="Part A", parent="impl")
    s.set_task("impl.b", "pending", title="Part B", parent="impl")
    s.set_task("docs", "skipped", title="Docs")
    tasks, resume = s.tasks()
    assert [t.id for t in tasks] == ["plan", "impl", "impl.a", "impl.b", "docs"]
    assert resume == "impl"
    cp = s.checkpoint()
    s.set_task("impl", "completed")
    s.set_task("impl.b", "completed")
    assert s.tasks()[1] is None
    s.restore(cp.id)
    tasks, resume = s.tasks()
    assert resume == "impl" and {t.id: t.status for t in tasks}["impl.b"] == "pending"
    assert [t.id for t in client.show(cp.id).tasks][:2] == ["plan", "impl"]


def test_denied_approval(gated, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    with gated.client() as c:
        s = c.create_session(str(ws))
        a = s.request_approval("deploy", {"env": "prod"})
        assert a.status == "pending" and a.checkpoint_id == c.get_session(s.id).head
        assert [x.id for x in c.list_approvals(status="pending")] == [a.id]
        threading.Timer(0.3, lambda: gated.cli("deny", a.id, "--reason", "not on friday")).start()
        decided = c.wait_approval(a.id, timeout=20)
        assert decided.status == "denied" and decided.reason == "not on friday"
        with pytest.raises(FailedPrecondition):
            s.record_tool_call("deploy", {"env": "prod"}, approval_id=a.id)
        with pytest.raises(FailedPrecondition):
            c.decide_approval(a.id, approve=True)


def test_gated_tool_needs_approved_approval(gated, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    with gated.client() as c:
        s = c.create_session(str(ws))
        with pytest.raises(FailedPrecondition):
            s.record_tool_call("deploy", {})
        with pytest.raises(FailedPrecondition):
            s.record_tool_call("bash", {"command": "git push origin"})
        a = s.request_approval("deploy")
        c.decide_approval(a.id, approve=True, reason="ship it")
        call = s.record_tool_call("deploy", {}, approval_id=a.id)
        assert call.effect == "external_non_idempotent" and call.approval_id == a.id
        with pytest.raises(InvalidArgument):
            c.decide_approval(s.request_approval("deploy").id, approve=False, reason="")


def test_cli_wait_exit_codes(gated, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    s = gated.cli_json("session", "create", "--workspace", str(ws))
    expired = gated.cli("approval", "request", s["id"], "deploy", "--ttl", "0.5", "--wait", "10",
                        "--json", check=False)
    assert expired.returncode == 4
    import json
    assert json.loads(expired.stdout)["status"] == "expired"
    timed_out = gated.cli("approval", "request", s["id"], "deploy", "--wait", "0.5", "--json",
                          check=False)
    assert timed_out.returncode == 4 and json.loads(timed_out.stdout)["status"] == "pending"
    pending_id = json.loads(timed_out.stdout)["id"]
    threading.Timer(0.5, lambda: gated.cli("approve", pending_id)).start()
    with gated.client() as c:
        assert c.wait_approval(pending_id, timeout=20).status == "approved"
    req = subprocess.Popen(WORLDLINE + ["approval", "request", s["id"], "deploy", "--wait", "30",
                                        "--json", "--address", gated.address],
                           stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        pending = gated.cli_json("approvals", "list", "--status", "pending")
        if pending:
            break
        time.sleep(0.1)
    gated.cli("approve", pending[0]["id"], "--reason", "ok")
    out, _ = req.communicate(timeout=30)
    assert req.returncode == 0 and json.loads(out)["status"] == "approved"


def test_pending_approval_survives_restart(gated, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    with gated.client() as c:
        s = c.create_session(str(ws))
        a = s.request_approval("deploy", ttl=600)
    gated.stop()
    gated.start()
    with gated.client() as c:
        assert c.get_approval(a.id).status == "pending"
        c.decide_approval(a.id, approve=True, reason="after restart")
        assert c.wait_approval(a.id, timeout=1).status == "approved"


def test_malformed_policy_stops_the_start(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[[tool]]\nmatch = 'x'\neffect = 'sometimes'\n")
    res = subprocess.run(WORLDLINE + ["daemon", "--root", str(tmp_path / "r"), "--policy",
                                      str(bad)], capture_output=True, text=True, timeout=30)
    assert res.returncode != 0 and "effect" in res.stderr and "bad.toml" in res.stderr


def test_policy_explain_cli(daemon):
    d = daemon.cli_json("policy", "explain", "bash", "--args",
                        '{"command": "terraform destroy"}')
    assert d["effect"] == "external_non_idempotent" and "terraform" in d["rule"]


def test_audit_log_is_chained(client, workspace):
    s = client.create_session(str(workspace))
    s.checkpoint()
    s.record_tool_call("bash", {"command": "ls"})
    events = client.audit(session_id=s.id)
    assert [e.kind for e in events][:3] == ["session.create", "checkpoint", "checkpoint"]
    assert client.verify_audit()["ok"]
