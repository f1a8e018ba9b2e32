"""A session's spec: what its world is made of, recorded with it.

The store keeps it as JSON text (``Session.spec``, keys sorted); this is its typed
form, parsed once per distinct text (a checkpoint reads it on every call) and written
back in the same format. Its fields, each absent (None) until something records it:

- ``roots``: by layer kind (``workspace``, ``container``), the identity
  (st_dev, st_ino) of the layer's root folder. Every capture and restore opens the
  root only if it is still that folder (``folders.open_layer_root``).
- ``exclude``: gitignore patterns of workspace paths never captured nor restored.
- ``container``: the container's creation spec (``Engine.creation_spec``), from which
  a removed container is made again, a fork's container made, an image exported.
- ``workspace``: the folder the container spec's bind mounts refer to (the session's
  first workspace; a take-over moves the session, not the recorded binds).
- ``agent``: [uid, gid] of the allowed user whose session it is (owners.py); absent:
  the daemon owner's.
- ``staging``, ``placed``: a take-over under way (fleet.py): the identity of the
  folder it writes the workspace in, and of that folder once put in place.

Keys it does not name are kept as they are (``other``). A parsed spec is shared
between callers: it is never changed in place, only copied (``dataclasses.replace``).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field, fields
from typing import Any

from .owners import Agent


@dataclass(frozen=True)
class SessionSpec:
    roots: dict[str, list[int]] | None = None
    exclude: list[str] | None = None
    container: dict | None = None
    workspace: str | None = None
    agent: list[int] | None = None
    staging: list[int] | None = None
    placed: list[int] | None = None
    other: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def parse(text: str | None) -> SessionSpec:
        """The spec a session records (its ``spec`` text; "" or None: an empty one)."""
        return _parse(text or "{}")

    def root(self, kind: str) -> list[int] | None:
        """The identity recorded for the root of the layer ``kind``, or None."""
        return self.roots.get(kind) if self.roots else None

    @property
    def patterns(self) -> list[str]:
        """The --exclude patterns ([] if none), a list of the caller's own."""
        return list(self.exclude or ())

    @property
    def owner(self) -> Agent | None:
        """The allowed user whose session it is; None: the daemon owner's."""
        return Agent(int(self.agent[0]), int(self.agent[1])) if self.agent else None

    def as_dict(self) -> dict[str, Any]:
        out = dict(self.other)
        for name in _FIELDS:
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out

    def to_json(self) -> str:
        """The text the store keeps."""
        return json.dumps(self.as_dict(), sort_keys=True)


_FIELDS = tuple(f.name for f in fields(SessionSpec) if f.name != "other")


@functools.lru_cache(maxsize=4096)
def _parse(text: str) -> SessionSpec:
    raw = json.loads(text)
    return SessionSpec(**{name: raw.pop(name) for name in _FIELDS if name in raw}, other=raw)
