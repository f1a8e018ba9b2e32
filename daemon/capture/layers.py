"""Layers: the folders a session's world is made of, all captured the same way.

A session's world has a *workspace* layer and, with a container, a *container*
layer: the container's writable layer, overlay2's upper folder. Each layer pairs a
snapshotter with the change tracker of its folder; the World checkpoints, restores
and forks layers without caring which is which.
"""

from __future__ import annotations

from dataclasses import dataclass

from .snapshot import WorkspaceSnapshotter
from .snapshotter import Capture
from .tracker import Changes, WorkspaceTracker
from .trees import links_of

WORKSPACE, CONTAINER = "workspace", "container"


@dataclass
class Layer:
    kind: str  # WORKSPACE | CONTAINER
    path: str
    snap: WorkspaceSnapshotter
    tracker: WorkspaceTracker | None

    def capture(self, base: str | None, persist: bool = True, consume: bool = True,
                mapped: dict[str, frozenset[str]] | None = None
                ) -> tuple[Capture, Changes | None]:
        """Capture the layer relative to ``base`` (the tree of the head checkpoint).
        ``mapped``: by layer kind, the files mapped shared and writable now
        (mappings.py; ``ContainerHold.paused`` yields it).

        With ``consume`` the tracker's changes are taken; the caller must either
        ``commit`` the capture or ``give_back`` the changes."""
        changes = None
        if self.tracker is not None:
            changes = self.tracker.prepare() if consume else self.tracker.peek()
            if not self._picture_of(base):
                changes.full = True  # the tracker's picture is relative to another tree
        try:
            return (self.snap.capture(persist=persist, changes=changes, base=base,
                                       mapped=(mapped or {}).get(self.kind, frozenset())),
                    changes)
        except BaseException:
            self.give_back(changes if consume else None)
            raise

    def scans_everything(self, base: str | None) -> bool:
        """Whether the next capture will be a full scan (no tracker, no history, a
        fallback pending, or a picture taken against another tree)."""
        return (self.tracker is None or not self._picture_of(base)
                or self.tracker.full_scan_next)

    def _picture_of(self, base: str | None) -> bool:
        """Whether the tracker's changes are relative to ``base``."""
        return base is not None and self.tracker.base == base

    def give_back(self, changes: Changes | None) -> None:
        if self.tracker is not None and changes is not None:
            self.tracker.give_back(changes)

    def committed(self, capture: Capture) -> None:
        """The capture is recorded: the stat cache learns it, the tracker starts from it."""
        self.snap.commit(capture)
        self.now_equals(capture.root, set(capture.links))

    def now_equals(self, tree: str, linked: set[str] | None = None) -> None:
        """The folder is now ``tree`` plus whatever the tracker has seen since. The next
        capture looks again at every file with other hard links (``linked``: the tree's
        link groups unless given), as it must to carry the groups forward."""
        if self.tracker is None:
            return
        if linked is None:
            groups = self.snap.trees.link_groups(links_of(self.snap.trees.read(tree).own))
            linked = {p for g in groups for p in g}
        self.tracker.base = tree
        self.tracker.linked = linked
