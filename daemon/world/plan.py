"""A restore's plan and its application, layer by layer.

The plan is made, and may fail, before anything changes: every layer opened by
identity, every blob it will write verified, the current state captured. Only then is
the journal written (journal.py), and the layers brought to the target one by one.
A new restore (restore.py) and the completion of an interrupted one (session_lock.py,
recovery.py) apply a plan the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from worldline.wire.errors import ResourceExhausted

from .. import history, owners, progress
from ..capture import chunks
from ..capture.exclude import covers
from ..capture.layers import CONTAINER, WORKSPACE, Layer
from ..capture.snapshotter import Capture
from ..capture.trees import FILE, MAPPED, Diff, TreeReader, diff, entry_at, entry_key
from ..faults import crash_point
from ..records import Checkpoint, Session
from ..session_spec import SessionSpec
from .core import Core
from .hold import ContainerHold


@dataclass
class LayerPlan:
    """What a restore will do to one layer (``Plans.plan``)."""

    layer: Layer
    current: Capture
    seen: object  # the tracker's changes the capture looked at (None without a tracker)
    want: str
    changes: Diff
    size: int
    unsaved: str = ""  # why ``current`` was not stored (a persisting plan: a limit)
    size_after: int | None = None  # a restore of some paths: the bytes of ``want``

    def journal(self) -> dict:
        """Each path to change, as it is and as it will be (entry_key), for the journal."""
        paths = {}
        trees = self.layer.snap.trees
        for path in self.changes.added + self.changes.modified + self.changes.deleted:
            paths[path] = [entry_key(entry_at(trees, self.current.root, path,
                                              self.current.trees)),
                           entry_key(entry_at(trees, self.want, path))]
        return {"kind": self.layer.kind, "path": self.layer.path, "paths": paths}


def bases(cp: Checkpoint) -> list[str | None]:
    """A checkpoint's tree of each layer, in the order of ``Core.layers``."""
    return [cp.tree, cp.container]


class Plans:
    def __init__(self, core: Core, hold: ContainerHold) -> None:
        self.core = core
        self.hold = hold

    def plan(self, session: Session, head: Checkpoint, target: Checkpoint,
             mapped: dict[str, frozenset[str]] | None = None, persist: bool = False,
             paths: list[str] | None = None) -> list[LayerPlan]:
        """What a restore will change in each layer, checked before anything changes:
        every layer opened by identity, every blob it will write verified (a corrupt one
        fails the restore with DATA_LOSS), the current state captured (with ``persist``,
        stored, for the checkpoint taken before the restore; a layer a limit keeps from
        being stored is captured again without, and its plan says why: ``unsaved``).
        ``mapped``: of a paused container (a dry run); a restore stops the container
        first. ``paths``: only those of the workspace are brought to the target; every
        other path of every layer stays as it is."""
        core = self.core
        trees, blobs = core.trees, core.blobs
        plans = []
        agent = SessionSpec.parse(session.spec).owner
        for layer, base, want in zip(core.layers(session), bases(head), bases(target),
                                     strict=False):
            unsaved = ""
            try:
                current, seen = layer.capture(base, persist=persist, consume=False,
                                              mapped=mapped)
            except ResourceExhausted as exc:
                if not persist:
                    raise
                unsaved = exc.message
                current, seen = layer.capture(base, persist=False, consume=False,
                                              mapped=mapped)
            size_after = None
            if paths and unsaved:  # the restore's checkpoint would name files never stored
                raise ResourceExhausted(f"{unsaved}: a restore of some paths keeps the rest"
                                        " of the world, which must be stored first")
            if paths and layer.kind == WORKSPACE:
                graft = history.Graft(trees, blobs, current.trees, persist)
                want, size_after = graft.apply(current.root, target.tree, paths)
                current = replace(current, trees=graft.trees)
            elif paths:
                want = current.root
            if agent is not None:  # it writes and removes only its user's own files,
                # and writes back none its user could not make (an older tree may hold one)
                owners.check_entries(trees, base, current.root, agent, current.trees,
                                     "nothing was restored")
                if want is not None:
                    owners.check_entries(trees, current.root, want, agent,
                                         current.trees, "nothing was restored")
            changes = restore_diff(trees, layer, current, want)
            size = 0
            for path in changes.added + changes.modified:
                entry = entry_at(trees, want, path, current.trees)
                if entry is not None and entry.has_content:
                    blobs.verify(entry.ref)
                    if entry.kind in MAPPED:  # less the chunks the file there holds
                        have = entry_at(trees, current.root, path, current.trees)
                        for piece in chunks.needed(blobs, entry.ref, have):
                            blobs.verify(piece)
                    size += entry.size if entry.kind == FILE else 0
            plans.append(LayerPlan(layer, current, seen, want, changes, size, unsaved,
                                   size_after))
        return plans

    def apply(self, session: Session, head: Checkpoint, target: Checkpoint,
              entry: dict, before: Callable[[list[LayerPlan]], None] | None = None,
              paths: list[str] | None = None) -> tuple[list[LayerPlan], list[str]]:
        """Bring every layer to the target: the container stopped meanwhile, then started
        again if it was running. The plan is made (and may fail) before the journal is
        written, so a restore refused up front leaves no journal; the journal names
        every path the restore will change, in each layer, as it was and as it will be,
        so a restart can tell whether the layers are still as the restore left them.
        ``before(plans)``, given by a new restore: called once the plan is made (its
        capture stored), before the journal (restore.py, the checkpoint before)."""
        with self.hold.stopped(session):
            crash_point("restore.stopped")
            plans = self.plan(session, head, target, persist=before is not None,
                              paths=paths)
            if before is not None:
                before(plans)
            crash_point("restore.planned")
            self.core.journal.write(entry | {"layers": [p.journal() for p in plans]})
            crash_point("restore.after_journal")
            warnings: list[str] = []
            for plan in plans:
                progress.begin(f"restore: {plan.layer.kind}", plan.size)
                warnings += [f"{plan.layer.kind}: {w}" if plan.layer.kind == CONTAINER else w
                             for w in plan.layer.snap.apply(plan.current, plan.want)]
                if plan.seen is not None and not plan.seen.full and (
                        plan.layer.snap.restore_exclusions(plan.current, plan.want) is None):
                    # (under exclusions the layer is the target but for what they left
                    # as it was: the next capture scans it all)
                    plan.layer.now_equals(plan.want)
                crash_point("restore.between_layers")
            return plans, warnings


def restore_diff(trees: TreeReader, layer: Layer, current: Capture, want: str) -> Diff:
    """What a restore from ``current`` to ``want`` changes: the paths that differ less
    those its exclusions leave as they are (exclude.py)."""
    changes = diff(trees, current.root, want, current.trees)
    excluded = layer.snap.restore_exclusions(current, want)
    if excluded is None:
        return changes

    def kept(paths: list[str], root: str) -> list[str]:
        out = []
        for path in paths:
            entry = entry_at(trees, root, path, current.trees)
            if not covers(excluded, path, entry is not None and entry.is_folder):
                out.append(path)
        return out
    return Diff(kept(changes.added, want), kept(changes.modified, want),
                kept(changes.deleted, current.root))
