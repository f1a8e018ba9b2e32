"""The checkpoints a restore or a fork under way is bringing back, kept from gc.

A restore to a checkpoint, or a fork of it, commits a checkpoint naming the target's
trees once it has written them out, which takes a while. Were retention to prune the
target meanwhile, the sweep after it would delete the blobs only the target named
(those stored before the grace period) while the new checkpoint is about to name
them: a checkpoint acknowledged over blobs that are gone, and a stat cache that hands
them to every checkpoint after it. So each one holds its target for its whole length
(``holding``), and gc prunes with every held target kept (``frozen``).

The hold is taken before the target is checked for a prune: a prune committed first
makes it unusable at once (FAILED_PRECONDITION), and one that begins after leaves it
be. A restore that a failure or a kill left half done is held by its journal's entry
instead (RestoreJournal.targets) until it is completed.

On a fleet, gc on another host must see them too: each change to the holds, and each
renewal of the host's leases, publishes them to the shared store (``publish``:
``Store.publish_holds``, with the journal's targets), lasting one lease. gc reads
every host's before it prunes and again before it sweeps (maintenance.py), so a
restore that checked its target just before another host pruned it still finds its
blobs kept, however long it takes. A hold is published before the target is
checked, and a restore whose hold cannot be published fails (UNAVAILABLE) rather
than run unseen. A host that dies leaves holds that run out with its leases. A host
that holds nothing, and has said so, writes nothing at its renewals.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)


class InUse:
    def __init__(self, publish: Callable[[set[str]], None] | None = None,
                 also: Callable[[], set[str]] = set) -> None:
        """``publish``: given the checkpoints held now, makes them this host's holds in
        the fleet's store (None on a data root of one host). ``also``: checkpoints
        published with the held ones (the restore journal's targets)."""
        self._held: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._publish_to = publish
        self._also = also
        # The store holds none of this host's: a renewal has nothing to extend. False
        # at first, so the first publication clears what a previous run left.
        self._none_published = False

    @property
    def _publishes(self) -> bool:
        return self._publish_to is not None

    def _publish(self) -> None:
        """Publish what is held now (called with the lock held)."""
        held = set(self._held) | self._also()
        if not held and self._none_published:
            return
        self._none_published = False  # until a publication of nothing succeeds
        self._publish_to(held)
        self._none_published = not held

    @contextmanager
    def holding(self, checkpoint_id: str) -> Iterator[None]:
        """``checkpoint_id`` is kept from retention for the block (which checks it is
        still usable, first thing)."""
        with self._lock:
            self._held[checkpoint_id] += 1
            if self._publishes and self._held[checkpoint_id] == 1:
                try:
                    self._publish()
                except BaseException:
                    self._drop(checkpoint_id)
                    raise
        try:
            yield
        finally:
            with self._lock:
                self._drop(checkpoint_id)
                if self._publishes and checkpoint_id not in self._held:
                    self._publish_or_warn()

    def _drop(self, checkpoint_id: str) -> None:
        self._held[checkpoint_id] -= 1
        if not self._held[checkpoint_id]:
            del self._held[checkpoint_id]

    def publish(self) -> None:
        """Publish the holds again (each lease renewal does: they last one lease). Never
        waits: a renewal that finds them being published, or frozen for this host's
        gc, leaves it to that (a frozen block publishes them as it ends; no other host
        collects meanwhile: the store's gc lock)."""
        if not self._publishes or not self._lock.acquire(blocking=False):
            return
        try:
            self._publish()
        finally:
            self._lock.release()

    def _publish_or_warn(self) -> None:
        """A hold let go of stays published until the next renewal succeeds: gc keeps
        a little more for a while, never less."""
        try:
            self._publish()
        except Exception as exc:  # noqa: BLE001 -- the store briefly unreachable
            log.warning("publishing this host's holds failed (%s); the next lease renewal"
                        " publishes them again", exc)

    @contextmanager
    def frozen(self) -> Iterator[set[str]]:
        """The checkpoints held now; no new hold begins until the block ends (retention
        prunes in it)."""
        with self._lock:
            try:
                yield set(self._held)
            finally:
                if self._publishes:  # the renewals it made wait
                    self._publish_or_warn()
