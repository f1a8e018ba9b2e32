"""Inside the new network namespace: loopback up, the model server, then the agent.

``python tests/agents/sandbox_child.py PROVIDER SCRIPT LOG PORT -- ARGV...`` (run by
sandbox.run_agent under ``unshare --net``). Exits with the agent's status.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the project, for tests.*


def main() -> int:
    provider, script, log, port, sep, *argv = sys.argv[1:]
    assert sep == "--" and argv, "usage: PROVIDER SCRIPT LOG PORT -- ARGV..."
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    module = importlib.import_module(f"tests.agents.providers.{provider}")
    from tests.agents.providers import serve
    server = serve(module.Handler, script, log, int(port))
    try:
        return subprocess.run(argv).returncode
    finally:
        server.shutdown()


if __name__ == "__main__":
    sys.exit(main())
