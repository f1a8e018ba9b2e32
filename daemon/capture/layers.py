"""Layers: the folders a session's world is made of, all captured the same way.

A session's world has a *workspace* layer and, with a container, a *container*
layer: the container's writable layer, overlay2's upper folder. Each layer pairs a
snapshotter with the change tracker of its folder; the World checkpoints, restores
and forks layers without caring which is which.

The restore journal makes a restore all-or-nothing across a crash: once the restore
is planned (and before the first byte of any layer changes), the journal records the
session, the target, the checkpoint id the restore will append, and every path it
will change in each layer, as it is and as it will be. At the next start (or the
session's next operation), an entry left behind is completed only if the layers are
still as the restore left it; if anything else changed since, or a layer is gone,
the entry is set aside and the session marked ``needs_attention`` for an operator
(``World.resolve``). An entry whose checkpoint was already recorded is removed.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from ..storage.durable import replace_file
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
        (mappings.py; ``World._paused`` yields it).

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


class RestoreJournal:
    """One JSON file per session with a restore under way, written durably.

    Only this daemon writes the folder (its data root is its own, under its lock), so
    it knows which sessions may have an entry: ``get``, asked before every operation
    on a session, opens a file only for those (a set that may name more sessions than
    have files, never fewer)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.aside = os.path.join(folder, "set-aside")
        os.makedirs(self.aside, mode=0o700, exist_ok=True)
        self._maybe = {name.removesuffix(".json") for name in os.listdir(folder)
                       if name.endswith(".json")}

    def _path(self, session_id: str) -> str:
        return os.path.join(self.folder, f"{session_id}.json")

    def write(self, entry: dict) -> None:
        self._maybe.add(entry["session"])
        replace_file(self._path(entry["session"]), json.dumps(entry))

    def remove(self, session_id: str) -> None:
        try:
            os.unlink(self._path(session_id))
        except FileNotFoundError:
            pass
        self._maybe.discard(session_id)

    def targets(self) -> set[str]:
        """The checkpoints that the restores under way bring back, and those set aside
        for an operator would (``World.resolve`` may complete one)."""
        found = set()
        for session_id in list(self._maybe):
            entry = self.get(session_id)
            if entry is not None:
                found.add(entry.get("target"))
        for name in os.listdir(self.aside):
            if name.endswith(".json"):
                entry = self.get_set_aside(name.removesuffix(".json"))
                if isinstance(entry, dict):
                    found.add(entry.get("target"))
        found.discard(None)
        return found

    def get(self, session_id: str) -> dict | None:
        if session_id not in self._maybe:
            return None
        try:
            with open(self._path(session_id)) as f:
                return json.load(f)
        except FileNotFoundError:
            return None

    def set_aside(self, session_id: str) -> None:
        """Keep the entry for an operator (``World.resolve``), out of the way of starts."""
        try:
            os.replace(self._path(session_id), os.path.join(self.aside, f"{session_id}.json"))
        except FileNotFoundError:
            pass
        self._maybe.discard(session_id)

    def get_set_aside(self, session_id: str) -> dict | None:
        try:
            with open(os.path.join(self.aside, f"{session_id}.json")) as f:
                return json.load(f)
        except FileNotFoundError:
            return None

    def drop_set_aside(self, session_id: str) -> None:
        try:
            os.unlink(os.path.join(self.aside, f"{session_id}.json"))
        except FileNotFoundError:
            pass

    def entries(self) -> list[dict]:
        """Every entry of a restore under way; one that cannot be read is set aside."""
        out = []
        for name in sorted(os.listdir(self.folder)):
            path = os.path.join(self.folder, name)
            if name.endswith(".tmp"):
                os.unlink(path)  # never completed: the restore had not begun
                continue
            if not name.endswith(".json"):
                continue
            try:
                with open(path) as f:
                    entry = json.load(f)
                if not isinstance(entry, dict) or "session" not in entry:
                    raise ValueError("not a journal entry")
                out.append(entry)
            except (OSError, ValueError):
                os.replace(path, os.path.join(self.aside, name))
        return out
