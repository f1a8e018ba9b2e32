"""Exclusions (issue 58, item 9): a ``.worldlineignore`` at the workspace root and
``session create --exclude PATTERN`` (gitignore syntax). Excluded paths are never
captured and a restore leaves them exactly as they are; a real daemon, files made by
the agent (uid 1000) where the agent controls them.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from worldline.client import InvalidArgument, NotFound, ResourceExhausted

from .conftest import DaemonProcess
from .fidelity import as_agent


def _as_found(path: Path) -> tuple:
    """What a restore must not change at ``path``: bytes, inode, mode and times."""
    st = os.stat(path, follow_symlinks=False)
    return path.read_bytes(), st.st_ino, st.st_mode, st.st_mtime_ns, st.st_ctime_ns


def test_excluded_paths_survive_a_restore_untouched_and_are_never_captured(
        client, agent_home):
    ws = agent_home / "proj" / "ws"
    as_agent("printf 'node_modules/\\n*.log\\n' > .worldlineignore"
             " && mkdir -p node_modules/pkg src && echo v1 > node_modules/pkg/index.js"
             " && echo one > src/a.py && echo l1 > debug.log", ws)
    s = client.create_session(str(ws))
    cp1 = s.checkpoint()
    as_agent("echo v2 > node_modules/pkg/index.js && echo l2 > debug.log"
             " && echo two > src/a.py && mkdir -p gone/node_modules && echo x > gone/f"
             " && echo dep > gone/node_modules/d.js", ws)
    cp2 = s.checkpoint()
    kept = ["node_modules/pkg/index.js", "debug.log", "gone/node_modules/d.js"]
    before = {p: _as_found(ws / p) for p in kept}

    result = s.restore(cp1.id)

    assert (ws / "src" / "a.py").read_text() == "one\n"
    assert {p: _as_found(ws / p) for p in kept} == before  # not even touched
    # a folder the checkpoint has not: emptied of all else, kept for what is excluded
    assert not (ws / "gone" / "f").exists()
    assert any(w.startswith("gone: kept") for w in result.warnings), result.warnings
    # never in a checkpoint: not in diff, not readable; the rules themselves are
    for cp in (cp1, cp2):
        for path in ("node_modules/pkg/index.js", "debug.log", "gone/node_modules/d.js"):
            with pytest.raises(NotFound):
                client.read_file(cp.id, path)
    d = client.diff(cp1.id, cp2.id)
    assert {"gone/f", "src/a.py"} <= set(d.added + d.modified)
    assert not [p for p in d.added + d.modified + d.deleted
                if "node_modules" in p or p.endswith(".log")]
    assert client.read_file(cp2.id, ".worldlineignore") == b"node_modules/\n*.log\n"


def test_exclude_from_the_cli_and_show_lists_both_sources(daemon, workspace):
    res = daemon.cli_json("session", "create", "--workspace", str(workspace),
                          "--exclude", "build/", "--exclude", "*.tmp")
    sid = res["id"]
    assert res["exclude"] == ["build/", "*.tmp"]
    (workspace / "build").mkdir()
    (workspace / "build" / "out.bin").write_bytes(b"\0" * 100)
    (workspace / "x.tmp").write_text("scratch\n")
    (workspace / "main.c").write_text("int main;\n")
    (workspace / ".worldlineignore").write_text("# caches\n.cache/\n")
    cp = daemon.cli_json("checkpoint", sid)
    assert daemon.cli("cat", cp["id"], "build/out.bin", check=False).returncode != 0
    assert daemon.cli("cat", cp["id"], "x.tmp", check=False).returncode != 0
    assert daemon.cli("cat", cp["id"], "main.c").stdout == "int main;\n"

    text = daemon.cli("session", "show", sid).stdout
    assert "excluded:" in text
    for line in ("build/  (--exclude)", "*.tmp  (--exclude)", ".cache/  (.worldlineignore)"):
        assert line in text, text
    shown = daemon.cli_json("session", "show", sid)
    assert (shown["exclude"], shown["ignore_file"]) == (["build/", "*.tmp"], [".cache/"])


@pytest.mark.parametrize("bad", ["", "a\nb", "x" * 2000])
def test_a_bad_exclude_pattern_is_refused_and_nothing_is_made(client, workspace, bad):
    with pytest.raises(InvalidArgument):
        client.create_session(str(workspace), exclude=[bad])
    assert client.list_sessions(workspace=str(workspace)) == []


def test_the_rules_a_capture_reads_decide_and_a_restore_obeys_todays(client, agent_home):
    """A changed .worldlineignore holds from the next capture on, in both directions,
    even for paths whose folder the tracker never watched (it was excluded); a restore
    obeys the rules on disk when it starts, whatever its target's were."""
    ws = agent_home / "proj" / "ws"
    as_agent("echo out/ > .worldlineignore && mkdir out && echo a > out/a"
             " && echo v1 > x.log", ws)
    s = client.create_session(str(ws))
    cp1 = s.checkpoint()
    with pytest.raises(NotFound):
        client.read_file(cp1.id, "out/a")
    as_agent("echo b > out/a && echo '*.log' > .worldlineignore && echo v2 > x.log", ws)
    cp2 = s.checkpoint()
    assert client.read_file(cp2.id, "out/a") == b"b\n"  # no longer excluded: captured
    with pytest.raises(NotFound):
        client.read_file(cp2.id, "x.log")  # newly excluded: left out
    assert client.read_file(cp1.id, "x.log") == b"v1\n"
    log_before = _as_found(ws / "x.log")

    out_before = _as_found(ws / "out" / "a")

    # today's rules exclude *.log: x.log stays v2; cp1's excluded out/: it cannot say
    # what out/a should be, so out/a stays too
    result = s.restore(cp1.id)

    assert _as_found(ws / "x.log") == log_before
    assert _as_found(ws / "out" / "a") == out_before
    assert "x.log" not in result.files_written and result.files_removed == []
    assert (ws / ".worldlineignore").read_text() == "out/\n"  # the rules came back too
    # the next checkpoint records what is there under the rules now on disk
    cp3 = s.checkpoint()
    assert client.read_file(cp3.id, "x.log") == b"v2\n"
    with pytest.raises(NotFound):
        client.read_file(cp3.id, "out/a")


def test_a_hostile_worldlineignore_is_ignored_with_a_warning(daemon, client, agent_home,
                                                              tmp_path):
    """A symlinked or oversized .worldlineignore is not obeyed (the capture takes
    everything, and says why in the daemon's log); rules that exclude everything, or
    name paths outside, let a restore touch nothing but the rules file."""
    ws = agent_home / "proj" / "ws"
    as_agent("echo secret.txt > ../rules && ln -s ../rules .worldlineignore"
             " && echo s > secret.txt", ws)
    s = client.create_session(str(ws))
    assert client.read_file(s.checkpoint().id, "secret.txt") == b"s\n"
    log = daemon.log.read_text()
    assert f"session {s.id} workspace: .worldlineignore ignored: it is a symlink" in log
    as_agent("rm .worldlineignore && yes secret.txt | head -c 70000 > .worldlineignore", ws)
    assert client.read_file(s.checkpoint().id, "secret.txt") == b"s\n"
    assert f"session {s.id} workspace: .worldlineignore ignored: larger than" in \
        daemon.log.read_text()

    outside = tmp_path / "canary.txt"
    outside.write_text("keep\n")
    as_agent("printf '*\\n../canary.txt\\n/../\\n' > .worldlineignore"
             " && echo changed > secret.txt && mkdir new && echo n > new/f", ws)
    everything = s.checkpoint()
    with pytest.raises(NotFound):
        client.read_file(everything.id, "secret.txt")
    found = {p: _as_found(ws / p) for p in ("secret.txt", "new/f")}
    s.restore(everything.id)
    first = min(s.log(), key=lambda cp: cp.seq)  # a symlink for rules, other contents
    s.restore(first.id)
    assert {p: _as_found(ws / p) for p in ("secret.txt", "new/f")} == found
    assert outside.read_text() == "keep\n"


def test_a_fork_leaves_excluded_paths_behind_and_keeps_the_patterns(client, workspace,
                                                                    tmp_path):
    (workspace / ".worldlineignore").write_text("node_modules/\n")
    (workspace / "node_modules").mkdir()
    (workspace / "node_modules" / "dep.js").write_text("dep\n")
    (workspace / "scratch.tmp").write_text("tmp\n")
    (workspace / "app.js").write_text("app\n")
    s = client.create_session(str(workspace), exclude=["*.tmp"])
    fork = client.fork(s.checkpoint().id, workspace=str(tmp_path / "fork"))
    there = tmp_path / "fork"
    assert sorted(os.listdir(there)) == [".worldlineignore", "app.js"]
    assert client.get_session(fork.id).exclude == ["*.tmp"]
    (there / "scratch.tmp").write_text("fork's\n")
    with pytest.raises(NotFound):
        client.read_file(fork.checkpoint().id, "scratch.tmp")


def _tree_of_files(root: Path, folders: int, per_folder: int) -> None:
    for i in range(folders):
        d = root / f"pkg{i}"
        d.mkdir(parents=True)
        for j in range(per_folder):
            (d / f"f{j}.js").write_bytes(b"module.exports = %d;\n" % j)


def test_an_excluded_folder_is_never_entered(tmp_path):
    """Its names do not count against --max-entries: the walk never lists them."""
    d = DaemonProcess(tmp_path / "root", extra=["--max-entries", "300"]).start()
    try:
        with d.client() as c:
            for name, exclude in (("plain", []), ("excluding", ["node_modules/"])):
                ws = tmp_path / name
                (ws / "src").mkdir(parents=True)
                (ws / "src" / "main.js").write_text("main\n")
                _tree_of_files(ws / "node_modules", 10, 100)
                if not exclude:
                    with pytest.raises(ResourceExhausted):
                        c.create_session(str(ws))
                    continue
                s = c.create_session(str(ws), exclude=exclude)
                _tree_of_files(ws / "node_modules" / "more", 5, 100)  # npm install
                cp = s.checkpoint()
                assert c.read_file(cp.id, "src/main.js") == b"main\n"
    finally:
        assert d.stop() == 0


def test_an_excluded_node_modules_costs_no_capture_time(client, tmp_path):
    """20,000 files under node_modules: the first capture (a full scan) and a
    checkpoint after the agent rewrote 2,000 of them, with and without the exclusion."""
    timings = {}
    for name in ("captured", "excluded", "absent"):
        ws = tmp_path / name
        (ws / "src").mkdir(parents=True)
        for i in range(50):
            (ws / "src" / f"m{i}.py").write_text(f"x = {i}\n")
        if name != "absent":
            _tree_of_files(ws / "node_modules", 200, 100)
        start = time.perf_counter()
        s = client.create_session(str(ws), exclude=["node_modules/"]
                                  if name == "excluded" else None)
        first = time.perf_counter() - start
        if name != "absent":
            for i in range(20):
                for j in range(100):
                    (ws / "node_modules" / f"pkg{i}" / f"f{j}.js").write_text("changed\n")
        (ws / "src" / "m0.py").write_text("x = -1\n")
        start = time.perf_counter()
        s.checkpoint()
        timings[name] = (first, time.perf_counter() - start)
    print("capture seconds (first full scan, checkpoint after 2,000 writes):",
          json.dumps({k: [round(t, 3) for t in v] for k, v in timings.items()}))
    assert timings["excluded"][0] < timings["captured"][0] / 3
    assert timings["excluded"][1] < timings["captured"][1] / 2
