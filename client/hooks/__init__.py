"""Agent hooks: ``worldline hook AGENT`` (one event: the agent's payload on stdin, its
answer on stdout) and ``worldline init AGENT`` (the hooks merged into the agent's
settings). Everything here imports only the standard library, the light client
(``worldline.client.lite``) and the wire's vocabulary (``worldline.wire``: the policy
the daemon applies, read here when the daemon cannot be reached), because it runs as a
new process on every tool call."""

from .run import main

__all__ = ["main"]
