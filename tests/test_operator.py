"""The operator's side: log --graph, shell completion, Prometheus metrics, JSON logs."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.request

import pytest
from worldline.client.progress import amount

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
            first = c.checkpoint(s.id)
            c.checkpoint(s.id)
            c.checkpoint(s.id)
            c.checkpoint(s.id)
            c.restore(s.id, first.id, dry_run=True)  # a preview is no rollback
            c.restore(s.id, first.id)
            s.request_approval("deploy")
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        text = body.decode()
        assert _sample(text, 'worldline_checkpoints_total{kind="checkpoint"}') == 4
        assert _sample(text, 'worldline_checkpoints_total{kind="restore"}') == 1
        assert _sample(text, "worldline_rollback_rate") == 25.0
        assert 'worldline_rpc_duration_seconds_count{code="OK",method="CreateCheckpoint"}' \
            in text
        assert "worldline_blob_bytes_written_total" in text
        assert "worldline_dedup_ratio" in text
        assert "worldline_tracker_fallbacks_total" in text
        assert 'worldline_gc_pause_seconds_count{generation="0"}' in text
        # each checkpoint waited for an fsync of meta.db's log; the log is copied into
        # the file within the checkpointer's interval
        assert _sample(text, 'worldline_metadata_fsync_seconds_count{file="meta.db"}') >= 2
        # each incremental checkpoint took a turn at the admission gate, on its CPU
        assert _sample(text, "worldline_admission_turn_seconds_count") >= 2
        assert _sample(text, "worldline_admission_wait_seconds_count") == _sample(
            text, "worldline_admission_turn_seconds_count")
        assert 0 < _sample(text, "worldline_admission_turn_cpu_seconds_total") <= _sample(
            text, "worldline_admission_turn_seconds_sum") + 0.01
        deadline = time.monotonic() + 10
        while _sample(text, 'worldline_wal_copy_seconds_count{file="meta.db"}') < 1:
            assert time.monotonic() < deadline, "meta.db's log was never copied"
            time.sleep(0.2)
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                          timeout=10).read().decode()
        assert 'worldline_wal_copy_seconds_bucket{file="meta.db",le="0.0005"}' in text
    finally:
        d.stop()
    lines = [json.loads(ln) for ln in d.log.read_text().splitlines() if ln.startswith("{")]
    assert lines and all({"time", "level", "logger", "message"} <= ln.keys() for ln in lines)


def _sample(text: str, name: str) -> float:
    """A sample's value in a Prometheus exposition, 0 if absent."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_the_cycle_collectors_pauses_are_counted():
    """worldline_gc_pause_seconds: every collection, by generation, with its duration
    (each stops every call). Counted without a lock: a collection may start inside a
    metric's own locked update."""
    import gc

    from prometheus_client import generate_latest
    from worldline.daemon.observe import GC_PAUSES, watch_gc
    watch_gc()
    watch_gc()  # once per process, however often asked
    before, took = sum(GC_PAUSES.counts[2]), GC_PAUSES.sums[2]
    gc.collect()
    assert sum(GC_PAUSES.counts[2]) == before + 1 and GC_PAUSES.sums[2] > took
    text = generate_latest().decode()
    assert f'worldline_gc_pause_seconds_count{{generation="2"}} {before + 1}.0' in text
    assert 'worldline_gc_pause_seconds_bucket{generation="2",le="+Inf"}' in text


def _many_files(ws, n: int = 300, size: int = 4096, tag: str = "a") -> int:
    for i in range(n):
        p = ws / f"d{i % 10}" / f"f{i}.bin"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text((tag * size)[:size])
    return n * size


def test_progress_bars_follow_restore_fork_and_gc(daemon, workspace):
    total = _many_files(workspace)
    s = daemon.cli_json("session", "create", "--workspace", str(workspace))
    cp = daemon.cli_json("checkpoint", s["id"])
    _many_files(workspace, tag="b")
    daemon.cli_json("checkpoint", s["id"])
    res = daemon.cli("restore", s["id"], cp["id"], "--progress", "--json")
    assert json.loads(res.stdout)["restored_from"] == cp["id"]  # stdout stays one document
    lines = res.stderr.splitlines()
    assert lines[-1] == f"restore: workspace: 100%  {amount(total, 'bytes')} of" \
                        f" {amount(total, 'bytes')}, 300 files", lines
    fork = daemon.cli("fork", cp["id"], "--progress")
    assert fork.stderr.splitlines()[-1].startswith("fork: ") and "100%" in fork.stderr
    gc = daemon.cli("gc", "--progress").stderr.splitlines()
    assert gc[-1].startswith("sweeping blobs: 100%"), gc
    assert daemon.cli("restore", s["id"], cp["id"], "--no-progress").stderr == ""
    assert daemon.cli("restore", s["id"], cp["id"]).stderr == ""  # not a terminal: no bar


def test_progress_is_visible_while_a_restore_runs(tmp_path):
    import threading

    from worldline.client import AlreadyExists, InvalidArgument, NotFound
    ws = tmp_path / "ws"
    ws.mkdir()
    total = _many_files(ws, n=120)
    d = DaemonProcess(tmp_path / "root",
                      env={"WORLDLINE_FAULTS": "restore.between_files@1.5:61"}).start()
    try:
        with d.client() as c:
            s = c.create_session(str(ws))
            cp = s.checkpoint()
            _many_files(ws, n=120, tag="z")
            s.checkpoint()
            done = threading.Event()
            t = threading.Thread(target=lambda: (c.restore(s.id, cp.id, operation_id="op-1"),
                                                 done.set()))
            t.start()
            seen = None
            for _ in range(100):  # the daemon pauses at the 61st file for 1.5 s
                try:
                    seen = c.progress("op-1")
                except NotFound:
                    pass
                if seen and seen["files"] == 60:
                    break
                threading.Event().wait(0.02)
            assert seen and seen["phase"] == "restore: workspace" and not seen["finished"]
            assert seen["unit"] == "bytes" and seen["total"] == total
            assert seen["done"] == 60 * 4096
            t.join(30)
            assert done.is_set()
            last = c.progress("op-1")
            assert last["finished"] and last["done"] == total and last["files"] == 120
            with pytest.raises(AlreadyExists):  # an id names one operation
                c.restore(s.id, cp.id, operation_id="op-1")
            with pytest.raises(InvalidArgument):
                c.restore(s.id, cp.id, operation_id="not an id!")
            with pytest.raises(NotFound):
                c.progress("never-started")
    finally:
        d.stop()
