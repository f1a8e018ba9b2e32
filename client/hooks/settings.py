"""``worldline init AGENT``: the hook configuration merged into the agent's settings.

| agent | project file | user file |
|---|---|---|
| claude-code | .claude/settings.json | ~/.claude/settings.json |
| codex | .codex/hooks.json | ~/.codex/hooks.json |
| gemini | .gemini/settings.json | ~/.gemini/settings.json |
| cursor | .cursor/hooks.json | ~/.cursor/hooks.json |

Claude Code and Codex: ``hooks.EVENT = [{"hooks": [{"type": "command", "command",
"timeout" (s)}]}]``; Gemini CLI the same with ``"name"`` and the timeout in ms; Cursor
``{"version": 1, "hooks": {"event": [{"command"}]}}``. No matcher: every tool.

Merging keeps every other setting and every other hook; worldline's own entries are
the ones whose command runs ``worldline hook`` (so a second ``init`` replaces them
rather than adding more). A file that changes is backed up first beside itself.
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
import time

from ..errors import FailedPrecondition, InvalidArgument

FILES = {
    "claude-code": (".claude/settings.json", "~/.claude/settings.json"),
    "codex": (".codex/hooks.json", "~/.codex/hooks.json"),
    "gemini": (".gemini/settings.json", "~/.gemini/settings.json"),
    "cursor": (".cursor/hooks.json", "~/.cursor/hooks.json"),
}
EVENTS = {
    "claude-code": ("SessionStart", "PreToolUse", "PostToolUse", "UserPromptSubmit", "Stop",
                    "SessionEnd"),
    "codex": ("SessionStart", "PreToolUse", "PostToolUse", "UserPromptSubmit", "Stop"),
    "gemini": ("SessionStart", "BeforeTool", "AfterTool", "BeforeAgent", "AfterAgent"),
    "cursor": ("sessionStart", "beforeShellExecution", "beforeMCPExecution",
               "afterShellExecution", "afterMCPExecution", "afterFileEdit",
               "beforeSubmitPrompt", "stop"),
}
PRE_EVENTS = {"PreToolUse", "BeforeTool", "beforeShellExecution", "beforeMCPExecution"}
MARK = "worldline hook"


def settings_path(agent: str, user: bool, project: str) -> str:
    project_file, user_file = FILES[agent]
    return os.path.expanduser(user_file) if user else os.path.join(project, project_file)


def _ours(entry: dict) -> bool:
    commands = [entry.get("command", "")] + [h.get("command", "") for h in
                                             entry.get("hooks", []) if isinstance(h, dict)]
    return any(isinstance(c, str) and MARK in c for c in commands)


def _without_ours(doc: dict) -> dict:
    hooks = doc.get("hooks")
    if not isinstance(hooks, dict):
        return doc
    kept = {}
    for event, entries in hooks.items():
        if not isinstance(entries, list):
            kept[event] = entries
            continue
        rest = []
        for entry in entries:
            if not isinstance(entry, dict):
                rest.append(entry)
            elif "hooks" in entry and isinstance(entry["hooks"], list):
                inner = [h for h in entry["hooks"] if not (isinstance(h, dict) and _ours(h))]
                if inner:
                    rest.append({**entry, "hooks": inner})
                elif not entry["hooks"]:
                    rest.append(entry)
            elif not _ours(entry):
                rest.append(entry)
        if rest:
            kept[event] = rest
    out = dict(doc)
    if kept:
        out["hooks"] = kept
    else:
        out.pop("hooks")
    return out


def _with_ours(doc: dict, agent: str, command: str, pre_timeout: int) -> dict:
    doc = dict(_without_ours(doc))
    hooks = dict(doc.get("hooks") or {})
    for event in EVENTS[agent]:
        seconds = pre_timeout if event in PRE_EVENTS else 60
        if agent == "cursor":
            entry = {"command": command}
        elif agent == "gemini":
            entry = {"hooks": [{"type": "command", "name": "worldline", "command": command,
                                "timeout": seconds * 1000}]}
        else:
            entry = {"hooks": [{"type": "command", "command": command, "timeout": seconds}]}
        hooks[event] = list(hooks.get(event) or []) + [entry]
    doc["hooks"] = hooks
    if agent == "cursor":
        doc.setdefault("version", 1)
    return doc


def init(agent: str, *, user: bool = False, project: str = ".", remove: bool = False,
         dry_run: bool = False, command: str = "", pre_timeout: int = 60) -> dict:
    """Merge (or with ``remove``, take out) worldline's hooks; returns what it did:
    ``path``, ``changed``, ``backup``, ``events`` and ``diff``."""
    if agent not in FILES:
        raise InvalidArgument(f"no settings file is known for {agent!r}: `worldline hook"
                              f" generic` is configured by hand (README, Agent hooks)")
    path = settings_path(agent, user, os.path.abspath(project))
    try:
        with open(path, encoding="utf-8") as f:
            old_text = f.read()
    except FileNotFoundError:
        old_text = ""
    try:
        doc = json.loads(old_text) if old_text.strip() else {}
    except ValueError as exc:
        raise FailedPrecondition(f"{path} is not valid JSON ({exc}); it was left as it"
                                 " is") from None
    if not isinstance(doc, dict):
        raise FailedPrecondition(f"{path} does not hold a JSON object; it was left as it is")
    new = _without_ours(doc) if remove else _with_ours(
        doc, agent, command or f"worldline hook {agent}", pre_timeout)
    new_text = json.dumps(new, indent=2, ensure_ascii=False) + "\n"
    changed = new != doc
    diff = "".join(difflib.unified_diff(
        old_text.splitlines(True), new_text.splitlines(True), f"{path} (before)",
        f"{path} (after)")) if changed else ""
    backup = ""
    if changed and not dry_run:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if old_text:
            backup = f"{path}.bak-{time.strftime('%Y%m%d%H%M%S')}"
            shutil.copy2(path, backup)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(new_text)
        if old_text:
            shutil.copymode(path, tmp)
        os.replace(tmp, path)
    return {"agent": agent, "path": path, "changed": changed, "dry_run": dry_run,
            "removed": remove, "backup": backup or None,
            "events": [] if remove else list(EVENTS[agent]), "diff": diff}
