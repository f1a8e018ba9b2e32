"""The JSON gateway: the Worldline service's calls as JSON lines over a Unix socket.

It exists for clients that must start in milliseconds: an agent's hook runs as a new
process twice per tool call, and importing grpc alone costs such a process about
70 ms, where Python and ``json`` cost about 20. The gateway serves the same servicer
as the gRPC socket, maps errors through the same ``server.status_of``, and listens
at ``<socket>.json`` beside the gRPC socket with the same permissions (owner-only;
with ``--allow-uid``, every peer's uid is checked as the relay checks it).

Protocol. A connection carries any number of requests, one after another. Each is
one line of JSON::

    {"method": "CreateCheckpoint", "request": {...}, "timeout": 30}

``request`` is the method's request message in proto3 JSON with the .proto's field
names; ``timeout`` (seconds, optional) is the call's deadline, as gRPC's. The answer
is one line: ``{"response": {...}}`` with every field present, or
``{"error": {"code": "NOT_FOUND", "message": "..."}}`` with a gRPC status name.
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
from worldline.client.lite import parse_request, response_json
from worldline.v1 import worldline_pb2 as pb

from ..observe import ACTIVITY
from .server import WorldlineServicer, status_of

log = logging.getLogger(__name__)

SERVICE = pb.DESCRIPTOR.services_by_name["Worldline"]
MAX_LINE = 64 << 20
SUFFIX = ".json"


class _Context:
    """What a servicer may ask of its call: the time left before the deadline."""

    def __init__(self, timeout: float | None) -> None:
        self._deadline = None if timeout is None else time.monotonic() + timeout

    def time_remaining(self) -> float | None:
        return None if self._deadline is None else max(0.0, self._deadline - time.monotonic())


class JsonGateway:
    def __init__(self, path: str, servicer: WorldlineServicer,
                 allowed_uids: set[int] | None = None) -> None:
        self.path = path
        self.servicer = servicer
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
        self.sock.listen(64)
        self._closed = False
        self._active = 0
        self._idle = threading.Condition()
        self._thread = threading.Thread(target=self._accept, name="json-gateway", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            if self.allowed is not None and _peer_uid(conn) not in self.allowed:
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn,), name="json-call",
                             daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as lines:
            for line in lines:
                if len(line) > MAX_LINE:
                    answer = _error("RESOURCE_EXHAUSTED", f"a request over {MAX_LINE} bytes")
                else:
                    answer = self.call(line)
                try:
                    conn.sendall(json.dumps(answer, ensure_ascii=False).encode() + b"\n")
                except OSError:
                    return

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
        except (ValueError, TypeError, AttributeError, json_format.ParseError) as exc:
            return _error("INVALID_ARGUMENT", f"not a request: {exc}".splitlines()[0])
        with self._idle:
            if self._closed:
                return _error("UNAVAILABLE", "the worldline daemon is stopping")
            self._active += 1
        ACTIVITY.begin()
        try:
            reply = getattr(self.servicer, method.name)(request, _Context(timeout))
        except Exception as exc:  # noqa: BLE001 -- mapped exactly as the gRPC edge maps it
            code, message = status_of(exc, method.name)
            return _error(code, message)
        finally:
            ACTIVITY.end()
            with self._idle:
                self._active -= 1
                self._idle.notify_all()
        return {"response": response_json(reply)}

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


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]
