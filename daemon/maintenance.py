"""fsck and garbage collection over the whole history.

fsck reads every checkpoint's trees, state and task list, verifies every stored
blob against its digest, checks that parents and heads exist, and verifies the
audit log's hash chain. gc is mark-and-sweep: everything reachable from any
checkpoint (or named by the stat cache) is kept, and a blob younger than the grace
period is never swept, so a checkpoint being taken while gc runs loses nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from worldline.client.errors import DataLoss, NotFound

from .records import GENESIS_HASH, chain_hash
from .trees import FILE
from .world import World

GC_GRACE_SECONDS = 600.0


@dataclass
class FsckReport:
    problems: list[str] = field(default_factory=list)
    blobs_checked: int = 0
    checkpoints_checked: int = 0
    repaired: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def reachable(world: World, problems: list[str] | None = None) -> set[str]:
    """Every digest that some checkpoint needs (trees, files, states, task lists)."""
    seen: set[str] = {world.empty_tree, world.empty_state}
    for cp in world.store.list_checkpoints():
        for digest in (cp.state_digest, cp.tasks_digest):
            seen.add(digest)
        _mark_tree(world, cp.tree, seen, problems, f"checkpoint {cp.id}")
    return seen


def _mark_tree(world: World, root: str, seen: set[str], problems, where: str) -> None:
    stack = [root]
    while stack:
        digest = stack.pop()
        if digest in seen:
            continue
        seen.add(digest)
        try:
            tree = world.trees.read(digest)
        except (NotFound, DataLoss) as exc:
            if problems is None:
                raise
            problems.append(f"{where}: tree {digest}: {exc.message}")
            continue
        for entry in tree.values():
            if entry.is_folder:
                stack.append(entry.ref)
            elif entry.kind == FILE:
                seen.add(entry.ref)


def fsck(world: World, repair: bool = False) -> FsckReport:
    report = FsckReport()
    store, blobs = world.store, world.blobs
    checkpoints = store.list_checkpoints()
    known = {cp.id for cp in checkpoints}
    for session in store.list_sessions():
        if session.head not in known:
            report.problems.append(f"session {session.id}: head {session.head} does not exist")
    for cp in checkpoints:
        report.checkpoints_checked += 1
        if cp.parent_id and cp.parent_id not in known:
            report.problems.append(f"checkpoint {cp.id}: parent {cp.parent_id} does not exist")
    needed = reachable(world, report.problems)
    stored = set()
    for digest in blobs.digests():
        stored.add(digest)
        report.blobs_checked += 1
        try:
            blobs.read_bytes(digest)
        except DataLoss:
            if digest in needed:
                report.problems.append(f"blob {digest} is corrupt and needed")
            elif repair:
                blobs.delete(digest)
                report.repaired.append(f"removed corrupt unreferenced blob {digest}")
            else:
                report.problems.append(f"blob {digest} is corrupt (unreferenced; --repair removes)")
    for digest in sorted(needed - stored):
        report.problems.append(f"blob {digest} is needed but missing")
    report.problems.extend(verify_audit(world)[1])
    return report


def verify_audit(world: World) -> tuple[int, list[str]]:
    problems = []
    prev = GENESIS_HASH
    events = world.store.list_audit()
    for i, event in enumerate(events, 1):
        if event.seq != i:
            problems.append(f"audit event {event.seq}: expected sequence number {i}")
        if event.prev_hash != prev:
            problems.append(f"audit event {event.seq}: chain broken (prev hash differs)")
        if chain_hash(event.prev_hash, event) != event.hash:
            problems.append(f"audit event {event.seq}: hash does not match its content")
        prev = event.hash
    return len(events), problems


def gc(world: World, dry_run: bool = False, grace: float = GC_GRACE_SECONDS
       ) -> tuple[int, int]:
    """Remove unreachable blobs older than ``grace`` seconds; return (count, bytes)."""
    needed = reachable(world) | world.stat_cache.digests()
    cutoff = time.time() - grace
    removed = freed = 0
    for digest in list(world.blobs.digests()):
        if digest in needed or world.blobs.stored_at(digest) > cutoff:
            continue
        size = world.blobs.size(digest)
        if not dry_run:
            world.blobs.delete(digest)
        removed += 1
        freed += size
    return removed, freed

