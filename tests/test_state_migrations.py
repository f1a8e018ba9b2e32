"""State that outlives its schema (docs/state-migrations.md), against a real daemon: a
checkpoint's state written in schema v1 reads at v3 through the client, the async
client and the LangGraph saver, the steps oldest first; the stored checkpoint keeps v1;
a restore hands back the upgraded state; a state newer than the reader's migrations
and a migration that fails are errors of their own, and restore nothing."""

from __future__ import annotations

import asyncio
import operator
import uuid
from pathlib import Path
from typing import Annotated, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph
from worldline.client import (
    AsyncClient,
    Client,
    FailedPrecondition,
    StateMigrationError,
    StateMigrations,
    StateVersionTooNew,
    WorldlineError,
)
from worldline.langgraph import WorldlineSaver

from .test_langgraph import passes_the_conformance_suite

V1 = {"todo": ["read the issue", "write the test"], "note": "kept"}
V3 = {"plan": [{"step": "read the issue", "done": False},
               {"step": "write the test", "done": False}], "note": "kept", "__schema__": 3}


def schema(calls: list, fail_at: int | None = None, current: int = 3) -> StateMigrations:
    """v1 {todo: [str]} -> v2 {plan: [str]} -> v3 {plan: [{step, done}]}; ``calls``
    gets the version each step starts from, in the order they run."""
    def v1_to_v2(state: dict) -> dict:
        calls.append(1)
        if fail_at == 1:
            raise KeyError("todo")
        state["plan"] = state.pop("todo")
        return state

    def v2_to_v3(state: dict) -> dict:
        calls.append(2)
        if fail_at == 2:
            raise KeyError("plan")
        return {**state, "plan": [{"step": s, "done": False} for s in state["plan"]]}

    return StateMigrations(current, {1: v1_to_v2, 2: v2_to_v3})


@pytest.fixture
def session(client, workspace):
    return client.create_session(str(workspace))


def test_a_v1_state_reads_at_v3_oldest_first_and_history_keeps_v1(daemon, client, session):
    v1 = session.checkpoint(label="v1", state=V1)  # unversioned: schema 1
    v2 = session.checkpoint(label="v2", state={"plan": ["x"], "__schema__": 2})
    calls: list[int] = []
    with Client(daemon.address, migrations=schema(calls)) as reader:
        assert reader.show(v1.id).state == V3
        assert calls == [1, 2]  # oldest first
        calls.clear()
        assert reader.show(v2.id).state["plan"] == [{"step": "x", "done": False}]
        assert calls == [2]
        calls.clear()
        s = reader.get_session(session.id)
        now = s.checkpoint(state={"plan": []})  # written at the reader's version
        assert reader.show(now.id).state == {"plan": [], "__schema__": 3}
        assert calls == []
        assert reader.show(s.checkpoint(label="no state").id).state == {"plan": [], "__schema__": 3}
    # never rewriting history: what is stored is what was written
    assert client.show(v1.id).state == V1
    assert client.show(v2.id).state == {"plan": ["x"], "__schema__": 2}
    assert client.show(now.id).state == {"plan": [], "__schema__": 3}


def test_a_checkpoint_without_state_reads_empty_and_runs_no_step(daemon, session):
    calls: list[int] = []
    with Client(daemon.address, migrations=schema(calls)) as reader:
        cp = reader.checkpoint(session.id, label="none")
        assert reader.show(cp.id).state == {}
    assert calls == []


def test_restore_returns_the_upgraded_state_and_stores_none(daemon, client, session, workspace):
    (workspace / "f.txt").write_text("at v1\n")
    v1 = session.checkpoint(state=V1)
    (workspace / "f.txt").write_text("later\n")
    session.checkpoint(state={"plan": [], "__schema__": 3})
    calls: list[int] = []
    with Client(daemon.address, migrations=schema(calls)) as reader:
        s = reader.get_session(session.id)
        result = s.restore(v1.id)
        assert result.state == V3 and calls == [1, 2]
        assert (workspace / "f.txt").read_text() == "at v1\n"
        assert reader.show(s.head).state == V3
        assert "state" not in result.to_dict()  # not part of the CLI's JSON
    assert client.show(result.checkpoint.id).state == V1  # the restore stored v1 as it was
    assert client.restore(session.id, v1.id).state is None  # no migrations: read it with show


def test_a_state_newer_than_the_reader_knows_is_an_error_and_restores_nothing(
        daemon, client, session, workspace):
    (workspace / "f.txt").write_text("written by v4\n")
    v4 = session.checkpoint(state={"plan": [], "tags": [], "__schema__": 4})
    (workspace / "f.txt").write_text("now\n")
    head = session.checkpoint().id
    calls: list[int] = []
    with Client(daemon.address, migrations=schema(calls)) as reader:
        with pytest.raises(StateVersionTooNew) as err:
            reader.show(v4.id)
        assert (err.value.version, err.value.current, err.value.checkpoint_id) == (4, 3, v4.id)
        assert isinstance(err.value, StateMigrationError)
        assert isinstance(err.value, FailedPrecondition) and err.value.code == "FAILED_PRECONDITION"
        with pytest.raises(StateVersionTooNew):
            reader.restore(session.id, v4.id)
    assert calls == []
    assert client.get_session(session.id).head == head
    assert (workspace / "f.txt").read_text() == "now\n"


def test_a_failing_migration_surfaces_with_its_cause_and_restores_nothing(
        daemon, client, session, workspace):
    (workspace / "f.txt").write_text("at v1\n")
    v1 = session.checkpoint(state=V1)
    (workspace / "f.txt").write_text("now\n")
    head = session.checkpoint().id
    calls: list[int] = []
    with Client(daemon.address, migrations=schema(calls, fail_at=2)) as reader:
        with pytest.raises(StateMigrationError) as err:
            reader.show(v1.id)
        assert not isinstance(err.value, StateVersionTooNew)
        assert (err.value.step, err.value.version, err.value.checkpoint_id) == (2, 1, v1.id)
        assert isinstance(err.value.__cause__, KeyError)
        assert calls == [1, 2]
        with pytest.raises(StateMigrationError):
            reader.restore(session.id, v1.id)
    assert client.get_session(session.id).head == head
    assert (workspace / "f.txt").read_text() == "now\n"
    assert client.show(v1.id).state == V1


def test_a_migration_must_return_a_dict_and_a_version_must_be_one(daemon, client, session):
    v1 = session.checkpoint(state=V1)
    with Client(daemon.address, migrations={1: lambda s: s.update(plan=[]), 2: dict}) as reader:
        assert reader.migrations.current == 3  # a plain mapping: one past its last step
        with pytest.raises(StateMigrationError) as err:
            reader.show(v1.id)
        assert err.value.step == 1
        for bad in ("2", 0, True, 2.0):
            cp = session.checkpoint(state={"x": 1, "__schema__": bad})
            with pytest.raises(StateMigrationError) as err:
                reader.show(cp.id)
            assert err.value.version == bad and not isinstance(err.value, StateVersionTooNew)
    old = session.checkpoint(state={"x": 1, "__schema__": 1})
    with Client(daemon.address, migrations=StateMigrations(3, {2: lambda s: s})) as reader:
        with pytest.raises(StateMigrationError) as err:  # no step starts at 1
            reader.show(old.id)
        assert err.value.step == 1


def test_the_documented_example_resumes_an_old_checkpoint(daemon, client, session,
                                                          monkeypatch):
    """The example of docs/state-migrations.md, pasted as it is."""
    doc = (Path(__file__).resolve().parents[1] / "docs" / "state-migrations.md").read_text()
    example = doc.split("## An example to paste")[1].split("```python")[1].split("```")[0]
    monkeypatch.setenv("WORLDLINE_ADDRESS", daemon.address)
    names: dict = {}
    exec(compile(example, "docs/state-migrations.md", "exec"), names)
    v1 = session.checkpoint(state={"todo": ["ship"]})
    assert names["resume"](session.id, v1.id) == {
        "plan": [{"step": "ship", "done": False}], "__schema__": 3}
    v9 = session.checkpoint(state={"__schema__": 9})
    with pytest.raises(SystemExit, match="newer agent"):
        names["resume"](session.id, v9.id)


def test_bad_migrations_are_refused_when_they_are_made():
    f = lambda s: s  # noqa: E731
    for current, steps in [(3, {1: f}), (3, {2: f, 3: f}), (0, {}), (3, {0: f, 1: f, 2: f}),
                           (3, {1: f, 2: "not callable"}), ("3", {})]:
        with pytest.raises(ValueError):
            StateMigrations(current, steps)
    with pytest.raises(ValueError):
        Client("unix:///nowhere", migrations={})
    with Client("unix:///nowhere") as c:
        c.migrations = {1: f}
        assert (c.migrations.current, c.migrations.steps) == (2, {1: f})
        c.migrations = None
        assert c.migrations is None
    assert StateMigrations(1).upgrade({"a": 1}) == {"a": 1}


def test_the_async_client_upgrades_the_same(daemon, client, session, workspace):
    v1 = session.checkpoint(state=V1)
    v4 = session.checkpoint(state={"__schema__": 4})
    calls: list[int] = []

    async def run():
        async with AsyncClient(daemon.address, migrations=schema(calls)) as reader:
            assert (await reader.show(v1.id)).state == V3
            assert calls == [1, 2]
            s = await reader.get_session(session.id)
            assert (await s.restore(v1.id)).state == V3
            with pytest.raises(StateVersionTooNew):
                await reader.show(v4.id)
        async with AsyncClient(daemon.address, migrations=schema([], fail_at=1)) as reader:
            with pytest.raises(StateMigrationError) as err:
                await reader.restore(session.id, v1.id)
            assert err.value.step == 1
            reader.migrations = None  # the plain client's view: as stored
            assert (await reader.show(v1.id)).state == V1

    asyncio.run(run())
    assert client.show(v1.id).state == V1


# -- the LangGraph saver -------------------------------------------------------------------
class StateV1(TypedDict, total=False):
    todo: Annotated[list[str], operator.add]
    owner: str


class StateV3(TypedDict, total=False):
    plan: Annotated[list[dict], operator.add]
    owner: dict


def graph_v1(saver):
    g = StateGraph(StateV1)
    g.add_node("think", lambda s: {"todo": ["write the test"]})
    g.add_edge(START, "think")
    g.add_edge("think", END)
    return g.compile(checkpointer=saver)


def graph_v3(saver):
    g = StateGraph(StateV3)
    g.add_node("act", lambda s: {"plan": [{"step": "ship", "done": True}]})
    g.add_edge(START, "act")
    g.add_edge("act", END)
    return g.compile(checkpointer=saver)


def graph_schema(calls: list, fail_at: int | None = None) -> StateMigrations:
    """The same steps on a graph's channel values (LangGraph's own channels pass)."""
    def v1_to_v2(values: dict) -> dict:
        calls.append(1)
        if fail_at == 1:
            raise RuntimeError("no")
        if "todo" in values:
            values["plan"] = values.pop("todo")
        return values

    def v2_to_v3(values: dict) -> dict:
        calls.append(2)
        if "plan" in values:
            values["plan"] = [{"step": s, "done": False} for s in values["plan"]]
        if "owner" in values:
            values["owner"] = {"name": values["owner"]}
        return values

    return StateMigrations(3, {1: v1_to_v2, 2: v2_to_v3})


def test_the_saver_upgrades_channel_values_when_read_and_keeps_history(daemon, tmp_path):
    config = {"configurable": {"thread_id": f"mig-{uuid.uuid4()}"}}
    with WorldlineSaver(daemon.address, workspace=str(tmp_path)) as old:
        graph_v1(old).invoke({"todo": ["read the issue"], "owner": "ana"}, config,
                             durability="sync")
        stored = old.get_tuple(config)
        v1_history = list(old.list(config))
        assert stored.checkpoint["channel_values"]["todo"] == ["read the issue", "write the test"]
    calls: list[int] = []
    with WorldlineSaver(daemon.address, migrations=graph_schema(calls)) as saver:
        t = saver.get_tuple(config)
        assert calls == [1, 2]
        assert t.checkpoint["channel_values"]["plan"] == [
            {"step": "read the issue", "done": False}, {"step": "write the test", "done": False}]
        assert "todo" not in t.checkpoint["channel_values"]
        assert "todo" not in t.checkpoint["channel_versions"]
        assert "__schema__" not in t.checkpoint
        assert t.checkpoint["channel_values"]["owner"] == {"name": "ana"}
        listed = list(saver.list(config))
        assert all("todo" not in h.checkpoint["channel_values"] for h in listed)
        # the v3 graph goes on from the upgraded state, and stores it as upgraded
        result = graph_v3(saver).invoke({"plan": []}, config, durability="sync")
        assert result["plan"] == [{"step": "read the issue", "done": False},
                                  {"step": "write the test", "done": False},
                                  {"step": "ship", "done": True}]
        calls.clear()
        assert saver.get_tuple(config).checkpoint["channel_values"]["plan"] == result["plan"]
        assert calls == []  # written at v3: no step runs
        assert "__schema__" not in saver.get_tuple(config).checkpoint
    with WorldlineSaver(daemon.address) as raw:
        history = list(raw.list(config))
        assert history[0].checkpoint["channel_values"]["plan"] == result["plan"]
        assert "todo" not in history[0].checkpoint["channel_values"]
        # a value the migration made and no step wrote since is stored with it
        assert history[0].checkpoint["channel_values"]["owner"] == {"name": "ana"}
        assert "__schema__" not in history[0].checkpoint
        # the v1 checkpoints are as they were written
        assert [h.checkpoint for h in history[-3:]] == [
            h.checkpoint for h in v1_history]
        assert history[-1].checkpoint["channel_values"]["__start__"] == {
            "todo": ["read the issue"], "owner": "ana"}


def paused_graph(state: type, saver, done: list):
    """START -> think -> review (interrupted before) -> END."""
    g = StateGraph(state)
    g.add_node("think", lambda s: {})
    g.add_node("review", lambda s: done.append("review") or {})
    g.add_edge(START, "think")
    g.add_edge("think", "review")
    g.add_edge("review", END)
    return g.compile(checkpointer=saver, interrupt_before=["review"])


def test_a_graph_paused_at_v1_resumes_at_v3_where_it_stood(daemon, tmp_path):
    """The agent was upgraded while a run waited for review: the new graph goes on
    from the upgraded state to the node it stopped before, once, and not again."""
    config = {"configurable": {"thread_id": f"mig-{uuid.uuid4()}"}}
    done: list[str] = []
    with WorldlineSaver(daemon.address, workspace=str(tmp_path)) as old:
        paused_graph(StateV1, old, done).invoke({"todo": ["a"], "owner": "ana"}, config,
                                                durability="sync")
        assert old.get_tuple(config) is not None and done == []
    with WorldlineSaver(daemon.address, migrations=graph_schema([])) as saver:
        graph = paused_graph(StateV3, saver, done)
        assert graph.get_state(config).next == ("review",)
        result = graph.invoke(None, config, durability="sync")
        assert done == ["review"]
        assert result == {"plan": [{"step": "a", "done": False}], "owner": {"name": "ana"}}
        assert graph.get_state(config).next == ()


def test_an_upgraded_channel_does_not_run_the_nodes_that_had_read_it_again(daemon):
    """A step's version of a value it changed sorts below the stored one: a node that
    subscribes to the channel and had read it is not scheduled again."""
    from langgraph.channels import LastValue
    from langgraph.pregel import NodeBuilder, Pregel

    def build(saver):
        echo = NodeBuilder().subscribe_only("todo").do(lambda x: x).write_to("out")
        return Pregel(nodes={"echo": echo}, channels={"todo": LastValue(list),
                                                      "out": LastValue(list)},
                      input_channels=["todo"], output_channels=["out"], checkpointer=saver)

    config = {"configurable": {"thread_id": f"mig-{uuid.uuid4()}"}}
    with WorldlineSaver(daemon.address) as old:
        assert build(old).invoke({"todo": ["a"]}, config) == {"out": ["a"]}
    upgrade = StateMigrations(2, {1: lambda v: {**v, "todo": [*v["todo"], "b"]}})
    with WorldlineSaver(daemon.address, migrations=upgrade) as saver:
        state = build(saver).get_state(config)
        assert state.values["todo"] == ["a", "b"]
        assert state.next == ()


def test_each_schema_and_each_checkpoint_upgrades_into_values_of_its_own(daemon, tmp_path):
    """Two readers of different schemas fork the same v1 checkpoint (``update_state`` on
    it), and one forks two v1 checkpoints whose "owner" is the same stored value but
    whose other channels differ: each fork stores the value made for it. (The v3 fork
    comes last: a v2 reader refuses a thread where v3 has written.)"""
    thread = f"mig-{uuid.uuid4()}"
    config = {"configurable": {"thread_id": thread}}
    with WorldlineSaver(daemon.address, workspace=str(tmp_path)) as old:
        graph_v1(old).invoke({"todo": ["a"], "owner": "ana"}, config, durability="sync")
        first, second = [h.checkpoint["id"] for h in old.list(config)][:2]  # newest first
        versions = [old.get_tuple({"configurable": {"thread_id": thread, "checkpoint_id": c}})
                    .checkpoint["channel_versions"]["owner"] for c in (first, second)]
        assert versions[0] == versions[1]

    def owner(values: dict) -> dict:  # a step that reads another channel
        values["owner"] = {"name": values["owner"], "tasks": len(values.get("todo", []))}
        return values

    def role(values: dict) -> dict:
        values["owner"] = {**values["owner"], "role": "dev"}
        return values

    forks = {}
    for name, m, at in [("v2", StateMigrations(2, {1: owner}), first),
                        ("v2 of the older", StateMigrations(2, {1: owner}), second),
                        ("v3", StateMigrations(3, {1: owner, 2: role}), first)]:
        at = {"configurable": {"thread_id": thread, "checkpoint_id": at}}
        with WorldlineSaver(daemon.address, migrations=m) as saver:
            forks[name] = graph_v1(saver).update_state(at, {"todo": ["b"]})
    with WorldlineSaver(daemon.address) as raw:
        got = {name: raw.get_tuple(c).checkpoint["channel_values"]["owner"]
               for name, c in forks.items()}
    assert got == {"v2": {"name": "ana", "tasks": 2}, "v3": {"name": "ana", "tasks": 2,
                                                             "role": "dev"},
                   "v2 of the older": {"name": "ana", "tasks": 1}}


def test_the_saver_refuses_a_newer_state_and_surfaces_a_failing_step(daemon, tmp_path):
    config = {"configurable": {"thread_id": f"mig-{uuid.uuid4()}"}}
    with WorldlineSaver(daemon.address, workspace=str(tmp_path)) as old:
        graph_v1(old).invoke({"todo": []}, config, durability="sync")
    with WorldlineSaver(daemon.address, migrations=graph_schema([], fail_at=1)) as saver:
        with pytest.raises(StateMigrationError) as err:
            saver.get_tuple(config)
        assert err.value.step == 1 and isinstance(err.value.__cause__, RuntimeError)
        with pytest.raises(StateMigrationError):
            list(saver.list(config))
    newer = {"configurable": {"thread_id": f"mig-{uuid.uuid4()}"}}
    four = StateMigrations(4, {1: lambda v: v, 2: lambda v: v, 3: lambda v: v})
    with WorldlineSaver(daemon.address, migrations=four) as v4:
        graph_v3(v4).invoke({"plan": []}, newer, durability="sync")
    with WorldlineSaver(daemon.address, migrations=graph_schema([])) as saver:
        with pytest.raises(StateVersionTooNew) as err:
            saver.get_tuple(newer)
        assert (err.value.version, err.value.current) == (4, 3)
        assert isinstance(err.value, WorldlineError)


def test_the_saver_async_methods_upgrade_the_same(daemon, tmp_path):
    config = {"configurable": {"thread_id": f"mig-{uuid.uuid4()}"}}
    with WorldlineSaver(daemon.address, workspace=str(tmp_path)) as old:
        graph_v1(old).invoke({"todo": ["a"]}, config, durability="sync")
    calls: list[int] = []

    async def run():
        async with WorldlineSaver(daemon.address, migrations=graph_schema(calls)) as saver:
            t = await saver.aget_tuple(config)
            assert t.checkpoint["channel_values"]["plan"] == [
                {"step": "a", "done": False}, {"step": "write the test", "done": False}]
            assert calls == [1, 2]
            async for h in saver.alist(config):
                assert "todo" not in h.checkpoint["channel_values"]
            state = await graph_v3(saver).aget_state(config)
            assert state.values["plan"][0] == {"step": "a", "done": False}

    asyncio.run(run())


def test_the_conformance_suite_passes_with_migrations(daemon):
    """A saver that marks and upgrades is still a LangGraph checkpointer."""
    passes_the_conformance_suite("WorldlineSaver with migrations", lambda: WorldlineSaver(
        daemon.address, migrations=StateMigrations(2, {1: lambda v: v})))
