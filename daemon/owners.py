"""Sessions of an agent user: what a caller admitted with ``--allow-uid`` may have.

The daemon runs as root; a caller it admits by uid (an agent's hooks and client, run
as the agent's user) is not trusted as the daemon's owner is: the daemon does nothing
for it that its user could not do itself.

- A session it creates is its own (``agent`` in the session's spec: its uid and gid),
  over a folder it owns and can itself enter, read and write, reached by its path as
  the daemon reaches it (the same folder, checked by identity as that user).
- It forks only its own checkpoints, into a new folder made in a folder it owns.
- Every entry a checkpoint of its session records is one its user could have made: a
  file or folder of another user's in the workspace (root's, put there by someone
  else), a file setgid to a group not the user's, or an entry with file capabilities
  (``security.capability``) or a ``trusted.`` xattr is PERMISSION_DENIED, named, with nothing
  recorded; a restore or fork of a tree holding one (recorded by an older version, which
  did not check) is refused too. So what the daemon reads for it (show, diff) and writes for it
  (restore, fork) is the user's own, and grants it nothing.
- Containers are the daemon owner's: an agent user makes, attaches or forks none (a
  container's root writes the bind-mounted folder as root).

Which calls it may make, and on whose sessions, is the edge's (edge/callers.py).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import shutil
import stat
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from worldline.wire.errors import FailedPrecondition, PermissionDenied

from .capture.resolve import open_folder
from .capture.trees import Entry, TreeReader

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Agent:
    """A caller admitted by uid: its user's uid and primary gid (SO_PEERCRED)."""

    uid: int
    gid: int

    def __str__(self) -> str:
        return f"uid {self.uid}"


def agent_of(spec: str | None) -> Agent | None:
    """The agent user a session's spec says it belongs to; None: the daemon owner's."""
    if not spec or '"agent"' not in spec:  # the owner's: no parse on a checkpoint's path
        return None
    found = json.loads(spec).get("agent")
    return Agent(int(found[0]), int(found[1])) if found else None


def made_by(spec: str | None, agent: Agent) -> bool:
    """Whether a session (its spec) is ``agent``'s: made by its uid (whatever group)."""
    owner = agent_of(spec)
    return owner is not None and owner.uid == agent.uid


def with_agent(spec: str, agent: Agent | None) -> str:
    """``spec`` (JSON) saying the session is ``agent``'s (unchanged for None)."""
    if agent is None:
        return spec
    return json.dumps({**json.loads(spec or "{}"), "agent": [agent.uid, agent.gid]},
                      sort_keys=True)


def check_folder(agent: Agent, path: str, what: str = "workspace",
                 identity: list[int] | None = None) -> None:
    """``path`` is a folder ``agent`` owns, and that its user reaches by that path and
    may enter, read and write: PERMISSION_DENIED otherwise. The folder is opened
    through no symlink (a symlink on the way is refused by the caller's own check);
    ``identity``: the (st_dev, st_ino) the caller took of it, which it must still be
    (FAILED_PRECONDITION if it changed meanwhile)."""
    try:
        fd = open_folder(path)
    except OSError:
        raise PermissionDenied(f"{what} {path} cannot be reached through no symlink") from None
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    if identity is not None and [st.st_dev, st.st_ino] != list(identity):
        raise FailedPrecondition(f"{what} {path} changed while it was checked")
    if st.st_uid != agent.uid:
        raise PermissionDenied(f"{what} {path} belongs to uid {st.st_uid}, not to the caller"
                               f" ({agent}): an allowed user's sessions are over folders of"
                               " its own")
    if os.geteuid() != 0:
        raise PermissionDenied(f"a daemon that is not root cannot check {what} {path} as the"
                               f" caller ({agent}) would reach it: run it as root, or as the"
                               " agent's own user")
    if _reached_by(agent, path) != (st.st_dev, st.st_ino):
        raise PermissionDenied(f"{what} {path} is not a folder the caller ({agent}) can"
                               " enter, read and write itself")


SETPRIV = shutil.which("setpriv", path="/usr/bin:/bin") or "/usr/bin/setpriv"  # util-linux
_CHECK = ('test -d "$1" && test -r "$1" && test -w "$1" && test -x "$1"'
          ' && exec stat -c "%d %i" -- "$1"')


def _reached_by(agent: Agent, path: str) -> tuple[int, int] | None:
    """(st_dev, st_ino) of the folder ``path`` names for ``agent``'s user (without its
    supplementary groups), if it may enter, read and write it; else None. Asked of a
    process running as that user (``setpriv``, util-linux): the kernel's own permission
    checks, no emulation."""
    # Through setpriv, not subprocess's user=: with those, Python forks the daemon (gRPC's
    # fork handlers then crashed the child now and then); without them it uses vfork.
    try:
        done = subprocess.run([SETPRIV, f"--reuid={agent.uid}", f"--regid={agent.gid}",
                               "--clear-groups", "--", "/bin/sh", "-c", _CHECK, "sh", path],
                              env={"PATH": "/usr/bin:/bin"}, cwd="/", capture_output=True,
                              timeout=10)
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("checking %s as %s: %s", path, agent, exc)
        return None
    try:
        dev, ino = done.stdout.split()
        return (int(dev), int(ino)) if done.returncode == 0 else None
    except ValueError:
        log.warning("checking %s as %s: exit %s, %r %r", path, agent, done.returncode,
                    done.stdout[-200:], done.stderr[-200:])
        return None


# xattrs only a privileged process writes, and whose restore grants something: file
# capabilities, and the trusted namespace (overlayfs's markers among them). Not every
# security.* name: SELinux labels every file its user makes.
PRIVILEGED_XATTRS = ("security.capability", "trusted.")


def beyond(entry: Entry, agent: Agent) -> str | None:
    """Why ``agent``'s user could not have made ``entry`` itself (None: it could): it
    is another user's; or a file setgid to a group not the user's (``chmod g+s`` by a
    non-member is cleared, and a restore as root would grant the group); or it holds an
    xattr only a privileged process writes (``PRIVILEGED_XATTRS``)."""
    if entry.uid != agent.uid:
        return f"uid {entry.uid}"
    if entry.has_content and entry.mode & stat.S_ISGID and entry.gid != agent.gid:
        return f"setgid to gid {entry.gid}"
    if entry.extra and '"x"' in entry.extra:
        for name in entry.xattrs():
            if name.startswith(PRIVILEGED_XATTRS):
                return f"xattr {name}"
    return None


def foreign(reader: TreeReader, old: str | None, new: str, agent: Agent,
            pending: Mapping | None = None, prefix: str = "") -> Iterator[tuple[str, str]]:
    """(path, why) of the entries below the tree ``new`` that ``agent``'s user could not
    have made (``beyond``; ``.`` for the root folder itself), looking only into the
    folders that differ from the tree ``old`` (None: every folder). ``pending``: trees of
    a capture that stored nothing (a restore's look at the layer)."""
    if old == new:
        return
    before = reader.read(old, pending) if old else {}
    tree = reader.read(new, pending)
    own = getattr(tree, "own", None)
    if not prefix and own is not None and (why := beyond(own, agent)):
        yield ".", why
    for name, entry in tree.items():
        was = before.get(name)
        if was == entry:
            continue
        path = prefix + name
        if why := beyond(entry, agent):
            yield path, why
        if entry.is_folder:
            yield from foreign(reader, was.ref if was is not None and was.is_folder else None,
                               entry.ref, agent, pending, path + "/")


def check_entries(reader: TreeReader, old: str | None, new: str, agent: Agent,
                  pending: Mapping | None = None, doing: str = "nothing was recorded") -> None:
    """PERMISSION_DENIED, naming them, if the tree ``new`` of ``agent``'s session holds
    entries its user could not have made (``beyond``; compared with the tree ``old``)."""
    found = list(itertools.islice(foreign(reader, old, new, agent, pending), 6))
    if found:
        named = ", ".join(f"{path} ({why})" for path, why in found[:5])
        raise PermissionDenied(
            f"the workspace holds {named}{' and more' if len(found) > 5 else ''}"
            f" of another user's making: a session of an allowed user ({agent}) holds only"
            f" what its user could make itself; {doing}")
