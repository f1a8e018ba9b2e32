"""The restore journal: what makes a restore all-or-nothing across a crash.

Once a restore is planned (and before the first byte of any layer changes), the
journal records the session, the target, the checkpoint the restore will append, and
every path it will change in each layer, as it is and as it will be. At the next start
(or the session's next operation: session_lock.py), an entry left behind is completed
only if the layers are still as the restore left them; if anything else changed since,
or a layer is gone, the entry is set aside and the session marked ``needs_attention``
for an operator (``World.resolve``). An entry whose checkpoint was already recorded is
removed.

An entry, one JSON file per session (``<data root>/journal/<session>.json``)::

    {"session": id, "target": checkpoint restored, "head": the checkpoint it follows,
     "checkpoint": the fields of the checkpoint it appends (``journalled``),
     "layers": [{"kind": ..., "path": root folder,
                 "paths": {path: [entry_key as it was, entry_key as it will be]}}]}

With a data key (encryption at rest) the file holds that JSON sealed with the key's
metadata subkey, bound to the session's id: an entry names symlink targets, xattrs
and the checkpoint's label, the agent's content.
"""

from __future__ import annotations

import json
import os

from worldline.wire.errors import DataLoss

from ..records import Checkpoint
from ..storage.durable import replace_file

_CONTEXT = b"restore journal "  # + the session's id: an entry opens under its own name


def new_entry(session_id: str, target: str, head: str, cp: Checkpoint) -> dict:
    """An entry for a restore of ``session_id`` to ``target`` appending ``cp`` after
    ``head``; its layers are added once the restore is planned (plan.py)."""
    return {"session": session_id, "target": target, "head": head,
            "checkpoint": cp.__dict__ | {"acknowledged": list(cp.acknowledged)}}


def journalled(entry: dict) -> Checkpoint:
    """The checkpoint a journalled restore appends: its trees are the ones the layers
    are brought to (the target's, or for a restore of some paths, the world with
    them), and its task list the session's after it."""
    fields = entry["checkpoint"]
    return Checkpoint(**{**fields, "acknowledged": tuple(fields["acknowledged"])})


class RestoreJournal:
    """One JSON file per session with a restore under way, written durably.

    Only this daemon writes the folder (its data root is its own, under its lock), so
    it knows which sessions may have an entry: ``get``, asked before every operation
    on a session, opens a file only for those (a set that may name more sessions than
    have files, never fewer)."""

    def __init__(self, folder: str, key=None) -> None:
        self.folder = folder
        # crypto.DataKey of a keyed data root: an entry holds the agent's content (a
        # symlink's target, xattrs, the checkpoint's label), so it is sealed with it
        self.key = key
        self.aside = os.path.join(folder, "set-aside")
        os.makedirs(self.aside, mode=0o700, exist_ok=True)
        self._maybe = {name.removesuffix(".json") for name in os.listdir(folder)
                       if name.endswith(".json")}

    def _path(self, session_id: str) -> str:
        return os.path.join(self.folder, f"{session_id}.json")

    def write(self, entry: dict) -> None:
        self._maybe.add(entry["session"])
        data = json.dumps(entry).encode()
        if self.key is not None:
            data = self.key.seal_meta(data, _CONTEXT + entry["session"].encode())
        replace_file(self._path(entry["session"]), data)

    def remove(self, session_id: str) -> None:
        try:
            os.unlink(self._path(session_id))
        except FileNotFoundError:
            pass
        self._maybe.discard(session_id)

    def targets(self) -> set[str]:
        """The checkpoints that the restores under way bring back, and those set aside
        for an operator would (``World.resolve`` may complete one)."""
        found = set()
        for session_id in list(self._maybe):
            entry = self.get(session_id)
            if entry is not None:
                found.add(entry.get("target"))
        for name in os.listdir(self.aside):
            if name.endswith(".json"):
                entry = self.get_set_aside(name.removesuffix(".json"))
                if isinstance(entry, dict):
                    found.add(entry.get("target"))
        found.discard(None)
        return found

    def get(self, session_id: str) -> dict | None:
        if session_id not in self._maybe:
            return None
        try:
            return self._read(self._path(session_id))
        except FileNotFoundError:
            return None

    def set_aside(self, session_id: str) -> None:
        """Keep the entry for an operator (``World.resolve``), out of the way of starts."""
        try:
            os.replace(self._path(session_id), os.path.join(self.aside, f"{session_id}.json"))
        except FileNotFoundError:
            pass
        self._maybe.discard(session_id)

    def get_set_aside(self, session_id: str) -> dict | None:
        try:
            return self._read(os.path.join(self.aside, f"{session_id}.json"))
        except FileNotFoundError:
            return None

    def drop_set_aside(self, session_id: str) -> None:
        try:
            os.unlink(os.path.join(self.aside, f"{session_id}.json"))
        except FileNotFoundError:
            pass

    def entries(self) -> list[dict]:
        """Every entry of a restore under way; one that cannot be read is set aside."""
        out = []
        for name in sorted(os.listdir(self.folder)):
            path = os.path.join(self.folder, name)
            if name.endswith(".tmp"):
                os.unlink(path)  # never completed: the restore had not begun
                continue
            if not name.endswith(".json"):
                continue
            try:
                entry = self._read(path)
                if not isinstance(entry, dict) or "session" not in entry:
                    raise ValueError("not a journal entry")
                out.append(entry)
            except (OSError, ValueError, DataLoss):
                os.replace(path, os.path.join(self.aside, name))
        return out

    def _read(self, path: str):
        """The entry in the file at ``path`` (opened with the key of a keyed root)."""
        with open(path, "rb") as f:
            data = f.read()
        if self.key is not None:
            session = os.path.basename(path).removesuffix(".json").encode()
            data = self.key.open_meta(data, _CONTEXT + session)
        return json.loads(data)
