"""The Store contract, run against every implementation."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest
from worldline.client.errors import (
    Aborted,
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
)
from worldline.daemon import ids
from worldline.daemon.records import (
    GENESIS_HASH,
    Approval,
    AuditEvent,
    Checkpoint,
    Session,
    Task,
    ToolCall,
    chain_hash,
)
from worldline.daemon.storage.crypto import DataKey
from worldline.daemon.storage.sql_store import SqlStore
from worldline.daemon.storage.sqlite_store import SqliteStore
from worldline.daemon.storage.store import MemoryStore, ordered_tasks

D = "0" * 64


KEY = DataKey(bytes(range(32)))


def make_store(kind: str, request, tmp_path):
    """``kind``: memory, sqlite or postgres; "+key": the agent's content sealed with
    a data key (sealed.py), the contract the same."""
    kind, _, keyed = kind.partition("+")
    key = KEY if keyed else None
    if kind == "memory":
        return MemoryStore()
    if kind == "sqlite":
        return SqliteStore(str(tmp_path / "meta.db"), key=key)
    from worldline.daemon.storage.postgres_store import PostgresStore
    return PostgresStore(request.getfixturevalue("postgres_url"), key=key)


@pytest.fixture(params=["memory", "sqlite", "postgres", "sqlite+key", "postgres+key"])
def store(request, tmp_path):
    s = make_store(request.param, request, tmp_path)
    yield s
    s.close()


def make_cp(session_id: str, parent: str | None, conv: str | None = None, n_msgs: int = 0,
            count: int = 0, kind: str = "checkpoint") -> Checkpoint:
    return Checkpoint(ids.new_id(), session_id, 0, parent, kind, ids.now(), D, 0, D, D,
                      conv if conv is not None else parent, n_msgs, count)


def new_session(store) -> tuple[Session, Checkpoint]:
    sid = ids.new_id()
    first = make_cp(sid, None, kind="initial")
    s = Session(sid, "s", "/ws", None, first.id, None, ids.now())
    store.create_session(s, first, [], [AuditEvent("session.create", sid, sid, {}, ids.now())])
    return store.get_session(sid), first


def test_session_round_trip(store):
    s, first = new_session(store)
    assert store.get_session(s.id).head == first.id
    assert [x.id for x in store.list_sessions()] == [s.id]
    assert store.get_checkpoint(first.id).seq == 0
    with pytest.raises(NotFound):
        store.get_session(ids.new_id())
    with pytest.raises(NotFound):
        store.get_checkpoint(ids.new_id())
    with pytest.raises(AlreadyExists):
        store.create_session(s, first, [], [])


def test_session_spec_and_attention_change_and_nothing_else(store):
    s, first = new_session(store)
    store.update_session(s.id, spec='{"roots": {}}', needs_attention="an interrupted restore")
    got = store.get_session(s.id)
    assert (got.spec, got.needs_attention, got.head) == ('{"roots": {}}',
                                                         "an interrupted restore", first.id)
    store.update_session(s.id, needs_attention=None)
    assert store.get_session(s.id).needs_attention is None
    with pytest.raises(ValueError):
        store.update_session(s.id, head="elsewhere")  # the head moves by compare-and-set
    with pytest.raises(NotFound):
        store.update_session(ids.new_id(), needs_attention="x")


def test_an_approval_is_used_up_by_one_tool_call(store):
    s, first = new_session(store)
    call = ToolCall(ids.new_id(), s.id, "deploy", "{}", None, "external_non_idempotent",
                    None, first.id, ids.now(), "", "01J0000000000000000000APPR")
    store.add_tool_call(call, [])
    again = ToolCall(ids.new_id(), s.id, "deploy", "{}", None, "external_non_idempotent",
                     None, first.id, ids.now(), "", "01J0000000000000000000APPR")
    with pytest.raises(FailedPrecondition):
        store.add_tool_call(again, [])
    assert store.list_tool_calls(session_id=s.id) == [call]


def test_append_moves_head_and_assigns_seq(store):
    s, first = new_session(store)
    a = store.append_checkpoint(make_cp(s.id, first.id), [], first.id, None, [])
    b = store.append_checkpoint(make_cp(s.id, a.id), [], a.id, None, [])
    assert (a.seq, b.seq) == (1, 2)
    assert store.get_session(s.id).head == b.id
    assert [c.id for c in store.list_checkpoints(s.id)] == [first.id, a.id, b.id]
    assert store.lineage(b.id) == [(b.id, s.id), (a.id, s.id), (first.id, s.id)]


def test_a_long_history_is_read_a_page_at_a_time(store):
    s, first = new_session(store)
    head, ids_ = first, [first.id]
    for _ in range(9):
        head = store.append_checkpoint(make_cp(s.id, head.id), [], head.id, None, [])
        ids_.append(head.id)
    other, _ = new_session(store)  # another session's checkpoints never join a page
    store.append_checkpoint(make_cp(other.id, _.id), [], _.id, None, [])
    assert store.count_checkpoints(s.id) == 10
    assert [c.id for c in store.list_checkpoints(s.id, limit=4)] == ids_[6:]
    assert [c.id for c in store.list_checkpoints(s.id, limit=4, before_seq=6)] == ids_[2:6]
    assert [c.id for c in store.list_checkpoints(s.id, limit=4, before_seq=2)] == ids_[:2]
    assert [c.id for c in store.list_checkpoints(s.id, before_seq=3)] == ids_[:3]
    assert store.list_checkpoints(s.id, limit=4, before_seq=0) == []


@pytest.mark.parametrize("with_events", [True, False])
def test_an_existing_checkpoint_id_is_already_exists_and_changes_nothing(store, with_events):
    """Pipelined on PostgreSQL, the duplicate surfaces at a later round trip or at the
    commit (no audit event: no round trip before it); either way nothing is kept."""
    s, first = new_session(store)
    a = store.append_checkpoint(make_cp(s.id, first.id), [], first.id, None, [])
    audit = store.list_audit()
    again = replace(make_cp(s.id, a.id, n_msgs=2, count=2), id=a.id)
    events = [AuditEvent("checkpoint", s.id, a.id, {}, ids.now())] if with_events else []
    with pytest.raises(AlreadyExists):
        store.append_checkpoint(again, ["m1", "m2"], a.id, None, events)
    assert store.get_session(s.id).head == a.id
    assert [c.id for c in store.list_checkpoints(s.id)] == [first.id, a.id]
    assert store.list_audit() == audit
    b = store.append_checkpoint(make_cp(s.id, a.id), [], a.id, None, [])
    assert b.seq == 2


def test_compare_and_set_loses_exactly_one(store):
    s, first = new_session(store)
    results = []

    def attempt():
        try:
            results.append(store.append_checkpoint(make_cp(s.id, first.id), [], first.id, None, []))
        except Aborted as exc:
            results.append(exc)

    threads = [threading.Thread(target=attempt) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wins = [r for r in results if isinstance(r, Checkpoint)]
    assert len(wins) == 1 and len(results) == 8
    assert store.get_session(s.id).head == wins[0].id
    assert len(store.list_checkpoints(s.id)) == 2


def test_conversation_follows_conversation_parents(store):
    s, first = new_session(store)
    a = store.append_checkpoint(make_cp(s.id, first.id, n_msgs=2, count=2),
                                ['{"role":"user","content":"1"}', '{"role":"a","content":"2"}'],
                                first.id, None, [])
    b = store.append_checkpoint(make_cp(s.id, a.id, n_msgs=1, count=3),
                                ['{"role":"user","content":"3"}'], a.id, None, [])
    # a restore to `a`: parent is b, conversation is a's
    r = store.append_checkpoint(make_cp(s.id, b.id, conv=a.id, count=2, kind="restore"), [],
                                b.id, None, [])
    assert len(store.conversation(b.id)) == 3
    assert store.conversation(r.id) == store.conversation(a.id)
    assert [cid for cid, _ in store.lineage(r.id)[:2]] == [r.id, b.id]


def test_tasks_replace_on_append(store):
    s, first = new_session(store)
    assert store.list_tasks(s.id) == []  # a session with none
    with pytest.raises(NotFound):  # no such session: not an empty list
        store.list_tasks(ids.new_id())
    store.set_task(s.id, Task("t1", "one", None, "pending", "", ids.now()), [])
    store.set_task(s.id, Task("t2", "two", None, "pending", "", ids.now()), [])
    store.set_task(s.id, Task("t1", "one", None, "completed", "", ids.now()), [])
    assert [(t.id, t.status) for t in store.list_tasks(s.id)] == [("t1", "completed"),
                                                                 ("t2", "pending")]
    store.append_checkpoint(make_cp(s.id, first.id), [], first.id,
                            [Task("t9", "nine", None, "pending", "", ids.now())], [])
    assert [t.id for t in store.list_tasks(s.id)] == ["t9"]


def test_a_session_and_its_tasks_read_together(store):
    s, _ = new_session(store)
    assert store.get_session_and_tasks(s.id) == (store.get_session(s.id), [])
    tasks = [Task("b", "second", None, "pending", "", ids.now()),
             Task("a", "first", "b", "in_progress", "a note", ids.now())]
    for task in tasks:
        store.set_task(s.id, task, [])
    store.update_session(s.id, needs_attention="look")
    session, read = store.get_session_and_tasks(s.id)
    assert session == store.get_session(s.id) and session.needs_attention == "look"
    assert read == store.list_tasks(s.id) == tasks  # in the order they were set
    with pytest.raises(NotFound):
        store.get_session_and_tasks(ids.new_id())


def _on_file(store, session_id: str):
    """The session and its tasks as the store's file holds them (SQLite: read through a
    connection of its own, past what the store keeps; others: as the store reads)."""
    if not isinstance(store, SqliteStore):
        return store.get_session_and_tasks(session_id)
    return SqlStore.get_session_and_tasks(store, session_id)


def test_a_session_read_after_any_write_is_what_the_store_holds(store):
    """Each write that changes a session or its tasks shows in the next read, and a
    checkpoint's moves its head and replaces its tasks exactly (SqliteStore keeps what
    it read and what it checkpointed: these are its cases)."""
    s, first = new_session(store)
    other, _ = new_session(store)
    task = Task("t1", "one", None, "pending", "", ids.now())
    head = first.id
    writes = [
        lambda: store.set_task(s.id, task, []),
        lambda: store.update_session(s.id, needs_attention="look"),
        lambda: store.append_checkpoint(make_cp(s.id, head), [], head, None, []),
        lambda: store.append_checkpoint(make_cp(s.id, head), [], head, [
            Task("t2", "two", None, "in_progress", "n", ids.now())], []),
        lambda: store.update_session(other.id, spec='{"k": 1}'),
        lambda: store.append_checkpoint(make_cp(s.id, head), [], head, [], []),
        lambda: store.claim_session(s.id, "h", "", 50.0, 10.0),
        lambda: store.append_checkpoint(make_cp(other.id, store.get_session(other.id).head),
                                        [], store.get_session(other.id).head, None, []),
        lambda: store.release_session(s.id, "h", "*"),
        lambda: store.update_session(s.id, deleted_at=ids.now()),
    ]
    for write in writes:
        for sid in (s.id, other.id):  # read before, so that a kept copy is there
            assert store.get_session_and_tasks(sid) == _on_file(store, sid)
        out = write()
        if isinstance(out, Checkpoint) and out.session_id == s.id:
            head = out.id
        for sid in (s.id, other.id):
            assert store.get_session_and_tasks(sid) == _on_file(store, sid), write
            assert store.get_session(sid) == _on_file(store, sid)[0]
    assert store.get_session(s.id).head == head


def test_a_failed_checkpoint_leaves_the_session_as_the_store_holds_it(store):
    s, first = new_session(store)
    store.get_session_and_tasks(s.id)
    with pytest.raises(Aborted):  # the head moved: nothing committed
        store.append_checkpoint(make_cp(s.id, first.id), [], ids.new_id(), [], [])
    assert store.get_session_and_tasks(s.id) == _on_file(store, s.id)
    assert store.get_session(s.id).head == first.id


def test_a_read_that_a_commit_overtook_keeps_nothing(tmp_path, monkeypatch):
    """SqliteStore keeps a session it read only if no transaction committed while it
    read: here one commits in the middle of the read (as another thread's could), and
    the next read finds what the file holds, not the older row."""
    store = SqliteStore(str(tmp_path / "meta.db"))
    try:
        s, _ = new_session(store)
        read = SqlStore.get_session_and_tasks

        def overtaken(self, session_id):
            found = read(self, session_id)
            store.update_session(s.id, needs_attention="changed meanwhile")
            return found
        monkeypatch.setattr(SqlStore, "get_session_and_tasks", overtaken)
        assert store.get_session_and_tasks(s.id)[0].needs_attention is None
        monkeypatch.setattr(SqlStore, "get_session_and_tasks", read)
        assert store.get_session_and_tasks(s.id)[0].needs_attention == "changed meanwhile"
    finally:
        store.close()


def test_ordered_tasks_depth_first():
    t = lambda i, p=None: Task(i, i, p, "pending", "", "")
    order = ordered_tasks([t("a"), t("b"), t("a1", "a"), t("b1", "b"), t("a2", "a")])
    assert [x.id for x in order] == ["a", "a1", "a2", "b", "b1"]


def test_tool_calls_by_checkpoint(store):
    s, first = new_session(store)
    call = ToolCall(ids.new_id(), s.id, "bash", "{}", None, "local", "k", first.id, ids.now())
    store.add_tool_call(call, [])
    assert store.list_tool_calls(checkpoint_ids=[first.id]) == [call]
    assert store.list_tool_calls(checkpoint_ids=[]) == []
    assert store.list_tool_calls(session_id=s.id) == [call]


def test_approval_decided_once(store):
    s, first = new_session(store)
    a = Approval(ids.new_id(), s.id, "deploy", "{}", "pending", first.id, ids.now(), ids.now())
    store.add_approval(a, [])
    assert store.list_approvals(status="pending") == [a]
    decided = store.decide_approval(a.id, "approved", "ok", ids.now(), [])
    assert decided.status == "approved" and decided.reason == "ok"
    with pytest.raises(FailedPrecondition):
        store.decide_approval(a.id, "denied", "no", ids.now(), [])
    with pytest.raises(NotFound):
        store.decide_approval(ids.new_id(), "denied", "no", ids.now(), [])


def test_audit_chain(store):
    new_session(store)
    store.append_audit([AuditEvent("x", None, "y", {"k": 1}, ids.now())])
    events = store.list_audit()
    assert [e.seq for e in events] == [1, 2]
    prev = GENESIS_HASH
    for e in events:
        assert e.prev_hash == prev and chain_hash(prev, e) == e.hash
        prev = e.hash
    assert store.list_audit(kind="x")[0].detail == {"k": 1}


def test_the_audit_log_since_a_time(store):
    """``since`` keeps the events recorded at or after it (gc reads a fleet's recent
    prunes so, not every one ever recorded)."""
    times = [ids.time_at(t) for t in (1000.0, 2000.0, 3000.0)]
    store.append_audit([AuditEvent("x", None, str(i), {}, at) for i, at in enumerate(times)])
    assert [e.subject_id for e in store.list_audit(kind="x", since=times[1])] == ["1", "2"]
    assert [e.subject_id for e in store.list_audit(since=ids.time_at(2000.5))] == ["2"]
    assert store.list_audit(kind="x", since=ids.time_at(3001.0)) == []


def test_the_audit_log_after_a_seq_and_its_newest(store):
    """``after_seq`` follows the log by its order, whatever the events' times (--notify
    reads it so); ``limit`` keeps the newest, oldest first."""
    times = [ids.time_at(t) for t in (2000.0, 1000.0, 3000.0)]
    store.append_audit([AuditEvent("x", None, str(i), {}, at) for i, at in enumerate(times)])
    first = store.list_audit(kind="x")[0].seq
    assert [e.subject_id for e in store.list_audit(after_seq=first)] == ["1", "2"]
    assert [e.subject_id for e in store.list_audit(kind="x", limit=2)] == ["1", "2"]
    assert [e.subject_id for e in store.list_audit(limit=1)] == ["2"]
    assert store.list_audit(after_seq=first + 2) == []


def test_calls_on_path_keep_to_their_timeline(store):
    from worldline.daemon.storage.store import calls_on_path
    s, first = new_session(store)
    a = store.append_checkpoint(make_cp(s.id, first.id), [], first.id, None, [])
    before = ToolCall(ids.new_id(), s.id, "t", "{}", None, "local", None, first.id, ids.now())
    after = ToolCall(ids.new_id(), s.id, "t", "{}", None, "local", None, a.id, ids.now())
    store.add_tool_call(before, [])
    store.add_tool_call(after, [])
    fork_id = ids.new_id()
    fork_first = make_cp(fork_id, a.id, kind="fork")
    store.create_session(Session(fork_id, "f", "/f", None, fork_first.id, a.id, ids.now()),
                         fork_first, [], [])
    in_fork = ToolCall(ids.new_id(), fork_id, "t", "{}", None, "local", None, fork_first.id,
                       ids.now())
    store.add_tool_call(in_fork, [])
    assert [c.id for c in calls_on_path(store, a.id)] == [before.id, after.id]
    assert [c.id for c in calls_on_path(store, a.id, since=a.id)] == [after.id]
    # the fork's history holds `before` (made before the fork point), not `after`
    assert [c.id for c in calls_on_path(store, fork_first.id)] == [before.id, in_fork.id]


def test_deletion_and_resume_points_round_trip(store):
    from dataclasses import replace
    s, first = new_session(store)
    resume = '{"agent":"codex","entries":3,"session_id":"x"}'
    cp = store.append_checkpoint(replace(make_cp(s.id, first.id), resume=resume), [],
                                 first.id, None, [])
    assert store.get_checkpoint(cp.id).resume == resume
    assert store.get_checkpoint(first.id).resume == ""
    assert store.list_checkpoints(s.id)[-1].resume == resume
    assert store.get_session(s.id).deleted_at is None
    store.update_session(s.id, deleted_at="2026-11-23T10:00:00Z")
    assert store.get_session(s.id).deleted_at == "2026-11-23T10:00:00Z"
    assert [x.deleted_at for x in store.list_sessions() if x.id == s.id] == [
        "2026-11-23T10:00:00Z"]


def test_leases_claims_and_releases(store):
    import time
    s, _ = new_session(store)
    assert store.get_session(s.id).host == ""
    now = time.time()
    # a session of a single-host data root ("" with no lease) is claimed once
    a = store.claim_session(s.id, "a", "", now + 30, now)
    assert (a.host, a.lease_expires, a.released_to) == ("a", now + 30, None)
    with pytest.raises(Aborted) as lost:  # a's lease is live
        store.claim_session(s.id, "b", "a", now + 30, now)
    assert f"lease until {ids.clock(now + 30)}" in lost.value.message  # UTC, not an epoch
    with pytest.raises(Aborted):  # not held by whom b thinks
        store.claim_session(s.id, "b", "c", now + 30, now + 60)
    assert store.renew_leases("a", now + 90) == 1
    with pytest.raises(Aborted):
        store.claim_session(s.id, "b", "a", now + 120, now + 60)
    with pytest.raises(FailedPrecondition):
        store.release_session(s.id, "b", "b")
    released = store.release_session(s.id, "a", "b")
    assert released.released_to == "b" and released.lease_expires == 0
    assert store.renew_leases("a", now + 200) == 0  # released: no longer renewed
    with pytest.raises(Aborted):  # released to b, and c's clock says a's lease is live
        store.claim_session(s.id, "c", "a", now + 30, -1)
    b = store.claim_session(s.id, "b", "a", now + 30, now, workspace="/elsewhere",
                            needs_attention="taking over")
    assert (b.host, b.workspace, b.released_to, b.needs_attention) == (
        "b", "/elsewhere", None, "taking over")
    with pytest.raises(NotFound):
        store.claim_session(ids.new_id(), "b", "", now, now)


def test_two_hosts_claiming_one_session_exactly_one_wins(store):
    import time
    s, _ = new_session(store)
    now = time.time()
    outcomes = []

    def claim(host):
        try:
            store.claim_session(s.id, host, "", now + 30, now)
            outcomes.append(host)
        except Aborted:
            outcomes.append(None)

    threads = [threading.Thread(target=claim, args=(h,)) for h in "abcdefgh"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [o for o in outcomes if o]
    assert len(winners) == 1 and store.get_session(s.id).host == winners[0]


def test_hosts_announce_where_they_answer(store):
    assert store.host_address("a") == ""
    store.announce_host("a", "a.internal:7070", 1.0)
    store.announce_host("a", "a2.internal:7070", 2.0)
    assert store.host_address("a") == "a2.internal:7070"


def test_each_hosts_holds_are_published_whole_and_run_out(store):
    """A host's holds are replaced whole at each publication, leave other hosts' be,
    and count only until they run out; those run out are dropped at the next one."""
    assert store.held_checkpoints(100.0) == set()
    store.publish_holds("a", {"c1", "c2"}, 130.0, 100.0)
    store.publish_holds("b", ["c2", "c3", "c3"], 110.0, 100.0)
    assert store.held_checkpoints(105.0) == {"c1", "c2", "c3"}
    store.publish_holds("a", {"c4"}, 140.0, 105.0)  # a let go of c1 and c2
    assert store.held_checkpoints(105.0) == {"c2", "c3", "c4"}
    assert store.held_checkpoints(115.0) == {"c4"}  # b's ran out at 110
    store.publish_holds("a", set(), 150.0, 120.0)
    assert store.held_checkpoints(100.0) == set()  # b's were dropped, run out at 120


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_digests_are_kept_as_bytes_and_hex_text_of_0_6_is_migrated(kind, request, tmp_path):
    """0.7 keeps digests as their 32 bytes; a database of 0.6 (hex text, schema 6) is
    rewritten once at open, reads back the same, and its audit chain still verifies."""
    store = make_store(kind, request, tmp_path)
    s, first = new_session(store)
    tree = "ab" * 32
    cp = make_cp(s.id, first.id)
    cp = store.append_checkpoint(replace(cp, tree=tree, container="cd" * 32), [], first.id,
                                 None, [AuditEvent("checkpoint", s.id, cp.id, {"tree": tree},
                                                   ids.now())])
    column = ("SELECT typeof(tree), length(tree) FROM checkpoints WHERE id = ?"
              if kind == "sqlite" else
              "SELECT pg_typeof(tree)::text, octet_length(tree) FROM checkpoints WHERE id = ?")
    assert tuple(store._one(column, (cp.id,))) in (("blob", 32), ("bytea", 32))
    events = store.list_audit()
    with store._tx() as db:  # as 0.6 wrote it
        if kind == "sqlite":
            db.execute("UPDATE checkpoints SET tree = hex(tree), state_digest ="
                       " hex(state_digest), tasks_digest = hex(tasks_digest), container ="
                       " hex(container)")
            db.execute("UPDATE checkpoints SET tree = lower(tree), state_digest ="
                       " lower(state_digest), tasks_digest = lower(tasks_digest), container ="
                       " lower(container)")
            db.execute("UPDATE audit SET prev_hash = lower(hex(prev_hash)),"
                       " hash = lower(hex(hash))")
        else:
            db.execute("ALTER TABLE checkpoints ALTER COLUMN tree TYPE TEXT USING"
                       " encode(tree, 'hex'), ALTER COLUMN state_digest TYPE TEXT USING"
                       " encode(state_digest, 'hex'), ALTER COLUMN tasks_digest TYPE TEXT"
                       " USING encode(tasks_digest, 'hex'), ALTER COLUMN container TYPE TEXT"
                       " USING encode(container, 'hex')")
            db.execute("ALTER TABLE audit ALTER COLUMN prev_hash TYPE TEXT USING"
                       " encode(prev_hash, 'hex'), ALTER COLUMN hash TYPE TEXT USING"
                       " encode(hash, 'hex')")
        db.execute("UPDATE meta SET value = '6' WHERE key = 'schema_version'")
    store.close()
    again = make_store(kind, request, tmp_path)
    try:
        assert again.schema_found == 6 and again.schema_version >= 7
        got = again.get_checkpoint(cp.id)
        assert (got.tree, got.container, got.state_digest) == (tree, "cd" * 32, D)
        assert tuple(again._one(column, (cp.id,))) in (("blob", 32), ("bytea", 32))
        assert again.list_audit() == events
        prev = GENESIS_HASH
        for event in again.list_audit():
            assert event.prev_hash == prev and chain_hash(prev, event) == event.hash
            prev = event.hash
    finally:
        again.close()


def test_a_checkpoints_bucket_objects_are_indexed_in_its_transaction(store):
    from worldline.daemon.storage.blob_index import StoredObject
    s, first = new_session(store)
    objects = [StoredObject("packs/b.pack", 30, "a", 1.0, [("b" * 64, 0, 10, 12, "pack"),
                                                          ("c" * 64, 10, 20, 20, "raw")]),
               StoredObject("packs/a.pack", 5, "a", 1.0, [("d" * 64, 0, 5, 5, "raw")])]
    if isinstance(store, MemoryStore):  # it serves no bucket: told, and nothing changes
        with pytest.raises(InvalidArgument):
            store.append_checkpoint(make_cp(s.id, first.id), [], first.id, None, [], objects)
        assert store.get_session(s.id).head == first.id
        return
    with pytest.raises(Aborted):  # the head moved: neither the checkpoint nor the index
        store.append_checkpoint(make_cp(s.id, first.id), [], "nope", None, [], objects)
    assert store.locate_blobs(["b" * 64, "d" * 64]) == {}
    assert store.blob_objects() == []
    cp = store.append_checkpoint(make_cp(s.id, first.id), [], first.id, None, [], objects)
    assert store.get_session(s.id).head == cp.id
    found = store.locate_blobs(["b" * 64, "c" * 64, "d" * 64])
    assert {d: (loc.object, loc.off, loc.len) for d, loc in found.items()} == {
        "b" * 64: ("packs/b.pack", 0, 10), "c" * 64: ("packs/b.pack", 10, 20),
        "d" * 64: ("packs/a.pack", 0, 5)}
    assert sorted(o[0] for o in store.blob_objects()) == ["packs/a.pack", "packs/b.pack"]
    # Recorded again by a second checkpoint (it shared a sync): kept as they are.
    again = store.append_checkpoint(make_cp(s.id, cp.id), [], cp.id, None, [], objects)
    assert store.get_session(s.id).head == again.id
    assert len(store.blob_objects()) == 2


def test_a_store_says_whether_its_commits_stay_on_this_host(store, request):
    """``local``: a checkpoint's commit runs in its capture's turn only on a store whose
    commit waits on nothing but this host's fsync (world/checkpoint.py). A fleet's
    database, whose commits wait on the network, says False: in the turn, every
    session's commit would queue behind the others' round trips."""
    assert store.local is (not request.node.callspec.params["store"].startswith("postgres"))


def test_a_store_says_whether_a_commit_can_be_made_durable_later(store):
    """``flush_later``: on a store of this host, a block whose commits return before they
    are durable, and the callable that makes them so; a fleet's database, whose commit's
    wait is the network's, has none (None)."""
    later = store.flush_later()
    if not store.local:
        assert later is None
        return
    s, first = new_session(store)
    with later as flush:
        cp = store.append_checkpoint(make_cp(s.id, first.id), [], first.id, None, [])
    flush()
    assert store.get_session(s.id).head == cp.id


def test_a_checkpoints_warnings_round_trip(store):
    s, first = new_session(store)
    cp = store.append_checkpoint(replace(make_cp(s.id, first.id), warnings=("a", "b ü")), [],
                                 first.id, None, [])
    assert store.get_checkpoint(cp.id).warnings == ("a", "b ü")
    assert store.get_checkpoint(first.id).warnings == ()
    assert [c.warnings for c in store.list_checkpoints(s.id)] == [(), ("a", "b ü")]


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_database_of_schema_13_gains_checkpoint_warnings(kind, request, tmp_path):
    """0.8 keeps a checkpoint's warnings in a column of its own: a database of 0.7
    (schema 13) gains it once at open, its checkpoints with none."""
    store = make_store(kind, request, tmp_path)
    s, first = new_session(store)
    cp = store.append_checkpoint(make_cp(s.id, first.id), [], first.id, None, [])
    with store._tx() as db:  # as 0.7 made it
        db.execute("ALTER TABLE checkpoints DROP COLUMN warnings")
        db.execute("UPDATE meta SET value = '13' WHERE key = 'schema_version'")
    store.close()
    again = make_store(kind, request, tmp_path)
    try:
        assert again.schema_found == 13 and again.schema_version >= 14
        assert again.get_checkpoint(cp.id).warnings == ()
        later = again.append_checkpoint(replace(make_cp(s.id, cp.id), warnings=("w",)), [],
                                        cp.id, None, [])
        assert again.get_checkpoint(later.id).warnings == ("w",)
    finally:
        again.close()
