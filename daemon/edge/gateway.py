"""The gateway: the Worldline service's calls over a Unix socket without HTTP/2, as
JSON lines (for hooks) or as protobuf frames (for the Python client).

JSON lines exist for clients that must start in milliseconds: an agent's hook runs as
a new process twice per tool call, and importing grpc alone costs such a process
about 70 ms, where Python and ``json`` cost about 20. Frames exist for the Python
client's calls after an idle gap, which gRPC answers about a millisecond later on a
2-core VM (client/wire.py). The gateway serves the same servicer as the gRPC socket,
maps errors through the same ``server.status_of``, times and counts calls in the same
metric, and listens at ``<socket>.json`` beside the gRPC socket with the same
permissions (owner-only; with ``--allow-uid``, every peer's uid is checked as the
relay checks it).

Protocol. A connection whose first line is ``wire.PREFACE`` speaks frames (see
client/wire.py). Any other connection carries JSON requests, one line each, one after
another::

    {"method": "CreateCheckpoint", "request": {...}, "timeout": 30}

``request`` is the method's request message in proto3 JSON with the .proto's field
names; ``timeout`` (seconds, optional) is the call's deadline, as gRPC's. The answer
is one line: ``{"response": {...}}`` with every field present, or
``{"error": {"code": "NOT_FOUND", "message": "..."}}`` with a gRPC status name. A
request over ``MAX_LINE`` bytes (or a frame over ``wire.MAX_FRAME``) is answered
RESOURCE_EXHAUSTED and ends the connection: the stream cannot be read past it.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import struct
import threading
import time

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from worldline.client import wire
from worldline.client.lite import parse_request, response_json
from worldline.v1 import worldline_pb2 as pb

from .. import ids
from ..observe import ACTIVITY, REQUEST_ID, RPC_SECONDS
from ..owners import Agent
from . import callers
from .callers import Rules
from .server import WorldlineServicer, status_of

log = logging.getLogger(__name__)

SERVICE = pb.DESCRIPTOR.services_by_name["Worldline"]
REQUESTS = {m.name: getattr(pb, m.input_type.name) for m in SERVICE.methods}
MAX_LINE = 64 << 20
SUFFIX = ".json"
MAX_CONNECTIONS = 1024  # open at once; a Python client keeps one per thread calling


class _Context:
    """What a servicer may ask of its call: the time left before the deadline."""

    def __init__(self, timeout: float | None) -> None:
        self._deadline = None if timeout is None else time.monotonic() + timeout

    def time_remaining(self) -> float | None:
        return None if self._deadline is None else max(0.0, self._deadline - time.monotonic())


class Gateway:
    """The socket ``path`` and a thread per connection (at most ``MAX_CONNECTIONS``),
    each serving its calls one after another, as JSON lines or as frames."""

    def __init__(self, path: str, servicer: WorldlineServicer,
                 allowed_uids: set[int] | None = None, rules: Rules | None = None) -> None:
        self.path = path
        self.servicer = servicer
        self.rules = rules
        self.allowed = None if not allowed_uids else allowed_uids | {0, os.geteuid()}
        if os.path.lexists(path):
            os.unlink(path)  # stale: the caller holds the socket's lock
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)
        try:
            self.sock.bind(path)
        finally:
            os.umask(old_umask)
        os.chmod(path, 0o666 if self.allowed else 0o600)
        self.sock.listen(1024)  # clients wait in the backlog while it is full (transport.py)
        self._closed = False
        self._active = 0  # calls under way
        self._connections = 0
        self._refused_at = 0.0  # when a connection over the limit was last logged
        self._idle = threading.Condition()
        self._thread = threading.Thread(target=self._accept, name="gateway", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            caller = None
            if self.allowed is not None:
                uid, gid = _peer_ids(conn)
                if uid not in self.allowed:
                    conn.close()
                    continue
                caller = callers.agent(uid, gid)
            with self._idle:
                full = self._connections >= MAX_CONNECTIONS
                if not full:
                    self._connections += 1
            if full:
                conn.close()  # a thread each: the limit keeps a caller from exhausting them
                if time.monotonic() - self._refused_at > 60:
                    self._refused_at = time.monotonic()
                    log.warning("gateway: %d connections open; refusing more",
                                MAX_CONNECTIONS)
                continue
            threading.Thread(target=self._serve, args=(conn, caller), name="gateway-call",
                             daemon=True).start()

    def _serve(self, conn: socket.socket, caller: Agent | None) -> None:
        callers.CALLER.set(caller)  # for every call on this connection (its own thread)
        try:
            with conn, conn.makefile("rb") as stream:
                first = stream.readline(MAX_LINE + 1)
                if first == wire.PREFACE:
                    self._serve_frames(conn, stream)
                else:
                    self._serve_lines(conn, stream, first)
        except OSError:
            pass  # the caller went away
        finally:
            with self._idle:
                self._connections -= 1

    def _serve_lines(self, conn: socket.socket, stream, line: bytes) -> None:
        while line:
            too_long = len(line) > MAX_LINE  # its end is not read: answer, then end
            answer = (_error("RESOURCE_EXHAUSTED", f"a request over {MAX_LINE} bytes")
                      if too_long else self.call(line))
            conn.sendall(json.dumps(answer, ensure_ascii=False).encode() + b"\n")
            if too_long:
                return
            line = stream.readline(MAX_LINE + 1)

    def _serve_frames(self, conn: socket.socket, stream) -> None:
        while True:
            try:
                body = wire.read_frame(stream.readinto)
            except wire.FrameError as exc:  # out of step with the caller: answer, then end
                code = ("RESOURCE_EXHAUSTED" if isinstance(exc, wire.FrameTooLarge)
                        else "INVALID_ARGUMENT")
                conn.sendall(_error_frame(code, f"not a frame: {exc}"))
                return
            if body is None:
                return
            conn.sendall(self.call_frame(body))

    def call(self, line: bytes) -> dict:
        """One request line to its answer; never raises."""
        try:
            envelope = json.loads(line)
            if not isinstance(envelope, dict):
                raise ValueError("not a JSON object")
            method, request = parse_request(envelope.get("method", ""),
                                            envelope.get("request"))
            if method is None:
                return _error("UNIMPLEMENTED", f"no method {envelope.get('method')!r} in"
                                               f" {SERVICE.full_name}")
            timeout = envelope.get("timeout")
            if timeout is not None and (isinstance(timeout, bool) or not isinstance(
                    timeout, int | float) or not timeout >= 0):
                raise ValueError(f"timeout {timeout!r} is not a number of seconds")
        except (ValueError, TypeError, AttributeError, json_format.ParseError) as exc:
            return _error("INVALID_ARGUMENT", f"not a request: {exc}".splitlines()[0])
        code, message, reply = self._invoke(method.name, request, timeout)
        return {"response": response_json(reply)} if reply is not None else _error(code, message)

    def call_frame(self, body: bytes) -> bytes:
        """One request frame's body to its answer frame; never raises."""
        try:
            name, timeout, data = wire.read_request(body)
            kind = REQUESTS.get(name)
            if kind is None:
                return _error_frame("UNIMPLEMENTED", f"no method {name!r} in {SERVICE.full_name}")
            request = kind.FromString(data)
        except (wire.FrameError, DecodeError) as exc:
            return _error_frame("INVALID_ARGUMENT", f"not a request: {exc}".splitlines()[0])
        code, message, reply = self._invoke(name, request, timeout)
        if reply is None:
            return _error_frame(code, message)
        data = reply.SerializeToString()
        if len(data) > wire.MAX_MESSAGE:  # as the gRPC server refuses to send it
            return _error_frame("RESOURCE_EXHAUSTED", f"{name}'s answer of {len(data)} bytes"
                                f" is over the {wire.MAX_MESSAGE}-byte limit")
        return wire.answer_frame(0, data)

    def _invoke(self, name: str, request, timeout: float | None):
        """The servicer's answer to one call, timed and counted as the gRPC edge's
        interceptors time and count theirs: (status name, error message, reply or
        None)."""
        with self._idle:
            if self._closed:
                return "UNAVAILABLE", "the worldline daemon is stopping", None
            self._active += 1
        code, message, reply = "OK", "", None
        start, token = time.perf_counter(), REQUEST_ID.set(ids.new_id())
        ACTIVITY.begin()
        try:
            if self.rules is not None:
                self.rules.check(name, request)
            reply = getattr(self.servicer, name)(request, _Context(timeout))
            if self.rules is not None:
                reply = self.rules.shown(name, reply)
        except Exception as exc:  # noqa: BLE001 -- mapped exactly as the gRPC edge maps it
            code, message = status_of(exc, name)
        finally:
            ACTIVITY.end()
            RPC_SECONDS.labels(name, code).observe(time.perf_counter() - start)
            REQUEST_ID.reset(token)
            with self._idle:
                self._active -= 1
                self._idle.notify_all()
        return code, message, reply

    def close(self, grace: float = 10.0) -> None:
        """Stop accepting; wait up to ``grace`` seconds for the calls under way."""
        with self._idle:
            self._closed = True
            self._idle.wait_for(lambda: self._active == 0, timeout=grace)
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def _error(code: str, message: str) -> dict:
    return {"error": {"code": code, "message": message}}


def _error_frame(code: str, message: str) -> bytes:
    return wire.answer_frame(wire.STATUS[code], message.encode("utf-8", "replace"))


def _peer_ids(conn: socket.socket) -> tuple[int, int]:
    """The peer's uid and gid (SO_PEERCRED)."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1:]
