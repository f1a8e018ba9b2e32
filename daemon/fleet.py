"""A fleet of hosts sharing one history (a PostgreSQL store, a bucket of blobs).

Terms: a *host* is one daemon beside one Docker engine, named by its host id. A
session is *held* by one host at a time: its workspace and container live there, and
only that host checkpoints, restores or records tool calls for it (others answer
FAILED_PRECONDITION naming it). The holder's *lease* on its sessions is renewed
while it runs (``Leases``); a host that stops renewing loses nothing, but after the
lease runs out another host may *take the session over*.

- **Release** (``release``): the holder lets a session go for another host (or any):
  its lease ends at once and it stops serving the session.
- **Take-over** (``take_over``): a host claims a session whose lease ran out or that
  was released to it (a compare-and-set in the store: of two hosts, one wins), marks
  it ``needs_attention`` while it works, rebuilds the workspace from the head in a
  folder of its own beside the target and renames it into place (a crash before the
  rename leaves only that folder, which the next take-over removes; one after it leaves
  the workspace in place, recorded by identity just before, and the next take-over goes
  on from it), makes the container again from the
  recorded spec with the head's layer (other mounts become fresh empty volumes), and
  appends a checkpoint equal to the head. That append moves the head, so a former
  holder still working on the session is fenced: its next checkpoint fails the head's
  compare-and-set (ABORTED).
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import threading
import time
from dataclasses import replace

from worldline.wire.errors import FailedPrecondition, InvalidArgument

from . import ids
from .capture.layers import CONTAINER, WORKSPACE
from .capture.resolve import identity_of, make_folder, open_folder
from .capture.snapshotter import Capture
from .faults import crash_point
from .records import AuditEvent, Checkpoint, Session
from .session_spec import SessionSpec
from .storage.leases import claimable
from .world import World, remove_folder, symlink_refused

log = logging.getLogger(__name__)

STAGING = ".worldline-takeover-"


def release(world: World, session_id: str, to_host: str) -> Session:
    if not world.host:
        raise FailedPrecondition("this daemon is not part of a fleet (start it with"
                                 " --store postgresql://... and a --host-id)")
    if not to_host:
        raise InvalidArgument("name the host to release the session to (or '*' for any)")
    with world.session_locked(session_id) as (session, _):
        if session.host != world.host:
            raise FailedPrecondition(f"session {session_id} is held by {session.host}, not"
                                     f" by this host ({world.host})")
        released = world.store.release_session(session_id, world.host, to_host)
        world.store.append_audit([AuditEvent("session.release", session_id, session_id,
                                             {"host": world.host, "to": to_host}, ids.now())])
        world.forget(session_id)
    if world.monitor is not None:
        world.monitor.release(session.workspace)
    return released


def take_over(world: World, session_id: str, workspace: str = "") -> Session:
    if not world.host:
        raise FailedPrecondition("this daemon is not part of a fleet (start it with"
                                 " --store postgresql://... and a --host-id)")
    session = world.session(session_id)
    if session.deleted_at:
        raise FailedPrecondition(f"session {session_id} was deleted; fork it instead")
    interrupted = (session.needs_attention or "").startswith("take-over")
    unfinished = interrupted and session.host == world.host
    if session.host == world.host and not session.released_to and not unfinished:
        raise FailedPrecondition(f"session {session_id} is already held by this host")
    if not unfinished and session.host != world.host and not claimable(
            session.host, session.lease_expires, session.released_to, world.host,
            session.host, time.time()):
        if session.released_to:
            raise FailedPrecondition(f"session {session_id} was released to host"
                                     f" {session.released_to}, not to {world.host}")
        raise FailedPrecondition(
            f"session {session_id} is held by host {session.host}, whose lease runs until"
            f" {time.strftime('%H:%M:%SZ', time.gmtime(session.lease_expires))}: stop that"
            f" host or release the session there (`worldline session move {session_id}"
            f" --to {world.host}`) first")
    path = workspace or session.workspace
    staging = os.path.join(os.path.dirname(path.rstrip("/")) or "/",
                           STAGING + session_id)
    # The folder the recorded container spec binds as the workspace: where the session
    # was before its first claim. The claim names the new place, so it also writes this
    # folder into the spec (which may lack it), where a take-over that died after the
    # claim and is resumed finds it.
    spec = SessionSpec.parse(session.spec)
    origin = spec.workspace or session.workspace
    # A take-over that died after putting the workspace in place left it there: the
    # folder at the path is the one it recorded (by identity), and the take-over goes
    # on from it, keeping whatever was written in it since (the next checkpoint has it).
    placed = interrupted and _is_placed(path, spec.placed)
    if interrupted:  # what a take-over that died left (its name is ours; never followed),
        # if it is still the folder it made (an agent writing the parent may have put
        # another there: then the staging below is refused)
        remove_folder(staging, spec.staging or [-1, -1])
    real = world.check_workspace(path, must_be_empty=not placed, moving=session_id)
    crash_point("takeover.checked", path)
    head = world.store.get_checkpoint(session.head)
    if head.pruned:
        raise FailedPrecondition(f"the head of session {session_id} was pruned")
    recorded = replace(spec, workspace=origin)
    now = time.time()
    claimed = session if unfinished else world.store.claim_session(
        session_id, world.host, session.host, now + world.lease_seconds, now,
        workspace=real, needs_attention=f"take-over by {world.host} under way",
        **({"spec": recorded.to_json()} if spec.as_dict() else {}))
    world.store.append_audit([AuditEvent("session.take_over", session_id, session_id,
                                         {"from": session.host, "host": world.host,
                                          "workspace": real}, ids.now())])
    if not placed:
        _make_workspace(world, claimed, head, real, staging, recorded)
    _rebuild(world, claimed, head, real, origin)
    return world.session(session_id)


def _is_placed(path: str, placed: list[int] | None) -> bool:
    """Whether the folder at ``path``, reached through no symlink, is the one a
    take-over recorded as put in place."""
    if not placed:
        return False
    try:
        return identity_of(open_folder(path)) == list(placed)
    except OSError:
        return False


def _make_workspace(world: World, session: Session, head: Checkpoint, path: str,
                    staging: str, spec: SessionSpec) -> None:
    """The workspace at ``path`` (an empty folder, or none) made from the head: written
    in ``staging`` beside it, recorded in the session's ``spec`` by identity, renamed
    into place."""
    # Made, written and renamed through no symlink: the folders above the workspace may
    # be the agent's, and swapped for symlinks while this runs.
    try:
        fd, created = make_folder(staging)
    except OSError as exc:
        raise symlink_refused(WORKSPACE, path, exc) from None
    staged = identity_of(fd)
    if not created:  # put there since it was cleared: not ours to write into
        raise FailedPrecondition(f"{staging} is in the way of the take-over (not made by"
                                 " it): nothing was written; remove it and try again")
    spec = replace(spec, staging=staged)  # an interrupted take-over removes only this one
    world.store.update_session(session.id, spec=spec.to_json())
    layer = world.layer(WORKSPACE, staging, staged, track=False)
    layer.snap.apply(Capture(world.empty_tree, 0), head.tree)
    crash_point("takeover.mid", staging)
    world.store.update_session(session.id, spec=replace(spec, placed=staged).to_json())
    try:
        parent = open_folder(os.path.dirname(path))
    except OSError as exc:
        raise symlink_refused(WORKSPACE, path, exc) from None
    try:
        name, here = os.path.basename(path), os.path.basename(staging)
        try:
            try:
                os.rmdir(name, dir_fd=parent)  # checked empty
            except FileNotFoundError:
                pass
            if not _is_staged(parent, here, staged):
                raise _in_the_way(staging, "the take-over's staging folder was moved or"
                                           " replaced")
            os.rename(here, name, src_dir_fd=parent, dst_dir_fd=parent)
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                raise
            raise _in_the_way(path, "something was put there") from None
        # The staging folder's name is in a folder others may write: what the rename
        # moved is checked to be the folder written, by identity.
        if not _is_staged(parent, name, staged):
            raise _in_the_way(path, "the take-over's staging folder was swapped as it"
                                    " was renamed into place")
    finally:
        os.close(parent)
    crash_point("takeover.placed", path)


def _is_staged(parent: int, name: str, staged: list[int]) -> bool:
    """Whether ``name`` in the folder ``parent`` (never followed) is the folder the
    take-over wrote."""
    try:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return stat.S_ISDIR(st.st_mode) and [st.st_dev, st.st_ino] == staged


def _in_the_way(path: str, what: str) -> FailedPrecondition:
    return FailedPrecondition(f"{path}: {what} while the take-over wrote the workspace;"
                              " nothing of it was put in place over another's: see what"
                              " is there, then take the session over again")


def _rebuild(world: World, session: Session, head: Checkpoint, path: str,
             origin: str) -> None:
    """The container of ``session`` made here from its head beside the workspace at
    ``path``, then a checkpoint equal to the head appended (which fences the former
    holder). The container's bind of ``origin`` (its workspace on the former host)
    becomes one of ``path``."""
    container = None
    if session.container and head.container:
        container = _remake_container(world, session, origin, path)
    # No roots yet (the layers' identities are taken below); still its agent user's,
    # its exclusions and what else it recorded.
    was = SessionSpec.parse(session.spec)
    kept = SessionSpec(agent=was.agent or None, exclude=was.exclude, other=was.other)
    moved = replace(session, workspace=path, container=container, spec=kept.to_json())
    with world.lock(path):
        layers = world.layers(moved)
        for lay in layers:
            if lay.kind == CONTAINER:
                lay.snap.apply(lay.snap.capture(persist=False), head.container,
                               watch_new=True)
        world.store.update_session(session.id, container=container,
                                   spec=world.recorded_spec(moved, layers,
                                                            _spec_of(world, container)),
                                   needs_attention=None)
        cp = Checkpoint(ids.new_id(), session.id, 0, head.id, "restore", ids.now(), head.tree,
                        head.bytes, head.state_digest, head.tasks_digest, head.id, 0,
                        head.message_count, label=f"taken over by {world.host}",
                        restored_from=head.id, container=head.container if container else None,
                        resume=head.resume)
        world.store.append_checkpoint(cp, [], head.id, None, [AuditEvent(
            "restore", session.id, cp.id, {"target": head.id, "host": world.host}, ids.now())])
    if container:
        world.start_container(container, path)


def _remake_container(world: World, session: Session, origin: str, path: str) -> str:
    spec = world.container_spec(session)
    host = "".join(c if c.isalnum() or c in "_.-" else "-" for c in world.host)
    name = f"{session.container}-{host}"[:120]
    # Mounts besides the workspace name the former host's folders and volumes: on this
    # host each becomes a fresh empty volume at the same place (as `fork --volumes
    # empty`), never a bind of whatever this host has at that path.
    world.require_engine().create_from_spec(spec, name, origin, path,
                                            world.labels(session.id), "empty")
    return name


def _spec_of(world: World, container: str | None):
    return world.require_engine().creation_spec(container) if container else None


class Leases:
    """Renews this host's leases every ``every`` seconds, on a thread of its own, so a
    running daemon keeps its sessions and a stopped one lets them go."""

    def __init__(self, world: World, every: float) -> None:
        self.world = world
        self.every = every
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="leases", daemon=True)

    def start(self, address: str = "") -> None:
        """Say where this host answers, then keep its leases."""
        self.world.store.announce_host(self.world.host, address, time.time())
        self.renew()
        self.thread.start()

    def renew(self) -> int:
        """Extend this host's leases, and its holds with them (in_use.py)."""
        renewed = self.world.store.renew_leases(self.world.host,
                                                time.time() + self.world.lease_seconds)
        self.world.in_use.publish()
        return renewed

    def _run(self) -> None:
        while not self.stopping.wait(self.every):
            try:
                self.renew()
            except Exception as exc:  # the store may be briefly unreachable: retry
                log.warning("renewing the leases of host %s failed: %s", self.world.host, exc)

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=5)
