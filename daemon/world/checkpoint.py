"""A checkpoint: the session's world captured, layer by layer, and committed as one
record after its head.

The hot path, in order: the session locked and read (session_lock.py), its layers
(core.py), a turn at the admission gate (``_admitted``), the container paused while
each layer is captured (hold.py; the snapshotter reads only what the tracker says
changed), the state and task list put, the blobs and the record committed together
(``_commit``), then each layer told what was committed, so its next capture starts
from it. Nothing here touches a file: the per-file work is the snapshotter's.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import replace

from .. import ids, owners
from ..capture.admission import FairGate
from ..capture.layers import Layer
from ..capture.snapshotter import Capture
from ..faults import crash_point
from ..observe import ADMISSION_TURN, ADMISSION_TURN_CPU, ADMISSION_WAIT
from ..records import AuditEvent, Checkpoint, Session, Task, tasks_to_json
from ..validate import check_text, check_warnings, parse_messages, parse_resume, parse_state
from .core import Core
from .hold import ContainerHold
from .plan import bases
from .session_lock import SessionLock

log = logging.getLogger(__name__)

# Seconds an incremental capture keeps its turn at the admission gate; a longer one (a
# file of gigabytes) goes on beside the next, which would otherwise wait for all of it.
TURN_SECONDS = 0.25


class Checkpoints:
    def __init__(self, core: Core, hold: ContainerHold, lock: SessionLock) -> None:
        self.core = core
        self.hold = hold
        self.lock = lock
        # incremental captures take turns, a long one for its first TURN_SECONDS only
        self.admission = FairGate(1, patience=TURN_SECONDS)  # (admission.py)

    def checkpoint(self, session_id: str, *, label: str = "", reasoning: str = "",
                   trace_id: str = "", messages_json: str = "", state_json: str = "",
                   expected_head: str = "", resume_json: str = "",
                   warnings: tuple[str, ...] | list[str] = ()) -> Checkpoint:
        """``warnings``: what the caller knows this checkpoint lacks (a transcript it
        could not read); the daemon's queued ones (warn_next) follow them."""
        warnings = check_warnings(warnings)
        messages = parse_messages(messages_json)
        state = parse_state(state_json)
        resume = parse_resume(resume_json)
        for what, text in (("label", label), ("reasoning", reasoning), ("trace id", trace_id)):
            check_text(what, text)
        core = self.core
        with self.lock.locked(session_id, expected_head) as (session, tasks):
            head = core.heads.get(session_id)
            if head is None or head.id != session.head:  # another call or host moved it
                head = core.store.get_checkpoint(session.head)
            if self.hold.gone(session):
                # The workspace goes on being checkpointed; the container layer last
                # captured is carried forward, so a restore or fork can make it again.
                session = replace(session, container=None)
                log.warning("session %s: container gone; checkpointing the workspace and"
                            " carrying its last layer forward", session.id)
            layers = core.layers(session)
            all_warnings = self._queued_warnings(session_id, warnings)
            try:
                return self._checkpoint(session, head, layers, messages, state, tasks, label,
                                        reasoning, trace_id, resume, all_warnings)
            except BaseException:
                self._requeue_warnings(session_id, all_warnings, warnings)
                raise

    def _checkpoint(self, session: Session, head: Checkpoint, layers: list[Layer],
                    messages: list, state: bytes | None, task_list: list[Task], label: str,
                    reasoning: str, trace_id: str, resume: str | None = None,
                    warnings: tuple[str, ...] = ()) -> Checkpoint:
        """``task_list``: the session's, read with it under the lock (a change to it
        racing this checkpoint lands in this one or the next, as with the files).

        A commit that writes only this host's disk (the embedded store and blobs) is
        Python work but for its fsync: it runs in the capture's turn (_admitted), and
        its fsync after the turn, beside the next capture; run beside the next capture
        instead, it would take the interpreter lock from it at each of its system calls.
        A fleet's commit waits on the network (a PUT, PostgreSQL's round trips): never
        in the turn."""
        taken: list[tuple[Layer, Capture, object]] = []
        later = self.core.flush_later()
        try:
            if later is not None:
                with later as flush, self._admitted(layers, head):
                    captured = self._capture(session, head, layers, taken, state,
                                             task_list)
                    cp = self._commit(session, head, captured, messages, label, reasoning,
                                      trace_id, resume, warnings)
                crash_point("checkpoint.before_flush")
                flush()
            else:
                with self._admitted(layers, head):
                    captured = self._capture(session, head, layers, taken, state,
                                             task_list)
                cp = self._commit(session, head, captured, messages, label, reasoning,
                                  trace_id, resume, warnings)
        except BaseException:
            for layer, _, changes in taken:
                layer.give_back(changes)
            raise
        crash_point("checkpoint.after_commit")
        self.core.heads[session.id] = cp  # the next checkpoint starts from it (what it
        # reads of a record, its trees and digests, never changes)
        for layer, capture, _ in taken:
            layer.committed(capture)
            for warning in capture.warnings:
                log.warning("session %s %s: %s", session.id, layer.kind, warning)
        return cp

    @contextlib.contextmanager
    def _admitted(self, layers: list[Layer], head: Checkpoint) -> Iterator[None]:
        """Incremental captures take turns (admission.py), and a local commit's Python
        work with them; its fsync overlaps the next capture. A full scan, which spends
        its time in system calls outside the interpreter lock, is not made to wait, nor
        makes the others wait behind it."""
        if any(layer.scans_everything(base)
               for layer, base in zip(layers, bases(head), strict=False)):
            yield
            return
        asked = time.perf_counter()
        with self.admission.admitted():
            began, cpu = time.perf_counter(), time.thread_time()
            ADMISSION_WAIT.observe(began - asked)
            try:
                crash_point("checkpoint.admitted")  # a long capture, held open by tests
                yield
            finally:
                ADMISSION_TURN_CPU.inc(time.thread_time() - cpu)
                ADMISSION_TURN.observe(time.perf_counter() - began)

    def _capture(self, session: Session, head: Checkpoint, layers: list[Layer],
                 taken: list, state: bytes | None, task_list: list[Task]
                 ) -> tuple[list[Capture], str, str]:
        """Capture each layer (appending to ``taken`` what a failure gives back) and put
        the state and task list: (captures, state digest, tasks digest)."""
        core = self.core
        with self.hold.paused(session) as mapped:
            for layer, base in zip(layers, bases(head), strict=False):
                capture, changes = layer.capture(base, mapped=mapped)
                taken.append((layer, capture, changes))
        agent = owners.agent_of(session.spec)
        if agent is not None:  # its own files only (owners.py)
            owners.check_entries(core.trees, head.tree, taken[0][1].root, agent)
        state_digest = (core.blobs.put_bytes(state, base=head.state_digest)
                        if state is not None else head.state_digest)
        tasks = tasks_to_json(task_list)
        # Unchanged since the head (the usual case): its blob is the head's, kept as the
        # state's is, with no put (a question to the pack) for it.
        tasks_digest = (head.tasks_digest if core.blobs.address(tasks) == head.tasks_digest
                        else core.blobs.put_bytes(tasks, base=head.tasks_digest))
        return [c for _, c, _ in taken], state_digest, tasks_digest

    def _commit(self, session: Session, head: Checkpoint,
                captured: tuple[list[Capture], str, str], messages: list, label: str,
                reasoning: str, trace_id: str, resume: str | None,
                warnings: tuple[str, ...] = ()) -> Checkpoint:
        captures, state_digest, tasks_digest = captured
        with self.core.blobs.committing() as objects:  # the bucket's, indexed in the commit
            crash_point("checkpoint.after_blobs")
            cp = Checkpoint(ids.new_id(), session.id, 0, head.id, "checkpoint", ids.now(),
                            captures[0].root, captures[0].bytes, state_digest, tasks_digest,
                            head.id, len(messages), head.message_count + len(messages),
                            label=label, reasoning=reasoning, trace_id=trace_id,
                            container=captures[1].root if len(captures) > 1
                            else head.container,  # a container gone: its last layer
                            resume=head.resume if resume is None else resume,
                            warnings=warnings)
            return self.core.store.append_checkpoint(cp, messages, head.id, None, [
                AuditEvent("checkpoint", session.id, cp.id,
                           checkpoint_detail(cp, label, len(messages)), ids.now())],
                objects)

    # -- warnings the daemon queues for a session's next checkpoint -----------------------
    def warn_next(self, session_id: str, text: str) -> None:
        """A warning the session's next checkpoint carries (its ``warnings``, beside the
        caller's): what the daemon saw happen between checkpoints, e.g. a gated call that
        ran anyway. Held in this daemon's memory until that checkpoint is committed."""
        check_warnings([text])
        with self.core.guard:
            self.core.warnings.setdefault(session_id, []).append(text)

    def _queued_warnings(self, session_id: str, given: tuple[str, ...] = ()
                         ) -> tuple[str, ...]:
        """The daemon's warnings for the session's next checkpoint, taken (after the
        caller's ``given``); given back by ``_requeue_warnings`` when it fails."""
        with self.core.guard:
            return given + tuple(self.core.warnings.pop(session_id, ()))

    def _requeue_warnings(self, session_id: str, taken: tuple[str, ...],
                          given: tuple[str, ...]) -> None:
        mine = list(taken[len(given):])
        if mine:
            with self.core.guard:
                self.core.warnings[session_id] = mine + self.core.warnings.get(session_id, [])


def checkpoint_detail(cp: Checkpoint, label: str | None, messages: int) -> dict:
    """A checkpoint's audit detail: its tree, and what is not the default (an audit row
    per checkpoint is a large share of the metadata: no container, no label and no
    messages, the usual case, are said by their absence)."""
    detail: dict = {"tree": cp.tree}
    if cp.container:
        detail["container"] = cp.container
    if label:
        detail["label"] = label
    if messages:
        detail["messages"] = messages
    if cp.warnings:
        detail["warnings"] = list(cp.warnings)
    return detail
