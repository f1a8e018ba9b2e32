"""What a session's history shows, read and never changed: a checkpoint's view, the
diff of two checkpoints, one path's history and content, the side effects between
two checkpoints.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field

from worldline.wire.errors import NotFound
from worldline.wire.paths import escape

from .. import history
from ..capture.layers import CONTAINER, WORKSPACE
from ..capture.trees import BLOCK, CHAR, FILE, MAPPED, SOCKET, Diff, Entry, diff, entry_at
from ..records import Checkpoint, Task, ToolCall, tasks_from_json
from ..storage.metadata_store import Store
from ..storage.store import calls_on_path, with_gates
from .core import Core


@dataclass
class CheckpointView:
    checkpoint: Checkpoint
    messages: list
    state: dict
    tasks: list[Task]
    skipped: list[str] = field(default_factory=list)  # recorded, never recreated


def side_effects_since(store: Store, head_id: str, target_id: str) -> list[ToolCall]:
    """Non-idempotent tool calls recorded after ``target_id`` on the way to
    ``head_id``, and gate bypasses (gated calls that ran without an approval)."""
    calls = with_gates(store, calls_on_path(store, head_id, since=target_id))
    return [c for c in calls if c.effect == "external_non_idempotent" or c.gate]


class Reads:
    def __init__(self, core: Core) -> None:
        self.core = core

    def view(self, checkpoint_id: str) -> CheckpointView:
        core = self.core
        cp = core.checkpoint_record(checkpoint_id)
        messages = [json.loads(m) for m in core.store.conversation(cp.id)]
        state = json.loads(core.blobs.read_bytes(cp.state_digest))
        tasks = tasks_from_json(core.blobs.read_bytes(cp.tasks_digest))
        skipped = []
        if not cp.pruned:
            skipped = self._skipped(cp.tree, WORKSPACE) + (
                [f"container:{p}" for p in self._skipped(cp.container, CONTAINER)]
                if cp.container else [])
        return CheckpointView(cp, messages, state, tasks, skipped)

    def _skipped(self, root: str, kind: str) -> list[str]:
        """Entries a restore does not recreate: sockets; device nodes outside a container."""
        never = (SOCKET,) if kind == CONTAINER else (SOCKET, CHAR, BLOCK)
        return [path for path, e in self.core.trees.walk(root) if e.kind in never]

    def diff(self, from_id: str, to_id: str, patch: bool = False
             ) -> tuple[Diff, Diff | None, str]:
        """The workspace's changes, the container layer's (None when neither checkpoint has
        one; an absent layer counts as empty), and a patch of the workspace's text files."""
        core = self.core
        trees = core.trees
        a, b = core.usable(from_id), core.usable(to_id)
        changes = diff(trees, a.tree, b.tree)
        box = None
        if a.container is not None or b.container is not None:
            box = diff(trees, a.container or core.empty_tree, b.container or core.empty_tree)
        if not patch:
            return changes, box, ""
        parts = []
        for path in sorted(changes.added + changes.modified + changes.deleted):
            parts.append(self._patch(path, entry_at(trees, a.tree, path),
                                     entry_at(trees, b.tree, path)))
        return changes, box, "".join(parts)

    def path_history(self, session_id: str, path: str, patch: bool = False
                     ) -> list[history.PathChange]:
        """The checkpoints of the session's lineage (its forks' ancestry included) that
        changed ``path``, newest first, each with the tool calls made since the one
        before it (history.changes_of). A rename is a deletion of one path and an
        addition of another: each path's history shows its own."""
        store = self.core.store
        session = self.core.session(session_id)
        path = history.check_path(path)
        mine = {cp.id: cp for cp in store.list_checkpoints(session.id)}
        chain = [mine.get(cid) or store.get_checkpoint(cid)
                 for cid, _ in store.lineage(session.head)]
        calls: dict[str, list[ToolCall]] = {}
        for call in calls_on_path(store, session.head):
            calls.setdefault(call.checkpoint_id, []).append(call)
        return history.changes_of(self.core.trees, path, chain, calls,
                                  (lambda old, new: self._patch(path, old, new))
                                  if patch else None)

    def read_file(self, checkpoint_id: str, path: str, offset: int = 0, length: int = 0
                  ) -> tuple[bytes, int, str]:
        """(bytes, whole size, kind) of the file or symlink at ``path`` as of the
        checkpoint; a slice from ``offset`` (history.READ_LIMIT at most)."""
        cp = self.core.usable(checkpoint_id)
        path = history.check_path(path)
        entry = history.PathLookup(self.core.trees, path).entry(cp.tree, strict=True)
        if entry is None:
            raise NotFound(f"checkpoint {cp.id} has no {path}")
        data, size = history.read_entry(self.core.blobs, entry, path, offset, length)
        return data, size, "symlink" if entry.kind == "symlink" else "file"

    def _patch(self, path: str, old: Entry | None, new: Entry | None) -> str:
        path = escape(path)
        return history.metadata_change(path, old, new) + self._text_patch(path, old, new)

    def _text_patch(self, path: str, old: Entry | None, new: Entry | None) -> str:
        if old is not None and new is not None and (old.kind, old.ref) == (new.kind, new.ref):
            return ""  # the same bytes: what changed is said by metadata_change
        if any(e is not None and e.kind in MAPPED for e in (old, new)):
            return history.binary_patch(self.core.blobs, path, old, new)
        texts = []
        for entry in (old, new):
            if entry is None or entry.kind != FILE:
                texts.append([])
                continue
            data = self.core.blobs.read_bytes(entry.ref)
            if b"\0" in data[:8192] or len(data) > (2 << 20):
                return f"Binary files a/{path} and b/{path} differ\n"
            try:
                texts.append(data.decode("utf-8").splitlines(keepends=True))
            except UnicodeDecodeError:
                return f"Binary files a/{path} and b/{path} differ\n"
        lines = difflib.unified_diff(texts[0], texts[1],
                                     "/dev/null" if old is None else f"a/{path}",
                                     "/dev/null" if new is None else f"b/{path}")
        return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
                       for line in lines)
