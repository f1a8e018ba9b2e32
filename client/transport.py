"""How the Python client's calls reach the daemon: gRPC, or frames on the gateway.

``open_transport(address, ...)`` gives an object with ``call(method, request,
timeout)`` (a request message in, the response message out, a ``WorldlineError``
raised) and ``close()``. On TCP it is gRPC (TLS and a bearer token). On a Unix socket
it is the gateway's frames (worldline.wire.frames) at ``<socket>.json`` when the daemon
serves them, which answers a call after an idle gap about a millisecond sooner than
gRPC does; a daemon without the gateway (or an address that is a relay, such as
``--allow-uid``'s ``.shared`` socket) is called over gRPC, decided at each new
connection.
"""

from __future__ import annotations

import os
import socket
import threading
import time

from worldline.v1 import worldline_pb2 as pb
from worldline.wire import frames as wire

from .config import unix_path, unreachable
from .errors import DeadlineExceeded, ResourceExhausted, Unavailable, error_for_code

GATEWAY_SUFFIX = ".json"
KINDS = ("auto", "grpc", "frames")

_SERVICE = pb.DESCRIPTOR.services_by_name["Worldline"]
_RESPONSES = {m.name: getattr(pb, m.output_type.name) for m in _SERVICE.methods}
_NO_GATEWAY = (FileNotFoundError, ConnectionRefusedError, NotADirectoryError)
_NOSIGNAL = socket.MSG_NOSIGNAL  # a daemon gone is an error, not a SIGPIPE for the caller
# A pooled connection idle this long is closed rather than used: the daemon closes one
# that sent nothing for --idle-seconds (60 by default), and a call sent as it does so
# could not tell that it was never read.
POOL_IDLE = 10.0


class GrpcTransport:
    """Calls over a gRPC channel (grpc is imported here, when one is made: a client on
    a Unix socket never loads it)."""

    def __init__(self, address: str, token: str | None = None,
                 tls_ca: str | None = None) -> None:
        import grpc
        from worldline.v1 import worldline_pb2_grpc as pb_grpc

        from .channel import mapped, open_channel
        self.address = address
        self._channel = open_channel(address, token, tls_ca)
        self._stub = pb_grpc.WorldlineStub(self._channel)
        self._failed, self._mapped = grpc.RpcError, mapped

    def call(self, method: str, request, timeout: float):
        try:
            return getattr(self._stub, method)(request, timeout=timeout)
        except self._failed as exc:
            raise self._mapped(exc, self.address) from None

    def close(self) -> None:
        self._channel.close()


class FrameTransport:
    """Calls as frames on the gateway's socket. Each call has a connection to itself
    (taken from a pool, or opened), so several threads may call at once, as on a gRPC
    channel; with ``fallback``, a gateway that is not there sends the call over gRPC."""

    def __init__(self, address: str, fallback: bool = True) -> None:
        self.address = address
        self.path = unix_path(address) + GATEWAY_SUFFIX
        self._fallback = fallback
        self._grpc: GrpcTransport | None = None
        self._idle: list[tuple[socket.socket, float]] = []  # and when each was given back
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._closed = False

    def call(self, method: str, request, timeout: float):
        """One call, given ``timeout`` seconds in all: waiting for room to connect,
        sending, and each read of the answer take what is left of it, so a daemon
        that answers a byte at a time still costs the caller its deadline, not more."""
        kind = _RESPONSES.get(method)
        if kind is None:
            raise error_for_code("UNIMPLEMENTED", f"no method {method!r} in {_SERVICE.full_name}")
        message = request.SerializeToString()
        if len(message) > wire.MAX_MESSAGE:  # as a gRPC channel refuses it, before sending
            raise ResourceExhausted(f"Sent message larger than max ({len(message)} vs."
                                    f" {wire.MAX_MESSAGE})")
        deadline = time.monotonic() + timeout
        sock, reused = self._take(deadline)
        if sock is None:
            return self._over_grpc().call(method, request, _until(deadline))
        frame = wire.request_frame(method, message, _until(deadline))  # the daemon's too
        try:
            try:
                _send(sock, frame, deadline)
            except (BrokenPipeError, ConnectionResetError):
                if not reused:
                    raise
                # the daemon closed this idle connection (it restarted): nothing was
                # delivered, so the call goes on a new one
                sock.close()
                sock, _ = self._take(deadline, fresh=True)
                if sock is None:
                    return self._over_grpc().call(method, request, _until(deadline))
                _send(sock, frame, deadline)
            body = wire.read_frame(_receiver(sock, deadline))
        except TimeoutError:
            sock.close()
            raise DeadlineExceeded("Deadline Exceeded") from None
        except (OSError, wire.FrameError) as exc:
            sock.close()
            raise Unavailable(f"the worldline daemon at {self.address} did not answer:"
                              f" {exc}") from None
        if body is None:
            sock.close()
            raise Unavailable(f"the worldline daemon at {self.address} closed the connection")
        self._give(sock)
        status, payload = wire.read_answer(body)
        if status != 0:
            code = wire.CODES[status] if status < len(wire.CODES) else "UNKNOWN"
            raise error_for_code(code, payload.decode("utf-8", "replace"))
        return kind.FromString(payload)

    def _take(self, deadline: float, fresh: bool = False
              ) -> tuple[socket.socket | None, bool]:
        """A connection to the gateway and whether it was used before; (None, False)
        when the daemon serves no gateway there and the call may go over gRPC. A
        connection opened here waits until ``deadline`` at most (a daemon too busy to
        accept it: DeadlineExceeded)."""
        with self._lock:
            if self._closed:
                raise Unavailable("this client is closed")
            if self._pid != os.getpid():  # a forked child: the parent's connections
                self._idle, self._pid = [], os.getpid()
            stale = time.monotonic() - POOL_IDLE
            while self._idle and self._idle[0][1] < stale:  # oldest first
                self._idle.pop(0)[0].close()
            if self._idle and not fresh:
                return self._idle.pop()[0], True
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            while True:
                sock.settimeout(_left(deadline))
                try:
                    sock.connect(self.path)
                    break
                except BlockingIOError:  # its backlog is full: a Unix socket says so at once
                    time.sleep(0.001)
            _send(sock, wire.PREFACE, deadline)
        except TimeoutError:
            sock.close()
            raise DeadlineExceeded("Deadline Exceeded") from None
        except OSError as exc:
            sock.close()
            if self._fallback and isinstance(exc, _NO_GATEWAY):
                return None, False  # gRPC then answers, or says that nothing listens
            raise Unavailable(unreachable(self.address, exc.errno)) from None
        return sock, False

    def _give(self, sock: socket.socket) -> None:
        with self._lock:
            if not self._closed and self._pid == os.getpid():
                self._idle.append((sock, time.monotonic()))
                return
        sock.close()

    def _over_grpc(self) -> GrpcTransport:
        with self._lock:
            if self._grpc is None:
                self._grpc = GrpcTransport(self.address)
            return self._grpc

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            grpc_transport, self._grpc = self._grpc, None
        for sock, _ in idle:
            sock.close()
        if grpc_transport is not None:
            grpc_transport.close()


def _left(deadline: float) -> float:
    """Seconds until ``deadline``; TimeoutError once it has passed."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    return left


def _until(deadline: float) -> float:
    """Seconds until ``deadline``, at least a millisecond: a timeout to hand on (the
    callee then says DeadlineExceeded itself)."""
    return max(deadline - time.monotonic(), 0.001)


def _send(sock: socket.socket, data: bytes, deadline: float) -> None:
    sock.settimeout(_left(deadline))  # sendall's timeout bounds the whole of it
    sock.sendall(data, _NOSIGNAL)


def _receiver(sock: socket.socket, deadline: float):
    """``sock.recv_into`` for read_frame, each read given what is left until
    ``deadline`` (a socket's timeout is per read)."""
    def recv_into(view) -> int:
        sock.settimeout(_left(deadline))
        return sock.recv_into(view)
    return recv_into


def open_transport(address: str, token: str | None = None, tls_ca: str | None = None,
                   kind: str = "auto") -> GrpcTransport | FrameTransport:
    """The transport for ``address``: ``auto`` is frames on a Unix socket (gRPC when the
    daemon serves no gateway) and gRPC on TCP; ``grpc`` and ``frames`` force one."""
    if kind not in KINDS:
        raise ValueError(f"transport {kind!r} is not one of {', '.join(KINDS)}")
    if kind == "grpc" or unix_path(address) is None:
        if kind == "frames":
            raise ValueError(f"frames need a Unix socket; {address} is TCP")
        return GrpcTransport(address, token, tls_ca)
    return FrameTransport(address, fallback=(kind == "auto"))
