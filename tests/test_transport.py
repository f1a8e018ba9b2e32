"""The Python client's two ways to the daemon on a Unix socket: gRPC, and frames on the
gateway (client/transport.py, worldline.wire.frames). Both give the same answers and the same
errors; the frames' own edges (a pool shared by threads, deadlines, a daemon that
restarted or has no gateway, frames that do not fit) are checked here."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from worldline.client import Client, DeadlineExceeded, InvalidArgument, NotFound, Unavailable
from worldline.client.transport import FrameTransport, GrpcTransport
from worldline.v1 import worldline_pb2 as pb
from worldline.wire import frames as wire

from .conftest import DaemonProcess
from .fidelity import in_fresh_child_as

KINDS = ("grpc", "frames")


def _gateway(d: DaemonProcess) -> str:
    return str(d.root / "worldline.sock.json")


@pytest.mark.parametrize("kind", KINDS)
def test_both_transports_give_the_same_answers_and_errors(daemon, tmp_path, kind):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a").write_text("one")
    with Client(daemon.address, transport=kind) as c:
        assert isinstance(c._transport, GrpcTransport if kind == "grpc" else FrameTransport)
        s = c.create_session(str(ws))
        (ws / "a").write_text("two")
        cp = s.checkpoint(label="edit", state={"step": 1}, messages=[{"role": "user"}])
        assert cp.seq == 1 and cp.label == "edit"
        assert c.show(cp.id).state == {"step": 1}
        assert c.diff(c.log(s.id)[0].id, cp.id).modified == ["a"]
        with pytest.raises(NotFound):
            c.get_session(s.id[:-4] + "0000")
        with pytest.raises(InvalidArgument, match="no-such"):
            c.get_session("no-such")
        with pytest.raises(InvalidArgument):
            c.checkpoint_raw(s.id, state_json="{not json")
        assert [x.id for x in c.list_sessions(workspace=str(ws))] == [s.id]


def test_a_client_shared_by_threads_calls_on_several_connections(daemon, tmp_path):
    """A call that waits (an approval) does not hold up another thread's calls on the
    same client, as on a gRPC channel: each call has a connection to itself."""
    ws = tmp_path / "ws"
    ws.mkdir()
    with Client(daemon.address, transport="frames") as c:
        s = c.create_session(str(ws))
        a = s.request_approval("deploy")
        got = {}
        waiter = threading.Thread(target=lambda: got.update(a=c.wait_approval(a.id, 20)))
        waiter.start()
        time.sleep(0.3)
        assert waiter.is_alive()  # still waiting on its own connection
        c.decide_approval(a.id, approve=True, reason="ok")
        waiter.join(20)
        assert got["a"].status == "approved"
        assert len(c._transport._idle) == 2  # the waiter's connection and this thread's


def _costs_its_deadline(c: Client, deadline: float = 0.3) -> None:
    """A call through ``c`` raises DeadlineExceeded after its deadline, not much later."""
    start = time.monotonic()
    with pytest.raises(DeadlineExceeded):
        c._call("ListSessions", pb.ListSessionsRequest(), timeout=deadline)
    assert deadline <= time.monotonic() - start < deadline + 2.7


def test_a_call_past_its_deadline_raises_deadline_exceeded(tmp_path):
    """A daemon that takes the call and never answers (forced here: a listener that
    only reads) costs the caller its deadline, not more, and the connection is not
    reused (its answer could still come)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / "wl.sock.json"))
    listener.listen(1)
    taken = []
    threading.Thread(target=lambda: taken.append(listener.accept()), daemon=True).start()
    try:
        with Client(f"unix://{tmp_path}/wl.sock", transport="frames") as c:
            _costs_its_deadline(c)
            assert c._transport._idle == []
    finally:
        listener.close()


def _trickling_gateway(tmp_path: Path, answer: bytes) -> socket.socket:
    """A gateway (forced: a listener of the test's) that reads the call, then sends
    ``answer`` a byte every 50 ms until the caller hangs up; the listener, to close."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / "wl.sock.json"))
    listener.listen(1)

    def trickle() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)  # the call (and a frame client's preface)
            try:
                for byte in answer:
                    conn.sendall(bytes((byte,)))
                    time.sleep(0.05)
            except OSError:  # the caller gave up and closed its end
                pass
    threading.Thread(target=trickle, daemon=True).start()
    return listener


def test_a_daemon_answering_a_byte_at_a_time_costs_the_deadline_not_more(tmp_path):
    """The deadline is the call's, not each read's: a gateway that trickles its answer
    (a frame that claims 1,000 bytes, a byte every 50 ms) would keep a per-read timeout
    alive for a minute; the call ends at its deadline."""
    listener = _trickling_gateway(tmp_path, struct.pack(">I", 1000) + b"\0" * 1000)
    try:
        with Client(f"unix://{tmp_path}/wl.sock", transport="frames") as c:
            _costs_its_deadline(c, 0.5)
            assert c._transport._idle == []
    finally:
        listener.close()


def test_the_hooks_client_gives_up_on_a_trickled_answer_at_its_deadline(tmp_path):
    """The same for the hooks' JSON-line client (client/lite.py), whose deadline is the
    call's wait and 5 s for the daemon to answer: past it, the hook is told the daemon
    is unavailable (and fails open or closed as configured), never left hanging."""
    from worldline.client.lite import LiteClient
    listener = _trickling_gateway(tmp_path, b'{"response": {"x": "' + b"y" * 1000)
    try:
        with LiteClient(f"unix://{tmp_path}/wl.sock") as c:
            start = time.monotonic()
            with pytest.raises(Unavailable, match="did not answer"):
                c.call("ListSessions", {}, timeout=0.5)
            assert 5.5 <= time.monotonic() - start < 5.5 + 2.7
    finally:
        listener.close()


def test_a_gateway_too_busy_to_accept_costs_the_deadline_not_an_error_at_once(tmp_path):
    """A full backlog (forced here: a listener that never accepts) makes a Unix
    socket's connect fail at once with EAGAIN; the client waits for room until the
    call's deadline, as a gRPC call would, instead of calling the daemon unreachable."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / "wl.sock.json"))
    listener.listen(0)
    filling = []
    try:
        while True:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.setblocking(False)
            filling.append(s)
            s.connect(str(tmp_path / "wl.sock.json"))
    except BlockingIOError:
        pass
    try:
        with Client(f"unix://{tmp_path}/wl.sock", transport="frames") as c:
            _costs_its_deadline(c)
    finally:
        for s in filling:
            s.close()
        listener.close()


def test_a_client_outlives_a_daemon_restart(tmp_path):
    """Its idle connection to the old daemon is closed; the next call goes on a new one
    and is answered, not failed."""
    d = DaemonProcess(tmp_path / "root").start()
    ws = tmp_path / "ws"
    ws.mkdir()
    try:
        with Client(d.address, transport="frames") as c:
            s = c.create_session(str(ws))
            assert len(c._transport._idle) == 1
            d.stop()
            with pytest.raises(Unavailable):
                c.get_session(s.id)
            d.start()
            assert c.get_session(s.id).id == s.id
    finally:
        d.stop()


def test_without_a_gateway_auto_goes_over_grpc_and_frames_says_unavailable(tmp_path):
    d = DaemonProcess(tmp_path / "root").start()
    ws = tmp_path / "ws"
    ws.mkdir()
    try:
        os.unlink(_gateway(d))  # as a daemon from before the gateway, or a relay's socket
        with Client(d.address) as c:
            s = c.create_session(str(ws))
            assert c._transport._grpc is not None and c.get_session(s.id).id == s.id
        with Client(d.address, transport="frames") as c, pytest.raises(Unavailable):
            c.get_session(s.id)
    finally:
        d.stop()


def _raw(path: str, data: bytes) -> list[tuple[int, bytes]]:
    """The answers the gateway gives to ``data`` sent after the preface, until it
    closes the connection or stops answering."""
    answers = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(path)
        s.sendall(wire.PREFACE + data)
        s.shutdown(socket.SHUT_WR)
        while (body := wire.read_frame(s.recv_into)) is not None:
            answers.append(wire.read_answer(body))
    return answers


def test_frames_that_do_not_fit_get_a_status_and_change_nothing(daemon):
    path = _gateway(daemon)
    before = len(Client(daemon.address, transport="grpc").list_sessions())
    # frames whose length is right but whose content is not a call: each answered, and
    # the calls after them on the same connection are still served
    bad = [(wire.request_frame("NoSuchCall", b"", None), "UNIMPLEMENTED"),
           (wire.request_frame("CreateSession", b"\xff\xff\xff", None), "INVALID_ARGUMENT"),
           (struct.pack(">I", 3) + b"\x05ab", "INVALID_ARGUMENT"),  # shorter than its header
           (struct.pack(">IB", 10, 1) + b"X" + struct.pack(">d", -1.0), "INVALID_ARGUMENT")]
    answers = _raw(path, b"".join(f for f, _ in bad)
                   + wire.request_frame("ListSessions", b"", None))
    assert [wire.CODES[c] for c, _ in answers] == [code for _, code in bad] + ["OK"]
    assert b"NoSuchCall" in answers[0][1]
    # a frame over the limit: answered, then the connection ends (it is out of step)
    answers = _raw(path, struct.pack(">I", wire.MAX_FRAME + 1)
                   + wire.request_frame("ListSessions", b"", None))
    assert [wire.CODES[c] for c, _ in answers] == ["RESOURCE_EXHAUSTED"]
    assert len(Client(daemon.address, transport="grpc").list_sessions()) == before


def test_the_wire_form_reads_back_what_it_writes():
    frame = wire.request_frame("CreateCheckpoint", b"\x01\x02", 2.5)
    (length,) = struct.unpack(">I", frame[:4])
    assert length == len(frame) - 4
    assert wire.read_request(frame[4:]) == ("CreateCheckpoint", 2.5, b"\x01\x02")
    assert wire.read_request(wire.request_frame("X", b"", None)[4:]) == ("X", None, b"")
    assert wire.read_answer(wire.answer_frame(5, b"gone")[4:]) == (5, b"gone")
    for bad in (b"", b"\x09abc", b"\x01\xff" + struct.pack(">d", 1.0),
                b"\x01X" + struct.pack(">d", float("nan"))):
        with pytest.raises(wire.FrameError):
            wire.read_request(bad)
    assert wire.STATUS["UNAVAILABLE"] == 14 and wire.CODES[5] == "NOT_FOUND"


def _line_call(sock: socket.socket, line: bytes) -> bytes:
    """The answer to one JSON line; b"" if the gateway closed the connection."""
    got = b""
    try:
        sock.sendall(line)
        while not got.endswith(b"\n"):
            chunk = sock.recv(1 << 16)
            if not chunk:
                break
            got += chunk
    except (BrokenPipeError, ConnectionResetError):  # closed, the request unread
        pass
    return got


def test_the_gateway_caps_its_connections_and_its_lines(tmp_path):
    """Each connection has a thread: past ``--max-connections`` a new one is answered
    RESOURCE_EXHAUSTED and closed at once (and served again once one ends); a JSON line
    over ``--gateway-max-line`` is answered RESOURCE_EXHAUSTED and the connection goes
    on; a timeout that is not a number of seconds is refused. In-process, with the
    limits made small: a line of 8 MiB and a thousand connections are what they stand
    for."""
    from worldline.daemon.edge import gateway
    from worldline.daemon.edge.limits import EdgeLimits

    gw = gateway.Gateway(str(tmp_path / "g.sock.json"), servicer=None,
                         limits=EdgeLimits(max_connections=2, owner_connections=1,
                                           max_line=100))
    unknown = b'{"method": "NoSuchCall", "request": {}}\n'
    try:
        held = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(3)]
        for s in held:
            s.settimeout(10)
            s.connect(gw.path)
        assert b"UNIMPLEMENTED" in _line_call(held[0], unknown)
        assert b"UNIMPLEMENTED" in _line_call(held[1], unknown)
        for timeout in (b'"soon"', b"-1", b"true"):  # refused before any servicer runs
            line = b'{"method": "ListSessions", "timeout": ' + timeout + b"}\n"
            assert b"INVALID_ARGUMENT" in _line_call(held[1], line)
        refused = held[2].recv(1 << 16)  # over the limit: answered at once, closed
        assert b"RESOURCE_EXHAUSTED" in refused
        assert _line_call(held[2], unknown) == b""
        held[0].close()
        deadline = time.monotonic() + 10
        while gw.connections.held(None) > 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(10)
            s.connect(gw.path)
            long_line = b'{"method": "' + b"x" * 200 + b'"}\n'
            assert b"RESOURCE_EXHAUSTED" in _line_call(s, long_line)
            assert b"UNIMPLEMENTED" in _line_call(s, unknown)  # and the connection goes on
        for s in held[1:]:
            s.close()
    finally:
        gw.close()


def _checkpoint_over(address: str, kind: str, ws: str) -> list:
    """A session of ``ws`` and its checkpoint, by a client on transport ``kind``: the
    checkpoint's seq, and whether the client went without gRPC."""
    with Client(address, transport=kind) as c:
        s = c.create_session(ws)
        return [s.checkpoint().seq, c._transport._grpc is None]


@pytest.mark.skipif(os.geteuid() != 0, reason="switching uids needs root")
def test_an_allowed_users_client_calls_at_the_usual_address_and_no_one_else(tmp_path):
    """With --allow-uid 1000, a Python client running as uid 1000 reaches the daemon
    at its usual address (as frames on the gateway, its peer uid checked); uid 65534
    is turned away, over frames and over gRPC alike."""
    import shutil
    import tempfile
    base = Path(tempfile.mkdtemp(prefix="wl-tr-"))
    os.chmod(base, 0o711)
    d = DaemonProcess(base / "root", extra=["--allow-uid", "1000"]).start()
    try:
        ws = base / "agent-ws"
        ws.mkdir()
        os.chown(ws, 1000, 1000)

        def checkpoint(uid, kind):
            return in_fresh_child_as(uid, _checkpoint_over, d.address, kind, str(ws))

        assert checkpoint(1000, "auto") == [1, True]
        assert checkpoint(65534, "frames") == "Unavailable"
        assert checkpoint(65534, "grpc") == "Unavailable"
        with d.client() as c:
            assert [s.workspace for s in c.list_sessions()] == [str(ws)]
    finally:
        d.stop()
        shutil.rmtree(base, ignore_errors=True)


_FORKS_BESIDE_CALLS = """
import os, sys, threading
sys.path.insert(0, {checkout!r})
import {package}  # noqa -- sets the default before anything imports grpc, or not
from worldline.client import Client
stop = threading.Event()

def busy():
    with Client({address!r}, transport="grpc") as c:
        while not stop.is_set():
            c.list_sessions()

worker = threading.Thread(target=busy)
worker.start()
for _ in range(300):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
stop.set()
worker.join()
print("forked")
"""


@pytest.mark.parametrize("package", ["worldline.daemon", "tests"])
def test_no_fork_enters_grpcs_fork_handlers_in_the_daemon_or_the_tests(daemon, package):
    """gRPC's fork handlers (on by default in recent grpcio) wait in fork() for gRPC's
    threads: a 0.7.27 CI run hung for good in ``in_child_as``'s fork there. A process
    that imported the daemon's package or the tests' has them off: 300 forks beside a
    thread making gRPC calls never enter them (with them on, gRPC's log says "skipping
    fork() handlers" for a fork that meets a call in flight). The script runs with
    neither the variable set nor the tests' package imported, but as named."""
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    env["GRPC_VERBOSITY"] = "info"
    script = _FORKS_BESIDE_CALLS.format(checkout=str(Path(__file__).parents[1]),
                                        package=package, address=daemon.address)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=240, env=env)
    assert done.returncode == 0 and done.stdout.strip() == "forked", done.stderr[-2000:]
    assert "fork_posix" not in done.stderr, done.stderr[-2000:]
