"""A data root's id: it labels what the root makes in the Docker engine (containers,
images), and recovery and gc remove what carries it and nothing the root records.

Made once, in ``<root>/root-id``. Beside it, ``root-id.at`` holds the root's real path
as of its last start. A root that starts at another path was moved or copied: moved
when the old path holds no data root with its id (it keeps the id, and records where
it is now); copied when the old path still holds one, a folder other than this one.
A copy takes an id of its own: sharing the original's, its recovery would remove the
containers the original made after the copy (their sessions are not in the copy's
store), and its gc the images of the original's later checkpoints. A root last started
by a version that kept no ``root-id.at`` has none: its first start records where it
is, so a copy made before that start is not told apart from its original.

A copy's store names the original's workspaces and containers, which the original goes
on using: the start that finds the copy (``RootId.copy_of``) leaves them to it
(``World.recover``): no restore under way there is completed here, no container it had
paused or stopped is started, and each session waits for an operator's word before
this root checkpoints or restores its world.

An id that is not one (a damaged disk; an empty one would match every root's
containers) is set aside as ``root-id.damaged`` and a new one made: what the old one
labelled is no longer removed by this root, never anyone else's.
"""

from __future__ import annotations

import logging
import os
from typing import NamedTuple

from . import ids
from .storage.durable import replace_file

log = logging.getLogger(__name__)

ID_FILE = "root-id"
AT_FILE = "root-id.at"


class RootId(NamedTuple):
    value: str
    copy_of: str = ""  # the original's path, at the start that found this root a copy


def root_id(root: str) -> RootId:
    """The id of the data root at ``root``, made (or made anew for a copy) if need be."""
    path = os.path.join(root, ID_FILE)
    found = _read_id(path)
    here = os.path.realpath(root)
    if found is None:
        return RootId(_made(root, here))
    at = _read(os.path.join(root, AT_FILE), 4096)
    if at and at != here and _holds_the_same_root(at, found, here):
        log.warning("this data root (%s) is a copy of the one at %s, which is there with"
                    " the same id: it takes an id of its own, so that its recovery and gc"
                    " never remove the containers and images the original makes, and"
                    " leaves the original's sessions' worlds to it", here, at)
        return RootId(_made(root, here), copy_of=at)
    if at != here:  # moved, or first started by a version that recorded no path
        _record_where(root, here)
    return RootId(found)


def _read_id(path: str) -> str | None:
    """The id in ``path``; None if there is none, or it was not one (set aside)."""
    found = _read(path, 64)
    if found is None or ids.is_id(found):
        return found
    os.replace(path, path + ".damaged")
    log.warning("the data root's id (%s) is not an id: set aside as %s.damaged and made"
                " anew; containers and images labelled with the old one are no longer"
                " removed by this root", path, path)
    return None


def _holds_the_same_root(at: str, found: str, here: str) -> bool:
    """Whether the folder at ``at`` is another data root with the id ``found``."""
    try:
        if os.path.samefile(at, here):  # the same folder, by another path (a bind mount)
            return False
    except OSError:
        return False  # nothing there any more: moved
    return _read(os.path.join(at, ID_FILE), 64) == found


def _made(root: str, here: str) -> str:
    value = ids.new_id()
    replace_file(os.path.join(root, ID_FILE), value)
    _record_where(root, here)
    return value


def _record_where(root: str, here: str) -> None:
    """Record where the root starts; a disk that takes no write (full: the start goes
    on, on its reserve) leaves that to the next start."""
    try:
        replace_file(os.path.join(root, AT_FILE), here)
    except OSError as exc:
        log.warning("could not record where the data root is (%s): %s; a copy of it"
                    " started elsewhere before the next start here is not told apart",
                    os.path.join(root, AT_FILE), exc.strerror or exc)


def _read(path: str, limit: int) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode("utf-8", "replace").strip()
    except (FileNotFoundError, NotADirectoryError):
        return None
