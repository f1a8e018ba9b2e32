"""fsck, retention and garbage collection over the whole history.

fsck reads every kept checkpoint's trees, state and task list, verifies every
stored blob against its digest, checks that parents and heads exist, and verifies
the audit log's hash chain. On a fleet it reads the durable copy: every object the
blob index names, from the bucket (a staged one from its row), each blob verified in
memory, nothing written to the host's cache, so a host whose cache holds every blob
still sees what the bucket lost, and a host with a full disk still reports
(``--cached``: the quick check of before, through the cache). Each missing or
damaged blob is named with the checkpoints and files it breaks (``_uses``: a walk of
the kept checkpoints' trees, each tree once); ``--repair`` puts good copies the host
holds (its cache, or another data root: ``repair_from``) back in the bucket under
new write-once names (S3BlobStore.mend).

Retention prunes checkpoints: a pruned checkpoint keeps its record (lineage,
conversation, state, tasks, audit) but no longer its trees. A checkpoint is kept
when any policy keeps it (the last N of its session, a labelled one, one newer than
T) and always when something live needs it: a session's head, a fork's source, the
checkpoint of a pending approval.

gc is mark-and-sweep: everything reachable from a kept checkpoint (or named by the
stat cache) is kept; a blob stored or reused within the grace period is never
swept, and the sweep re-checks that age atomically with respect to puts, so a
checkpoint taken while gc runs loses nothing. gc also removes the container images
worldline made for checkpoints that no longer exist or were pruned, and the fork
views no mounted fork uses.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import time
from dataclasses import dataclass, field

from worldline.wire.errors import (
    Aborted,
    DataLoss,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
)

from . import ids, progress
from .capture import chunks
from .capture.containers import LABEL_CHECKPOINT, LABEL_ROOT
from .capture.trees import CHUNKED, FILE, MAPPED, TreeReader, links_of
from .faults import crash_point
from .records import GENESIS_HASH, AuditEvent, Checkpoint, chain_hash
from .world import World

log = logging.getLogger(__name__)

GC_GRACE_SECONDS = 600.0


@dataclass
class BrokenBlob:
    """A blob fsck found missing or damaged where it is durable, and what it breaks."""
    digest: str
    object: str  # where the index places it ("" on one host, or when no row names it)
    state: str  # "missing" | "damaged"
    reason: str
    checkpoints: list[str] = field(default_factory=list)  # kept checkpoints that need it
    files: list[tuple[str, str]] = field(default_factory=list)  # (checkpoint, path)
    mended_to: str = ""  # the object --repair put a good copy in


@dataclass
class FsckReport:
    problems: list[str] = field(default_factory=list)
    blobs_checked: int = 0
    checkpoints_checked: int = 0
    repaired: list[str] = field(default_factory=list)
    source: str = "local"  # what was read: "bucket", "cache" (--cached), "local" (one host)
    subset: str = ""  # --read-data-subset, as given ("": everything)
    objects_checked: int = 0  # the bucket's objects read (source "bucket")
    objects_total: int = 0  # ...of those the index names
    bytes_read: int = 0
    broken: list[BrokenBlob] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)  # what could not be read, and why
    not_repaired: list[str] = field(default_factory=list)  # what --repair could not mend

    @property
    def ok(self) -> bool:
        return not self.problems and not self.unchecked


class Subset:
    """``--read-data-subset``: ``N%`` (each object, or blob, chosen with that chance,
    afresh each run, as restic's ``check --read-data-subset``) or ``n/m`` (the n-th of
    m fixed parts: m runs, one of each part, read everything once); "" is all."""

    def __init__(self, text: str) -> None:
        self.text = text = text.strip()
        self.share, self.part = 1.0, None
        self._seed = os.urandom(8).hex()
        if not text:
            return
        share = re.fullmatch(r"(\d+(?:\.\d+)?)%", text)
        part = re.fullmatch(r"(\d+)/(\d+)", text)
        if share and 0 < float(share.group(1)) <= 100:
            self.share = float(share.group(1)) / 100
        elif part and 1 <= int(part.group(1)) <= int(part.group(2)):
            self.part = (int(part.group(1)) - 1, int(part.group(2)))
        else:
            raise InvalidArgument(f"--read-data-subset {text!r} is not N% (0 < N <= 100)"
                                  " or n/m (1 <= n <= m)")

    def takes(self, name: str) -> bool:
        if self.part is not None:
            return _hashed(name) % self.part[1] == self.part[0]
        return self.share >= 1.0 or _hashed(self._seed + name) < self.share * 2 ** 64


def _hashed(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


@dataclass
class Retention:
    keep_last: int = 0  # the newest N of each session
    keep_labelled: bool = False  # checkpoints a caller labelled
    keep_newer_than: float = 0.0  # seconds

    @property
    def active(self) -> bool:
        return bool(self.keep_last or self.keep_labelled or self.keep_newer_than)


@dataclass
class GcReport:
    blobs_removed: int = 0
    bytes_freed: int = 0
    checkpoints_pruned: int = 0
    images_removed: int = 0
    views_removed: int = 0


def reachable(world: World, problems: list[str] | None = None,
              without: set[str] | frozenset[str] = frozenset(),
              held: set[str] | frozenset[str] = frozenset(),
              reads: _Reads | None = None) -> set[str]:
    """Every digest that some kept checkpoint needs (trees, files, states, task lists);
    ``without``: checkpoints counted as pruned already (a dry run's, of what the sweep
    would free once they are); ``held``: pruned ones whose trees still count;
    ``reads``: how trees are read (fsck's: nothing written to a cache)."""
    reads = reads or _Reads(world.trees, world.blobs)
    seen: set[str] = {world.empty_tree, world.empty_state}
    checkpoints = world.store.list_checkpoints()
    progress.begin("marking what checkpoints need", len(checkpoints), "checkpoints")
    for cp in checkpoints:
        progress.advance()
        seen.update((cp.state_digest, cp.tasks_digest))
        if (cp.pruned and cp.id not in held) or cp.id in without:
            continue
        for root in (cp.tree, cp.container):
            if root:
                _mark_tree(reads, root, seen, problems, f"checkpoint {cp.id}")
    return seen


@dataclass
class _Reads:
    """Where a walk reads trees and extent maps from."""
    trees: TreeReader
    blobs: object  # anything with read_bytes


class _Uncached:
    """A blob store's reads that write nothing to its cache (S3BlobStore.read_uncached)."""

    def __init__(self, blobs) -> None:
        self.read_bytes = blobs.read_uncached


def _fsck_reads(world: World) -> _Reads:
    """fsck's reads: on a fleet, none fills the cache (so none needs disk space)."""
    if getattr(world.blobs, "read_uncached", None) is None:
        return _Reads(world.trees, world.blobs)
    blobs = _Uncached(world.blobs)
    return _Reads(TreeReader(blobs), blobs)


def _mark_tree(reads: _Reads, root: str, seen: set[str], problems, where: str) -> None:
    stack = [root]
    while stack:
        digest = stack.pop()
        if digest in seen:
            continue
        seen.add(digest)
        try:
            tree = reads.trees.read(digest)
        except (NotFound, DataLoss) as exc:
            if problems is None:
                raise
            problems.append(f"{where}: tree {digest}: {exc.message}")
            continue
        links = links_of(tree.own)
        if links:
            seen.add(links)  # the layer's hard-link groups
        for entry in tree.values():
            if entry.is_folder:
                stack.append(entry.ref)
            elif entry.kind == FILE:
                seen.add(entry.ref)
            elif entry.kind in MAPPED:
                seen.add(entry.ref)  # the map, and the pages and chunks it names
                found: list[str] = []
                seen.update(chunks.refs_safe(reads.blobs, entry.ref,
                                             None if problems is None else found))
                if problems is not None:
                    problems += [f"{where}: {p}" for p in found]


def fsck(world: World, repair: bool = False, cached: bool = False, subset: str = "",
         repair_from: str = "") -> FsckReport:
    """Check the history (module docstring). ``cached``: through a fleet host's cache
    (verified there, fetched into it where missing), not from the bucket; ``subset``:
    read only that share of the objects (of the blobs: one host, ``cached``);
    ``repair_from``: a data root whose blobs ``repair`` may take good copies from."""
    share = Subset(subset)
    blobs = world.blobs
    bucket = getattr(blobs, "check_objects", None) is not None and not cached
    if repair_from and not (repair and bucket):
        raise InvalidArgument("--repair-from mends a fleet's bucket: give it with --repair,"
                              " without --cached")
    sources = (_data_root_blobs(repair_from, getattr(world.blobs, "key", None))
               if repair_from else [])
    try:
        report = FsckReport(source="bucket" if bucket else "local" if blobs.local else "cache",
                            subset=share.text)
        store = world.store
        report.problems.extend(store.sealed_problems())  # with a key: every tag checked
        checkpoints = store.list_checkpoints()
        known = {cp.id for cp in checkpoints}
        for session in store.list_sessions():
            if session.head not in known:
                report.problems.append(f"session {session.id}: head {session.head} does not"
                                       " exist")
        for cp in checkpoints:
            report.checkpoints_checked += 1
            if cp.parent_id and cp.parent_id not in known:
                report.problems.append(f"checkpoint {cp.id}: parent {cp.parent_id} does not"
                                       " exist")
        reads = _fsck_reads(world)
        walked: list[str] = []  # trees the walk could not read
        needed = reachable(world, walked, reads=reads)
        if bucket:
            stored = _check_bucket(world, report, share)
        else:
            stored = _check_blobs(world, report, share, needed, repair)
        report.broken.extend(BrokenBlob(digest, "", "missing", "no blob store row names it")
                             for digest in sorted(needed - stored))
        _uses(world, reads, report.broken, checkpoints)
        if repair and bucket and report.broken:
            try:
                with store.gc_lock():  # no rewrite of the same objects meanwhile, anywhere
                    _mend(world, report, sources)
            except Aborted as exc:  # another host collects: the report stands, unmended
                report.not_repaired.extend(f"blob {b.digest}: not mended: {exc.message}"
                                           for b in report.broken)
            if walked and any(b.mended_to for b in report.broken):
                walked = []  # what the walk could not read may read now: walked again
                reachable(world, walked, reads=_fsck_reads(world))
        report.problems.extend(walked)
        left = [b for b in report.broken if not b.mended_to]
        report.problems.extend(_by_object(left, needed))
        report.problems.extend(_described(b, b.digest in needed) for b in left)
        report.problems.extend(verify_audit(world)[1])
        return report
    finally:
        for source in sources:
            source.close()


def _data_root_blobs(root: str, key=None):
    """The blob store of a data root (another host's, a backup), for --repair-from;
    ``key``: this daemon's data key (a fleet's hosts share it)."""
    from .storage.blobs import LocalBlobStore
    from .storage.config import pack_file
    found = pack_file(root)
    if not os.path.isdir(os.path.join(root, "blobs")) or not os.path.isfile(found):
        raise InvalidArgument(f"--repair-from {root!r} is not a worldline data root (no"
                              " blobs folder, or no pack beside it)")
    return [LocalBlobStore(os.path.join(root, "blobs"), durable=False, pack_file=found,
                           key=key)]


def _check_bucket(world: World, report: FsckReport, share: Subset) -> set[str]:
    """The bucket's objects read and verified (S3BlobStore.check_objects); returns the
    digests the index names."""
    check = world.blobs.check_objects(share.takes)
    report.objects_total, report.objects_checked = check.objects_total, check.objects_checked
    report.bytes_read, report.blobs_checked = check.bytes_read, check.blobs_checked
    report.unchecked.extend(check.unchecked)
    report.broken.extend(BrokenBlob(b.digest, b.object, b.state, b.reason)
                         for b in check.broken)
    return set(world.blobs.digests())


def _by_object(broken: list[BrokenBlob], needed: set[str]) -> list[str]:
    """A line for each object of the bucket that ``broken`` (not mended) names."""
    by_object: dict[str, list[BrokenBlob]] = {}
    for b in broken:
        if b.object:
            by_object.setdefault(b.object, []).append(b)
    lines = []
    for name, found in sorted(by_object.items()):
        lost = sum(b.digest in needed for b in found)
        what = "missing from the bucket" if found[0].state == "missing" else "damaged"
        lines.append(f"object {name}: {what}: {len(found)} blob(s) it holds cannot be read,"
                     f" {lost} of them needed by kept checkpoints")
    return lines


def _check_blobs(world: World, report: FsckReport, share: Subset, needed: set[str],
                 repair: bool) -> set[str]:
    """Every stored blob (of the subset) verified where the store reads it: one host's
    data root, or a fleet host's cache (``--cached``); returns the digests stored."""
    blobs = world.blobs
    stored = set()
    for digest in blobs.digests():
        stored.add(digest)
        if not share.takes(digest):
            continue
        report.blobs_checked += 1
        try:
            try:
                blobs.verify(digest)
            except ResourceExhausted as exc:  # the cache has no room for it: in memory
                if getattr(blobs, "read_uncached", None) is None:
                    report.unchecked.append(f"blob {digest}: {exc.message}")
                    continue
                blobs.read_uncached(digest)
        except DataLoss as exc:
            if digest in needed:
                report.broken.append(BrokenBlob(digest, "", "damaged", exc.message))
            elif repair:
                blobs.delete(digest)
                report.repaired.append(f"removed corrupt unreferenced blob {digest}")
            else:
                report.problems.append(f"blob {digest} is corrupt (unreferenced; --repair"
                                       " removes)")
        except NotFound:
            continue  # swept meanwhile
    return stored


def _mend(world: World, report: FsckReport, sources: list) -> None:
    """--repair on a fleet: good copies of the broken blobs this host holds, put back in
    the bucket (S3BlobStore.mend); what could not be mended, said."""
    done, why = world.blobs.mend({b.digest: b.object for b in report.broken if b.object},
                                 sources)
    for b in report.broken:
        if b.digest in done:
            b.mended_to = done[b.digest]
            report.repaired.append(f"blob {b.digest}: a good copy from this host is in"
                                   f" {b.mended_to} (was {b.state} in {b.object})")
        else:
            reason = why.get(b.digest, "no row of the blob index names it: nothing to"
                             " point at a copy")
            report.not_repaired.append(f"blob {b.digest}: {reason}")


def _described(b: BrokenBlob, needed: bool) -> str:
    where = f" in {b.object}" if b.object else ""
    text = f"blob {b.digest}{where} is {b.state} ({b.reason})"
    if not needed:
        return text + "; no kept checkpoint needs it"
    if not b.checkpoints:
        return text + "; needed"
    text += f"; it breaks {len(b.checkpoints)} checkpoint(s): " + _some(b.checkpoints)
    files = [f"{cp} {path}" for cp, path in b.files]
    return text + (f"; files: {_some(files)}" if files else "")


def _some(items: list[str], shown: int = 3) -> str:
    more = len(items) - shown
    return ", ".join(items[:shown]) + (f" and {more} more" if more > 0 else "")


def _uses(world: World, reads: _Reads, broken: list[BrokenBlob], checkpoints) -> None:
    """Fill in, for each broken blob, the kept checkpoints that need it and the paths
    it breaks there (``container:`` before a path in the container's layer; a folder
    whose tree is broken as ``path/``; ``(state)``, ``(task list)``). The reverse of
    gc's mark: each checkpoint's trees walked, each tree once (``_bad_below``)."""
    bad = {b.digest: b for b in broken}
    if not bad:
        return
    memo: dict[str, list[tuple[str, str]]] = {}
    for cp in checkpoints:
        found: list[tuple[str, str]] = []
        for digest, what in ((cp.state_digest, "(state)"), (cp.tasks_digest, "(task list)")):
            if digest in bad:
                found.append((what, digest))
        if not cp.pruned:
            for prefix, root in (("", cp.tree), ("container:", cp.container)):
                if root:
                    found += [(prefix + path, d) for path, d in _bad_below(reads, root, bad,
                                                                           memo)]
        for path, digest in found:
            b = bad[digest]
            if not b.checkpoints or b.checkpoints[-1] != cp.id:
                b.checkpoints.append(cp.id)
            b.files.append((cp.id, path or "/"))


def _bad_below(reads: _Reads, root: str, bad, memo: dict) -> list[tuple[str, str]]:
    """(path under ``root``, broken digest) for everything below the tree ``root`` that
    needs a blob of ``bad``; ``memo`` keeps each tree's answer (trees are shared by
    many checkpoints). Iterative: a hostile agent's folders may nest deep."""
    opened: dict[str, dict] = {}
    stack = [(root, False)]
    while stack:
        digest, expanded = stack.pop()
        if digest in memo and not expanded:
            continue
        own = [("", digest)] if digest in bad else []  # the folder's tree itself
        if not expanded:
            try:  # a broken tree this host can still read (its cache): what is below too
                tree = reads.trees.read(digest)
            except (NotFound, DataLoss):  # the mark's walk reported it
                memo[digest] = own
                continue
            opened[digest] = tree
            stack.append((digest, True))
            stack.extend((e.ref, False) for e in tree.values()
                         if e.is_folder and e.ref not in memo)
            continue
        tree = opened.pop(digest)
        out = own
        links = links_of(getattr(tree, "own", None))
        if links in bad:
            out.append(("(hard links)", links))
        for name, entry in sorted(tree.items()):
            if entry.is_folder:
                out += [(f"{name}/{path}", d) for path, d in memo.get(entry.ref, [])]
            elif entry.has_content and entry.ref in bad:
                out.append((name, entry.ref))
            elif entry.kind in MAPPED:
                out += [(name, p) for p in chunks.refs_safe(reads.blobs, entry.ref, [])
                        if p in bad]
        memo[digest] = out
    return memo.get(root, [])


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


def to_prune(world: World, policy: Retention, now: float | None = None,
             in_use: set[str] | frozenset[str] = frozenset()) -> list[Checkpoint]:
    """The checkpoints the policy lets go of; never one something live needs (``in_use``:
    the targets of the restores and forks under way, in_use.py)."""
    if not policy.active:
        return []
    now = time.time() if now is None else now
    store = world.store
    sessions = store.list_sessions()
    needed = {s.head for s in sessions} | {s.forked_from for s in sessions if s.forked_from}
    needed |= set(in_use)
    needed |= {a.checkpoint_id for a in store.list_approvals(status="pending")}
    by_session: dict[str, list[Checkpoint]] = {}
    for cp in store.list_checkpoints():
        by_session.setdefault(cp.session_id, []).append(cp)
    out = []
    for cps in by_session.values():
        newest = {cp.id for cp in sorted(cps, key=lambda c: c.seq)[-policy.keep_last:]} \
            if policy.keep_last else set()
        for cp in cps:
            if cp.pruned or cp.id in needed or cp.id in newest:
                continue
            if policy.keep_labelled and cp.kind == "checkpoint" and cp.label:
                continue
            age = now - ids.parse_time(cp.created_at).timestamp()
            if policy.keep_newer_than and age < policy.keep_newer_than:
                continue
            out.append(cp)
    return out


def recently_pruned(world: World, grace: float) -> set[str]:
    """The checkpoints retention pruned within the grace period, whose trees stay until
    it is over, as a blob stored or reused within it does. Every host's holds keep a
    pruned target's trees for as long as its restore or fork runs (``_fleet_holds``);
    this keeps them too for a host whose hold was not yet published (one still on an
    older worldline, which publishes none, while the fleet upgrades)."""
    found: set[str] = set()
    for event in world.store.list_audit(kind="retention.prune",
                                        since=ids.time_at(time.time() - grace)):
        found.update(event.detail.get("checkpoints", ()))
    return found


def _fleet_holds(world: World) -> set[str]:
    """The checkpoints the restores and forks under way on every host of a fleet hold
    (in_use.py); none on a data root of one host, whose holds gc reads in memory."""
    return set() if world.store.local else world.store.held_checkpoints(time.time())


def gc(world: World, dry_run: bool = False, policy: Retention | None = None,
       grace: float = GC_GRACE_SECONDS) -> GcReport:
    """Retention, then a sweep of the blobs no kept checkpoint needs. One host of a fleet
    at a time (the store's gc lock: ABORTED while another host collects)."""
    with world.store.gc_lock():
        return _gc(world, dry_run, policy, grace)


def _gc(world: World, dry_run: bool, policy: Retention | None, grace: float) -> GcReport:
    report = GcReport()
    # No restore or fork begins on a checkpoint while it is pruned (in_use.py). They
    # wait for the listing too: chosen outside, a checkpoint that a fork held meanwhile
    # and then recorded as its source would be pruned, which a fork source never is.
    with world.in_use.frozen() as held:
        pruned = to_prune(world, policy or Retention(),
                          in_use=held | world.journal.targets() | _fleet_holds(world))
        report.checkpoints_pruned = len(pruned)
        crash_point("gc.chosen")
        if pruned and not dry_run:
            world.store.prune_checkpoints([cp.id for cp in pruned], [AuditEvent(
                "retention.prune", None, "gc", {"checkpoints": [cp.id for cp in pruned]},
                ids.now())])
    # a dry run's: what the sweep would free once they are pruned (one walk, not two)
    without = {cp.id for cp in pruned} if dry_run else set()
    # Read again once the prune is committed: a restore on another host that checked
    # its target just before the prune had published its hold before that check.
    needed = reachable(world, without=without,
                       held=set() if world.store.local
                       else recently_pruned(world, grace) | _fleet_holds(world)
                       ) | world.stat_cache.digests()
    cutoff = time.time() - grace
    digests = list(world.blobs.digests())
    progress.begin("sweeping blobs", len(digests), "blobs")
    gone: set[str] = set()  # a dry run's: what the sweep would have deleted so far
    for digest in digests:
        progress.advance()
        if digest in needed:
            continue
        try:
            if dry_run:  # as the sweep would: a base of a blob kept is kept
                freed = world.blobs.freeable(digest, cutoff, gone)
                if freed:
                    gone.add(digest)
            else:
                freed = world.blobs.delete(digest, older_than=cutoff)
        except NotFound:
            continue
        if freed:
            report.blobs_removed += 1
            report.bytes_freed += freed
    compact = getattr(world.blobs, "compact", None)  # a bucket's packs and orphans
    if compact is not None and not dry_run:
        report.bytes_freed += compact(cutoff)[1]
        report.bytes_freed += _consolidate(world, cutoff)
    report.images_removed = _gc_images(world, dry_run)
    report.views_removed = _gc_views(world, dry_run)
    return report


def _consolidate(world: World, cutoff: float) -> int:
    """Every host's small packs in the bucket made before ``cutoff``, rewritten with
    deltas (S3BlobStore.consolidate), a group at a time: those of a host that never
    rested to rewrite its own (an autoscaled sandbox stopped at once), with bases from
    the trees. Returns the bytes freed."""
    found: list[dict[str, str]] = []

    def hints() -> dict[str, str]:  # read once, and only if there is something to rewrite
        if not found:
            found.append(base_hints(world))
        return found[0]

    freed = 0
    while True:
        done, before, after = world.blobs.consolidate(older_than=cutoff, any_host=True,
                                                      hints=hints)
        if not done:
            return freed
        freed += before - after


def base_hints(world: World) -> dict[str, str]:
    """digest -> the digest the same path of the same session's layer held in its
    checkpoint before, for each file and folder that changed from one kept checkpoint
    to the next: the base a capture on the host would have stored it against. Only
    the folders that changed are read."""
    hints: dict[str, str] = {}
    last: dict[tuple[str, int, str], str] = {}  # (session, layer, path) -> digest
    checkpoints = sorted(world.store.list_checkpoints(), key=lambda cp: (cp.session_id, cp.seq))
    for cp in checkpoints:
        if cp.pruned:
            continue
        for layer, root in enumerate((cp.tree, cp.container)):
            stack = [("", root)] if root else []
            while stack:
                path, digest = stack.pop()
                key = (cp.session_id, layer, path)
                before = last.get(key)
                last[key] = digest
                if before == digest:
                    continue  # unchanged here, and so everything below
                if before is not None:
                    hints.setdefault(digest, before)
                try:
                    tree = world.trees.read(digest)
                except (NotFound, DataLoss):
                    continue  # fsck's to report; a hint is only a hint
                for name, entry in tree.items():
                    if entry.is_folder:
                        stack.append((f"{path}/{name}", entry.ref))
                    elif entry.kind in (FILE, CHUNKED) and entry.ref:
                        file_key = (cp.session_id, layer, f"{path}/{name}")
                        earlier = last.get(file_key)
                        if earlier is not None and earlier != entry.ref:
                            hints.setdefault(entry.ref, earlier)
                        last[file_key] = entry.ref
    return hints


def _gc_images(world: World, dry_run: bool) -> int:
    engine = world.engine
    if engine is None or not engine.ping():
        return 0
    removed = 0
    for image in engine.images_labelled(LABEL_ROOT, world.root_id):
        cp_id = (image.get("Labels") or {}).get(LABEL_CHECKPOINT, "")
        if not cp_id:
            continue
        try:
            keep = not world.store.get_checkpoint(cp_id).pruned
        except NotFound:
            keep = False
        if not keep:
            removed += 1
            if not dry_run:
                engine.remove_image(image["Id"])
    return removed


def _gc_views(world: World, dry_run: bool) -> int:
    views = world.views
    if views is None or not os.path.isdir(views.views):
        return 0
    used = views.used()
    if used is None:  # a fork's record is unreadable: which views it needs is unknown
        log.warning("gc: no view removed while a fork's mount record cannot be read"
                    " (restart the daemon to make it again)")
        return 0
    removed = 0
    for name in os.listdir(views.views):
        if name in used or ".building-" in name:
            continue
        removed += 1
        if not dry_run:
            path = os.path.join(views.views, name)
            world.stat_cache.forget(path)
            shutil.rmtree(path, ignore_errors=True)
    return removed
