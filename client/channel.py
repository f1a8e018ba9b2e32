"""Channels to the daemon, blocking or asyncio, and the mapping of failed calls
back to worldline errors: one place for both clients and the LangGraph saver."""

from __future__ import annotations

import os

import grpc
from worldline.wire.frames import MAX_MESSAGE

from .config import connect_errno, unix_path, unreachable
from .errors import Unavailable, WorldlineError, error_for_code

OPTIONS = [("grpc.max_receive_message_length", MAX_MESSAGE),
           ("grpc.max_send_message_length", MAX_MESSAGE)]


def _credentials(token: str | None, tls_ca: str | None) -> grpc.ChannelCredentials:
    """On TCP the channel is TLS, trusting ``tls_ca`` (a PEM file; default
    ``$WORLDLINE_TLS_CA``, else the system's roots), and every call carries the bearer
    ``token`` (default ``$WORLDLINE_TOKEN``)."""
    ca = tls_ca or os.environ.get("WORLDLINE_TLS_CA")
    roots = None
    if ca:
        with open(ca, "rb") as f:
            roots = f.read()
    creds = grpc.ssl_channel_credentials(root_certificates=roots)
    token = token or os.environ.get("WORLDLINE_TOKEN")
    if token:
        creds = grpc.composite_channel_credentials(
            creds, grpc.access_token_call_credentials(token))
    return creds


def open_channel(address: str, token: str | None = None, tls_ca: str | None = None,
                 aio: bool = False):
    """A channel to ``address`` (``unix:///abs/path`` or ``host:port``); with ``aio``, a
    ``grpc.aio`` channel for the running event loop."""
    kind = grpc.aio if aio else grpc
    if unix_path(address) is not None:
        return kind.insecure_channel(address, options=OPTIONS)
    return kind.secure_channel(address, _credentials(token, tls_ca), options=OPTIONS)


def mapped(exc: grpc.RpcError, address: str) -> WorldlineError:
    """The worldline error a failed call stands for."""
    code, details = exc.code(), exc.details() or ""
    path = unix_path(address)
    if code == grpc.StatusCode.UNAVAILABLE and path is not None:
        err = connect_errno(path)  # None: the daemon listens, and its answer stands
        if err is not None:
            return Unavailable(unreachable(address, err))
    return error_for_code(code.name, details)
