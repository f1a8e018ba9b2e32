"""Run a real agent program where nothing but 127.0.0.1 exists.

``run_agent(argv, provider=..., script=...)`` starts, inside a fresh network namespace
whose only interface is loopback (``unshare --net``), the scripted model server for
``provider`` (``tests/agents/providers/<provider>.py``) and then the agent, and returns
the agent's exit status, output and every request the model server received. Whatever
the agent tries beyond 127.0.0.1 (telemetry, updates, the real API) finds no route: it
cannot leave the machine, whatever its configuration says. The daemon is reached over
its Unix socket, which a network namespace does not hide.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

PORT = 18765  # the namespace is new every run: nothing else listens there


@dataclass
class AgentRun:
    returncode: int
    stdout: str
    stderr: str
    requests: list[dict] = field(default_factory=list)  # as the model server logged them

    def check(self) -> AgentRun:
        assert self.returncode == 0, (f"agent exited {self.returncode}\nstdout:\n{self.stdout}"
                                      f"\nstderr:\n{self.stderr}")
        return self


def run_agent(argv: list[str], *, provider: str, script: list, cwd: Path,
              env: dict[str, str], timeout: float = 120.0,
              stdin: str | None = None) -> AgentRun:
    """Run ``argv`` against the scripted ``provider`` server at ``base_url(provider)``.

    ``script`` is the list of turns the provider module understands (each module says
    its own form); ``env`` is the agent's whole environment (nothing is inherited)."""
    with tempfile.TemporaryDirectory(prefix="wl-agent-") as tmp:
        script_file = Path(tmp) / "script.json"
        script_file.write_text(json.dumps(script))
        log_file = Path(tmp) / "requests.jsonl"
        child = [sys.executable, str(Path(__file__).with_name("sandbox_child.py")), provider,
                 str(script_file), str(log_file), str(PORT), "--", *argv]
        out = subprocess.run(["unshare", "--net", "--", *child], cwd=cwd, env=env,
                             input=stdin, capture_output=True, text=True, timeout=timeout)
        requests = []
        if log_file.exists():
            requests = [json.loads(line) for line in log_file.read_text().splitlines() if line]
        return AgentRun(out.returncode, out.stdout, out.stderr, requests)


def base_url(provider: str) -> str:
    return f"http://127.0.0.1:{PORT}"


def isolated_home(root: Path) -> dict[str, str]:
    """A minimal environment for an agent: its own HOME, PATH to node and the system."""
    home = root / "home"
    home.mkdir(parents=True, exist_ok=True)
    return {
        "HOME": str(home),
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/bin",
                                 "/usr/bin", "/bin", "/usr/sbin", "/sbin"]),
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "NO_COLOR": "1",
        "CI": "true",
    }
