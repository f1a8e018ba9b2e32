"""``MemorySnapshotter``: the reference implementation of the Snapshotter contract
(snapshotter.py), a world held in a dict of paths; the contract tests run it beside
``WorkspaceSnapshotter``."""

from __future__ import annotations

from dataclasses import dataclass

from ..storage.blob_store import BlobStore
from .snapshotter import Capture
from .tracker import Changes
from .trees import DIR, FILE, SYMLINK, Entry, Tree, TreeReader, check_name, encode


@dataclass(frozen=True)
class MemoryFile:
    kind: str  # FILE | SYMLINK | DIR
    mode: int = 0o644
    data: bytes = b""  # content of a FILE, target of a SYMLINK (UTF-8)


class MemorySnapshotter:
    """A world held in a dict {relative path: MemoryFile}; parents are implied folders
    unless listed. The reference implementation of the Snapshotter contract."""

    def __init__(self, blobs: BlobStore, trees: TreeReader,
                 files: dict[str, MemoryFile] | None = None) -> None:
        self.blobs = blobs
        self.trees = trees
        self.files: dict[str, MemoryFile] = dict(files or {})

    def capture(self, persist: bool = True, changes: Changes | None = None,
                base: str | None = None, mapped: frozenset[str] = frozenset()) -> Capture:
        """Everything, always: a dict has no stat to trust."""
        nested: dict = {}
        for path, f in self.files.items():
            parts = path.split("/")
            for part in parts:
                check_name(part)
            node = nested
            for part in parts[:-1]:
                node = node.setdefault(part, ({}, 0o755))[0]
            if f.kind == DIR:
                node.setdefault(parts[-1], ({}, f.mode))
                node[parts[-1]] = (node[parts[-1]][0], f.mode)
            else:
                node[parts[-1]] = f
        trees: dict[str, Tree] = {}
        root, size = self._build(nested, persist, trees)
        return Capture(root, size, trees, [], {}, persist)

    def _build(self, nested: dict, persist: bool, trees: dict[str, Tree]) -> tuple[str, int]:
        """(digest, size) of the tree of ``nested``; not ``persist``ed, each tree is
        kept in ``trees`` (Capture.trees)."""
        tree, total = Tree(), 0
        for name, node in nested.items():
            if isinstance(node, MemoryFile):
                if node.kind == FILE:
                    d = self.blobs.put_bytes(node.data) if persist else self.blobs.address(
                        node.data)
                    tree[name] = Entry(FILE, node.mode, d, len(node.data))
                    total += len(node.data)
                else:
                    tree[name] = Entry(SYMLINK, 0, node.data.decode("utf-8", "surrogateescape"))
            else:
                digest, size = self._build(node[0], persist, trees)
                tree[name] = Entry(DIR, node[1], digest, size)
                total += size
        data = encode(tree)
        if persist:
            digest = self.blobs.put_bytes(data)
        else:
            digest = self.blobs.address(data)
            trees[digest] = tree
        return digest, total

    def apply(self, current: Capture, target_root: str) -> None:
        files: dict[str, MemoryFile] = {}
        for path, entry in self.trees.walk(target_root):
            if entry.kind == FILE:
                files[path] = MemoryFile(FILE, entry.mode, self.blobs.read_bytes(entry.ref))
            elif entry.kind == SYMLINK:
                files[path] = MemoryFile(SYMLINK, 0, entry.ref.encode("utf-8", "surrogateescape"))
            else:
                files[path] = MemoryFile(DIR, entry.mode)
        self.files = files

    def commit(self, capture: Capture) -> None:
        return None
