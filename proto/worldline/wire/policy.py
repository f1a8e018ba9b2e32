"""The side-effect policy: which effect a tool call has, and whether it needs approval.

A caller may state a tool call's effect; when it does not, the policy decides:
rules from the policy file first (in file order, first match wins), then the
built-in rules. Tool names match globs, whatever their case (agents name the same
tools ``Bash``, ``bash`` or ``run_shell_command``). For shell-like tools the command line is
split into simple commands (on ``;``, ``&&``, ``||``, ``|`` and newlines) and each
is matched; the most far-reaching effect wins. An unknown shell command is
``local``; an unknown tool is ``local``.

Policy file (TOML)::

    shell_tools = ["bash", "run"]        # added to the built-in shell-like tool names

    [[tool]]                             # globs on the tool name
    match = "send_*"
    effect = "external_non_idempotent"
    require_approval = true

    [[command]]                          # globs on one simple command of a shell tool
    match = "make deploy*"
    effect = "external_non_idempotent"
    require_approval = true
"""

from __future__ import annotations

import fnmatch
import re
import shlex
import tomllib
from dataclasses import dataclass

from .errors import InvalidArgument

# A tool call's effects, from the least far-reaching to the most.
EFFECTS = ("read_only", "local", "external_idempotent", "external_non_idempotent")
SEVERITY = {e: i for i, e in enumerate(EFFECTS)}
SHELL_TOOLS = ("bash", "sh", "shell", "run_shell", "run_command", "execute_command", "exec",
               "terminal", "run_terminal_cmd", "command", "cmd", "run_shell_command",
               "local_shell", "exec_command")
COMMAND_KEYS = ("command", "cmd", "script", "commandLine", "command_line")
NON_IDEM, IDEM, LOCAL, READ = EFFECTS[3], EFFECTS[2], EFFECTS[1], EFFECTS[0]


@dataclass(frozen=True)
class Rule:
    kind: str  # "tool" | "command"
    match: str
    effect: str
    require_approval: bool
    origin: str  # "builtin" or "<file>:tool[i]"

    def describe(self) -> str:
        return f"{self.origin}: {self.kind} {self.match!r} -> {self.effect}"


@dataclass(frozen=True)
class Decision:
    effect: str
    rule: str
    requires_approval: bool


def _builtin(kind: str, effect: str, *patterns: str) -> list[Rule]:
    return [Rule(kind, p, effect, False, "builtin") for p in patterns]


_MUTATING_CLOUD = r"(create|delete|put|update|remove|terminate|run|start|stop|reboot|deploy|" \
                  r"set|attach|detach|modify|publish|send|invoke|apply|import|add|destroy)"

BUILTIN_TOOLS = (
    _builtin("tool", READ, "read*", "view*", "list*", "search*", "grep*", "glob*", "find*",
             "get_*", "cat", "ls", "open_file", "fetch*", "web_search", "browse*", "webfetch",
             "websearch", "web_fetch", "google_web_search")
    + _builtin("tool", LOCAL, "write*", "edit*", "multiedit", "create_file", "str_replace*",
               "apply_patch", "replace", "delete_file", "move_file", "mkdir", "notebook_edit",
               "notebookedit", "todo*")
    + _builtin("tool", NON_IDEM, "send_*", "email*", "post_*", "deploy*", "publish*", "slack*",
               "notify*", "create_pull_request", "merge_pull_request", "create_issue",
               "comment*", "tweet*", "pay*", "charge*", "transfer*")
)

# (pattern on the normalised simple command, effect); regular expressions, matched at start.
BUILTIN_COMMANDS: list[tuple[str, str]] = [
    (r"git push\b", NON_IDEM),
    (r"git (fetch|pull|clone|ls-remote)\b", LOCAL),
    (r"git (status|log|diff|show|branch|rev-parse|blame|grep)\b", READ),
    (r"(npm|yarn|pnpm) publish\b", NON_IDEM),
    (r"(twine|flit) upload\b|poetry publish\b|cargo publish\b|gem push\b|uv publish\b", NON_IDEM),
    (r"docker (push|login)\b|docker (image|manifest) push\b", NON_IDEM),
    (r"kubectl (apply|create|delete|patch|replace|scale|rollout|set|edit|annotate|label|"
     r"drain|cordon|taint|expose|run|exec)\b", NON_IDEM),
    (r"kubectl (get|describe|logs|top|explain|version|config view)\b", READ),
    (r"terraform (apply|destroy|import|taint|state (rm|mv|push))\b", NON_IDEM),
    (r"terraform (plan|validate|fmt|show|output)\b", LOCAL),
    (r"pulumi (up|destroy|import)\b", NON_IDEM),
    (r"helm (install|upgrade|uninstall|delete|rollback|push)\b", NON_IDEM),
    (r"gh (pr|release|issue|repo|gist|secret|workflow|label) (create|merge|close|delete|edit|"
     r"comment|reopen|review|run|set|fork|upload)\b", NON_IDEM),
    (r"gh api\b.*(-X|--method)\s*(POST|PUT|PATCH|DELETE)", NON_IDEM),
    (r"aws \S+ " + _MUTATING_CLOUD + r"[\w-]*", NON_IDEM),
    (r"aws s3 (cp|mv|rm|sync|rb|mb)\b", NON_IDEM),
    (r"gcloud (\S+ )+" + _MUTATING_CLOUD + r"\b", NON_IDEM),
    (r"az (\S+ )+" + _MUTATING_CLOUD + r"\b", NON_IDEM),
    (r"curl\b.*(\s-X\s*|--request\s*)(POST|PUT|PATCH|DELETE)\b", NON_IDEM),
    (r"curl\b.*\s(-d|--data\S*|-F|--form|-T|--upload-file|--json)\b", NON_IDEM),
    (r"wget\b.*\s--(post-data|post-file|method=(POST|PUT|PATCH|DELETE)|body-data|body-file)",
     NON_IDEM),
    (r"(curl|wget|http|https)\b", READ),
    (r"(ssh|mosh)\s", NON_IDEM),
    (r"scp\b.*\s\S+:", NON_IDEM),
    (r"rsync\b.*\s(\S+@)?[\w.-]+:", NON_IDEM),
    (r"(sendmail|mail|mailx|mutt|msmtp|swaks)\b", NON_IDEM),
    (r"(heroku|vercel|netlify|fly|flyctl|firebase|serverless|sls|wrangler) "
     r"(deploy|releases|publish|--prod)", NON_IDEM),
    (r"(vercel)\b.*--prod", NON_IDEM),
    (r"(ls|cat|head|tail|grep|rg|find|wc|stat|file|tree|less|more|echo|pwd|which|env|"
     r"diff|du|df|sort|uniq|cut|awk|sed -n|jq|type)\b", READ),
]
_COMPILED = [(re.compile(p), e) for p, e in BUILTIN_COMMANDS]
_PREFIXES = {"sudo", "env", "time", "nohup", "nice", "command", "exec", "timeout", "xargs"}


class Policy:
    def __init__(self, tool_rules: list[Rule] | None = None,
                 command_rules: list[Rule] | None = None,
                 shell_tools: tuple[str, ...] = SHELL_TOOLS, source: str = "builtin") -> None:
        self.tool_rules = tool_rules or []
        self.command_rules = command_rules or []
        self.shell_tools = shell_tools
        self.source = source

    @classmethod
    def load(cls, path: str) -> Policy:
        """Read a policy file; any unknown key or bad value is an error, never ignored."""
        try:
            with open(path, "rb") as f:
                doc = tomllib.load(f)
        except OSError as exc:
            raise InvalidArgument(f"policy file {path}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise InvalidArgument(f"policy file {path} is not valid TOML: {exc}") from None
        unknown = set(doc) - {"shell_tools", "tool", "command"}
        if unknown:
            raise InvalidArgument(f"policy file {path}: unknown key(s) {sorted(unknown)}")
        shell = doc.get("shell_tools", [])
        if not isinstance(shell, list) or not all(isinstance(s, str) for s in shell):
            raise InvalidArgument(f"policy file {path}: shell_tools must be a list of names")
        rules: dict[str, list[Rule]] = {"tool": [], "command": []}
        for kind in rules:
            entries = doc.get(kind, [])
            if not isinstance(entries, list):
                raise InvalidArgument(f"policy file {path}: [[{kind}]] must be an array of tables")
            for i, entry in enumerate(entries):
                where = f"{path}:{kind}[{i}]"
                if not isinstance(entry, dict):
                    raise InvalidArgument(f"{where} must be a table")
                extra = set(entry) - {"match", "effect", "require_approval"}
                if extra:
                    raise InvalidArgument(f"{where}: unknown key(s) {sorted(extra)}")
                match = entry.get("match")
                if not isinstance(match, str) or not match:
                    raise InvalidArgument(f"{where}: match must be a non-empty string")
                effect = entry.get("effect", LOCAL)
                if effect not in EFFECTS:
                    raise InvalidArgument(f"{where}: effect {effect!r} is not one of {EFFECTS}")
                approval = entry.get("require_approval", False)
                if not isinstance(approval, bool):
                    raise InvalidArgument(f"{where}: require_approval must be true or false")
                rules[kind].append(Rule(kind, match, effect, approval, where))
        return cls(rules["tool"], rules["command"], SHELL_TOOLS + tuple(shell), path)

    def classify(self, tool: str, args: dict) -> Decision:
        name = tool.lower()
        for rule in self.tool_rules:
            if fnmatch.fnmatchcase(name, rule.match.lower()):
                return Decision(rule.effect, rule.describe(), rule.require_approval)
        shell = name in {t.lower() for t in self.shell_tools}
        command = _command_of(args) if shell else None
        if command is not None:
            return self._classify_command(command)
        for rule in BUILTIN_TOOLS:
            if fnmatch.fnmatchcase(name, rule.match):
                return Decision(rule.effect, rule.describe(), False)
        return Decision(LOCAL, "default: unknown tool -> local", False)

    def _classify_command(self, command: str) -> Decision:
        decisions = [self._classify_simple(simple) for simple in split_commands(command)]
        if not decisions:
            return Decision(LOCAL, "default: empty command -> local", False)
        worst = max(decisions, key=lambda d: SEVERITY[d.effect])
        return Decision(worst.effect, worst.rule, any(d.requires_approval for d in decisions))

    def _classify_simple(self, simple: str) -> Decision:
        for rule in self.command_rules:
            if fnmatch.fnmatchcase(simple, rule.match):
                return Decision(rule.effect, rule.describe(), rule.require_approval)
        for pattern, effect in _COMPILED:
            if pattern.match(simple):
                return Decision(effect, f"builtin: command /{pattern.pattern}/ -> {effect}",
                                False)
        return Decision(LOCAL, f"default: unknown command {simple.split(' ')[0]!r} -> local",
                        False)


def _command_of(args: dict) -> str | None:
    for key in COMMAND_KEYS:
        value = args.get(key)
        if isinstance(value, str):
            return value
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return shlex.join(value)
    return None


def split_commands(command: str) -> list[str]:
    """Simple commands of a command line, normalised: prefixes such as ``sudo``,
    ``env`` and variable assignments dropped, words joined by single spaces."""
    out = []
    for part in re.split(r"\|\||&&|[;|\n&]|\$\(|`|\)", command):
        try:
            words = shlex.split(part, comments=True)
        except ValueError:
            words = part.split()
        while words and (words[0] in _PREFIXES or re.match(r"^\w+=", words[0])):
            words = words[1:]
        if words:
            words[0] = words[0].rsplit("/", 1)[-1]
            if re.match(r"^python[\d.]*$", words[0]) and words[1:2] == ["-m"]:
                words = words[2:]  # `python -m twine upload` is `twine upload`
            elif words[0] in ("npx", "uvx", "bunx") or words[:2] == ["pipx", "run"]:
                words = words[2:] if words[0] == "pipx" else words[1:]
        if words:
            out.append(" ".join(words))
    return out
