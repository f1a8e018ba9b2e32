"""The idle repack: what `git gc` does for a repository at rest, for the pack.

A checkpoint stores each changed blob the fast way (a zstd delta at level 3 against the
version the same path had, or the whole blob as a zstd frame at level 3), because the agent
is waiting. Once the daemon is idle, the rows stored since the last repack are looked
at again, a few at a time, in row order:

- each is encoded against a *window* of candidate bases, at zstd's strongest level:
  its current base and that base's own bases (the same path's earlier versions), and
  the recent versions of files with the same name elsewhere (a file moved, copied or
  renamed; names come from the trees the repack reads on the way), and whole;
- the smallest encoding replaces the row when it saves at least an eighth, in a
  short transaction that also moves the rows depending on it to their new depth;
- freed pages go back to the file system (`PRAGMA incremental_vacuum`, a few pages
  per step), so the pack's file (meta.db, or an older root's blobs/pack.db) shrinks when gc or the
  repack frees space.

Rules that keep every blob readable, as the pack's own (packs.py): a row's bytes are
rebuilt and verified against its digest before anything is encoded from them; a new
base is a committed row that is neither the row itself nor any row depending on it
(no cycle), and the new chain stays within ``MAX_DEPTH``. Each step is one
transaction (the rows and the repack's mark together), so a kill at any moment leaves
the pack as it was before or after a step. A step yields to checkpoints: it applies
nothing while a put is encoding against a base or rows are pending a sync, and its
transaction is a few row updates.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from ..faults import crash_point
from .packs import MAX_DEPTH, RAW, SMALL, ZSTD, best_delta, zstd_whole

log = logging.getLogger("worldline.repack")

BATCH = 32  # rows looked at per step
WINDOW = 4  # earlier versions of the same path, and of the same name, tried as bases
VACUUM_PAGES = 256  # pages given back to the file system per step (1 MiB)
_NAMES = 20_000  # file names whose recent versions are remembered
RAW_KEPT = 16 << 10  # a raw row from this size with no base and no name: left as it is

# (name, digest) of the files a blob lists, if it is a tree; None for any other blob
NamesOf = Callable[[bytes], "list[tuple[str, str]] | None"]


@dataclass
class _Change:
    row_id: int
    digest: str
    kind: int
    base_id: int | None
    depth: int
    data: bytes
    old: tuple  # (kind, base id, stored length): the row as it was read


class _CallArrived(Exception):
    """A call arrived while a row was being encoded: the step ends before that row."""


class Repacker:
    """Repacks a LocalBlobStore's pack while the daemon is idle (``step``)."""

    def __init__(self, store, names_of: NamesOf | None = None) -> None:
        self.store = store
        self.pack = store.pack
        self.names_of = names_of
        self._versions: OrderedDict[str, list[str]] = OrderedDict()  # name -> digests
        self._name_of: OrderedDict[str, str] = OrderedDict()  # digest -> its file name
        self.rows_rewritten = 0
        self.bytes_saved = 0

    # -- the loop ------------------------------------------------------------------------
    def run(self, seconds: float, idle: Callable[[], bool]) -> int:
        """Steps for up to ``seconds`` while ``idle()`` holds; the rows rewritten."""
        before = self.rows_rewritten
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and idle():
            if not self.step(idle):
                break
        return self.rows_rewritten - before

    def step(self, idle: Callable[[], bool] = lambda: True) -> bool:
        """Repack the next few rows, or give a few free pages back; False when there
        was nothing left to do, or ``idle()`` stopped holding. It is asked before each
        row is read and before each of its encodings: a call that arrives waits for one
        read or one encoding at most (a read rebuilds and verifies a blob that may be
        large; an encoding of a blob of 1 MiB takes about half a second)."""
        through = self.pack.mark("repacked")
        rows = self.pack._all(
            "SELECT id, digest, kind, base, depth, length(data) FROM objects WHERE id > ?"
            " ORDER BY id LIMIT ?", (through, BATCH))
        if not rows:
            return self.pack.vacuum_step(VACUUM_PAGES)
        looked = []
        # Every row is read before any is encoded: a tree names the files of its
        # commit, which were stored before it (renames find their old versions so).
        for row_id, raw, kind, base_id, depth, stored in rows:
            if not idle():
                break
            digest = bytes(raw).hex()
            data = self._verified(digest)
            if data is not None:  # damaged or gone: verify and gc deal with it
                self._learn_names(data)
            looked.append((row_id, digest, kind, base_id, depth, stored, data))
        changes = []
        for i, row in enumerate(looked):  # encodings at the strongest level: slow
            if row[-1] is None:
                continue  # damaged or gone: verify and gc deal with it
            try:
                change = self._better(row, idle)
            except _CallArrived:
                looked = looked[:i]
                break
            if change is not None:
                changes.append(change)
        if not looked or not self._apply(changes, looked[-1][0]):
            return False  # a call or a checkpoint is under way: the next idle moment goes on
        crash_point("repack.step")
        return len(looked) == len(rows) or idle()

    # -- choosing --------------------------------------------------------------------------
    def _verified(self, digest: str) -> bytes | None:
        try:
            data = self.pack.read(digest)
        except Exception:
            return None
        return data if self.store.address(data) == digest else None

    def _learn_names(self, data: bytes) -> None:
        if self.names_of is None:
            return
        names = self.names_of(data)
        for name, digest in names or ():
            self._name_of[digest] = name
            self._name_of.move_to_end(digest)
            versions = self._versions.setdefault(name, [])
            if digest not in versions:
                versions.append(digest)
                del versions[:-WINDOW * 2]
            self._versions.move_to_end(name)
        while len(self._versions) > _NAMES:
            self._versions.popitem(last=False)
        while len(self._name_of) > _NAMES * 4:
            self._name_of.popitem(last=False)

    def _candidates(self, row_id: int, digest: str, base_id: int | None
                    ) -> list[tuple[int, str, int]]:
        """(row id, digest, depth) of committed rows to try as its base: older rows only,
        so newer versions build on older ones, as checkpoints store them."""
        found: list[tuple[int, str, int]] = []
        at = base_id
        while at is not None and len(found) < WINDOW:  # the same path's earlier versions
            r = self.pack._one("SELECT id, digest, depth, base FROM objects WHERE id = ?",
                               (at,))
            if r is None:
                break
            found.append((r[0], bytes(r[1]).hex(), r[2]))
            at = r[3]
        name = self._name_of.get(digest)
        for other in reversed(self._versions.get(name, []) if name else []):
            if other != digest and all(other != f[1] for f in found):
                r = self.pack.row_id(other)
                if r is not None and r[0] < row_id:
                    found.append((r[0], other, r[1]))
            if len(found) >= WINDOW * 2:
                break
        return found

    def _better(self, looked, idle: Callable[[], bool]) -> _Change | None:
        """The row's smallest encoding, or None when it is not worth a rewrite. Each
        encoding, whole and against each candidate base, is at zstd's strongest level
        (about half a second for a blob of 1 MiB): ``idle()`` is asked before each, and
        _CallArrived raised once it no longer holds, the row left for the next idle
        moment."""
        row_id, digest, kind, base_id, depth, stored, data = looked
        if (kind == RAW and base_id is None and stored >= RAW_KEPT
                and digest not in self._name_of):
            # the checkpoint's zstd found nothing to take from it (a chunk of a big file
            # of random bytes, say), and no earlier version names it a base to try
            return None
        if not idle():
            raise _CallArrived
        built_on = self.pack.below(row_id)
        height = max((d for d, _ in built_on.values()), default=depth) - depth
        best = _Change(row_id, digest, ZSTD, None, 0, zstd_whole(data, SMALL),
                       (kind, base_id, stored))
        whole = len(best.data)
        for cand_id, cand, cand_depth in self._candidates(row_id, digest, base_id):
            if cand_depth + 1 + height > MAX_DEPTH:
                continue
            if cand_id == row_id or cand_id in built_on:
                continue  # a cycle: the candidate is rebuilt from this row
            if not idle():
                raise _CallArrived
            base = self._verified(cand)
            if base is None:
                continue
            kind, delta = best_delta(base, data, SMALL)
            # a delta costs its readers a rebuild: it must at least halve the whole row
            if len(delta) < min(len(best.data), whole // 2):
                best = _Change(row_id, digest, kind, cand_id, cand_depth + 1, delta,
                               best.old)
        if len(best.data) > stored - max(stored // 8, 16):
            return None  # not worth a rewrite
        return best

    # -- applying --------------------------------------------------------------------------
    def _apply(self, changes: list[_Change], through: int) -> bool:
        store = self.store
        with store._lock:  # no put reads a base, and no row waits for a sync, meanwhile
            if store._pins or self.pack.pending or self.pack.committing:
                return False
            shifted = self.pack.rewrite(changes, "repacked", through)
            for digest in shifted:
                self.pack.forget_depth(digest)
        self.rows_rewritten += len(changes)
        self.bytes_saved += sum(c.old[2] - len(c.data) for c in changes)
        if changes:
            log.debug("repacked %d rows, %d bytes smaller", len(changes),
                      sum(c.old[2] - len(c.data) for c in changes))
        return True
