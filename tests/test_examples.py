"""The examples run, against a real daemon, as a user would run them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_scripted_agent(daemon, client):
    res = subprocess.run([sys.executable, str(EXAMPLES / "scripted_agent.py"), "--address",
                          daemon.address], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    assert "tests before any fix: fail" in out
    assert "restored" in out
    assert "approach B (drop the +1, empty is 0): tests pass" in out
    assert "resume point: None" in out
    # it cleans up: its sessions deleted (their history kept), no fork mounted, no folder
    repo = re.search(r"^session (\w+) on (\S+)$", out, re.M)
    forks = re.findall(r"\(fork (\w+),", out)
    assert repo and len(forks) == 2, out
    for sid in [repo[1], *forks]:
        s = client.get_session(sid)
        assert s.deleted_at, sid
        assert not os.path.ismount(s.workspace), s.workspace
    assert not os.path.exists(repo[2])
    assert "deleted 3 session(s)" in out


def test_scripted_agent_says_an_expected_failure_in_one_line(tmp_path):
    res = subprocess.run([sys.executable, str(EXAMPLES / "scripted_agent.py"), "--address",
                          f"unix://{tmp_path}/no-daemon.sock"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1
    assert "Traceback" not in res.stderr
    assert res.stderr.startswith("error: UNAVAILABLE: ") and res.stderr.count("\n") == 1
