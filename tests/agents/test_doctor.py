"""`worldline doctor AGENT` against the real programs (the pinned versions on PATH):
each check fails, with the command that fixes it, until that is done, and then holds;
`--json` is `{"checks": [{"name", "ok", "detail", "fix"}]}`; exit 0 only when all hold."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from ..conftest import DaemonProcess
from ..fidelity import AGENT_UID, in_child_as
from . import CLAUDE_CODE, CODEX, GEMINI_CLI, agent_bin
from .claude import WORLDLINE, claude_env
from .sandbox import run_agent

BINS = {"claude-code": agent_bin("claude-code", CLAUDE_CODE).parent,
        "gemini": agent_bin("gemini-cli", GEMINI_CLI).parent,
        "codex": agent_bin("codex", CODEX).parent}
SYSTEM = [str(Path(sys.executable).parent), "/usr/bin", "/bin"]


def env_for(tmp_path: Path, *agents: str, **extra: str) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    path = [str(BINS[a]) for a in agents] + SYSTEM
    return {"HOME": str(home), "PATH": os.pathsep.join(path), "LANG": "C.UTF-8", **extra}


def doctor(env: dict[str, str], *args: str) -> tuple[int, dict]:
    out = subprocess.run(WORLDLINE + ["doctor", *args, "--json"], capture_output=True,
                         text=True, env=env, timeout=120)
    return out.returncode, json.loads(out.stdout)


def by_name(d: dict) -> dict[str, dict]:
    for check in d["checks"]:
        assert set(check) == {"name", "ok", "detail", "fix"}
        assert isinstance(check["ok"], bool) and (check["fix"] == "") == check["ok"]
    return {c["name"]: c for c in d["checks"]}


def run_fix(fix: str, env: dict[str, str], *extra: str) -> dict:
    """A `worldline ...` fix as the user would type it (the worldline of these tests)."""
    words = shlex.split(fix)
    assert words[0] == "worldline"
    out = subprocess.run(WORLDLINE + words[1:] + [*extra, "--json"], capture_output=True,
                         text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_doctor_claude_code_each_point_fails_then_holds(daemon, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    nowhere = f"unix://{tmp_path}/no-daemon.sock"
    code, d = doctor(env_for(tmp_path), "claude-code", "--project", str(ws),
                     "--address", nowhere)
    checks = by_name(d)
    assert code == 1
    assert list(checks) == ["claude-code client", "claude-code hooks",
                            "claude-code hook command", "claude-code trust (headless)",
                            "claude-code trust (interactive)", "daemon", "permissions"]
    assert checks["claude-code client"]["fix"] == "npm install -g @anthropic-ai/claude-code"
    assert checks["claude-code hooks"]["fix"] == f"worldline init claude-code --project {ws}"
    assert checks["claude-code trust (headless)"]["ok"]  # print mode needs no trust
    assert checks["claude-code trust (interactive)"]["fix"].startswith(f"cd {ws} && claude")
    assert checks["daemon"]["fix"] == f"worldline daemon --listen {nowhere}"

    # The fixes: the client on PATH, the hooks by the printed command, the trust as
    # Claude Code's dialog records it, the daemon that runs.
    env = env_for(tmp_path, "claude-code")
    init = run_fix(checks["claude-code hooks"]["fix"], env, "--address", daemon.address)
    assert by_name(init)["claude-code hooks"]["ok"]
    (tmp_path / "home" / ".claude.json").write_text(json.dumps(
        {"projects": {str(tmp_path): {"hasTrustDialogAccepted": True}}}))  # a parent
    code, d = doctor(env, "claude-code", "--project", str(ws))  # the hooks' --address
    checks = by_name(d)
    assert code == 0 and all(c["ok"] for c in checks.values()), checks
    assert checks["claude-code client"]["detail"].startswith(f"claude {CLAUDE_CODE} at ")
    assert daemon.address in checks["daemon"]["detail"]

    # What turns the hooks off again is found: disableAllHooks, a command that cannot run.
    local = ws / ".claude" / "settings.local.json"  # where init wrote the hooks
    kept = local.read_text()
    local.write_text(json.dumps({**json.loads(kept), "disableAllHooks": True}))
    code, d = doctor(env, "claude-code", "--project", str(ws))
    assert code == 1 and str(local) in by_name(d)["claude-code hooks"]["fix"]
    local.write_text(kept)
    run_fix(f"worldline init claude-code --project {ws}", env, "--command",
            f"{tmp_path}/gone/worldline hook claude-code")
    code, d = doctor(env, "claude-code", "--project", str(ws))
    assert code == 1 and not by_name(d)["claude-code hook command"]["ok"]

    # The human form: a line a check, `ok` or `fail`, and the fix under a failing one.
    out = subprocess.run(WORLDLINE + ["doctor", "claude-code", "--project", str(ws)],
                         capture_output=True, text=True, env=env, timeout=120)
    lines = out.stdout.splitlines()
    assert out.returncode == 1
    assert lines[0].startswith("ok    claude-code client: claude ")
    assert any(line.startswith("fail  claude-code hook command:") for line in lines)
    assert any(line.startswith("      fix: worldline init claude-code") for line in lines)


def set_up_untrusted(daemon, tmp_path: Path, agent: str, version: str):
    """A project with worldline's hooks for ``agent``, its program on PATH, nothing
    trusted yet: (workspace, env, doctor's checks), once doctor found the program."""
    ws = tmp_path / "ws"
    ws.mkdir()
    env = env_for(tmp_path, agent)
    run_fix(f"worldline init {agent} --project {ws}", env, "--address", daemon.address)
    code, d = doctor(env, agent, "--project", str(ws))
    checks = by_name(d)
    assert code == 1
    assert checks[f"{agent} client"]["detail"].startswith(f"{agent} {version} at ")
    return ws, env, checks


def test_doctor_gemini_trust_headless_and_interactive(daemon, tmp_path):
    ws, env, checks = set_up_untrusted(daemon, tmp_path, "gemini", GEMINI_CLI)
    assert checks["gemini trust (headless)"]["fix"].startswith(
        "export GEMINI_CLI_TRUST_WORKSPACE=true")
    assert not checks["gemini trust (interactive)"]["ok"]

    code, d = doctor({**env, "GEMINI_CLI_TRUST_WORKSPACE": "true"}, "gemini",
                     "--project", str(ws))
    checks = by_name(d)
    assert checks["gemini trust (headless)"]["ok"]
    assert not checks["gemini trust (interactive)"]["ok"] and code == 1

    rules = tmp_path / "home" / ".gemini" / "trustedFolders.json"
    rules.parent.mkdir(exist_ok=True)
    rules.write_text(json.dumps({str(ws / "child"): "TRUST_PARENT"}))  # trusts ws
    code, d = doctor(env, "gemini", "--project", str(ws))
    assert code == 0, d
    rules.write_text(json.dumps({str(tmp_path): "TRUST_FOLDER",
                                 str(ws): "DO_NOT_TRUST"}))  # the longest rule wins
    code, d = doctor(env, "gemini", "--project", str(ws))
    assert code == 1 and "DO_NOT_TRUST" in by_name(d)["gemini trust (interactive)"]["detail"]


def test_doctor_codex_hook_trust(daemon, tmp_path):
    """Codex's own app server says which hooks it trusts: none in an untrusted project,
    a hook whose stored hash is not its command's is "modified", and the hashes it
    reports, stored in config.toml (what its "Trust all" does), trust them."""
    from worldline.client.doctor import _codex_hooks
    ws, env, checks = set_up_untrusted(daemon, tmp_path, "codex", CODEX)
    assert "--dangerously-bypass-hook-trust" in checks["codex trust (headless)"]["fix"]
    assert "not a trusted project" in checks["codex trust (interactive)"]["detail"]

    config = tmp_path / "home" / ".codex" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    project = f'[projects."{ws}"]\ntrust_level = "trusted"\n'
    config.write_text(project)
    listed = _codex_hooks(str(BINS["codex"] / "codex"), str(ws), env)
    assert sorted(h["key"].split(":")[1] for h in listed) == [
        "post_tool_use", "pre_tool_use", "session_start", "stop", "user_prompt_submit"]
    assert {h["trustStatus"] for h in listed} == {"untrusted"}
    [pre] = [h for h in listed if ":pre_tool_use:" in h["key"]]
    assert pre["key"] == f"{ws}/.codex/hooks.json:pre_tool_use:0:0"

    def trust(hooks: list[dict], digest=lambda h: h["currentHash"]) -> None:
        config.write_text(project + "".join(
            f'[hooks.state."{h["key"]}"]\ntrusted_hash = "{digest(h)}"\n' for h in hooks))

    trust(listed, digest=lambda h: "sha256:" + "0" * 64)  # another command's hash
    code, d = doctor(env, "codex", "--project", str(ws))
    assert code == 1 and "pre_tool_use (modified)" in by_name(d)["codex trust (headless)"][
        "detail"]
    trust([h for h in listed if ":stop:" not in h["key"]])
    code, d = doctor(env, "codex", "--project", str(ws))
    assert code == 1 and by_name(d)["codex trust (headless)"]["detail"] == (
        "worldline's hooks are not trusted: stop (untrusted)")
    trust(listed)
    code, d = doctor(env, "codex", "--project", str(ws))
    assert code == 0, d


def test_doctor_names_the_uid_the_daemon_does_not_admit(tmp_path):
    """As uid 1000, a daemon of root's: the permissions check fails, its fix names
    --allow-uid 1000, and a daemon started so admits the hooks of that user."""
    from worldline.client.doctor import daemon_checks
    hidden = in_child_as(AGENT_UID, lambda: [c.to_dict() for c in daemon_checks(
        f"unix://{tmp_path}/root/worldline.sock")])  # below pytest's 0700 folders
    assert not hidden[0]["ok"] and hidden[0]["fix"].startswith("chmod o+x /tmp/")
    base = Path(tempfile.mkdtemp(prefix="wl-doctor-"))
    os.chmod(base, 0o711)

    def as_agent(address: str) -> dict:
        got = in_child_as(AGENT_UID, lambda: [c.to_dict() for c in daemon_checks(address)])
        assert isinstance(got, list), got
        return {c["name"]: c for c in got}

    closed = DaemonProcess(base / "closed").start()
    try:
        checks = as_agent(closed.address)
        assert [c.to_dict()["ok"] for c in daemon_checks(closed.address)] == [True, True]
    finally:
        closed.stop()
    assert checks["daemon"]["ok"] and not checks["permissions"]["ok"]
    fix = checks["permissions"]["fix"]
    assert f"--allow-uid {AGENT_UID}" in fix
    admitting = DaemonProcess(base / "open", extra=["--allow-uid", str(AGENT_UID)]).start()
    try:
        checks = as_agent(admitting.address)
    finally:
        admitting.stop()
        shutil.rmtree(base, ignore_errors=True)
    assert checks["daemon"]["ok"] and checks["permissions"]["ok"], checks


@pytest.mark.parametrize("agent", ["claude-code", "codex"])
def test_the_package_version_is_the_one_the_program_reports(agent):
    """doctor reads the version from the npm package (`gemini --version` takes seconds);
    the programs themselves say the same (`claude --version`, `codex --version`)."""
    from worldline.client.doctor import installed
    from worldline.client.hooks.support import reported_version
    program, version = installed(agent, str(BINS[agent]))
    assert version == {"claude-code": CLAUDE_CODE, "codex": CODEX}[agent]
    assert reported_version(program) == version


@pytest.mark.parametrize("agent", ["claude-code", "gemini"])
def test_init_prints_the_doctors_checks(agent, daemon, tmp_path):
    env = env_for(tmp_path, agent)
    out = subprocess.run(WORLDLINE + ["init", agent, "--project", str(tmp_path),
                                      "--address", daemon.address],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"ok    {agent} hooks: " in out.stdout and "ok    daemon: " in out.stdout


KEY = "sk-ant-api03-" + "t" * 32  # an API key Claude Code's interactive start accepts


@pytest.mark.parametrize("trusted", [True, False])
def test_interactive_claude_code_runs_the_hooks_where_doctor_says_trusted(trusted, daemon,
                                                                         client, tmp_path):
    """The real Claude Code on a terminal: in a folder whose trust was accepted the
    hooks run (the prompt is checkpointed); elsewhere it shows its trust dialog and
    runs nothing, and doctor's interactive trust check says so beforehand."""
    ws = tmp_path / "ws"
    ws.mkdir()
    session = client.create_session(str(ws))
    env = {**claude_env(tmp_path), "ANTHROPIC_API_KEY": KEY, "TERM": "xterm-256color"}
    env.pop("CI")
    run_fix(f"worldline init claude-code --project {ws}", env, "--address", daemon.address)
    (tmp_path / "home" / ".claude.json").write_text(json.dumps({
        "hasCompletedOnboarding": True, "theme": "dark",  # past the first-run screens
        "customApiKeyResponses": {"approved": [KEY[-20:]], "rejected": []},
        "projects": {str(ws): {"hasTrustDialogAccepted": trusted}}}))
    code, d = doctor({**env, "PATH": env_for(tmp_path, "claude-code")["PATH"]},
                     "claude-code", "--project", str(ws))
    assert by_name(d)["claude-code trust (interactive)"]["ok"] is trusted
    assert code == (0 if trusted else 1)

    marker = "fromthemodel|Workedfor" if trusted else "Itrustthisfolder|No,exit"
    run = run_agent([sys.executable, str(Path(__file__).with_name("pty_drive.py")), "40",
                     marker, "1.5", "--", str(agent_bin("claude-code", CLAUDE_CODE)),
                     "say hi"], provider="anthropic", script=[{"text": "hello from the model"}],
                    cwd=ws, env=env, timeout=90)
    assert run.returncode == 0, run.stdout[-2000:]
    labels = [cp.label for cp in client.log(session.id)]
    asked = [r for r in run.requests if r["path"].startswith("/v1/messages")]
    if trusted:
        assert "prompt: say hi" in labels and len(asked) >= 1
    else:
        assert labels == ["session created"] and asked == []
