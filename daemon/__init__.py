"""The worldline daemon.

gRPC's fork handlers (``pthread_atfork``, on by default in grpcio's recent releases)
run at every ``fork()`` of a process that loaded gRPC, and wait there for gRPC's own
threads; one that never comes to a stop leaves the forking thread blocked for good.
The daemon never forks (its subprocesses start through vfork, which runs no fork
handlers), so the handlers buy it nothing and could only hang it: they are off unless
the environment says otherwise. Set before anything imports grpc.
"""

import os

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
