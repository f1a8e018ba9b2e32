"""A blob's file, for a blob too large for the pack (``LocalBlobStore``, blobs.py):
written to a temporary ``<root>/tmp/<digest>.<random>`` (or ``stream-<random>`` while
its digest is not known yet), flushed with every other pending one by one ``syncfs``
(one flush per checkpoint, not one per blob), then renamed to ``<root>/<2 hex>/<62
hex>``; at the next start after a crash, each temporary named after its digest is
verified against it and renamed, and every other removed (``recover``).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import re
from typing import TYPE_CHECKING

from worldline.wire.errors import DataLoss, Unavailable

from .durable import fsync_folder, out_of_space
from .streams import discard, disk_full, write_all

if TYPE_CHECKING:
    from .blobs import LocalBlobStore

log = logging.getLogger("worldline.daemon.storage.blobs")  # the store's own log

DIGEST_RE = re.compile(r"^[0-9a-f]{64}$")


def write_temp(folder: str, chunks, digest: str = "") -> str:
    """Write ``chunks`` to a new read-only temporary in ``folder``; return its path. On
    any error the temporary is removed, and a full disk is ResourceExhausted."""
    fd, tmp = open_temp(folder, digest)
    try:
        for chunk in chunks:
            write_all(fd, chunk)
        os.fchmod(fd, 0o444)
    except OSError as exc:
        discard(fd, tmp)
        raise disk_full(exc) from exc
    except BaseException:
        discard(fd, tmp)
        raise
    os.close(fd)
    return tmp


def open_temp(folder: str, digest: str = "") -> tuple[int, str]:
    prefix = f"{digest}." if digest else "stream-"
    name = os.path.join(folder, f"{prefix}{os.urandom(8).hex()}")
    try:
        return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600), name
    except OSError as exc:
        raise disk_full(exc) from exc


def place(store: LocalBlobStore, batch: dict[str, str]) -> None:
    """The files of a sync's ``batch`` (digest -> temporary) flushed with one syncfs,
    then renamed to their names (the caller holds the sync lock and has taken them
    into ``_moving``). A flush that fails leaves the store refusing every later sync
    in this process (``failed``); what was not renamed waits for the next sync."""
    renamed: set[str] = set()
    flushed = False
    try:
        flush_filesystem(store.tmp, batch.values())
        flushed = True
        folders = set()
        for digest, tmp in batch.items():
            final = store._path(digest)
            folder = os.path.dirname(final)
            if folder not in folders:
                os.makedirs(folder, mode=0o700, exist_ok=True)
                folders.add(folder)
            os.rename(tmp, final)
            renamed.add(digest)
        if _syncfs is None:  # each blob was fsynced alone: make its name durable too
            for folder in folders | {store.tmp, store.root}:
                fsync_folder(folder)
    except OSError as exc:
        with store._lock:  # what was not renamed waits for the next sync
            store._pending.update({d: t for d, t in batch.items() if d not in renamed})
        if not flushed and store.pack.durable:
            # The pages it could not write may be gone, and a later flush would
            # succeed without them: no temporary of this store is trusted again
            # in this process (the next start verifies each against its name).
            # A bucket's cache (not durable) only fails this call.
            store.failed = f"flushing blob files: {exc.strerror or exc}"
            log.error("%s: %s; no more syncs until the daemon restarts",
                      store.root, store.failed)
            if not out_of_space(exc):
                raise store._refusal() from exc
        raise disk_full(exc) from exc
    finally:
        with store._lock:
            for digest in batch:
                store._moving.pop(digest, None)


def recover(store: LocalBlobStore) -> tuple[int, int]:
    """At start, before any put: finish the renames a crash interrupted (a temporary
    whose bytes match the digest it is named after) and remove every other
    temporary. Returns (renamed, removed)."""
    renamed = removed = 0
    for name in os.listdir(store.tmp):
        path = os.path.join(store.tmp, name)
        digest = name.split(".", 1)[0]
        if DIGEST_RE.match(digest) and not os.path.exists(store._path(digest)):
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                whole = store._file_digest(fd)[0] == digest
            except DataLoss:
                whole = False
            finally:
                os.close(fd)
            if whole:
                os.makedirs(os.path.dirname(store._path(digest)), mode=0o700,
                            exist_ok=True)
                os.rename(path, store._path(digest))
                renamed += 1
                continue
        os.unlink(path)
        removed += 1
    if renamed:
        try:
            flush_filesystem(store.root, ())
        except OSError as exc:  # the daemon does not start on them: say why
            raise Unavailable(f"the blob store {store.root} could not make the {renamed}"
                              f" blob file(s) a crash left behind durable"
                              f" ({exc.strerror or exc}): check the disk, then start"
                              " the daemon again") from None
    return renamed, removed


_libc = ctypes.CDLL(None, use_errno=True)
_syncfs = getattr(_libc, "syncfs", None)


def flush_filesystem(folder: str, files) -> bool:
    """Make ``files`` (and every metadata change on the file system) durable with one
    syncfs; where the platform has none, fsync each of ``files`` and return False."""
    if _syncfs is not None:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            if _syncfs(fd) == 0:
                return True
            failed = ctypes.get_errno()
            if failed != errno.ENOSYS:  # a write-back failed: never fall back to fsyncs,
                raise OSError(failed, os.strerror(failed))  # which may not see it again
        finally:
            os.close(fd)
    for path in files:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return False
