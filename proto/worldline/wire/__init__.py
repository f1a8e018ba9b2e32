"""The vocabulary both sides of the wire speak, beside the generated ``worldline.v1``.

The daemon and the client each import this package and nothing of the other (the CLI
starts the daemon through one entry point, ``worldline.daemon.main``)::

    errors    the error tree, each class named after the gRPC status it travels as
    paths     file names on the wire: any bytes as a proto string, escaped and back
    frames    the gateway's framed form of the Worldline calls (protobuf frames)
    jsonform  the JSON form of the Worldline calls (the gateway's lines, the light client)
    address   the data root and the daemon's address, and their defaults
    policy    the side-effect policy: which effect a tool call has, and whether it
              needs approval (the daemon decides; the hook asks the same rules when
              the daemon cannot be reached)

Every module here imports only the standard library at its top (the hook, a new
process on every tool call, loads some of them).
"""
