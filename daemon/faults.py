"""Named crash points for fault-injection tests.

``WORLDLINE_FAULTS=name[:N],...`` in the daemon's environment makes the N-th time
(default the first) the daemon passes ``crash_point(name)`` kill it with SIGKILL, as
a power cut or the OOM killer would; ``name@SECONDS[:N]`` pauses there instead, to
hold a race open; ``name!ERRNO[:N]`` raises OSError(ERRNO) there, as the system call
that follows it would (``metadata.fsync!EIO``: a disk that fails a write-back);
``name~`` holds the daemon there whenever the test asks: on reaching it with
``$WORLDLINE_PAUSE_DIR/<name>.hold`` present, it takes that file away, makes
``<name>.reached`` and waits for ``<name>.go`` (at most ``WORLDLINE_PAUSE_TIMEOUT``
seconds, 30 unless told, so a broken test never hangs the daemon), so a test acts as
the agent would at that exact step of an operation, as many times as it likes with one
daemon. Unset (always, outside tests), a crash point costs one dict lookup.
"""

from __future__ import annotations

import errno
import os
import signal
import threading
import time

_armed: dict[str, int] = {}
_pause: dict[str, float] = {}
_errors: dict[str, int] = {}
_held: set[str] = set()  # name~: held until the test's go
for spec in filter(None, os.environ.get("WORLDLINE_FAULTS", "").split(",")):
    name, _, count = spec.partition(":")
    name, _, error = name.strip().partition("!")
    name, _, seconds = name.partition("@")
    if name.endswith("~"):
        name = name[:-1]
        _held.add(name)
    _armed[name] = int(count or 1)  # name~: every time, while the test asks
    if seconds:
        _pause[name] = float(seconds)
    if error:
        _errors[name] = getattr(errno, error)
_lock = threading.Lock()

POINTS = (
    "checkpoint.admitted",         # an incremental capture holds its turn, nothing read
    "capture.before_open",         # a changed file (symlink) listed, about to be opened (read)
    "capture.file_opened",         # a changed file opened and its size budgeted, not yet read
    "checkpoint.after_blobs",      # blobs written and synced, metadata not committed
    "checkpoint.before_flush",     # committed in the capture's turn, the fsync not taken
    "checkpoint.after_commit",     # committed, the reply not yet sent
    "capture.paused",              # a container paused for its world to be read
    "restore.stopped",             # the container stopped, the journal not written
    "restore.planned",             # the target checked and the plan made, no journal
    "restore.after_journal",       # journal written, nothing applied
    "restore.between_files",       # some files of a layer written, not all
    "restore.before_rename",       # a file written aside, not yet renamed into place
    # Between what a write of a tree (restore, fork, take-over) checked and what it
    # writes; each says the path at stake (apply.py):
    "restore.meta_in_place",       # an unchanged file about to be opened for its metadata
    "restore.before_folder",       # a folder the plan saw about to be opened and checked
    "restore.folder_made",         # a new folder made in the staging folder, not yet in place
    "restore.special_made",        # a symlink/FIFO/device made and owned in staging, not placed
    "restore.before_remove",       # an entry the plan saw about to be checked and removed
    "restore.before_link",         # a hard-link group's first name about to be opened
    "restore.before_retouch",      # a folder that gained links about to be opened for its time
    "restore.between_layers",      # the workspace applied, the container not
    "restore.before_commit",       # every layer applied, the checkpoint not appended
    "gc.chosen",                   # gc chose what retention prunes, nothing pruned yet
    "fork.mid",                    # some of the fork's files written
    "fork.checked",                # the fork's folder checked, not yet made
    "session.checked",             # a new session's workspace checked, nothing read
    "blobs.after_put",             # a pack is in the bucket, not yet in the index
    "blobs.rewrite_after_put",     # a host's packs rewritten as one in the bucket, unindexed
    "blobs.rewrite_after_index",   # the rewrite indexed, the objects it replaces not deleted
    "blobs.flush_after_put",       # staged objects PUT as one, the rows still staged
    "takeover.checked",            # a take-over's new workspace checked, nothing claimed
    "takeover.mid",                # a take-over claimed the session, its workspace half made
    "takeover.placed",             # a take-over's workspace renamed into place, not yet recorded
    "repack.mid",                  # the idle repack rewrote a row, its transaction open
    "repack.step",                 # a repack step committed, the next not begun
    "metadata.fsync",              # a commit in meta.db's log, its fsync about to be taken
    "metadata.restart",            # meta.db's log copied whole, its restart about to be written
)


def crash_point(name: str, detail: str = "") -> None:
    """``detail``: what is at stake there (a layer's path), written into a held point's
    ``.reached`` file for the test."""
    if not _armed or name not in _armed:
        return
    if name in _held:
        _hold(name, detail)
        return
    with _lock:
        _armed[name] -= 1
        fire = _armed[name] == 0
    if fire and name in _pause:
        time.sleep(_pause[name])
    elif fire and name in _errors:
        raise OSError(_errors[name], os.strerror(_errors[name]))
    elif fire:
        os.kill(os.getpid(), signal.SIGKILL)


def _hold(name: str, detail: str) -> None:
    """Held here if the test asks (``<name>.hold``): say so, wait for its go."""
    folder = os.environ.get("WORLDLINE_PAUSE_DIR", "/tmp")
    try:
        os.unlink(os.path.join(folder, f"{name}.hold"))
    except FileNotFoundError:
        return
    go = os.path.join(folder, f"{name}.go")
    reached = os.path.join(folder, f"{name}.reached")
    with open(reached + ".tmp", "w") as f:
        f.write(detail)
    os.replace(reached + ".tmp", reached)  # whole, with its detail
    end = time.monotonic() + float(os.environ.get("WORLDLINE_PAUSE_TIMEOUT", "30"))
    while not os.path.exists(go) and time.monotonic() < end:
        time.sleep(0.002)
    for done in (os.path.join(folder, f"{name}.reached"), go):  # go last: the test
        # waits for it to be gone before it asks again
        try:
            os.unlink(done)
        except FileNotFoundError:
            pass
