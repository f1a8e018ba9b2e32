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
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from worldline.wire.errors import DataLoss, InvalidArgument

from ..storage.blob_store import BlobStore

FILE, SYMLINK, DIR = "file", "symlink", "dir"
WHITEOUT, OPAQUE = "whiteout", "opaque"  # overlay upper folders only
FIFO, CHAR, BLOCK = "fifo", "char", "block"  # device nodes: container layers only
SOCKET = "socket"  # recorded (so a checkpoint lists it as skipped), never recreated
SPARSE = "sparse"  # a file with holes (older data roots): ref names its extent map
CHUNKED = "chunked"  # a big or sparse file: ref names its chunk map (chunks.py)
_CODES = {FILE: "f", SYMLINK: "l", DIR: "d", WHITEOUT: "w", OPAQUE: "o", FIFO: "p",
          CHAR: "c", BLOCK: "b", SOCKET: "s", SPARSE: "z", CHUNKED: "k"}
FOLDERS = (DIR, OPAQUE)
MAPPED = (SPARSE, CHUNKED)  # kinds whose ref names a map of pieces (chunks.read_map)
FILES = (FILE, SPARSE, CHUNKED)  # kinds with content
DEVICES = (CHAR, BLOCK)
_KINDS = {v: k for k, v in _CODES.items()}
NO_OWNER = -1  # uid/gid of an entry of the oldest tree format: no owner, times or xattrs


@dataclass(frozen=True, slots=True)
class Entry:
    """One name in a folder, with everything ``rsync -aHAXS`` would keep of it.

    ``mode`` is ``st_mode & 0o7777`` (setuid, setgid and sticky included; 0 for
    symlinks), ``mtime`` nanoseconds, ``extra`` the canonical JSON of what only some
    entries have (``make_extra``): xattrs (ACLs included), device numbers, and on a root
    tree's own entry its hard-link groups. Entries of the oldest tree format, which
    recorded none of owner, times and xattrs, have ``uid == NO_OWNER`` (``has_meta``
    false) and are restored with their mode alone (fsmeta.py), as when they were
    written."""

    kind: str  # FILE | SPARSE | CHUNKED | SYMLINK | DIR | OPAQUE | WHITEOUT | FIFO | CHAR |
    #   BLOCK | SOCKET
    mode: int
    ref: str  # content (FILE), map (SPARSE, CHUNKED), tree (DIR, OPAQUE), target (SYMLINK)
    size: int = 0  # bytes of a file (logical); for a folder, of every file below
    uid: int = NO_OWNER
    gid: int = NO_OWNER
    mtime: int = 0
    extra: str = ""

    @property
    def is_folder(self) -> bool:
        return self.kind in FOLDERS

    @property
    def has_content(self) -> bool:
        return self.kind in FILES

    @property
    def has_meta(self) -> bool:
        return self.uid != NO_OWNER

    def extras(self) -> dict:
        return json.loads(self.extra) if self.extra else {}

    def xattrs(self) -> dict[str, bytes]:
        return {name: bytes.fromhex(value) for name, value in self.extras().get("x", ())}

    def same_object(self, other: "Entry") -> bool:
        """Whether only the modification time differs (a folder whose contents changed)."""
        return (self.kind, self.mode, self.uid, self.gid, self.extra) == (
            other.kind, other.mode, other.uid, other.gid, other.extra)


def make_extra(xattrs: dict[str, bytes] | None = None, rdev: int | None = None,
               links: str = "") -> str:
    """The canonical text of an entry's extras ("" when it has none)."""
    out: dict = {}
    if xattrs:
        out["x"] = sorted([name, value.hex()] for name, value in xattrs.items())
    if rdev is not None:
        out["dev"] = rdev
    if links:
        out["links"] = links
    return json.dumps(out, sort_keys=True, separators=(",", ":")) if out else ""


class Tree(dict):
    """A folder's entries by name, and (on a layer's root tree) ``own``: the entry of the
    folder itself (its owner, mode, times, xattrs; and the layer's hard-link groups)."""

    __slots__ = ("own",)

    def __init__(self, *args, own: Entry | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.own = own


def check_name(name: str) -> str:
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise InvalidArgument(f"{name!r} is not a valid file name")
    return name


def _row(name: str, e: Entry) -> list:
    row = [name, _CODES[e.kind], e.mode, e.ref, e.size]
    if e.uid != NO_OWNER:
        row += [e.uid, e.gid, e.mtime, e.extra]
    return row


def _items(tree: Mapping[str, Entry]) -> list[tuple[str, Entry]]:
    own = getattr(tree, "own", None)
    items = sorted(tree.items())
    return [("", own)] + items if own is not None else items


def encode_python(tree: Mapping[str, Entry]) -> bytes:
    """Canonical JSON: a row per entry, sorted by name; the folder's own entry first under
    the empty name. A row is [name, code, mode, ref, size] for an entry without owner
    (written by 0.3), else [name, code, mode, ref, size, uid, gid, mtime_ns, extra]."""
    rows = [_row(name, e) for name, e in _items(tree)]
    return json.dumps(rows, ensure_ascii=True, separators=(",", ":")).encode("ascii")


try:  # the same encoding in C (daemon/_codec.c), byte for byte
    from .._codec import encode_tree as _encode_tree

    def encode(tree: Mapping[str, Entry]) -> bytes:
        return _encode_tree(_items(tree), _CODES)
except ImportError:
    encode = encode_python


def decode(data: bytes, digest: str = "?") -> Tree:
    try:
        rows = json.loads(data)
        tree = Tree()
        for row in rows:
            name, code, mode, ref, size = row[:5]
            if len(row) == 9:
                uid, gid, mtime, extra = row[5:]
                entry = Entry(_KINDS[code], int(mode), str(ref), int(size), int(uid),
                              int(gid), int(mtime), str(extra))
            elif len(row) == 5:
                entry = Entry(_KINDS[code], int(mode), str(ref), int(size))
            else:
                raise ValueError(f"a row of {len(row)} fields")
            if name == "" and entry.is_folder:
                tree.own = entry
            else:
                tree[check_name(name)] = entry
        return tree
    except (ValueError, KeyError, TypeError, InvalidArgument) as exc:
        raise DataLoss(f"tree {digest} is malformed: {exc}") from None


def files_named(data: bytes) -> list[tuple[str, str]] | None:
    """(name, content digest) of the files a tree lists; None if ``data`` is no tree.
    The idle repack learns from it which blobs are versions of a same-named file."""
    if not data.startswith(b'[["'):
        return None
    try:
        tree = decode(data)
    except DataLoss:
        return None
    return [(name, e.ref) for name, e in tree.items() if e.kind == FILE]


EMPTY_TREE = encode({})


ROWS_FROM = 64  # entries from which a folder's encoded rows are kept for its next version
ROWS_KEPT = 128  # folders whose rows are kept, at most ...
ROWS_KEPT_ENTRIES = 1 << 18  # ... and rows over all of them (about 170 bytes a row)
TREES_KEPT = 8192  # decoded trees the reader keeps, at most ...
# ... and entries over all of them. A decoded entry takes about 460 bytes (a version of
# a folder shares its unchanged entries with the one it was made from: about 40 bytes
# each), so the trees kept take half a gigabyte at the very most, whatever the agent
# builds: a count of trees alone let a few large folders, each changed a few thousand
# times, take everything the machine has.
ENTRIES_KEPT = 1 << 20
# An entry's weight in both bounds: one, or its share of the tree's encoding at this
# many bytes an entry (about what an entry without xattrs takes), whichever is more: an
# entry carrying kilobytes of xattrs (fsmeta.MAX_XATTR_BYTES) weighs as much as the
# plain entries its bytes would make.
ENTRY_BYTES = 160
# Counts of names kept (``TreeReader.count``): of the folders counted last, and, apart,
# of the layers' roots, so a full scan of a large tree never drops every session's head
COUNTS_KEPT, ROOT_COUNTS_KEPT = 1 << 16, 1 << 12


def _encoded_row(name: str, entry: Entry) -> bytes:
    """The row ``encode`` writes for one entry (without the brackets around the rows)."""
    return encode({name: entry})[1:-1]


def _size(entry: Entry | None) -> int:
    return entry.size if entry is not None and entry.kind != SOCKET else 0


class Rows:
    """A large folder's encoding as its rows, sorted by name (the folder's own entry,
    which only a layer's root tree has, is not among them), and the total size of its
    entries: what the next version of the folder, which differs in a few names, is
    made from (``TreeReader.encode_update``)."""

    __slots__ = ("names", "rows", "total")

    def __init__(self, names: list[str], rows: list[bytes], total: int) -> None:
        self.names, self.rows, self.total = names, rows, total


try:  # out of the cycle collector's sight (daemon/_codec.c); without the C build, seen
    from .._codec import untrack
except ImportError:
    def untrack(objects: Iterable[object]) -> None:
        pass


def _settled(tree: Tree | dict[str, Entry]) -> None:
    """A tree about to be kept, and its entries, untracked by the cycle collector: they
    hold only strings and numbers and can be in no cycle, and the trees a busy daemon
    keeps were most of what each young collection traversed, for nothing (under the
    eight-session load, pauses of every call that found no garbage)."""
    untrack(tree.values())
    own = getattr(tree, "own", None)
    untrack((tree,) if own is None else (tree, own))


class _Kept:
    """The least recently used of what was kept, dropped first, within two bounds: how
    many are kept, and their total weight (a tree's or a folder's rows' entries, plus
    one). One too heavy to keep with nothing else is not kept at all."""

    def __init__(self, count: int, weight: int) -> None:
        self._items: OrderedDict[str, tuple[object, int]] = OrderedDict()
        self._count, self._weight, self.weight = count, weight, 0

    def get(self, key: str):
        kept = self._items.get(key)
        if kept is None:
            return None
        self._items.move_to_end(key)
        return kept[0]

    def put(self, key: str, value: object, entries: int) -> None:
        old = self._items.pop(key, None)
        if old is not None:
            self.weight -= old[1]
        weight = entries + 1
        if weight > self._weight:
            return
        self._items[key] = (value, weight)
        self.weight += weight
        while len(self._items) > self._count or self.weight > self._weight:
            self.weight -= self._items.popitem(last=False)[1][1]

    def __len__(self) -> int:
        return len(self._items)


class TreeReader:
    """Reads trees from a blob store, caching decoded trees (they never change), and
    the encoded rows of the large folders captured last, both within bounds of count
    and of entries (``_Kept``)."""

    def __init__(self, blobs: BlobStore, capacity: int = TREES_KEPT,
                 entries: int = ENTRIES_KEPT, rows: tuple[int, int] = (
                     ROWS_KEPT, ROWS_KEPT_ENTRIES)) -> None:
        self.blobs = blobs
        self._cache = _Kept(capacity, entries)
        self._rows = _Kept(*rows)
        self._counts = _Kept(COUNTS_KEPT, COUNTS_KEPT)
        self._root_counts = _Kept(ROOT_COUNTS_KEPT, ROOT_COUNTS_KEPT)
        self._lock = threading.Lock()

    def encode_update(self, tree: Tree, base: str, touched: Iterable[str]
                      ) -> tuple[bytes, int, Rows | None]:
        """(encoding, total size of the entries, rows to keep) of ``tree``, which is the
        tree ``base`` with only the names in ``touched`` changed, added or removed. A
        large folder whose base's rows are kept is encoded by replacing those rows
        only: the same bytes ``encode`` makes of the whole tree (the rows are sorted by
        name and each is encoded alone), for a few rows' work instead of every row's,
        and its total is the base's corrected by the touched entries."""
        if len(tree) < ROWS_FROM:
            return encode(tree), sum(_size(e) for e in tree.values()), None
        with self._lock:
            kept = self._rows.get(base)
        if kept is None:
            names = sorted(tree)
            rows = [_encoded_row(name, tree[name]) for name in names]
            total = sum(_size(e) for e in tree.values())
        else:
            before = self.read(base)
            names, rows, total = list(kept.names), list(kept.rows), kept.total
            for name in set(touched):
                entry = tree.get(name)
                total += _size(entry) - _size(before.get(name))
                at = bisect_left(names, name)
                present = at < len(names) and names[at] == name
                if entry is None:
                    if present:
                        del names[at], rows[at]
                elif present:
                    rows[at] = _encoded_row(name, entry)
                else:
                    names.insert(at, name)
                    rows.insert(at, _encoded_row(name, entry))
        own = getattr(tree, "own", None)
        body = b",".join([_encoded_row("", own), *rows] if own is not None else rows)
        return b"[" + body + b"]", total, Rows(names, rows, total)

    def kept(self) -> tuple[int, int, int, int]:
        """What is kept now: (trees, their entries, folders' rows, those rows), each
        tree or folder weighing one more than its entries."""
        with self._lock:
            return (len(self._cache), self._cache.weight - len(self._cache),
                    len(self._rows), self._rows.weight - len(self._rows))

    def keep_rows(self, digest: str, rows: Rows, size: int = 0) -> None:
        """Keep a folder's rows (``size``: the bytes of its encoding, for their weight)."""
        untrack((rows.names, rows.rows, rows))  # strings and bytes: no cycle (_settled)
        with self._lock:
            self._rows.put(digest, rows, max(len(rows.rows), size // ENTRY_BYTES))

    def read(self, digest: str, pending: Mapping[str, dict[str, Entry]] | None = None
             ) -> dict[str, Entry]:
        if pending and digest in pending:
            return pending[digest]
        with self._lock:
            tree = self._cache.get(digest)
        if tree is not None:
            return tree
        data = self.blobs.read_bytes(digest)
        tree = decode(data, digest)
        self.remember(digest, tree, len(data))
        return tree

    def remember(self, digest: str, tree: dict[str, Entry], size: int = 0) -> None:
        """Keep a decoded tree (``size``: the bytes of its encoding, for its weight)."""
        _settled(tree)
        with self._lock:
            self._cache.put(digest, tree, max(len(tree), size // ENTRY_BYTES))

    def count(self, digest: str) -> int:
        """The names in the folder tree ``digest`` and in every folder below it: how
        many entries a layer holds (``--max-entries``). Each folder's count is kept
        (the last ones counted, ``remember_count``), so a tree that shares folders with
        one counted before reads only the others."""
        with self._lock:
            known = self._root_counts.get(digest)
            if known is None:
                known = self._counts.get(digest)
        if known is not None:
            return known
        counted: dict[str, int] = {}
        stack: list[tuple[str, tuple[int, list[str]] | None]] = [(digest, None)]
        while stack:
            folder, read = stack.pop()
            if read is None:
                if folder in counted:
                    continue
                with self._lock:
                    known = self._counts.get(folder)
                if known is not None:
                    counted[folder] = known
                    continue
                tree = self.read(folder)
                below = [e.ref for e in tree.values() if e.is_folder]
                stack.append((folder, (len(tree), below)))
                stack.extend((ref, None) for ref in below)
            else:
                names, below = read
                counted[folder] = total = names + sum(counted[ref] for ref in below)
                self.remember_count(folder, total)
        return counted[digest]

    def remember_count(self, digest: str, names: int, root: bool = False) -> None:
        """What a capture counted of a folder it built or found unchanged (``count``);
        ``root``: a layer's root, kept apart."""
        with self._lock:
            (self._root_counts if root else self._counts).put(digest, names, 0)

    def link_groups(self, digest: str, pending: Mapping | None = None) -> list[list[str]]:
        """The hard-link groups a root tree's own entry names ([] for none);
        ``pending``, as for ``read``: a capture that stores nothing holds its groups
        there, under their digest, beside its trees."""
        if not digest:
            return []
        if pending and digest in pending:
            return pending[digest]
        try:
            groups = json.loads(self.blobs.read_bytes(digest))
            for group in groups:
                for path in group:
                    for part in path.split("/"):
                        check_name(part)
            return groups
        except (ValueError, TypeError, InvalidArgument) as exc:
            raise DataLoss(f"hard-link groups {digest} are malformed: {exc}") from None

    def walk(self, root: str, prefix: str = "") -> Iterator[tuple[str, Entry]]:
        """Every entry below ``root`` as (relative path, entry), folders before their contents."""
        for name, entry in sorted(self.read(root).items()):
            path = f"{prefix}{name}"
            yield path, entry
            if entry.is_folder:
                yield from self.walk(entry.ref, path + "/")


def links_of(own: Entry | None) -> str:
    """The digest of the hard-link groups a layer's root entry names ("" for none)."""
    return own.extras().get("links", "") if own is not None else ""


def entry_at(reader: TreeReader, root: str, path: str,
             pending: Mapping[str, Tree] | None = None) -> Entry | None:
    """The entry at ``path`` (slash-separated) below the tree ``root``, or None."""
    tree = reader.read(root, pending)
    *folders, name = path.split("/")
    for part in folders:
        entry = tree.get(part)
        if entry is None or not entry.is_folder:
            return None
        tree = reader.read(entry.ref, pending)
    return tree.get(name)


def entry_key(entry: Entry | None) -> list | None:
    """An entry as JSON (for journals): None for no entry."""
    return None if entry is None else [entry.kind, entry.mode, entry.ref, entry.size,
                                       entry.uid, entry.gid, entry.mtime, entry.extra]


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
    diff) or when its owner, mode, xattrs or kind changed (a folder's time follows its
    contents and is not reported). A file that joined or left a hard-link group is
    modified.
    """
    result = Diff([], [], [])
    _diff_into(reader, old, new, "", result, pending)
    relinked = _link_changes(reader, old, new, pending)
    if relinked:
        gone = set(result.added) | set(result.deleted) | set(result.modified)
        result.modified.extend(p for p in relinked if p not in gone)
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
            if not ea.same_object(eb):
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


def _link_changes(reader: TreeReader, old: str, new: str, pending) -> set[str]:
    """Paths whose hard-link group differs between two root trees."""
    la = links_of(getattr(reader.read(old, pending), "own", None))
    lb = links_of(getattr(reader.read(new, pending), "own", None))
    if la == lb:
        return set()
    groups = [{p: frozenset(g) for g in reader.link_groups(d, pending) for p in g}
              for d in (la, lb)]
    return {p for p in groups[0].keys() | groups[1].keys()
            if groups[0].get(p) != groups[1].get(p)}
