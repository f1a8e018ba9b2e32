"""The daemon's edge shared fairly with a hostile agent user (issue 57, findings 2-5).

A daemon of root's with ``--allow-uid 1000``; the agent's side runs as uid 1000 (a
forked child, raw sockets, or a fresh interpreter where it needs gRPC). Each test is
one of the probe's findings: idle connections that took every slot of the gateway,
lines buffered without bound, a request nested too deep for the parser, errors that
named the owner's session to the agent, and approvals reused for other arguments.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path

import pytest
from worldline.client import Client
from worldline.wire import frames as wire

from .conftest import DaemonProcess, unmount_below
from .fidelity import AGENT_UID, in_child_as, in_fresh_child_as

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching uids needs root")


@pytest.fixture
def place(request):
    """base/ (0711): the daemon's root (``--allow-uid 1000`` and the test's indirect
    parameter), the agent's folder agent/ws (uid 1000's), the owner's folder owner/ with
    a session and a checkpoint. Yields (daemon, agent's ws, owner's session)."""
    base = Path(tempfile.mkdtemp(prefix="wl-limits-"))
    os.chmod(base, 0o711)
    ws = base / "agent" / "ws"
    ws.mkdir(parents=True)
    for p in (ws.parent, ws):
        os.chown(p, AGENT_UID, AGENT_UID)
    (base / "owner").mkdir()
    (base / "owner" / "plan.txt").write_text("the owner's\n")
    d = DaemonProcess(base / "root", extra=["--allow-uid", str(AGENT_UID),
                                            *getattr(request, "param", ())]).start()
    try:
        with d.client() as owner:
            theirs = owner.create_session(str(base / "owner"))
            theirs.checkpoint()
        yield d, ws, theirs
    finally:
        d.stop()
        unmount_below(base)
        shutil.rmtree(base, ignore_errors=True)


def _gateway(d: DaemonProcess) -> str:
    return f"{d.root}/worldline.sock.json"


def _read_line(sock: socket.socket) -> bytes:
    got = b""
    while not got.endswith(b"\n"):
        chunk = sock.recv(1 << 16)
        if not chunk:
            break
        got += chunk
    return got


def _ask(sock: socket.socket, method: str, request: dict | None = None) -> dict:
    """One call as a JSON line (the hooks' form) on an open connection: its answer."""
    sock.sendall(json.dumps({"method": method, "request": request or {}}).encode() + b"\n")
    return json.loads(_read_line(sock))


def _connected(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(20)
    sock.connect(path)
    return sock


def _rss(pid: int) -> int:
    """A process's resident memory, in bytes (/proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


class _Held:
    """A child of uid 1000 that opens connections and holds them until the test lets
    go: ``opened`` says how many each path took. ``feed(i, sock)``, if given, writes
    to each connection what it should hold (non-blocking: as much as the daemon reads)
    for up to ``feed_seconds``."""

    def __init__(self, paths: dict[str, int], feed=None, feed_seconds: float = 0.0):
        ready_r, ready_w = os.pipe()
        self._go_r, self._go_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            try:
                os.close(ready_r)
                os.close(self._go_w)
                resource.setrlimit(resource.RLIMIT_NOFILE, (8192, 8192))
                os.setgroups([])
                os.setgid(AGENT_UID)
                os.setuid(AGENT_UID)
                socks, opened = [], {}
                for path, count in paths.items():
                    opened[path] = 0
                    for _ in range(count):
                        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                        s.settimeout(5)
                        try:
                            s.connect(path)
                            opened[path] += 1
                            socks.append(s)
                        except OSError:
                            s.close()
                if feed is not None:
                    _feed_all(socks, feed, feed_seconds)
                os.write(ready_w, json.dumps(opened).encode())
                os.close(ready_w)
                os.read(self._go_r, 1)  # held until the test lets go
            finally:
                os._exit(0)
        os.close(ready_w)
        os.close(self._go_r)
        with os.fdopen(ready_r, "rb") as f:
            self.opened = json.loads(f.read() or b"{}")

    def release(self) -> None:
        os.close(self._go_w)
        os.waitpid(self.pid, 0)


def _feed_all(socks: list[socket.socket], feed, seconds: float) -> None:
    """Write each socket's bytes without blocking, round after round, until all is
    written or ``seconds`` pass: ``feed(i)`` gives socket i's first bytes and how many
    zero bytes follow them."""
    zeros = memoryview(bytes(1 << 20))
    left = []
    for i, s in enumerate(socks):
        s.setblocking(False)
        head, count = feed(i)
        left.append([memoryview(head), count])
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(len(h) or n for h, n in left):
        moved = 0
        for i, s in enumerate(socks):
            head, count = left[i]
            data = head if len(head) else zeros[:min(count, len(zeros))]
            if not len(data):
                continue
            try:
                sent = s.send(data)
            except BlockingIOError:
                continue
            except OSError:
                left[i] = [memoryview(b""), 0]
                continue
            if len(head):
                left[i][0] = head[sent:]
            else:
                left[i][1] = count - sent
            moved += sent
        if not moved:
            time.sleep(0.05)


def _timed(fn) -> float:
    start = time.monotonic()
    fn()
    return time.monotonic() - start


# -- finding 2: one agent user shut the gateway for everyone ------------------------------

def test_1030_idle_connections_of_an_agent_leave_the_owner_its_checkpoints(place):
    """uid 1000 opens 1,030 connections to the gateway and 1,030 to the relay and sends
    nothing: it keeps its share (--connections-per-uid, 64), the rest are refused at
    once. The owner's checkpoint through the gateway (frames), a hook's JSON line, and
    the owner's checkpoint through gRPC each complete in under a second. (0.7.38: the
    agent's connections took the gateway's 1,024, the owner's client was UNAVAILABLE.)"""
    d, _, theirs = place
    held = _Held({_gateway(d): 1030, f"{d.root}/worldline.sock.shared": 1030})
    try:
        assert held.opened[_gateway(d)] >= 64, held.opened
        with Client(d.address, transport="frames") as frames, \
                Client(d.address, transport="grpc") as grpc_client:
            assert _timed(lambda: frames.checkpoint(theirs.id)) < 1.0
            assert _timed(lambda: grpc_client.checkpoint(theirs.id)) < 1.0
            with _connected(_gateway(d)) as hook:
                took = _timed(lambda: _ask(hook, "GetSession", {"session_id": theirs.id}))
                assert took < 1.0
        # the agent still has its share: one more of its connections is answered so
        refused = in_child_as(AGENT_UID, lambda: _first_answer(_gateway(d)))
        assert refused["error"]["code"] == "RESOURCE_EXHAUSTED", refused
    finally:
        held.release()
    with d.client() as owner:
        assert len(owner.log(theirs.id)) == 4  # made, the fixture's, these two


def _first_answer(path: str) -> dict:
    with _connected(path) as s:
        return json.loads(_read_line(s))


def _wait_for_approvals(address: str, ws: str, waits: int) -> dict:
    """The agent's side of the test below (gRPC through the relay): a session, an
    approval request, and ``waits`` threads waiting on it at once for 8 seconds; how
    their calls ended."""
    import concurrent.futures

    with Client(address + ".shared", transport="grpc") as c:
        s = c.create_session(ws)
        approval = c.request_approval(s.id, "deploy").id

        def wait(_):
            try:
                c.wait_approval(approval, timeout=8.0)
                return "ok"
            except Exception as exc:  # noqa: BLE001 -- counted by name
                return type(exc).__name__

        with concurrent.futures.ThreadPoolExecutor(waits) as pool:
            outcomes = list(pool.map(wait, range(waits)))
    return {name: outcomes.count(name) for name in set(outcomes)}


def test_an_agents_waiting_calls_leave_the_owner_grpc_workers(place):
    """uid 1000 keeps 40 WaitApproval calls under way over gRPC: it is given its share
    of the server's workers (--calls-per-uid, 8) and the rest are RESOURCE_EXHAUSTED
    at once; the owner's gRPC checkpoint meanwhile completes in under a second. (0.7.38:
    the agent's waits held all 32 workers; the owner's call waited for them.)"""
    d, ws, theirs = place
    got: dict = {}
    agent = threading.Thread(target=lambda: got.update(out=in_fresh_child_as(
        AGENT_UID, _wait_for_approvals, d.address, str(ws), 40)))
    agent.start()
    try:
        with d.client() as owner:
            deadline = time.monotonic() + 30
            while not owner.list_approvals(status="pending") and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(1.0)  # its waits under way
            with Client(d.address, transport="grpc") as grpc_client:
                assert _timed(lambda: grpc_client.checkpoint(theirs.id)) < 1.0
    finally:
        agent.join(60)
    out = got["out"]
    assert isinstance(out, dict), out
    assert out.get("ResourceExhausted", 0) >= 40 - 8 and out.get("ok", 0) <= 8, out


def _large_messages(address: str, ws: str) -> dict:
    """The agent's side of the test below: a checkpoint of 9 MiB of messages over gRPC
    through the relay, and over frames at the usual address."""
    out = {}
    messages = [{"role": "user", "content": "x" * (9 << 20)}]
    with Client(address, transport="frames") as frames, \
            Client(address + ".shared", transport="grpc") as grpc_client:
        sid = frames.create_session(ws).id
        for name, c in (("grpc", grpc_client), ("frames", frames)):
            try:
                c.checkpoint(sid, messages=messages)
                out[name] = "ok"
            except Exception as exc:  # noqa: BLE001 -- compared by name
                out[name] = type(exc).__name__
    return out


def test_an_agents_grpc_messages_are_bounded_apart_from_the_owners(place):
    """The relay's peers are served by a gRPC server of their own, whose messages are
    at most --gateway-max-line (8 MiB): uid 1000's checkpoint of 9 MiB of messages over
    gRPC is RESOURCE_EXHAUSTED, read no further than its length; the same checkpoint as
    frames (64 MiB, within the gateway's buffers) is stored."""
    d, ws, _ = place
    got = in_fresh_child_as(AGENT_UID, _large_messages, d.address, str(ws))
    assert got == {"grpc": "ResourceExhausted", "frames": "ok"}, got


# -- idle connections --------------------------------------------------------------------

@pytest.mark.parametrize("place", [("--idle-seconds", "1")], indirect=True)
def test_a_connection_that_sends_nothing_is_closed_after_the_idle_timeout(place):
    """--idle-seconds 1: uid 1000's connection that sends nothing is closed by the
    daemon a second later; one that sent half a line, too; one to the gRPC relay that
    sends nothing, too; one that calls keeps being served between calls shorter than
    that."""
    d, _, _ = place

    def idle() -> list:
        out = []
        relay = f"{d.root}/worldline.sock.shared"
        for path, first in ((_gateway(d), b""), (_gateway(d), b'{"method": "ListSe'),
                            (relay, b"")):
            with _connected(path) as s:
                s.sendall(first)
                start = time.monotonic()
                got = b""
                try:
                    while chunk := s.recv(1 << 16):
                        got += chunk
                except ConnectionResetError:  # closed so: the same
                    pass
                # gRPC's server says its HTTP/2 settings first: what matters is the end
                out.append([len(got) if path == relay else got.decode(),
                            time.monotonic() - start])
        with _connected(_gateway(d)) as s:
            for _ in range(3):
                time.sleep(0.5)
                out.append(list(_ask(s, "ListSessions")))
        return out

    got = in_child_as(AGENT_UID, idle)
    assert isinstance(got, list), got
    for answer, took in got[:3]:
        assert answer in ("", got[2][0]) and 0.8 < took < 5.0, got
    assert got[3:] == [["response"]] * 3, got


# -- finding 3: memory without bound ---------------------------------------------------------

def test_a_line_over_the_bound_is_answered_resource_exhausted_and_the_connection_goes_on(
        place):
    """A JSON line of 9 MiB (over the default --gateway-max-line of 8 MiB) from uid 1000
    is answered RESOURCE_EXHAUSTED, and the next line on the same connection is served.
    (0.7.38: lines up to 64 MiB were read whole.)"""
    d, _, _ = place

    def too_long() -> list:
        with _connected(_gateway(d)) as s:
            big = b'{"method": "ListSessions", "request": {}, "pad": "' + b"x" * (9 << 20)
            s.sendall(big + b'"}\n')
            first = json.loads(_read_line(s))
            return [first, _ask(s, "ListSessions")]

    first, then = in_child_as(AGENT_UID, too_long)
    assert first["error"]["code"] == "RESOURCE_EXHAUSTED", first
    assert "response" in then, then


MAX_LINE = 8 << 20
RSS_BOUND = 200 << 20  # SECURITY.md, Limits: an allowed user's requests grow the daemon so much


def test_the_largest_lines_and_frames_an_agent_may_send_keep_the_daemon_small(place):
    """uid 1000 sends, at once, 30 lines of the largest size the gateway reads (8 MiB,
    no newline yet) and 30 frames of the largest size (64 MiB), as fast as the daemon
    reads them: the daemon's RSS grows by less than 200 MiB (the agent's half of
    --gateway-buffer-bytes, 128 MiB, and what decoding costs), and the owner's
    checkpoint through the gateway meanwhile completes in under a second. (0.7.38:
    the daemon read all of it, 2.2 GB.)"""
    d, _, theirs = place
    before = _rss(d.proc.pid)
    gateway = _gateway(d)

    def feed(i: int) -> tuple[bytes, int]:
        if i < 30:  # a line of the largest size read, its newline still to come
            head = b'{"method": "ListSessions", "pad": "'
            return head, MAX_LINE - len(head)
        return wire.PREFACE + wire.MAX_FRAME.to_bytes(4, "big"), wire.MAX_FRAME

    held = _Held({gateway: 60}, feed=feed, feed_seconds=3.0)
    try:
        assert held.opened[gateway] == 60, held.opened
        time.sleep(0.5)
        grown = _rss(d.proc.pid) - before
        with Client(d.address, transport="frames") as frames:
            assert _timed(lambda: frames.checkpoint(theirs.id)) < 1.0
    finally:
        held.release()
    print(f"the daemon grew by {grown >> 20} MiB")
    assert grown < RSS_BOUND, f"the daemon grew by {grown >> 20} MiB"


# -- finding 5: a request nested 100,000 deep -------------------------------------------------

def test_json_nested_100000_deep_is_invalid_argument_and_the_connection_stays(place):
    """A line nested 100,000 deep (and one 40 deep, past the gateway's limit of 32) is
    answered INVALID_ARGUMENT; the same connection then serves a call. (0.7.38:
    RecursionError escaped, the connection dropped, a traceback in the log.)"""
    d, _, _ = place

    def deep() -> list:
        with _connected(_gateway(d)) as s:
            out = []
            for depth in (100_000, 40):
                line = (b'{"method": "ListSessions", "request": {}, "x": ' + b"[" * depth
                        + b"]" * depth + b"}\n")
                s.sendall(line)
                out.append(json.loads(_read_line(s) or b"null"))
            out.append(_ask(s, "ListSessions"))
            return out

    deep_one, forty, then = in_child_as(AGENT_UID, deep)
    assert deep_one and deep_one["error"]["code"] == "INVALID_ARGUMENT", deep_one
    assert forty and forty["error"]["code"] == "INVALID_ARGUMENT", forty
    assert "response" in then, then
    assert "Traceback" not in d.log.read_text()


# -- finding 4: errors that named the owner's session -------------------------------------

def test_an_agents_errors_name_nothing_of_the_owners(place):
    """uid 1000 asks for a session over a folder holding the owner's workspace, forks
    its own checkpoint into the owner's workspace, and names the owner's checkpoint
    and approval: each is refused, and no refusal names the owner's session ids or its
    folder inside the agent's. (0.7.38: "overlaps the workspace ... of session ID", and "session
    ID is not the caller's" for a checkpoint or an approval of it.)"""
    d, ws, theirs = place
    with d.client() as owner:
        # the owner's session over a folder inside the agent's: the agent's folder is
        # not available to a session of the agent's
        inner = ws / "vendored"
        inner.mkdir()
        over_theirs = owner.create_session(str(inner))
        theirs_cp = owner.log(theirs.id)[-1].id
        approval = owner.request_approval(theirs.id, "deploy").id
        owner.decide_approval(approval, approve=True)
    # what the agent did not give: the sessions' ids, the folder of the owner's inside
    # its own (a path the agent gave may come back, as it gave it)
    secret = {theirs.id, over_theirs.id, str(inner)}

    def probe() -> dict:
        with _connected(_gateway(d)) as s:
            out = {"create over theirs": _ask(s, "CreateSession", {"workspace": str(ws)})}
            mine = _ask(s, "CreateSession", {"workspace": str(ws.parent / "mine")})
            out["mine"] = mine
            if "response" not in mine:
                return out
            sid = mine["response"]["id"]
            cp = _ask(s, "CreateCheckpoint", {"session_id": sid})["response"]["id"]
            out["fork into theirs"] = _ask(s, "Fork", {
                "checkpoint_id": cp, "workspace": str(theirs.workspace) + "/f"})
            out["show theirs"] = _ask(s, "GetCheckpoint", {"checkpoint_id": theirs_cp})
            out["diff theirs"] = _ask(s, "Diff", {"from_id": cp, "to_id": theirs_cp})
            out["their approval"] = _ask(s, "GetApproval", {"approval_id": approval})
            out["decide theirs"] = _ask(s, "DecideApproval", {"approval_id": approval,
                                                                "approve": True})
            out["record with theirs"] = _ask(s, "RecordToolCall", {
                "session_id": sid, "name": "deploy", "approval_id": approval})
            return out

    (ws.parent / "mine").mkdir()
    os.chown(ws.parent / "mine", AGENT_UID, AGENT_UID)
    got = in_child_as(AGENT_UID, probe)
    assert "response" in got["mine"], got
    codes = {"create over theirs": "FAILED_PRECONDITION",
             "fork into theirs": "FAILED_PRECONDITION",
             "show theirs": "PERMISSION_DENIED", "diff theirs": "PERMISSION_DENIED",
             "their approval": "PERMISSION_DENIED", "decide theirs": "PERMISSION_DENIED",
             "record with theirs": "PERMISSION_DENIED"}
    for what, code in codes.items():
        answer = got[what]
        assert "error" in answer, (what, answer)
        assert answer["error"]["code"] == code, (what, answer)
        for named in secret:
            assert named not in answer["error"]["message"], (what, answer)
    with d.client() as owner:
        assert owner.get_approval(approval).status == "approved"
        assert not owner.tool_calls(theirs.id)


# -- item 5: approvals forged or replayed -------------------------------------------------

def test_an_agents_approval_covers_the_call_it_was_given_for_once(place):
    """uid 1000 (allowed to approve its own requests, the hooks' ask mode) asks for
    approval of deploy {"env": "staging"} and approves it: it cannot record deploy
    {"env": "prod"} with it (0.7.38 recorded it: the arguments were never compared),
    nor another tool; it records the staging call once, not twice; and an idempotency
    key of that call given to the prod call is refused rather than answered as a
    replay that would hide the prod call (0.7.38: replayed=True, nothing recorded)."""
    d, ws, _ = place

    def approvals() -> dict:
        with _connected(_gateway(d)) as s:
            sid = _ask(s, "CreateSession", {"workspace": str(ws)})["response"]["id"]
            staging, prod = json.dumps({"env": "staging"}), json.dumps({"env": "prod"})
            aid = _ask(s, "RequestApproval", {"session_id": sid, "tool": "deploy",
                                              "args_json": staging})["response"]["id"]
            out = {"approve": _ask(s, "DecideApproval", {"approval_id": aid,
                                                         "approve": True})}

            def record(name: str, args: str, key: str = "", approval: str = aid) -> dict:
                return _ask(s, "RecordToolCall", {
                    "session_id": sid, "name": name, "args_json": args,
                    "approval_id": approval, "idempotency_key": key})

            out["other args"] = record("deploy", prod)
            out["other tool"] = record("push", staging)
            out["its call"] = record("deploy", staging, key="k1")
            out["again"] = record("deploy", staging)
            out["key of another call"] = record("deploy", prod, key="k1", approval="")
            out["calls"] = _ask(s, "ListToolCalls", {"session_id": sid})
            return out

    got = in_child_as(AGENT_UID, approvals)
    assert "response" in got["approve"], got
    for what in ("other args", "other tool", "again", "key of another call"):
        assert got[what].get("error", {}).get("code") == "FAILED_PRECONDITION", (what, got)
    assert "response" in got["its call"], got
    calls = got["calls"]["response"]["tool_calls"]
    assert [(c["name"], json.loads(c["args_json"])) for c in calls] == [
        ("deploy", {"env": "staging"})], calls


def test_an_agent_over_its_share_is_told_resource_exhausted(place):
    """Through the Python client (frames) too: uid 1000's connection past its share is
    an error the client raises, not a hang."""
    d, ws, _ = place
    held = _Held({_gateway(d): 64})
    try:
        got = in_fresh_child_as(AGENT_UID, _call_once, d.address)
        assert got in ("Unavailable", "ResourceExhausted"), got
    finally:
        held.release()
    assert in_fresh_child_as(AGENT_UID, _call_once, d.address) == "ok"


def _call_once(address: str) -> str:
    with Client(address, transport="frames", timeout=10) as c:
        c.list_sessions()
    return "ok"


def test_through_mcp_an_approval_covers_its_own_arguments_once(daemon, workspace):
    """The same gate through `worldline mcp` (stdio, a real MCP client): an approval the
    user gave through elicitation for deploy {"env": "prod"} records that call once,
    and never deploy {"env": "staging"}. (0.7.38 recorded the staging call with it.)
    As the daemon's owner: the MCP server runs as whoever starts it, and its calls meet
    the daemon's one gate (daemon/gates.py) that the tests above probe as uid 1000."""
    import anyio
    import mcp.types as types

    from .test_mcp import mcp_session

    async def elicit(context, params):
        return types.ElicitResult(action="accept", content={"approve": True, "reason": "ok"})

    async def scenario() -> dict:
        async with mcp_session(daemon, elicitation_callback=elicit) as session:
            await session.initialize()

            async def call(tool_name, /, **args):
                result = await session.call_tool(tool_name, args)
                if result.is_error:  # "...: CODE: message"
                    text = result.content[0].text
                    return next((c for c in wire.CODES if f"{c}:" in text), text)
                return result.structured_content

            s = await call("create_session", workspace=str(workspace))
            a = await call("request_approval", session_id=s["id"], tool="deploy",
                           args={"env": "prod"})
            out = {"approved": a["status"]}
            for what, env in (("other args", "staging"), ("its call", "prod"),
                              ("again", "prod")):
                got = await call("record_tool_call", session_id=s["id"], name="deploy",
                                 args={"env": env}, approval_id=a["id"])
                out[what] = got if isinstance(got, str) else "ok"
            return out

    got = anyio.run(scenario)
    assert got == {"approved": "approved", "other args": "FAILED_PRECONDITION",
                   "its call": "ok", "again": "FAILED_PRECONDITION"}, got
