"""The operator's side: log --graph, shell completion, Prometheus metrics, JSON logs."""

from __future__ import annotations

import json
import socket
import subprocess
import urllib.request

from .conftest import WORLDLINE, DaemonProcess


def test_log_graph_draws_restores_and_forks(daemon, workspace):
    s = daemon.cli_json("session", "create", "--workspace", str(workspace))
    (workspace / "f").write_text("1")
    cp1 = daemon.cli_json("checkpoint", s["id"], "--label", "one")
    (workspace / "f").write_text("2")
    daemon.cli_json("checkpoint", s["id"], "--label", "two")
    daemon.cli_json("restore", s["id"], cp1["id"])
    fork = daemon.cli_json("fork", cp1["id"], "--name", "other approach")
    text = daemon.cli("log", s["id"], "--graph").stdout
    lines = text.splitlines()
    assert lines[0].startswith("* #3") and "↺ restored to #1" in lines[0]
    assert any(f"fork {fork['id']}" in ln and "other approach" in ln for ln in lines)
    graph = daemon.cli_json("log", s["id"], "--graph")
    assert [f["id"] for f in graph["forks"][cp1["id"]]] == [fork["id"]]


def test_bash_completion(tmp_path):
    script = subprocess.run(WORLDLINE + ["completion", "bash"], capture_output=True,
                            text=True, check=True).stdout
    path = tmp_path / "c.sh"
    path.write_text(script)
    out = subprocess.run(
        ["bash", "-c", f"source {path}; COMP_WORDS=(worldline res); COMP_CWORD=1; _worldline;"
                       " echo ${COMPREPLY[@]}; COMP_WORDS=(worldline gc --k); COMP_CWORD=2;"
                       " _worldline; echo ${COMPREPLY[@]}"],
        capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0] == "restore"
    assert set(out[1].split()) == {"--keep-last", "--keep-labelled", "--keep-newer-than"}


def test_metrics_and_json_logs(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    d = DaemonProcess(tmp_path / "root", extra=["--metrics-listen", f"127.0.0.1:{port}",
                                                "--log-format", "json"],
                      env={"WORLDLINE_LOG_LEVEL": "INFO"}).start()
    ws = tmp_path / "ws"
    ws.mkdir()
    try:
        with d.client() as c:
            s = c.create_session(str(ws))
            (ws / "a").write_text("x" * 1000)
            c.checkpoint(s.id)
            c.checkpoint(s.id)
            s.request_approval("deploy")
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        text = body.decode()
        assert 'worldline_rpc_duration_seconds_count{code="OK",method="CreateCheckpoint"}' \
            in text
        assert "worldline_blob_bytes_written_total" in text
        assert "worldline_dedup_ratio" in text
        assert "worldline_tracker_fallbacks_total" in text
    finally:
        d.stop()
    lines = [json.loads(ln) for ln in d.log.read_text().splitlines() if ln.startswith("{")]
    assert lines and all({"time", "level", "logger", "message"} <= ln.keys() for ln in lines)
