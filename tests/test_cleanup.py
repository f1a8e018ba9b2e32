"""Clean-up (issue 58, item 8), from the CLI as a person types it: `session delete`
stops the session's container (`--keep-container` keeps it) and unmounts a fork's view
for good, across a daemon restart; forks get distinct names; the same caller's second
session over a folder is ALREADY_EXISTS naming the first, which `--exist-ok` and
``create_session(exist_ok=True)`` return; an allowed user overlapping another uid's
session is still told only that the folder is not available."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from worldline.client import AlreadyExists, FailedPrecondition

from .fidelity import AGENT_UID
from .test_containers import IMAGE
from .test_gateway_limits import place  # noqa: F401 -- a fixture
from .test_watch import _as_agent


def running(container: str) -> bool:
    out = subprocess.run(["docker", "inspect", "-f", "{{.State.Running}}", container],
                         capture_output=True, text=True, check=True).stdout
    return out.strip() == "true"


@pytest.mark.docker
def test_session_delete_stops_its_container_unless_kept(daemon, client, tmp_path, containers):
    sessions = []
    for name in ("stopped", "kept"):
        ws = tmp_path / name
        ws.mkdir()
        s = client.create_session(str(ws), image=IMAGE)
        containers.append(s.container)
        assert running(s.container)
        sessions.append(s)
    stopped, kept = sessions
    d = daemon.cli_json("session", "delete", stopped.id)
    assert d["id"] == stopped.id and d["deleted_at"] and d["container"] == stopped.container
    assert not running(stopped.container)
    res = daemon.cli("session", "delete", kept.id, "--keep-container")
    assert f"its container {kept.container} keeps running" in res.stdout
    assert running(kept.container)
    # the history stays: the deleted session's checkpoints are still read
    assert client.log(stopped.id)


def test_session_delete_unmounts_a_forks_view_for_good(fresh_daemon, workspace):
    d = fresh_daemon.start()
    (workspace / "f.txt").write_text("one\n")
    s = d.cli_json("session", "create", "--workspace", str(workspace), "--name", "proj")
    cp = d.cli_json("checkpoint", s["id"])
    forks = [d.cli_json("fork", cp["id"]) for _ in range(3)]
    assert [f["name"] for f in forks] == ["proj-fork-1", "proj-fork-2", "proj-fork-3"]
    gone, kept = forks[0], forks[1]
    if not os.path.ismount(gone["workspace"]):
        pytest.skip("forks copy here (no overlay mounts): no view to unmount")
    d.cli("session", "delete", gone["id"])
    assert not os.path.ismount(gone["workspace"])
    assert os.path.ismount(kept["workspace"])
    d.stop()
    d.start()  # a start mounts the live forks again, never a deleted one
    assert not os.path.ismount(gone["workspace"])
    assert os.path.ismount(kept["workspace"])
    assert open(os.path.join(kept["workspace"], "f.txt")).read() == "one\n"
    # the deleted fork's history is still there to fork from
    again = d.cli_json("fork", gone["head"])
    assert open(os.path.join(again["workspace"], "f.txt")).read() == "one\n"
    assert again["name"] == "proj-fork-1-fork-1"


def test_a_second_session_over_a_folder_is_already_exists_or_the_first(daemon, client,
                                                                        workspace):
    first = daemon.cli_json("session", "create", "--workspace", str(workspace))
    try:
        res = daemon.cli("session", "create", "--workspace", str(workspace), check=False)
        assert res.returncode == 1 and "ALREADY_EXISTS" in res.stderr
        assert first["id"] in res.stderr
        with pytest.raises(AlreadyExists):
            client.create_session(str(workspace))
        again = daemon.cli_json("session", "create", "--workspace", str(workspace),
                                "--exist-ok")
        assert again["id"] == first["id"]
        assert client.create_session(str(workspace), exist_ok=True).id == first["id"]
        # a folder inside it is another folder: still the overlap it is
        (workspace / "sub").mkdir()
        with pytest.raises(FailedPrecondition):
            client.create_session(str(workspace / "sub"), exist_ok=True)
    finally:
        client.delete_session(first["id"])
    # deleted: the folder is free, and exist_ok makes a new session there
    assert client.create_session(str(workspace), exist_ok=True).id != first["id"]


def test_an_allowed_user_gets_its_own_session_back_but_never_another_uids(place):  # noqa: F811
    d, ws, theirs = place
    other = ws.parent / "other"
    other.mkdir()
    os.chown(other, AGENT_UID, AGENT_UID)
    with d.client() as owner:
        over_other = owner.create_session(str(other))  # the owner's, in the agent's folder
    mine = _as_agent(d, "CreateSession", {"workspace": str(ws)})
    sid = mine["response"]["id"]
    twice = _as_agent(d, "CreateSession", {"workspace": str(ws)})
    assert twice["error"]["code"] == "ALREADY_EXISTS" and sid in twice["error"]["message"]
    refused = _as_agent(d, "CreateSession", {"workspace": str(other)})
    assert refused["error"]["code"] == "FAILED_PRECONDITION", refused
    assert over_other.id not in json.dumps(refused) and theirs.id not in json.dumps(refused)
