"""``worldline doctor [AGENT]``: will the installed agent run worldline's hooks as they are
configured? Each check holds or fails, says what it found, and a failing one names the
command that fixes it.

What each agent needs (docs/agents.md has the evidence, from each client's own source):
- Claude Code: its print mode (``claude -p``) runs a project's hooks with no trust
  dialog; interactively, the project's hooks run once its folder (or one above) is
  trusted: ``projects[DIR].hasTrustDialogAccepted`` in ``~/.claude.json``
  (``$CLAUDE_CONFIG_DIR``). ``disableAllHooks`` in any settings file turns them off.
- Gemini CLI: project settings, hooks included, load only in a trusted folder:
  ``GEMINI_CLI_TRUST_WORKSPACE=true`` (or ``--skip-trust``) for the run, a rule in
  ``~/.gemini/trustedFolders.json`` (``$GEMINI_CLI_TRUSTED_FOLDERS_PATH``; the longest
  matching path wins; TRUST_PARENT trusts the folder above the rule's), or folder
  trust turned off (``security.folderTrust.enabled: false`` in the user's settings).
- Codex: a project's ``.codex`` layer loads when the project is trusted
  (``[projects."DIR"] trust_level = "trusted"`` in ``$CODEX_HOME/config.toml``), and
  each hook runs once trusted (``[hooks.state."FILE:event:i:j"] trusted_hash``, the
  hash of its command), which Codex asks for interactively; ``codex exec`` skips
  untrusted hooks unless run with ``--dangerously-bypass-hook-trust``. Doctor asks
  Codex itself (``codex app-server``, ``hooks/list``: each hook's trust status), and
  reads config.toml where that cannot be asked.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import threading

from .config import default_address, normalize_address, unix_path
from .errors import WorldlineError
from .hooks.settings import EVENTS, FILES, LOCAL, MARK
from .hooks.support import PACKAGES, PROGRAMS, detect

BINARIES = PROGRAMS


class Check:
    def __init__(self, name: str, ok: bool, detail: str, fix: str = "") -> None:
        self.name, self.ok, self.detail, self.fix = name, ok, detail, "" if ok else fix

    def to_dict(self) -> dict:
        return {"name": self.name, "ok": self.ok, "detail": self.detail, "fix": self.fix}


@functools.lru_cache(maxsize=None)
def installed(agent: str, path: str | None = None) -> tuple[str, str] | None:
    """The agent's program on ``path`` (default ``$PATH``) and its version (``""`` when
    it cannot be read: hooks/support.py's detect); None when there is no such program."""
    program, version = detect(agent, None if path is None else {**os.environ, "PATH": path})
    return (program, version) if program else None


# -- the settings ------------------------------------------------------------------------
def _load_json(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _commands(doc: dict) -> dict[str, list[tuple[int, int, str]]]:
    """worldline's hook commands in a settings document, by event: (entry index, hook
    index, command) each (Codex keys its hooks' trust by the two indexes)."""
    out: dict[str, list[tuple[int, int, str]]] = {}
    hooks = doc.get("hooks")
    for event, entries in (hooks.items() if isinstance(hooks, dict) else ()):
        for i, entry in enumerate(entries if isinstance(entries, list) else ()):
            if not isinstance(entry, dict):
                continue
            inner = entry.get("hooks") if isinstance(entry.get("hooks"), list) else [entry]
            for j, hook in enumerate(inner):
                command = hook.get("command") if isinstance(hook, dict) else None
                if isinstance(command, str) and MARK in command:
                    out.setdefault(event, []).append((i, j, command))
    return out


class Settings:
    """Where worldline's hooks for ``agent`` are: the project's file, else the user's."""

    def __init__(self, agent: str, project: str) -> None:
        self.agent, self.project = agent, project
        project_file, user_file = FILES[agent]
        self.files = ([("local", os.path.join(project, LOCAL[agent]))] if agent in LOCAL
                      else []) + [("project", os.path.join(project, project_file)),
                                  ("user", os.path.expanduser(user_file))]
        self.scope, self.path, self.commands = "", "", {}
        for scope, path in self.files:
            doc = _load_json(path)
            found = _commands(doc) if doc else {}
            if found and len(found) > len(self.commands):
                self.scope, self.path, self.commands = scope, path, found

    def missing(self) -> list[str]:
        return [e for e in EVENTS[self.agent] if e not in self.commands]

    def command(self) -> str:
        for event in EVENTS[self.agent]:
            if event in self.commands:
                return self.commands[event][0][2]
        return ""

    def address(self) -> str:
        """The daemon the hook command names (``--address``), or ""."""
        try:
            words = shlex.split(self.command())
        except ValueError:
            return ""
        for i, word in enumerate(words):
            if word == "--address" and i + 1 < len(words):
                return words[i + 1]
            if word.startswith("--address="):
                return word.split("=", 1)[1]
        return ""


def _init_command(agent: str, project: str) -> str:
    return f"worldline init {agent} --project {shlex.quote(project)}"


# -- an agent's checks -------------------------------------------------------------------
def agent_checks(agent: str, project: str, env: dict[str, str] | None = None) -> list[Check]:
    env = os.environ if env is None else env
    project = os.path.realpath(project)
    checks = [_client(agent, env)]
    settings = Settings(agent, project)
    checks += _hooks(settings)
    if agent == "claude-code":
        checks += _claude_trust(settings, env)
    elif agent == "gemini":
        checks += _gemini_trust(settings, env)
    elif agent == "codex":
        checks += _codex_trust(settings, env)
    return checks


def _client(agent: str, env) -> Check:
    name = f"{agent} client"
    found = installed(agent, env.get("PATH"))
    if found is None:
        package = PACKAGES.get(agent)
        fix = f"npm install -g {package}" if package else "install Cursor's CLI (cursor-agent)"
        return Check(name, False, f"no `{BINARIES[agent]}` on PATH", fix)
    program, version = found
    if not version:
        return Check(name, False, f"{program} --version names no version",
                     f"reinstall it: npm install -g {PACKAGES.get(agent, BINARIES[agent])}")
    return Check(name, True, f"{BINARIES[agent]} {version} at {program}")


def _hooks(s: Settings) -> list[Check]:
    agent, where = s.agent, " or ".join(path for _, path in s.files)
    if not s.commands:
        return [Check(f"{agent} hooks", False, f"no worldline hooks in {where}",
                      _init_command(agent, s.project)),
                Check(f"{agent} hook command", False, "no hook command to run",
                      _init_command(agent, s.project))]
    missing = s.missing()
    disabled = _claude_hooks_disabled(s) if agent == "claude-code" else ""
    if missing:
        hooks = Check(f"{agent} hooks", False, f"{s.path} lacks worldline's hooks for"
                      f" {', '.join(missing)}", _init_command(agent, s.project)
                      + (" --user" if s.scope == "user" else ""))
    elif disabled:
        hooks = Check(f"{agent} hooks", False, f"{disabled} has \"disableAllHooks\": true:"
                      " Claude Code runs no hook", f"remove disableAllHooks from {disabled}")
    else:
        hooks = Check(f"{agent} hooks", True, f"{s.path} ({s.scope}): worldline's hooks"
                      f" for {', '.join(EVENTS[agent])}")
    return [hooks, _hook_command(s)]


def _hook_command(s: Settings) -> Check:
    name = f"{s.agent} hook command"
    command = s.command()
    try:
        program = shlex.split(command)[0]
    except (ValueError, IndexError):
        return Check(name, False, f"cannot read the command {command!r}",
                     _init_command(s.agent, s.project))
    found = program if os.sep in program else shutil.which(program)
    if found and os.access(found, os.X_OK):
        return Check(name, True, f"{command} ({found})")
    return Check(name, False, f"{program} is not a program this user can run (the hooks"
                 f" run `{command}`)", _init_command(s.agent, s.project) +
                 " --command '/absolute/path/to/worldline hook " + s.agent + "'")


def _claude_hooks_disabled(s: Settings) -> str:
    for path in [p for _, p in s.files]:
        doc = _load_json(path)
        if doc and doc.get("disableAllHooks") is True:
            return path
    return ""


def _ancestors(path: str) -> list[str]:
    out = [path]
    while os.path.dirname(out[-1]) != out[-1]:
        out.append(os.path.dirname(out[-1]))
    return out


def _claude_trust(s: Settings, env) -> list[Check]:
    headless = Check("claude-code trust (headless)", True,
                     "claude -p runs the project's hooks without the trust dialog")
    name = "claude-code trust (interactive)"
    if s.scope == "user":
        return [headless, Check(name, True, "user hooks need no folder trust")]
    config_dir = env.get("CLAUDE_CONFIG_DIR")
    config = os.path.join(config_dir, ".claude.json") if config_dir else os.path.join(
        os.path.expanduser("~"), ".claude.json")
    projects = (_load_json(config) or {}).get("projects") or {}
    for folder in _ancestors(s.project):
        entry = projects.get(folder)
        if isinstance(entry, dict) and entry.get("hasTrustDialogAccepted") is True:
            return [headless, Check(name, True, f"{folder} is trusted in {config}")]
    return [headless, Check(name, False, f"{s.project} is not trusted in {config}: claude"
                            " shows its trust dialog and runs no project hook until"
                            " it is accepted",
                            f"cd {shlex.quote(s.project)} && claude   (accept the trust"
                            " dialog once)")]


def _gemini_trust(s: Settings, env) -> list[Check]:
    project = s.project
    interactive_fix = (f"cd {shlex.quote(project)} && gemini   (choose \"Trust folder\""
                       " once)")
    home = os.path.expanduser("~")
    user = _load_json(os.path.join(home, ".gemini", "settings.json")) or {}
    folder_trust = ((user.get("security") or {}).get("folderTrust") or {}).get("enabled")
    rules_file = env.get("GEMINI_CLI_TRUSTED_FOLDERS_PATH") or os.path.join(
        home, ".gemini", "trustedFolders.json")
    trusted, why = _gemini_rule(rules_file, project)
    if folder_trust is False:
        trusted, why = True, "folder trust is off (security.folderTrust.enabled: false)"
    interactive = Check("gemini trust (interactive)", bool(trusted), why or
                        f"{project} is not trusted in {rules_file}", interactive_fix)
    variable = env.get("GEMINI_CLI_TRUST_WORKSPACE")
    if variable == "true":
        headless = Check("gemini trust (headless)", True,
                         "GEMINI_CLI_TRUST_WORKSPACE=true in this environment")
    elif variable == "false":
        headless = Check("gemini trust (headless)", False,
                         "GEMINI_CLI_TRUST_WORKSPACE=false distrusts every folder",
                         "export GEMINI_CLI_TRUST_WORKSPACE=true")
    else:
        headless = Check("gemini trust (headless)", bool(trusted), why or
                         f"{project} is not trusted in {rules_file}, and"
                         " GEMINI_CLI_TRUST_WORKSPACE is not set: gemini -p refuses"
                         " the folder", "export GEMINI_CLI_TRUST_WORKSPACE=true   (or"
                         f" trust the folder once: cd {shlex.quote(project)} && gemini)")
    return [headless, interactive]


def _gemini_rule(rules_file: str, project: str) -> tuple[bool | None, str]:
    rules = _load_json(rules_file) or {}
    best, level = -1, None
    for rule, trust in rules.items():
        folder = os.path.dirname(rule) if trust == "TRUST_PARENT" else rule
        folder = os.path.realpath(folder)
        if (project == folder or project.startswith(folder.rstrip("/") + "/")) \
                and len(rule) > best:
            best, level = len(rule), trust
    if level in ("TRUST_FOLDER", "TRUST_PARENT"):
        return True, f"{project} is trusted in {rules_file} ({level})"
    if level == "DO_NOT_TRUST":
        return False, f"{project} is marked DO_NOT_TRUST in {rules_file}"
    return None, ""


def _codex_trust(s: Settings, env) -> list[Check]:
    import tomllib
    home = env.get("CODEX_HOME") or os.path.join(os.path.expanduser("~"), ".codex")
    config_path = os.path.join(home, "config.toml")
    try:
        with open(config_path, "rb") as f:
            config = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError):
        config = {}
    problems = []
    if s.scope == "project":
        projects = config.get("projects") or {}
        if not any((projects.get(folder) or {}).get("trust_level") == "trusted"
                   for folder in _ancestors(s.project)):
            problems.append(f"{s.project} is not a trusted project in {config_path}")
    if not s.commands:
        problems.append("no worldline hooks to trust")
    found = installed("codex", env.get("PATH"))
    listed = _codex_hooks(found[0], s.project, env) if found else None
    if listed is not None:  # Codex's own word: each hook's key, hash and trust status
        ours = {h.get("key", ""): h.get("trustStatus", "") for h in listed
                if MARK in str(h.get("command", ""))}
        untrusted = [f"{key.rsplit(':', 3)[1]} ({status})" for key, status in ours.items()
                     if status not in ("trusted", "managed")]
        if s.commands and not ours and not problems:
            problems.append(f"Codex loads none of worldline's hooks from {s.path}")
    else:  # no app-server to ask: an entry in hooks.state for each of ours
        state = (config.get("hooks") or {}).get("state") or {}
        events = {e: re.sub(r"(?<!^)(?=[A-Z])", "_", e).lower() for e in s.commands}
        untrusted = [events[event] for event, hooks in s.commands.items()
                     for i, j, _ in hooks if not (state.get(
                         f"{s.path}:{events[event]}:{i}:{j}") or {}).get("trusted_hash")]
    if untrusted:
        problems.append(f"worldline's hooks are not trusted: {', '.join(untrusted)}")
    ok = not problems
    detail = "; ".join(problems) or "the project and worldline's hooks are trusted"
    fix = f"cd {shlex.quote(s.project)} && codex   (trust the folder and \"Trust all\" hooks)"
    return [Check("codex trust (headless)", ok, detail, fix + ", or run codex exec with"
                  " --dangerously-bypass-hook-trust"),
            Check("codex trust (interactive)", ok, detail, fix)]


def _codex_hooks(program: str, project: str, env) -> list[dict] | None:
    """The hooks Codex loads for ``project``, as its app server lists them (``hooks/list``:
    key, command, currentHash, trustStatus); None when it cannot be asked."""
    lines = [{"id": 1, "method": "initialize", "params": {
                 "clientInfo": {"name": "worldline-doctor", "version": "1"}}},
             {"method": "initialized"},
             {"id": 2, "method": "hooks/list", "params": {"cwds": [project]}}]
    try:
        proc = subprocess.Popen([program, "app-server"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                cwd=project, env=dict(env))
    except OSError:
        return None
    timer = threading.Timer(20, proc.kill)
    timer.start()
    try:
        proc.stdin.write("".join(json.dumps({"jsonrpc": "2.0", **m}) + "\n"
                                 for m in lines).encode())
        proc.stdin.flush()
        for line in proc.stdout:
            try:
                answer = json.loads(line)
            except ValueError:
                continue
            if isinstance(answer, dict) and answer.get("id") == 2:
                data = (answer.get("result") or {}).get("data") or []
                return [h for entry in data for h in entry.get("hooks") or []]
        return None
    except OSError:
        return None
    finally:
        timer.cancel()
        proc.kill()
        proc.wait()


# -- the daemon --------------------------------------------------------------------------
def daemon_checks(address: str) -> list[Check]:
    """The daemon answers at ``address``, and this user may reach the gateway the hooks
    use (``<socket>.json``). No grpc is imported for a Unix socket."""
    path = unix_path(address)
    if path is None:
        return _tcp_checks(address)
    start = _start_command(address, path)
    gateway = path + ".json"
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(5)
    try:
        probe.connect(gateway)
        refused = 0
    except OSError as exc:
        refused = exc.errno or errno.EIO
    finally:
        probe.close()
    uid = os.getuid()
    closed = [f for f in reversed(_ancestors(os.path.dirname(path))[1:])
              if not os.access(f, os.X_OK)]
    if refused in (errno.EACCES, errno.EPERM) and closed:  # above the daemon's root
        return [Check("daemon", False, f"uid {uid} cannot search {closed[0]}, above the"
                      f" daemon's socket {path}", f"chmod o+x {shlex.quote(closed[0])}"),
                Check("permissions", False, "not checked: the socket cannot be reached",
                      f"chmod o+x {shlex.quote(closed[0])}")]
    if refused in (errno.EACCES, errno.EPERM):
        owner = os.stat(path).st_uid if os.path.exists(path) else -1
        return [Check("daemon", True, f"a daemon's socket is at {path} (owner uid {owner})"),
                Check("permissions", False, f"uid {uid} may not connect to {gateway}: the"
                      " hooks of an agent run as this user cannot reach the daemon",
                      f"restart the daemon with --allow-uid {uid} (e.g. {start}"
                      f" --allow-uid {uid})")]
    if refused:
        return [Check("daemon", False, f"no daemon answers at {address}"
                      f" ({os.strerror(refused)})", start),
                Check("permissions", False, "not checked: no daemon answers", start)]
    from .lite import connect
    try:
        with connect(address, timeout=10) as client:
            n = len(client.call("ListSessions", {})["sessions"])
    except WorldlineError as exc:
        return [Check("daemon", False, f"the daemon at {address} does not answer:"
                      f" {exc.message}", start),
                Check("permissions", False, "not checked: the daemon did not answer", start)]
    return [Check("daemon", True, f"{address} answers ({n} session(s) visible)"),
            Check("permissions", True, f"uid {uid} reaches the hooks' gateway {gateway}")]


def _start_command(address: str, path: str) -> str:
    """The command that starts a daemon listening at ``address``."""
    if address == default_address():
        return "worldline daemon"
    if os.path.basename(path) == "worldline.sock":
        return f"worldline daemon --root {shlex.quote(os.path.dirname(path))}"
    return f"worldline daemon --listen {shlex.quote(address)}"


def _tcp_checks(address: str) -> list[Check]:
    from .lite import connect
    try:
        with connect(address, timeout=10) as client:
            client.call("ListSessions", {})
    except WorldlineError as exc:
        return [Check("daemon", False, f"{address}: {exc.code}: {exc.message}",
                      "start the daemon there, and give the hooks its token"
                      " ($WORLDLINE_TOKEN)")]
    return [Check("daemon", True, f"{address} answers")]


# -- all of it ---------------------------------------------------------------------------
def run(agent: str | None, project: str = ".", address: str | None = None) -> list[Check]:
    """The agent's checks (every agent installed or set up here, without one), then the
    daemon's: at ``address``, else the one the hooks name, else the default."""
    agents = [agent] if agent else [a for a in BINARIES if shutil.which(BINARIES[a])
                                    or Settings(a, os.path.realpath(project)).commands]
    checks: list[Check] = []
    named = ""
    for a in agents:
        checks += agent_checks(a, project)
        named = named or Settings(a, os.path.realpath(project)).address()
    target = normalize_address(address or named) if (address or named) else default_address()
    return checks + daemon_checks(target)


def render(checks: list[Check]) -> str:
    lines = []
    for c in checks:
        lines.append(f"{'ok' if c.ok else 'fail':<4}  {c.name}: {c.detail}")
        if c.fix:
            lines.append(f"      fix: {c.fix}")
    return "\n".join(lines)


def main(agent: str | None, project: str, address: str | None, as_json: bool) -> int:
    checks = run(agent, project, address)
    if as_json:
        print(json.dumps({"checks": [c.to_dict() for c in checks]}, indent=2,
                         ensure_ascii=False))
    else:
        print(render(checks))
    return 0 if all(c.ok for c in checks) else 1
