"""Approvals and events people notice (issue 58, item 6): `worldline approvals watch` and
`worldline audit --follow`, typed as a person types them (plain and --json), against a
real daemon; the client's ``watch_audit``; an allowed user's follow shows its own
sessions' events only; the daemon logs a line per approval requested."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
import time

import pytest
from worldline.client import InvalidArgument

from .conftest import WORLDLINE, DaemonProcess
from .fidelity import AGENT_UID, in_child_as
from .test_gateway_limits import _ask, _connected, _gateway, place  # noqa: F401 -- a fixture


def _ctrl_c_default() -> None:
    """Ctrl-C as a terminal gives it: a suite started in the background of a shell
    without job control inherits SIGINT ignored, and a Python started so never raises
    KeyboardInterrupt (the follow's usual end would then never come)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Follow:
    """A following command's stdout, line by line, as it comes (a thread reads it)."""

    def __init__(self, args: list[str], prefix: list[str] | None = None,
                 env: dict | None = None) -> None:
        self.proc = subprocess.Popen((prefix or []) + WORLDLINE + args, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env,
                                     cwd=os.path.dirname(os.path.dirname(__file__)),
                                     preexec_fn=_ctrl_c_default)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def next(self, timeout: float = 10.0) -> str:
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no line within {timeout} s (exit {self.proc.poll()},"
                                 f" stderr so far unread)") from None

    def until(self, pred, timeout: float = 10.0) -> list[str]:
        """The lines up to and with the first for which ``pred`` holds."""
        seen, deadline = [], time.monotonic() + timeout
        while True:
            seen.append(self.next(max(0.0, deadline - time.monotonic())))
            if pred(seen[-1]):
                return seen

    def stop(self) -> tuple[int, str]:
        """Ctrl-C: its exit status and stderr."""
        self.proc.send_signal(signal.SIGINT)
        try:
            code = self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        return code, self.proc.stderr.read()


def test_approvals_watch_prints_the_pending_then_each_request_within_a_second(tmp_path):
    d = DaemonProcess(tmp_path / "root", env={"WORLDLINE_LOG_LEVEL": "INFO"}).start()
    ws = tmp_path / "ws"
    ws.mkdir()
    try:
        with d.client() as c:
            s = c.create_session(str(ws))
            waiting = c.request_approval(s.id, "deploy", {"env": "staging"})
            watch = Follow(["approvals", "watch", "--session", s.id, "--json",
                            "--address", d.address])
            plain = Follow(["approvals", "watch", "--address", d.address])
            try:
                first = json.loads(watch.next())  # the pending one, first
                assert first["event"] == "pending" and first["id"] == waiting.id
                assert first["args"] == {"env": "staging"} and first["expires_at"]
                line = plain.next()
                assert waiting.id in line and "pending" in line and "deploy" in line
                asked = c.request_approval(s.id, "push", {"branch": "main"})
                at = time.monotonic()
                got = json.loads(watch.next(timeout=5))
                assert time.monotonic() - at < 1.0, "the request took over a second to show"
                assert got["event"] == "requested" and got["id"] == asked.id
                assert got["tool"] == "push" and got["status"] == "pending"
                line = plain.until(lambda line: asked.id in line)[-1]
                assert "requested" in line and "push" in line
                assert f"worldline approve {asked.id}" in line
                c.decide_approval(asked.id, approve=False, reason="not on a Sunday")
                got = json.loads(watch.next())
                assert (got["event"], got["id"], got["status"]) == ("denied", asked.id,
                                                                    "denied")
                line = plain.until(lambda line: "denied" in line)[-1]
                assert asked.id in line and "not on a Sunday" in line
                # an approval expires when it is next read: the watch reads it when due
                short = c.request_approval(s.id, "wait", ttl=1)
                assert json.loads(watch.next())["id"] == short.id
                got = json.loads(watch.next(timeout=5))
                assert (got["event"], got["id"], got["status"]) == ("expired", short.id,
                                                                    "expired")
            finally:
                for f in (watch, plain):
                    code, err = f.stop()
                    assert code == 0 and "Traceback" not in err, err
    finally:
        d.stop()
    log = d.log.read_text()
    assert f"approval {waiting.id} requested for 'deploy'" in log
    assert f"worldline approve {asked.id}" in log


def test_audit_follow_prints_events_as_they_come(client, daemon, workspace):
    s = client.create_session(str(workspace))
    follow = Follow(["audit", "--follow", "--session", s.id, "--json", "--limit", "1",
                     "--address", daemon.address])
    plain = Follow(["audit", "-f", "--session", s.id, "--kind", "checkpoint", "--limit", "1",
                    "--address", daemon.address])
    try:
        last = json.loads(follow.next())  # --limit 1: the newest event first
        assert last["kind"] == "checkpoint" and last["session_id"] == s.id
        assert s.head in plain.next()  # the first checkpoint's: it follows from here on
        (workspace / "a.txt").write_text("a\n")
        cp = s.checkpoint(label="one")
        call = s.record_tool_call("shell", {"command": "ls"}, effect="read_only")
        kinds = []
        for _ in range(2):
            e = json.loads(follow.next())
            assert e["session_id"] == s.id and e["seq"] > last["seq"]
            kinds.append((e["kind"], e["subject_id"]))
            last = e
        assert kinds == [("checkpoint", cp.id), ("tool_call", call.id)]
        line = plain.next()
        assert "  checkpoint  " in line and cp.id in line and s.id in line
    finally:
        for f in (follow, plain):
            code, err = f.stop()
            assert code == 0 and "Traceback" not in err, err
    # an unknown kind is refused, as `audit --kind` refuses it
    res = daemon.cli("audit", "--follow", "--kind", "nonsense", check=False)
    assert res.returncode == 1 and "INVALID_ARGUMENT" in res.stderr


def test_the_clients_watch_audit_yields_each_new_event(client, workspace):
    s = client.create_session(str(workspace))
    _, cursor = client.wait_audit(-1)
    threading.Timer(0.3, lambda: s.checkpoint(label="later")).start()
    started = time.monotonic()
    event = next(client.watch_audit(after_seq=cursor, kinds=["checkpoint"], session_id=s.id,
                                    until=started + 10))
    assert event.kind == "checkpoint" and event.session_id == s.id
    assert time.monotonic() - started < 2.0  # woke for it, not at the poll's end
    assert list(client.watch_audit(kinds=["checkpoint"], session_id=s.id,
                                   until=time.monotonic() + 0.3)) == []
    with pytest.raises(InvalidArgument):
        client.wait_audit(cursor, kinds=["no.such.kind"], timeout=0)


def _as_agent(d: DaemonProcess, method: str, request: dict) -> dict:
    """One call as uid 1000, through the JSON gateway: its answer."""
    def call() -> dict:
        with _connected(_gateway(d)) as sock:
            return _ask(sock, method, request)
    return in_child_as(AGENT_UID, call)


def test_an_allowed_users_follow_shows_only_its_own_sessions_events(place):  # noqa: F811
    d, ws, theirs = place
    env = {**os.environ, "HOME": "/nonexistent", "PYTHONDONTWRITEBYTECODE": "1"}
    follow = Follow(["audit", "--follow", "--json", "--address", d.address],
                    prefix=["setpriv", f"--reuid={AGENT_UID}", f"--regid={AGENT_UID}",
                            "--clear-groups"], env=env)
    try:
        sid = _as_agent(d, "CreateSession", {"workspace": str(ws)})["response"]["id"]
        with d.client() as owner:
            def both() -> str:
                """A checkpoint of the owner's, then one of the agent's: the agent's."""
                owner.checkpoint(theirs.id, label="the owner's")
                return _as_agent(d, "CreateCheckpoint", {"session_id": sid})["response"]["id"]
            for _ in range(40):  # until the follow (a fresh interpreter) has started
                both()
                try:
                    first = follow.next(timeout=0.5)
                    break
                except AssertionError:
                    continue
            else:
                raise AssertionError("the agent's follow printed nothing in 20 s")
            last = both()  # the follow is at the log's end: the owner's is passed over
            seen = [first] + follow.until(lambda line: last in line)
        events = [json.loads(line) for line in seen]
        assert {e["session_id"] for e in events} == {sid}, events
        assert not any(theirs.id in line for line in seen)
    finally:
        code, err = follow.stop()
    assert code == 0 and "Traceback" not in err, err

    # asking for the owner's session by name is refused; the audit log itself is the owner's
    def probe() -> dict:
        with _connected(_gateway(d)) as sock:
            return {"theirs": _ask(sock, "WaitAudit", {"after_seq": 0,
                                                       "session_id": theirs.id}),
                    "list": _ask(sock, "ListAudit", {})}
    got = in_child_as(AGENT_UID, probe)
    assert got["theirs"]["error"]["code"] == "PERMISSION_DENIED", got
    assert got["list"]["error"]["code"] == "PERMISSION_DENIED", got
