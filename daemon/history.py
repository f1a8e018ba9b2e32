"""One path through a session's history (issue 58): the checkpoints that changed it,
its bytes as of a checkpoint, and the tree a restore of a few paths brings a layer to.

A path is workspace-relative and '/'-separated, escaped on the wire as every path is
(worldline.wire.paths). It never leaves the tree: an absolute path, an empty, ``.`` or
``..`` part is INVALID_ARGUMENT, and so is a path whose folder on the way is a symlink
or a file in a tree it is looked up in (``strict``); a history, which looks at every
checkpoint, counts such a path as absent where it passes through one.

Trees are content-addressed: a folder unchanged between two checkpoints has the same
digest, so the entry at a path is looked up once per distinct folder on the way
(``PathLookup``), never by comparing whole worlds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from worldline.wire.errors import FailedPrecondition, InvalidArgument, NotFound
from worldline.wire.paths import unescape

from .capture import chunks
from .capture.trees import (
    FILE,
    MAPPED,
    SYMLINK,
    Entry,
    Tree,
    TreeReader,
    encode,
    links_of,
)
from .records import Checkpoint, ToolCall
from .storage.blob_store import BlobStore

READ_LIMIT = 32 << 20  # bytes one ReadFile answers at most (half a message's limit)


def check_path(path: str) -> str:
    """A workspace-relative path as sent (escaped), in its ``os.fsdecode`` form;
    INVALID_ARGUMENT for one that could leave the tree or names no entry."""
    p = unescape(path or "")
    if not p:
        raise InvalidArgument("give a path (relative to the workspace)")
    if p.startswith("/"):
        raise InvalidArgument(f"path {path!r} is absolute: give it relative to the workspace")
    parts = p.rstrip("/").split("/")
    if any(part in ("", ".", "..") or "\0" in part for part in parts):
        raise InvalidArgument(f"path {path!r} has an empty, '.' or '..' part: give it as"
                              " it is below the workspace, with no '..'")
    return "/".join(parts)


class PathLookup:
    """The entry at one path in many trees, each folder on the way read once: a folder
    seen before (by digest, at that depth) answers from the memo."""

    def __init__(self, reader: TreeReader, path: str,
                 pending: Mapping[str, Tree] | None = None) -> None:
        self.reader, self.parts, self.pending = reader, path.split("/"), pending
        self._memo: dict[tuple[str, int], Entry | None] = {}

    def entry(self, root: str, strict: bool = False) -> Entry | None:
        """The entry at the path below ``root``, or None; ``strict``: a folder on the way
        that is a symlink or a file is INVALID_ARGUMENT (else: None)."""
        digest = root
        for depth, part in enumerate(self.parts):
            key = (digest, depth)
            if key in self._memo and not strict:
                return self._memo[key]
            entry = self.reader.read(digest, self.pending).get(part)
            last = depth == len(self.parts) - 1
            if last or entry is None or not entry.is_folder:
                if not last and entry is not None:
                    if strict:
                        raise InvalidArgument(
                            f"path {'/'.join(self.parts)} passes through"
                            f" {'/'.join(self.parts[:depth + 1])}, a {entry.kind}, not a"
                            " folder: nothing is read or written through it")
                    entry = None
                self._memo[key] = entry
                return entry
            digest = entry.ref
        return None


def same(a: Entry | None, b: Entry | None) -> bool:
    """Whether a path is unchanged: the same entry but for its modification time (a
    file written again with the same bytes, a folder whose time followed its files)."""
    if a is None or b is None:
        return a is b
    return (a.kind, a.mode, a.ref, a.size, a.uid, a.gid, a.extra) == (
        b.kind, b.mode, b.ref, b.size, b.uid, b.gid, b.extra)


@dataclass
class PathChange:
    checkpoint: Checkpoint
    change: str  # added | modified | deleted
    tool_calls: list[ToolCall] = field(default_factory=list)
    patch: str = ""


def changes_of(reader: TreeReader, path: str, chain: list[Checkpoint],
               calls_after: dict[str, list[ToolCall]], patch=None) -> list[PathChange]:
    """The checkpoints of ``chain`` (a lineage, newest first; pruned ones left out, as
    their trees may be gone) whose entry at ``path`` differs from the one before it,
    newest first, each with the tool calls made since that one (``calls_after``: by
    the checkpoint they followed). ``patch(old, new)``: the change as a patch."""
    look = PathLookup(reader, path)
    kept = [cp for cp in chain if not cp.pruned]
    entries = [look.entry(cp.tree) for cp in kept]
    out = []
    for i, cp in enumerate(kept):
        new, old = entries[i], entries[i + 1] if i + 1 < len(kept) else None
        if same(old, new):
            continue
        change = "added" if old is None else "deleted" if new is None else "modified"
        # the calls made after the checkpoint before it (and after any pruned between)
        start = chain.index(cp)
        stop = chain.index(kept[i + 1]) + 1 if i + 1 < len(kept) else len(chain)
        calls = [c for older in chain[start + 1:stop] for c in calls_after.get(older.id, [])]
        out.append(PathChange(cp, change, calls, patch(old, new) if patch else ""))
    return out


def metadata_change(path: str, old: Entry | None, new: Entry | None) -> str:
    """A patch's lines for what changed of a path besides its bytes (git's way: "old
    mode"/"new mode"), "" when nothing did or it was added or deleted."""
    if old is None or new is None:
        return ""
    lines = []
    if old.kind != new.kind:
        lines.append(f"kind {old.kind} -> {new.kind}")
    if old.mode != new.mode:
        lines += [f"old mode {old.mode:o}", f"new mode {new.mode:o}"]
    if (old.uid, old.gid) != (new.uid, new.gid) and old.has_meta and new.has_meta:
        lines.append(f"owner {old.uid}:{old.gid} -> {new.uid}:{new.gid}")
    if old.extras().get("x") != new.extras().get("x"):
        lines.append("extended attributes changed")
    return "".join(f"{line}\n" for line in
                   ([f"metadata of {path}:"] + lines if lines else []))


def read_entry(blobs: BlobStore, entry: Entry, path: str, offset: int, length: int
               ) -> tuple[bytes, int]:
    """(bytes from ``offset``, at most ``length`` or READ_LIMIT; the whole size) of a
    file's content, or of a symlink's target."""
    if offset < 0 or length < 0:
        raise InvalidArgument("offset and length are 0 or more")
    length = min(length or READ_LIMIT, READ_LIMIT)
    if entry.kind == SYMLINK:
        data = entry.ref.encode("utf-8", "surrogateescape")
        return data[offset:offset + length], len(data)
    if entry.kind == FILE:
        data = blobs.read_bytes(entry.ref)
        return data[offset:offset + length], len(data)
    if entry.kind in MAPPED:
        size, pieces = chunks.read_map(blobs, entry.ref)
        end = min(size, offset + length)
        out = bytearray(max(0, end - offset))
        for at, n, digest in pieces:
            if at + n <= offset or at >= end:
                continue
            data = blobs.read_bytes(digest)
            lo, hi = max(at, offset), min(at + n, end)
            out[lo - offset:hi - offset] = data[lo - at:hi - at]
        return bytes(out), size
    what = "a folder" if entry.is_folder else f"a {entry.kind}"
    raise InvalidArgument(f"{path} is {what}: only files and symlinks have bytes to read")


RANGES_SHOWN = 100  # changed ranges a binary patch lists at most


def binary_patch(blobs: BlobStore, path: str, old: Entry | None, new: Entry | None) -> str:
    """The patch of a file stored by chunks: that it differs, and which byte ranges of
    its new version (or of the old one, removed) hold chunks the other has not."""
    head = (f"Binary files {'/dev/null' if old is None else 'a/' + path} and"
            f" {'/dev/null' if new is None else 'b/' + path} differ\n")
    mapped = [e.ref if e is not None and e.kind in MAPPED else None for e in (old, new)]
    side, (base, ref) = ("b", mapped) if new is not None else ("a", mapped[::-1])
    if ref is None:  # the version shown is a whole blob: all of it differs
        return head
    size, ranges = chunks.changed_ranges(blobs, base, ref)
    lines = [f"@@ {side}/{path} bytes {lo}-{hi - 1} of {size} @@\n"
             for lo, hi in ranges[:RANGES_SHOWN]]
    if len(ranges) > RANGES_SHOWN:
        lines.append(f"@@ and {len(ranges) - RANGES_SHOWN} more ranges @@\n")
    return head + "".join(lines)


class Graft:
    """The tree ``base`` with the entries at some paths taken from ``source`` (removed
    where it has none): what a restore of those paths brings a layer to. New trees are
    stored (``persist``) or kept in ``trees`` (a dry run), beside ``pending``."""

    def __init__(self, reader: TreeReader, blobs: BlobStore,
                 pending: Mapping[str, Tree] | None, persist: bool) -> None:
        self.reader, self.blobs, self.persist = reader, blobs, persist
        self.trees: dict[str, Tree] = dict(pending or {})

    def apply(self, base: str, source: str, paths: list[str]) -> tuple[str, int]:
        """(root digest, bytes of its files)."""
        root = self.reader.read(base, self.trees)
        linked = {p for g in self.reader.link_groups(links_of(root.own), self.trees)
                  for p in g}
        src_root = self.reader.read(source, self.trees)
        linked |= {p for g in self.reader.link_groups(links_of(src_root.own)) for p in g}
        for path in paths:
            old = PathLookup(self.reader, path, self.trees).entry(base, strict=True)
            new = PathLookup(self.reader, path, self.trees).entry(source, strict=True)
            if old is None and new is None:
                raise NotFound(f"path {path} is neither in the checkpoint nor in the"
                               " workspace")
            if any(p == path or p.startswith(path + "/") for p in linked):
                raise FailedPrecondition(
                    f"path {path} is (or holds) one of a group of hard links: restore the"
                    " whole world to keep the group whole")
            base = self._put(base, source, path.split("/"))
        tree = self.reader.read(base, self.trees)
        return base, sum(e.size for e in tree.values())

    def _put(self, folder: str, source: str | None, parts: list[str]) -> str:
        """``folder`` (a digest) with the entry at ``parts`` set to ``source``'s (the
        folders on the way made from the source's own entries where missing)."""
        tree = self.reader.read(folder, self.trees)
        src = self.reader.read(source, self.trees) if source else {}
        name, want = parts[0], src.get(parts[0])
        out = Tree(tree, own=getattr(tree, "own", None))
        if len(parts) == 1:
            if want is None:
                out.pop(name, None)
            else:
                out[name] = want
        else:
            have = tree.get(name)
            below = want.ref if want is not None and want.is_folder else None
            if have is None:  # made as the source has it, holding only the path
                have = Entry(want.kind, want.mode, self._store(Tree()), 0, want.uid,
                             want.gid, want.mtime, want.extra)
            ref = self._put(have.ref, below, parts[1:])
            inner = self.reader.read(ref, self.trees)
            if not inner and tree.get(name) is None:
                out.pop(name, None)  # nothing was made below it
            else:
                out[name] = Entry(have.kind, have.mode, ref,
                                  sum(e.size for e in inner.values()), have.uid, have.gid,
                                  have.mtime, have.extra)
        return self._store(out)

    def _store(self, tree: Tree) -> str:
        data = encode(tree)
        digest = self.blobs.address(data)
        if self.persist:
            self.blobs.put_bytes(data)
            self.reader.remember(digest, tree, len(data))
        else:
            self.trees[digest] = tree
        return digest
