"""The errors a person meets first say what to do, in one line: a socket they may not
use, a daemon that is not running, a Docker engine that cannot be reached."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
from worldline.client import Client, Unavailable
from worldline.daemon.capture.containers import Engine

from .fidelity import AGENT_UID

CLI = [sys.executable, "-m", "worldline.client.cli"]


def _cli(*args: str, uid: int | None = None) -> subprocess.CompletedProcess:
    prefix = [] if uid is None else ["setpriv", f"--reuid={uid}", f"--regid={uid}",
                                     "--clear-groups"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORLDLINE_")}
    return subprocess.run([*prefix, *CLI, *args], capture_output=True, text=True, cwd="/",
                          env=env, timeout=60)


@pytest.mark.parametrize("transport", ["gateway", "grpc"])
def test_no_daemon_at_the_socket_says_how_to_start_one_in_one_line(tmp_path, transport):
    address = f"unix://{tmp_path}/none.sock"
    if transport == "grpc":
        with pytest.raises(Unavailable) as err, Client(address, transport="grpc") as c:
            c.list_sessions()
        message = str(err.value)
    else:
        out = _cli("--address", address, "session", "list")
        assert out.returncode != 0
        message = out.stderr.strip()
        assert len(message.splitlines()) == 1, message
    assert "`worldline daemon`" in message, message
    assert "failed to connect" not in message and "UNKNOWN" not in message, message


def test_a_socket_the_caller_may_not_use_names_allow_uid(daemon):
    out = _cli("--address", daemon.address, "session", "list", uid=AGENT_UID)
    assert out.returncode != 0
    message = out.stderr.strip()
    assert len(message.splitlines()) == 1, message
    assert f"--allow-uid {AGENT_UID}" in message, message


def test_a_docker_engine_that_is_not_there_is_one_line_of_advice(tmp_path):
    engine = Engine(f"unix://{tmp_path}/docker.sock")
    with pytest.raises(Unavailable) as err, engine.errors():
        engine.api.version()
    assert "no Docker engine listens" in str(err.value), err.value


def test_a_docker_engine_that_refuses_the_user_says_so(tmp_path):
    path = tmp_path / "docker.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen()
    os.chmod(tmp_path, 0o755)
    os.chmod(path, 0o600)  # root's, as the engine's socket is
    script = ("from worldline.daemon.capture.containers import Engine\n"
              "from worldline.client import Unavailable\n"
              f"e = Engine('unix://{path}')\n"
              "try:\n    e.api.version()\nexcept Unavailable as exc:\n    print(exc)\n")
    try:
        out = subprocess.run(["setpriv", f"--reuid={AGENT_UID}", f"--regid={AGENT_UID}",
                              "--clear-groups", sys.executable, "-c", script], cwd="/",
                             capture_output=True, text=True, timeout=60)
    finally:
        listener.close()
    assert "permission denied" in out.stdout and "docker group" in out.stdout, out
    assert "PermissionError(" not in out.stdout
