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
instead (RestoreJournal.targets) until it is completed. Holds are this daemon's; gc
on another host of a fleet cannot see them, and keeps what it pruned within the grace
period instead (maintenance.py).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager


class InUse:
    def __init__(self) -> None:
        self._held: Counter[str] = Counter()
        self._lock = threading.Lock()

    @contextmanager
    def holding(self, checkpoint_id: str) -> Iterator[None]:
        """``checkpoint_id`` is kept from retention for the block (which checks it is
        still usable, first thing)."""
        with self._lock:
            self._held[checkpoint_id] += 1
        try:
            yield
        finally:
            with self._lock:
                self._held[checkpoint_id] -= 1
                if not self._held[checkpoint_id]:
                    del self._held[checkpoint_id]

    @contextmanager
    def frozen(self) -> Iterator[set[str]]:
        """The checkpoints held now; no new hold begins until the block ends (retention
        prunes in it)."""
        with self._lock:
            yield set(self._held)
