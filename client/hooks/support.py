"""What each agent's client honours, version by version, and which version is installed.

The hook never answers a decision the client would ignore: a gate is only as good as
the client's reading of the answer. ``SUPPORT`` holds, for each agent, ranges of
versions (``[low, high)``, ``None`` for open) and what a client in the range does with
a pre-tool hook's answer:

- ``decisions``: the answers it honours. ``allow`` (run without the client's own
  prompt), ``deny`` (the call does not run), ``ask`` (the person at the client is
  asked, and the call runs only on their yes).
- ``exit2``: whether exit status 2 with a reason on stderr blocks the call.
- ``reason``: whether a deny's reason reaches the model (it then knows the approval's
  id and the command that approves it).
- ``skips_after_event``: whether a call that ran may fire no after-tool event (Codex
  applies an ``apply_patch`` sent through its shell tool itself: PreToolUse only).
- ``transcript``: where the client writes the conversation, and in which format.
- ``trust``: what must be granted before the client runs a project's hooks.
- ``source``: where these facts come from.

A version outside every range is unknown: it honours nothing but ``deny`` as far as
worldline is concerned, so gated calls fail closed. Facts are taken from the clients'
own code and checked against the real programs (tests/agents).
"""

from __future__ import annotations

import os

ALLOW, DENY, ASK = "allow", "deny", "ask"
UNKNOWN = "unknown"


class Support:
    def __init__(self, agent: str, low: str | None, high: str | None, decisions: tuple,
                 exit2: bool, reason: bool, transcript: str, trust: str,
                 source: str, skips_after_event: bool = False) -> None:
        self.agent, self.low, self.high = agent, low, high
        self.skips_after_event = skips_after_event
        self.decisions = frozenset(decisions)
        self.exit2, self.reason = exit2, reason
        self.transcript, self.trust, self.source = transcript, trust, source

    def honours(self, decision: str) -> bool:
        return decision in self.decisions

    def covers(self, version: str) -> bool:
        v = parse_version(version)
        if v is None:
            return False
        return ((self.low is None or v >= parse_version(self.low))
                and (self.high is None or v < parse_version(self.high)))

    def as_dict(self) -> dict:
        return {"agent": self.agent, "versions": [self.low, self.high],
                "decisions": sorted(self.decisions), "exit2": self.exit2,
                "reason": self.reason, "skips_after_event": self.skips_after_event,
                "transcript": self.transcript, "trust": self.trust,
                "source": self.source}


SUPPORT: dict[str, list[Support]] = {
    "claude-code": [Support(
        "claude-code", "2.0.0", "3.0.0", (ALLOW, DENY, ASK), exit2=True, reason=True,
        transcript="~/.claude/projects/<project path, / as ->/<session id>.jsonl: JSONL,"
                   " one entry a line (type, uuid, parentUuid, message, version, ...)",
        trust="interactive: the workspace trust dialog, once per folder; headless (-p):"
              " the project's .claude/settings.json hooks run without it",
        source="Claude Code hooks reference (PreToolUse permissionDecision allow | deny |"
               " ask); checked with 2.1.197 (tests/agents)")],
    "codex": [Support(
        "codex", "0.171.0", "1.0.0", (DENY,), exit2=True, reason=True,
        transcript="$CODEX_HOME/sessions/YYYY/MM/DD/rollout-<time>-<session id>.jsonl:"
                   " JSONL of {timestamp, type (session_meta | response_item | event_msg |"
                   " turn_context ...), payload}; the hook payload's transcript_path",
        trust="the project trusted ([projects.\"DIR\"] trust_level = \"trusted\" in"
              " $CODEX_HOME/config.toml, or `codex exec --trust`), else .codex/ is not"
              " loaded at all; and the hooks trusted: headless `codex exec"
              " --dangerously-bypass-hook-trust`, interactive the review in /hooks (kept"
              " as hooks.state.<key>.trusted_hash in config.toml)",
        source="codex-rs/hooks (output parser: \"PreToolUse hook returned unsupported"
               " permissionDecision:ask\" and \":allow\", both fail open and the call"
               " runs; deny with a reason and exit 2 with stderr block it, the reason"
               " reaches the model as \"Command blocked by PreToolUse hook: ...\"; ask"
               " support proposed in openai/codex#20756, not merged); checked with"
               " 0.171.0 (tests/agents/test_codex.py)", skips_after_event=True)],
    "gemini": [Support(
        "gemini", "0.61.0", "1.0.0", (ALLOW, DENY), exit2=True, reason=True,
        transcript="~/.gemini/tmp/<project hash>/chats/session-*.jsonl (0.61: JSONL with"
                   " $set updates; older: one JSON document)",
        trust="a trusted folder: GEMINI_CLI_TRUST_WORKSPACE=true, or the folder in"
              " ~/.gemini/trustedFolders.json; else project hooks are not loaded",
        source="Gemini CLI hooks reference (BeforeTool decision allow | deny | block, no"
               " ask); checked with 0.61.0")],
    "cursor": [Support(
        "cursor", None, None, (ALLOW, DENY, ASK), exit2=False, reason=True,
        transcript="none given to hooks",
        trust="none: .cursor/hooks.json is read as it is",
        source="Cursor hooks docs (permission allow | deny | ask); not checked against"
               " the real program")],
    "generic": [Support(
        "generic", None, None, (ALLOW, DENY, ASK), exit2=False, reason=True,
        transcript="the messages each event carries", trust="none",
        source="worldline's own (docs/hooks.md): the harness decides")],
}

# How to ask each client for its version, and how to read the answer:
# `codex --version` prints "codex-cli 0.171.0"; `claude --version` "2.1.197 (Claude
# Code)"; `gemini --version` "0.61.0".
PROGRAMS = {"claude-code": "claude", "codex": "codex", "gemini": "gemini",
            "cursor": "cursor-agent"}
PACKAGES = {"claude-code": "@anthropic-ai/claude-code", "codex": "@openai/codex",
            "gemini": "@google/gemini-cli"}


def parse_version(text: str | None) -> tuple[int, ...] | None:
    """The first ``N.N.N`` in ``text`` (by hand: ``re`` would cost every hook process
    its import)."""
    for word in (text or "").replace("-", " ").replace("v", " ").split():
        parts = word.split(".")
        if len(parts) >= 3 and all(p.isdigit() for p in parts[:3]):
            return tuple(int(p) for p in parts[:3])
    return None


def support(agent: str, version: str = "") -> Support | None:
    """What ``version`` of ``agent`` honours; ``version`` empty: the newest known range
    (a hook configured without a version assumes the client as worldline last knew
    it). None: a version worldline does not know (fail closed)."""
    ranges = SUPPORT[agent]
    if not version:
        return ranges[-1]
    if agent == "generic":
        return ranges[0]
    for entry in ranges:
        if entry.covers(version):
            return entry
    return None


def honours(agent: str, version: str, decision: str) -> bool:
    entry = support(agent, version)
    return entry is not None and entry.honours(decision)


def detect(agent: str, environ: dict[str, str] | None = None) -> tuple[str, str]:
    """The installed client: (its program's path, its version); ("", "") when it is not
    found, (path, "") when its version cannot be read. The version is its npm package's
    (``gemini --version`` alone takes seconds: Node loads the whole CLI to print it),
    else what ``--version`` reports."""
    import shutil
    program = PROGRAMS.get(agent)
    if not program:
        return "", ""
    env = dict(os.environ if environ is None else environ)
    path = shutil.which(program, path=env.get("PATH"))
    if not path:
        return "", ""
    return path, package_version(agent, path) or reported_version(path, env)


def package_version(agent: str, program: str) -> str:
    """The version in the npm package ``program`` (its entry point) belongs to; ""."""
    import json
    folder = os.path.dirname(os.path.realpath(program))
    for _ in range(4):
        try:
            with open(os.path.join(folder, "package.json"), encoding="utf-8") as f:
                doc = json.load(f)
        except (OSError, ValueError):
            doc = None
        if isinstance(doc, dict) and doc.get("name") == PACKAGES.get(agent) and isinstance(
                doc.get("version"), str) and parse_version(doc["version"]):
            return doc["version"]
        folder = os.path.dirname(folder)
    return ""


def reported_version(program: str, environ: dict[str, str] | None = None) -> str:
    """The version ``program --version`` prints; "" when it names none."""
    import subprocess
    try:
        out = subprocess.run([program, "--version"], capture_output=True, text=True,
                             timeout=30, env=environ, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return ""
    version = parse_version(out.stdout) if out.returncode == 0 else None
    return ".".join(map(str, version)) if version else ""


def approval_mode(agent: str, version: str, wanted: str = "") -> tuple[str, str]:
    """The hook's ``--approval`` mode that holds for this client version, and why when it
    differs from ``wanted``. ``ask`` needs a client that honours it; an unknown version
    gets ``deny`` (wait answers allow or deny, and allow is optional: a client that
    ignores allow just runs the call under its own rules)."""
    entry = support(agent, version) if version != UNKNOWN else None
    if entry is None:
        why = (f"{agent} {version} is not a version worldline knows" if version != UNKNOWN
               else f"the installed {agent}'s version could not be read")
        if wanted == "wait":  # allow only once an operator approved: it holds too
            return wanted, why
        return DENY, why + ": gated calls are refused until approved"
    if wanted in ("", ASK) and not entry.honours(ASK):
        why = (f"{agent} {version or '(newest known)'} does not honour ask: gated calls are"
               f" refused with the approval's id") if wanted == ASK else ""
        return DENY, why
    return wanted or ASK, ""
