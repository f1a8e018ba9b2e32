"""The World: checkpoint, restore and fork a session's whole world at once.

A session's world is its conversation, agent state, task list and workspace (and,
with the container issue, its container). The World coordinates the snapshotters,
the blob store and the metadata store; it never talks gRPC. Every operation on a
workspace holds that workspace's lock, so a capture never races a restore.
History only grows: restore and fork append a checkpoint, never rewrite one.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
import shutil
import threading
from dataclasses import dataclass, field, replace

from worldline.client.errors import (
    Aborted,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
)

from . import ids
from .blobs import BlobStore
from .records import (
    AuditEvent,
    Checkpoint,
    Session,
    Task,
    ToolCall,
    tasks_from_json,
    tasks_to_json,
)
from .snapshot import Capture, WorkspaceSnapshotter
from .statcache import StatCache
from .store import Store, calls_on_path
from .tracker import ChangeMonitor, Changes, WorkspaceTracker
from .trees import EMPTY_TREE, FILE, Diff, Entry, TreeReader, diff

log = logging.getLogger(__name__)

MAX_STATE_BYTES = 16 << 20
MAX_MESSAGES_BYTES = 32 << 20
MAX_TEXT = 64 << 10  # labels, reasoning, names
EMPTY_STATE = b"{}"


@dataclass
class RestoreResult:
    checkpoint: Checkpoint | None
    restored_from: str
    files_written: list[str]
    files_removed: list[str]
    side_effects: list[ToolCall]
    dry_run: bool = False


@dataclass
class ForkResult:
    session: Session
    side_effects: list[ToolCall] = field(default_factory=list)


@dataclass
class CheckpointView:
    checkpoint: Checkpoint
    messages: list
    state: dict
    tasks: list[Task]


def parse_messages(text: str) -> list[str]:
    """Validate a JSON list of messages; return each message as canonical JSON text."""
    if not text:
        return []
    if len(text) > MAX_MESSAGES_BYTES:
        raise ResourceExhausted(
            f"messages are {len(text)} bytes; the limit is {MAX_MESSAGES_BYTES}")
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise InvalidArgument(f"messages are not valid JSON: {exc}") from None
    if not isinstance(value, list):
        raise InvalidArgument("messages must be a JSON list of message objects")
    for i, msg in enumerate(value):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise InvalidArgument(f"message {i} must be an object with a string \"role\"")
    return [json.dumps(m, ensure_ascii=False, separators=(",", ":")) for m in value]


def parse_state(text: str) -> bytes | None:
    if not text:
        return None
    if len(text) > MAX_STATE_BYTES:
        raise ResourceExhausted(f"state is {len(text)} bytes; the limit is {MAX_STATE_BYTES}")
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise InvalidArgument(f"state is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidArgument("state must be one JSON object")
    return json.dumps(value, ensure_ascii=False, sort_keys=True,
                      separators=(",", ":")).encode("utf-8")


def check_text(what: str, value: str) -> str:
    if len(value) > MAX_TEXT:
        raise InvalidArgument(f"{what} is {len(value)} characters; the limit is {MAX_TEXT}")
    return value


def check_id(what: str, value: str) -> str:
    if not ids.is_id(value):
        raise InvalidArgument(f"{value!r} is not a valid {what} id")
    return value


class World:
    def __init__(self, root: str, store: Store, blobs: BlobStore, stat_cache: StatCache,
                 monitor: ChangeMonitor | None = None) -> None:
        self.root = os.path.realpath(root)
        self.store = store
        self.blobs = blobs
        self.trees = TreeReader(blobs)
        self.stat_cache = stat_cache
        self.monitor = monitor
        self.fork_root = os.path.join(self.root, "workspaces")
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self.empty_tree = blobs.put_bytes(EMPTY_TREE)
        self.empty_state = blobs.put_bytes(EMPTY_STATE)
        blobs.sync()

    # -- helpers ---------------------------------------------------------------------
    def lock(self, workspace: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(workspace, threading.Lock())

    def tracker(self, workspace: str) -> WorkspaceTracker | None:
        return self.monitor.tracker(workspace) if self.monitor is not None else None

    def snapshotter(self, session: Session) -> WorkspaceSnapshotter:
        tracker = self.tracker(session.workspace)
        return WorkspaceSnapshotter(session.workspace, self.blobs, self.trees, self.stat_cache,
                                    tracker.watch_folder if tracker is not None else None)

    def _changes(self, workspace: str, base: str, consume: bool) -> Changes | None:
        """What changed in the workspace since ``base``, or None: examine everything."""
        tracker = self.tracker(workspace)
        if tracker is None:
            return None
        changes = tracker.prepare() if consume else tracker.peek()
        if tracker.base != base:
            changes.full = True  # the tracker's picture is relative to another tree
        return changes

    def _give_back(self, workspace: str, changes: Changes | None) -> None:
        tracker = self.tracker(workspace)
        if tracker is not None and changes is not None:
            tracker.give_back(changes)

    def _tracked(self, workspace: str, tree: str) -> None:
        """The workspace is now exactly ``tree`` plus what the tracker has seen since."""
        tracker = self.tracker(workspace)
        if tracker is not None:
            tracker.base = tree

    def session(self, session_id: str) -> Session:
        return self.store.get_session(check_id("session", session_id))

    def checkpoint_record(self, checkpoint_id: str) -> Checkpoint:
        return self.store.get_checkpoint(check_id("checkpoint", checkpoint_id))

    def _check_workspace(self, path: str, *, must_be_empty: bool) -> str:
        if not path or not os.path.isabs(path):
            raise InvalidArgument(f"workspace {path!r} must be an absolute path")
        if os.path.lexists(path) and not os.path.isdir(path):
            raise InvalidArgument(f"workspace {path} is not a folder")
        if os.path.islink(path):
            raise InvalidArgument(f"workspace {path} is a symlink; give the folder itself")
        real = os.path.realpath(path)
        if real == "/":
            raise InvalidArgument("the file system root cannot be a workspace")
        inside_forks = real.startswith(self.fork_root + os.sep)
        if not inside_forks and (_contains(real, self.root) or _contains(self.root, real)):
            raise InvalidArgument(f"workspace {real} overlaps the data root {self.root}")
        if must_be_empty and os.path.isdir(real) and os.listdir(real):
            raise FailedPrecondition(f"workspace {real} is not empty")
        if not must_be_empty and not os.path.isdir(real):
            raise NotFound(f"workspace {real} does not exist")
        return real

    # -- sessions ------------------------------------------------------------------------
    def create_session(self, workspace: str, container: str | None = None,
                       name: str = "") -> Session:
        path = self._check_workspace(workspace, must_be_empty=False)
        check_text("name", name)
        sid = ids.new_id()
        session = Session(sid, name or os.path.basename(path), path, container or None, "",
                          None, ids.now())
        with self.lock(path):
            changes = self._changes(path, "", consume=True)
            try:
                capture = self.snapshotter(session).capture(changes=changes)
            except BaseException:
                self._give_back(path, changes)
                raise
            tasks_digest = self.blobs.put_bytes(tasks_to_json([]))
            self.blobs.sync()
            first = Checkpoint(ids.new_id(), sid, 0, None, "initial", ids.now(), capture.root,
                               capture.bytes, self.empty_state, tasks_digest, None, 0, 0,
                               label="session created")
            session = _with_head(session, first.id)
            self.store.create_session(session, first, [], [
                AuditEvent("session.create", sid, sid, {"workspace": path}, ids.now()),
                AuditEvent("checkpoint", sid, first.id, {"seq": 0, "tree": first.tree},
                           ids.now())])
            self.snapshotter(session).commit(capture)
            self._tracked(path, capture.root)
        return self.store.get_session(sid)

    # -- checkpoints -----------------------------------------------------------------------
    def checkpoint(self, session_id: str, *, label: str = "", reasoning: str = "",
                   trace_id: str = "", messages_json: str = "", state_json: str = "",
                   expected_head: str = "") -> Checkpoint:
        messages = parse_messages(messages_json)
        state = parse_state(state_json)
        for what, text in (("label", label), ("reasoning", reasoning), ("trace id", trace_id)):
            check_text(what, text)
        session = self.session(session_id)
        if expected_head:
            check_id("checkpoint", expected_head)
        with self.lock(session.workspace):
            session = self.session(session_id)
            if expected_head and expected_head != session.head:
                raise Aborted(f"session {session_id} head is {session.head}, not {expected_head}")
            head = self.store.get_checkpoint(session.head)
            snap = self.snapshotter(session)
            changes = self._changes(session.workspace, head.tree, consume=True)
            try:
                capture = snap.capture(changes=changes, base=head.tree)
                state_digest = (self.blobs.put_bytes(state) if state is not None
                                else head.state_digest)
                tasks_digest = self.blobs.put_bytes(
                    tasks_to_json(self.store.list_tasks(session_id)))
                self.blobs.sync()
                cp = Checkpoint(ids.new_id(), session_id, 0, head.id, "checkpoint", ids.now(),
                                capture.root, capture.bytes, state_digest, tasks_digest, head.id,
                                len(messages), head.message_count + len(messages), label=label,
                                reasoning=reasoning, trace_id=trace_id)
                cp = self.store.append_checkpoint(cp, messages, head.id, None, [
                    AuditEvent("checkpoint", session_id, cp.id,
                               {"tree": cp.tree, "label": label, "messages": len(messages)},
                               ids.now())])
            except BaseException:
                self._give_back(session.workspace, changes)
                raise
            self._tracked(session.workspace, capture.root)
            snap.commit(capture)
            for warning in capture.warnings:
                log.warning("session %s: %s", session_id, warning)
        return cp

    def view(self, checkpoint_id: str) -> CheckpointView:
        cp = self.checkpoint_record(checkpoint_id)
        messages = [json.loads(m) for m in self.store.conversation(cp.id)]
        state = json.loads(self.blobs.read_bytes(cp.state_digest))
        tasks = tasks_from_json(self.blobs.read_bytes(cp.tasks_digest))
        return CheckpointView(cp, messages, state, tasks)

    # -- side effects ------------------------------------------------------------------------
    def side_effects_since(self, head_id: str, target_id: str) -> list[ToolCall]:
        """Non-idempotent tool calls recorded after ``target_id`` on the way to ``head_id``."""
        return [c for c in calls_on_path(self.store, head_id, since=target_id)
                if c.effect == "external_non_idempotent"]

    # -- restore -------------------------------------------------------------------------------
    def restore(self, session_id: str, checkpoint_id: str, *, acknowledge: bool = False,
                dry_run: bool = False, expected_head: str = "") -> RestoreResult:
        target = self.checkpoint_record(checkpoint_id)
        session = self.session(session_id)
        with self.lock(session.workspace):
            session = self.session(session_id)
            if expected_head and expected_head != session.head:
                raise Aborted(f"session {session_id} head is {session.head}, not {expected_head}")
            effects = self.side_effects_since(session.head, target.id)
            snap = self.snapshotter(session)
            head = self.store.get_checkpoint(session.head)
            seen = self._changes(session.workspace, head.tree, consume=False)
            current = snap.capture(persist=False, changes=seen, base=head.tree)
            changes = diff(self.trees, current.root, target.tree, current.trees)
            written = sorted(changes.added + changes.modified)
            if dry_run:
                return RestoreResult(None, target.id, written, changes.deleted, effects, True)
            if effects and not acknowledge:
                names = ", ".join(f"{c.name} ({c.id})" for c in effects)
                raise FailedPrecondition(
                    f"restoring to {target.id} passes {len(effects)} non-idempotent side"
                    f" effect(s) no restore can undo: {names}; acknowledge them to proceed")
            snap.apply(current, target.tree)
            tasks = tasks_from_json(self.blobs.read_bytes(target.tasks_digest))
            cp = Checkpoint(ids.new_id(), session_id, 0, session.head, "restore", ids.now(),
                            target.tree, target.bytes, target.state_digest, target.tasks_digest,
                            target.id, 0, target.message_count, label=f"restore of {target.id}",
                            restored_from=target.id, acknowledged=tuple(c.id for c in effects))
            events = [AuditEvent("restore", session_id, cp.id,
                                 {"target": target.id, "written": len(written),
                                  "removed": len(changes.deleted)}, ids.now())]
            if effects:
                events.append(AuditEvent("side_effects.acknowledge", session_id, cp.id,
                                         {"tool_calls": [c.id for c in effects]}, ids.now()))
            cp = self.store.append_checkpoint(cp, [], session.head, tasks, events)
            if seen is not None and not seen.full:
                self._tracked(session.workspace, target.tree)
        return RestoreResult(cp, target.id, written, changes.deleted, effects)

    # -- fork -------------------------------------------------------------------------------------
    def fork(self, checkpoint_id: str, workspace: str = "", name: str = "") -> ForkResult:
        source = self.checkpoint_record(checkpoint_id)
        parent = self.store.get_session(source.session_id)
        check_text("name", name)
        sid = ids.new_id()
        path = self._check_workspace(workspace or os.path.join(self.fork_root, sid),
                                     must_be_empty=True)
        created = not os.path.exists(path)
        os.makedirs(path, mode=0o755, exist_ok=True)
        session = Session(sid, name or f"{parent.name} (fork)", path, None, "", source.id,
                          ids.now())
        try:
            with self.lock(path):
                snap = self.snapshotter(session)
                tracker = self.tracker(path)
                if tracker is not None:
                    tracker.prepare()  # drop the "no history" mark: we know what we write
                snap.apply(Capture(self.empty_tree, 0), source.tree, watch_new=True)
                first = Checkpoint(ids.new_id(), sid, 0, source.id, "fork", ids.now(),
                                   source.tree, source.bytes, source.state_digest,
                                   source.tasks_digest, source.id, 0, source.message_count,
                                   label=f"fork of {source.id}")
                session = _with_head(session, first.id)
                tasks = tasks_from_json(self.blobs.read_bytes(source.tasks_digest))
                self.store.create_session(session, first, tasks, [
                    AuditEvent("fork", sid, first.id,
                               {"source": source.id, "workspace": path}, ids.now())])
                self._tracked(path, source.tree)
        except BaseException:
            if created:
                _remove_tree(path)
            raise
        effects = self.side_effects_since(parent.head, source.id)
        return ForkResult(self.store.get_session(sid), effects)

    # -- diff ------------------------------------------------------------------------------
    def diff(self, from_id: str, to_id: str, patch: bool = False) -> tuple[Diff, str]:
        a, b = self.checkpoint_record(from_id), self.checkpoint_record(to_id)
        changes = diff(self.trees, a.tree, b.tree)
        if not patch:
            return changes, ""
        parts = []
        for path in sorted(changes.added + changes.modified + changes.deleted):
            parts.append(self._patch(path, self._entry(a.tree, path), self._entry(b.tree, path)))
        return changes, "".join(parts)

    def _entry(self, root: str, path: str) -> Entry | None:
        tree = self.trees.read(root)
        *folders, name = path.split("/")
        for part in folders:
            entry = tree.get(part)
            if entry is None or not entry.is_folder:
                return None
            tree = self.trees.read(entry.ref)
        return tree.get(name)

    def _patch(self, path: str, old: Entry | None, new: Entry | None) -> str:
        texts = []
        for entry in (old, new):
            if entry is None or entry.kind != FILE:
                texts.append([])
                continue
            data = self.blobs.read_bytes(entry.ref)
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


def _with_head(session: Session, head: str) -> Session:
    return replace(session, head=head)


def _contains(outer: str, inner: str) -> bool:
    return inner == outer or inner.startswith(outer.rstrip(os.sep) + os.sep)


def _remove_tree(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)
