"""The JSON form of the Worldline calls: a request as a dict with the .proto's field
names read into its message, and a response message written back as such a dict. The
daemon's gateway (daemon/edge/gateway.py) speaks it on ``<socket>.json``; the light
client (client/lite.py) sends it, and reads it through gRPC on TCP.

protobuf and the generated ``worldline.v1`` load on first use: the hook, which imports
the light client on every tool call, never needs them on a Unix socket.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def parse_request(method: str, request: dict | None):
    """The JSON form of a Worldline call, read: (the method's descriptor, its request
    message); the descriptor is None for a method the service does not have. Raises
    ``google.protobuf.json_format.ParseError`` for a request that does not fit. One
    reading for the gateway (daemon/edge/gateway.py) and the light client's gRPC fallback
    (client/lite.py)."""
    from google.protobuf import json_format
    from worldline.v1 import worldline_pb2 as pb
    descriptor = pb.DESCRIPTOR.services_by_name["Worldline"].methods_by_name.get(method)
    if descriptor is None:
        return None, None
    return descriptor, json_format.ParseDict(request or {},
                                             getattr(pb, descriptor.input_type.name)())


def response_json(message) -> dict[str, Any]:
    """A response message in its JSON form: the .proto's field names, every field
    present, 64-bit integers as numbers."""
    from google.protobuf import json_format
    return json_format.MessageToDict(message, always_print_fields_with_no_presence=True,
                                     preserving_proto_field_name=True,
                                     unquote_int64_if_possible=True)
