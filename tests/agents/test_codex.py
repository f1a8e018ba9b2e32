"""The real Codex (0.171.0, from the npm registry: `make agents`) set up with
`worldline init codex` against a real daemon, driven headless (`codex exec`) by a
scripted OpenAI Responses server on 127.0.0.1 (providers/openai.py).

Set-up that makes Codex run a project's hooks headless, both needed: the project is
trusted (``[projects."DIR"] trust_level = "trusted"`` in $CODEX_HOME/config.toml, or
``codex exec --trust``: else .codex/ is not loaded at all) and the hooks are trusted
(``--dangerously-bypass-hook-trust`` for this invocation; interactively, the review in
/hooks keeps ``hooks.state.<key>.trusted_hash`` in config.toml). The sandbox and
Codex's own approvals are off (``--dangerously-bypass-approvals-and-sandbox``), so that
nothing but worldline's gate stands between the model and a `git push`.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from ..conftest import WORLDLINE, tree_state
from . import CODEX, agent_bin
from .sandbox import base_url, isolated_home, run_agent

GIT = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
       "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid"}
PUSH = "git push origin HEAD:refs/heads/shipped"
PATCH = "*** Begin Patch\n*** Add File: notes.txt\n+written by apply_patch\n*** End Patch"


def config_toml(workspace: Path) -> str:
    """Codex pointed at the scripted server, with nothing that phones home."""
    return f"""model = "scripted"
model_provider = "scripted"
check_for_update_on_startup = false

[model_providers.scripted]
name = "scripted"
base_url = "{base_url("openai")}/v1"
wire_api = "responses"
env_key = "OPENAI_API_KEY"
request_max_retries = 0
stream_max_retries = 0

[analytics]
enabled = false

[projects."{workspace}"]
trust_level = "trusted"
"""


class Codex:
    """A workspace (a git repository with a bare origin beside it), an isolated
    CODEX_HOME, and `worldline init codex` in the workspace."""

    def __init__(self, daemon, tmp: Path, approval: str = "") -> None:
        self.daemon = daemon
        self.ws = tmp / "ws"
        self.origin = tmp / "origin.git"
        self.ws.mkdir()
        self.env = isolated_home(tmp)
        codex = agent_bin("codex", CODEX)
        self.env["PATH"] = f"{codex.parent}:{self.env['PATH']}"
        home = tmp / "codex-home"
        home.mkdir()
        (home / "config.toml").write_text(config_toml(self.ws))
        self.env.update(CODEX_HOME=str(home), OPENAI_API_KEY="test",
                        WORLDLINE_HOOK_STATE=str(tmp / "hook-state"), **GIT)
        git = {**self.env}
        subprocess.run(["git", "init", "-q", "--bare", str(self.origin)], check=True, env=git)
        for args in (["init", "-q", "-b", "main"], ["remote", "add", "origin", str(self.origin)]):
            subprocess.run(["git", *args], cwd=self.ws, check=True, env=git)
        (self.ws / "app.txt").write_text("v1\n")
        subprocess.run(["git", "add", "app.txt"], cwd=self.ws, check=True, env=git)
        subprocess.run(["git", "commit", "-qm", "v1"], cwd=self.ws, check=True, env=git)
        res = subprocess.run(WORLDLINE + ["init", "codex", "--project", str(self.ws), "--json",
                                          "--address", daemon.address,
                                          *(["--approval", approval] if approval else [])],
                             capture_output=True, text=True, env=self.env, timeout=60)
        assert res.returncode == 0, res.stderr
        self.init = json.loads(res.stdout)

    def exec(self, script: list, *args: str, env: dict | None = None):
        argv = [str(agent_bin("codex", CODEX)), "exec", "--skip-git-repo-check",
                "--dangerously-bypass-approvals-and-sandbox", "--dangerously-bypass-hook-trust",
                "--json", *args]
        return run_agent(argv, provider="openai", script=script, cwd=self.ws,
                         env={**self.env, **(env or {})}, timeout=90).check()

    def origin_refs(self) -> str:
        return subprocess.run(["git", "--git-dir", str(self.origin), "show-ref"],
                              capture_output=True, text=True).stdout


def thread_id(run) -> str:
    for line in run.stdout.splitlines():
        if line.startswith("{") and json.loads(line).get("type") == "thread.started":
            return json.loads(line)["thread_id"]
    raise AssertionError(f"no thread.started in {run.stdout}")


def told(run, command: str) -> str:
    """What the model was told of its call of ``command``: the call's output."""
    items = [item for request in run.requests
             for item in (request.get("body") or {}).get("input", [])]
    ids = {item["call_id"] for item in items if item.get("type") == "function_call"
           and json.loads(item["arguments"]).get("cmd") == command}
    for item in items:
        if item.get("type") == "function_call_output" and item["call_id"] in ids:
            return item["output"]
    raise AssertionError(f"the model was never told of its call of {command!r}")


def test_codex_edits_and_patches_recorded_and_its_push_waits_for_the_operator(daemon, client,
                                                                              tmp_path):
    codex = Codex(daemon, tmp_path)
    # init read the installed version and wrote a mode that holds for it: Codex 0.171.0
    # does not honour ask, so gated calls are refused with the approval's id.
    assert codex.init["client"]["version"] == CODEX
    assert codex.init["client"]["approval"] == "deny"
    hooks = json.loads((codex.ws / ".codex" / "hooks.json").read_text())["hooks"]
    assert f"--approval deny --client-version {CODEX}" in \
        hooks["PreToolUse"][0]["hooks"][0]["command"]

    first = codex.exec([
        {"text": "Editing app.txt.", "calls": [{"shell": "printf 'v2\\n' > app.txt"}]},
        {"calls": [{"patch": PATCH}]},
        {"calls": [{"shell": PUSH}]},
        {"text": "The push needs an operator's approval."},
    ], "ship it")
    assert (codex.ws / "app.txt").read_text() == "v2\n"
    assert (codex.ws / "notes.txt").read_text() == "written by apply_patch\n"
    assert codex.origin_refs() == ""  # the push did not run
    [s] = client.list_sessions(workspace=str(codex.ws))
    [approval] = client.list_approvals(s.id, "pending")
    assert f"worldline approve {approval.id}" in told(first, PUSH)

    calls = client.tool_calls(s.id)
    assert [c.args["command"].split()[0] for c in calls] == ["printf", "apply_patch"]
    edit, patch = calls
    log = client.log(s.id)
    by_id = {cp.id: cp for cp in log}
    after = {cp.parent_id: cp for cp in log}
    # Each call's changes are in the checkpoint right after it: the patch's too, though
    # Codex fired no PostToolUse for it.
    assert client.diff(edit.checkpoint_id, after[edit.checkpoint_id].id).modified == ["app.txt"]
    patched = after[patch.checkpoint_id]
    assert patched.label.endswith("(no after-tool event)")
    assert client.diff(patch.checkpoint_id, patched.id).added == ["notes.txt"]
    # Every checkpoint past the first prompt holds the conversation up to it.
    stop = log[-1]
    assert stop.label == "stop" and stop.resume["session_id"] == thread_id(first)
    texts = json.dumps(client.show(stop.id).messages)
    assert "ship it" in texts and "The push needs an operator" in texts
    assert all(client.show(cp.id).messages for cp in log[2:])
    assert by_id[approval.checkpoint_id].seq < stop.seq
    snapshot, stop_id = tree_state(codex.ws), stop.id

    # The operator approves; the model retries the same call: it runs, citing it.
    daemon.cli("approve", approval.id, "--reason", "ship it")
    codex.exec([{"calls": [{"shell": PUSH}]}, {"text": "Pushed."}],
               "resume", thread_id(first), "approved: retry the push")
    assert "refs/heads/shipped" in codex.origin_refs()
    pushed = [c for c in client.tool_calls(s.id) if c.args["command"] == PUSH]
    assert len(pushed) == 1 and pushed[0].approval_id == approval.id and pushed[0].gate is None
    approved = client.list_approvals(s.id, "approved")
    assert [(a.id, a.reason) for a in approved] == [(approval.id, "ship it")]
    assert [e for e in client.audit(s.id) if e.kind == "gate_bypassed"] == []

    # Rewind: the workspace exactly as at the first run's end; the push is a side effect
    # no rewind undoes; the command that resumes Codex's conversation names its session.
    res = subprocess.run(WORLDLINE + ["rewind", "--to", stop_id, "--yes", "--json",
                                      "--address", daemon.address],
                         cwd=codex.ws, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    result = json.loads(res.stdout)
    assert [e["tool_call_id"] for e in result["side_effects"]] == [pushed[0].id]
    assert result["resume_command"].startswith(f"codex resume {thread_id(first)}")
    assert tree_state(codex.ws) == snapshot


def test_codex_with_ask_forced_runs_the_push_and_it_is_recorded_as_a_bypass(daemon, client,
                                                                            tmp_path):
    """The defect as it was: a hook answering ask to Codex 0.171.0, which runs the call.
    The ledger says what happened: a gate bypass, and no approval."""
    codex = Codex(daemon, tmp_path, approval="ask")
    assert codex.init["client"]["approval"] == "deny"  # init will not write ask for it
    hooks_file = codex.ws / ".codex" / "hooks.json"
    hooks_file.write_text(hooks_file.read_text().replace("--approval deny", "--approval ask"))
    codex.exec([{"calls": [{"shell": PUSH}]}, {"text": "Pushed."}], "ship it",
               env={"WORLDLINE_HOOK_UNCHECKED": "1"})
    assert "refs/heads/shipped" in codex.origin_refs()  # Codex ignored the ask
    [s] = client.list_sessions(workspace=str(codex.ws))
    [call] = client.tool_calls(s.id)
    assert call.gate == "bypassed" and call.approval_id is None
    [approval] = client.list_approvals(s.id)
    assert approval.status == "pending"  # nobody approved it
    assert [e.detail["approval"] for e in client.audit(s.id)
            if e.kind == "gate_bypassed"] == [approval.id]
    assert not [e for e in client.audit(s.id) if e.kind == "approval.approved"]

