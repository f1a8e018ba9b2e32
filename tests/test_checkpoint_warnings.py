"""A checkpoint's warnings: the caller's, then the daemon's own
(World.warn_next_checkpoint), kept with it and shown by the client."""

from __future__ import annotations

import json

import pytest
from worldline.client.errors import InvalidArgument

from .conftest import run_python


def test_the_callers_warnings_are_kept_and_bad_ones_change_nothing(daemon, client,
                                                                   workspace):
    s = client.create_session(str(workspace))
    cp = s.checkpoint(label="partial", warnings=["the transcript could not be read"])
    assert client.show(cp.id).warnings == ["the transcript could not be read"]
    assert client.log(s.id)[-1].warnings == ["the transcript could not be read"]
    for bad in ([""], ["  "], ["w"] * 33, ["x" * ((64 << 10) + 1)]):
        with pytest.raises(InvalidArgument):
            s.checkpoint(warnings=bad)
    assert client.get_session(s.id).head == cp.id
    assert s.checkpoint().warnings == []
    made = daemon.cli_json("checkpoint", s.id, "--warning", "one", "--warning", "two")
    assert made["warnings"] == ["one", "two"]
    lines = daemon.cli("log", s.id).stdout.splitlines()
    assert [line for line in lines if "warning(s)]" in line] == [
        line for line in lines if cp.id in line or made["id"] in line]


def test_a_warning_the_daemon_queues_rides_on_the_sessions_next_checkpoint(tmp_path):
    root, ws = tmp_path / "root", tmp_path / "ws"
    ws.mkdir()
    (tmp_path / "ws-2").mkdir()
    script = (
        "import json\n"
        "from worldline.client import Client\n"
        "from worldline.daemon.main import Daemon\n"
        f"root, ws = {str(root)!r}, {str(ws)!r}\n"
        "d = Daemon(root, f'unix://{root}/wl.sock')\n"
        "d.start()\n"
        "out = []\n"
        "with Client(f'unix://{root}/wl.sock') as c:\n"
        "    s, other = c.create_session(ws), c.create_session(ws + '-2')\n"
        "    d.world.warn_next_checkpoint(s.id, 'a gated call ran anyway')\n"
        "    out.append(other.checkpoint().warnings)\n"
        "    out.append(s.checkpoint(warnings=['mine']).warnings)\n"
        "    out.append(c.show(s.head).warnings)\n"
        "    out.append(s.checkpoint().warnings)\n"
        "d.stop()\n"
        "print(json.dumps(out))\n")
    other, first, shown, second = json.loads(run_python(script, timeout=60))
    assert other == []
    assert first == shown == ["mine", "a gated call ran anyway"]
    assert second == []
