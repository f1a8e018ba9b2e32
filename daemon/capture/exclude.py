"""Exclusions (opt-in): workspace paths a capture never reads and a restore never touches.

Two sources, both in gitignore syntax (pathspec's ``GitIgnoreSpec``, Git's own rules):

- the session's patterns, given once at ``session create --exclude PATTERN`` and kept
  in its spec (a fork inherits them);
- the file ``.worldlineignore`` at the workspace root, as it is on disk when a capture
  (or a restore's look at the workspace) reads it. The agent controls that file, so it
  is read like everything else: opened with ``O_NOFOLLOW`` relative to the root's
  descriptor, a regular file of at most ``MAX_FILE`` bytes and ``MAX_PATTERNS``
  patterns; a symlink, anything else or a file over the limits is ignored (whole) and
  said in the capture's warnings, and the capture then takes everything.

The ``.worldlineignore`` file itself is never excluded: it is part of the workspace,
and the version a checkpoint holds is the one its capture obeyed. Exclusions apply to
the workspace layer only, never to a container's writable layer.

An exclusion can only narrow what worldline reads and writes: patterns are matched
against workspace-relative paths the walk found (a pattern with ``..`` or an absolute
path matches nothing outside), and a restore still writes only what the target tree
names, through the same checked descriptors.
"""

from __future__ import annotations

import errno
import os
import stat as st_

from pathspec import GitIgnoreSpec
from worldline.wire.errors import InvalidArgument

from ..storage.blob_store import digest_of
from .descriptors import READ_FLAGS as _READ_FLAGS
from .trees import FILE

IGNORE_FILE = ".worldlineignore"
MAX_FILE = 64 << 10  # bytes of .worldlineignore read at the most
MAX_PATTERNS = 1000  # in the file, and given with --exclude
MAX_PATTERN = 1024  # characters of one --exclude pattern


class Exclusions:
    """The paths excluded by a set of patterns: ``excluded(path, is_dir)``."""

    def __init__(self, patterns: list[str]) -> None:
        self.patterns = patterns
        self.spec = GitIgnoreSpec.from_lines(patterns)

    def __call__(self, path: str, is_dir: bool) -> bool:
        if path == IGNORE_FILE:
            return False
        return self.spec.match_file(path + "/" if is_dir else path)


def covers(excluded, path: str, is_dir: bool) -> bool:
    """Whether ``path`` is excluded, itself or by a folder above it."""
    parts = path.split("/")
    return any(excluded("/".join(parts[:i]), True) for i in range(1, len(parts))) or \
        excluded(path, is_dir)


def patterns_of(text: str) -> list[str]:
    """The patterns of a .worldlineignore: its lines less blanks and comments."""
    return [line for line in text.splitlines() if line.strip() and not line.startswith("#")]


def check_patterns(patterns) -> list[str]:
    """``session create --exclude`` patterns: each a valid gitignore pattern, one line."""
    patterns = [str(p) for p in patterns]
    if len(patterns) > MAX_PATTERNS:
        raise InvalidArgument(f"{len(patterns)} --exclude patterns; the limit is {MAX_PATTERNS}")
    for p in patterns:
        if not p.strip() or len(p) > MAX_PATTERN or any(c in p for c in "\n\r\0"):
            raise InvalidArgument(f"--exclude {p[:80]!r}: a pattern is one non-empty line of"
                                  f" at most {MAX_PATTERN} characters")
        try:
            GitIgnoreSpec.from_lines([p])
        except ValueError as exc:
            raise InvalidArgument(f"--exclude {p[:80]!r} is not a gitignore pattern: {exc}"
                                  ) from None
    return patterns


class Either:
    """Excluded by one set of rules or the other (a restore: today's, and its
    target's own)."""

    def __init__(self, *rules: Exclusions) -> None:
        self.rules = rules

    def __call__(self, path: str, is_dir: bool) -> bool:
        return any(rule(path, is_dir) for rule in self.rules)


def either(*rules: Exclusions | None) -> Exclusions | Either | None:
    found = [r for r in rules if r is not None]
    return None if not found else found[0] if len(found) == 1 else Either(*found)


def read(root_fd: int, session_patterns: tuple[str, ...] | list[str], address=digest_of
         ) -> tuple[Exclusions | None, list[str], str | None]:
    """The exclusions in force in the workspace open at ``root_fd`` (None: none), the
    warnings about a .worldlineignore that is ignored, and the file's ``key``: the
    digest of a regular .worldlineignore within the size limit (None: none), what the
    rules follow from (a capture whose base had another examines everything); the
    digest is ``address``'s, the blob store's (BlobStore.address)."""
    warnings: list[str] = []
    text, digest = _read_file(root_fd, warnings, address)
    return _rules(session_patterns, text, warnings), warnings, digest


def key_in(trees, root: str, pending=None) -> str | None:
    """The .worldlineignore key (``read``) of a capture's tree ``root`` (``pending``: a
    capture's trees not stored yet)."""
    entry = trees.read(root, pending).get(IGNORE_FILE)
    return entry.ref if entry is not None and entry.kind == FILE and \
        entry.size <= MAX_FILE else None


def of_tree(trees, blobs, root: str, session_patterns: tuple[str, ...] | list[str]
            ) -> Exclusions | None:
    """The exclusions the capture of the tree ``root`` obeyed, as its .worldlineignore
    and the session's patterns tell."""
    key = key_in(trees, root)
    text = (blobs.read_bytes(key).decode("utf-8", "surrogateescape")
            if key is not None else None)
    return _rules(session_patterns, text, [])


def _rules(session_patterns, text: str | None, warnings: list[str]) -> Exclusions | None:
    from_file = patterns_of(text) if text is not None else []
    if len(from_file) > MAX_PATTERNS:
        warnings.append(f"{IGNORE_FILE} ignored: {len(from_file)} patterns, more than"
                        f" {MAX_PATTERNS}")
        from_file = []
    patterns = list(session_patterns) + from_file
    if not patterns:
        return None
    try:
        return Exclusions(patterns)
    except ValueError as exc:  # a bad line in the file (the session's were checked)
        warnings.append(f"{IGNORE_FILE} ignored: {exc}")
        return Exclusions(list(session_patterns)) if session_patterns else None


def _read_file(root_fd: int, warnings: list[str], address=digest_of
               ) -> tuple[str | None, str | None]:
    """The text of .worldlineignore and its content digest, (None, None) if there is
    none or it is not one to obey (said in ``warnings``)."""
    try:
        fd = os.open(IGNORE_FILE, _READ_FLAGS, dir_fd=root_fd)
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            warnings.append(f"{IGNORE_FILE} ignored: it is a symlink, not a file")
            return None, None
        warnings.append(f"{IGNORE_FILE} ignored: {os.strerror(exc.errno or 0)}")
        return None, None
    try:
        st = os.fstat(fd)
        if not st_.S_ISREG(st.st_mode):
            warnings.append(f"{IGNORE_FILE} ignored: not a regular file")
            return None, None
        data = b""
        while len(data) <= MAX_FILE and (chunk := os.read(fd, MAX_FILE + 1 - len(data))):
            data += chunk
    finally:
        os.close(fd)
    if len(data) > MAX_FILE:
        warnings.append(f"{IGNORE_FILE} ignored: larger than {MAX_FILE} bytes")
        return None, None
    return data.decode("utf-8", "surrogateescape"), address(data)
