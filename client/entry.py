"""The ``worldline`` console script. ``worldline hook`` runs as a new process on every
tool call of an agent, so it goes straight to the hooks, which import neither the CLI's
parser nor grpc nor ``json``; every other command goes to ``worldline.client.cli``."""

import sys


def main() -> int:
    if sys.argv[1:2] == ["hook"]:
        from .hooks import main as hook
        return hook(sys.argv[2:])
    from .cli import main as cli
    return cli()
