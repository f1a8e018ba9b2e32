"""The real Gemini CLI, set up with `worldline init gemini`, against a real daemon.

Gemini CLI runs headless (``-p ... --yolo``) in a network namespace of loopback only,
its model the scripted Gemini API of providers/gemini.py. Two pinned versions: 0.61.0
(its session as JSONL, hooks only in a folder it trusts) and 0.38.2 (the last to write
one JSON document, and to trust every folder when headless).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from ..conftest import WORLDLINE
from . import GEMINI_CLI, GEMINI_CLI_DOCUMENT, agent_bin
from .sandbox import base_url, isolated_home, run_agent

PROMPT = "write the notes, add a line, then publish them"


def gemini_env(root: Path) -> dict[str, str]:
    """Gemini CLI's environment: its own home, the scripted API, nothing sent anywhere."""
    env = isolated_home(root)
    settings = Path(env["HOME"]) / ".gemini" / "settings.json"
    settings.parent.mkdir(parents=True, exist_ok=True)
    settings.write_text(json.dumps({
        "security": {"auth": {"selectedType": "gemini-api-key"}},
        "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
        "telemetry": {"enabled": False},
        "privacy": {"usageStatisticsEnabled": False}}))
    env.update(GOOGLE_GEMINI_BASE_URL=base_url("gemini"), GEMINI_API_KEY="test")
    return env


def init_gemini(ws: Path, env: dict[str, str], daemon, *extra: str) -> dict:
    """`worldline init gemini` as the user runs it: their HOME, their project."""
    out = subprocess.run(WORLDLINE + ["init", "gemini", "--project", str(ws), "--json",
                                      "--address", daemon.address, *extra],
                         capture_output=True, text=True, env={**os.environ, **env},
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def gemini(version: str, ws: Path, env: dict[str, str], script: list, prompt: str = PROMPT,
           extra: list[str] = ()):
    argv = [str(agent_bin("gemini-cli", version)), *extra, "-p", prompt, "--yolo",
            "--output-format", "json", "-m", "gemini-2.5-flash"]
    return run_agent(argv, provider="gemini", script=script, cwd=ws, env=env, timeout=120)


def git(*args: str, cwd: Path) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True,
                          text=True).stdout


def project(tmp_path: Path) -> tuple[Path, Path]:
    """A git project whose origin is a local bare repository."""
    origin, ws = tmp_path / "origin.git", tmp_path / "ws"
    git("init", "-q", "--bare", str(origin), cwd=tmp_path)
    ws.mkdir()
    git("init", "-q", "-b", "main", cwd=ws)
    (ws / "README").write_text("notes\n")
    git("add", "README", cwd=ws)
    git("commit", "-q", "-m", "start", cwd=ws)
    git("remote", "add", "origin", str(origin), cwd=ws)
    return ws, origin


def messages_of(client, cp_id: str) -> list[dict]:
    return client.show(cp_id).messages


def calls_in(messages: list[dict]) -> list[str]:
    return [c["name"] for m in messages for c in m.get("toolCalls") or []]


def texts_in(messages: list[dict]) -> str:
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, str):
            out.append(content)
        elif isinstance(content, list):
            out += [p.get("text", "") for p in content if isinstance(p, dict)]
    return "\n".join(out)


@pytest.mark.parametrize("version", [GEMINI_CLI, GEMINI_CLI_DOCUMENT])
def test_gemini_cli_is_recorded_gated_and_rewound(version, daemon, client, tmp_path):
    ws, origin = project(tmp_path)
    session = client.create_session(str(ws))
    env = gemini_env(tmp_path)
    d = init_gemini(ws, env, daemon, "--trust")
    assert d["trust"]["trusted"], d["trust"]
    script = [
        {"text": "I will write the notes.",
         "calls": [{"name": "write_file",
                    "args": {"file_path": str(ws / "notes.txt"), "content": "first\n"}}]},
        {"calls": [{"name": "run_shell_command",
                    "args": {"command": "echo second >> notes.txt"}}]},
        {"calls": [{"name": "run_shell_command",
                    "args": {"command": "git push origin HEAD:refs/heads/main"}}]},
        {"text": "Done: the push needs an approval."},
    ]
    run = gemini(version, ws, env, script).check()
    gemini_session = json.loads(run.stdout)["session_id"]
    assert len([r for r in run.requests if "GenerateContent" in r["path"]]) == 4

    # the files as the model's calls left them; the push never ran
    assert (ws / "notes.txt").read_text() == "first\nsecond\n"
    assert git("for-each-ref", cwd=origin) == ""
    calls = client.tool_calls(session.id)
    assert [c.name for c in calls] == ["write_file", "run_shell_command"]
    assert "git push" not in json.dumps([c.args for c in calls])
    [approval] = client.list_approvals(session.id)
    # Gemini CLI has no "ask": the hook refused, an operator decides; nobody has yet
    assert (approval.tool, approval.status) == ("run_shell_command", "pending")
    told = json.dumps(run.requests[-1]["body"])  # the model was told what approves it
    assert f"worldline approve {approval.id}" in told

    # each checkpoint holds the conversation up to it: each message once, as last
    # written, the later ones extending the earlier
    log = [cp for cp in client.log(session.id) if cp.kind == "checkpoint"]
    labels = [cp.label for cp in log]
    assert labels[0].startswith("prompt:") and labels[-1] == "stop", labels
    after_write = log[[lb.startswith("write_file") for lb in labels].index(True)]
    after_edit = log[[lb.startswith("run_shell_command") for lb in labels].index(True)]
    assert all(cp.warnings == [] for cp in log), [cp.warnings for cp in log]
    conversations = [messages_of(client, cp.id) for cp in log]
    for earlier, later in zip(conversations, conversations[1:], strict=False):
        assert later[:len(earlier)] == earlier
    # (0.38 makes its transcript at its first message, after the prompt's checkpoint)
    for messages in conversations if version == GEMINI_CLI else conversations[1:]:
        assert messages
        ids = [m["id"] for m in messages]
        assert len(ids) == len(set(ids))
    assert PROMPT in texts_in(messages_of(client, after_write.id))
    at_edit = messages_of(client, after_edit.id)
    assert "I will write the notes." in texts_in(at_edit)
    assert calls_in(at_edit) == ["write_file"]  # the model's turn as it ended up
    whole = conversations[-1]
    assert calls_in(whole) == ["write_file", "run_shell_command", "run_shell_command"]
    assert "Done: the push needs an approval." in texts_in(whole)
    assert {m["role"] for m in whole} == {"user", "assistant"}
    transcript = Path(client.show(log[-1].id).resume["transcript"])
    if version == GEMINI_CLI:  # JSONL: a header line, then messages and updates
        assert transcript.suffix == ".jsonl"
        assert len(transcript.read_text().splitlines()) > len(whole)
    else:  # one JSON document
        assert transcript.suffix == ".json"
        assert [m["id"] for m in json.loads(transcript.read_text())["messages"]] == [
            m["id"] for m in whole]

    # once an operator approves it, the retry goes through, recorded with the approval
    out = subprocess.run(WORLDLINE + ["approve", approval.id, "--address", daemon.address],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    gemini(version, ws, env, [script[2], {"text": "Pushed."}], prompt="push again").check()
    assert git("for-each-ref", "--format=%(refname)", cwd=origin) == "refs/heads/main\n"
    pushed = client.tool_calls(session.id)[-1]
    assert "git push" in pushed.args["command"] and pushed.approval_id == approval.id

    # rewind is exact, and says how to take the conversation back there
    out = subprocess.run(WORLDLINE + ["rewind", "--to", after_write.id, "--json", "--yes",
                                      "--address", daemon.address],
                         cwd=ws, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert [e["tool_call_id"] for e in r["side_effects"]] == [pushed.id]
    assert (ws / "notes.txt").read_text() == "first\n"
    assert f"gemini --resume {gemini_session}" in r["resume_command"]
    now = client.checkpoint(session.id, label="after the rewind")
    d = client.diff(after_write.id, now.id)
    assert (d.added, d.modified, d.deleted) == ([], [], [])
    # the command it printed resumes that conversation in Gemini CLI
    resumed = gemini(version, ws, env, [{"text": "Back again."}], prompt="where were we",
                     extra=r["resume_command"].split("   ")[0].split()[1:]).check()
    sent = json.dumps(resumed.requests[-1]["body"])
    assert "I will write the notes." in sent and "where were we" in sent


def test_an_untrusted_folder_and_init_saying_so(daemon, client, tmp_path):
    """Gemini CLI 0.61.0 runs no hook in a folder it does not trust (headless, it
    refuses to start there): `worldline init gemini` says so and gives the command;
    --trust trusts the folder named, and only it."""
    ws, _ = project(tmp_path)
    session = client.create_session(str(ws))
    env = gemini_env(tmp_path)
    d = init_gemini(ws, env, daemon)
    trust = d["trust"]
    assert not trust["trusted"] and "--trust" in trust["fix"]
    assert "GEMINI_CLI_TRUST_WORKSPACE=true" in trust["fix"]
    run = gemini(GEMINI_CLI, ws, env, [{"text": "nothing to do"}], prompt="hello")
    assert run.returncode == 55 and "trusted" in run.stderr  # FatalUntrustedWorkspaceError
    assert [cp.kind for cp in client.log(session.id)] == ["initial"]
    trusted = init_gemini(ws, env, daemon, "--trust")["trust"]
    assert trusted["trusted"] and str(ws) in trusted["by"]
    rules = json.loads(Path(trusted["file"]).read_text())
    assert rules == {str(ws.resolve()): "TRUST_FOLDER"}
