"""worldline.langgraph.WorldlineSaver against a real daemon: LangGraph's official
conformance suite, and real graphs whose steps edit a workspace."""

from __future__ import annotations

import asyncio
import operator
from pathlib import Path
from typing import Annotated, TypedDict

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES
from langgraph.graph import END, START, StateGraph
from worldline.client import AlreadyExists, InvalidArgument, NotFound
from worldline.langgraph import WorldlineSaver
from worldline.v1 import worldline_pb2 as pb

from .conftest import tree_state


def passes_the_conformance_suite(name: str, make) -> None:
    """LangGraph's conformance suite on the savers ``make()`` gives: every base and
    optional capability claimed, and passed."""
    @checkpointer_test(name=name)
    async def saver():
        s = make()
        yield s
        await s.aclose()

    report = asyncio.run(validate(saver))
    assert report.passed_all_base()
    failures = {cap: (r.detected, r.passed, r.failures) for cap, r in report.results.items()
                if not (r.detected and r.passed)}
    assert failures == {}, failures  # every optional capability is claimed, and passes
    assert {cap.value for cap in ALL_CAPABILITIES} == set(report.results)


def test_the_official_conformance_suite_passes_every_capability(daemon):
    passes_the_conformance_suite("WorldlineSaver", lambda: WorldlineSaver(daemon.address))


class State(TypedDict):
    steps: Annotated[list[str], operator.add]


def editing_graph(ws: Path, saver: WorldlineSaver):
    """Three steps, each a tool call that edits the workspace."""
    def write_plan(state: State) -> State:
        (ws / "PLAN.md").write_text("1. add module\n2. test it\n")
        return {"steps": ["plan"]}

    def write_code(state: State) -> State:
        (ws / "src").mkdir(exist_ok=True)
        (ws / "src" / "mod.py").write_text("def f():\n    return 1\n")
        return {"steps": ["code"]}

    def break_things(state: State) -> State:
        (ws / "PLAN.md").unlink()
        (ws / "src" / "mod.py").write_text("garbage")
        return {"steps": ["oops"]}

    g = StateGraph(State)
    g.add_node("plan", write_plan)
    g.add_node("code", write_code)
    g.add_node("oops", break_things)
    g.add_edge(START, "plan")
    g.add_edge("plan", "code")
    g.add_edge("code", "oops")
    g.add_edge("oops", END)
    return g.compile(checkpointer=saver)


def test_each_graph_step_checkpoints_the_world_and_restores_it(daemon, client, tmp_path):
    ws = tmp_path / "repo"
    ws.mkdir()
    with WorldlineSaver(daemon.address, workspace=str(ws)) as saver:
        graph = editing_graph(ws, saver)
        config = {"configurable": {"thread_id": "issue-42"}}
        # durability="sync": each step's checkpoint (and so its world) is taken before the
        # next step starts; LangGraph's default saves while the next step already runs.
        result = graph.invoke({"steps": []}, config, durability="sync")
        assert result["steps"] == ["plan", "code", "oops"]
        sid, workspace = saver.thread_session("issue-42")
        assert workspace == str(ws)
        history = list(graph.get_state_history(config))  # newest first
        after_code = next(h for h in history if h.values.get("steps") == ["plan", "code"])
        world = saver.world_checkpoint(after_code.config)
        assert world is not None
        # every root-namespace graph checkpoint recorded one world checkpoint
        log = client.log(sid)
        assert {c.id for c in log} >= {saver.world_checkpoint(h.config) for h in history}
        assert [c.trace_id for c in log if c.trace_id] == [
            h.config["configurable"]["checkpoint_id"] for h in reversed(history)]

        client.restore(sid, world, acknowledge_side_effects=True)
        assert (ws / "PLAN.md").read_text() == "1. add module\n2. test it\n"
        assert (ws / "src" / "mod.py").read_text() == "def f():\n    return 1\n"


def test_copy_thread_forks_the_world(daemon, tmp_path):
    ws = tmp_path / "repo"
    ws.mkdir()

    async def run() -> tuple[str, str]:
        async with WorldlineSaver(daemon.address, workspace=str(ws)) as saver:
            graph = editing_graph(ws, saver)
            config = {"configurable": {"thread_id": "a"}}
            await graph.ainvoke({"steps": []}, config, durability="sync")
            await saver.acopy_thread("a", "b")
            state_b = await graph.aget_state({"configurable": {"thread_id": "b"}})
            assert state_b.values["steps"] == ["plan", "code", "oops"]
            with pytest.raises(AlreadyExists):
                await saver.acopy_thread("a", "b")
            with pytest.raises(NotFound):
                await saver.acopy_thread("nobody", "c")
            return saver.thread_session("a")[1], saver.thread_session("b")[1]

    ws_a, ws_b = asyncio.run(run())
    assert ws_b != ws_a
    assert tree_state(Path(ws_b)) == tree_state(ws)
    (Path(ws_b) / "only-in-b").write_text("b")
    assert not (ws / "only-in-b").exists()


def test_threads_without_a_workspace_get_their_own_folder(daemon):
    with WorldlineSaver(daemon.address) as saver:
        config = {"configurable": {"thread_id": "t1", "checkpoint_ns": ""}}
        from langgraph.checkpoint.base import empty_checkpoint
        cp = empty_checkpoint()
        saver.put(config, cp, {"source": "input", "step": -1}, {})
        sid, workspace = saver.thread_session("t1")
        assert Path(workspace).is_dir() and Path(workspace).is_relative_to(daemon.root)
        assert saver.get_tuple(config).checkpoint["id"] == cp["id"]
        assert cp["id"] in [t.checkpoint["id"] for t in saver.list(None)]
        saver.delete_thread("t1")
        assert saver.get_tuple(config) is None
        assert list(saver.list(config)) == []
        # the world's history stays: deleting graph state never destroys it
        assert saver.thread_session("t1")[0] == sid


def test_listing_pages_through_more_than_a_page(daemon):
    with WorldlineSaver(daemon.address) as saver:
        from langgraph.checkpoint.base import empty_checkpoint
        parent = None
        made = []
        for step in range(130):
            config = {"configurable": {"thread_id": "long", "checkpoint_ns": "child:1"}}
            if parent:
                config["configurable"]["checkpoint_id"] = parent
            cp = empty_checkpoint()
            saver.put(config, cp, {"step": step}, {})
            parent = cp["id"]
            made.append(cp["id"])
        listed = [t.checkpoint["id"] for t in saver.list({"configurable": {"thread_id": "long"}})]
        assert listed == list(reversed(made))
        assert len(list(saver.list({"configurable": {"thread_id": "long"}}, limit=101))) == 101
        odd = list(saver.list(None, filter={"step": 129}))
        assert [t.metadata["step"] for t in odd] == [129]


def test_bad_graph_requests_are_refused(daemon):
    with WorldlineSaver(daemon.address) as saver:
        from langgraph.checkpoint.base import empty_checkpoint
        with pytest.raises(InvalidArgument, match="thread id"):
            saver.put({"configurable": {"thread_id": "", "checkpoint_ns": ""}},
                      empty_checkpoint(), {}, {})
        with pytest.raises(InvalidArgument, match="strategy"):
            saver.prune(["t"], strategy="everything")
        with pytest.raises(NotFound):
            saver.thread_session("never-seen")
        stub = saver._stub
        for request, message in [
            (pb.ListGraphCheckpointsRequest(any_thread=True, limit=1000), "at most"),
            (pb.ListGraphCheckpointsRequest(any_thread=True, filter_json="[1]"), "JSON object"),
            (pb.ListGraphCheckpointsRequest(any_thread=True, filter_json="{"), "filter"),
        ]:
            with pytest.raises(Exception) as err:
                stub.ListGraphCheckpoints(request, timeout=10)
            assert err.value.code().name == "INVALID_ARGUMENT"
            assert message in err.value.details()
        with pytest.raises(Exception) as err:
            stub.PutGraphCheckpoint(pb.PutGraphCheckpointRequest(checkpoint=pb.GraphCheckpoint(
                thread_id="t", checkpoint_id="c", metadata_json="not json")), timeout=10)
        assert err.value.code().name == "INVALID_ARGUMENT"
        assert saver.get_tuple({"configurable": {"thread_id": "t"}}) is None  # nothing stored
