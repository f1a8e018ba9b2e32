"""Claude Code, headless, against the scripted Anthropic server: the set-up both its
tests use (docs/agents.md says why each flag is there)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from . import CLAUDE_CODE, agent_bin
from .sandbox import AgentRun, base_url, isolated_home, run_agent

WORLDLINE = [sys.executable, "-m", "worldline.client.cli"]


def claude_env(root: Path) -> dict[str, str]:
    """An environment of its own (HOME under ``root``) that points Claude Code at the
    scripted server and turns off what would reach beyond it."""
    return {**isolated_home(root), "ANTHROPIC_BASE_URL": base_url("anthropic"),
            "ANTHROPIC_API_KEY": "test", "DISABLE_TELEMETRY": "1",
            "DISABLE_AUTOUPDATER": "1", "DISABLE_ERROR_REPORTING": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}


def run_claude(prompt: str, script: list, cwd: Path, env: dict[str, str], *args: str
               ) -> tuple[AgentRun, dict]:
    """``claude -p PROMPT --output-format json ARGS``; the run and its JSON result."""
    run = run_agent([str(agent_bin("claude-code", CLAUDE_CODE)), "-p", prompt,
                     "--output-format", "json", *args], provider="anthropic",
                    script=script, cwd=cwd, env=env, timeout=90).check()
    return run, json.loads(run.stdout)


def worldline(*args: str, cwd: Path | None = None) -> dict:
    out = subprocess.run(WORLDLINE + [*args, "--json"], capture_output=True, text=True,
                         cwd=cwd, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def conversation(run: AgentRun) -> list[dict]:
    """The conversation requests the server answered (those that offered tools)."""
    from .providers.anthropic import is_conversation
    return [r["body"] for r in run.requests if r["path"].startswith("/v1/messages")
            and isinstance(r["body"], dict) and is_conversation(r["body"])]


def tool_results(run: AgentRun) -> dict[str, dict]:
    """Each tool result the model was sent in the run's last request, by tool-use id."""
    out = {}
    for message in conversation(run)[-1]["messages"]:
        for block in message["content"] if isinstance(message["content"], list) else []:
            if block.get("type") == "tool_result":
                out[block["tool_use_id"]] = block
    return out
