"""Every write of a restore or fork acts on what was verified (issue 57): the daemon is
held at each named point between what it checked and what it writes (faults.py,
``name~``), the agent (uid 1000) swaps, links, renames or chmods exactly there, and
the daemon goes on. Root's files and its canary folder must come out untouched, nothing
may gain a privilege, and the operation either completes saying what it left alone
(its warnings) or fails with a clear status: never a traceback, never a crash.

The random racer of test_hostile.py stays as a second line."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import grpc
import pytest

from .conftest import DaemonProcess
from .fidelity import AGENT_UID, NOBODY, differences, fingerprint

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching uids needs root")

# The points a restore or fork passes between a check and a write, each with a path
RESTORE_POINTS = (
    "restore.meta_in_place",
    "restore.before_folder",
    "restore.folder_made",
    "restore.special_made",
    "restore.before_rename",
    "restore.before_remove",
    "restore.before_link",
    "restore.before_retouch",
)
FORK_POINTS = ("fork.checked", "restore.folder_made", "restore.special_made",
               "restore.before_rename", "restore.before_link", "restore.before_retouch")
# What the agent does at the point, to the path at stake: a root-owned 0600 file
# renamed in; a symlink to the canary (folder, or its secret); a root file with a
# second name (a hard link of root's: protected_hardlinks keeps the agent from making
# one itself); a folder of root's from beside the path (moving a folder to another
# parent needs write permission on it); a folder of its own; a chmod.
SWAPS = ("root_file", "symlink", "hard_link", "root_folder", "folder", "chmod")
POINTS = RESTORE_POINTS + ("fork.checked",)
ALLOWED = ("FAILED_PRECONDITION", "ABORTED", "PERMISSION_DENIED", "NOT_FOUND")
# The checkpoint the restores go back to, and the layer as the agent left it: every
# step of a restore has work (a file given its time in place, a folder entered, a
# folder and a FIFO and a symlink made, a file written, two removed, a hard link made
# again in a folder whose time is then set again).
TARGET = ("mkdir -p d hd newdir && echo mine > a.txt && echo target > f.txt"
          " && echo x > d/x.txt && echo n > newdir/n.txt && mkfifo fifo && ln -s a.txt ln"
          " && echo h > h1 && ln h1 hd/h2")
DRIFTED = ("mkdir -p d hd extradir && echo mine > a.txt && echo changed > f.txt"
           " && echo y > d/x.txt && echo h > h1 && echo h > hd/h2 && echo e > extradir/e.txt"
           " && echo gone > extra.txt")
SECRET = b"root's own, 0600\n"


class Place:
    """base/ (0711): the agent's home (uid 1000) with its workspace and a stash of
    root's files it may move (root put them in the agent's folder), root's canary and
    every root file the agent is handed is kept open by the test, which checks it by
    its descriptor (a second name would give it two links, which the old code refused
    to change in place: the attack's file has one)."""

    def __init__(self, base: Path, daemon: DaemonProcess, pauses: Path) -> None:
        self.base, self.daemon, self.pauses = base, daemon, pauses
        self.home = base / "agent"
        self.ws = self.home / "ws"
        self.stash = self.home / "stash"
        self.canary = base / "canary"
        self.keep = base / "keep"
        self.kept: list[int] = []
        self.n = 0

    def root_file(self) -> Path:
        """A root-owned 0600 file in the agent's stash, kept also in keep/."""
        self.n += 1
        f = self.stash / f"root{self.n}"
        f.write_bytes(SECRET)
        os.chmod(f, 0o600)
        self.kept.append(os.open(f, os.O_RDONLY))
        return f

    def linked_root_file(self) -> Path:
        """A root-owned 0600 file in the stash with a second name in root's keep/."""
        f = self.root_file()
        os.link(f, self.keep / f.name)
        return f

    def root_folder(self, beside: Path) -> Path | None:
        """A root-owned 0755 folder holding a root 0600 file (both kept), made by root
        in the agent's folder ``beside`` a path (a folder of root's can only be renamed
        within its own parent); None where the agent cannot write anyway."""
        if beside.lstat().st_uid != AGENT_UID:
            return None
        self.n += 1
        d = beside / f"rootdir{self.n}"
        d.mkdir(mode=0o755)
        os.chmod(d, 0o755)
        f = d / "inside"
        f.write_bytes(SECRET)
        os.chmod(f, 0o600)
        self.kept.append(os.open(f, os.O_RDONLY))
        self.kept.append(os.open(d, os.O_RDONLY | os.O_DIRECTORY))
        return d

    def swap(self, kind: str, target: Path) -> bool:
        """Do ``kind`` to ``target`` as the agent; whether it could."""
        is_dir = target.is_dir() and not target.is_symlink()
        if kind == "root_folder":
            d = self.root_folder(target.parent)
            return d is not None and as_agent("sh", "-c", f'rm -rf -- "{target}" && mv -T --'
                                              f' "{d}" "{target}"').returncode == 0
        clear = f'rm -rf -- "{target}" && '
        script = {
            "root_file": clear + f'mv -f -- "{self.root_file()}" "{target}"',
            "symlink": clear + f'ln -s "{self.canary if is_dir else self.canary / "secret"}"'
                               f' "{target}"',
            "hard_link": clear + f'mv -f -- "{self.linked_root_file()}" "{target}"',
            "folder": clear + f'mkdir "{target}" && echo planted > "{target}/planted"',
            "chmod": f'chmod 0777 -- "{target}"',
        }[kind]
        return as_agent("sh", "-c", script).returncode == 0

    def check_root_files(self, since: int = 0) -> None:
        """Every root file handed to the agent (since the ``since``-th) is as root made
        it: owner, mode, content; the folders too; nothing below the agent's home is
        setuid or setgid, nor root's but what root handed it."""
        ours = {(st.st_dev, st.st_ino) for st in map(os.fstat, self.kept)}
        for fd in self.kept[since:]:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 0, 0o755)
            else:
                assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 0, 0o600)
                assert os.pread(fd, 100, 0) == SECRET
        for p in _below(self.home):
            st = p.lstat()
            if not stat.S_ISLNK(st.st_mode):
                assert not st.st_mode & (stat.S_ISUID | stat.S_ISGID), p
            if st.st_uid == 0:  # root's own in the agent's home: only what it was handed
                assert (st.st_dev, st.st_ino) in ours, p

    def reset(self, script: str) -> None:
        """The workspace emptied (as root: what the agent moved in goes too), then made
        by the agent's ``script``."""
        for p in self.ws.iterdir():
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
        assert as_agent("sh", "-ec", f"cd {self.ws} && {script}").returncode == 0


def _below(top: Path):
    for dirpath, dirs, files in os.walk(top):
        for name in dirs + files:
            yield Path(dirpath) / name


def as_agent(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(["setpriv", f"--reuid={AGENT_UID}", f"--regid={AGENT_UID}",
                           "--clear-groups", *argv], capture_output=True, text=True,
                          timeout=30)


@pytest.fixture(scope="module")
def place():
    base = Path(tempfile.mkdtemp(prefix="wl-windows-"))
    os.chmod(base, 0o711)
    pauses = base / "pauses"
    pauses.mkdir(mode=0o700)
    (base / "keep").mkdir(mode=0o700)
    canary = base / "canary"
    canary.mkdir(mode=0o700)
    (canary / "secret").write_bytes(b"the canary\n")
    os.chmod(canary / "secret", 0o600)
    home = base / "agent"
    for p in (home, home / "ws", home / "stash"):
        p.mkdir()
        os.chown(p, AGENT_UID, AGENT_UID)
    faults = ",".join(f"{p}~" for p in POINTS)
    # forks copied (not overlay views) so that they write through the same points
    d = DaemonProcess(base / "root", extra=["--allow-uid", str(AGENT_UID), "--copy-forks"],
                      env={"WORLDLINE_FAULTS": faults, "WORLDLINE_PAUSE_DIR": str(pauses),
                           "WORLDLINE_PAUSE_TIMEOUT": "20"}).start()
    before = fingerprint(canary)
    try:
        yield Place(base, d, pauses)
        assert differences(before, fingerprint(canary)) == []
        assert d.proc.poll() is None, "the daemon died"
    finally:
        d.stop()
        shutil.rmtree(base, ignore_errors=True)


def held(place: Place, point: str, operation, swap) -> tuple[object, str]:
    """Run ``operation()`` in a thread with ``point`` held once; when the daemon is
    there, ``swap(path)`` (the path at stake, as the point says), then go on. What the
    operation returned (or its gRPC status code), and the path."""
    hold = place.pauses / f"{point}.hold"
    reached = place.pauses / f"{point}.reached"
    go = place.pauses / f"{point}.go"
    hold.touch()
    out: dict = {}

    def run() -> None:
        try:
            out["result"] = operation()
        except grpc.RpcError as exc:
            out["result"] = exc.code()
        except Exception as exc:  # noqa: BLE001 -- the client's errors carry their code
            out["result"] = getattr(exc, "code", type(exc).__name__)
    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 20
    while not reached.exists() and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.002)
    assert reached.exists(), f"{point} was never reached: {out}"
    path = reached.read_text()
    try:
        swap(path)
    finally:
        go.touch()
        thread.join(30)
        while go.exists():
            time.sleep(0.002)
    assert not thread.is_alive()
    hold.unlink(missing_ok=True)
    return out["result"], path


@pytest.fixture(scope="module")
def world(place):
    """The operator's session over the agent's workspace, and its checkpoint TARGET."""
    place.reset(TARGET)
    with place.daemon.client() as c:
        s = c.create_session(str(place.ws))
        yield c, s, s.checkpoint()


def test_finding_1_a_metadata_only_restore_never_chowns_a_root_file(place, world):
    """Finding 1 of issue 57, reproduced at its window: the restore gives an unchanged
    file back its time in place; held just before, the agent renames a root-owned 0600
    file onto it. 0.7.38 chowned it to uid 1000, mode 0644."""
    c, s, target = world  # the operator restores the agent's folder
    place.reset(TARGET)
    assert as_agent("touch", "-d", "2001-01-01", str(place.ws / "a.txt")).returncode == 0
    since = len(place.kept)
    secret = place.root_file()

    def swap(path: str) -> None:
        assert path == "a.txt"
        assert as_agent("mv", "-f", str(secret), str(place.ws / path)).returncode == 0
    result, _ = held(place, "restore.meta_in_place", lambda: c.restore(s.id, target.id),
                     swap)
    place.check_root_files(since)
    assert not isinstance(result, str), result
    assert any(w.startswith("a.txt: changed") for w in result.warnings), result.warnings
    assert (place.ws / "a.txt").lstat().st_uid == 0  # left as it is, root's
    (event,) = [e for e in c.audit(s.id, kind="restore")][-1:]
    assert event.detail["left_alone"] == ["a.txt"]  # and the audit log says so


def _judge(place: Place, since: int, result, swapped: bool, kind: str, path: str) -> None:
    place.check_root_files(since)
    assert place.daemon.proc.poll() is None, "the daemon died"
    if isinstance(result, str):
        assert result in ALLOWED, result  # a clear status, never INTERNAL or UNKNOWN
        return
    assert not isinstance(result, grpc.StatusCode), result
    # Its own folder may take the inode number the one it removed had (ext4 reuses
    # them at once): the same type, owner and inode, nothing of anyone else's, and
    # written as the plan's; a chmod changes no identity.
    if swapped and kind not in ("folder", "chmod") and path:
        top = path.split("/")[0]
        assert any(w.startswith((path, top)) for w in result.warnings), result.warnings


@pytest.mark.parametrize("kind", SWAPS)
@pytest.mark.parametrize("point", RESTORE_POINTS)
def test_a_restore_held_at_each_point_while_the_agent_swaps(place, world, point, kind):
    c, s, target = world
    place.reset(DRIFTED)
    since = len(place.kept)
    done: dict = {}

    def swap(path: str) -> None:
        done["swapped"] = place.swap(kind, place.ws / path)
    result, path = held(place, point, lambda: c.restore(s.id, target.id), swap)
    _judge(place, since, result, done["swapped"], kind, path)


@pytest.mark.parametrize("kind", SWAPS)
@pytest.mark.parametrize("point", FORK_POINTS)
def test_a_fork_held_at_each_point_while_the_agent_swaps(place, world, point, kind):
    c, s, target = world
    place.n += 1
    fork = place.home / f"fork{place.n}"
    since = len(place.kept)
    done: dict = {}

    def swap(path: str) -> None:
        done["swapped"] = place.swap(kind, fork / path if path else fork)
    result, path = held(place, point, lambda: c.fork(target.id, str(fork)), swap)
    _judge(place, since, result, False, kind, path)


# As nobody, through descriptors root opened: the layer's folders on the host are the
# engine's (0710 and 0700), which the agent's processes in the container never cross.
_AS_NOBODY = r"""
import os, sys
src, dst = (os.open(os.path.dirname(p), os.O_RDONLY | os.O_DIRECTORY) for p in sys.argv[1:3])
os.setgroups([])
os.setresgid(65534, 65534, 65534)
os.setresuid(65534, 65534, 65534)
os.rename(os.path.basename(sys.argv[1]), os.path.basename(sys.argv[2]), src_dir_fd=src,
          dst_dir_fd=dst)
"""


@pytest.mark.docker
def test_a_container_layers_metadata_only_window_as_nobody(place):
    """The same window in a container's writable layer, whose agent is ``nobody``: a
    file of nobody's gets only its time back; held there, nobody renames root's 0600
    file of the same folder onto it. Root's file keeps its owner and mode."""
    from .test_containers import IMAGE, docker
    if subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True).returncode:
        pytest.fail(f"the base image {IMAGE} is missing: run `make docker`")
    ws = place.home / "box"
    ws.mkdir(exist_ok=True)
    with place.daemon.client() as c:
        s = c.create_session(str(ws), image=IMAGE)
        try:
            docker("exec", s.container, "sh", "-ec",
                   "mkdir /data && chown 65534:65534 /data && echo secret > /data/root.key"
                   " && chmod 600 /data/root.key")
            docker("exec", "-u", f"{NOBODY}:{NOBODY}", s.container, "sh", "-ec",
                   "echo mine > /data/a.txt")
            cp = s.checkpoint()
            docker("exec", "-u", f"{NOBODY}:{NOBODY}", s.container, "touch", "-d",
                   "2001-01-01", "/data/a.txt")
            top = json.loads(docker("inspect", s.container))[0]["GraphDriver"]["Data"][
                "UpperDir"]
            key = os.open(os.path.join(top, "data", "root.key"), os.O_RDONLY)

            def swap(path: str) -> None:
                assert path == "data/a.txt"
                done = subprocess.run(
                    ["/usr/bin/python3", "-c", _AS_NOBODY, os.path.join(top, "data/root.key"),
                     os.path.join(top, path)], capture_output=True, text=True, timeout=30)
                assert done.returncode == 0, done.stderr
            result, _ = held(place, "restore.meta_in_place", lambda: c.restore(s.id, cp.id),
                             swap)
            st = os.fstat(key)
            assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 0, 0o600)
            assert os.pread(key, 100, 0) == b"secret\n"
            os.close(key)
            assert not isinstance(result, str), result
            assert any(w.startswith("container: data/a.txt: changed")
                       for w in result.warnings), result.warnings
        finally:
            docker("rm", "-f", s.container, check=False)
