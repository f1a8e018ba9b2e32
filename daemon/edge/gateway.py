"""The gateway: the Worldline service's calls over a Unix socket without HTTP/2, as
JSON lines (for hooks) or as protobuf frames (for the Python client).

JSON lines exist for clients that must start in milliseconds: an agent's hook runs as
a new process twice per tool call, and importing grpc alone costs such a process
about 70 ms, where Python and ``json`` cost about 20. Frames exist for the Python
client's calls after an idle gap, which gRPC answers about a millisecond later on a
2-core VM (worldline.wire.frames). The gateway serves the same servicer as the gRPC socket,
maps errors through the same ``server.status_of``, times and counts calls in the same
metric, and listens at ``<socket>.json`` beside the gRPC socket with the same
permissions (owner-only; with ``--allow-uid``, every peer's uid is checked as the
relay checks it).

Protocol. A connection whose first line is ``wire.PREFACE`` speaks frames (see
worldline.wire.frames). Any other connection carries JSON requests, one line each, one after
another::

    {"method": "CreateCheckpoint", "request": {...}, "timeout": 30}

``request`` is the method's request message in proto3 JSON with the .proto's field
names; ``timeout`` (seconds, optional) is the call's deadline, as gRPC's. The answer
is one line: ``{"response": {...}}`` with every field present, or
``{"error": {"code": "NOT_FOUND", "message": "..."}}`` with a gRPC status name. A
line over ``--gateway-max-line`` bytes is answered RESOURCE_EXHAUSTED as soon as it
passes the bound, the rest of it read and dropped, and the connection goes on; one
nested deeper than ``limits.MAX_DEPTH`` is INVALID_ARGUMENT. A frame over
``wire.MAX_FRAME`` is answered RESOURCE_EXHAUSTED and ends the connection: the stream
cannot be read past it.

Sharing (limits.py): connections are counted per peer uid (an allowed user's at most
``--connections-per-uid``, the last ``--owner-connections`` the owner's alone); one
that sends nothing for ``--idle-seconds`` is closed; what every connection has read
and not yet answered is counted against ``--gateway-buffer-bytes`` (an allowed user's
at most half of it): a connection with nothing left to it waits to read, and after
``--idle-seconds`` of that is answered RESOURCE_EXHAUSTED and closed.
"""
from __future__ import annotations

import json
import logging
import os
import re
import socket
import struct
import threading
import time

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from worldline.v1 import worldline_pb2 as pb
from worldline.wire import frames as wire
from worldline.wire.jsonform import parse_request, response_json

from .. import ids
from ..observe import ACTIVITY, REQUEST_ID, RPC_SECONDS
from ..owners import Agent
from . import callers
from .callers import Rules
from .limits import MAX_DEPTH, EdgeLimits, Quota
from .server import WorldlineServicer, status_of

log = logging.getLogger(__name__)

SERVICE = pb.DESCRIPTOR.services_by_name["Worldline"]
REQUESTS = {m.name: getattr(pb, m.input_type.name) for m in SERVICE.methods}
SUFFIX = ".json"
CHUNK = 1 << 16  # read at a time, and counted against the buffers' budget first
_PARSING = threading.Lock()  # one JSON request decoded at a time: the GIL runs one
# anyway, and a line's objects take a few times its bytes while they live
MAX_ITEMS = 100_000  # lists, objects and their items in one JSON request
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')  # a JSON string, as JSON lexes it
_NOT_BRACKET = bytes(c for c in range(256) if c not in b"[]{}")


class _Full(Exception):
    """The buffers' budget had no room for a connection's next read in time."""


class _Context:
    """What a servicer may ask of its call: the time left before the deadline."""

    def __init__(self, timeout: float | None) -> None:
        self._deadline = None if timeout is None else time.monotonic() + timeout

    def time_remaining(self) -> float | None:
        return None if self._deadline is None else max(0.0, self._deadline - time.monotonic())


class Gateway:
    """The socket ``path`` and a thread per connection (at most ``limits.max_connections``,
    shared per peer uid: limits.py), each serving its calls one after another, as JSON
    lines or as frames."""

    def __init__(self, path: str, servicer: WorldlineServicer,
                 allowed_uids: set[int] | None = None, rules: Rules | None = None,
                 limits: EdgeLimits | None = None) -> None:
        self.path = path
        self.servicer = servicer
        self.rules = rules
        self.limits = limits or EdgeLimits()
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
        self.connections = self.limits.connections()
        self.buffers = self.limits.buffers()
        self._refused_at = 0.0  # when a connection over the limit was last logged
        self._idle = threading.Condition()
        self._thread = threading.Thread(target=self._accept, name="gateway", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self.sock.accept()
            except OSError as exc:
                if self._closed or not callers.out_of_files(exc):
                    return
                time.sleep(0.05)  # no descriptor left: once one is closed, on
                continue
            uid, gid = _peer_ids(conn)
            if self.allowed is not None and uid not in self.allowed:
                conn.close()
                continue
            caller = callers.agent(uid, gid)
            key = None if caller is None else uid
            if not self.connections.take(key, 1):
                self._refuse(conn, key)  # a thread each: no caller may take them all
                continue
            threading.Thread(target=self._serve, args=(conn, caller, key),
                             name="gateway-call", daemon=True).start()

    def _refuse(self, conn: socket.socket, key: int | None) -> None:
        """Answer a connection over the limits RESOURCE_EXHAUSTED, as a JSON line (what
        a hook reads; a frames client sees the connection end), and close it."""
        why = self.connections.refusal(key)
        try:
            conn.setblocking(False)
            conn.send(_line(_error("RESOURCE_EXHAUSTED", why)))
        except OSError:
            pass
        conn.close()
        if time.monotonic() - self._refused_at > 60:
            self._refused_at = time.monotonic()
            log.warning("gateway: refused a connection: %s", why)

    def _serve(self, conn: socket.socket, caller: Agent | None, key: int | None) -> None:
        callers.CALLER.set(caller)  # for every call on this connection (its own thread)
        reader = _Reader(conn, self.buffers, key, self.limits.idle_seconds)
        try:
            with conn:
                conn.settimeout(self.limits.idle_seconds)  # each read, and each answer
                try:
                    first = reader.line(self.limits.max_line)
                    if first == wire.PREFACE:
                        reader.done()
                        reader.frames = True
                        self._serve_frames(conn, reader)
                    else:
                        self._serve_lines(conn, reader, first)
                except _Full:
                    why = "the gateway's buffers are full: " + self.buffers.refusal(key)
                    conn.sendall(_error_frame("RESOURCE_EXHAUSTED", why) if reader.frames
                                 else _line(_error("RESOURCE_EXHAUSTED", why)))
        except OSError:
            pass  # the caller went away, or sent nothing for --idle-seconds
        finally:
            reader.close()
            self.connections.give(key, 1)

    def _serve_lines(self, conn: socket.socket, reader: _Reader, line: bytes) -> None:
        limit = self.limits.max_line
        while line:
            ended = line.endswith(b"\n")
            too_long = len(line) - ended > limit
            if too_long:  # answered at once; the rest of it is read and dropped, then on
                answer = _error("RESOURCE_EXHAUSTED", f"a request line over {limit} bytes"
                                " (--gateway-max-line)")
            else:
                answer = self.call(line)
            del line
            conn.sendall(_line(answer))
            reader.done()
            if too_long and not ended and not reader.skip_line():
                return
            line = reader.line(limit)

    def _serve_frames(self, conn: socket.socket, reader: _Reader) -> None:
        while True:
            try:
                body = reader.frame()
            except wire.FrameError as exc:  # out of step with the caller: answer, then end
                code = ("RESOURCE_EXHAUSTED" if isinstance(exc, wire.FrameTooLarge)
                        else "INVALID_ARGUMENT")
                conn.sendall(_error_frame(code, f"not a frame: {exc}"))
                return
            if body is None:
                return
            answer = self.call_frame(body)
            del body
            conn.sendall(answer)
            reader.done()

    def call(self, line: bytes) -> dict:
        """One request line to its answer; never raises."""
        try:
            with _PARSING:  # its objects gone before the next line's are made
                shape = _shape_error(line)
                if shape is not None:
                    raise ValueError(shape)
                envelope = json.loads(line)
                if not isinstance(envelope, dict):
                    raise ValueError("not a JSON object")
                method, request = parse_request(envelope.get("method", ""),
                                                envelope.get("request"))
                name = envelope.get("method")
                timeout = envelope.get("timeout")
                del envelope
            if method is None:
                return _error("UNIMPLEMENTED", f"no method {name!r} in {SERVICE.full_name}")
            if timeout is not None and (isinstance(timeout, bool) or not isinstance(
                    timeout, int | float) or not timeout >= 0):
                raise ValueError(f"timeout {timeout!r} is not a number of seconds")
        except RecursionError:
            return _error("INVALID_ARGUMENT", f"not a request: nested deeper than {MAX_DEPTH}")
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


def _line(answer: dict) -> bytes:
    return json.dumps(answer, ensure_ascii=False).encode() + b"\n"


def _shape_error(line: bytes) -> str | None:
    """Why a request line is not one the gateway decodes, by its shape alone: lists and
    objects nested deeper than ``MAX_DEPTH``, or more than ``MAX_ITEMS`` of them and
    their items. Checked before a byte is decoded, it keeps a line's objects within a
    few times its size (a line of ``[],`` would make a list object of each three
    bytes: 20 times). Counted first in the whole line, which is quick; only a line
    that fails that is counted again without its strings (JSON's own lexing), so
    brackets and commas inside strings count for nothing."""
    if _shape_of(line) is None:
        return None
    return _shape_of(_STRING.sub(b"", line))


def _shape_of(text: bytes) -> str | None:
    if text.count(b",") + text.count(b"[") + text.count(b"{") > MAX_ITEMS:
        return f"more than {MAX_ITEMS} lists, objects and items"
    depth = 0
    for c in text.translate(None, _NOT_BRACKET):
        depth += 1 if c in b"[{" else -1
        if depth > MAX_DEPTH:
            return f"nested deeper than {MAX_DEPTH}"
    return None


class _Reader:
    """A connection's requests, as lines or frames. Each read is counted against the
    gateway's buffers (``Quota``) before it is made, and given back once its request
    is answered (``done``): what the daemon holds of every connection's requests stays
    within ``--gateway-buffer-bytes``. A read waits for the peer up to the socket's
    timeout (``--idle-seconds``), and for room in the buffers as long again
    (``_Full`` after that)."""

    def __init__(self, conn: socket.socket, budget: Quota, key: int | None,
                 wait: float) -> None:
        self.conn, self.budget, self.key, self.wait = conn, budget, key, wait
        self.buf = bytearray()
        self.held = 0  # counted against the budget: the buffer and the request under way
        self.frames = False

    def _more(self, size: int = CHUNK) -> bool:
        """One read of up to ``size`` bytes into the buffer; False at the stream's end."""
        if not self.conn.recv(1, socket.MSG_PEEK):  # the wait: nothing counted meanwhile
            return False
        if not self.budget.take(self.key, size, self.wait):
            raise _Full
        try:
            data = self.conn.recv(size)
        except BaseException:
            self.budget.give(self.key, size)
            raise
        self.budget.give(self.key, size - len(data))
        self.held += len(data)
        self.buf += data
        return bool(data)

    def _cut(self, n: int) -> bytearray:
        if n == len(self.buf):
            out, self.buf = self.buf, bytearray()
        else:
            out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def line(self, limit: int) -> bytearray:
        """The next line with its newline; what is buffered, once that is over
        ``limit`` bytes with no newline; at the stream's end, what is left (b"": none)."""
        start = 0
        while True:
            end = self.buf.find(b"\n", start)
            if end >= 0:
                return self._cut(end + 1)
            start = len(self.buf)  # no newline before: what is read next is searched
            if start > limit or not self._more():
                return self._cut(start)

    def skip_line(self) -> bool:
        """Read and drop the rest of the line under way (``line`` gave its start, over
        the limit); False if the stream ends first."""
        while True:
            end = self.buf.find(b"\n")
            if end >= 0:
                self._cut(end + 1)
                self.done()
                return True
            self.buf = bytearray()
            self.done()
            if not self._more():
                return False

    def frame(self) -> bytearray | None:
        """The next frame's body (worldline.wire.frames); None at a clean end before one."""
        head = self._exactly(4, eof_ok=True)
        if head is None:
            return None
        length = int.from_bytes(head, "big")
        if length > wire.MAX_FRAME:
            raise wire.FrameTooLarge(f"a frame of {length} bytes, over the"
                                     f" {wire.MAX_FRAME}-byte limit")
        if length > self.budget.room(self.key):
            raise _Full  # it could never be held
        return self._exactly(length, eof_ok=False)

    def _exactly(self, n: int, eof_ok: bool) -> bytearray | None:
        while len(self.buf) < n:  # never read past it: its buffer becomes the body
            if not self._more(min(CHUNK, n - len(self.buf))):
                if eof_ok and not self.buf:
                    return None
                raise wire.FrameError(f"the stream ended {n - len(self.buf)} bytes into"
                                      " a frame")
        return self._cut(n)

    def done(self) -> None:
        """The request under way is answered: what it held is free again."""
        gone = self.held - len(self.buf)
        self.held -= gone
        self.budget.give(self.key, gone)

    def close(self) -> None:
        self.buf = bytearray()
        self.done()
