"""The real agents' programs, driven headless against scripted model servers on 127.0.0.1.

``deploy/ensure-agents.sh`` (``make agents``, part of ``make test``) installs each pinned
version from the npm registry into the cache below; a test that needs one and finds it
missing fails with that reason rather than skipping.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE = Path(os.environ.get("WORLDLINE_AGENTS_CACHE",
                            Path.home() / ".cache" / "worldline" / "agents"))

CLAUDE_CODE = "2.1.197"
GEMINI_CLI = "0.61.0"
GEMINI_CLI_DOCUMENT = "0.38.2"  # the last to write one JSON document, not JSONL
CODEX = "0.171.0"

_BINARIES = {"claude-code": "claude", "gemini-cli": "gemini", "codex": "codex"}


def agent_bin(name: str, version: str) -> Path:
    """The pinned program's entry point, installed by deploy/ensure-agents.sh."""
    path = CACHE / f"{name}-{version}" / "node_modules" / ".bin" / _BINARIES[name]
    if not path.exists():
        raise AssertionError(f"{name} {version} is not installed at {path}: run"
                             " `make agents` (deploy/ensure-agents.sh) with the npm"
                             " registry reachable")
    return path
