"""A client that starts in milliseconds, for commands that run on every tool call.

``connect(address)`` gives an object with one method, ``call(method, request)``:
the daemon's Worldline calls by name, requests and responses as dicts with the
.proto's field names (every response field present). On a Unix socket it speaks
JSON lines to the daemon's gateway at ``<socket>.json`` (daemon/edge/gateway.py) and
imports nothing heavier than ``json`` and ``socket``; importing grpc would cost a
new process about 70 ms. On TCP it goes through the gRPC client with the same
interface. Errors are the usual ``WorldlineError`` subclasses.
"""

from __future__ import annotations

import _socket  # the C module: `socket` would add selectors, enum and more to start-up
import time

from worldline.wire.jsonform import parse_request, response_json

from . import _json as json
from .config import default_address, normalize_address, unix_path, unreachable
from .errors import Unavailable, WorldlineError, error_for_code

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

GATEWAY_SUFFIX = ".json"


class LiteClient:
    def __init__(self, address: str, timeout: float = 120.0) -> None:
        self.address = address
        self.timeout = timeout
        self.path = unix_path(address) + GATEWAY_SUFFIX
        self._sock = None
        self._buffer = b""

    def __enter__(self) -> LiteClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _connect(self) -> None:
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.path)
        except OSError as exc:
            sock.close()
            raise Unavailable(unreachable(self.address, exc.errno)) from None
        self._sock, self._buffer = sock, b""

    def _readline(self, deadline: float) -> bytes:
        """The answer's line; each read is given what is left until ``deadline`` (a
        daemon that answers a byte at a time still costs the call its deadline)."""
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("timed out")
            self._sock.settimeout(left)
            chunk = self._sock.recv(1 << 16)
            if not chunk:
                return b""
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def call(self, method: str, request: dict | None = None,
             timeout: float | None = None) -> dict[str, Any]:
        if self._sock is None:
            self._connect()
        wait = timeout or self.timeout
        deadline = time.monotonic() + wait + 5  # the daemon's own, and time to answer
        self._sock.settimeout(wait + 5)
        envelope = {"method": method, "request": request or {}, "timeout": wait}
        try:
            self._sock.sendall(json.dumps(envelope).encode() + b"\n")
            line = self._readline(deadline)
        except OSError as exc:
            self.close()
            raise Unavailable(f"the worldline daemon at {self.address} did not answer:"
                              f" {exc}") from None
        if not line:
            self.close()
            raise Unavailable(f"the worldline daemon at {self.address} closed the connection")
        answer = json.loads(line)
        if "error" in answer:
            raise error_for_code(answer["error"]["code"], answer["error"]["message"])
        return answer["response"]

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


class GrpcJsonClient:
    """The same interface over gRPC, for daemons on TCP (TLS and a bearer token)."""

    def __init__(self, address: str, timeout: float = 120.0) -> None:
        from ._client import Client
        self._client = Client(address, timeout=timeout)
        self.address = address

    def __enter__(self) -> GrpcJsonClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def call(self, method: str, request: dict | None = None,
             timeout: float | None = None) -> dict[str, Any]:
        descriptor, message = parse_request(method, request)
        if descriptor is None:
            raise WorldlineError(f"no method {method!r}")
        return response_json(self._client._call(method, message, timeout))

    def close(self) -> None:
        self._client.close()


def connect(address: str | None = None, timeout: float = 120.0) -> LiteClient | GrpcJsonClient:
    """A light client for ``address`` (None: ``$WORLDLINE_ADDRESS`` or the default
    socket)."""
    address = normalize_address(address) if address else default_address()
    if unix_path(address) is not None:
        return LiteClient(address, timeout)
    return GrpcJsonClient(address, timeout)
