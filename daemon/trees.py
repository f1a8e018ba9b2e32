"""Trees: the manifests of a snapshot, one content-addressed blob per folder.

A *tree* maps the names in one folder to entries. An entry is a regular file
(content digest, mode, size), a symlink (its target, stored as text and never
followed), or a folder (the digest of its own tree, and its mode). Trees of a
container's writable layer (an overlay upper folder) also hold the overlay's own
marks: a *whiteout* (a deleted lower file) and an *opaque* folder (one that hides
the lower folder of the same name). A snapshot is
named by its root tree's digest, as in git: a change to three files writes three
file blobs and the trees on their paths to the root, whatever the size of the rest.

Encoding: canonical JSON, ASCII only (names that are not UTF-8 survive as escaped
surrogates), entries sorted by name. Decoding validates every name, so a tree read
back can never name ``..``, ``.``, an empty name or a path with a slash in it.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from worldline.client.errors import DataLoss, InvalidArgument

from .blobs import BlobStore, digest_of

FILE, SYMLINK, DIR = "file", "symlink", "dir"
WHITEOUT, OPAQUE = "whiteout", "opaque"  # overlay upper folders only
_CODES = {FILE: "f", SYMLINK: "l", DIR: "d", WHITEOUT: "w", OPAQUE: "o"}
FOLDERS = (DIR, OPAQUE)
_KINDS = {v: k for k, v in _CODES.items()}


@dataclass(frozen=True, slots=True)
class Entry:
    kind: str  # FILE | SYMLINK | DIR | WHITEOUT | OPAQUE
    mode: int  # permission bits, st_mode & 0o7777 (0 for symlinks)
    ref: str  # content digest (FILE), tree digest (DIR, OPAQUE), link target (SYMLINK)

    @property
    def is_folder(self) -> bool:
        return self.kind in FOLDERS
    size: int = 0  # bytes of a FILE; for a DIR, bytes of every file below it


Tree = Mapping[str, Entry]


def check_name(name: str) -> str:
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise InvalidArgument(f"{name!r} is not a valid file name")
    return name


def encode_python(tree: Tree) -> bytes:
    rows = [[name, _CODES[e.kind], e.mode, e.ref, e.size] for name, e in sorted(tree.items())]
    return json.dumps(rows, ensure_ascii=True, separators=(",", ":")).encode("ascii")


try:  # the same encoding in C (daemon/_codec.c), byte for byte
    from ._codec import encode_tree as _encode_tree

    def encode(tree: Tree) -> bytes:
        return _encode_tree(sorted(tree.items()), _CODES)
except ImportError:
    encode = encode_python


def decode(data: bytes, digest: str = "?") -> dict[str, Entry]:
    try:
        rows = json.loads(data)
        tree = {}
        for name, code, mode, ref, size in rows:
            tree[check_name(name)] = Entry(_KINDS[code], int(mode), str(ref), int(size))
        return tree
    except (ValueError, KeyError, TypeError, InvalidArgument) as exc:
        raise DataLoss(f"tree {digest} is malformed: {exc}") from None


EMPTY_TREE = encode({})
EMPTY_TREE_DIGEST = digest_of(EMPTY_TREE)


class TreeReader:
    """Reads trees from a blob store, caching decoded trees (they never change)."""

    def __init__(self, blobs: BlobStore, capacity: int = 8192) -> None:
        self.blobs = blobs
        self._cache: OrderedDict[str, dict[str, Entry]] = OrderedDict()
        self._capacity = capacity
        self._lock = threading.Lock()

    def read(self, digest: str, pending: Mapping[str, dict[str, Entry]] | None = None
             ) -> dict[str, Entry]:
        if pending and digest in pending:
            return pending[digest]
        with self._lock:
            tree = self._cache.get(digest)
            if tree is not None:
                self._cache.move_to_end(digest)
                return tree
        tree = decode(self.blobs.read_bytes(digest), digest)
        self.remember(digest, tree)
        return tree

    def remember(self, digest: str, tree: dict[str, Entry]) -> None:
        with self._lock:
            self._cache[digest] = tree
            while len(self._cache) > self._capacity:
                self._cache.popitem(last=False)

    def walk(self, root: str, prefix: str = "") -> Iterator[tuple[str, Entry]]:
        """Every entry below ``root`` as (relative path, entry), folders before their contents."""
        for name, entry in sorted(self.read(root).items()):
            path = f"{prefix}{name}"
            yield path, entry
            if entry.is_folder:
                yield from self.walk(entry.ref, path + "/")


@dataclass
class Diff:
    added: list[str]
    modified: list[str]
    deleted: list[str]


def diff(reader: TreeReader, old: str, new: str,
         pending: Mapping[str, dict[str, Entry]] | None = None) -> Diff:
    """Paths that differ between two trees, skipping identical subtrees.

    Files and symlinks are reported by path; a folder is reported itself only when
    it is empty on the side where it exists (so empty folders are never lost from a
    diff) or when only its mode changed.
    """
    result = Diff([], [], [])
    _diff_into(reader, old, new, "", result, pending)
    result.added.sort()
    result.modified.sort()
    result.deleted.sort()
    return result


def _leaves(reader: TreeReader, entry: Entry, path: str, pending) -> Iterator[str]:
    if not entry.is_folder:
        yield path
        return
    tree = reader.read(entry.ref, pending)
    if not tree:
        yield path
        return
    for name, child in tree.items():
        yield from _leaves(reader, child, f"{path}/{name}", pending)


def _diff_into(reader: TreeReader, old: str, new: str, prefix: str, out: Diff, pending) -> None:
    if old == new:
        return
    a, b = reader.read(old, pending), reader.read(new, pending)
    for name in a.keys() | b.keys():
        path = f"{prefix}{name}"
        ea, eb = a.get(name), b.get(name)
        if ea == eb:
            continue
        if eb is None:
            out.deleted.extend(_leaves(reader, ea, path, pending))
        elif ea is None:
            out.added.extend(_leaves(reader, eb, path, pending))
        elif ea.is_folder and eb.is_folder:
            if ea.mode != eb.mode or ea.kind != eb.kind:
                out.modified.append(path)
            _diff_into(reader, ea.ref, eb.ref, path + "/", out, pending)
        elif not ea.is_folder and not eb.is_folder:
            out.modified.append(path)
        else:
            old_leaves = set(_leaves(reader, ea, path, pending))
            new_leaves = set(_leaves(reader, eb, path, pending))
            out.modified.extend(old_leaves & new_leaves)
            out.deleted.extend(old_leaves - new_leaves)
            out.added.extend(new_leaves - old_leaves)
