"""The gRPC edge's share of observability: every unary call timed into
``worldline_rpc_duration_seconds``, counted in the daemon's activity, and given the
request id its logs carry (daemon/observe.py holds the metrics themselves)."""

from __future__ import annotations

import time

import grpc

from .. import ids
from ..observe import ACTIVITY, REQUEST_ID, RPC_SECONDS


class MetricsInterceptor(grpc.ServerInterceptor):
    """Times every unary call and gives it a request id for the logs."""

    def intercept_service(self, continuation, details):
        handler = continuation(details)
        if handler is None or handler.unary_unary is None:
            return handler
        inner, method = handler.unary_unary, details.method.rsplit("/", 1)[-1]
        given = dict(details.invocation_metadata or ()).get("x-request-id")

        def timed(request, context):
            token = REQUEST_ID.set(given if isinstance(given, str) and given else ids.new_id())
            start = time.perf_counter()
            code = "OK"
            ACTIVITY.begin()
            try:
                return inner(request, context)
            except Exception:
                code = context.code().name if context.code() else "UNKNOWN"
                raise
            finally:
                ACTIVITY.end()
                RPC_SECONDS.labels(method, code).observe(time.perf_counter() - start)
                REQUEST_ID.reset(token)

        return grpc.unary_unary_rpc_method_handler(
            timed, request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer)
