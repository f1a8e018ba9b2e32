"""``worldline init AGENT``: the hook configuration merged into the agent's settings.

| agent | project file | user file |
|---|---|---|
| claude-code | .claude/settings.local.json (--shared: settings.json) | ~/.claude/settings.json |
| codex | .codex/hooks.json | ~/.codex/hooks.json |
| gemini | .gemini/settings.json | ~/.gemini/settings.json |
| cursor | .cursor/hooks.json | ~/.cursor/hooks.json |

Where an agent has a local, uncommitted project file (Claude Code's
settings.local.json, whose hooks it runs beside the shared file's: "Local settings" in
2.1.197's hook sources), the project's hooks go there by default: the command names
this machine's worldline (an absolute path, a socket), which is no one else's to run.
``--shared`` writes the committed file instead.

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
# The project's own file that is not to be committed, where the agent has one.
LOCAL = {"claude-code": ".claude/settings.local.json"}
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


def settings_path(agent: str, user: bool, project: str, shared: bool = False) -> str:
    """The file ``init`` writes: the user's; else the project's local one, where the
    agent has one and ``shared`` is not asked for; else the project's."""
    project_file, user_file = FILES[agent]
    if user:
        return os.path.expanduser(user_file)
    return os.path.join(project, project_file if shared else LOCAL.get(agent, project_file))


def has_ours(path: str) -> bool:
    """Whether the settings file at ``path`` holds worldline's hooks."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.loads(f.read() or "{}")
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and _without_ours(doc) != doc


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
         dry_run: bool = False, command: str = "", pre_timeout: int = 60,
         shared: bool = False) -> dict:
    """Merge (or with ``remove``, take out) worldline's hooks; returns what it did:
    ``path``, ``changed``, ``backup``, ``events``, ``diff`` and ``also`` (another of the
    project's files that holds worldline's hooks too: the agent would run both)."""
    if agent not in FILES:
        raise InvalidArgument(f"no settings file is known for {agent!r}: `worldline hook"
                              f" generic` is configured by hand (docs/hooks.md)")
    path = settings_path(agent, user, os.path.abspath(project), shared)
    other = (settings_path(agent, False, os.path.abspath(project), not shared)
             if not user and agent in LOCAL else path)
    also = other if other != path and has_ours(other) else None
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
            "events": [] if remove else list(EVENTS[agent]), "diff": diff, "also": also}


# -- Gemini CLI's folder trust ------------------------------------------------------------
# Gemini CLI (0.39.0 and later; read in 0.61.0's trust.ts, hookRegistry.ts, settings.ts,
# userStartupWarnings.ts) runs hooks only in a trusted folder. Headless (-p, no
# terminal, or CI=true) in a folder it does not trust, 0.61.0 refuses to start (exit 55,
# "not running in a trusted directory"; --skip-trust trusts it for the run).
# Interactive, it asks; a folder left untrusted runs with no project settings
# (.gemini/settings.json), no hook from any settings file, user's included, and --yolo
# turned back into the default approval mode, said only in its debug log.
# A folder is trusted, first rule that decides:
#  1. $GEMINI_CLI_TRUST_WORKSPACE=true (false, or $GEMINI_RESTRICTED_MODE=true: not);
#  2. the user's settings turn folder trust off (security.folderTrust.enabled: false);
#  3. the IDE companion's workspace trust, when connected;
#  4. the trusted-folders file ($GEMINI_CLI_TRUSTED_FOLDERS_PATH, else
#     ${GEMINI_CLI_HOME:-~}/.gemini/trustedFolders.json: {path: TRUST_FOLDER |
#     TRUST_PARENT | DO_NOT_TRUST}, real paths, the longest rule that holds the folder
#     wins, TRUST_PARENT trusting the rule's parent folder);
#  5. else not trusted. Up to 0.38 a headless run (-p, no terminal, or CI=true) trusted
#     every folder.
GEMINI_TRUST_ENV = "GEMINI_CLI_TRUST_WORKSPACE"


def gemini_home() -> str:
    return os.path.join(os.environ.get("GEMINI_CLI_HOME") or os.path.expanduser("~"),
                        ".gemini")


def gemini_trusted_folders_path() -> str:
    return os.environ.get("GEMINI_CLI_TRUSTED_FOLDERS_PATH") or os.path.join(
        gemini_home(), "trustedFolders.json")


def _read_json_object(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.loads(f.read() or "{}")
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise FailedPrecondition(f"{path} cannot be read as JSON ({exc}); it was left as"
                                 " it is") from None
    if not isinstance(doc, dict):
        raise FailedPrecondition(f"{path} does not hold a JSON object; it was left as it is")
    return doc


def gemini_trust(folder: str, environ: dict | None = None) -> dict:
    """Whether Gemini CLI 0.39+ trusts ``folder`` (so runs hooks there) and why:
    ``{"folder", "trusted": True | False, "by", "file", "fix"}``."""
    environ = os.environ if environ is None else environ
    folder = os.path.realpath(folder)
    path = gemini_trusted_folders_path()
    fix = (f"worldline init gemini --project {folder} --trust   (adds it to {path});"
           f" or, for one run, {GEMINI_TRUST_ENV}=true gemini ... (or gemini --skip-trust)")
    out = {"folder": folder, "trusted": False, "by": "", "file": path, "fix": fix}
    env = environ.get(GEMINI_TRUST_ENV, "")
    if environ.get("GEMINI_RESTRICTED_MODE") == "true" or env == "false":
        return {**out, "by": f"${GEMINI_TRUST_ENV}=false or $GEMINI_RESTRICTED_MODE"}
    if env == "true":
        return {**out, "trusted": True, "by": f"${GEMINI_TRUST_ENV}=true", "fix": ""}
    user = _read_json_object(os.path.join(gemini_home(), "settings.json"))
    if ((user.get("security") or {}).get("folderTrust") or {}).get("enabled") is False:
        return {**out, "trusted": True, "by": "security.folderTrust.enabled is false in"
                                              " the user's settings", "fix": ""}
    best, level = -1, None
    for rule, value in _read_json_object(path).items():
        where = os.path.dirname(rule) if value == "TRUST_PARENT" else rule
        where = os.path.realpath(where)
        if (folder == where or folder.startswith(where.rstrip("/") + "/")) \
                and len(rule) > best:
            best, level = len(rule), (rule, value)
    if level and level[1] in ("TRUST_FOLDER", "TRUST_PARENT"):
        return {**out, "trusted": True, "by": f"{path}: {level[0]} {level[1]}", "fix": ""}
    if level:
        return {**out, "by": f"{path}: {level[0]} {level[1]}"}
    return {**out, "by": f"no rule of {path} holds it"}


def trust_gemini_folder(folder: str) -> dict:
    """Add ``folder`` (its real path) to Gemini CLI's trusted folders as TRUST_FOLDER,
    keeping every other rule; the file is replaced whole, readable by its owner only.
    Returns gemini_trust's answer after."""
    folder = os.path.realpath(folder)
    path = gemini_trusted_folders_path()
    rules = _read_json_object(path)
    if rules.get(folder) != "TRUST_FOLDER":
        rules[folder] = "TRUST_FOLDER"
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with open(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(rules, indent=2) + "\n")
        os.replace(tmp, path)
    return gemini_trust(folder)
