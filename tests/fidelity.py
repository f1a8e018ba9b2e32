"""What `rsync -aHAXS` keeps of a tree, as one comparable value; and the agent's hands.

``fingerprint(root)`` maps every path below ``root`` (``"."`` for the root itself) to
its kind, permission bits (setuid, setgid, sticky included), owner, group, mtime in
nanoseconds, xattrs (ACLs and file capabilities included; the overlay's own markers
left out), content digest and size, symlink target, device numbers, hard-link group
(the other paths sharing its inode) and, for a sparse file, where its data and holes
are (``SEEK_DATA``/``SEEK_HOLE``). Not its block count: that counts the file system's
own blocks too, such as the xattr block ext4 gives a file whose xattrs outgrow its
inode, which overlayfs's private ``trusted.overlay.origin`` does to a copied-up file.

The agent's actions run as uid 1000 on the host (``as_agent``) and as ``nobody``
(65534) in containers, by number: a fresh CI machine has no such users.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

AGENT_UID = 1000
NOBODY = 65534


def _xattrs(path: str) -> dict[str, bytes]:
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except OSError:
        return {}
    out = {}
    for name in names:
        if name.startswith("trusted.overlay."):
            continue
        out[name] = os.getxattr(path, name, follow_symlinks=False)
    return out


def _digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _data_runs(path: str) -> tuple[tuple[int, int], ...]:
    """The (start, end) byte ranges of a file that hold data, between its holes."""
    runs = []
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        end, at = os.fstat(fd).st_size, 0
        while at < end:
            try:
                start = os.lseek(fd, at, os.SEEK_DATA)
            except OSError:  # ENXIO: holes to the end
                break
            at = os.lseek(fd, start, os.SEEK_HOLE)
            runs.append((start, at))
    finally:
        os.close(fd)
    return tuple(runs)


def fingerprint(root: Path | str, skip_sockets: bool = True) -> dict[str, tuple]:
    root = os.fspath(root)
    records: dict[str, dict] = {}
    inodes: dict[int, list[str]] = {}
    stack = [""]
    while stack:
        rel = stack.pop()
        full = os.path.join(root, rel) if rel else root
        st = os.lstat(full)
        kind = stat.S_IFMT(st.st_mode)
        if kind == stat.S_IFSOCK and skip_sockets:
            continue
        rec = {"kind": kind, "uid": st.st_uid, "gid": st.st_gid,
               "mtime": st.st_mtime_ns, "xattrs": _xattrs(full)}
        if kind != stat.S_IFLNK:
            rec["mode"] = stat.S_IMODE(st.st_mode)
        if kind == stat.S_IFREG:
            rec["size"] = st.st_size
            rec["sha"] = _digest(full)
            if st.st_blocks * 512 < st.st_size:
                rec["data"] = _data_runs(full)  # a sparse file stays as sparse
            if st.st_nlink > 1:
                inodes.setdefault(st.st_ino, []).append(rel)
        elif kind == stat.S_IFLNK:
            rec["target"] = os.readlink(full)
        elif kind in (stat.S_IFCHR, stat.S_IFBLK):
            rec["rdev"] = st.st_rdev
        elif kind == stat.S_IFDIR:
            stack.extend(os.path.join(rel, n) if rel else n for n in os.listdir(full))
        records[rel or "."] = rec
    for group in inodes.values():
        if len(group) > 1:
            for path in group:
                records[path]["links"] = tuple(sorted(group))
    return {path: tuple(sorted(rec.items())) for path, rec in records.items()}


def differences(a: dict, b: dict) -> list[str]:
    """A readable list of what differs between two fingerprints (empty when equal)."""
    out = []
    for path in sorted(a.keys() | b.keys()):
        if a.get(path) != b.get(path):
            out.append(f"{path}: {dict(a[path]) if path in a else None}"
                       f" != {dict(b[path]) if path in b else None}")
    return out


def as_agent(script: str, cwd: Path | str, uid: int = AGENT_UID, check: bool = True
             ) -> subprocess.CompletedProcess:
    """Run a shell script as the agent: uid and gid ``uid``, no supplementary groups."""
    res = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                          "sh", "-ec", script], cwd=cwd, capture_output=True, text=True,
                         timeout=60)
    if check and res.returncode != 0:
        raise AssertionError(f"as uid {uid}: {script!r}: {res.stderr}")
    return res


def _no_grpc_in_a_forked_child() -> None:
    """Make a forked child's gRPC channel an error rather than a hang: gRPC's threads in
    the test process (any earlier test's channel starts them, and they outlive it) may
    hold a lock at the fork, and the child's channel then waits on it for good. A child
    that needs gRPC is ``in_fresh_child_as``'s."""
    grpc = sys.modules.get("grpc")
    if grpc is None:
        return

    def refused(*_args, **_kwargs):
        raise AssertionError("gRPC in a forked child can hang: use in_fresh_child_as")
    grpc.insecure_channel = grpc.secure_channel = refused


def in_child_as(uid: int, work: Callable[[], object]) -> object:
    """``work()`` in a child forked to run as uid and gid ``uid`` with no supplementary
    groups; what it returned (JSON-able), or the name of the exception it raised. The
    child imports nothing (it may not be able to read this checkout): whatever
    ``work`` needs is loaded here first. No gRPC in it (``in_fresh_child_as``)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            try:
                _no_grpc_in_a_forked_child()
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
                out = work()
            except Exception as exc:  # noqa: BLE001 -- reported to the parent
                out = type(exc).__name__
            os.write(w, json.dumps(out).encode())
        finally:
            os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    with os.fdopen(r, "rb") as f:
        return json.loads(f.read())


# A fresh interpreter, run as root in the checkout: it imports the work's module (and
# the client's gRPC path, whose modules gRPC imports lazily at the first channel, so
# that nothing is read from the checkout once it is the agent), drops to the uid, and
# writes what the work returned, or its exception's name, to the inherited pipe.
_FRESH_CHILD = r"""
import importlib, json, os, sys
spec = json.loads(sys.argv[1])
work = importlib.import_module(spec["module"])
for part in spec["name"].split("."):
    work = getattr(work, part)
import grpc
import worldline.client.channel, worldline.v1.worldline_pb2_grpc
grpc.insecure_channel("unix:/nonexistent-worldline-warm-up").close()
os.setgroups([])
os.setgid(spec["uid"])
os.setuid(spec["uid"])
try:
    out = work(*spec["args"])
except Exception as exc:
    out = type(exc).__name__
with os.fdopen(spec["fd"], "w") as f:
    f.write(json.dumps(out))
"""


def in_fresh_child_as(uid: int, work: Callable[..., object], *args: object) -> object:
    """``work(*args)`` as ``in_child_as`` runs it, in a fresh interpreter rather than a
    fork of this one: for work that uses gRPC, which a forked child cannot
    (``_no_grpc_in_a_forked_child``). ``work`` is a module-level function, ``args``
    JSON-able. The child's stderr is the test's (pytest shows it with a failure): not a
    pipe this side would have to drain while it waits on the result's."""
    name = work.__qualname__
    assert "<locals>" not in name, f"{name}: a fresh interpreter finds module-level work"
    r, w = os.pipe()
    spec = {"module": work.__module__, "name": name, "args": list(args), "uid": uid,
            "fd": w}
    root = Path(__file__).resolve().parents[1]
    child = subprocess.Popen([sys.executable, "-c", _FRESH_CHILD, json.dumps(spec)],
                             cwd=root, pass_fds=(w,))
    os.close(w)
    with os.fdopen(r, "rb") as f:
        out = f.read()
    code = child.wait(timeout=120)
    if not out:
        raise AssertionError(f"the fresh child of uid {uid} said nothing (exit {code}; its"
                             " stderr is in the test's captured output)")
    return json.loads(out)


class AgentProcess:
    """A forked child running as uid and gid ``AGENT_UID`` with no supplementary groups,
    in ``cwd``, for as long as a test needs the agent: ``ask(request)`` sends it a
    JSON-able request and returns ``answer(request)`` as the child computed it. The
    child imports nothing (it may not be able to read this checkout)."""

    def __init__(self, answer: Callable[[object], object], cwd: Path | str = "/") -> None:
        to_child, self._to = os.pipe()
        self._from, from_child = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            os.close(self._to)
            os.close(self._from)
            try:
                _no_grpc_in_a_forked_child()
                os.chdir(cwd)
                os.setgroups([])
                os.setgid(AGENT_UID)
                os.setuid(AGENT_UID)
                with os.fdopen(to_child) as requests, os.fdopen(from_child, "w") as answers:
                    for line in requests:
                        answers.write(json.dumps(answer(json.loads(line))) + "\n")
                        answers.flush()
            finally:
                os._exit(0)
        os.close(to_child)
        os.close(from_child)
        self._send = os.fdopen(self._to, "w")
        self._recv = os.fdopen(self._from)

    def ask(self, request: object) -> object:
        self._send.write(json.dumps(request) + "\n")
        self._send.flush()
        line = self._recv.readline()
        if not line:
            raise AssertionError(f"the agent died on {request}")
        return json.loads(line)

    def close(self) -> None:
        os.kill(self.pid, signal.SIGKILL)  # done, or stuck on a test that failed
        os.waitpid(self.pid, 0)
        self._send.close()
        self._recv.close()


# The agent's part of a host workspace: its own files with every kind of metadata an
# unprivileged user can give them.
AGENT_TREE = r"""
mkdir -p src/deep/er bin shared sticky empty
printf 'print(1)\n' > src/main.py
printf 'leaf' > src/deep/er/leaf.txt
cp /bin/true bin/tool && chmod 4755 bin/tool
cp /bin/true bin/grouptool && chmod 2711 bin/grouptool
chmod 2775 shared
chmod 1777 sticky
chmod 700 empty
setfattr -n user.note -v hello src/main.py
setfattr -n user.bin -v 0x00ff10 src/deep
setfacl -m u:65534:r-x src/main.py
setfacl -d -m u:65534:rwx shared
setfacl -m g:65534:rwx shared
ln src/main.py src/hard.py
ln src/main.py bin/also.py
ln -s ../src/main.py bin/link.py
ln -s /nowhere/at/all dangling
mkfifo pipe
truncate -s 100M sparse.img
printf 'data' | dd of=sparse.img bs=1 seek=50000000 conv=notrunc status=none
printf 'head' > small-hole.bin && truncate -s 200K small-hole.bin && printf 'tail' >> small-hole.bin
truncate -s 64K leading-hole.bin && printf 'x' >> leading-hole.bin
printf 'x' > "$(printf 'bad\377name')"
touch -h -d '2001-02-03 04:05:06.123456789' bin/link.py
touch -d '1999-12-31 23:59:59.5' src/deep/er/leaf.txt
touch -d '2002-02-02 02:02:02.25' src/deep/er
python3 -c 'import socket; socket.socket(socket.AF_UNIX).bind("agent.sock")'
"""


def build_host_tree(ws: Path) -> None:
    """A workspace owned by the agent (uid 1000), with files of another user and a
    file capability that only root could have given (as a container's root would)."""
    os.chown(ws, AGENT_UID, AGENT_UID)
    os.chmod(ws, 0o750)
    as_agent(AGENT_TREE, ws)
    others = ws / "others"
    others.mkdir()
    (others / "nobody.txt").write_text("not the agent's\n")
    os.chmod(others / "nobody.txt", 0o640)
    for p in (others, others / "nobody.txt"):
        os.chown(p, NOBODY, NOBODY)
    captool = ws / "bin" / "captool"
    captool.write_bytes(Path("/bin/true").read_bytes())
    os.chown(captool, AGENT_UID, AGENT_UID)
    os.chmod(captool, 0o755)
    subprocess.run(["setcap", "cap_net_bind_service+ep", str(captool)], check=True)
    os.utime(others, ns=(1_500_000_000_000_000_000, 1_500_000_000_000_000_000))


def empty_folder(path: Path) -> None:
    """Remove everything inside ``path`` (as root: the agent's and everyone's files)."""
    for child in path.iterdir():
        if child.is_dir() and not child.is_symlink():
            subprocess.run(["rm", "-rf", str(child)], check=True)
        else:
            child.unlink()
