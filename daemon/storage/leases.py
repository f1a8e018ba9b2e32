"""The LeaseStore contract: which host of a fleet holds each session, for how long,
and which checkpoints each host's work under way brings back. Every ``Store`` keeps it
(metadata_store.py); fleet.py and in_use.py are its callers.

Terms
- A *host* is one daemon beside one Docker engine, named by its host id. A session is
  *held* by one host at a time (``Session.host``): only the holder checkpoints,
  restores or records tool calls for it.
- The holder's *lease* (``Session.lease_expires``, seconds since the epoch) is renewed
  while it runs (fleet.Leases, every few seconds); a host that stops renewing loses
  nothing, but once its lease runs out another host may *claim* the session.
- A *release* ends the lease at once, for one host or for any ("*")
  (``Session.released_to``).
- A host *announces* the address where it answers, so that a caller sent to the wrong
  host can be told where to go.
- A *hold* is a checkpoint a host's restore or fork under way brings back
  (in_use.py), lasting one lease: gc on every host spares it and what it names.

Guarantees
- ``claim_session`` is a compare-and-set: of two hosts claiming one session, exactly
  one wins; the other gets ``Aborted``. Whether a claim may win is ``claimable``, the
  one rule every store tests.
- A claim sets only ``CLAIMABLE_FIELDS`` beside the holder (``check_claim_fields``:
  anything else is a bug, ValueError). The head is not among them: a new holder moves
  it by appending a checkpoint, which fences a former holder still at work (its next
  append fails the head's compare-and-set).
- Each method is one transaction; times are the caller's clock (``now``), so a
  fleet's hosts compare leases by the clocks that wrote them.

Lifecycle (a host): ``announce_host`` and ``renew_leases`` at its start; ``renew_leases``
and ``publish_holds`` while it runs; at its stop ``renew_leases(host, now)``, which
ends its leases so its sessions may be claimed at once. A single host's embedded
store keeps the same records; nothing claims from it.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Protocol

from ..records import Session


class LeaseStore(Protocol):
    """Sessions held by the hosts of a fleet; the module's docstring is the contract."""

    def renew_leases(self, host: str, until: float) -> int:
        """Extend the lease of every session ``host`` holds (and has not released) to
        ``until``; return how many."""

    def claim_session(self, session_id: str, host: str, expected_host: str, until: float,
                      now: float, **fields) -> Session:
        """Make ``host`` the session's holder with a lease until ``until`` (and set
        ``fields``: ``workspace``, ``container``, ``spec``, ``needs_attention``),
        provided it is still held by ``expected_host`` and that host's lease ran out
        before ``now`` or the session was released to ``host``: else ``Aborted``. Two
        hosts claiming one session: exactly one wins."""

    def announce_host(self, host: str, address: str, now: float) -> None:
        """Record where ``host`` answers (its advertised address, "" if none)."""

    def host_address(self, host: str) -> str:
        """The address ``host`` last announced, "" if none."""

    def publish_holds(self, host: str, checkpoint_ids: Collection[str], until: float,
                      now: float) -> None:
        """``host``'s holds become exactly ``checkpoint_ids``, each lasting until
        ``until`` (the checkpoints its restores and forks under way bring back,
        in_use.py); every host's holds that ran out before ``now`` are dropped."""

    def held_checkpoints(self, now: float) -> set[str]:
        """The checkpoints some host holds past ``now``: gc on any host of a fleet
        neither prunes them nor deletes what they name."""

    def release_session(self, session_id: str, host: str, to: str) -> Session:
        """``host`` lets go of the session for ``to`` (a host id, or "*" for any):
        its lease ends now. ``FailedPrecondition`` unless ``host`` holds it."""


CLAIMABLE_FIELDS = {"workspace", "container", "spec", "needs_attention"}


def check_claim_fields(fields: dict) -> None:
    unknown = set(fields) - CLAIMABLE_FIELDS
    if unknown:
        raise ValueError(f"session fields {sorted(unknown)} cannot change by a claim")


def claimable(holder: str, lease_expires: float, released_to: str | None, host: str,
              expected_host: str, now: float) -> bool:
    """Whether ``host`` may take a session held by ``holder`` (what claim_session's
    compare-and-set tests, in every store)."""
    if holder != expected_host:
        return False
    if released_to is not None:  # released for one host (or "*": any), whatever the clock
        return released_to in (host, "*")
    return lease_expires < now
