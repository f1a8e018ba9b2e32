"""Who is calling, and which calls an agent user may make on which sessions.

The daemon's owner (root, or the daemon's own uid: the private socket's peers, a TCP
caller with the token) may make every call on every session. A caller admitted by
``--allow-uid`` is an agent user (owners.py): it makes sessions of its own and calls
only on them; the daemon-wide calls (gc, fsck, the audit log, take-overs, image
export, LangGraph's service) are the owner's, PERMISSION_DENIED to it. It may decide
its own sessions' approvals (the hooks' ``--approval ask`` records the person's yes
so), unless the daemon runs with ``--approvals-by owner``: then only a denial, never
an approval, is its to give.

How the edge knows the caller: the gateway reads each connection's peer credentials
(SO_PEERCRED); the gRPC relay (auth.PeerRelay) connects to the private socket from
an abstract address naming the peer's uid and gid, which gRPC shows as the call's
peer. Only the daemon's own uid can connect to the private socket, so no one else can
name a caller so. ``CALLER`` holds the agent for the call under way (None: owner).
"""

from __future__ import annotations

import contextvars
import errno
import os
import re
import secrets
from typing import TYPE_CHECKING

from google.protobuf.message import Message
from worldline.wire.errors import PermissionDenied

from ..owners import Agent, made_by

if TYPE_CHECKING:
    from ..world import World

CALLER: contextvars.ContextVar[Agent | None] = contextvars.ContextVar("caller", default=None)

_RELAY = "worldline-relay-"
_RELAYED = re.compile(rf"unix-abstract:{_RELAY}(\d+)-(\d+)-[0-9a-f]+")

# The daemon owner's calls. Any call not named below is the owner's too: a call added
# later is refused to an agent user until it is given a rule.
_BY_SESSION = {"GetSession", "ResolveSession", "DeleteSession", "CreateCheckpoint",
               "ListCheckpoints", "RecordToolCall", "ListToolCalls", "SetTask", "ListTasks",
               "RequestApproval", "Restore", "PathHistory"}
_BY_CHECKPOINT = {"GetCheckpoint": ("checkpoint_id",), "Diff": ("from_id", "to_id"),
                  "ReadFile": ("checkpoint_id",),
                  "Fork": ("checkpoint_id",), "Restore": ("checkpoint_id",)}
_BY_APPROVAL = {"GetApproval", "WaitApproval", "DecideApproval", "CancelApproval"}
# ResolveId: open, answering only with what the caller's sessions hold (server.py)
# WaitAudit: open, its events cut to the caller's sessions' (shown)
_OPEN = {"ExplainPolicy", "GetProgress", "ListSessions", "ListApprovals", "CreateSession",
         "ResolveId", "WaitAudit"}


def agent(uid: int, gid: int) -> Agent | None:
    """The caller a peer's credentials make: None for root and the daemon's own uid."""
    return None if uid in (0, os.geteuid()) else Agent(uid, gid)


def out_of_files(exc: OSError) -> bool:
    """Whether an accept failed for want of descriptors or memory (it may succeed once
    some are closed), rather than because its socket was closed."""
    return exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


def relay_address(uid: int, gid: int) -> str:
    """The abstract address the relay connects from for a peer of ``uid``/``gid``."""
    return f"\0{_RELAY}{uid}-{gid}-{secrets.token_hex(8)}"


def agent_of_peer(peer: str) -> Agent | None:
    """The caller a gRPC call's peer names (a relayed one), else None: the owner."""
    found = _RELAYED.fullmatch(peer or "")
    return agent(int(found[1]), int(found[2])) if found else None


class Rules:
    """``check`` before a call, ``shown`` on its reply, for the caller in ``CALLER``."""

    def __init__(self, world: World, gates, approvals_by_owner: bool = False) -> None:
        self.world, self.gates = world, gates
        self.approvals_by_owner = approvals_by_owner

    def check(self, method: str, request: Message) -> None:
        caller = CALLER.get()
        if caller is None:
            return
        known = (method in _BY_SESSION or method in _BY_CHECKPOINT or method in _BY_APPROVAL
                 or method in _OPEN)
        if not known:
            raise PermissionDenied(f"{method} is the daemon owner's to call, not an allowed"
                                   f" user's ({caller})")
        if method in _BY_SESSION:
            self._own_session(caller, request.session_id)
        for field in _BY_CHECKPOINT.get(method, ()):
            checkpoint = self.world.store.get_checkpoint(getattr(request, field))
            self._own_session(caller, checkpoint.session_id,
                              f"checkpoint {getattr(request, field)}")
        if method in _BY_APPROVAL or (method == "RecordToolCall" and request.approval_id):
            self._own_session(caller, self.gates.get_approval(request.approval_id).session_id,
                              f"approval {request.approval_id}")
        if method == "DecideApproval" and request.approve and self.approvals_by_owner:
            raise PermissionDenied(
                f"approvals are the daemon owner's to give (--approvals-by owner), not an"
                f" allowed user's ({caller}); it may deny or cancel its own")
        if method in ("ListApprovals", "WaitAudit") and request.session_id:
            self._own_session(caller, request.session_id)
        # What it may create (no container, a folder of its own) is the World's to check:
        # it is given the caller (owners.py).

    def shown(self, method: str, reply: Message) -> Message:
        """The reply as the caller may see it: a list of its own sessions' only; a
        policy decision naming whose approval counts for it (the hooks' ask mode
        turns the person's yes into an approval only where the caller's counts)."""
        caller = CALLER.get()
        if caller is None:
            return reply
        if method == "ExplainPolicy":
            reply.approver = "owner" if self.approvals_by_owner else "caller"
            return reply
        if method not in ("ListSessions", "ListApprovals", "WaitAudit"):
            return reply
        items = getattr(reply, {"ListSessions": "sessions", "ListApprovals": "approvals",
                                "WaitAudit": "events"}[method])
        mine = {s.id for s in self.world.sessions(include_deleted=True)
                if belongs(s.spec, caller)}
        # a daemon-wide event (gc, a fleet's) has no session: never an allowed user's
        kept = [m for m in items if (m.id if method == "ListSessions" else m.session_id) in mine]
        del items[:]
        items.extend(kept)
        return reply

    def _own_session(self, caller: Agent, session_id: str, named: str = "") -> None:
        """``named``: what the caller gave, when it is not the session (a checkpoint, an
        approval): the refusal names that alone, never the session it belongs to."""
        if not belongs(self.world.session(session_id).spec, caller):
            raise PermissionDenied(f"{named or f'session {session_id}'} is not the caller's"
                                   f" ({caller}): an allowed user calls only on sessions it"
                                   " made")


belongs = made_by  # whether a session (its spec) is the caller's, whatever its group
