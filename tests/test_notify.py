"""--notify URL: a JSON POST for each event a person must hear of, to a receiver on
127.0.0.1; retried with back-off when the receiver fails; never holding a checkpoint
back when it hangs."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from worldline.v1 import worldline_pb2 as pb

from .conftest import DaemonProcess


class Receiver:
    """An HTTP endpoint on 127.0.0.1 that keeps what it is sent; ``fail`` answers 500 that
    many times first; ``hang`` holds every request that long before answering."""

    def __init__(self, fail: int = 0, hang: float = 0.0) -> None:
        self.got: list[dict] = []
        self.tries = 0
        self.fail, self.hang = fail, hang
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.tries += 1
                if outer.hang:
                    time.sleep(outer.hang)
                if outer.fail > 0:
                    outer.fail -= 1
                    self.send_response(500)
                    self.end_headers()
                    return
                outer.got.append(json.loads(body))
                self.send_response(204)
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_for(self, event: str, timeout: float = 15.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for m in self.got:
                if m["event"] == event:
                    return m
            time.sleep(0.05)
        raise AssertionError(f"no {event} in {self.got}")

    def close(self) -> None:
        self.server.shutdown()


@contextlib.contextmanager
def notifying(tmp_path, receiver: Receiver):
    """A daemon posting to ``receiver``, a client of it and a session: (client, session)."""
    d = DaemonProcess(tmp_path / "root", extra=["--notify", receiver.url]).start()
    try:
        ws = tmp_path / "ws"
        ws.mkdir()
        with d.client() as c:
            yield c, c.create_session(str(ws))
    finally:
        d.stop()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def test_approvals_and_bypasses_are_posted_as_they_happen(tmp_path, receiver):
    with notifying(tmp_path, receiver) as (c, s):
        a = c.request_approval(s.id, "deploy", {"env": "prod"})
        m = receiver.wait_for("approval_requested")
        assert m["session_id"] == s.id and m["subject_id"] == a.id
        assert "deploy" in m["text"] and f"worldline approve {a.id}" in m["text"]
        c.decide_approval(a.id, approve=False, reason="not on a Friday")
        m = receiver.wait_for("approval_decided")
        assert m["subject_id"] == a.id and "not on a Friday" in m["text"]
        call = c._call("RecordToolCall", pb.RecordToolCallRequest(  # as the hook does
            session_id=s.id, name="Bash", args_json='{"command": "git push"}',
            gate="bypassed"))
        m = receiver.wait_for("gate_bypassed")
        assert m["session_id"] == s.id and m["subject_id"] == call.id
        c.checkpoint(s.id)
        time.sleep(1.5)  # nothing else was sent: a checkpoint is no event of its own
        assert [m["event"] for m in receiver.got] == [
            "approval_requested", "approval_decided", "gate_bypassed"]


def test_a_failing_receiver_gets_the_event_again_until_it_takes_it(tmp_path):
    receiver = Receiver(fail=2)
    try:
        with notifying(tmp_path, receiver) as (c, s):
            c.request_approval(s.id, "deploy")
            receiver.wait_for("approval_requested", timeout=20)  # after 1 s, 2 s back-off
            assert receiver.tries == 3 and len(receiver.got) == 1
    finally:
        receiver.close()


def test_a_receiver_that_hangs_holds_no_checkpoint_back(tmp_path):
    receiver = Receiver(hang=4.0)
    try:
        with notifying(tmp_path, receiver) as (c, s):
            for i in range(3):
                c.request_approval(s.id, f"deploy-{i}")
            time.sleep(1.0)  # the first POST is now held by the receiver
            started = time.monotonic()
            ws = tmp_path / "ws"
            for i in range(10):
                (ws / "f.txt").write_text(f"{i}\n")
                c.checkpoint(s.id)
            assert time.monotonic() - started < 3.0
            receiver.hang = 0.0
            deadline = time.monotonic() + 30
            while len(receiver.got) < 3 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert [m["detail"]["tool"] for m in receiver.got] == [
                "deploy-0", "deploy-1", "deploy-2"]
    finally:
        receiver.close()


def test_a_notify_url_that_is_not_http_is_refused_at_start(tmp_path):
    d = DaemonProcess(tmp_path / "root", extra=["--notify", "file:///etc/passwd"])
    with pytest.raises(RuntimeError, match="--notify"):
        d.start()


def test_an_event_whose_time_is_earlier_than_the_last_ones_is_still_posted(tmp_path,
                                                                          receiver):
    """An event's time is taken before its transaction (on a fleet, by its host's clock):
    the log may hold a later seq with an earlier time. The watcher follows the seq."""
    from worldline.daemon.notify import Notifier
    from worldline.daemon.records import AuditEvent
    from worldline.daemon.storage.sqlite_store import SqliteStore

    store = SqliteStore(str(tmp_path / "meta.db"))
    notifier = Notifier(store, receiver.url, poll=0.05)
    notifier.start()
    try:
        store.append_audit([AuditEvent("approval.request", "s1", "a1", {"tool": "deploy"},
                                       created_at="2026-11-29T07:00:02.000000Z")])
        receiver.wait_for("approval_requested")
        store.append_audit([AuditEvent("gate_bypassed", "s2", "t2", {},
                                       created_at="2026-11-29T07:00:01.000000Z")])
        m = receiver.wait_for("gate_bypassed", timeout=5.0)
        assert m["subject_id"] == "t2"
        assert [x["subject_id"] for x in receiver.got] == ["a1", "t2"]
    finally:
        notifier.stop()
        store.close()


def test_the_agents_words_in_the_text_are_neither_mentions_nor_links_nor_lines():
    """A tool's name and a denial's reason are the agent's: in `text`, which Slack-compatible
    receivers show, `<!channel>` and `<URL|label>` are escaped, and a newline is a space."""
    from worldline.daemon.notify import message
    from worldline.daemon.records import AuditEvent

    m = message(AuditEvent("approval.denied", "s1", "a1",
                           {"reason": "no <!channel>\n<https://evil.example|approve> & go"},
                           created_at="2026-11-29T07:00:00.000000Z", seq=3))
    assert "<" not in m["text"] and ">" not in m["text"] and "\n" not in m["text"]
    assert "&lt;!channel&gt;" in m["text"] and " &amp; go" in m["text"]
    assert m["detail"]["reason"].startswith("no <!channel>")  # the detail as recorded
