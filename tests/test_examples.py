"""The examples run, against a real daemon, as a user would run them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_scripted_agent(daemon):
    res = subprocess.run([sys.executable, str(EXAMPLES / "scripted_agent.py"), "--address",
                          daemon.address], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    assert "tests before any fix: fail" in out
    assert "restored" in out
    assert "approach B (drop the +1, empty is 0): tests pass" in out
    assert "resume point: None" in out
