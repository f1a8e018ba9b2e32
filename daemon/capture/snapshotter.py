"""The Snapshotter contract: a layer of a world read into trees and blobs, and written
back from them.

Terms
    layer     a folder of files the snapshotter owns for a session: a workspace, a
              fork's view, or a Docker container's writable (overlay upper) layer
    tree      a folder's listing stored by digest (trees.py); a layer's state is the
              digest of its root tree, the tree's files are blobs (BlobStore)
    capture   one reading of the layer: a ``Capture`` (below), its ``root`` that digest
    changes   a change tracker's report (tracker.Changes): the paths that may differ
              from the tree ``base`` since it was captured; ``full`` when it knows nothing
    stat cache what each file looked like when last read (statcache.py), so an
              unchanged file is not read again

Operations
- ``capture(persist=True, changes=None, base=None, mapped=frozenset())`` reads the
  layer and returns a ``Capture`` whose ``root`` is the digest of its root tree. With
  ``persist`` the blobs and trees are stored (not yet synced: the caller calls
  ``BlobStore.sync()`` once, for every layer of a checkpoint); without it nothing is
  written anywhere and the new trees travel in ``Capture.trees`` (a restore's plan, a
  diff against the live folder). ``changes`` names the paths that may differ from the
  tree ``base``; only those are examined and only the trees on their paths rewritten.
  Without them, or when they say ``full``, the whole layer is examined, the stat cache
  sparing the reads of unchanged files. ``mapped``: files mapped shared and writable
  now (mappings.py), read again whatever their stat says.
- ``apply(current, target_root)`` makes the layer equal to the tree ``target_root``,
  touching only what differs from ``current`` (a fresh capture, usually one that
  stored nothing); it returns the warnings (what it could not bring back exactly, as
  texts). Every file is written aside and renamed into place; nothing is ever written
  through a symlink or outside the layer. An entry that is no longer what ``current``
  saw (the layer changing under the write) is left alone and named in the warnings,
  never overwritten unseen (apply.py has the rules).
- ``commit(capture)`` records what a persisted capture learnt (the stat cache's
  entries and folder memos). A capture that stored nothing commits nothing.

Guarantees
- The same files give the same ``root``, whichever implementation read them and
  whether they were read in full or through ``changes``.
- A capture never changes the layer; an apply changes nothing outside it.
- Bad input from the layer (a name that is not allowed, a layer over the limits)
  raises the error its code says (InvalidArgument, ResourceExhausted, ...), with
  nothing stored that any record references.

Lifecycle of a checkpoint
    capture(persist=True) -> BlobStore.sync() -> the store records the checkpoint
    (its metadata durable) -> commit(capture)
``commit`` comes last: the stat cache may vouch for a file only once the blobs it names
and the record that references them are durable (a crash before it costs a rehash,
never a file). A restore: capture(persist=False) -> apply(current, target_root) ->
a capture of the result recorded as above.

Implementations: ``WorkspaceSnapshotter`` in snapshot.py and ``MemorySnapshotter``
(the reference) in memory_snapshot.py; tests/test_snapshotter_contract.py holds
every one to this contract.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from . import exclude
from .statcache import Memo
from .tracker import Changes
from .trees import Tree


@dataclass
class Capture:
    """One reading of a layer (``Snapshotter.capture``): its root tree's digest and what
    the reading learnt, for ``commit`` and for a restore's plan."""

    root: str
    bytes: int
    # what a capture that stores nothing made, by digest: its trees (and the root's
    # hard-link groups, a list), read through TreeReader's ``pending``
    trees: dict[str, Tree | list] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    seen: dict[str, tuple] = field(default_factory=dict)  # stat cache entries learnt
    persisted: bool = True
    full: bool = True  # every file was examined (not just a tracker's changes)
    memos: dict[str, Memo | None] = field(default_factory=dict)  # folder memos (None: drop)
    reused: set[str] = field(default_factory=set)  # folders whose memo held
    links: dict[str, int] = field(default_factory=dict)  # files with hard links: inode
    # files mapped shared and writable as it read them: their stat cache entries go
    mapped: frozenset[str] = frozenset()
    entries: int = 0  # names in the layer (every folder's), within --max-entries
    # a look that stores nothing (a restore's plan): the inode of each entry it stat'ed,
    # which the restore's writes check each entry against (apply.py)
    inodes: dict[str, int] = field(default_factory=dict)
    # the exclusions the capture obeyed (exclude.py), which a restore planned from it
    # obeys too; None: none
    excluded: exclude.Exclusions | None = None


class Snapshotter(Protocol):
    """A layer read into trees and written back; the module's docstring is the
    contract."""

    def capture(self, persist: bool = True, changes: Changes | None = None,
                base: str | None = None, mapped: frozenset[str] = frozenset()
                ) -> Capture: ...

    def apply(self, current: Capture, target_root: str) -> list[str]: ...

    def commit(self, capture: Capture) -> None: ...


class Watcher(Protocol):
    """A change tracker, as the snapshotter sees it: a full scan hands it each folder it
    opens (``watch_folder``), and tells it what the capture excluded."""

    excluded: Callable[[str, bool], bool] | None  # what the last capture excluded

    def watch_folder(self, rel: str, fd: int) -> None: ...

    def scanning(self) -> contextlib.AbstractContextManager[
        tuple[int, int, Callable[[list[tuple[str, int]]], None]]]: ...
