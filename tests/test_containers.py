"""Container worlds against the real Docker engine: round trips of the writable
layer, restore after rm -rf, fork isolation, exported images, an unreachable engine,
a container removed behind the daemon's back, and a crash mid-restore."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from worldline.client import FailedPrecondition, Unavailable

from .conftest import DaemonProcess
from .services import UnixRelay

IMAGE = "worldline/busybox:latest"
pytestmark = pytest.mark.docker

# Everything but the mounts docker manages (/etc/hostname, hosts, resolv.conf) and the
# bind-mounted workspace: kind, mode, owner, link target or checksum of each path.
FS_STATE = r"""
find / -xdev \( -path /proc -o -path /sys -o -path /dev -o -path /workspace \
  -o -path /etc/hostname -o -path /etc/hosts -o -path /etc/resolv.conf \) -prune -o -print \
| sort | while read -r f; do
  if [ -L "$f" ]; then echo "L $f -> $(readlink "$f")";
  elif [ -d "$f" ]; then echo "D $f $(stat -c %a "$f")";
  else echo "F $f $(stat -c %a "$f") $(md5sum < "$f")"; fi
done
"""


def docker(*args: str, check: bool = True) -> str:
    res = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=120)
    if check and res.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)}: {res.stderr}")
    return res.stdout


def sh(container: str, script: str) -> str:
    return docker("exec", container, "sh", "-c", script)


def fs_state(container: str) -> str:
    return sh(container, FS_STATE)


@pytest.fixture(scope="module", autouse=True)
def engine():
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        pytest.fail("no Docker engine answers: run `make docker` (make test does)")
    if subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True).returncode:
        pytest.fail(f"the base image {IMAGE} is missing: run `make docker`")


def managed(client, session) -> str:
    return client.get_session(session.id).container


def test_layer_round_trip(client, workspace, containers):
    s = client.create_session(str(workspace), image=IMAGE)
    c = s.container
    containers.append(c)
    sh(c, "mkdir -p /data/sub/deeper && echo one > /data/sub/f && chmod 750 /data/sub"
          " && echo tool >> /etc/passwd && rm /bin/vi && rm -rf /usr/sbin"
          " && ln -s /data/sub/f /data/link && mkdir /data/empty && echo ws > /workspace/w")
    cp = s.checkpoint(label="layer")
    assert cp.container
    before = fs_state(c)
    # wreck it: change, delete and add, in the layer and below it
    sh(c, "echo changed > /data/sub/f; rm -rf /data/empty /etc 2>/dev/null; mkdir -p /etc;"
          " echo new > /etc/new && ln -s /nowhere /bin/vi && rm /bin/ls && mkdir /zzz")
    (workspace / "w").write_text("changed")
    s.checkpoint(label="wrecked")
    s.restore(cp.id)
    assert fs_state(c) == before
    assert (workspace / "w").read_text() == "ws\n"
    info = json.loads(docker("inspect", c))[0]
    assert info["State"]["Running"] and info["Name"] == f"/{c}"


def test_restore_after_rm_rf(client, workspace, containers):
    s = client.create_session(str(workspace), image=IMAGE)
    containers.append(s.container)
    sh(s.container, "mkdir -p /srv/app && echo v1 > /srv/app/main")
    cp = s.checkpoint()
    before = fs_state(s.container)
    sh(s.container, "rm -rf /srv /usr /bin/cat; rm -rf /etc 2>/dev/null; true")
    s.restore(cp.id)
    assert fs_state(s.container) == before
    assert sh(s.container, "cat /srv/app/main") == "v1\n"


def test_fork_isolation(client, workspace, tmp_path, containers):
    s = client.create_session(str(workspace), image=IMAGE)
    containers.append(s.container)
    sh(s.container, "mkdir /data && echo base > /data/f && echo ws > /workspace/shared")
    cp = s.checkpoint()
    f = s.fork(cp.id, workspace=str(tmp_path / "fork"))
    containers.append(f.container)
    assert f.container and f.container != s.container
    assert fs_state(f.container) == fs_state(s.container)
    sh(f.container, "echo fork > /data/f && echo forkws > /workspace/shared && touch /only-fork")
    sh(s.container, "echo parent > /data/g")
    assert sh(s.container, "cat /data/f") == "base\n"
    missing = sh(s.container, "ls /only-fork 2>&1 || true").strip()
    assert missing.endswith("No such file or directory")
    assert sh(f.container, "ls /data") == "f\n"
    assert (workspace / "shared").read_text() == "ws\n"
    assert (tmp_path / "fork" / "shared").read_text() == "forkws\n"
    labels = json.loads(docker("inspect", f.container))[0]["Config"]["Labels"]
    assert labels["io.worldline.session"] == f.id
    # a fork of the fork: still the base image and one layer
    ff = client.fork(f.checkpoint().id, workspace=str(tmp_path / "fork2"))
    containers.append(ff.container)
    assert sh(ff.container, "cat /data/f") == "fork\n"
    image = json.loads(docker("inspect", ff.container))[0]["Config"]["Image"]
    assert image == IMAGE


def test_export_image_once(client, workspace, containers):
    s = client.create_session(str(workspace), image=IMAGE)
    containers.append(s.container)
    sh(s.container, "mkdir /app && echo built > /app/out")
    cp = s.checkpoint(label="release")
    image_id, ref = client.export_image(cp.id)
    again, _ = client.export_image(cp.id)
    assert again == image_id
    try:
        out = docker("run", "--rm", ref, "cat", "/app/out")
        assert out == "built\n"
        labels = json.loads(docker("image", "inspect", ref))[0]["Config"]["Labels"]
        assert labels["io.worldline.checkpoint"] == cp.id
        assert not docker("ps", "-a", "--filter", f"name=worldline-export-{cp.id.lower()}", "-q")
    finally:
        docker("rmi", "-f", ref, check=False)


def test_attach_existing_container(client, workspace, containers):
    name = f"wl-attach-{os.getpid()}"
    docker("run", "-d", "--name", name, "-v", f"{workspace}:/w", IMAGE, "sleep", "100000")
    containers.append(name)
    s = client.create_session(str(workspace), container=name)
    assert s.container == name
    sh(name, "echo x > /tmp/attached")
    cp = s.checkpoint()
    sh(name, "rm /tmp/attached")
    s.restore(cp.id)
    assert sh(name, "cat /tmp/attached") == "x\n"


@pytest.mark.parametrize("first, heeds", [
    (["sleep", "100000"], False),              # no handler: the kernel drops SIGTERM
    (["sh"], False),                           # an interactive shell ignores it (-it below)
    (["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 0.2; done"], True),
    (["--init", "sleep", "100000"], True),     # tini waits for it in sigtimedwait
    (["--stop-signal", "USR1", "sh", "-c", "trap 'exit 0' USR1; while :; do sleep 0.2; done"],
     True),
    (["--stop-signal", "USR1", "sh", "-c", "trap 'exit 0' TERM; while :; do sleep 0.2; done"],
     False),
], ids=["sleep", "interactive-sh", "trap", "init", "usr1-trapped", "usr1-not-trapped"])
def test_which_first_processes_drop_their_stop_signal(containers, first, heeds):
    """stopping.ignores_stop_signal reads the kernel's rule off /proc: a PID 1 that
    neither catches nor blocks its stop signal never gets it."""
    import docker as sdk
    from worldline.daemon.capture.stopping import ignores_stop_signal
    name = f"wl-deaf-{os.getpid()}-{len(containers)}"
    opts = ["--init"] if first[0] == "--init" else []
    rest = first[len(opts):]
    if rest[0] == "--stop-signal":
        opts, rest = opts + rest[:2], rest[2:]
    docker("run", "-d", "-it", "--name", name, *opts, IMAGE, *rest)
    containers.append(name)
    api = sdk.APIClient()
    time.sleep(0.3)  # the trap is set
    for _ in range(5):  # the same answer whatever the process is doing at the moment
        assert ignores_stop_signal(api.inspect_container(name)) is not heeds
        time.sleep(0.05)
    assert not ignores_stop_signal({**api.inspect_container(name), "Id": "f" * 64})


def test_a_restore_does_not_wait_for_a_first_process_that_drops_the_stop_signal(
        client, tmp_path, containers):
    """A restore stops the container: a PID 1 such as `sleep` never gets SIGTERM, and
    `docker stop -t 5` waited 5 s for nothing before it killed it (every restore of
    such a sandbox took 5.4 s). It is killed at once now; a PID 1 that handles the
    signal is still given it, and the time to act on it."""
    outside = tmp_path / "outside"
    outside.mkdir()
    deaf, polite = f"wl-deaf-{os.getpid()}", f"wl-polite-{os.getpid()}"
    for name in (deaf, polite):
        (tmp_path / name).mkdir()
    docker("run", "-d", "--name", deaf, "-v", f"{tmp_path / deaf}:/w", IMAGE, "sleep", "100000")
    docker("run", "-d", "--name", polite, "-v", f"{tmp_path / polite}:/w", "-v", f"{outside}:/out",
           IMAGE, "sh", "-c", "trap 'sleep 1; echo bye > /out/bye; exit 0' TERM;"
           " while :; do sleep 0.2; done")
    containers += [deaf, polite]
    for name in (deaf, polite):
        s = client.create_session(str(tmp_path / name), container=name)
        sh(name, "echo one > /tmp/f")
        cp = s.checkpoint()
        sh(name, "echo two > /tmp/f")
        started = time.monotonic()
        s.restore(cp.id)
        took = time.monotonic() - started
        assert sh(name, "cat /tmp/f") == "one\n"
        info = json.loads(docker("inspect", name))[0]
        assert info["State"]["Running"]
        if name == deaf:
            assert took < 4.5, f"the restore waited {took:.1f} s for a stop signal it dropped"
            assert info["State"]["ExitCode"] in (0, 137)
        else:
            assert took >= 1.0 and (outside / "bye").read_text() == "bye\n"


def test_session_survives_its_container(client, workspace, tmp_path, containers):
    """0.3 froze a session whose container was removed (`docker rm -f`): checkpoint,
    restore and fork failed for good. Now the workspace goes on being checkpointed (the
    last container layer carried forward), and restore and fork make the container
    again from the spec recorded with the session, with its layer."""
    s = client.create_session(str(workspace), image=IMAGE)
    containers.append(s.container)
    sh(s.container, "mkdir -p /srv && echo kept > /srv/state")
    with_layer = s.checkpoint()
    docker("rm", "-f", s.container)
    (workspace / "after.txt").write_text("written after the container went\n")
    cp = s.checkpoint()
    assert cp.container == with_layer.container
    assert "after.txt" in client.diff(with_layer.id, cp.id).added
    fork = client.fork(cp.id, workspace=str(tmp_path / "fork"))
    containers.append(fork.container)
    assert sh(fork.container, "cat /srv/state").strip() == "kept"
    result = s.restore(with_layer.id)
    assert any("made again" in w for w in result.warnings)
    assert sh(s.container, "cat /srv/state").strip() == "kept"
    assert json.loads(docker("inspect", s.container))[0]["State"]["Running"]
    assert not (workspace / "after.txt").exists()
    s.checkpoint()  # and the remade container is captured as before


def test_unknown_container_is_refused(client, workspace):
    with pytest.raises(FailedPrecondition):
        client.create_session(str(workspace), container="no-such-container-worldline")


def test_engine_unreachable(tmp_path, containers):
    proxy = UnixRelay(tmp_path / "docker.sock", "/var/run/docker.sock")
    d = DaemonProcess(tmp_path / "root",
                      env={"DOCKER_HOST": f"unix://{tmp_path / 'docker.sock'}"}).start()
    ws = tmp_path / "ws"
    ws.mkdir()
    try:
        with d.client() as c:
            s = c.create_session(str(ws), image=IMAGE)
            containers.append(s.container)
            proxy.cut()  # the engine goes away
            with pytest.raises(Unavailable):
                s.checkpoint()
            assert wait_health(d, health_pb2.HealthCheckResponse.NOT_SERVING)
            c.list_sessions()  # the rest of the daemon keeps serving
            proxy.restore()
            assert wait_health(d, health_pb2.HealthCheckResponse.SERVING)
            s.checkpoint()
        # The engine's start events, followed throughout, were lost and taken up again
        # quietly: no traceback, and the daemon stops at once.
        assert "Traceback" not in d.log.read_text()
        assert d.stop() == 0
    finally:
        d.stop()
        proxy.close()


def wait_health(d: DaemonProcess, want: int, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(d.address) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        while time.monotonic() < deadline:
            status = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status
            if status == want:
                return True
            time.sleep(0.2)
    return False


def _killed_holding(tmp_path: Path, containers: list, call: str, point: str):
    """A daemon and its container session (/v2 written in the container after its last
    checkpoint), killed at ``point`` by a ``call`` ("checkpoint", or "restore" to the
    session's first checkpoint) with the container held; returned stopped, its faults
    disarmed."""
    ws = tmp_path / "ws"
    ws.mkdir()
    d = DaemonProcess(tmp_path / "root").start()
    with d.client() as c:
        s = c.create_session(str(ws), image=IMAGE)
        containers.append(s.container)
        first = s.checkpoint()
    d.stop()
    d.env["WORLDLINE_FAULTS"] = point
    d.start()
    with d.client() as c:
        sh(s.container, "echo v2 > /v2")
        with pytest.raises(Unavailable):  # killed with the container held
            c.checkpoint(s.id) if call == "checkpoint" else c.restore(s.id, first.id)
    assert d.proc.wait(10) == -9
    d.proc = None
    d.env.pop("WORLDLINE_FAULTS")
    return d, s


@pytest.mark.parametrize("call,held,point", [("checkpoint", "Paused", "capture.paused"),
                                             ("restore", "Running", "restore.stopped")])
def test_a_container_held_when_the_daemon_died_runs_again_at_start(tmp_path, containers,
                                                                  call, held, point):
    """A checkpoint pauses the container while it reads its layer; a restore stops it
    while it plans and writes. A daemon killed then (here: as the layer is read; before
    a restore's journal is written) must not leave the agent's sandbox frozen or
    stopped: its next start unpauses it, or starts it again."""
    d, s = _killed_holding(tmp_path, containers, call, point)
    state = json.loads(docker("inspect", s.container))[0]["State"]
    assert state[held] is (held == "Paused")
    d.start()
    try:
        state = json.loads(docker("inspect", s.container))[0]["State"]
        assert state["Running"] is True and state["Paused"] is False
        assert sh(s.container, "cat /v2").strip() == "v2"  # no restore had begun
        with d.client() as c:
            c.checkpoint(s.id)
        for kind in ("paused", "stopped"):
            assert not list((tmp_path / "root" / kind).iterdir())
    finally:
        d.stop()


@pytest.mark.parametrize("point", ["restore.between_files:2", "restore.before_rename:6",
                                   "restore.between_layers",
                                   "restore.before_commit"])
def test_crash_mid_restore_is_completed_at_start(tmp_path, containers, point):
    ws = tmp_path / "ws"
    ws.mkdir()
    for i in range(5):
        (ws / f"f{i}").write_text(f"v1 {i}")
    d = DaemonProcess(tmp_path / "root", env={"WORLDLINE_FAULTS": point}).start()
    with d.client() as c:
        s = c.create_session(str(ws), image=IMAGE)
        containers.append(s.container)
        sh(s.container, "mkdir /data && echo v1 > /data/f")
        cp = s.checkpoint()
        expected_layer = fs_state(s.container)
        for i in range(5):
            (ws / f"f{i}").write_text(f"v2 {i}")
        sh(s.container, "echo v2 > /data/f; rm -rf /usr /etc 2>/dev/null; true")
        s.checkpoint()
        with pytest.raises(Unavailable):
            s.restore(cp.id)  # the daemon dies mid-way
    assert d.proc.wait(10) == -9
    d.proc = None
    d.env.pop("WORLDLINE_FAULTS")
    d.start()
    with d.client() as c:
        assert [(f"f{i}", (ws / f"f{i}").read_text()) for i in range(5)] == \
            [(f"f{i}", f"v1 {i}") for i in range(5)]
        # running again, as it was when the restore began
        assert json.loads(docker("inspect", s.container))[0]["State"]["Running"] is True
        assert fs_state(s.container) == expected_layer
        log = c.log(s.id)
        assert log[-1].kind == "restore" and log[-1].restored_from == cp.id
        assert c.fsck()["ok"]
    d.stop()
    assert not list(Path(tmp_path / "root" / "journal").glob("*.json"))


def test_gc_removes_images_of_pruned_checkpoints(tmp_path, containers):
    d = DaemonProcess(tmp_path / "root", extra=["--gc-grace", "0"]).start()
    ws = tmp_path / "ws"
    ws.mkdir()
    try:
        with d.client() as c:
            s = c.create_session(str(ws), image=IMAGE)
            containers.append(s.container)
            sh(s.container, "echo one > /one")
            old = s.checkpoint(label="release 1")
            image_id, ref = c.export_image(old.id)
            sh(s.container, "echo two > /two")
            s.checkpoint()
            assert c.gc(keep_labelled=True)["images_removed"] == 0  # labelled: kept
            report = c.gc(keep_last=1)
            assert report["checkpoints_pruned"] >= 1 and report["images_removed"] == 1
            assert subprocess.run(["docker", "image", "inspect", image_id],
                                  capture_output=True).returncode != 0
    finally:
        d.stop()


@pytest.mark.parametrize("root_id", [None, b"", b"\xff../not an id\n"])
def test_daemons_sharing_an_engine_leave_each_other_alone(tmp_path, containers, root_id):
    """Regression: a daemon starting up removed every worldline container whose session
    it did not know, including those of another daemon on the same engine. And one
    whose data root's id is damaged (``root_id``: empty, or bytes that are no id) makes
    a new id and still removes nothing of another's: before 0.7.23 an empty id matched
    every root's containers, and the start removed them."""
    a = DaemonProcess(tmp_path / "a").start()
    ws = tmp_path / "ws"
    ws.mkdir()
    try:
        with a.client() as c:
            s = c.create_session(str(ws), image=IMAGE)
            containers.append(s.container)
        b = DaemonProcess(tmp_path / "b").start()  # its recovery sweeps its own orphans
        b.stop()
        if root_id is not None:
            (b.root / "root-id").write_bytes(root_id)
            b.start()
            b.stop()
            assert (b.root / "root-id.damaged").read_bytes() == root_id
            made = (b.root / "root-id").read_text()
            assert made != (a.root / "root-id").read_text() and len(made) == 26
            assert "root-id) is not an id" in b.log.read_text()
        assert json.loads(docker("inspect", s.container))[0]["State"]["Running"]
        with a.client() as c:
            c.checkpoint(s.id)
    finally:
        a.stop()


def test_a_copy_of_a_data_root_leaves_the_originals_containers_alone(tmp_path, containers):
    """An operator copies a data root (a backup, started to look at it) while the
    original goes on. The copy shared the original's id, which labels what a root makes
    in the engine: its start removed, as orphans, the containers of the sessions the
    original made after the copy (their sessions are not in the copy's store). A copy
    now takes an id of its own as it starts, says so, and removes nothing of the
    original's. The original keeps its id, and a root moved (nothing left where it was)
    keeps its own."""
    a = DaemonProcess(tmp_path / "a").start()
    a.stop()
    subprocess.run(["cp", "-a", str(a.root), str(tmp_path / "copy")], check=True)
    original_id = (a.root / "root-id").read_text()
    ws = tmp_path / "ws"
    ws.mkdir()
    a.start()
    try:
        with a.client() as c:
            s = c.create_session(str(ws), image=IMAGE)  # after the copy: not in its store
            containers.append(s.container)
        copy = DaemonProcess(tmp_path / "copy").start()
        copy.stop()
        assert "is a copy of the one at" in copy.log.read_text()
        copy_id = (copy.root / "root-id").read_text()
        assert copy_id != original_id and len(copy_id) == 26
        assert json.loads(docker("inspect", s.container))[0]["State"]["Running"]
        with a.client() as c:
            c.checkpoint(s.id)
    finally:
        a.stop()
    a.start()
    a.stop()
    assert (a.root / "root-id").read_text() == original_id
    os.rename(copy.root, tmp_path / "moved")
    moved = DaemonProcess(tmp_path / "moved").start()
    moved.stop()
    assert (moved.root / "root-id").read_text() == copy_id
    assert "is a copy" not in moved.log.read_text()
    assert json.loads(docker("inspect", s.container))[0]["State"]["Running"]


def test_a_copy_started_first_leaves_the_container_its_original_holds(tmp_path,
                                                                    containers):
    """A daemon is killed while a checkpoint has its session's container paused, and an
    operator copies the data root before the original starts again. The copy's start
    unpaused the container (its mark was copied too) while the original's daemon still
    held it. Now the copy drops the mark and leaves the container to the original,
    whose start unpauses it; the copy's session waits for an operator."""
    d, s = _killed_holding(tmp_path, containers, "checkpoint", "capture.paused")
    subprocess.run(["cp", "-a", str(d.root), str(tmp_path / "copy")], check=True)
    copy = DaemonProcess(tmp_path / "copy").start()
    try:
        assert json.loads(docker("inspect", s.container))[0]["State"]["Paused"] is True
        with copy.client() as c:
            assert "copy of the one at" in c.get_session(s.id).needs_attention
            with pytest.raises(FailedPrecondition):
                c.checkpoint(s.id)
        assert not list((copy.root / "paused").iterdir())
    finally:
        copy.stop()
    assert json.loads(docker("inspect", s.container))[0]["State"]["Paused"] is True
    d.start()
    try:
        state = json.loads(docker("inspect", s.container))[0]["State"]
        assert state["Running"] is True and state["Paused"] is False
        with d.client() as c:
            assert c.get_session(s.id).needs_attention is None
            c.checkpoint(s.id)
    finally:
        d.stop()


def _not_over(container: str, canary: Path) -> None:
    """The container does not run with the canary's folder as its workspace, and the
    canary is as it was."""
    if json.loads(docker("inspect", container))[0]["State"]["Running"]:
        assert "root only" not in sh(container, "cat /workspace/secret 2>/dev/null || true")
    assert (canary / "ws" / "secret").read_text() == "root only\n"
    assert sorted(os.listdir(canary / "ws")) == ["secret"]


def test_a_container_is_never_left_running_over_a_swapped_workspace(tmp_path, agent_home,
                                                                   containers):
    """The engine resolves a bind mount's source path each time it starts a container,
    following symlinks. The agent (uid 1000) owns the folders above its workspace and
    swaps one for a symlink to a folder holding a root-only secret; a restore (which
    stops and starts the container) is refused, and the container is stopped rather
    than started with the symlink's target as its /workspace. Before 0.7.23 the
    restore's end started it so: the secret was readable inside, and writable by the
    container's root. A start the daemon did not make (a restart policy, an operator's
    `docker start`) is stopped as it starts, with no call to the daemon: it watches the
    engine's start events (0.7.24; before, the container ran until the session's next
    checkpoint)."""
    from .fidelity import as_agent
    canary = tmp_path / "canary"
    (canary / "ws").mkdir(parents=True)
    (canary / "ws" / "secret").write_text("root only\n")
    os.chmod(canary / "ws" / "secret", 0o600)
    home = agent_home
    ws = home / "proj" / "ws"
    d = DaemonProcess(tmp_path / "root").start()
    try:
        with d.client() as c:
            s = c.create_session(str(ws), image=IMAGE)
            containers.append(s.container)
            as_agent("echo mine > a.txt", ws)
            cp = s.checkpoint()
            as_agent(f"mv proj proj.real && ln -s {canary} proj", home)
            with pytest.raises(FailedPrecondition):
                s.restore(cp.id)
            _not_over(s.container, canary)
            # Started again by someone else (a restart policy, an operator): stopped as it
            # starts.
            docker("start", s.container)
            deadline = time.monotonic() + 10
            while json.loads(docker("inspect", s.container))[0]["State"]["Running"]:
                assert time.monotonic() < deadline, "left running over the swapped workspace"
                time.sleep(0.05)
            assert "shows another folder than the session's workspace" in d.log.read_text()
            _not_over(s.container, canary)
        # Started while the daemon was down: stopped when it starts again (the watch looks
        # at every running container of its own when it connects to the engine).
        d.stop()
        docker("start", s.container)
        d.start()
        deadline = time.monotonic() + 10
        while json.loads(docker("inspect", s.container))[0]["State"]["Running"]:
            assert time.monotonic() < deadline, "left running over the swapped workspace"
            time.sleep(0.05)
        with d.client() as c:
            s = c.get_session(s.id)
            with pytest.raises(FailedPrecondition):
                s.checkpoint()
            as_agent("rm proj && mv proj.real proj", home)  # put back, the session goes on
            docker("start", s.container)
            s.checkpoint()
            assert sh(s.container, "cat /workspace/a.txt") == "mine\n"
    finally:
        d.stop()


def test_a_container_layer_filled_with_names_is_refused(tmp_path, workspace, containers):
    """--max-entries holds for a container's writable layer as for a workspace: names
    made inside by `nobody` past it make the checkpoint RESOURCE_EXHAUSTED naming the
    layer, record nothing, and a restore brings the layer back under the limit (each
    new folder within it: a look at the layer walks a new folder whole)."""
    from worldline.client import ResourceExhausted

    d = DaemonProcess(tmp_path / "root", extra=["--max-entries", "300"]).start()
    try:
        with d.client() as c:
            s = c.create_session(str(workspace), image=IMAGE)
            containers.append(s.container)
            docker("exec", "-u", "65534", s.container, "sh", "-c",
                   "mkdir /tmp/few && touch /tmp/few/a /tmp/few/b")
            cp = s.checkpoint()
            logged = [x.id for x in c.log(s.id)]
            docker("exec", "-u", "65534", s.container, "sh", "-c",
                   "for d in 1 2; do mkdir /tmp/many$d && cd /tmp/many$d && i=0;"
                   " while [ $i -lt 200 ]; do : > f$i; i=$((i+1)); done; done")
            with pytest.raises(ResourceExhausted) as err:
                s.checkpoint()
            assert "the container's writable layer holds" in err.value.message
            assert "--max-entries" in err.value.message
            assert [x.id for x in c.log(s.id)] == logged
            s.restore(cp.id, acknowledge_side_effects=True)
            assert sh(s.container, "ls /tmp; ls /tmp/few") == "few\na\nb\n"
            sh(s.container, "touch /tmp/few/c")
            assert s.checkpoint().id
    finally:
        d.stop()
