"""The gateway's framed form: the Worldline service's calls as protobuf frames over the
daemon's Unix socket ``<socket>.json``, for the Python client.

A gRPC call over a Unix socket costs about 1.2 ms on a 2-core VM once the client has
been idle for a few milliseconds (HTTP/2 framing and grpcio's threads waking one
another), which is most of a small checkpoint; an agent's checkpoint always follows an
idle gap (the tool call it records). These frames carry the same request and response
messages with nothing around them.

A connection that starts with the line ``PREFACE`` speaks frames; any other first line
is the gateway's JSON form (daemon/edge/gateway.py). After the preface, any number of
calls follow, one at a time. All integers are big-endian::

    request:  u32 length of the rest, u8 length of the method name, the name (ASCII),
              f64 timeout in seconds (0: none), the request message
    answer:   u32 length of the rest, u8 status (gRPC's numeric code; 0 is OK), then
              the response message (OK) or the error's message in UTF-8
"""

from __future__ import annotations

import struct

PREFACE = b"WORLDLINE-FRAMES/1\n"
MAX_MESSAGE = 64 << 20  # as the gRPC channel's message limit
MAX_FRAME = MAX_MESSAGE + 264  # a message, its method's name and the timeout

# gRPC's status codes by number, as the answer's status byte carries them
CODES = ("OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
         "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
         "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
         "UNAUTHENTICATED")
STATUS = {name: number for number, name in enumerate(CODES)}

_LENGTH = struct.Struct(">I")
_TIMEOUT = struct.Struct(">d")


class FrameError(ValueError):
    """A frame that does not fit the form above."""


class FrameTooLarge(FrameError):
    """A frame whose length is over ``MAX_FRAME``: the stream cannot be read past it."""


def request_frame(method: str, message: bytes, timeout: float | None) -> bytes:
    name = method.encode("ascii")
    body = bytes((len(name),)) + name + _TIMEOUT.pack(timeout or 0.0) + message
    return _LENGTH.pack(len(body)) + body


def read_request(body: bytes) -> tuple[str, float | None, bytes]:
    """(method, timeout or None, request message) of a request frame's body."""
    if not body:
        raise FrameError("an empty frame")
    end = 1 + body[0]
    if len(body) < end + _TIMEOUT.size:
        raise FrameError("a frame shorter than its header")
    try:
        method = body[1:end].decode("ascii")
    except UnicodeDecodeError:
        raise FrameError("a method name that is not ASCII") from None
    (timeout,) = _TIMEOUT.unpack_from(body, end)
    if not timeout >= 0.0:  # NaN or negative
        raise FrameError(f"timeout {timeout!r}")
    return method, (timeout or None), body[end + _TIMEOUT.size:]


def answer_frame(status: int, payload: bytes) -> bytes:
    return _LENGTH.pack(len(payload) + 1) + bytes((status,)) + payload


def read_answer(body: bytes) -> tuple[int, bytes]:
    """(status, response message or error text) of an answer frame's body."""
    if not body:
        raise FrameError("an empty frame")
    return body[0], body[1:]


def read_frame(recv_into) -> bytes | None:
    """The next frame's body from a stream, read with ``recv_into`` (a socket's or a
    buffered file's ``readinto``); None at a clean end of stream before a frame."""
    head = _read_exactly(recv_into, _LENGTH.size, eof_ok=True)
    if head is None:
        return None
    (length,) = _LENGTH.unpack(head)
    if length > MAX_FRAME:
        raise FrameTooLarge(f"a frame of {length} bytes, over the {MAX_FRAME}-byte limit")
    return _read_exactly(recv_into, length, eof_ok=False)


def _read_exactly(recv_into, n: int, eof_ok: bool) -> bytes | None:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = recv_into(view[got:])
        if not k:
            if got == 0 and eof_ok:
                return None
            raise FrameError(f"the stream ended {n - got} bytes into a frame")
        got += k
    return bytes(buf)
