"""worldline's tests.

The tests fork children from the test process (``fidelity.in_child_as``) after gRPC
channels were used in it. gRPC's fork handlers, on by default in grpcio's recent
releases, wait in ``fork()`` for gRPC's threads to stop, and a 0.7.27 CI run hung there
for good (`os.fork` in ``in_child_as``, the stack in cygrpc's prefork handler). The
children never use gRPC (``in_fresh_child_as`` is for those), so the handlers are off
for the test process, set before anything imports grpc (the Makefile sets it too, for
pytest's plugins).
"""

import os

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
