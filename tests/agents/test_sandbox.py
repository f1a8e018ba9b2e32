"""The agents' sandbox: the scripted server answers on 127.0.0.1, and nothing else is
reachable (the namespace has loopback only)."""

import sys

from .sandbox import base_url, isolated_home, run_agent

FETCH = """
import json, subprocess, sys, urllib.request
print(json.dumps(json.load(urllib.request.urlopen(sys.argv[1] + "/v1/x", data=b"{}"))))
print(subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout)
"""


def test_the_agent_reaches_the_scripted_server_and_only_loopback_exists(tmp_path):
    run = run_agent([sys.executable, "-c", FETCH, base_url("echo")], provider="echo",
                    script=[{"say": "hello"}], cwd=tmp_path,
                    env=isolated_home(tmp_path)).check()
    first, *links = run.stdout.splitlines()
    assert '"say": "hello"' in first
    names = [line.split(":")[1].strip() for line in links if line.strip()]
    assert names == ["lo"]
    assert [r["path"] for r in run.requests] == ["/v1/x"]
