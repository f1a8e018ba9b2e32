"""The parts of issue 57's probe that did not reach (item 5), each as the agent would do
it: uid 1000 on the host, with a canary folder of root's that must stay untouched.

- A checkpoint held between a changed file's stat and its open, and between its open
  and its read (faults.py, ``name~``), while the agent swaps the name for a FIFO, a
  symlink to root's file, root's own file, a hard link of root's, or a folder; and held
  with its turn taken while the agent swaps the whole workspace. The capture never
  blocks on a FIFO, never follows a symlink out, never records root's file as the
  agent's (an agent user's session refuses it: PERMISSION_DENIED).
- A take-over held where it checked the new workspace and where it wrote its staging
  folder, while the agent (who writes the parent) puts its own folder, a symlink or a
  file there: refused (FAILED_PRECONDITION), nothing of another's put in place.
- Hard-link groups reaching into another session's workspace: what the agent can link
  (``/proc/sys/fs/protected_hardlinks``), and that a restore of either session never
  writes, chmods or chowns through the link into the other workspace.
- A disk filled by the agent: its workspace's file system, and (it cannot reach it)
  the data root's. Other sessions, the metadata and every acknowledged checkpoint keep
  working; the full session's restore is RESOURCE_EXHAUSTED.
- Tens of thousands of empty names in one folder, names of 255 bytes, paths past
  PATH_MAX and deep nesting: checkpoint and restore within --max-entries and bounded
  memory, clear errors past the limits, other sessions served meanwhile.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest
from worldline.client import Client
from worldline.client.errors import FailedPrecondition, ResourceExhausted

from .conftest import DaemonProcess, unmount_below
from .fidelity import AGENT_UID, as_agent, differences, fingerprint, in_fresh_child_as
from .test_restore_windows import SECRET, Place, held

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching uids needs root")

CANARY = b"the canary\n"
ALLOWED = ("FAILED_PRECONDITION", "ABORTED", "PERMISSION_DENIED", "NOT_FOUND")
CAPTURE_POINTS = ("capture.before_open", "capture.file_opened")
# What the agent puts at the name the capture listed: its own FIFO (opened, a reader
# blocks until a writer comes), a symlink to root's canary secret, root's 0600 file
# from its stash, root's file with a second name, its own folder.
CAPTURE_SWAPS = ("fifo", "symlink", "root_file", "hard_link", "folder")


def _swap(place: Place, kind: str, target: Path) -> bool:
    if kind == "fifo":
        return subprocess.run(
            ["setpriv", f"--reuid={AGENT_UID}", f"--regid={AGENT_UID}", "--clear-groups",
             "sh", "-c", f'rm -rf -- "{target}" && mkfifo "{target}"'],
            capture_output=True, timeout=30).returncode == 0
    return place.swap(kind, target)


def _agents(*folders: Path, uid: int = AGENT_UID) -> None:
    """Each of ``folders`` made (in order: parents first) and given to ``uid``."""
    for p in folders:
        p.mkdir()
        os.chown(p, uid, uid)


def _base() -> Path:
    """base/ (0711): pauses/, keep/ and canary/ of root's (the canary's secret 0600), the
    agent's home/ with ws/ and stash/."""
    base = Path(tempfile.mkdtemp(prefix="wl-reach-"))
    os.chmod(base, 0o711)
    for name in ("pauses", "keep", "canary", "forks"):
        (base / name).mkdir(mode=0o700)
    (base / "canary" / "secret").write_bytes(CANARY)
    os.chmod(base / "canary" / "secret", 0o600)
    home = base / "agent"
    _agents(home, *(home / name for name in ("ws", "stash", "mine", "stash2")))
    return base


@pytest.fixture
def reachable():
    """A folder (0711) below which the agent reaches the daemon's socket (pytest's
    tmp_path is below a folder of root's, 0700)."""
    base = Path(tempfile.mkdtemp(prefix="wl-reach-"))
    os.chmod(base, 0o711)
    yield base
    unmount_below(base)
    shutil.rmtree(base, ignore_errors=True)


def _agent_session(address: str, workspace: str) -> str:
    """As the agent user: a session of its own over ``workspace``; its id."""
    with Client(address, transport="frames") as c:
        return c.create_session(workspace).id


def _agent_checkpoint(address: str, session_id: str) -> str:
    """As the agent user: a checkpoint of its session; "ok" or the error's name."""
    with Client(address, transport="frames") as c:
        c.checkpoint(session_id)
        return "ok"


def _agent_restore(address: str, session_id: str, checkpoint_id: str) -> str:
    with Client(address, transport="frames") as c:
        c.restore(session_id, checkpoint_id, acknowledge_side_effects=True)
        return "ok"


@pytest.fixture(scope="module")
def capture_place():
    base = _base()
    faults = ",".join(f"{p}~" for p in (*CAPTURE_POINTS, "checkpoint.admitted"))
    d = DaemonProcess(base / "root", extra=["--allow-uid", str(AGENT_UID), "--copy-forks"],
                      env={"WORLDLINE_FAULTS": faults,
                           "WORLDLINE_PAUSE_DIR": str(base / "pauses"),
                           "WORLDLINE_PAUSE_TIMEOUT": "20"}).start()
    place = Place(base, d, base / "pauses")
    mine = Place(base, d, base / "pauses")  # the agent user's own session's workspace
    mine.ws, mine.stash, mine.n = base / "agent" / "mine", base / "agent" / "stash2", 10_000
    mine.kept = place.kept  # one list: each checks every root file handed to the agent
    before = fingerprint(place.canary)
    try:
        place.reset("echo one > a.txt && echo two > b.txt")
        mine.reset("echo one > a.txt && echo two > b.txt")
        with d.client() as c:
            s = c.create_session(str(place.ws))
            theirs = in_fresh_child_as(AGENT_UID, _agent_session, d.address, str(mine.ws))
            yield place, mine, c, s, theirs
        assert differences(before, fingerprint(place.canary)) == []
        assert d.proc.poll() is None, "the daemon died"
    finally:
        d.stop()
        shutil.rmtree(base, ignore_errors=True)


def _outcome(call):
    """What ``call()`` came to: its result, or its error's gRPC code name."""
    try:
        return call()
    except Exception as exc:  # noqa: BLE001 -- the client's errors carry their code
        return getattr(exc, "code", type(exc).__name__)


@pytest.mark.parametrize("kind", CAPTURE_SWAPS)
@pytest.mark.parametrize("point", CAPTURE_POINTS)
def test_a_checkpoint_held_at_each_point_while_the_agent_swaps(capture_place, point, kind):
    """The operator's checkpoint of the agent's folder: whatever the agent swaps in
    where the capture stopped, it completes (a FIFO never blocks it) or fails with a
    clear status, and what it recorded is what was there by identity: root's file
    only ever as root's (owner 0, mode 0600), never the canary read through a symlink,
    never root's content under the agent's name."""
    place, _, c, s, _ = capture_place
    place.reset("echo one > a.txt")
    time.sleep(0.2)  # past the stat cache's racy window: only a.txt is read next
    s.checkpoint()
    since = len(place.kept)
    assert as_agent("echo changed > a.txt", place.ws).returncode == 0
    done: dict = {}

    def swap(path: str) -> None:
        assert path == "a.txt", path
        done["swapped"] = _swap(place, kind, place.ws / path)
    result, _ = held(place, point, lambda: _outcome(s.checkpoint), swap)
    assert done["swapped"]
    place.check_root_files(since)
    if isinstance(result, str):
        assert result in ALLOWED, result
        return
    place.n += 1
    fork = place.base / "forks" / f"f{place.n}"
    c.fork(result.id, str(fork))
    for p in fork.rglob("*"):
        st = p.lstat()
        if not stat.S_ISREG(st.st_mode):
            continue
        data = p.read_bytes()
        assert data != CANARY, p  # never read through a symlink
        if data == SECRET:  # root's own file, recorded as root's
            assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o600), p
        elif p.name == "a.txt":
            assert (data, st.st_uid) == (b"changed\n", AGENT_UID), p


@pytest.mark.parametrize("kind", ["file", "fifo", "folder"])
def test_a_symlink_swapped_before_its_target_is_read(capture_place, kind):
    """A changed symlink's target is read by its name after its stat; held there, the
    agent puts a file, a FIFO or a folder of its own in its place. Before, readlink's
    EINVAL failed the checkpoint (an internal error); now the name is left to the next
    checkpoint (its event brings it), which records what is there."""
    place, _, c, s, _ = capture_place
    place.reset("echo one > a.txt && ln -s a.txt ln")
    time.sleep(0.2)  # past the stat cache's racy window: only ln is read next
    s.checkpoint()
    as_agent("ln -sfn b.txt ln", place.ws)
    make = {"file": "echo file > ln", "fifo": "mkfifo ln", "folder": "mkdir ln"}[kind]

    def swap(path: str) -> None:
        assert path == "ln", path
        as_agent(f"rm ln && {make}", place.ws)
    result, _ = held(place, "capture.before_open", lambda: _outcome(s.checkpoint), swap)
    assert not isinstance(result, str), result
    cp = s.checkpoint()
    added = [p.rstrip("/") for p in c.diff(result.id, cp.id).added]
    assert added == ["ln"], added  # what is there now, recorded


@pytest.mark.parametrize("kind", CAPTURE_SWAPS)
def test_an_agent_users_checkpoint_never_takes_root_files_swapped_in(capture_place, kind):
    """The agent user's own session (its checkpoint asked for as uid 1000, through the
    gateway), held before the open: root's file swapped in, by rename or as a second
    name of root's, is PERMISSION_DENIED with nothing recorded; its own FIFO or folder,
    or a symlink, is no harm."""
    place, mine, c, _, theirs = capture_place
    mine.reset("echo one > a.txt")
    time.sleep(0.2)
    assert in_fresh_child_as(AGENT_UID, _agent_checkpoint, place.daemon.address,
                             theirs) == "ok"
    logged = [x.id for x in c.log(theirs)]
    since = len(mine.kept)
    assert as_agent("echo changed > a.txt", mine.ws).returncode == 0
    done: dict = {}

    def swap(path: str) -> None:
        done["swapped"] = _swap(mine, kind, mine.ws / path)
    result, _ = held(place, "capture.before_open", lambda: in_fresh_child_as(
        AGENT_UID, _agent_checkpoint, place.daemon.address, theirs), swap)
    assert done["swapped"]
    mine.check_root_files(since)
    if kind in ("root_file", "hard_link"):
        assert result == "PermissionDenied", result
        assert [x.id for x in c.log(theirs)] == logged  # nothing recorded
    else:
        assert result == "ok", result


@pytest.mark.parametrize("kind", ["symlink", "folder"])
def test_a_checkpoint_holding_its_turn_while_the_agent_swaps_its_workspace(
        capture_place, kind):
    """Held with its turn taken, nothing read (``checkpoint.admitted``), the agent puts a
    symlink to root's canary, or a folder of its own, in its workspace's place (it owns
    the folder above): FAILED_PRECONDITION, nothing recorded, the canary unread."""
    place, _, c, s, _ = capture_place
    place.reset("echo one > a.txt")
    s.checkpoint()
    logged = [x.id for x in c.log(s.id)]
    as_agent("echo changed > a.txt", place.ws)
    aside = place.home / "ws.real"
    make = (f'ln -s "{place.canary}" ws' if kind == "symlink"
            else "mkdir ws && echo planted > ws/planted")

    def swap(_path: str) -> None:
        as_agent(f"mv ws ws.real && {make}", place.home)
    try:
        result, _ = held(place, "checkpoint.admitted", lambda: _outcome(s.checkpoint), swap)
    finally:
        if aside.exists():
            subprocess.run(["rm", "-rf", "--", str(place.ws)], check=True)
            aside.rename(place.ws)
    assert result == "FAILED_PRECONDITION", result
    assert [x.id for x in c.log(s.id)] == logged
    assert s.checkpoint().id  # put back, the session goes on


# -- take-over ----------------------------------------------------------------------
class _Pauses:
    """What ``held`` needs of a place: the pause folder."""

    def __init__(self, pauses: Path) -> None:
        self.pauses = pauses


# Where the take-over is held, and what the agent (who writes the new workspace's
# parent) puts there: at ``takeover.checked`` the path is the new workspace's, at
# ``takeover.mid`` the staging folder's (written, not yet renamed into place).
TAKEOVER_CASES = (
    ("takeover.checked", "folder"),
    ("takeover.checked", "symlink"),
    ("takeover.checked", "file"),
    ("takeover.mid", "folder"),
    ("takeover.mid", "symlink"),
)


def test_a_take_over_held_while_the_agent_swaps_where_it_writes(
        reachable, postgres_url, s3_server):
    """Before this, a folder the agent put at the staging folder's name while the
    take-over wrote it was renamed into place as the session's workspace (the take-over
    acknowledged, the folder the agent's, not the head's), and a folder, symlink or file
    put at the new workspace's path made the rename fail with an OSError (INTERNAL).
    Now each is FAILED_PRECONDITION, the canary and what the agent put there untouched,
    and the session can be taken over again once the way is clear."""
    tmp_path = reachable
    canary = tmp_path / "canary"
    canary.mkdir(mode=0o700)
    (canary / "secret").write_bytes(CANARY)
    home = tmp_path / "agent"
    _agents(home)
    pauses = tmp_path / "pauses"
    pauses.mkdir(mode=0o700)
    before = fingerprint(canary)
    bucket = s3_server.new_bucket()

    def host(name: str, env: dict | None = None) -> DaemonProcess:
        return DaemonProcess(tmp_path / f"root-{name}", [
            "--store", postgres_url, "--blobs", f"s3://{bucket}/fleet", "--host-id", name,
            "--lease-seconds", "2"], env={**s3_server.env, **(env or {})}).start()
    a, b = host("a"), None
    sessions = []
    try:
        with a.client() as ca:
            for i, _ in enumerate(TAKEOVER_CASES):
                ws = tmp_path / f"ws{i}"
                _agents(ws)
                as_agent(f"echo {i} > a.txt && mkdir src && echo code > src/m.py", ws)
                s = ca.create_session(str(ws))
                s.checkpoint()
                sessions.append(s.id)
        a.stop()
        b = host("b", {"WORLDLINE_FAULTS": "takeover.checked~,takeover.mid~",
                       "WORLDLINE_PAUSE_DIR": str(pauses), "WORLDLINE_PAUSE_TIMEOUT": "20"})
        with b.client() as cb:
            for sid, (point, kind) in zip(sessions, TAKEOVER_CASES, strict=True):
                _take_over_held(cb, pauses, sid, home / f"taken-{sid}", point, kind, canary)
            # the way cleared, it is taken over whole
            sid = sessions[0]
            target = home / f"taken-{sid}"
            subprocess.run(["rm", "-rf", "--", str(target)], check=True)
            taken = cb.move_session(sid, take_over=True, workspace=str(target))
            assert taken.needs_attention is None
            assert (target / "a.txt").read_text() == "0\n"
    finally:
        for d in (a, b):
            if d is not None and d.proc is not None:
                d.stop()
    assert differences(before, fingerprint(canary)) == []


def _take_over_held(cb, pauses: Path, sid: str, target: Path, point: str, kind: str,
                    canary: Path) -> None:
    """Take ``sid`` over into ``target``, held at ``point`` while the agent puts a
    ``kind`` where the take-over is about to write: refused, what it put left as is."""
    made = {"folder": 'mkdir "{0}" && echo planted > "{0}/planted"',
            "symlink": f'ln -s "{canary}" "{{0}}"',
            "file": 'echo planted > "{0}"'}[kind]

    def swap(path: str) -> None:
        if point == "takeover.mid":
            assert os.path.basename(path).startswith(".worldline-takeover-"), path
            as_agent(f'mv "{path}" "{path}.moved" && ' + made.format(path), target.parent)
        else:
            assert path == str(target), path
            as_agent(made.format(path), target.parent)
    result, _ = held(_Pauses(pauses), point, lambda: _outcome(
        lambda: cb.move_session(sid, take_over=True, workspace=str(target))), swap)
    assert result == "FAILED_PRECONDITION", (point, kind, result)
    # nothing of the session's written over what the agent put at the path
    if kind == "symlink" and point == "takeover.checked":
        assert target.is_symlink()
    elif kind == "file":
        assert target.read_text() == "planted\n"
    elif point == "takeover.checked":
        assert sorted(os.listdir(target)) == ["planted"]
    assert cb.get_session(sid).needs_attention  # said, not taken


# -- hard links into another session's workspace ------------------------------------
OTHER_UID = 1001  # another user, whose session the agent's sits beside


def test_hard_links_into_another_sessions_workspace_are_never_written_through(reachable):
    """With ``protected_hardlinks`` (1 on this machine) the agent links no file it does
    not own unless it may read and write it: root's 0644 file, no; another user's 0666
    file, yes. So a link group may span the agent's workspace and another session's.
    A restore of either session gives every name the checkpoint's content and metadata
    on a file of its own (written aside, renamed), and never through a descriptor of
    an inode with other links: the other workspace keeps its owner, mode, time and
    bytes. (Were a file with other links given its metadata in place, the agent's
    restore would chown the other user's file to the agent and chmod it.)"""
    tmp_path = reachable
    home, theirs, rootws = tmp_path / "agent", tmp_path / "theirs", tmp_path / "rootws"
    ws, mine = home / "ws", home / "mine"
    _agents(home, ws, mine)
    _agents(theirs, uid=OTHER_UID)
    as_agent("echo same > rw.txt && chmod 0666 rw.txt", theirs, uid=OTHER_UID)
    rootws.mkdir(mode=0o755)
    (rootws / "root.txt").write_text("same\n")
    os.chmod(rootws / "root.txt", 0o644)
    with open("/proc/sys/fs/protected_hardlinks") as f:
        protected = f.read().strip() == "1"
    d = DaemonProcess(tmp_path / "root", ["--allow-uid", str(AGENT_UID)]).start()
    try:
        linked = as_agent(f'ln "{rootws}/root.txt" probe', ws, check=False).returncode == 0
        assert linked != protected  # root's file: linked only without protected_hardlinks
        if linked:
            os.unlink(ws / "probe")
        as_agent(f'ln "{theirs}/rw.txt" probe && rm probe', ws)  # read+write: allowed
        with d.client() as c:
            as_agent("echo same > y && echo old > z && echo group > g1 && ln g1 g2", ws)
            a = c.create_session(str(ws))
            target = (a.checkpoint().id, fingerprint(ws))
            b = c.create_session(str(theirs))
            their_cp = b.checkpoint().id
            # the agent's names become the other user's inode: equal content (y), other
            # content (z), a group's first name (g1); root's file too where it may
            sources = [f"{theirs}/rw.txt"] + ([f"{rootws}/root.txt"] if linked else [])
            as_agent("rm y z g1 && " + " && ".join(
                f'ln -f "{sources[0]}" {n}' for n in ("y", "z", "g1"))
                + (f' && ln "{sources[-1]}" r' if linked else ""), ws)
            there = {src: fingerprint(Path(src).parent) for src in sources}
            a.restore(target[0], acknowledge_side_effects=True)
            assert differences(target[1], fingerprint(ws)) == []
            for src, fp in there.items():
                assert differences(fp, fingerprint(Path(src).parent)) == [], src
                assert os.stat(src).st_nlink == 1  # no name of the agent's left on it
            # the other way: the other session restored while the agent holds a link
            as_agent(f'ln "{theirs}/rw.txt" held', ws)
            as_agent("touch -d 2001-01-01 rw.txt", theirs, uid=OTHER_UID)
            ours = fingerprint(ws)
            b.restore(their_cp, acknowledge_side_effects=True)
            assert differences(ours, fingerprint(ws)) == []  # its time not set through
            assert os.stat(theirs / "rw.txt").st_mtime_ns != os.stat(ws / "held").st_mtime_ns
            # the agent user's own session, its restore asked for as uid 1000
            as_agent("echo same > m.txt", mine)
            sid = in_fresh_child_as(AGENT_UID, _agent_session, d.address, str(mine))
            logged = c.log(sid)[-1].id
            as_agent(f'rm m.txt && ln "{theirs}/rw.txt" m.txt', mine)
            there = fingerprint(theirs)
            got = in_fresh_child_as(AGENT_UID, _agent_restore, d.address, sid, logged)
            assert got in ("ok", "PermissionDenied"), got
            assert differences(there, fingerprint(theirs)) == []
            if got == "ok":
                st = os.stat(mine / "m.txt")
                assert (st.st_uid, st.st_nlink) == (AGENT_UID, 1)
            assert c.fsck()["ok"]
    finally:
        d.stop()


# -- a disk filled by the agent -------------------------------------------------------
def test_an_agent_fills_its_disk_and_nothing_acknowledged_is_lost(tmp_path, tmpfs):
    """The agent fills the small file system its workspace is on (the data root is on
    another, which the agent cannot write at all). A checkpoint of the full folder
    works (a capture writes nothing there); a restore that needs room there is
    RESOURCE_EXHAUSTED; meanwhile another session checkpoints and restores, and the
    metadata (log, audit, list, fsck) answers. Once the agent frees room, every
    acknowledged checkpoint comes back whole."""
    os.chmod(tmp_path, 0o711)
    canary = tmp_path / "canary"
    canary.mkdir(mode=0o777)  # open to the agent: a restore acting for it would show
    (canary / "keep.txt").write_text("keep\n")
    untouched = fingerprint(canary)
    home = tmp_path / "agent"
    _agents(home)
    ws = tmpfs(home / "ws", "4m", mode="0755")
    os.chown(ws, AGENT_UID, AGENT_UID)
    neighbour = tmp_path / "neighbour"
    neighbour.mkdir()
    d = DaemonProcess(tmp_path / "root", ["--allow-uid", str(AGENT_UID),
                                          "--min-free-bytes", "1M"]).start()
    try:
        for folder in (d.root, d.root / "blobs"):  # not the agent's to fill, or to read
            assert as_agent(f'touch "{folder}/planted"', home, check=False).returncode
            assert as_agent(f'ls "{folder}"', home, check=False).returncode
        with d.client() as c:
            s = c.create_session(str(ws))
            n = c.create_session(str(neighbour))
            acked: dict[str, dict] = {}
            as_agent("echo first > a.txt && head -c 1200000 /dev/urandom > f.bin"
                     " && mkdir zz && echo z > zz/z.txt", ws)
            first = s.checkpoint().id
            acked[first] = fingerprint(ws)
            # the filler goes in zz/, which the checkpoint has too: a restore writes the
            # top's files before it empties zz/, so it finds the disk full
            as_agent("echo second > a.txt && rm f.bin", ws)
            filled = as_agent("head -c 16000000 /dev/zero > zz/fill", ws, check=False)
            assert filled.returncode and "No space left" in filled.stderr
            full = s.checkpoint().id  # read as any folder is: nothing written there
            acked[full] = fingerprint(ws)
            (neighbour / "n.txt").write_text("one\n")
            ncp = n.checkpoint().id
            with pytest.raises(ResourceExhausted):
                s.restore(first, acknowledge_side_effects=True)  # no room for f.bin
            (neighbour / "n.txt").write_text("two\n")
            assert n.checkpoint().id
            n.restore(ncp)
            assert (neighbour / "n.txt").read_text() == "one\n"
            assert {x.id for x in c.list_sessions()} >= {s.id, n.id}
            assert [x.id for x in c.log(s.id)][-1] == full
            assert [e.kind for e in c.audit(s.id, kind="restore.failed")]
            assert c.fsck()["ok"]
            as_agent("rm -f zz/fill", ws)  # room again
            for i, (cp_id, want) in enumerate(acked.items()):
                fork = tmp_path / f"fork{i}"  # on another file system: room to spare
                c.fork(cp_id, str(fork))
                got = fingerprint(fork)
                assert differences({k: v for k, v in want.items() if k != "."},
                                   {k: v for k, v in got.items() if k != "."}) == []
            s.restore(first, acknowledge_side_effects=True)
            assert differences(acked[first], fingerprint(ws)) == []
        assert differences(untouched, fingerprint(canary)) == []
    finally:
        d.stop()



def test_an_agent_user_filling_the_data_root_leaves_the_owner_its_reserve(reachable, tmpfs):
    """The agent cannot write the data root, but its own session's checkpoints (of
    files it writes, 4 MB at a time) fill it. Before, they went on to the floor
    (--min-free-bytes), and then the owner's sessions could store nothing either. Now
    an agent user's checkpoints stop as far again short of the floor, RESOURCE_EXHAUSTED
    saying so, and the owner's session still checkpoints a file of 4 MB; every
    acknowledged checkpoint of the agent's is whole."""
    tmp_path = reachable
    home, ws, neighbour = tmp_path / "agent", tmp_path / "agent" / "ws", tmp_path / "own"
    _agents(home, ws)
    neighbour.mkdir()
    data = tmpfs(tmp_path / "data", "64m")
    d = DaemonProcess(data / "root", ["--allow-uid", str(AGENT_UID),
                                      "--min-free-bytes", "12M"])
    d.log = tmp_path / "daemon.log"  # not on the small file system
    d.start()
    try:
        sid = in_fresh_child_as(AGENT_UID, _agent_session, d.address, str(ws))
        with d.client() as c:
            n = c.create_session(str(neighbour))
            acked = []
            for i in range(30):
                as_agent(f"head -c 4000000 /dev/urandom > f{i}.bin", ws)
                try:
                    acked.append(c.checkpoint(sid).id)
                except ResourceExhausted as exc:
                    assert "kept for the owner's sessions" in exc.message, exc.message
                    break
            else:
                pytest.fail("the agent's checkpoints never stopped")
            assert acked
            (neighbour / "big.bin").write_bytes(os.urandom(4 << 20))
            assert n.checkpoint().id  # the owner's reserve is the owner's
            assert c.fsck()["ok"]
            as_agent("rm -f f*.bin", ws)
            c.restore(sid, acked[-1], acknowledge_side_effects=True)
            assert len(list(ws.glob("f*.bin"))) == len(acked)
    finally:
        d.stop()

# -- many names, and names at the file system's limits --------------------------------
MANY = 60_000  # empty files in one folder (100,000: a restore of 29 s here)
_MAKE_NAMES = r"""
import os, sys
n = int(sys.argv[1])
os.mkdir("many")
for i in range(n):
    os.close(os.open(f"many/{i:06d}", os.O_CREAT | os.O_WRONLY, 0o644))
with open("n" * 255, "w") as f:
    f.write("a name of 255 bytes\n")
os.mkdir("long")
os.chdir("long")
for _ in range(17):  # 17 names of 255 bytes: a path of 4,352 bytes, past PATH_MAX
    os.mkdir("d" * 255)
    os.chdir("d" * 255)
with open("leaf", "w") as f:
    f.write("past PATH_MAX\n")
"""
_NEST = r"""
import os, sys
os.mkdir(sys.argv[2])
os.chdir(sys.argv[2])
for _ in range(int(sys.argv[1])):
    os.mkdir("x")
    os.chdir("x")
with open("leaf", "w") as f:
    f.write("deep\n")
"""


def _py_as_agent(script: str, cwd: Path, *args: str) -> None:
    done = subprocess.run(["setpriv", f"--reuid={AGENT_UID}", f"--regid={AGENT_UID}",
                           "--clear-groups", "/usr/bin/python3", "-c", script, *args],
                          cwd=cwd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def _leaf(top: Path, parts: list[str]) -> bytes:
    """The file at the end of ``parts`` below ``top``, reached through descriptors (the
    path is longer than PATH_MAX)."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            sub = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = sub
        leaf = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW, dir_fd=fd)
        try:
            return os.read(leaf, 100)
        finally:
            os.close(leaf)
    finally:
        os.close(fd)


def _peak_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) << 10
    return 0


def test_a_layer_of_many_names_at_the_file_systems_limits(tmp_path, capsys):
    """The agent makes 60,000 empty files in one folder, a name of 255 bytes, a path
    of 4,352 bytes (past PATH_MAX) and 300 nested folders. Checkpoint and restore take
    them all within --max-entries, with the daemon's memory bounded, while another
    session is served; past --max-entries the checkpoint is RESOURCE_EXHAUSTED, past
    the deepest nesting captured (400) FAILED_PRECONDITION, nothing recorded."""
    os.chmod(tmp_path, 0o711)
    home = tmp_path / "agent"
    ws = home / "ws"
    _agents(home, ws)
    neighbour = tmp_path / "neighbour"
    neighbour.mkdir()
    limit = MANY + 2_000
    d = DaemonProcess(tmp_path / "root", ["--max-entries", str(limit)]).start()
    took: dict[str, float] = {}

    def timed(name: str, call):
        started = time.monotonic()
        out = call()
        took[name] = round(time.monotonic() - started, 2)
        return out
    try:
        timed("make", lambda: _py_as_agent(_MAKE_NAMES, ws, str(MANY)))
        _py_as_agent(_NEST, ws, "300", "nest")
        long_leaf = ["long"] + ["d" * 255] * 17 + ["leaf"]
        deep_leaf = ["nest"] + ["x"] * 300 + ["leaf"]
        with d.client() as c:
            n = c.create_session(str(neighbour))
            s = timed("create (full scan)", lambda: c.create_session(str(ws)))
            as_agent("echo changed > many/000007", ws)
            cp = timed("checkpoint", s.checkpoint)
            # (fingerprint goes by path: not below long/, whose paths pass PATH_MAX)
            want = {sub: fingerprint(ws / sub) for sub in ("many", "nest")}
            # past --max-entries: refused, nothing recorded, the neighbour served
            as_agent("mkdir more && seq 1 2100 | sed 's|^|more/m|' | xargs touch", ws)
            with pytest.raises(ResourceExhausted) as err:
                s.checkpoint()
            assert "--max-entries" in err.value.message
            assert c.log(s.id)[-1].id == cp.id
            as_agent("rm -rf more", ws)
            # past the deepest nesting captured: refused, clearly
            _py_as_agent(_NEST, ws, "450", "deeper")
            with pytest.raises(FailedPrecondition) as err:
                s.checkpoint()
            assert "deep" in err.value.message
            as_agent("rm -rf deeper many long nest", ws)
            latencies: list[float] = []
            stop = threading.Event()

            def neighbour_works() -> None:
                i = 0
                while not stop.is_set():
                    i += 1
                    (neighbour / "n.txt").write_text(f"{i}\n")
                    started = time.monotonic()
                    n.checkpoint()
                    latencies.append(time.monotonic() - started)
            worker = threading.Thread(target=neighbour_works)
            worker.start()
            try:
                timed("restore", lambda: s.restore(cp.id, acknowledge_side_effects=True))
            finally:
                stop.set()
                worker.join(30)
            assert len(os.listdir(ws / "many")) == MANY
            for sub, fp in want.items():
                assert differences(fp, fingerprint(ws / sub)) == [], sub
            assert (ws / ("n" * 255)).read_text() == "a name of 255 bytes\n"
            assert _leaf(ws, long_leaf) == b"past PATH_MAX\n"
            assert _leaf(ws, deep_leaf) == b"deep\n"
            assert latencies and max(latencies) < 10, latencies  # served meanwhile
            took["neighbour's slowest checkpoint"] = round(max(latencies), 2)
            assert c.fsck()["ok"]
        peak = _peak_rss(d.proc.pid)
        took["daemon peak RSS MiB"] = peak >> 20
        with capsys.disabled():
            print(f"\n{MANY:,} names: {took}")
        assert peak < 1 << 30, peak  # bounded: well below a gigabyte
    finally:
        d.stop()
