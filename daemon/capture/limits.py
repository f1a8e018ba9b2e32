"""Resource limits: what one agent may make a checkpoint store.

A checkpoint past any limit fails with RESOURCE_EXHAUSTED naming the file or the
limit, before the file is read (sizes are known from ``fstat``), and nothing it
stored is referenced by any record (garbage collection takes it back). A file that
grows after its ``fstat`` is read within its ``allowance``: what it grew by counts
too. A layer's names are counted by the capture (``max_entries``): a full scan's walk
stops at the limit, before it holds more in memory. Defaults suit a coding agent's
workspace; an operator sets them with ``worldline daemon`` options.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from worldline.wire.errors import ResourceExhausted

from ..storage.reserve import room

GiB = 1 << 30


@dataclass(frozen=True)
class Limits:
    max_file_bytes: int = 8 * GiB  # data of one file (allocated bytes for a sparse one)
    max_file_size: int = 1 << 40  # logical size of one file (a sparse file's holes count)
    max_checkpoint_bytes: int = 16 * GiB  # bytes read from changed files in one checkpoint
    min_free_bytes: int = 1 * GiB  # free space the data root keeps
    # names (files, folders, links...) one layer may hold: a full scan holds about a
    # kilobyte of memory for each while it builds the trees
    max_entries: int = 2_000_000
    # free space above the floor kept for the daemon owner's sessions: an agent user's
    # checkpoints stop this much short of it, so that one agent filling the data root
    # through its checkpoints leaves the owner's sessions room
    owner_reserve: int = 0

    def budget(self, data_root: str | None) -> "Budget":
        return Budget(self, data_root)


def human(n: int) -> str:
    """A size as people read it: 1.5 GiB, 300 bytes."""
    for unit, size in (("GiB", GiB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} bytes"


class Budget:
    """What one capture may still read and store."""

    def __init__(self, limits: Limits, data_root: str | None) -> None:
        self.limits = limits
        self.used = 0
        self.left = limits.max_checkpoint_bytes
        self.floor_reason = ""
        if data_root is not None:
            free = room(data_root)
            floor = limits.min_free_bytes + limits.owner_reserve
            what = (f"its floor of {human(limits.min_free_bytes)} (--min-free-bytes)"
                    + (f" and the {human(limits.owner_reserve)} kept for the owner's"
                       " sessions (an agent user's checkpoint stops short of them)"
                       if limits.owner_reserve else ""))
            spare = free - floor
            if spare <= 0:
                raise ResourceExhausted(
                    f"the data root {data_root} has {human(free)} free, below {what}:"
                    " free space or run gc")
            if spare < self.left:
                self.left = spare
                self.floor_reason = f"the data root's free space above {what}"

    def check_file(self, path: str, st: os.stat_result, data_bytes: int) -> None:
        """Before a changed file is read: its logical size and its data bytes."""
        if st.st_size > self.limits.max_file_size:
            raise ResourceExhausted(
                f"{path} is {human(st.st_size)}, past the largest file size captured,"
                f" {human(self.limits.max_file_size)} (--max-file-size)")
        if data_bytes > self.limits.max_file_bytes:
            raise ResourceExhausted(
                f"{path} holds {human(data_bytes)} of data, past the largest file"
                f" captured, {human(self.limits.max_file_bytes)} (--max-file-bytes)")
        self.take(data_bytes, path)

    def allowance(self, data_bytes: int) -> int:
        """The most bytes a file ``check_file`` let in at ``data_bytes`` may hold when it
        is read: it may grow meanwhile (an agent's process on the host writes on), and
        what it grew by counts as changed bytes do (``take``), within the largest file."""
        return max(data_bytes, min(self.limits.max_file_bytes,
                                   data_bytes + self.left - self.used))

    def overread(self, path: str, data_bytes: int) -> ResourceExhausted:
        """The error for a file that held more than its ``allowance`` when read."""
        allowed = self.allowance(data_bytes)
        if allowed >= self.limits.max_file_bytes:
            why = (f"the largest file captured, {human(self.limits.max_file_bytes)}"
                   " (--max-file-bytes)")
        else:
            why = self.floor_reason or (f"the most new bytes per checkpoint,"
                                        f" {human(self.limits.max_checkpoint_bytes)}"
                                        " (--max-checkpoint-bytes)")
        return ResourceExhausted(f"{path} grew while it was read, from {human(data_bytes)}"
                                 f" to more than {human(allowed)},"
                                 f" past {why}")

    def check_entries(self, entries: int, layer: str) -> None:
        """After a capture: the names its layer holds."""
        if entries > self.limits.max_entries:
            raise self.too_many_entries(layer, entries)

    def too_many_entries(self, layer: str, entries: int | None = None) -> ResourceExhausted:
        """The error for a layer past ``max_entries`` (a walk stops there: ``entries``
        unknown)."""
        held = f"{entries:,}" if entries is not None else f"more than {self.limits.max_entries:,}"
        return ResourceExhausted(
            f"{layer} holds {held} entries (files, folders, links), past the most a layer"
            f" may hold, {self.limits.max_entries:,} (--max-entries): remove some, or start"
            " the daemon with a larger --max-entries")

    def take(self, n: int, path: str) -> None:
        self.used += n
        if self.used > self.left:
            why = self.floor_reason or (f"the most new bytes per checkpoint,"
                                        f" {human(self.limits.max_checkpoint_bytes)}"
                                        " (--max-checkpoint-bytes)")
            raise ResourceExhausted(f"the changed files reach {human(self.used)} at {path},"
                                    f" past {why}")
