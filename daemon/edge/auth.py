"""Who may call the daemon.

- On a Unix socket: the socket is 0600 in a 0700 folder, so only its owner can
  connect. With ``--allow-uid``, other users may connect too: the daemon then also
  listens on ``<socket>.shared`` (0666) through a relay that reads each connecting
  peer's credentials (SO_PEERCRED) and closes the connection of any uid not
  allowed, before a byte of it reaches gRPC, and of an allowed user past its share
  of connections (limits.py).
- On TCP: TLS and a bearer token are both required (the daemon refuses to start
  without them); every call must carry ``authorization: Bearer <token>``, checked in
  constant time, or it is UNAUTHENTICATED. Health checks need no token.
"""

from __future__ import annotations

import hmac
import logging
import os
import selectors
import socket
import struct
import threading
import time

import grpc

from .callers import out_of_files, relay_address
from .limits import Quota

log = logging.getLogger(__name__)
OPEN_METHODS = ("/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch")


def _refusal(handler, code: grpc.StatusCode, message: str):
    def abort(request_or_iterator, context):
        context.abort(code, message)

    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(abort)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(abort)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(abort)
    return grpc.stream_stream_rpc_method_handler(abort)


class TokenInterceptor(grpc.ServerInterceptor):
    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    def intercept_service(self, continuation, details):
        handler = continuation(details)
        if handler is None or details.method in OPEN_METHODS:
            return handler
        given = dict(details.invocation_metadata or ()).get("authorization", "")
        if isinstance(given, str):
            given = given.encode()
        if hmac.compare_digest(given, self._expected):
            return handler
        return _refusal(handler, grpc.StatusCode.UNAUTHENTICATED,
                        "a valid bearer token is required (authorization: Bearer <token>)")


def read_token(path: str) -> str:
    with open(path) as f:
        token = f.read().strip()
    if len(token) < 16:
        raise ValueError(f"the token in {path} is shorter than 16 characters")
    return token


class PeerRelay:
    """Relays connections from a shared socket to the daemon's private one, admitting
    only peers whose uid is allowed (the daemon's own uid always is)."""

    def __init__(self, public: str, private: str, allowed_uids: set[int],
                 connections: Quota | None = None) -> None:
        self.public, self.private = public, private
        self.allowed = allowed_uids | {os.geteuid()}
        self.connections = connections or Quota("connections", 1 << 30, 1 << 30, 0)
        if os.path.lexists(public):
            os.unlink(public)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(public)
        os.chmod(public, 0o666)
        self.listener.listen(64)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="peer-relay", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError as exc:
                if self._stop.is_set() or not out_of_files(exc):
                    return
                time.sleep(0.05)  # no descriptor left: once one is closed, on
                continue
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                    struct.calcsize("3i"))
            pid, uid, gid = struct.unpack("3i", creds)
            if uid not in self.allowed:
                log.warning("refused a connection from uid %d (pid %d): not allowed", uid, pid)
                conn.close()
                continue
            key = None if uid in (0, os.geteuid()) else uid
            if not self.connections.take(key, 1):  # a thread each: its share of them
                conn.close()
                continue
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                # From an address naming the peer: the daemon's calls know who it is
                # (callers.py); none but the daemon's uid reaches the private socket.
                upstream.bind(relay_address(uid, gid))
                upstream.connect(self.private)
            except OSError:
                conn.close()
                upstream.close()
                self.connections.give(key, 1)
                continue
            threading.Thread(target=self._pump, args=(conn, upstream, key),
                             daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket, key: int | None) -> None:
        try:
            _pump_pair(a, b)
        finally:
            self.connections.give(key, 1)

    def close(self) -> None:
        self._stop.set()
        self.listener.close()
        try:
            os.unlink(self.public)
        except FileNotFoundError:
            pass


def _pump_pair(a: socket.socket, b: socket.socket) -> None:
    sel = selectors.DefaultSelector()
    sel.register(a, selectors.EVENT_READ, b)
    sel.register(b, selectors.EVENT_READ, a)
    try:
        while True:
            for key, _ in sel.select():
                data = key.fileobj.recv(65536)
                if not data:
                    return
                key.data.sendall(data)
    except OSError:
        pass
    finally:
        sel.close()
        a.close()
        b.close()
