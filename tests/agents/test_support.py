"""client/hooks/support.py against the real programs: each installed client's version
read as `worldline init` reads it, and the mode written for it."""

from __future__ import annotations

import pytest
from worldline.client.hooks import support

from . import CLAUDE_CODE, CODEX, GEMINI_CLI, agent_bin
from .sandbox import isolated_home


@pytest.mark.parametrize("agent, package, version, mode", [
    ("codex", "codex", CODEX, "deny"),  # 0.171.0 ignores ask: refused until approved
    ("claude-code", "claude-code", CLAUDE_CODE, "ask"),
    ("gemini", "gemini-cli", GEMINI_CLI, "deny"),
])
def test_detect_reads_the_installed_version(agent, package, version, mode, tmp_path):
    program = agent_bin(package, version)
    env = isolated_home(tmp_path)
    env["PATH"] = f"{program.parent}:{env['PATH']}"
    path, found = support.detect(agent, env)
    assert (path, found) == (str(program), version)
    assert support.approval_mode(agent, found)[0] == mode
    assert support.detect(agent, isolated_home(tmp_path)) == ("", "")  # not on PATH
