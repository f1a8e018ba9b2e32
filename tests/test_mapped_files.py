"""Writes through a shared memory mapping (daemon/capture/mappings.py).

inotify reports no write through ``mmap(MAP_SHARED)``, and once a page is writable its
writes leave the file's time as it was. The agent's program here (fixtures/mapwrite.c,
built static so that it runs in the busybox image too) maps a file and writes through
the mapping on command; it runs as uid 1000 on the host and as ``nobody`` in a
container.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from worldline.daemon.capture.mappings import DELETED, Mapped, layer_paths

from .fidelity import AGENT_UID, NOBODY
from .test_container_fidelity import upper
from .test_containers import IMAGE, docker

SOURCE = Path(__file__).parent / "fixtures" / "mapwrite.c"
SIZE = 8192  # two pages
RACY = 0.25  # seconds: past the stat cache's racy window (statcache.RACY_NS)


@pytest.fixture(scope="session")
def mapwrite() -> Path:
    """The program, in a folder uid 1000 can reach (pytest's own are root's alone)."""
    folder = Path(tempfile.mkdtemp(prefix="wl-mapwrite-"))
    os.chmod(folder, 0o755)
    binary = folder / "mapwrite"
    subprocess.run(["gcc", "-O2", "-static", "-o", str(binary), str(SOURCE)], check=True)
    yield binary
    shutil.rmtree(folder)


class Mapper:
    """A running mapwrite: ``do("w 0 text")`` returns once the program has done it."""

    def __init__(self, argv: list[str], **popen) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, **popen)
        self._answer()

    def _answer(self) -> None:
        line = self.proc.stdout.readline()
        assert line == "ok\n", f"mapwrite said {line!r}"

    def do(self, command: str) -> None:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        if command != "q":
            self._answer()
        else:
            assert self.proc.wait(timeout=30) == 0

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _content(*writes: tuple[int, str]) -> bytes:
    data = bytearray(SIZE)
    for offset, text in writes:
        data[offset:offset + len(text)] = text.encode()
    return bytes(data)


def test_a_file_closed_after_writing_is_read_again_whatever_its_stat_says(
        client, workspace, mapwrite):
    """A write through a page already writable leaves the file's time as it was: the
    checkpoint before it learnt the file's stat, and only the close of the file's last
    mapping tells of the write. Without reading a closed file again the checkpoint
    after the close kept the content of the one before."""
    os.chown(workspace, AGENT_UID, AGENT_UID)
    db = workspace / "db"
    m = Mapper([str(mapwrite), "db", str(SIZE)], user=AGENT_UID, group=AGENT_UID,
               extra_groups=[], cwd=workspace)
    try:
        s = client.create_session(str(workspace))
        start = s.checkpoint()
        m.do("w 0 first")  # the page becomes writable, and the file's time moves
        m.do("p 100 written")  # an event for the file: the next checkpoint reads it
        time.sleep(RACY)
        a = s.checkpoint()
        assert client.diff(start.id, a.id).modified == ["db"]
        m.do("w 8 second")  # the same page: no event, no new time
        m.do("c")
        m.do("u")  # the last close: IN_CLOSE_WRITE
        b = s.checkpoint()
        assert client.diff(a.id, b.id).modified == ["db"]
    finally:
        m.kill()
    db.write_bytes(b"overwritten")
    client.restore(s.id, b.id)
    assert db.read_bytes() == _content((0, "first"), (8, "second"), (100, "written"))
    client.restore(s.id, a.id)
    assert db.read_bytes() == _content((0, "first"), (100, "written"))


class _HeldBack:
    """A workspace layer on its own change monitor (no daemon), with a file ``db`` that
    uid 1000's mapwrite maps, whose stat the layer's head vouches for; the monitor's
    reader thread held back, as a busy daemon's is, so that only a capture's own
    barrier reads what is queued; MAX_CHANGES lowered to 50."""

    def __init__(self, ws: Path, monkeypatch, mapwrite: Path) -> None:
        from worldline.daemon.capture import tracker as tracker_mod
        from worldline.daemon.capture.layers import WORKSPACE, Layer
        from worldline.daemon.capture.snapshot import WorkspaceSnapshotter
        from worldline.daemon.capture.statcache import StatCache
        from worldline.daemon.capture.trees import TreeReader
        from worldline.daemon.storage.blobs import MemoryBlobStore

        monkeypatch.setattr(tracker_mod, "MAX_CHANGES", 50)
        monkeypatch.setattr(tracker_mod, "READER_DELAY", 2.0)
        (ws / "sub").mkdir()
        for i in range(60):
            (ws / "sub" / f"f{i}").write_text(str(i))
        for path in (ws, ws / "sub", *(ws / "sub").iterdir()):
            os.chown(path, AGENT_UID, AGENT_UID)
        self.ws = ws
        self.monitor = tracker_mod.ChangeMonitor()
        self.mapper = Mapper([str(mapwrite), "db", str(SIZE)], user=AGENT_UID,
                             group=AGENT_UID, extra_groups=[], cwd=ws)
        try:
            blobs = MemoryBlobStore()
            self.tracker = self.monitor.tracker(str(ws))
            self.snap = WorkspaceSnapshotter(str(ws), blobs, TreeReader(blobs),
                                             StatCache(None), self.tracker)
            self.layer = Layer(WORKSPACE, str(ws), self.snap, self.tracker)
            self.mapper.do("p 8191 z")  # both pages written: no hole, so a plain file
            self.mapper.do("w 0 first")  # the page becomes writable, the file's time moves
            time.sleep(RACY)
            self.head, _ = self.layer.capture(None)
            self.layer.committed(self.head)  # the stat cache vouches for db from now on
        except BaseException:
            self.close()
            raise

    def agent(self, script: str) -> None:
        subprocess.run(["sh", "-c", script], cwd=self.ws / "sub", user=AGENT_UID,
                       group=AGENT_UID, extra_groups=[], check=True)

    def captured(self):
        """The root tree of a capture, which must be a full scan."""
        capture, _ = self.layer.capture(self.head.root)
        assert capture.full
        return self.snap.trees.read(capture.root)

    def captured_db(self):
        return self.captured()["db"].ref

    def close(self) -> None:
        self.mapper.kill()
        self.monitor.close()


def test_a_close_just_before_a_full_scan_is_read_again(workspace, monkeypatch, mapwrite):
    """A full scan (after a flood of changes, or an overflow) trusts the stat cache as
    an incremental capture does, so it must take the closes still queued when it
    starts: until 0.7.37 it skipped the barrier, and a write through a page already
    writable, its file closed just before the checkpoint, waited for the next one."""
    from worldline.daemon.storage.blob_store import digest_of

    w = _HeldBack(workspace, monkeypatch, mapwrite)
    try:
        w.mapper.do("w 8 second")  # the same page: no event, no new time
        w.agent("chmod 600 f*")  # 60 changed paths, none closed: a full scan next
        assert w.monitor.barrier() and w.tracker.full_scan_next
        w.mapper.do("c")
        w.mapper.do("u")  # the last close, queued behind the held-back reader
        assert w.captured_db() == digest_of(
            _content((0, "first"), (8, "second"), (8191, "z")))
    finally:
        w.close()


def test_past_the_cap_of_closed_files_the_next_capture_trusts_no_stat(
        workspace, monkeypatch, mapwrite):
    """Past MAX_CHANGES files closed after writing between two captures the tracker
    keeps none of them (its memory stays bounded), so the next capture cannot know
    which stats to distrust: it reads every file. Until 0.7.37 any flood dropped the
    closes and the full scan after it kept the content the stat cache vouched for."""
    from worldline.daemon.capture.trees import SYMLINK
    from worldline.daemon.storage.blob_store import digest_of

    from .conftest import tree_state

    canary = workspace.parent / "canary"  # outside, open to the agent: reading every
    canary.mkdir()  # file must not mean following its links there
    (canary / "keep.txt").write_text("keep\n")
    os.chmod(canary, 0o777)
    before = tree_state(canary)
    w = _HeldBack(workspace, monkeypatch, mapwrite)
    try:
        w.mapper.do("w 8 second")
        w.mapper.do("c")
        w.mapper.do("u")  # closed: the first of many
        w.agent(f"ln -s {canary} out && ln -s {canary}/keep.txt outfile")
        w.agent("for i in $(seq 120); do echo $i > g$i; done")  # 120 more closed
        assert w.monitor.barrier()
        assert w.tracker.peek().distrust
        root = w.captured()
        assert root["db"].ref == digest_of(
            _content((0, "first"), (8, "second"), (8191, "z")))
        sub = w.snap.trees.read(root["sub"].ref)
        assert [(sub[n].kind, sub[n].ref) for n in ("out", "outfile")] == [
            (SYMLINK, str(canary)), (SYMLINK, f"{canary}/keep.txt")]
        assert tree_state(canary) == before
    finally:
        w.close()


@pytest.fixture
def sandbox(workspace, containers, mapwrite) -> str:
    """A container of the busybox image with the workspace at /workspace, and mapwrite
    in the workspace."""
    shutil.copy(mapwrite, workspace / "mapwrite")
    os.chmod(workspace / "mapwrite", 0o755)
    os.chmod(workspace, 0o777)
    name = f"wl-mmap-{os.urandom(3).hex()}"
    docker("create", "--init", "--name", name, "-v", f"{workspace}:/workspace", IMAGE,
           "sleep", "1000000")
    containers.append(name)
    docker("start", name)
    docker("exec", "-u", f"{NOBODY}:{NOBODY}", name, "mkdir", "-p", "/tmp/m")
    return name


def _in(container: str, path: str) -> Mapper:
    return Mapper(["docker", "exec", "-i", "-u", f"{NOBODY}:{NOBODY}", container,
                   "/workspace/mapwrite", path, str(SIZE)])


def _merged(container: str) -> str:
    return os.path.join(os.path.dirname(upper(container)), "merged")


@pytest.mark.docker
def test_a_containers_writes_through_a_mapping_are_captured_while_it_maps(
        fresh_daemon, workspace, sandbox):
    """Processes of the container map a file of its layer and one of the bind-mounted
    workspace, and write through the mappings between checkpoints, with no other trace:
    each checkpoint has the writes (before 0.7.21 none had, until the mappings ended).
    Nor does the stat cache learn a mapped file: a daemon stopped while the container
    writes on and its programs end (their closes unseen) still finds the last writes."""
    client = fresh_daemon.start().client()
    mappers = [_in(sandbox, "/workspace/wdb"), _in(sandbox, "/tmp/m/cdb")]
    try:
        for m in mappers:
            m.do("c")  # the mapping alone keeps the file open
        s = client.create_session(str(workspace), container=sandbox)
        start = s.checkpoint()
        time.sleep(RACY)
        for m in mappers:
            m.do("w 0 hello")
        a = s.checkpoint()
        changed = client.diff(start.id, a.id)
        assert (changed.modified, changed.container.modified) == (["wdb"], ["tmp/m/cdb"])
        for m in mappers:
            m.do("w 8 world")  # the same page: not even the time moves
        time.sleep(RACY)  # b could learn the files' stat, were they not mapped
        b = s.checkpoint()
        changed = client.diff(a.id, b.id)
        assert (changed.modified, changed.container.modified) == (["wdb"], ["tmp/m/cdb"])
        for m in mappers:
            m.do("w 16 again")
        client.close()
        assert fresh_daemon.stop() == 0
    finally:
        for m in mappers:
            m.kill()
    client = fresh_daemon.start().client()
    try:
        c = client.checkpoint(s.id)
        changed = client.diff(b.id, c.id)
        assert (changed.modified, changed.container.modified) == (["wdb"], ["tmp/m/cdb"])
        cdb = lambda: Path(_merged(sandbox), "tmp/m/cdb").read_bytes()  # noqa: E731
        for cp, writes in ((a, [(0, "hello")]), (b, [(0, "hello"), (8, "world")]),
                           (c, [(0, "hello"), (8, "world"), (16, "again")])):
            client.restore(s.id, cp.id)
            assert (workspace / "wdb").read_bytes() == cdb() == _content(*writes), cp.id
    finally:
        client.close()


def test_only_the_worlds_files_are_taken_from_the_mappings():
    """What a container's processes map is matched to a layer by device and by the
    folder the workspace is mounted at; anything else mapped is outside the world."""
    view, disk, shm = os.makedev(0, 51), os.makedev(254, 0), os.makedev(0, 27)
    upper_dir = "/var/lib/docker/overlay2/abc/diff"
    mapped = [Mapped(view, "/tmp/m/cdb"), Mapped(disk, "/workspace/src/wdb"),
              Mapped(shm, "/dev/shm/segment"), Mapped(disk, "/elsewhere/file"),
              Mapped(disk, "/workspace"), Mapped(view, "/a/../../etc/passwd"),
              Mapped(view, "/gone" + DELETED),
              Mapped(disk, upper_dir + "/usr/old-kernel")]
    work, box = layer_paths(mapped, view, upper_dir, disk, ["/workspace/"])
    assert work == {"src/wdb"}
    assert box == {"tmp/m/cdb", "gone" + DELETED, "gone", "usr/old-kernel"}
